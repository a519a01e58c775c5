package gcra_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/gcra"
)

const (
	ms = int64(1000) // µs per millisecond
	s  = 1000 * ms   // µs per second
)

// step is one row of a timeline table: a request of cost n at base+at and
// what Decide must answer. Expectations are derived by hand from the model
// of doc.go (TAT, newTAT = max(TAT, now) + n·T, admit iff newTAT − now ≤ B·T).
type step struct {
	at            int64 // µs after the table's base instant
	n             int64
	wantAllowed   bool
	wantTooLarge  bool
	wantRemaining int64
	wantRetry     time.Duration
	wantReset     time.Duration
}

// runTimeline feeds the steps through Decide under s, carrying the state
// between rows, and checks that only an admitted request with n > 0 writes.
func runTimeline(t *testing.T, sch gcra.Schedule, base int64, steps []step) gcra.State {
	t.Helper()
	var st gcra.State
	for i, tt := range steps {
		now := base + tt.at
		next, write, r, err := gcra.Decide(st, now, &sch, tt.n)
		if err != nil {
			t.Fatalf("t%d (at %dµs, n=%d): unexpected error %v", i, tt.at, tt.n, err)
		}
		if r.Allowed != tt.wantAllowed || r.TooLarge != tt.wantTooLarge ||
			r.Remaining != tt.wantRemaining || r.RetryAfter != tt.wantRetry || r.ResetAfter != tt.wantReset {
			t.Errorf("t%d (at %v, n=%d): got allowed=%v tooLarge=%v remaining=%d retry=%v reset=%v; "+
				"want allowed=%v tooLarge=%v remaining=%d retry=%v reset=%v",
				i, time.Duration(tt.at)*time.Microsecond, tt.n,
				r.Allowed, r.TooLarge, r.Remaining, r.RetryAfter, r.ResetAfter,
				tt.wantAllowed, tt.wantTooLarge, tt.wantRemaining, tt.wantRetry, tt.wantReset)
		}
		if r.Wait != 0 {
			t.Errorf("t%d: Decide reported Wait %v, want 0", i, r.Wait)
		}
		wantWrite := tt.wantAllowed && tt.n > 0
		if write != wantWrite {
			t.Errorf("t%d: write = %v, want %v", i, write, wantWrite)
		}
		if !write {
			if next != st {
				t.Errorf("t%d: no write but returned state %+v differs from input %+v", i, next, st)
			}
			continue
		}
		if !next.Exists {
			t.Errorf("t%d: written state does not exist: %+v", i, next)
		}
		st = next
	}
	return st
}

// bases are the instants the timelines are replayed from: the store's clock
// is arbitrary (Redis TIME is µs since 1970).
var bases = []int64{0, 1_700_000_000 * s, 5 * s}

func TestDecideSeed003Timeline(t *testing.T) {
	// PerSecond(5, 3): T = 200 ms, B·T = 600 ms.
	l := gcra.PerSecond(5, 3)
	steps := []step{
		{at: 0, n: 1, wantAllowed: true, wantRemaining: 2, wantReset: 200 * time.Millisecond},         // t0 TAT 200
		{at: 0, n: 1, wantAllowed: true, wantRemaining: 1, wantReset: 400 * time.Millisecond},         // t1 TAT 400
		{at: 0, n: 1, wantAllowed: true, wantRemaining: 0, wantReset: 600 * time.Millisecond},         // t2 TAT 600
		{at: 0, n: 1, wantRetry: 200 * time.Millisecond, wantReset: 600 * time.Millisecond},           // t3 allowAt 200
		{at: 250 * ms, n: 1, wantAllowed: true, wantReset: 550 * time.Millisecond},                    // t4 TAT 800
		{at: 250 * ms, n: 1, wantRetry: 150 * time.Millisecond, wantReset: 550 * time.Millisecond},    // t5 allowAt 400
		{at: 400 * ms, n: 1, wantAllowed: true, wantReset: 600 * time.Millisecond},                    // t6 exactly on time, TAT 1000
		{at: 400 * ms, n: 0, wantAllowed: true, wantReset: 600 * time.Millisecond},                    // t7 peek: at the limit, not over
		{at: 1400 * ms, n: 3, wantAllowed: true, wantReset: 600 * time.Millisecond},                   // t8 rested: whole burst at once, TAT 2000
		{at: 1500 * ms, n: 1, wantRetry: 100 * time.Millisecond, wantReset: 500 * time.Millisecond},   // t9 allowAt 1600
		{at: 2000 * ms, n: 2, wantAllowed: true, wantRemaining: 1, wantReset: 400 * time.Millisecond}, // t10 TAT 2400
		{at: 2000 * ms, n: 4, wantTooLarge: true, wantRemaining: 1, wantRetry: gcra.Never, wantReset: 400 * time.Millisecond},
		{at: 2000 * ms, n: 2, wantRemaining: 1, wantRetry: 200 * time.Millisecond, wantReset: 400 * time.Millisecond},
		{at: 2100 * ms, n: 0, wantAllowed: true, wantRemaining: 1, wantReset: 300 * time.Millisecond}, // slack 300 ms = 1.5 T
		{at: 1900 * ms, n: 1, wantRetry: 100 * time.Millisecond, wantReset: 500 * time.Millisecond},   // time going back
		{at: 2400 * ms, n: 1, wantAllowed: true, wantRemaining: 2, wantReset: 200 * time.Millisecond}, // rested exactly
	}
	for _, base := range bases {
		t.Run(time.Duration(base*1000).String(), func(t *testing.T) {
			sch := gcra.Steady(l)
			st := runTimeline(t, sch, base, steps)
			if want := base + 2600*ms; st.TAT != want || st.Epoch != 0 {
				t.Errorf("final state %+v, want TAT %d epoch 0", st, want)
			}
		})
	}
}

// admissions drives one request every tick µs over [0, end] (both ends
// included) and returns the instants admitted. With burstEachTick the
// caller retries at each tick until denied (saturation).
func admissions(t *testing.T, l gcra.Limit, tick, end int64, saturate bool) []int64 {
	t.Helper()
	sch := gcra.Steady(l)
	var st gcra.State
	var got []int64
	for now := int64(0); now <= end; now += tick {
		for {
			next, write, r, err := gcra.Decide(st, now, &sch, 1)
			if err != nil {
				t.Fatal(err)
			}
			if !r.Allowed {
				break
			}
			if !write {
				t.Fatalf("admitted at %d without a write", now)
			}
			st = next
			got = append(got, now)
			if !saturate {
				break
			}
		}
	}
	return got
}

