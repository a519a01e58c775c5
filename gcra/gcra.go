package gcra

import (
	"errors"
	"fmt"
	"time"
)

// State is what a store keeps for one key: the theoretical arrival time and
// the epoch tag of the limit it was written under. Exists is false for a key
// with no state (never written, or expired once rested).
//
// Rested is set on the states Decide, Reserve and DecideAll return for
// writing: the instant (µs) from which the key holds its full burst under
// every limit its schedule names, including a change still pending at the
// write. From then on a missing key decides exactly like this state, so a
// store may drop it (Redis: PX). Stores keep a state as its Value, which
// does not hold Rested; the expiry carries it.
//
// T and Burst are the limit the TAT was written under — the unit its
// tokens are counted in — so that a reader under another limit converts it
// exactly (see Schedule). Both are zero when unknown: a state an older
// release wrote (a 12-byte Value or a packed integer), which is read as
// that release read it.
type State struct {
	TAT    int64  // theoretical arrival time, µs on the store's clock
	Rested int64  // µs; see above. Not part of the stored Value.
	Epoch  uint64 // EpochTag of the limit the state was written under (TagBits wide)
	T      int64  // the writer's emission interval, µs; 0: unknown
	Burst  int64  // the writer's burst; 0: unknown
	Exists bool
}

// writer is the limit st's TAT was written under, or def when st does not
// say (an older release wrote it).
func (st *State) writer(def *Limit) Limit {
	if st.T == 0 {
		return *def
	}
	return FromInterval(st.T, st.Burst)
}

// under reports whether st's TAT counts tokens in l's unit: its writer's
// limit is l, or unknown.
func (st *State) under(l *Limit) bool {
	return st.T == 0 || (st.T == l.t && st.Burst == l.burst)
}

// Result is the outcome of one decision. A denial is a Result, never an
// error.
type Result struct {
	// Limit is the limit the decision was made under (for a composite, the
	// one that bound it).
	Limit Limit
	// Allowed reports whether the request was admitted (or, for a
	// reservation, booked).
	Allowed bool
	// TooLarge reports a request that can never be admitted under Limit:
	// its cost exceeds Burst, or Limit is the zero limit. RetryAfter is Never.
	TooLarge bool
	// Remaining is how many more cost-1 requests would be admitted right
	// now, after this decision: floor((Burst·T − (TAT − now))/T) in [0, Burst].
	Remaining int64
	// RetryAfter is, for a denial, exactly how long until the same request
	// would be admitted; zero when allowed; Never when TooLarge.
	RetryAfter time.Duration
	// ResetAfter is how long until the key is fully rested (max(TAT−now, 0)
	// after this decision).
	ResetAfter time.Duration
	// Wait is, for a booked reservation, how long the caller must wait
	// before acting on it; zero otherwise.
	Wait time.Duration
}

// Errors for bad input. Stores return them (possibly wrapped) and write
// nothing.
var (
	ErrNegativeCost  = errors.New("gcra: cost must not be negative")
	ErrInvalidLimit  = errors.New("gcra: invalid limit")
	ErrNegativeWait  = errors.New("gcra: maxWait must not be negative")
	ErrWaitTooLong   = errors.New("gcra: burst window plus maxWait exceeds gcra.MaxWindow")
	ErrEmptyKey      = errors.New("gcra: empty key name")
	ErrKeyTooLong    = fmt.Errorf("gcra: key longer than %d bytes", MaxKeyLen)
	ErrNoChecks      = errors.New("gcra: composite check with no limits")
	ErrTooManyChecks = fmt.Errorf("gcra: composite check with more than %d limits", MaxChecks)
)

// MaxTime bounds every instant the core takes (now, effective times):
// [0, 2^52) µs, about 142 years from the clock's zero, so every TAT and
// duration stays an exact integer below 2^53 in Redis's Lua too.
const MaxTime = int64(1) << 52

// ErrBadTime is returned for a now outside [0, MaxTime).
var ErrBadTime = errors.New("gcra: now outside [0, 2^52) µs")

// MaxKeyLen is the longest key (Tag plus Name, in bytes) a store accepts.
const MaxKeyLen = 1024

// MaxChecks is the most limits one composite decision may combine.
const MaxChecks = 32

func micros(us int64) time.Duration { return time.Duration(us) * time.Microsecond }

