package gcra_test

import (
	"flag"
	"fmt"
	"math/big"
	"os"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/gcra"
	"pgregory.net/rapid"
)

const maxWindow = gcra.MaxWindowMicros

// span is the scale of the time offsets the change properties draw: 36 h,
// the windows of every limit genLimit draws and then some. genChange also
// draws long limits, whose windows reach span·64 (about 96 days).
const span = int64(36*3600) * 1_000_000

// TestMain keeps rapid from writing testdata/rapid/*.fail files into the
// package directory unless asked to (-rapid.nofailfile=false); a failure
// still prints the -rapid.seed that reproduces it.
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "rapid.nofailfile" })
	if !set {
		if err := flag.Set("rapid.nofailfile", "true"); err != nil {
			panic(err)
		}
	}
	os.Exit(m.Run())
}

// genLimit draws a limit with T in [1, 10⁷] µs and Burst in [1, 1000].
func genLimit(t *rapid.T, label string) gcra.Limit {
	T := rapid.Int64Range(1, 10_000_000).Draw(t, label+"T")
	b := rapid.Int64Range(1, 1000).Draw(t, label+"Burst")
	l := gcra.FromInterval(T, b)
	if err := l.Validate(); err != nil {
		t.Fatalf("generated an invalid limit: %v", err)
	}
	return l
}

// genDelta draws a time step ≥ 0 at the scales that matter for l: none,
// within one interval, within a few windows.
func genDelta(t *rapid.T, l gcra.Limit, label string) int64 {
	T, w := l.IntervalMicros(), l.Burst()*l.IntervalMicros()
	return rapid.OneOf(
		rapid.Just(int64(0)),
		rapid.Int64Range(0, T),
		rapid.Int64Range(0, 3*w),
	).Draw(t, label)
}

func us(d time.Duration) int64 { return int64(d / time.Microsecond) }

// bucket is an independent model: a token bucket whose level is kept in µs
// of credit (tokens·T), refilled one µs per µs up to Burst·T. A request of
// cost n needs n·T of credit; reservations may drive the level negative.
type bucket struct {
	T, B, level int64
}

func (m *bucket) refill(dt int64) { m.level = min(m.B*m.T, m.level+dt) }

func (m *bucket) remaining() int64 {
	if m.level <= 0 {
		return 0
	}
	return m.level / m.T
}

// TestPropertyMatchesTokenBucket drives Decide and Reserve with random
// traffic and checks every field of every result, and every written TAT,
// against the token-bucket model.
func TestPropertyMatchesTokenBucket(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		l := genLimit(t, "")
		sch := gcra.Steady(l)
		T, B := l.IntervalMicros(), l.Burst()
		m := bucket{T: T, B: B, level: B * T}
		now := rapid.Int64Range(0, 1<<50).Draw(t, "start")
		var st gcra.State
		nSteps := rapid.IntRange(1, 100).Draw(t, "steps")
		for i := 0; i < nSteps; i++ {
			dt := genDelta(t, l, "dt")
			now += dt
			m.refill(dt)
			n := rapid.Int64Range(0, B+2).Draw(t, "cost")
			reserve := rapid.Bool().Draw(t, "reserve")
			var (
				next  gcra.State
				write bool
				r     gcra.Result
				err   error
				want  = gcra.Result{Limit: l}
			)
			if reserve {
				maxWait := rapid.Int64Range(0, min(maxWindow-B*T, 3*B*T)).Draw(t, "maxWait")
				next, write, r, err = gcra.Reserve(st, now, &sch, n, maxWait)
				switch wait := max(n*T-m.level, 0); {
				case n > B:
					want.TooLarge, want.RetryAfter = true, gcra.Never
				case wait <= maxWait:
					m.level -= n * T
					want.Allowed, want.Wait = true, time.Duration(wait)*time.Microsecond
				default:
					want.RetryAfter = time.Duration(wait) * time.Microsecond
				}
			} else {
				next, write, r, err = gcra.Decide(st, now, &sch, n)
				switch {
				case n > B:
					want.TooLarge, want.RetryAfter = true, gcra.Never
				case m.level >= n*T:
					m.level -= n * T
					want.Allowed = true
				default:
					want.RetryAfter = time.Duration(n*T-m.level) * time.Microsecond
				}
			}
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			want.Remaining = m.remaining()
			want.ResetAfter = time.Duration(B*T-m.level) * time.Microsecond
			if r != want {
				t.Fatalf("step %d (now %d, n %d, reserve %v):\n got %+v\nwant %+v", i, now, n, reserve, r, want)
			}
			if wantWrite := want.Allowed && n > 0; write != wantWrite {
				t.Fatalf("step %d: write = %v, want %v", i, write, wantWrite)
			}
			if write {
				if wantTAT := now + B*T - m.level; next.TAT != wantTAT || !next.Exists || next.Epoch != 0 {
					t.Fatalf("step %d: wrote %+v, want TAT %d", i, next, wantTAT)
				}
				st = next
			} else if next != st {
				t.Fatalf("step %d: no write, but state %+v became %+v", i, st, next)
			}
		}
	})
}

