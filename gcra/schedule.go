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

// TagBits is the width of the epoch tag stored with each key.
const TagBits = 40

// tagMask keeps an epoch's low TagBits bits.
const tagMask = uint64(1)<<TagBits - 1

// EpochTag is the part of an epoch stored with each key: its low TagBits
// (40) bits. Tags compare by serial-number arithmetic (RFC 1982): a tag 1 to
// 2^39 − 1 ahead is newer. See the package documentation for the bound this
// places on callers.
func EpochTag(epoch uint64) uint64 { return epoch & tagMask }

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
	// Fence is the table the schedule comes from, for a store that keeps
	// a region fence (see Fence); zero: unfenced.
	Fence Fence
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
	if s.Current.Effective < 0 || s.Current.Effective >= MaxTime {
		errs = append(errs, fmt.Errorf("current effective time %dµs: outside [0, 2^52)", s.Current.Effective))
	}
	if s.HasPrevious {
		if err := s.Previous.Limit.validate(); err != nil {
			errs = append(errs, fmt.Errorf("previous limit %s: %w", s.Previous.Limit, err))
		}
		if !newer(EpochTag(s.Current.Epoch), EpochTag(s.Previous.Epoch)) {
			errs = append(errs, fmt.Errorf("previous epoch %d and current epoch %d: the current epoch's tag (low 40 bits) must be 1 to 2^39−1 ahead of the previous one's",
				s.Previous.Epoch, s.Current.Epoch))
		}
		if s.Previous.Effective < 0 || s.Previous.Effective >= MaxTime {
			errs = append(errs, fmt.Errorf("previous effective time %dµs: outside [0, 2^52)", s.Previous.Effective))
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
	okTime := func(t int64) bool { return t >= 0 && t < MaxTime }
	if !okLimit(s.Current.Limit) || !okTime(s.Current.Effective) {
		return false
	}
	return !s.HasPrevious || (okLimit(s.Previous.Limit) && okTime(s.Previous.Effective) &&
		s.Previous.Effective <= s.Current.Effective &&
		newer(EpochTag(s.Current.Epoch), EpochTag(s.Previous.Epoch)))
}

// Valid reports whether s passes Validate, without building an error.
func (s *Schedule) Valid() bool { return s.ok() }

// resolve picks the version in force at now and the TAT st stands for under
// it, applying "limit changes keep tokens".
func (s *Schedule) resolve(st State, now int64) (*Version, int64) {
	if !s.HasPrevious {
		// Steady: one limit. The common case, kept short.
		if st.Exists && st.Epoch == EpochTag(s.Current.Epoch) && st.under(&s.Current.Limit) {
			return &s.Current, st.TAT
		}
		return &s.Current, tatUnder(st, now, &s.Current, nil, false)
	}
	if now >= s.Current.Effective {
		return &s.Current, tatUnder(st, now, &s.Current, &s.Previous, true)
	}
	if !st.Exists {
		// No state under a version that replaced another: empty at its
		// change, as a state older than it is, not rested — what the key
		// held before is not known, and the version before may have held
		// less (see tatUnder).
		return &s.Previous, max(filledFrom(&s.Previous), now)
	}
	return &s.Previous, tatUnder(st, now, &s.Previous, nil, false)
}

// written is the state to store after an admission moved the TAT to tat
// under version v: tagged with v's epoch (or the stored, newer one: state is
// never converted back) and with Rested covering what a missing key would
// be read as instead.
//
// A missing key counts as empty at the change to the earliest version its
// schedule names (tatUnder), so a state outlives one window of the version
// it was written under (v's effective time plus Burst·T): dropped sooner,
// it would come back holding less than it does. Written under the previous
// limit of a change still pending, and still refilling (or not yet a
// window past its version's change) when the current limit takes over, it
// also outlives its TAT converted to the current limit — dropped sooner,
// it would come back with more or less than that. Rested by then, a
// missing key holds exactly what the state would.
func (s *Schedule) written(st State, v *Version, tat int64) State {
	tag := EpochTag(v.Epoch)
	if st.Exists && newer(st.Epoch, tag) {
		tag = st.Epoch
	}
	rested := tat
	if tag == EpochTag(v.Epoch) {
		rested = max(rested, filledFrom(v))
	}
	if c := &s.Current; v == &s.Previous && rested > c.Effective {
		rested = max(rested, convert(rested, v.Limit, c.Limit, c.Effective))
	}
	return State{TAT: tat, Rested: rested, Epoch: tag, T: v.Limit.t, Burst: v.Limit.burst, Exists: true}
}

// Rebase is st re-stored in the unit of the limit in force at now under s,
// holding the tokens it holds now, and whether that differs from st: when
// the read converted st from another epoch or writer's limit and the key
// is still refilling (its converted TAT is after now, by at most the
// limit's window: booked debt is left as it is). A denied request
// writes it (Decide, Reserve, DecideAll); nothing is consumed.
//
// Without it a key denied before its first admission under a new limit
// stayed stuck at its writer's refill rate: the conversion of a state
// whose write time is unknown takes the tokens it holds at the read
// (fromWriter), so until its TAT passed every read took them afresh and
// none of the new limit's refill since the change counted. A region
// raised from a floor of 333 ppm of a 26/s budget, where one admission
// had moved the TAT 115 s ahead, denied every request at 99.9 % for those
// 115 s (issue 18: the simulator's migrating tenants lost 20.9 % with
// floors of 0.1 %, 2.0 % with this). Re-storing at the read is what an
// admission of cost 0 would write; from then on the key refills at its
// limit's rate.
func Rebase(st State, now int64, s *Schedule) (State, bool) {
	if uint64(now) >= uint64(MaxTime) {
		return st, false
	}
	v, tat := s.resolve(st, now)
	return s.rebase(st, v, tat, now)
}

// rebase is Rebase with the version v in force and the TAT tat st stands
// for under it already resolved.
func (s *Schedule) rebase(st State, v *Version, tat, now int64) (State, bool) {
	if !st.Exists || tat <= now || !v.Limit.usable() || tat-now > v.Limit.burst*v.Limit.t {
		// Rested; or the zero limit (writes nothing); or booked past the
		// window, where no admission could write (the debt's slots are
		// kept by every later read as they are).
		return st, false
	}
	tag := EpochTag(v.Epoch)
	if st.under(&v.Limit) && (st.Epoch == tag || newer(st.Epoch, tag)) {
		return st, false // read as stored
	}
	return s.written(st, v, tat), true
}

// newer reports whether tag a is 1 to 2^39 − 1 ahead of tag b (both
// TagBits wide).
func newer(a, b uint64) bool {
	d := (a - b) & tagMask
	return d != 0 && d < 1<<(TagBits-1)
}

// tatUnder is the TAT that st stands for under version a (in force at now),
// whose predecessor is p when hasP (then a.Effective ≤ now).
//
//   - st written under a: as stored.
//   - st written under p: converted to a at a's effective time.
//   - st written under a newer epoch than a: as stored (never converted back).
//   - st older than p (or than a, with no p): empty at the previous change
//     (a's own effective time, with no p) or its stored TAT if later,
//     converted to a at a's.
//   - no state: as a state older than p — empty at p's own change, refilled
//     under p, converted to a at a's (issue 18: "p's full burst at the
//     change" gave a key p's whole burst when p had replaced a smaller
//     limit less than p's window before, the zero limit or a floor: a
//     unit of burst moved to a region created a token the budget had
//     already spent elsewhere); with no p, rested.
//
// "As stored" and "converted from p" take the TAT in the unit of the limit
// the epoch names for this reader. When the state says it was written under
// another limit (State.T, State.Burst) — a sibling agent of the region that
// ran the key under another epoch slot, a version this reader skipped, or
// the same epoch at another reduced limit — its TAT is converted from that
// limit instead (fromWriter), and a state older than p keeps its own
// tokens that way too, floored at "empty at p's change". Reading another
// limit's TAT in the reader's unit turned a fast writer's admissions into
// a slow reader's credit (the explorer's epoch-slot schedules: OA_budget
// up to 1.1 % of a key).
func tatUnder(st State, now int64, a, p *Version, hasP bool) int64 {
	ta := a.Effective
	tag := EpochTag(a.Epoch)
	if st.Exists {
		switch {
		case st.Epoch == tag || newer(st.Epoch, tag):
			if st.under(&a.Limit) {
				return st.TAT
			}
			return fromWriter(&st, &a.Limit, ta, now)
		case hasP && st.Epoch == EpochTag(p.Epoch):
			if st.under(&p.Limit) {
				return convert(st.TAT, p.Limit, a.Limit, ta)
			}
			return fromWriter(&st, &a.Limit, ta, now)
		}
		// Older than the previous change: empty at that change — or at
		// its own TAT if that is later, so that slots it booked keep
		// their times (forgetting them would let new bookings overlap).
		if !hasP {
			if st.under(&a.Limit) {
				return max(emptyAt(a.Limit, ta), st.TAT)
			}
			return max(emptyAt(a.Limit, ta), fromWriter(&st, &a.Limit, ta, now))
		}
		if st.under(&p.Limit) {
			return convert(max(emptyAt(p.Limit, p.Effective), st.TAT), p.Limit, a.Limit, ta)
		}
		// convert is monotone in the TAT, so this is the rule above with
		// the state's own TAT taken from its writer's unit.
		return max(convert(emptyAt(p.Limit, p.Effective), p.Limit, a.Limit, ta), fromWriter(&st, &a.Limit, ta, now))
	}
	if !hasP {
		return now
	}
	return convert(max(filledFrom(p), ta), p.Limit, a.Limit, ta)
}

// fromWriter is st's TAT, written under its writer's limit, as a TAT under l,
// which has been in force for the reader since ta: the tokens it holds at
// c = max(ta, min(now, TAT)), clamped to l's burst, refilling under l from
// then on (booked debt keeps at least its length in time, as convert
// does). Any c in [ta, now] counts every admission the state records and
// refills at l's rate only while l was in force, so the reader never holds
// more than l allows; the latest such c — the read, or the state's TAT
// when it rested before — keeps a state written long after ta from reading
// its rested time as debt.
func fromWriter(st *State, l *Limit, ta, now int64) int64 {
	c := max(ta, min(now, st.TAT))
	return convert(st.TAT, st.writer(l), *l, c)
}

// filledFrom is the TAT of a key with no state under v: empty at v's
// change, so full one window (Burst·T) after it — or full from the start
// for a version in force since time 0 (Steady's, a cold key's), which
// has always been in force.
func filledFrom(v *Version) int64 {
	if v.Effective <= 0 {
		return 0
	}
	return emptyAt(v.Limit, v.Effective)
}

// emptyAt is the TAT of a key with no tokens left at t under l.
func emptyAt(l Limit, t int64) int64 {
	if !l.usable() {
		return t
	}
	return t + l.burst*l.t
}

// Convert is the TAT under limit to that keeps the tokens a key with TAT
// tat under limit from holds at instant at, clamped to to's burst, as a
// store converts state at a limit change (credit rounded down, booked debt
// kept at least its length in time; see the package documentation). A
// yardstick that changes a key's budget (the simulator's meter at a policy
// reload) uses it to keep the same rule as the stores.
func Convert(tat int64, from, to Limit, at int64) int64 { return convert(tat, from, to, at) }

// mulCap is where the conversion's quotients saturate: MaxTAT, above every
// window (a credit that large is a full burst) and every debt that does not
// saturate the converted TAT itself.
const mulCap = MaxTAT

// convert turns tat, a TAT under limit p, into the TAT under limit a that
// keeps the available tokens at the change time ta, clamped to a's burst:
// tokens = Burst_p − max(tat−ta, 0)/T_p (negative for booked reservations),
// TAT_a = ta + (Burst_a − min(tokens, Burst_a))·T_a. Credit is rounded down
// and debt up, so a conversion never adds tokens. Debt — reservations
// already booked — keeps at least its length in time: the booked requests
// are served at the slots they were given, so under a faster limit new
// bookings start only after the last of them (converting it by tokens
// alone would let the two overlap and serve above the new rate). The result
// saturates at MaxTAT.
//
// Every operand is exact in a double (below 2^53); the products are exact
// 128-bit ones here and in the Lua script (which splits them into 26-bit
// limbs), so both compute the same integer.
func convert(tat int64, p, a Limit, ta int64) int64 {
	if !a.usable() {
		return tat // the zero limit decides nothing and writes nothing
	}
	full := a.burst * a.t
	if !p.usable() {
		// p held nothing; slots booked past ta keep their times (a state
		// older than a zero limit is a sibling's, written under the same
		// version's other epoch slot while this agent ran it reduced:
		// forgetting its bookings let two agents of one region book one
		// slot — explorer schedule 81950 of seed 1, OA_budget 0.6 %).
		d := max(tat-ta, 0)
		if d >= MaxTAT-ta-full {
			return MaxTAT
		}
		return ta + full + d
	}
	d := max(tat-ta, 0)
	credit := p.burst*p.t - d // µs of credit under p; negative is debt
	if credit >= 0 {
		c := mulDivFloor(credit, a.t, p.t)
		if c >= full {
			return ta
		}
		return ta + full - c
	}
	debt := min(-credit, mulCap)
	q := max(debt, mulDivCeil(debt, a.t, p.t))
	if q >= MaxTAT-ta-full {
		return MaxTAT
	}
	return ta + full + q
}

// mulDivFloor is min(floor(x·y/z), mulCap) for 0 ≤ x ≤ MaxTAT and
// 0 < y, z ≤ MaxWindowMicros.
func mulDivFloor(x, y, z int64) int64 {
	q, _ := mulDiv(x, y, z)
	return q
}

// mulDivCeil is min(ceil(x·y/z), mulCap) under the same bounds.
func mulDivCeil(x, y, z int64) int64 {
	q, r := mulDiv(x, y, z)
	if r != 0 && q < mulCap {
		q++
	}
	return q
}

// mulDiv is floor(x·y/z) and its remainder, the quotient saturating at
// mulCap (remainder 0 then).
func mulDiv(x, y, z int64) (int64, uint64) {
	hi, lo := bits.Mul64(uint64(x), uint64(y))
	if hi >= uint64(z) {
		return mulCap, 0
	}
	q, r := bits.Div64(hi, lo, uint64(z))
	if q >= uint64(mulCap) {
		return mulCap, 0
	}
	return int64(q), r
}