func TestDecideSeed000ThreeSeconds(t *testing.T) {
	// "10 per second and a burst of 5" lets 6 through at once: Burst 6.
	// From idle, the first 6 pass as fast as they come; the k-th (k > 6)
	// needs TAT (k−1)·T − now ≤ 6·T, i.e. now ≥ (k−6)·100 ms.
	l := gcra.PerSecond(10, 6)
	tests := []struct {
		name     string
		saturate bool
		first6   []int64
	}{
		{"one per ms", false, []int64{0, 1 * ms, 2 * ms, 3 * ms, 4 * ms, 5 * ms}},
		{"saturating", true, []int64{0, 0, 0, 0, 0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := admissions(t, l, ms, 3*s, tt.saturate)
			want := append([]int64(nil), tt.first6...)
			for k := int64(1); k <= 30; k++ {
				want = append(want, k*100*ms)
			}
			if len(got) != 36 {
				t.Fatalf("admitted %d in [0, 3s], want 36: %v", len(got), got)
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("admission %d at %dµs, want %dµs (all: %v)", i, got[i], want[i], got)
				}
			}
			first100 := 0
			for _, at := range got {
				if at <= 100*ms {
					first100++
				}
			}
			if first100 != 7 {
				t.Errorf("admitted %d within the first 100 ms, want 7", first100)
			}
		})
	}
}

func TestDecideTooLarge(t *testing.T) {
	l := gcra.PerSecond(5, 3) // T = 200 ms
	sch := gcra.Steady(l)
	now := 10 * s
	states := []struct {
		name          string
		st            gcra.State
		wantRemaining int64
		wantReset     time.Duration
	}{
		{"no state", gcra.State{}, 3, 0},
		{"rested", gcra.State{TAT: now - s, Exists: true}, 3, 0},
		{"partly used", gcra.State{TAT: now + 300*ms, Exists: true}, 1, 300 * time.Millisecond},
		{"exhausted", gcra.State{TAT: now + 600*ms, Exists: true}, 0, 600 * time.Millisecond},
	}
	for _, sc := range states {
		for _, n := range []int64{4, 1000, 1 << 31, 1 << 62, 1<<63 - 1} {
			next, write, r, err := gcra.Decide(sc.st, now, &sch, n)
			if err != nil {
				t.Fatalf("%s n=%d: %v", sc.name, n, err)
			}
			if write || next != sc.st {
				t.Errorf("%s n=%d: wrote %+v (write=%v)", sc.name, n, next, write)
			}
			if !r.TooLarge || r.Allowed || r.RetryAfter != gcra.Never || r.Wait != 0 {
				t.Errorf("%s n=%d: got %+v, want TooLarge with RetryAfter Never", sc.name, n, r)
			}
			if r.Remaining != sc.wantRemaining || r.ResetAfter != sc.wantReset {
				t.Errorf("%s n=%d: remaining %d reset %v, want %d %v", sc.name, n, r.Remaining, r.ResetAfter, sc.wantRemaining, sc.wantReset)
			}
			if r.Limit != l {
				t.Errorf("%s n=%d: Limit %v, want %v", sc.name, n, r.Limit, l)
			}
			// The bare algorithm agrees.
			tat, ar, err := gcra.Allow(l, sc.st.TAT, now, n)
			if err != nil || !ar.TooLarge || ar.RetryAfter != gcra.Never || tat != sc.st.TAT {
				t.Errorf("%s Allow n=%d: tat %d result %+v err %v", sc.name, n, tat, ar, err)
			}
			// And so does Reserve, whatever maxWait.
			rn, rw, rr, err := gcra.Reserve(sc.st, now, &sch, n, 0)
			if err != nil || rw || rn != sc.st || !rr.TooLarge || rr.RetryAfter != gcra.Never {
				t.Errorf("%s Reserve n=%d: %+v %v %+v %v", sc.name, n, rn, rw, rr, err)
			}
		}
	}
	// Exactly Burst is not too large.
	_, write, r, err := gcra.Decide(gcra.State{}, now, &sch, 3)
	if err != nil || !write || !r.Allowed || r.TooLarge {
		t.Errorf("n = Burst from idle: write=%v %+v %v, want admitted", write, r, err)
	}
}

func TestDecideNegativeCost(t *testing.T) {
	sch := gcra.Steady(gcra.PerSecond(5, 3))
	st := gcra.State{TAT: 123, Epoch: 7, Exists: true}
	for _, n := range []int64{-1, -1 << 62, -1 << 63} {
		next, write, _, err := gcra.Decide(st, 0, &sch, n)
		if !errors.Is(err, gcra.ErrNegativeCost) || write || next != st {
			t.Errorf("Decide n=%d: err %v write %v next %+v", n, err, write, next)
		}
		next, write, _, err = gcra.Reserve(st, 0, &sch, n, 0)
		if !errors.Is(err, gcra.ErrNegativeCost) || write || next != st {
			t.Errorf("Reserve n=%d: err %v write %v next %+v", n, err, write, next)
		}
		tat, _, err := gcra.Allow(gcra.PerSecond(5, 3), 123, 0, n)
		if !errors.Is(err, gcra.ErrNegativeCost) || tat != 123 {
			t.Errorf("Allow n=%d: err %v tat %d", n, err, tat)
		}
	}
}