type admitted struct{ at, n int64 }

// TestPropertyAdmissionBound checks the GCRA bound directly: the cost
// admitted at request times within any [a, b] is at most
// Burst + floor((b−a)/T).
func TestPropertyAdmissionBound(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		l := genLimit(t, "")
		sch := gcra.Steady(l)
		T, B := l.IntervalMicros(), l.Burst()
		now := rapid.Int64Range(0, 1<<50).Draw(t, "start")
		var st gcra.State
		var log []admitted
		nSteps := rapid.IntRange(1, 150).Draw(t, "steps")
		for i := 0; i < nSteps; i++ {
			now += genDelta(t, l, "dt")
			n := rapid.Int64Range(0, B+2).Draw(t, "cost")
			next, write, r, err := gcra.Decide(st, now, &sch, n)
			if err != nil {
				t.Fatal(err)
			}
			if write {
				st = next
			}
			if r.Allowed && n > 0 {
				log = append(log, admitted{now, n})
			}
		}
		for i := range log {
			if i > 0 && log[i-1].at == log[i].at {
				continue // windows start at the first request of an instant
			}
			sum := int64(0)
			for j := i; j < len(log); j++ {
				sum += log[j].n
				if j+1 < len(log) && log[j+1].at == log[j].at {
					continue // and end at the last
				}
				if bound := B + (log[j].at-log[i].at)/T; sum > bound {
					t.Fatalf("admitted cost %d in [%d, %d] (%dµs), bound %d: %v", sum, log[i].at, log[j].at, log[j].at-log[i].at, bound, log)
				}
			}
		}
	})
}

// TestPropertyDenialAndRetryAfter: a denial changes nothing, and its
// RetryAfter is exact — the same request from the same state is admitted at
// now+RetryAfter and denied 1µs earlier.
func TestPropertyDenialAndRetryAfter(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		l := genLimit(t, "")
		sch := gcra.Steady(l)
		B := l.Burst()
		now := rapid.Int64Range(0, 1<<50).Draw(t, "start")
		var st gcra.State
		nSteps := rapid.IntRange(1, 100).Draw(t, "steps")
		for i := 0; i < nSteps; i++ {
			now += genDelta(t, l, "dt")
			n := rapid.Int64Range(0, B+2).Draw(t, "cost")
			next, write, r, err := gcra.Decide(st, now, &sch, n)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case r.Allowed:
				if r.RetryAfter != 0 || r.TooLarge {
					t.Fatalf("admitted with %+v", r)
				}
				if write {
					st = next
				}
				continue
			case r.TooLarge:
				if n <= B || r.RetryAfter != gcra.Never {
					t.Fatalf("n=%d (burst %d): %+v", n, B, r)
				}
			default:
				if n > B || r.RetryAfter <= 0 {
					t.Fatalf("n=%d (burst %d) denied with %+v", n, B, r)
				}
				ra := us(r.RetryAfter)
				if time.Duration(ra)*time.Microsecond != r.RetryAfter {
					t.Fatalf("RetryAfter %v is not whole µs", r.RetryAfter)
				}
				if _, _, early, _ := gcra.Decide(st, now+ra-1, &sch, n); early.Allowed {
					t.Fatalf("admitted 1µs before RetryAfter %v (state %+v, now %d, n %d)", r.RetryAfter, st, now, n)
				}
				if _, _, onTime, _ := gcra.Decide(st, now+ra, &sch, n); !onTime.Allowed {
					t.Fatalf("denied at now+RetryAfter %v: %+v", r.RetryAfter, onTime)
				}
			}
			if write || next != st {
				t.Fatalf("denial wrote: write=%v, %+v -> %+v", write, st, next)
			}
		}
	})
}

// TestPropertyRemainingExact: after any decision, exactly Remaining more
// cost-1 requests at the same instant are admitted, and the next is denied.
func TestPropertyRemainingExact(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		l := genLimit(t, "")
		sch := gcra.Steady(l)
		B := l.Burst()
		now := rapid.Int64Range(0, 1<<50).Draw(t, "start")
		var st gcra.State
		nSteps := rapid.IntRange(1, 40).Draw(t, "steps")
		for i := 0; i < nSteps; i++ {
			now += genDelta(t, l, "dt")
			n := rapid.Int64Range(0, B+2).Draw(t, "cost")
			next, write, r, err := gcra.Decide(st, now, &sch, n)
			if err != nil {
				t.Fatal(err)
			}
			if write {
				st = next
			}
			probe := st
			for k := int64(0); k < r.Remaining; k++ {
				p, w, pr, _ := gcra.Decide(probe, now, &sch, 1)
				if !pr.Allowed || !w {
					t.Fatalf("Remaining %d, but request %d of them was denied: %+v", r.Remaining, k+1, pr)
				}
				if pr.Remaining != r.Remaining-k-1 {
					t.Fatalf("Remaining went %d -> %d after one", r.Remaining-k, pr.Remaining)
				}
				probe = p
			}
			if _, _, pr, _ := gcra.Decide(probe, now, &sch, 1); pr.Allowed {
				t.Fatalf("Remaining %d, but one more request was admitted", r.Remaining)
			}
		}
	})
}

