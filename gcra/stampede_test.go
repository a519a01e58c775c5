package gcra_test

import (
	"testing"

	"github.com/meridian-quota/meridian/gcra"
)

// stampede runs clients sharing one key as a discrete-event loop on virtual
// time: no goroutines, no sleeps. Every client calls at 0; call returns when
// that client calls next. The earliest call goes first, ties in client
// order. Calls and admissions made in [0, end) are counted.
func stampede(t *testing.T, clients int, end int64, call func(st *gcra.State, now int64) (admitted bool, next int64)) (calls, admits int) {
	t.Helper()
	var st gcra.State
	nextCall := make([]int64, clients)
	for {
		c := 0
		for i := range nextCall {
			if nextCall[i] < nextCall[c] {
				c = i
			}
		}
		now := nextCall[c]
		if now >= end {
			return calls, admits
		}
		ok, next := call(&st, now)
		if next < now {
			t.Fatalf("client %d would call again in the past: %d < %d", c, next, now)
		}
		calls++
		if ok {
			admits++
		}
		nextCall[c] = next
		if calls > 1_000_000 {
			t.Fatalf("runaway simulation")
		}
	}
}

// TestStampede compares seed 000's two client strategies for 20 clients
// sharing PerSecond(10, 6) over 3 s: retrying after every denial wakes all
// denied clients together, so nearly every call is wasted; reserving a slot
// makes one call per admitted request.
func TestStampede(t *testing.T) {
	const (
		clients = 20
		end     = 3 * s
		maxWait = 2 * s
	)
	l := gcra.PerSecond(10, 6)
	sch := gcra.Steady(l)

	// (a) Retry on deny: on admit call again at once (no work time); on
	// deny sleep exactly RetryAfter.
	var retryActs []int64
	retryCalls, retryAdmits := stampede(t, clients, end, func(st *gcra.State, now int64) (bool, int64) {
		next, write, r, err := gcra.Decide(*st, now, &sch, 1)
		if err != nil {
			t.Fatal(err)
		}
		if write {
			*st = next
		}
		if r.Allowed {
			retryActs = append(retryActs, now)
			return true, now
		}
		if r.RetryAfter <= 0 {
			t.Fatalf("denied with RetryAfter %v", r.RetryAfter)
		}
		return false, now + us(r.RetryAfter)
	})
	// (b) Reserve with maxWait 2 s: sleep Result.Wait, then call again.
	refused := 0
	var reserveActs []int64
	resCalls, resAdmits := stampede(t, clients, end, func(st *gcra.State, now int64) (bool, int64) {
		next, write, r, err := gcra.Reserve(*st, now, &sch, 1, maxWait)
		if err != nil {
			t.Fatal(err)
		}
		if write {
			*st = next
		}
		if !r.Allowed {
			refused++
			return false, now + us(r.RetryAfter) - maxWait
		}
		if us(r.Wait) > maxWait {
			t.Fatalf("booked with Wait %v > maxWait", r.Wait)
		}
		reserveActs = append(reserveActs, now+us(r.Wait))
		return true, now + us(r.Wait)
	})

	t.Logf("retry on deny: %d calls for %d admitted (%.1f calls each)", retryCalls, retryAdmits, float64(retryCalls)/float64(retryAdmits))
	t.Logf("reserve:       %d calls for %d admitted (%d refused)", resCalls, resAdmits, refused)

	if retryAdmits == 0 || retryCalls < 10*retryAdmits {
		t.Errorf("retry on deny: %d calls for %d admitted, want ≥ 10 calls per admitted request", retryCalls, retryAdmits)
	}
	if resCalls != resAdmits || refused != 0 {
		t.Errorf("reserve: %d calls for %d admitted (%d refused), want exactly one call per admitted request", resCalls, resAdmits, refused)
	}
	if resAdmits <= retryAdmits {
		t.Errorf("reserve admitted %d, retry %d: want reserve to admit more", resAdmits, retryAdmits)
	}
	// Retry: the burst of 6 at 0, then one per 100 ms (the k-th at k·100 ms, k < 30).
	if retryAdmits != 35 {
		t.Errorf("retry admitted %d in [0, 3s), want 6 + 29 = 35", retryAdmits)
	}
	// Reserve: 20 bookings at 0 (waits 0…1.4 s), the 6 that wait 0 book
	// again at once (1.5…2.0 s) — TAT now 2.6 s — and from then on one
	// client calls at each slot k·100 ms (k = 1…29) and books 2 s ahead.
	if resAdmits != 20+6+29 {
		t.Errorf("reserve admitted %d in [0, 3s), want 20 + 6 + 29 = 55", resAdmits)
	}
	// Both strategies respect the limit where the requests act.
	for name, at := range map[string][]int64{"retry": retryActs, "reserve": reserveActs} {
		checkSpacing(t, name, l, at)
	}
}

// checkSpacing asserts the GCRA bound on sorted act times: at most
// Burst + floor((b−a)/T) requests act within any [a, b].
func checkSpacing(t *testing.T, name string, l gcra.Limit, acts []int64) {
	t.Helper()
	T, B := l.IntervalMicros(), l.Burst()
	for i := range acts {
		for j := i; j < len(acts); j++ {
			if acts[j] < acts[i] {
				t.Fatalf("%s: act times out of order: %v", name, acts)
			}
			if got, bound := int64(j-i+1), B+(acts[j]-acts[i])/T; got > bound {
				t.Fatalf("%s: %d requests act within [%d, %d], bound %d", name, got, acts[i], acts[j], bound)
			}
		}
	}
}