func TestDecidePeek(t *testing.T) {
	l := gcra.PerSecond(5, 3) // T = 200 ms, window 600 ms
	sch := gcra.Steady(l)
	const now = 5 * s
	tests := []struct {
		name          string
		st            gcra.State
		wantAllowed   bool
		wantRemaining int64
		wantRetry     time.Duration
		wantReset     time.Duration
	}{
		{"no state", gcra.State{}, true, 3, 0, 0},
		{"rested long ago", gcra.State{TAT: now - 10*s, Exists: true}, true, 3, 0, 0},
		{"one used", gcra.State{TAT: now + 200*ms, Exists: true}, true, 2, 0, 200 * time.Millisecond},
		{"a fraction into the next token", gcra.State{TAT: now + 399*ms, Exists: true}, true, 1, 0, 399 * time.Millisecond},
		{"at the limit", gcra.State{TAT: now + 600*ms, Exists: true}, true, 0, 0, 600 * time.Millisecond},
		// Reservations can book the TAT past the window: the key is over its limit.
		{"over by 1µs", gcra.State{TAT: now + 600*ms + 1, Exists: true}, false, 0, time.Microsecond, 600*time.Millisecond + time.Microsecond},
		{"booked 2 ahead", gcra.State{TAT: now + 1000*ms, Exists: true}, false, 0, 400 * time.Millisecond, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next, write, r, err := gcra.Decide(tt.st, now, &sch, 0)
			if err != nil {
				t.Fatal(err)
			}
			if write || next != tt.st {
				t.Errorf("peek wrote: write=%v next=%+v", write, next)
			}
			if r.Allowed != tt.wantAllowed || r.TooLarge || r.Remaining != tt.wantRemaining ||
				r.RetryAfter != tt.wantRetry || r.ResetAfter != tt.wantReset {
				t.Errorf("got %+v, want allowed=%v remaining=%d retry=%v reset=%v",
					r, tt.wantAllowed, tt.wantRemaining, tt.wantRetry, tt.wantReset)
			}
		})
	}
}

func TestDecideZeroAndInvalidLimit(t *testing.T) {
	limits := []struct {
		name string
		l    gcra.Limit
	}{
		{"zero value", gcra.Limit{}},
		{"FromInterval(0, 0)", gcra.FromInterval(0, 0)},
		{"New(0, 0, 0)", gcra.New(0, 0, 0)},
		{"invalid: rate 0", gcra.PerSecond(0, 1)},
		{"invalid: burst 0", gcra.PerSecond(5, 0)},
		{"invalid: T 0", gcra.FromInterval(0, 5)},
		{"invalid: window too long", gcra.FromInterval(1, gcra.MaxWindowMicros+1)},
	}
	states := []gcra.State{{}, {TAT: 7 * s, Exists: true}, {TAT: -1, Epoch: 3, Exists: true}}
	for _, tl := range limits {
		sch := gcra.Steady(tl.l)
		for _, st := range states {
			for _, n := range []int64{0, 1, 5} {
				next, write, r, err := gcra.Decide(st, 5*s, &sch, n)
				if err != nil || write || next != st {
					t.Errorf("%s n=%d st=%+v: err %v write %v next %+v", tl.name, n, st, err, write, next)
				}
				if r.Allowed || !r.TooLarge || r.RetryAfter != gcra.Never {
					t.Errorf("%s n=%d: %+v, want denied TooLarge Never", tl.name, n, r)
				}
				next, write, r, err = gcra.Reserve(st, 5*s, &sch, n, int64(time.Hour/time.Microsecond))
				if err != nil || write || next != st || r.Allowed || !r.TooLarge {
					t.Errorf("%s Reserve n=%d: err %v write %v next %+v r %+v", tl.name, n, err, write, next, r)
				}
			}
		}
	}
	// Allow: the zero limit denies; an invalid one is an error.
	if _, r, err := gcra.Allow(gcra.Limit{}, 0, 0, 1); err != nil || r.Allowed || !r.TooLarge {
		t.Errorf("Allow zero limit: %+v %v", r, err)
	}
	if _, _, err := gcra.Allow(gcra.PerSecond(0, 1), 0, 0, 1); !errors.Is(err, gcra.ErrInvalidLimit) {
		t.Errorf("Allow invalid limit: err %v, want ErrInvalidLimit", err)
	}
}

func TestReserveTimeline(t *testing.T) {
	l := gcra.PerSecond(5, 3) // T = 200 ms, window 600 ms
	sch := gcra.Steady(l)
	const maxWait = 500 * ms
	tests := []struct {
		at, n               int64
		wantBooked          bool
		wantWait, wantRetry time.Duration
		wantRemaining       int64
		wantReset           time.Duration
	}{
		{0, 1, true, 0, 0, 2, 200 * time.Millisecond},
		{0, 1, true, 0, 0, 1, 400 * time.Millisecond},
		{0, 1, true, 0, 0, 0, 600 * time.Millisecond},
		{0, 1, true, 200 * time.Millisecond, 0, 0, 800 * time.Millisecond},         // TAT 800: acts at 200 ms
		{0, 1, true, 400 * time.Millisecond, 0, 0, 1000 * time.Millisecond},        // TAT 1000
		{0, 1, false, 0, 600 * time.Millisecond, 0, 1000 * time.Millisecond},       // would wait 600 ms > 500 ms
		{0, 0, true, 400 * time.Millisecond, 0, 0, 1000 * time.Millisecond},        // n=0: when could it act
		{100 * ms, 1, true, 500 * time.Millisecond, 0, 0, 1100 * time.Millisecond}, // exactly maxWait: TAT 1200
		{100 * ms, 3, false, 0, 1100 * time.Millisecond, 0, 1100 * time.Millisecond},
		{2 * s, 3, true, 0, 0, 0, 600 * time.Millisecond}, // rested: the whole burst, no wait
	}
	var st gcra.State
	for i, tt := range tests {
		next, write, r, err := gcra.Reserve(st, tt.at, &sch, tt.n, maxWait)
		if err != nil {
			t.Fatalf("r%d: %v", i, err)
		}
		if r.Allowed != tt.wantBooked || r.Wait != tt.wantWait || r.RetryAfter != tt.wantRetry ||
			r.Remaining != tt.wantRemaining || r.ResetAfter != tt.wantReset || r.TooLarge {
			t.Errorf("r%d (at %dms n=%d): got %+v; want booked=%v wait=%v retry=%v remaining=%d reset=%v",
				i, tt.at/ms, tt.n, r, tt.wantBooked, tt.wantWait, tt.wantRetry, tt.wantRemaining, tt.wantReset)
		}
		if wantWrite := tt.wantBooked && tt.n > 0; write != wantWrite {
			t.Errorf("r%d: write=%v, want %v", i, write, wantWrite)
		}
		if write {
			st = next
		} else if next != st {
			t.Errorf("r%d: no write but state changed: %+v -> %+v", i, st, next)
		}
	}
	if st.TAT != 2600*ms {
		t.Errorf("final TAT %d, want %d", st.TAT, 2600*ms)
	}
	// A refused reservation's RetryAfter is when Decide admits it.
	st = gcra.State{TAT: 1000 * ms, Exists: true}
	_, _, r, _ := gcra.Reserve(st, 0, &sch, 1, maxWait)
	if r.Allowed || r.RetryAfter != 600*time.Millisecond {
		t.Fatalf("refusal: %+v", r)
	}
	if _, _, d, _ := gcra.Decide(st, 600*ms-1, &sch, 1); d.Allowed {
		t.Errorf("Decide admitted 1µs before the refused reservation's RetryAfter")
	}
	if _, _, d, _ := gcra.Decide(st, 600*ms, &sch, 1); !d.Allowed {
		t.Errorf("Decide denied at the refused reservation's RetryAfter: %+v", d)
	}
}