// tokensBound checks one limit change at ta: R = TAT' − ta is what the key
// holds under a at the change time (tokens_a = Burst_a − R/T_a), and
// creditP = Burst_p·T_p − max(tat−ta, 0) is what it held under p
// (tokens_p = creditP/T_p, negative for booked debt). The conversion must
// never raise tokens — tokens_a ≤ min(tokens_p, Burst_a) — and must lose
// less than 1µs of a's credit, unless the TAT saturates at gcra.MaxTAT
// (documented in schedule.go).
func tokensBound(t *rapid.T, what string, p, a gcra.Limit, creditP, ta, R int64) {
	Tp, Ta := big.NewInt(p.IntervalMicros()), big.NewInt(a.IntervalMicros())
	fullA := a.Burst() * a.IntervalMicros()
	if R < 0 || ta+R > gcra.MaxTAT {
		t.Fatalf("%s: converted TAT %dµs after the change, outside [0, MaxTAT − ta]", what, R)
	}
	if creditP < 0 {
		// Booked reservations: the debt keeps the larger of its length in
		// time and its tokens at a's rate (rounded up); the TAT saturates
		// at MaxTAT.
		debt := -creditP
		q := new(big.Int).Mul(big.NewInt(debt), Ta)
		q.Add(q, new(big.Int).Sub(Tp, big.NewInt(1)))
		q.Div(q, Tp)
		if q.Cmp(big.NewInt(debt)) < 0 {
			q.SetInt64(debt)
		}
		want := new(big.Int).Add(q, big.NewInt(ta+fullA))
		if want.Cmp(big.NewInt(gcra.MaxTAT)) > 0 {
			want.SetInt64(gcra.MaxTAT)
		}
		if ta+R != want.Int64() {
			t.Fatalf("%s: debt %dµs under %v converted to TAT +%dµs under %v, want +%d", what, debt, p, R, a, want.Int64()-ta)
		}
		return
	}
	// Everything in units of µs(a)·µs(p): tokens·T_a·T_p.
	have := new(big.Int).Mul(big.NewInt(fullA-R), Tp)   // tokens_a·Ta·Tp
	credit := new(big.Int).Mul(big.NewInt(creditP), Ta) // tokens_p·Ta·Tp
	capA := new(big.Int).Mul(big.NewInt(fullA), Tp)     // Burst_a·Ta·Tp
	limit := credit
	if capA.Cmp(limit) < 0 {
		limit = capA
	}
	if have.Cmp(limit) > 0 {
		t.Fatalf("%s: conversion raised tokens: %s/%d·%d > min(%d/%d, %d) (p=%v a=%v creditP=%d R=%d)",
			what, have, Ta, Tp, creditP, Tp, a.Burst(), p, a, creditP, R)
	}
	lost := new(big.Int).Sub(limit, have)
	if lost.Cmp(Tp) >= 0 {
		t.Fatalf("%s: conversion lost %s/(Ta·Tp) tokens, ≥ 1µs of a's credit (p=%v a=%v creditP=%d R=%d)",
			what, lost, p, a, creditP, R)
	}
}

// peekReset returns max(TAT' − now, 0) in µs for the state Decide sees.
func peekReset(t *rapid.T, st gcra.State, now int64, sch *gcra.Schedule, want gcra.Limit) int64 {
	next, write, r, err := gcra.Decide(st, now, sch, 0)
	if err != nil || write || next != st {
		t.Fatalf("peek: err %v write %v next %+v", err, write, next)
	}
	if r.Limit != want {
		t.Fatalf("peek at %d decided under %v, want %v", now, r.Limit, want)
	}
	return us(r.ResetAfter)
}

type changeCase struct {
	p, a     gcra.Limit
	pe, ae   uint64
	pEff, ta int64
	sch      gcra.Schedule
	windowP  int64 // Burst_p·T_p
	windowA  int64
}

// genLongLimit draws a limit of a long period: T up to a year's worth of
// µs, the window up to 64·span.
func genLongLimit(t *rapid.T, label string) gcra.Limit {
	T := rapid.Int64Range(1, 365*24*3600*1_000_000).Draw(t, label+"T")
	b := rapid.Int64Range(1, max(1, min(1000, 64*span/T))).Draw(t, label+"Burst")
	return gcra.FromInterval(T, b)
}