// remaining is floor((Burst·T − (tat − now))/T) clamped to [0, Burst], for
// tat ≥ now.
func remaining(l *Limit, tat, now int64) int64 {
	slack := l.burst*l.t - (tat - now)
	if slack <= 0 {
		return 0
	}
	r := slack / l.t
	if r > l.burst {
		r = l.burst
	}
	return r
}

// tooLarge is the result for a request that can never be admitted.
func tooLarge(l Limit, tat, now int64) Result {
	r := Result{Limit: l, TooLarge: true, RetryAfter: Never}
	if l.usable() {
		base := max(tat, now)
		r.Remaining = remaining(&l, base, now)
		r.ResetAfter = micros(base - now)
	}
	return r
}

// step is GCRA on one TAT under one limit: the decision for cost n at now,
// written into r, and the TAT to store if it is admitted. The limit must be
// usable and 0 ≤ n ≤ Burst (checked by the callers before any
// multiplication).
func step(l *Limit, tat, now, n int64, r *Result) int64 {
	base := max(tat, now)
	next := base + n*l.t
	r.Limit = *l
	if allowAt := next - l.burst*l.t; allowAt > now {
		r.Remaining = remaining(l, base, now)
		r.RetryAfter = micros(allowAt - now)
		r.ResetAfter = micros(base - now)
		return tat
	}
	r.Allowed = true
	r.Remaining = remaining(l, next, now)
	r.ResetAfter = micros(next - now)
	return next
}

// Allow decides a request of cost n at now against a key whose TAT is tat
// (pass tat ≤ now for a rested key) under a single limit that never changes.
// It returns the TAT to store when Result.Allowed and n > 0. It is the bare
// algorithm of ARCHITECTURE.md, with no epochs; stores use Decide.
func Allow(l Limit, tat, now, n int64) (int64, Result, error) {
	switch {
	case n < 0:
		return tat, Result{}, ErrNegativeCost
	case !l.usable() || n > l.burst:
		if !l.IsZero() && !l.usable() {
			return tat, Result{}, ErrInvalidLimit
		}
		return tat, tooLarge(l, tat, now), nil
	}
	var r Result
	next := step(&l, tat, now, n, &r)
	return next, r, nil
}

// Decide decides a request of cost n at now for a key with state st under
// the schedule s: it picks the limit in force at now, converts st to it as
// "limit changes keep tokens" requires, and applies GCRA. It returns the
// state to write and whether to write it: an admitted request with n > 0
// writes, and so does a denied one whose state was read through a
// conversion (see Rebase); cost 0 peeks: Allowed reports whether the key
// is not over its limit, and nothing is written.
//
// Decide does not validate s; stores call s.Validate first. An invalid limit
// in s decides as the zero limit (denies), never panics.
func Decide(st State, now int64, s *Schedule, n int64) (next State, write bool, r Result, err error) {
	switch {
	case n < 0:
		return st, false, r, ErrNegativeCost
	case uint64(now) >= uint64(MaxTime):
		return st, false, r, ErrBadTime
	}
	v, tat := s.resolve(st, now)
	if !v.Limit.ok || n > v.Limit.burst {
		return st, false, tooLarge(v.Limit, tat, now), nil
	}
	t := step(&v.Limit, tat, now, n, &r)
	if n == 0 {
		return st, false, r, nil
	}
	if !r.Allowed {
		next, write := s.rebase(st, v, tat, now)
		return next, write, r, nil
	}
	return s.written(st, v, t), true, r, nil
}

// Reserve books the next slot for a request of cost n at now if the wait
// until it may act is at most maxWait (µs): the TAT moves forward by n·T and
// Result.Wait says how long to wait. Otherwise it books nothing and
// Result.RetryAfter says how long until the request would be admitted
// without waiting. Burst·T + maxWait must not exceed MaxWindow.
func Reserve(st State, now int64, s *Schedule, n, maxWait int64) (State, bool, Result, error) {
	switch {
	case n < 0:
		return st, false, Result{}, ErrNegativeCost
	case maxWait < 0:
		return st, false, Result{}, ErrNegativeWait
	case uint64(now) >= uint64(MaxTime):
		return st, false, Result{}, ErrBadTime
	}
	v, tat := s.resolve(st, now)
	l := &v.Limit
	if !l.usable() || n > l.burst {
		return st, false, tooLarge(*l, tat, now), nil
	}
	if maxWait > MaxWindowMicros-l.burst*l.t {
		return st, false, Result{}, ErrWaitTooLong
	}
	base := max(tat, now)
	next := base + n*l.t
	wait := next - l.burst*l.t - now
	if wait < 0 {
		wait = 0
	}
	if wait > maxWait {
		r := Result{
			Limit:      *l,
			Remaining:  remaining(l, base, now),
			RetryAfter: micros(wait),
			ResetAfter: micros(base - now),
		}
		if n == 0 {
			return st, false, r, nil
		}
		next, write := s.rebase(st, v, tat, now)
		return next, write, r, nil
	}
	r := Result{
		Limit:      *l,
		Allowed:    true,
		Remaining:  remaining(l, next, now),
		ResetAfter: micros(next - now),
		Wait:       micros(wait),
	}
	if n == 0 {
		return st, false, r, nil
	}
	return s.written(st, v, next), true, r, nil
}

