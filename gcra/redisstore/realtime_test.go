package redisstore

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/internal/testenv"
)

// TestRealTimeDecide hammers one key from 20 goroutines for about 1.5 s on
// the server's clock and checks the admitted stream against the limit: never
// more than Burst + elapsed/T (+1), not far fewer, and after the burst one
// admission every T on average.
func TestRealTimeDecide(t *testing.T) {
	testenv.SkipShort(t, "real-time test: 1.5 s")
	s, _ := newTestStore(t)
	ctx := context.Background()
	lim := gcra.PerSecond(50, 5)
	sch := gcra.Steady(lim)
	k := gcra.Key{Tag: "rt", Name: "hammer"}
	const workers = 20
	const run = 1500 * time.Millisecond

	var (
		mu       sync.Mutex
		admitted []time.Time
		calls    int
		firstErr error
		wg       sync.WaitGroup
	)
	begin := make(chan struct{})
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-begin
			var mine []time.Time
			n := 0
			var err error
			for start := time.Now(); time.Since(start) < run; {
				var r gcra.Result
				r, err = s.Decide(ctx, k, sch, 1)
				n++
				if err != nil {
					break
				}
				if r.Allowed {
					mine = append(mine, time.Now())
				}
			}
			mu.Lock()
			admitted = append(admitted, mine...)
			calls += n
			if err != nil && firstErr == nil {
				firstErr = err
			}
			mu.Unlock()
		}()
	}
	start := time.Now()
	close(begin)
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		t.Fatalf("decide: %v", firstErr)
	}

	T := lim.Interval()
	b := lim.Burst()
	ideal := float64(b) + float64(elapsed)/float64(T)
	n := len(admitted)
	t.Logf("%d calls in %v, %d admitted; ideal %.1f (burst %d + %v/%v)", calls, elapsed, n, ideal, b, elapsed, T)
	if max := int(ideal) + 1; n > max {
		t.Errorf("admitted %d in %v, more than Burst + elapsed/T + 1 = %d", n, elapsed, max)
	}
	if min := 0.7 * ideal; float64(n) < min {
		t.Errorf("admitted %d in %v, fewer than 70%% of the ideal %.1f", n, elapsed, ideal)
	}
	if n < int(b)+10 {
		t.Fatalf("only %d admitted: too few to measure the spacing", n)
	}
	slices.SortFunc(admitted, func(a, b time.Time) int { return a.Compare(b) })
	// From the last admission of the initial burst on, one every T.
	span := admitted[n-1].Sub(admitted[b-1])
	mean := span / time.Duration(n-int(b))
	t.Logf("mean spacing after the burst %v (T = %v)", mean, T)
	if lo, hi := T*85/100, T*115/100; mean < lo || mean > hi {
		t.Errorf("mean spacing after the burst %v, want %v ±15%%", mean, T)
	}
}

// reservation is one Reserve call as the client saw it: the booked slot
// (server now + Wait) lies in [start+Wait, end+Wait].
type reservation struct {
	start, end time.Time
	res        gcra.Result
	err        error
}

func (r reservation) lo() time.Time { return r.start.Add(r.res.Wait) }
func (r reservation) hi() time.Time { return r.end.Add(r.res.Wait) }

// TestRealTimeReserve: 20 concurrent reservations on PerSecond(20, 1) with
// maxWait 1 s all fit the queue and book slots at least T apart; a second
// wave is refused only where the wait would exceed maxWait.
func TestRealTimeReserve(t *testing.T) {
	s, _ := newTestStore(t)
	ctx := context.Background()
	lim := gcra.PerSecond(20, 1)
	sch := gcra.Steady(lim)
	T := lim.Interval()
	k := gcra.Key{Tag: "rt", Name: "queue"}
	const workers = 20
	const maxWait = time.Second

	wave := func() []reservation {
		out := make([]reservation, workers)
		var wg sync.WaitGroup
		begin := make(chan struct{})
		for i := range out {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-begin
				st := time.Now()
				r, err := s.Reserve(ctx, k, sch, 1, maxWait)
				out[i] = reservation{start: st, end: time.Now(), res: r, err: err}
			}()
		}
		close(begin)
		wg.Wait()
		return out
	}
	first := wave()
	second := wave()

	var booked []reservation
	for i, r := range append(first, second...) {
		inFirst := i < workers
		switch {
		case r.err != nil:
			t.Fatalf("reserve: %v", r.err)
		case r.res.Allowed:
			if r.res.Wait > maxWait {
				t.Errorf("booked with wait %v > maxWait %v", r.res.Wait, maxWait)
			}
			booked = append(booked, r)
		case inFirst:
			// 20 slots T apart need 19·T = 950 ms < maxWait.
			t.Errorf("first wave: refused (%+v) while the queue fits in maxWait", r.res)
		case r.res.TooLarge || r.res.RetryAfter <= maxWait:
			t.Errorf("second wave: refused with RetryAfter %v (TooLarge %v), want a refusal only past maxWait %v",
				r.res.RetryAfter, r.res.TooLarge, maxWait)
		}
	}
	elapsed := second[0].end.Sub(first[0].start)
	for _, r := range second {
		elapsed = max(elapsed, r.end.Sub(first[0].start))
	}
	if limit := 1 + int((elapsed+maxWait)/T) + 1; len(booked) > limit {
		t.Errorf("%d booked within %v + maxWait, more than %d", len(booked), elapsed, limit)
	}

	// Booked slots are at least T apart. Each slot is known to within its
	// call's latency; sorting by the earliest bound gives the true order
	// while every latency is below T/2, so only such pairs are judged.
	slices.SortFunc(booked, func(a, b reservation) int { return a.lo().Compare(b.lo()) })
	judged, naiveMin := 0, time.Duration(1<<62)
	for i := 1; i < len(booked); i++ {
		a, b := booked[i-1], booked[i]
		naiveMin = min(naiveMin, b.lo().Sub(a.lo()))
		if a.end.Sub(a.start) >= T/2 || b.end.Sub(b.start) >= T/2 {
			continue
		}
		judged++
		if gap := b.hi().Sub(a.lo()); gap < T {
			t.Errorf("slots %d and %d at most %v apart (waits %v, %v), want ≥ T = %v", i-1, i, gap, a.res.Wait, b.res.Wait, T)
		}
	}
	t.Logf("%d booked in %v; %d adjacent pairs judged; smallest gap of call time + Wait: %v (T = %v)",
		len(booked), elapsed, judged, naiveMin, T)
	if judged < len(booked)/2 {
		t.Errorf("only %d of %d pairs had calls faster than T/2: the spacing was not checked", judged, len(booked)-1)
	}
}