func genChange(t *rapid.T) changeCase {
	var c changeCase
	lim := func(label string) gcra.Limit {
		if rapid.IntRange(0, 3).Draw(t, label+"Long") == 0 {
			return genLongLimit(t, label)
		}
		return genLimit(t, label)
	}
	c.p = lim("prev")
	c.a = lim("cur")
	c.pe = rapid.Uint64().Draw(t, "prevEpoch")
	c.ae = c.pe + rapid.Uint64Range(1, 1000).Draw(t, "epochStep")
	c.ta = rapid.Int64Range(3*span, 1<<50).Draw(t, "effective")
	c.pEff = c.ta - rapid.Int64Range(0, 2*span).Draw(t, "prevAge")
	c.sch = gcra.Change(
		gcra.Version{Limit: c.p, Epoch: c.pe, Effective: c.pEff},
		gcra.Version{Limit: c.a, Epoch: c.ae, Effective: c.ta})
	if err := c.sch.Validate(); err != nil {
		t.Fatalf("generated schedule invalid: %v", err)
	}
	c.windowP = c.p.Burst() * c.p.IntervalMicros()
	c.windowA = c.a.Burst() * c.a.IntervalMicros()
	return c
}

// TestPropertyLimitChangeKeepsTokens: a state written under the previous
// limit, seen at or after the change, holds no more tokens than it had at
// the change (clamped to the new burst), and the conversion is evaluated at
// the change, not at the request.
func TestPropertyLimitChangeKeepsTokens(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := genChange(t)
		// Where the TAT stood relative to the change: rested, partly used,
		// exhausted, or booked ahead by reservations.
		off := rapid.OneOf(
			rapid.Int64Range(-3*c.windowP, c.windowP),
			rapid.Int64Range(c.windowP, min(maxWindow, 5*c.windowP)),
			rapid.Int64Range(-span, span),
		).Draw(t, "tatOffset")
		st := gcra.State{TAT: c.ta + off, Epoch: gcra.EpochTag(c.pe), Exists: true}
		creditP := c.windowP - max(off, 0)

		R := peekReset(t, st, c.ta, &c.sch, c.a)
		tokensBound(t, "prev-epoch state", c.p, c.a, creditP, c.ta, R)
		clamped := c.ta+R == gcra.MaxTAT

		// Later, the same conversion refilled at a's rate.
		delta := rapid.Int64Range(0, 2*c.windowA).Draw(t, "later")
		if got := peekReset(t, st, c.ta+delta, &c.sch, c.a); !clamped && got != max(R-delta, 0) {
			t.Fatalf("at ta+%d: reset %d, want %d (conversion must be evaluated at ta)", delta, got, max(R-delta, 0))
		}
		// An admitted request writes the current epoch's tag on the converted TAT.
		now := c.ta + delta
		next, write, r, _ := gcra.Decide(st, now, &c.sch, 1)
		if !clamped {
			wantAllowed := max(c.ta+R, now)+c.a.IntervalMicros()-now <= c.windowA
			if r.Allowed != wantAllowed {
				t.Fatalf("cost 1 at ta+%d: allowed %v, want %v", delta, r.Allowed, wantAllowed)
			}
			if write && r.Allowed && (next.Epoch != gcra.EpochTag(c.ae) || next.TAT != max(c.ta+R, now)+c.a.IntervalMicros()) {
				t.Fatalf("wrote %+v, want TAT %d tag %d", next, max(c.ta+R, now)+c.a.IntervalMicros(), gcra.EpochTag(c.ae))
			}
			// A denial re-stores the converted TAT, consuming nothing.
			if write && !r.Allowed && (next.Epoch != gcra.EpochTag(c.ae) || next.TAT != c.ta+R) {
				t.Fatalf("denied: wrote %+v, want the converted TAT %d tag %d", next, c.ta+R, gcra.EpochTag(c.ae))
			}
		}

		// Before the change the previous limit decides the stored TAT as is.
		if c.pEff < c.ta {
			before := rapid.Int64Range(c.pEff, c.ta-1).Draw(t, "before")
			if got := peekReset(t, st, before, &c.sch, c.p); got != max(st.TAT-before, 0) {
				t.Fatalf("before the change: reset %d, want %d", got, max(st.TAT-before, 0))
			}
			next, write, _, _ := gcra.Decide(st, before, &c.sch, 1)
			if write && next.Epoch != gcra.EpochTag(c.pe) {
				t.Fatalf("before the change: wrote tag %d, want previous %d", next.Epoch, gcra.EpochTag(c.pe))
			}
		}
	})
}