// DecideAll decides several limits together, all or nothing: every check is
// evaluated at now against its own state; if all admit, next receives the
// states to write and write is true; if any denies, nothing is consumed:
// next holds each state as it was, or re-stored in its limit's unit where
// it was read through a conversion (Rebase, for checks of cost above 0),
// and write says whether any was.
// out receives each check's own result: as if decided alone when all admit;
// when any denies, Allowed is false for all, and a limit that would have
// admitted reports its untouched state (nothing was consumed). The combined
// Result, folded from out by Combine, is returned:
// Allowed when all allow, TooLarge when any is too large, RetryAfter the
// largest retry-after, Remaining the smallest, ResetAfter the largest, and
// Limit the limit that bound the decision.
//
// states, next and out must have len(checks) elements; next and out may
// alias nothing else. A key listed twice is decided twice against the same
// stored state (list each key once).
func DecideAll(now int64, checks []Check, states, next []State, out []Result) (Result, bool, error) {
	switch {
	case len(checks) == 0:
		return Result{}, false, ErrNoChecks
	case len(checks) > MaxChecks:
		return Result{}, false, ErrTooManyChecks
	case len(states) != len(checks) || len(next) != len(checks) || len(out) != len(checks):
		return Result{}, false, errors.New("gcra: DecideAll: states, next and out must match checks in length")
	}
	if uint64(now) >= uint64(MaxTime) {
		return Result{}, false, ErrBadTime
	}
	for i := range checks {
		if checks[i].Cost < 0 {
			return Result{}, false, ErrNegativeCost
		}
	}
	write := false
	for i := range checks {
		c := &checks[i]
		st, w, r, _ := Decide(states[i], now, &c.Schedule, c.Cost)
		next[i], out[i] = st, r
		write = write || w
	}
	all := Combine(out)
	if !all.Allowed {
		write = false
		for i := range out {
			if out[i].Allowed {
				// This limit would have admitted; with the composite denied,
				// nothing is consumed, so report its untouched state.
				_, _, r, _ := Decide(states[i], now, &checks[i].Schedule, 0)
				r.Allowed = false
				out[i] = r
				next[i] = states[i]
				if checks[i].Cost > 0 {
					next[i], _ = Rebase(states[i], now, &checks[i].Schedule)
				}
			}
			// A denied check's next is what Decide left: the state as it
			// was, or re-stored (Rebase).
			write = write || next[i] != states[i]
		}
		return Combine(out), write, nil
	}
	return all, write, nil
}

// Combine folds per-limit results into the result of a composite decision:
// allowed iff all allowed; too large if any is; the largest RetryAfter and
// ResetAfter, the smallest Remaining; Limit is the limit that bound it (the
// denial with the largest retry-after, else the one with the fewest
// remaining).
func Combine(rs []Result) Result {
	if len(rs) == 0 {
		return Result{}
	}
	c := rs[0]
	bind := 0
	for i := 1; i < len(rs); i++ {
		r := &rs[i]
		c.Allowed = c.Allowed && r.Allowed
		c.TooLarge = c.TooLarge || r.TooLarge
		c.ResetAfter = max(c.ResetAfter, r.ResetAfter)
		c.Wait = max(c.Wait, r.Wait)
		b := &rs[bind]
		switch {
		case r.RetryAfter > b.RetryAfter:
			bind = i
		case r.RetryAfter == b.RetryAfter && r.Remaining < b.Remaining:
			bind = i
		}
		c.Remaining = min(c.Remaining, r.Remaining)
		c.RetryAfter = max(c.RetryAfter, r.RetryAfter)
	}
	c.Limit = rs[bind].Limit
	return c
}