func TestReserveErrors(t *testing.T) {
	l := gcra.PerSecond(5, 3) // window 600 ms
	sch := gcra.Steady(l)
	st := gcra.State{TAT: 42, Exists: true}
	limit := gcra.MaxWindowMicros - 600*ms
	if _, _, _, err := gcra.Reserve(st, 0, &sch, 1, limit); err != nil {
		t.Errorf("Burst·T + maxWait = MaxWindow: %v", err)
	}
	for _, mw := range []int64{limit + 1, 1 << 62, 1<<63 - 1} {
		next, write, _, err := gcra.Reserve(st, 0, &sch, 1, mw)
		if !errors.Is(err, gcra.ErrWaitTooLong) || write || next != st {
			t.Errorf("maxWait %d: err %v write %v next %+v, want ErrWaitTooLong", mw, err, write, next)
		}
	}
	// A limit whose window is the whole MaxWindow allows no wait at all.
	full := gcra.FromInterval(1<<20, 1<<31) // 2^51 µs
	if err := full.Validate(); err != nil {
		t.Fatal(err)
	}
	fs := gcra.Steady(full)
	if _, _, _, err := gcra.Reserve(gcra.State{}, 0, &fs, 1, 0); err != nil {
		t.Errorf("full window, maxWait 0: %v", err)
	}
	if _, _, _, err := gcra.Reserve(gcra.State{}, 0, &fs, 1, 1); !errors.Is(err, gcra.ErrWaitTooLong) {
		t.Errorf("full window, maxWait 1µs: err %v, want ErrWaitTooLong", err)
	}
	for _, mw := range []int64{-1, -1 << 63} {
		next, write, _, err := gcra.Reserve(st, 0, &sch, 1, mw)
		if !errors.Is(err, gcra.ErrNegativeWait) || write || next != st {
			t.Errorf("maxWait %d: err %v write %v next %+v, want ErrNegativeWait", mw, err, write, next)
		}
	}
	if _, err := gcra.ValidateMaxWait(-time.Nanosecond); !errors.Is(err, gcra.ErrNegativeWait) {
		t.Errorf("ValidateMaxWait(-1ns): %v", err)
	}
	if got, err := gcra.ValidateMaxWait(1999 * time.Nanosecond); err != nil || got != 1 {
		t.Errorf("ValidateMaxWait(1999ns) = %d, %v; want 1 (rounded down)", got, err)
	}
}

// check builds one composite check on a steady limit.
func check(name string, l gcra.Limit, cost int64) gcra.Check {
	return gcra.Check{Key: gcra.Key{Tag: "t", Name: name}, Schedule: gcra.Steady(l), Cost: cost}
}