// TestPropertyLimitChangeNoState: a key with no state reads exactly as a
// state older than the previous version does — empty at the previous
// change, refilled under the previous limit, converted at the current
// change (so never more than min(Burst_p, Burst_a) under a) — or holds
// nothing when the previous limit was zero; before the change, it is
// empty at the previous change and refills under the previous limit.
//
// Fails on 1783ef8: a missing key held the previous limit's full burst at
// the change however recently the previous limit itself took over — from
// the zero limit or a floor, say — which gave a region a unit of burst the
// budget had spent elsewhere (explorer schedule 266 of seed 1 with the
// fence at 1 s: OA_budget 0.7 % of a key with no fault at all).
func TestPropertyLimitChangeNoState(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := genChange(t)
		zeroPrev := rapid.Bool().Draw(t, "zeroPrev")
		if zeroPrev {
			c.sch.Previous.Limit = gcra.Limit{}
		}
		older := gcra.State{TAT: c.pEff, Epoch: gcra.EpochTag(c.pe - 1), Exists: true}
		R := peekReset(t, gcra.State{}, c.ta, &c.sch, c.a)
		if want := peekReset(t, older, c.ta, &c.sch, c.a); R != want {
			t.Fatalf("no state at the change: TAT ta+%d, want ta+%d as a state older than the previous version", R, want)
		}
		switch {
		case zeroPrev:
			if R != c.windowA {
				t.Fatalf("no state after a zero limit: TAT ta+%d, want ta+%d (empty)", R, c.windowA)
			}
		default:
			creditP := c.windowP - max(c.pEff+c.windowP-c.ta, 0)
			tokensBound(t, "no state", c.p, c.a, creditP, c.ta, R)
		}
		delta := rapid.Int64Range(0, 2*c.windowA).Draw(t, "later")
		if got, want := peekReset(t, gcra.State{}, c.ta+delta, &c.sch, c.a), peekReset(t, older, c.ta+delta, &c.sch, c.a); got != want || got != max(R-delta, 0) {
			t.Fatalf("no state at ta+%d: reset %d, want %d (older state %d)", delta, got, max(R-delta, 0), want)
		}
		next, write, r, _ := gcra.Decide(gcra.State{}, c.ta+delta, &c.sch, 1)
		if r.Allowed && (!write || next.Epoch != gcra.EpochTag(c.ae)) {
			t.Fatalf("no state: admitted write %v %+v, want current tag %d", write, next, gcra.EpochTag(c.ae))
		}
		// Before the change: empty at the previous change, refilling.
		if !zeroPrev && c.pEff < c.ta {
			before := rapid.Int64Range(c.pEff, c.ta-1).Draw(t, "before")
			if got, want := peekReset(t, gcra.State{}, before, &c.sch, c.p), max(c.pEff+c.windowP-before, 0); got != want {
				t.Fatalf("no state before the change: reset %d, want %d (empty at the previous change)", got, want)
			}
		}
	})
}

// TestPropertyLimitChangeOlderState: state tagged before the previous
// epoch counts as empty at the previous change — or as its stored TAT if
// that is later, so that slots it booked keep their times — and refills at
// the previous limit's rate until the current change.
func TestPropertyLimitChangeOlderState(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := genChange(t)
		tag := gcra.EpochTag(c.pe - rapid.Uint64Range(1, 1000).Draw(t, "age"))
		tat := c.ta + rapid.Int64Range(-span, span).Draw(t, "tatOffset")
		st := gcra.State{TAT: tat, Epoch: tag, Exists: true}
		tatP := max(c.pEff+c.windowP, tat) // the state under p
		creditP := c.windowP - max(tatP-c.ta, 0)
		tokensBound(t, "older state", c.p, c.a, creditP, c.ta, peekReset(t, st, c.ta, &c.sch, c.a))
		if c.pEff < c.ta {
			before := rapid.Int64Range(c.pEff, c.ta-1).Draw(t, "before")
			want := max(tatP-before, 0)
			if got := peekReset(t, st, before, &c.sch, c.p); got != want {
				t.Fatalf("older state before the change: reset %d, want %d (empty at the previous change, or its TAT)", got, want)
			}
		}
	})
}

// TestPropertyLimitChangeNewerState: state written under an epoch newer
// than the caller's current one is used as stored, and keeps its tag.
func TestPropertyLimitChangeNewerState(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := genChange(t)
		// Ahead of the current epoch, and so (by at most 2^39−1) of the previous one.
		tag := gcra.EpochTag(c.ae + rapid.Uint64Range(1, 1<<39-1-1000).Draw(t, "ahead"))
		if rapid.Bool().Draw(t, "sameAsCurrent") {
			tag = gcra.EpochTag(c.ae) // the current epoch: also as stored
		}
		now := c.ta + rapid.Int64Range(-span, span).Draw(t, "nowOffset")
		tat := now + rapid.Int64Range(-3*c.windowA, c.windowA).Draw(t, "tatOffset")
		st := gcra.State{TAT: tat, Epoch: tag, Exists: true}
		l := c.a
		if now < c.ta {
			l = c.p
		}
		if got := peekReset(t, st, now, &c.sch, l); got != max(tat-now, 0) {
			t.Fatalf("newer state: reset %d, want %d (as stored)", got, max(tat-now, 0))
		}
		next, write, r, _ := gcra.Decide(st, now, &c.sch, 1)
		wantTAT := max(tat, now) + l.IntervalMicros()
		if wantAllowed := wantTAT-now <= l.Burst()*l.IntervalMicros(); r.Allowed != wantAllowed {
			t.Fatalf("newer state: allowed %v, want %v", r.Allowed, wantAllowed)
		}
		if write && (next.TAT != wantTAT || next.Epoch != tag) {
			t.Fatalf("newer state: wrote %+v, want TAT %d with the stored tag %d", next, wantTAT, tag)
		}
	})
}

