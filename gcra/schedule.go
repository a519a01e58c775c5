package gcra

import (
	"errors"
	"fmt"
	"math/bits"
)

// Version is a limit with the epoch it belongs to and the instant (µs on the
// store's clock) from which it is in force.
type Version struct {
	Limit     Limit
	Epoch     uint64
	Effective int64
}

// EpochTag is the part of an epoch stored with each key: its low 16 bits.
// Tags compare by serial-number arithmetic (RFC 1982): a tag 1…32767 ahead
// is newer. See the package documentation for the bound this places on
// callers.
func EpochTag(epoch uint64) uint16 { return uint16(epoch) }

// Schedule tells a store which limit applies to a key: the limit in force
// (Current, from Current.Effective on) and, when HasPrevious, the limit it
// replaced. The store picks by its own clock — Previous before
// Current.Effective, Current from then on — so every agent of a region
// switches a key at the same instant.
//
// A Schedule with only Current set is a steady limit; see Steady.
type Schedule struct {
	Current     Version
	Previous    Version
	HasPrevious bool
}

// Steady is a schedule with one limit that has always been in force
// (epoch 0).
func Steady(l Limit) Schedule { return Schedule{Current: Version{Limit: l}} }

// Change is a schedule switching from prev to cur at cur.Effective.
func Change(prev, cur Version) Schedule {
	return Schedule{Current: cur, Previous: prev, HasPrevious: true}
}

// Validate reports every problem with s: invalid limits, or a previous limit
// that takes effect after the current one.
func (s *Schedule) Validate() error {
	var errs []error
	if err := s.Current.Limit.validate(); err != nil {
		errs = append(errs, fmt.Errorf("current limit %s: %w", s.Current.Limit, err))
	}
	if s.HasPrevious {
		if err := s.Previous.Limit.validate(); err != nil {
			errs = append(errs, fmt.Errorf("previous limit %s: %w", s.Previous.Limit, err))
		}
		if s.Previous.Effective > s.Current.Effective {
			errs = append(errs, fmt.Errorf("previous limit effective at %dµs, after the current one (%dµs)",
				s.Previous.Effective, s.Current.Effective))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalidLimit, errors.Join(errs...))
}

// ok is the cheap form of Validate used on hot paths.
func (s *Schedule) ok() bool {
	okLimit := func(l Limit) bool { return l.ok || l.IsZero() }
	if !okLimit(s.Current.Limit) {
		return false
	}
	return !s.HasPrevious || (okLimit(s.Previous.Limit) && s.Previous.Effective <= s.Current.Effective)
}

// Valid reports whether s passes Validate, without building an error.
func (s *Schedule) Valid() bool { return s.ok() }

// resolve picks the version in force at now and the TAT st stands for under
// it, applying "limit changes keep tokens".
func (s *Schedule) resolve(st State, now int64) (Version, int64) {
	if now >= s.Current.Effective || !s.HasPrevious {
		if s.HasPrevious {
			return s.Current, tatUnder(st, now, &s.Current, &s.Previous, true)
		}
		return s.Current, tatUnder(st, now, &s.Current, nil, false)
	}
	return s.Previous, tatUnder(st, now, &s.Previous, nil, false)
}

// writeTag is the epoch tag to store with a state written under v: v's, or
// the stored one when it is newer (state is never converted back to an
// older epoch).
func (s *Schedule) writeTag(st State, v Version) uint16 {
	tag := EpochTag(v.Epoch)
	if st.Exists && newer(st.Epoch, tag) {
		return st.Epoch
	}
	return tag
}

// newer reports whether tag a is 1…32767 ahead of tag b.
func newer(a, b uint16) bool {
	d := a - b
	return d != 0 && d < 1<<15
}

// tatUnder is the TAT that st stands for under version a (in force at now),
// whose predecessor is p when hasP.
//
//   - st written under a: as stored.
//   - st written under p: converted to a at a's effective time.
//   - st written under a newer epoch than a: as stored (never converted back).
//   - st older than p (or than a, with no p), or no state: the key held p's
//     full burst (no state) or nothing (older state) at the change, and is
//     converted to a at a's effective time.
//
// Effective times after now are taken as now.
func tatUnder(st State, now int64, a, p *Version, hasP bool) int64 {
	ta := min(a.Effective, now)
	tag := EpochTag(a.Epoch)
	if st.Exists {
		switch {
		case st.Epoch == tag:
			return st.TAT
		case hasP && st.Epoch == EpochTag(p.Epoch):
			return convert(st.TAT, p.Limit, a.Limit, ta, now)
		case newer(st.Epoch, tag):
			return st.TAT
		}
		// Older than any limit we know: empty at the previous change.
		if !hasP {
			return emptyAt(a.Limit, ta)
		}
		tp := min(p.Effective, ta)
		return convert(emptyAt(p.Limit, tp), p.Limit, a.Limit, ta, now)
	}
	if !hasP {
		return now // rested: the full burst of the only limit known
	}
	// No state: the key held p's full burst at the change.
	return convert(ta, p.Limit, a.Limit, ta, now)
}

// emptyAt is the TAT of a key with no tokens left at t under l.
func emptyAt(l Limit, t int64) int64 {
	if !l.usable() {
		return t
	}
	return t + l.burst*l.t
}

// convCap bounds intermediate conversions; any TAT beyond now+MaxWindow is
// clamped there (such a key is blocked for the whole window anyway).
const convCap = 1 << 39

// convert turns tat, a TAT under limit p, into the TAT under limit a that
// keeps the available tokens at the change time ta, clamped to a's burst:
// tokens = Burst_p − max(tat−ta, 0)/T_p (negative for booked reservations),
// TAT_a = ta + (Burst_a − min(tokens, Burst_a))·T_a. Credit is rounded down
// and debt up, so a conversion never adds tokens. The result is clamped to
// now+MaxWindow.
func convert(tat int64, p, a Limit, ta, now int64) int64 {
	if !a.usable() {
		return tat // the zero limit decides nothing and writes nothing
	}
	full := a.burst * a.t
	if !p.usable() {
		return ta + full // p held nothing
	}
	d := max(tat-ta, 0)
	credit := p.burst*p.t - d // µs of credit under p; negative is debt
	var out int64
	if credit >= 0 {
		c := mulDivFloor(credit, a.t, p.t)
		if c >= full {
			return ta
		}
		out = ta + full - c
	} else {
		out = ta + full + mulDivCeil(min(-credit, convCap), a.t, p.t)
	}
	return min(out, now+MaxWindowMicros)
}

// mulDivFloor is floor(x·y/z) for 0 ≤ x ≤ 2^39, 0 < y, z ≤ 2^37, capped at
// convCap. The Lua script computes the same by long division on doubles.
func mulDivFloor(x, y, z int64) int64 {
	hi, lo := bits.Mul64(uint64(x), uint64(y))
	if hi >= uint64(z) {
		return convCap
	}
	q, _ := bits.Div64(hi, lo, uint64(z))
	return int64(min(q, convCap))
}

// mulDivCeil is ceil(x·y/z) under the same bounds as mulDivFloor.
func mulDivCeil(x, y, z int64) int64 {
	hi, lo := bits.Mul64(uint64(x), uint64(y))
	if hi >= uint64(z) {
		return convCap
	}
	q, r := bits.Div64(hi, lo, uint64(z))
	if r != 0 {
		q++
	}
	return int64(min(q, convCap))
}