func TestDecideAll(t *testing.T) {
	const now = 100 * s
	fast := gcra.PerSecond(10, 5) // T = 100 ms, window 500 ms
	slow := gcra.PerSecond(1, 2)  // T = 1 s, window 2 s
	rested := gcra.State{}
	tests := []struct {
		name        string
		checks      []gcra.Check
		states      []gcra.State
		wantAllowed bool
		wantTooBig  bool
		wantWrite   bool
		wantNext    []gcra.State // when written
		wantOut     []gcra.Result
		want        gcra.Result
	}{
		{
			name:        "both admit",
			checks:      []gcra.Check{check("a", fast, 1), check("b", slow, 1)},
			states:      []gcra.State{rested, {TAT: now - s, Exists: true}},
			wantAllowed: true,
			wantWrite:   true,
			wantNext:    []gcra.State{{TAT: now + 100*ms, Rested: now + 100*ms, Exists: true}, {TAT: now + s, Rested: now + s, Exists: true}},
			wantOut: []gcra.Result{
				{Limit: fast, Allowed: true, Remaining: 4, ResetAfter: 100 * time.Millisecond},
				{Limit: slow, Allowed: true, Remaining: 1, ResetAfter: time.Second},
			},
			want: gcra.Result{Limit: slow, Allowed: true, Remaining: 1, ResetAfter: time.Second},
		},
		{
			name:   "slow denies: fast is not consumed",
			checks: []gcra.Check{check("a", fast, 1), check("b", slow, 1)},
			states: []gcra.State{{TAT: now + 200*ms, Exists: true}, {TAT: now + 2*s, Exists: true}},
			wantOut: []gcra.Result{
				{Limit: fast, Remaining: 3, ResetAfter: 200 * time.Millisecond},
				{Limit: slow, Remaining: 0, RetryAfter: time.Second, ResetAfter: 2 * time.Second},
			},
			want: gcra.Result{Limit: slow, Remaining: 0, RetryAfter: time.Second, ResetAfter: 2 * time.Second},
		},
		{
			name:   "both deny: the largest retry-after binds",
			checks: []gcra.Check{check("a", fast, 2), check("b", slow, 1), check("c", fast, 1)},
			states: []gcra.State{
				{TAT: now + 450*ms, Exists: true},  // needs 650−500 = 150 ms
				{TAT: now + 1500*ms, Exists: true}, // needs 2500−2000 = 500 ms
				{TAT: now + 300*ms, Exists: true},  // admits alone
			},
			wantOut: []gcra.Result{
				{Limit: fast, Remaining: 0, RetryAfter: 150 * time.Millisecond, ResetAfter: 450 * time.Millisecond},
				{Limit: slow, Remaining: 0, RetryAfter: 500 * time.Millisecond, ResetAfter: 1500 * time.Millisecond},
				{Limit: fast, Remaining: 2, ResetAfter: 300 * time.Millisecond},
			},
			want: gcra.Result{Limit: slow, RetryAfter: 500 * time.Millisecond, ResetAfter: 1500 * time.Millisecond},
		},
		{
			name:       "one too large",
			checks:     []gcra.Check{check("a", fast, 3), check("b", slow, 3)},
			states:     []gcra.State{rested, rested},
			wantTooBig: true,
			wantOut: []gcra.Result{
				{Limit: fast, Remaining: 5},
				{Limit: slow, TooLarge: true, Remaining: 2, RetryAfter: gcra.Never},
			},
			want: gcra.Result{Limit: slow, TooLarge: true, Remaining: 2, RetryAfter: gcra.Never},
		},
		{
			name:        "all peek: admitted, nothing written",
			checks:      []gcra.Check{check("a", fast, 0), check("b", slow, 0)},
			states:      []gcra.State{{TAT: now + 500*ms, Exists: true}, rested},
			wantAllowed: true,
			wantOut: []gcra.Result{
				{Limit: fast, Allowed: true, Remaining: 0, ResetAfter: 500 * time.Millisecond},
				{Limit: slow, Allowed: true, Remaining: 2},
			},
			want: gcra.Result{Limit: fast, Allowed: true, Remaining: 0, ResetAfter: 500 * time.Millisecond},
		},
		{
			// The composite is denied, so the generous limit consumes
			// nothing: the combined Remaining and ResetAfter must describe
			// the untouched states (min 1, max 8 s), not the 2 tokens the
			// generous limit would have spent alone (0, 10 s).
			name:   "denied: combined result ignores unspent cost",
			checks: []gcra.Check{check("generous", gcra.PerSecond(1, 10), 2), check("tight", gcra.PerSecond(10, 3), 2)},
			states: []gcra.State{{TAT: now + 8*s, Exists: true}, {TAT: now + 200*ms, Exists: true}},
			wantOut: []gcra.Result{
				{Limit: gcra.PerSecond(1, 10), Remaining: 2, ResetAfter: 8 * time.Second},
				{Limit: gcra.PerSecond(10, 3), Remaining: 1, RetryAfter: 100 * time.Millisecond, ResetAfter: 200 * time.Millisecond},
			},
			want: gcra.Result{Limit: gcra.PerSecond(10, 3), Remaining: 1, RetryAfter: 100 * time.Millisecond, ResetAfter: 8 * time.Second},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := len(tt.checks)
			next := make([]gcra.State, k)
			out := make([]gcra.Result, k)
			got, write, err := gcra.DecideAll(now, tt.checks, tt.states, next, out)
			if err != nil {
				t.Fatal(err)
			}
			if write != tt.wantWrite {
				t.Errorf("write = %v, want %v", write, tt.wantWrite)
			}
			wantNext := tt.wantNext
			if !tt.wantWrite {
				wantNext = tt.states
			}
			for i := range next {
				wantNext := wantNext[i]
				if tt.wantWrite {
					// A written state names the limit it was written under.
					wantNext.T, wantNext.Burst = out[i].Limit.IntervalMicros(), out[i].Limit.Burst()
				}
				if next[i] != wantNext {
					t.Errorf("next[%d] = %+v, want %+v", i, next[i], wantNext)
				}
				if out[i] != tt.wantOut[i] {
					t.Errorf("out[%d] = %+v\n             want %+v", i, out[i], tt.wantOut[i])
				}
			}
			if got.Allowed != tt.wantAllowed || got.TooLarge != tt.wantTooBig {
				t.Errorf("combined allowed=%v tooLarge=%v, want %v %v", got.Allowed, got.TooLarge, tt.wantAllowed, tt.wantTooBig)
			}
			if got != tt.want {
				t.Errorf("combined = %+v\n      want %+v", got, tt.want)
			}
		})
	}
}

func TestDecideAllErrors(t *testing.T) {
	l := gcra.PerSecond(5, 3)
	mk := func(k int) ([]gcra.Check, []gcra.State, []gcra.State, []gcra.Result) {
		cs := make([]gcra.Check, k)
		for i := range cs {
			cs[i] = check("k", l, 1)
		}
		return cs, make([]gcra.State, k), make([]gcra.State, k), make([]gcra.Result, k)
	}
	if _, _, err := gcra.DecideAll(0, nil, nil, nil, nil); !errors.Is(err, gcra.ErrNoChecks) {
		t.Errorf("no checks: %v", err)
	}
	cs, st, nx, out := mk(gcra.MaxChecks)
	if _, _, err := gcra.DecideAll(0, cs, st, nx, out); err != nil {
		t.Errorf("MaxChecks checks: %v", err)
	}
	cs, st, nx, out = mk(gcra.MaxChecks + 1)
	if _, _, err := gcra.DecideAll(0, cs, st, nx, out); !errors.Is(err, gcra.ErrTooManyChecks) {
		t.Errorf("MaxChecks+1 checks: %v", err)
	}
	cs, st, nx, out = mk(2)
	if _, _, err := gcra.DecideAll(0, cs, st[:1], nx, out); err == nil {
		t.Errorf("short states: no error")
	}
	if _, _, err := gcra.DecideAll(0, cs, st, nx, out[:1]); err == nil {
		t.Errorf("short out: no error")
	}
	cs[1].Cost = -1
	sentinel := gcra.State{TAT: 99, Exists: true}
	nx[0], nx[1] = sentinel, sentinel
	if _, write, err := gcra.DecideAll(0, cs, st, nx, out); !errors.Is(err, gcra.ErrNegativeCost) || write {
		t.Errorf("negative cost: err %v write %v", err, write)
	}
	if nx[0] != sentinel || nx[1] != sentinel {
		t.Errorf("negative cost: next was filled in: %+v", nx)
	}
}

func TestKeyValidate(t *testing.T) {
	long := strings.Repeat("x", gcra.MaxKeyLen)
	tests := []struct {
		k    gcra.Key
		want error
	}{
		{gcra.Key{Name: "a"}, nil},
		{gcra.Key{Tag: "{t}", Name: "\x00\xff"}, nil},
		{gcra.Key{Name: long}, nil},
		{gcra.Key{Tag: "t", Name: long[1:]}, nil},
		{gcra.Key{}, gcra.ErrEmptyKey},
		{gcra.Key{Tag: "t"}, gcra.ErrEmptyKey},
		{gcra.Key{Name: long + "x"}, gcra.ErrKeyTooLong},
		{gcra.Key{Tag: "t", Name: long}, gcra.ErrKeyTooLong},
	}
	for _, tt := range tests {
		if err := tt.k.Validate(); !errors.Is(err, tt.want) || (tt.want == nil && err != nil) {
			t.Errorf("Key{%q, %d bytes}.Validate() = %v, want %v", tt.k.Tag, len(tt.k.Name), err, tt.want)
		}
	}
}