// TestPropertyDecideAllAllOrNothing: with 2–4 random limits, either every
// state advances exactly as Decide alone would advance it, or none does.
func TestPropertyDecideAllAllOrNothing(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		k := rapid.IntRange(2, 4).Draw(t, "k")
		now := rapid.Int64Range(0, 1<<50).Draw(t, "now")
		checks := make([]gcra.Check, k)
		states := make([]gcra.State, k)
		for i := range checks {
			l := genLimit(t, "")
			w := l.Burst() * l.IntervalMicros()
			checks[i] = gcra.Check{
				Key:      gcra.Key{Name: string(rune('a' + i))},
				Schedule: gcra.Steady(l),
				Cost:     rapid.Int64Range(0, l.Burst()+1).Draw(t, "cost"),
			}
			if rapid.Bool().Draw(t, "exists") {
				states[i] = gcra.State{TAT: now + rapid.Int64Range(-w, w).Draw(t, "tatOffset"), Exists: true}
			}
		}
		alone := make([]gcra.Result, k)
		aloneNext := make([]gcra.State, k)
		aloneWrite := make([]bool, k)
		all, anyTooLarge, anyWrite := true, false, false
		var maxRetry time.Duration
		for i := range checks {
			aloneNext[i], aloneWrite[i], alone[i], _ = gcra.Decide(states[i], now, &checks[i].Schedule, checks[i].Cost)
			all = all && alone[i].Allowed
			anyTooLarge = anyTooLarge || alone[i].TooLarge
			anyWrite = anyWrite || aloneWrite[i]
			maxRetry = max(maxRetry, alone[i].RetryAfter)
		}
		next := make([]gcra.State, k)
		out := make([]gcra.Result, k)
		got, write, err := gcra.DecideAll(now, checks, states, next, out)
		if err != nil {
			t.Fatal(err)
		}
		advanced := 0
		for i := range next {
			if next[i] != states[i] {
				advanced++
			}
		}
		if all {
			if !got.Allowed || write != anyWrite {
				t.Fatalf("all admit alone: combined %+v write %v", got, write)
			}
			for i := range checks {
				if next[i] != aloneNext[i] || out[i] != alone[i] {
					t.Fatalf("check %d: next %+v out %+v, want %+v %+v", i, next[i], out[i], aloneNext[i], alone[i])
				}
			}
		} else {
			if got.Allowed || write || advanced != 0 {
				t.Fatalf("one denies alone: combined %+v write %v, %d states advanced", got, write, advanced)
			}
			for i := range checks {
				want := alone[i]
				if want.Allowed {
					// Vetoed: nothing spent, so it reports its untouched state.
					_, _, want, _ = gcra.Decide(states[i], now, &checks[i].Schedule, 0)
					want.Allowed = false
				}
				if out[i] != want {
					t.Fatalf("check %d: out %+v, want %+v", i, out[i], want)
				}
			}
		}
		if got.TooLarge != anyTooLarge || got.RetryAfter != maxRetry {
			t.Fatalf("combined %+v: want tooLarge %v retry %v", got, anyTooLarge, maxRetry)
		}
		// The combined result summarises out.
		minRem, maxReset := out[0].Remaining, out[0].ResetAfter
		for _, r := range out[1:] {
			minRem, maxReset = min(minRem, r.Remaining), max(maxReset, r.ResetAfter)
		}
		if got.Remaining != minRem || got.ResetAfter != maxReset {
			t.Fatalf("combined remaining %d reset %v, want min/max of out: %d %v (out %+v)", got.Remaining, got.ResetAfter, minRem, maxReset, out)
		}
		if all && advanced != countWrites(aloneWrite) {
			t.Fatalf("%d states advanced, want %d", advanced, countWrites(aloneWrite))
		}
	})
}

func countWrites(ws []bool) int {
	n := 0
	for _, w := range ws {
		if w {
			n++
		}
	}
	return n
}