// TestDecideLimitChange walks hand-computed conversions: the key keeps the
// tokens it had at the change (ta = 10 s), clamped to the new burst, credit
// rounded down and debt up.
func TestDecideLimitChange(t *testing.T) {
	const (
		ta     = 10 * s
		pe, ae = 1, 2
	)
	fast := gcra.PerSecond(10, 10) // T 100 ms, window 1 s
	slow := gcra.PerSecond(5, 4)   // T 200 ms, window 800 ms
	tagged := func(tat int64, tag uint64) gcra.State {
		return gcra.State{TAT: tat, Rested: tat, Epoch: tag, Exists: true}
	}
	tests := []struct {
		name          string
		prev, cur     gcra.Limit
		pEff          int64
		st            gcra.State
		now, n        int64
		wantAllowed   bool
		wantRemaining int64
		wantRetry     time.Duration
		wantReset     time.Duration
		wantWrite     gcra.State // zero: no write
	}{
		// 10 − 3 = 7 tokens at ta, clamped to 4: TAT' = ta.
		{"decrease: clamped to the new burst", fast, slow, 0, tagged(ta+300*ms, pe), ta, 4,
			true, 0, 0, 800 * time.Millisecond, tagged(ta+800*ms, ae)},
		// 10 − 9 = 1 token at ta: TAT' = ta + 800 − 200 ms.
		{"decrease: one token kept", fast, slow, 0, tagged(ta+900*ms, pe), ta + 100*ms, 0,
			true, 1, 0, 500 * time.Millisecond, gcra.State{}},
		// Denied, it re-stores the converted TAT under the new limit
		// (Rebase), one window of slow past the change at rest.
		{"decrease: two asked, one held", fast, slow, 0, tagged(ta+900*ms, pe), ta + 100*ms, 2,
			false, 1, 100 * time.Millisecond, 500 * time.Millisecond, gcra.State{TAT: ta + 600*ms, Rested: ta + 800*ms, Epoch: ae, Exists: true}},
		// 4 − 2 = 2 tokens at ta under slow; fast refills 3 more by ta+300ms.
		{"increase adds rate, not tokens", slow, fast, 0, tagged(ta+400*ms, pe), ta + 300*ms, 0,
			true, 5, 0, 500 * time.Millisecond, gcra.State{}},
		{"no state: previous full burst", slow, fast, 0, gcra.State{}, ta, 0,
			true, 4, 0, 600 * time.Millisecond, gcra.State{}},
		{"no state: then refills at the new rate", slow, fast, 0, gcra.State{}, ta + 2*s, 1,
			true, 9, 0, 100 * time.Millisecond, tagged(ta+2*s+100*ms, ae)},
		{"no state: zero previous holds nothing", gcra.Limit{}, fast, 0, gcra.State{}, ta + 250*ms, 0,
			true, 2, 0, 750 * time.Millisecond, gcra.State{}},
		// Issue 18 (fails on 1783ef8, which gave it slow's full 4 tokens):
		// slow took over only 300 ms before, so a key with no state was
		// empty then and holds 1.5 tokens at ta, 150 ms of fast's credit.
		{"no state: empty at the previous change", slow, fast, ta - 300*ms, gcra.State{}, ta, 0,
			true, 1, 0, 850 * time.Millisecond, gcra.State{}},
		// Issue 18 (fails on 1783ef8, which forgot the booked 500 ms): a
		// sibling's state booked past the change, read through a zero
		// previous limit (this agent ran the version reduced).
		{"older epoch through a zero limit: booked slots keep their times", gcra.Limit{}, fast, ta - 300*ms, tagged(ta+500*ms, 0), ta, 1,
			false, 0, 600 * time.Millisecond, 1500 * time.Millisecond, gcra.State{}},
		// Booked 2 past the window under slow: 400 ms of booked slots. Under
		// fast they keep their times (not 2 tokens × 100 ms): the next
		// booking starts after them.
		{"booked debt stays booked", slow, fast, 0, tagged(ta+1200*ms, pe), ta, 1,
			false, 0, 500 * time.Millisecond, 1400 * time.Millisecond, gcra.State{}},
		// 4µs of credit under T=3 is 1.33 tokens: 2µs·… floor(8/3) = 2µs under T=2, 1 token.
		{"credit rounds down", gcra.FromInterval(3, 2), gcra.FromInterval(2, 5), 0, tagged(ta+2, pe), ta, 0,
			true, 1, 0, 8 * time.Microsecond, gcra.State{}},
		// 1µs of debt under T=3 (⅓ token) is ceil(2/3) = 1µs under T=2.
		{"debt rounds up", gcra.FromInterval(3, 2), gcra.FromInterval(2, 5), 0, tagged(ta+7, pe), ta, 0,
			false, 0, time.Microsecond, 11 * time.Microsecond, gcra.State{}},
		// Empty at the previous change (9.7 s), 3 tokens refilled by ta.
		{"older epoch: empty at the previous change", fast, slow, ta - 300*ms, tagged(ta-5*s, 0), ta, 0,
			true, 3, 0, 200 * time.Millisecond, gcra.State{}},
		// Its TAT 5 s ahead is later than empty: 4 s of slots booked under
		// fast keep their times — 40 tokens, 8 s under slow.
		{"older epoch: booked slots keep their times", fast, slow, ta - 300*ms, tagged(ta+5*s, 0), ta, 0,
			false, 0, 8 * time.Second, 8800 * time.Millisecond, gcra.State{}},
		{"before the change: previous decides, as stored", fast, slow, 0, tagged(ta-500*ms, pe), ta - s, 1,
			// Written before the change and rested by it: a missing key
			// holds exactly what it would, so Rested is its TAT.
			true, 4, 0, 600 * time.Millisecond, tagged(ta-400*ms, pe)},
		// Still refilling at the change: 2 of 10 tokens held at ta, which
		// 2/s (T 500 ms) refills to 10 only at ta + 8·500 ms… from a TAT of
		// ta + 5 s − 2·500 ms = ta + 4 s. The key must outlive that, not just
		// its TAT of ta + 800 ms.
		{"before the change, refilling past it", fast, gcra.PerSecond(2, 10), 0, tagged(ta+700*ms, pe), ta - 200*ms, 1,
			true, 0, 0, time.Second, gcra.State{TAT: ta + 800*ms, Rested: ta + 4*s, Epoch: pe, Exists: true}},
		{"newer epoch: as stored, tag kept", fast, slow, 0, tagged(ta+100*ms, 3), ta, 1,
			true, 2, 0, 300 * time.Millisecond, tagged(ta+300*ms, 3)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sch := gcra.Change(gcra.Version{Limit: tt.prev, Epoch: pe, Effective: tt.pEff},
				gcra.Version{Limit: tt.cur, Epoch: ae, Effective: ta})
			if err := sch.Validate(); err != nil {
				t.Fatal(err)
			}
			next, write, r, err := gcra.Decide(tt.st, tt.now, &sch, tt.n)
			if err != nil {
				t.Fatal(err)
			}
			if r.Allowed != tt.wantAllowed || r.Remaining != tt.wantRemaining || r.RetryAfter != tt.wantRetry || r.ResetAfter != tt.wantReset {
				t.Errorf("got %+v; want allowed=%v remaining=%d retry=%v reset=%v", r, tt.wantAllowed, tt.wantRemaining, tt.wantRetry, tt.wantReset)
			}
			if want := tt.wantWrite.Exists; write != want {
				t.Fatalf("write = %v, want %v", write, want)
			}
			// A written state names the limit that decided it.
			wantWrite := tt.wantWrite
			wantWrite.T, wantWrite.Burst = r.Limit.IntervalMicros(), r.Limit.Burst()
			if write && next != wantWrite {
				t.Errorf("wrote %+v, want %+v", next, wantWrite)
			}
			if !write && next != tt.st {
				t.Errorf("no write, but state %+v became %+v", tt.st, next)
			}
		})
	}
}

// TestRetryAfterExactBeforeThePreviousChange: a schedule whose previous
// limit is not yet effective (two changes announced within one lead time).
// A key with state from an older epoch counts as empty at the previous
// change; Decide takes that change as "now", so the key is denied with
// RetryAfter T, and again at now+T, and again…: RetryAfter is not exact.
func TestRetryAfterExactBeforeThePreviousChange(t *testing.T) {
	l := gcra.PerSecond(10, 5) // T 100 ms
	schedules := map[string]gcra.Schedule{
		"previous in the future": gcra.Change(
			gcra.Version{Limit: l, Epoch: 6, Effective: 10 * s},
			gcra.Version{Limit: gcra.PerSecond(20, 5), Epoch: 7, Effective: 20 * s}),
		"current in the future, no previous": {Current: gcra.Version{Limit: l, Epoch: 6, Effective: 10 * s}},
	}
	st := gcra.State{TAT: 0, Epoch: 5, Exists: true} // rested long ago, older epoch
	for name, sch := range schedules {
		t.Run(name, func(t *testing.T) {
			now := 5 * s
			_, _, r, _ := gcra.Decide(st, now, &sch, 1)
			if r.Allowed || r.TooLarge {
				return // admitted: nothing to check
			}
			ra := us(r.RetryAfter)
			if _, _, again, _ := gcra.Decide(st, now+ra, &sch, 1); !again.Allowed {
				t.Errorf("denied at %v with RetryAfter %v; at +RetryAfter denied again with RetryAfter %v",
					time.Duration(now)*time.Microsecond, r.RetryAfter, again.RetryAfter)
			}
		})
	}
}

// TestRetryAfterExactWhenConversionClamped: a share cut converts booked
// debt into days of debt under the new limit; RetryAfter stays exact (the
// conversion is exact up to MaxTAT, where it saturates).
func TestRetryAfterExactWhenConversionClamped(t *testing.T) {
	const ta = 100 * s
	prev := gcra.PerSecond(1000, 100)          // T 1 ms, window 100 ms
	cur := gcra.FromInterval(1_000_000_000, 2) // T 1000 s: a share cut 10⁶-fold
	sch := gcra.Change(gcra.Version{Limit: prev, Epoch: 1}, gcra.Version{Limit: cur, Epoch: 2, Effective: ta})
	// A 1 s reservation booked under prev just before the change: 1000 tokens
	// of debt, 10⁶ s (11.6 days) under cur.
	st := gcra.State{TAT: ta + 1100*ms, Epoch: 1, Exists: true}
	_, _, r, _ := gcra.Decide(st, ta, &sch, 1)
	if r.Allowed {
		t.Fatalf("admitted with 1000 tokens of debt: %+v", r)
	}
	ra := us(r.RetryAfter)
	if _, _, again, _ := gcra.Decide(st, ta+ra, &sch, 1); !again.Allowed {
		t.Errorf("denied with RetryAfter %v; at +RetryAfter denied again with RetryAfter %v", r.RetryAfter, again.RetryAfter)
	}
}