// TestPropertyValueRoundTrip: every state a store can hold reads back from
// its Value exactly, with no reference time: any TAT in [0, MaxTAT], any
// tag, any usable writer's limit (or none); and its previous release's
// 12-byte form reads back as the same state with the writer unknown.
func TestPropertyValueRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		st := gcra.State{
			TAT:    rapid.Int64Range(0, gcra.MaxTAT).Draw(t, "tat"),
			Epoch:  gcra.EpochTag(rapid.Uint64().Draw(t, "epoch")),
			Exists: true,
		}
		if rapid.Bool().Draw(t, "writer") {
			b := rapid.Int64Range(1, gcra.MaxBurst).Draw(t, "burst")
			st.T, st.Burst = rapid.Int64Range(1, gcra.MaxWindowMicros/b).Draw(t, "T"), b
		}
		v := gcra.EncodeValue(st)
		if v[0] >= 0x20 {
			t.Fatalf("EncodeValue(%+v) starts with %#x: could be read as a packed decimal", st, v[0])
		}
		got, err := gcra.DecodeValue(v[:])
		if err != nil || got != st {
			t.Fatalf("DecodeValue(EncodeValue(%+v)) = %+v, %v", st, got, err)
		}
		v2 := gcra.EncodeValueV2(st)
		want := st
		want.T, want.Burst = 0, 0
		if got, err := gcra.DecodeValue(v2[:]); err != nil || got != want {
			t.Fatalf("DecodeValue(EncodeValueV2(%+v)) = %+v, %v", st, got, err)
		}
	})
}

// TestPropertyReaderHoldsNoMoreThanItsWriter: a state written under one
// limit and read under another — a sibling agent of the region in another
// epoch slot, at another reduced limit, or a version the reader skipped —
// holds no more tokens for the reader than the writer's own bucket holds at
// the read, whatever epoch it carries; a state its writer has rested by
// then holds the writer's full burst at that TAT plus what the reader's
// rate refilled since. (7833642 read the TAT in the reader's unit: a slow
// reader took a fast writer's spent window for credit.)
func TestPropertyReaderHoldsNoMoreThanItsWriter(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w, a := genLimit(t, "writer"), genLimit(t, "reader")
		now := 10*span + rapid.Int64Range(0, span).Draw(t, "now")
		tat := now - 3*w.Burst()*w.IntervalMicros() + rapid.Int64Range(0, 4*w.Burst()*w.IntervalMicros()).Draw(t, "tat")
		st := gcra.State{TAT: tat, Epoch: gcra.EpochTag(rapid.Uint64Range(0, 20).Draw(t, "tag")),
			T: w.IntervalMicros(), Burst: w.Burst(), Exists: true}
		var sch gcra.Schedule
		if rapid.Bool().Draw(t, "change") {
			pe := rapid.Uint64Range(1, 10).Draw(t, "prevEpoch")
			ae := pe + rapid.Uint64Range(1, 10).Draw(t, "step")
			pEff := now - rapid.Int64Range(0, 4*span).Draw(t, "pAgo")
			aEff := pEff + rapid.Int64Range(0, now-pEff).Draw(t, "aAfter")
			sch = gcra.Change(gcra.Version{Limit: genLimit(t, "prev"), Epoch: pe, Effective: pEff},
				gcra.Version{Limit: a, Epoch: ae, Effective: aEff})
		} else {
			sch = gcra.Steady(a)
			sch.Current.Epoch = rapid.Uint64Range(0, 20).Draw(t, "epoch")
		}
		_, _, r, err := gcra.Decide(st, now, &sch, 0)
		if err != nil {
			t.Fatal(err)
		}
		held := max(0, (w.Burst()*w.IntervalMicros()-max(tat-now, 0))/w.IntervalMicros())
		if tat < now {
			held = min(a.Burst(), w.Burst()+(now-tat)/a.IntervalMicros())
		}
		if r.Remaining > held {
			t.Fatalf("reader %v holds %d tokens of a state whose writer %v holds %d (schedule %+v)", a, r.Remaining, w, held, sch)
		}
	})
}

// TestPropertyPackV1RoundTrip: a packed state below 2^53 reads back
// exactly below any upper bound less than 2^37 µs after its TAT, and its
// 16-bit tag widens to the epoch it was written under when that lies within
// 2^15 of the schedule's current epoch.
func TestPropertyPackV1RoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		tat := rapid.Int64Range(0, gcra.MaxTime+gcra.V1MaxWindow).Draw(t, "tat")
		cur := rapid.Uint64Range(0, 1<<50).Draw(t, "current")
		epoch := cur + rapid.Uint64Range(0, 1<<15-1).Draw(t, "behind") - 1<<14
		if rapid.Bool().Draw(t, "ahead") {
			epoch = cur + rapid.Uint64Range(0, 1<<15-1).Draw(t, "ahead")
		}
		st := gcra.State{TAT: tat, Epoch: gcra.EpochTag(epoch), Exists: true}
		v := gcra.PackV1(st)
		if v < 0 || v >= 1<<53 {
			t.Fatalf("PackV1(%+v) = %d, outside [0, 2^53)", st, v)
		}
		upper := tat + rapid.Int64Range(0, 1<<37-1).Draw(t, "slack")
		sch := gcra.Steady(gcra.PerSecond(1, 1))
		sch.Current.Epoch = cur
		if got := gcra.UnpackV1(v, upper, &sch); got != st {
			t.Fatalf("UnpackV1(PackV1(%+v), %d) = %+v", st, upper, got)
		}
	})
}

// TestPropertyRetryAfterExactAcrossSchedules: under a change schedule, for
// any stored state (none, previous, current, older or newer epoch) and any
// now — including before the previous change takes effect — a denial's
// RetryAfter is exact, as long as now+RetryAfter does not cross the change
// (which legitimately changes the answer).
func TestPropertyRetryAfterExactAcrossSchedules(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := genChange(t)
		now := c.ta + rapid.Int64Range(-3*span, 2*c.windowA).Draw(t, "nowOffset")
		off := rapid.Int64Range(-3*max(c.windowP, c.windowA), max(span, c.windowA)).Draw(t, "tatOffset")
		tags := []uint64{gcra.EpochTag(c.pe), gcra.EpochTag(c.ae), gcra.EpochTag(c.pe - 3), gcra.EpochTag(c.ae + 3)}
		var st gcra.State
		if k := rapid.IntRange(0, len(tags)).Draw(t, "epoch"); k < len(tags) {
			st = gcra.State{TAT: now + off, Epoch: tags[k], Exists: true}
		}
		n := rapid.Int64Range(0, 1001).Draw(t, "cost")
		_, _, r, err := gcra.Decide(st, now, &c.sch, n)
		if err != nil {
			t.Fatal(err)
		}
		if r.Allowed || r.TooLarge {
			return
		}
		ra := us(r.RetryAfter)
		if now < c.ta && now+ra >= c.ta {
			return // crosses the change
		}
		if now+ra >= gcra.MaxTime {
			return // booked debt converted to a slow limit: beyond the clock's range
		}
		if _, _, early, _ := gcra.Decide(st, now+ra-1, &c.sch, n); early.Allowed {
			t.Fatalf("admitted 1µs before RetryAfter %v", r.RetryAfter)
		}
		if _, _, onTime, _ := gcra.Decide(st, now+ra, &c.sch, n); !onTime.Allowed {
			t.Fatalf("denied (%+v) at now+RetryAfter after %+v", onTime, r)
		}
	})
}

// TestPropertyDroppedAfterRestedNeverGains: a store may drop a written state
// once Rested has passed (Redis expires it, memstore sweeps it). From then
// on, the missing key must never hold more tokens than the state would have
// — including across a change that was still pending when it was written
// (a rate cut that would otherwise hand back the old limit's full burst).
func TestPropertyDroppedAfterRestedNeverGains(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		lim := func(name string) gcra.Limit {
			T := rapid.Int64Range(1, 1_000_000).Draw(t, name+"T")
			B := rapid.Int64Range(1, min(1000, maxWindow/T)).Draw(t, name+"B")
			return gcra.FromInterval(T, B)
		}
		p, a := lim("prev"), lim("cur")
		ta := rapid.Int64Range(3*span, 10*span).Draw(t, "ta")
		sch := gcra.Change(gcra.Version{Limit: p, Epoch: 1, Effective: ta - rapid.Int64Range(0, span).Draw(t, "prevAge")},
			gcra.Version{Limit: a, Epoch: 2, Effective: ta})
		// Drive the key with a few admissions around the change.
		var st gcra.State
		now := ta - rapid.Int64Range(0, 2*p.Burst()*p.IntervalMicros()).Draw(t, "start")
		for i := range rapid.IntRange(1, 20).Draw(t, "steps") {
			now += rapid.Int64Range(0, 2*max(p.IntervalMicros(), a.IntervalMicros())).Draw(t, fmt.Sprintf("dt%d", i))
			next, write, _, err := gcra.Decide(st, now, &sch, rapid.Int64Range(0, 3).Draw(t, fmt.Sprintf("n%d", i)))
			if err != nil {
				t.Fatal(err)
			}
			if write {
				st = next
				if st.Rested < st.TAT {
					t.Fatalf("Rested %d before TAT %d", st.Rested, st.TAT)
				}
			}
		}
		if !st.Exists {
			return
		}
		for i := range 5 {
			at := st.Rested + rapid.Int64Range(0, 3*max(a.Burst()*a.IntervalMicros(), p.Burst()*p.IntervalMicros())).Draw(t, fmt.Sprintf("probe%d", i))
			at = max(at, now)
			_, _, kept, _ := gcra.Decide(st, at, &sch, 0)
			_, _, dropped, _ := gcra.Decide(gcra.State{}, at, &sch, 0)
			if dropped.Remaining != kept.Remaining || dropped.ResetAfter != kept.ResetAfter {
				t.Fatalf("at %d (Rested %d, change at %d): dropped key holds %d (reset %v), kept state %d (reset %v); state %+v",
					at, st.Rested, ta, dropped.Remaining, dropped.ResetAfter, kept.Remaining, kept.ResetAfter, st)
			}
		}
	})
}