// TestDecideWriterLimit reads states written under another limit than the
// one their epoch names for the reader: the TAT counts the writer's tokens,
// so it is converted from the writer's limit. Every case but the last fails on 7833642 (a state rested long before reads alike either way),
// which read such a TAT in the reader's own unit (the explorer's epoch-slot
// class: a sibling agent of the region in another epoch slot, or one that
// skipped a version, turned a fast writer's admissions into credit under a
// slow limit — OA_budget up to 1.1 % of a key).
func TestDecideWriterLimit(t *testing.T) {
	const ta = 100 * s
	fast := gcra.PerSecond(10, 10)           // T 100 ms, window 1 s
	slow := gcra.FromInterval(1*s, 10)       // T 1 s, window 10 s
	fastHalf := gcra.FromInterval(50*ms, 10) // T 50 ms, window 500 ms
	by := func(tat int64, tag uint64, l gcra.Limit) gcra.State {
		return gcra.State{TAT: tat, Epoch: tag, T: l.IntervalMicros(), Burst: l.Burst(), Exists: true}
	}
	tests := []struct {
		name          string
		sch           gcra.Schedule
		st            gcra.State
		now           int64
		wantRemaining int64
	}{
		// A sibling in the table's slot (epoch 2, fast) spent all 10
		// tokens at ta + 500 ms; this agent runs the version reduced
		// (epoch 3, slow, after epoch 1, slow). Read as older than epoch 1
		// in slow's unit it held 5 tokens; the sibling's bucket is empty.
		{"tag between previous and current, fast writer, empty", gcra.Change(
			gcra.Version{Limit: slow, Epoch: 1, Effective: ta - 300*ms}, gcra.Version{Limit: fast, Epoch: 3, Effective: ta}),
			by(ta+1500*ms, 2, fast), ta + 500*ms, 0},
		// The same epoch at another reduced limit: a sibling's fast TAT 1 s
		// ahead is its whole burst; in slow's unit it read as 1 token of 10.
		{"same epoch, another limit", gcra.Steady(slow),
			by(ta+1*s, 0, fast), ta, 0},
		{"same epoch, another limit, partly spent", gcra.Steady(slow),
			by(ta+500*ms, 0, fast), ta, 5},
		// A newer epoch's state (never converted back) written under a
		// faster limit: 250 ms of fastHalf's window is 5 of its 10 tokens.
		{"newer epoch, faster writer", gcra.Change(
			gcra.Version{Limit: fast, Epoch: 1, Effective: ta - 2*s}, gcra.Version{Limit: slow, Epoch: 2, Effective: ta - s}),
			by(ta+250*ms, 7, fastHalf), ta, 5},
		// The previous epoch written at another limit than this agent's
		// previous one (both ran it reduced, at different floors).
		{"previous epoch, another limit", gcra.Change(
			gcra.Version{Limit: slow, Epoch: 1, Effective: 0}, gcra.Version{Limit: slow, Epoch: 2, Effective: ta}),
			by(ta+2*s+800*ms, 1, fast), ta + 2*s, 2},
		// Older than the version in force (before the change to epoch 5:
		// no previous of its own): floored at
		// empty at the change, or the writer's tokens if fewer.
		{"older epoch, no previous: writer's debt kept", gcra.Change(
			gcra.Version{Limit: slow, Epoch: 4, Effective: ta - 20*s}, gcra.Version{Limit: slow, Epoch: 5, Effective: ta + 10*s}),
			by(ta+1*s, 2, fast), ta, 0},
		// A state its writer's limit says is rested reads as full once the
		// reader's own floor (empty at the previous change) has refilled.
		{"older epoch, rested long ago", gcra.Change(
			gcra.Version{Limit: slow, Epoch: 1, Effective: ta - 30*s}, gcra.Version{Limit: fast, Epoch: 3, Effective: ta - 20*s}),
			by(ta-25*s, 2, fast), ta, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.sch.Validate(); err != nil {
				t.Fatal(err)
			}
			_, _, r, err := gcra.Decide(tt.st, tt.now, &tt.sch, 0)
			if err != nil {
				t.Fatal(err)
			}
			if r.Remaining != tt.wantRemaining {
				t.Errorf("remaining %d, want %d (%+v)", r.Remaining, tt.wantRemaining, r)
			}
			// The same state with its writer's limit unknown — a 12-byte
			// value, read exactly as 7833642 read every state — holds at
			// least as much: these cases are that release's defect.
			old := tt.st
			old.T, old.Burst = 0, 0
			_, _, ro, _ := gcra.Decide(old, tt.now, &tt.sch, 0)
			if ro.Remaining < r.Remaining {
				t.Errorf("read without the writer's limit: remaining %d, fewer than %d", ro.Remaining, r.Remaining)
			}
			t.Logf("remaining %d; read without the writer's limit (7833642) %d", r.Remaining, ro.Remaining)
		})
	}
}

// TestDeniedReadRebases: a region raised from a floor, whose only state
// was written under the floor's slow limit, refills at its new limit from
// its first denied read on. It fails on the commit before Rebase: every
// read converted the slow writer's state afresh at the read, so the key
// refilled at the floor's rate (one token per 100 s) until that state's
// TAT, 95 s later, passed — the simulator's migrating tenants at floors of
// 0.1 % admitted nothing for whole runs.
func TestDeniedReadRebases(t *testing.T) {
	floor := gcra.FromInterval(100*s, 1) // the cold key's limit, which wrote the state
	prev := gcra.Version{Limit: gcra.FromInterval(100*s, 8), Epoch: 8, Effective: 4 * s}
	cur := gcra.Version{Limit: gcra.FromInterval(40*ms, 25), Epoch: 12, Effective: 5 * s}
	sch := gcra.Change(prev, cur)
	if err := sch.Validate(); err != nil {
		t.Fatal(err)
	}
	// One admission at 2 s under the floor: TAT 102 s, tag 1.
	st := gcra.State{TAT: 102 * s, Rested: 102 * s, Epoch: 1, T: floor.IntervalMicros(), Burst: floor.Burst(), Exists: true}
	tests := []struct {
		now         int64
		wantAllowed bool
		wantRemain  int64
	}{
		// 5 s of the floor's 100 s credit left at 7 s: 0.05 of a token.
		{7 * s, false, 0},
		// Re-stored at 7 s under cur: full again 1 s later.
		{8 * s, true, 24},
		{8*s + 1, true, 23},
	}
	for i, tt := range tests {
		next, write, r, err := gcra.Decide(st, tt.now, &sch, 1)
		if err != nil {
			t.Fatal(err)
		}
		if r.Allowed != tt.wantAllowed || r.Remaining != tt.wantRemain {
			t.Fatalf("t%d at %dµs: allowed=%v remaining=%d, want %v %d (retry-after %v)", i, tt.now, r.Allowed, r.Remaining, tt.wantAllowed, tt.wantRemain, r.RetryAfter)
		}
		if i == 0 {
			// The denial consumed nothing: the re-stored state holds what
			// the read did, and names the limit in force.
			want := gcra.State{TAT: 7*s + s - 2*ms, Rested: 7*s + s - 2*ms, Epoch: 12, T: 40 * ms, Burst: 25, Exists: true}
			if !write || next != want {
				t.Fatalf("t0: write=%v next=%+v, want a write of %+v", write, next, want)
			}
		}
		if write {
			st = next
		}
	}
}
