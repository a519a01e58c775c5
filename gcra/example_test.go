package gcra_test

import (
	"fmt"
	"time"

	"github.com/meridian-quota/meridian/gcra"
)

// The trace of seed 003: 5 per second with burst 3, times in µs.
func ExampleDecide() {
	sch := gcra.Steady(gcra.PerSecond(5, 3))
	var st gcra.State // a key with no state
	ms := int64(time.Millisecond / time.Microsecond)
	for _, now := range []int64{0, 0, 0, 0, 250 * ms, 250 * ms} {
		next, write, r, err := gcra.Decide(st, now, &sch, 1)
		if err != nil {
			panic(err)
		}
		if write {
			st = next // a store writes next only when told to
		}
		fmt.Printf("t=%-5v allowed=%-5v remaining=%d retry-after=%v\n",
			time.Duration(now)*time.Microsecond, r.Allowed, r.Remaining, r.RetryAfter)
	}
	// Output:
	// t=0s    allowed=true  remaining=2 retry-after=0s
	// t=0s    allowed=true  remaining=1 retry-after=0s
	// t=0s    allowed=true  remaining=0 retry-after=0s
	// t=0s    allowed=false remaining=0 retry-after=200ms
	// t=250ms allowed=true  remaining=0 retry-after=0s
	// t=250ms allowed=false remaining=0 retry-after=150ms
}

// Reserve books the next free slot and says how long to wait for it,
// refusing only when the wait would exceed maxWait.
func ExampleReserve() {
	sch := gcra.Steady(gcra.PerSecond(10, 2)) // one per 100 ms, 2 at once
	maxWait := int64(250 * time.Millisecond / time.Microsecond)
	var st gcra.State
	for i := 0; i < 6; i++ {
		next, write, r, err := gcra.Reserve(st, 0, &sch, 1, maxWait)
		if err != nil {
			panic(err)
		}
		if write {
			st = next
		}
		if r.Allowed {
			fmt.Printf("request %d: booked, go in %v\n", i, r.Wait)
		} else {
			fmt.Printf("request %d: refused, retry in %v\n", i, r.RetryAfter)
		}
	}
	// Output:
	// request 0: booked, go in 0s
	// request 1: booked, go in 0s
	// request 2: booked, go in 100ms
	// request 3: booked, go in 200ms
	// request 4: refused, retry in 300ms
	// request 5: refused, retry in 300ms
}

// DecideAll admits a request only if every limit does, and then consumes
// all of them; otherwise it consumes none.
func ExampleDecideAll() {
	checks := []gcra.Check{
		{Key: gcra.Key{Tag: "tenant42", Name: "all"}, Schedule: gcra.Steady(gcra.PerSecond(100, 10)), Cost: 1},
		{Key: gcra.Key{Tag: "tenant42", Name: "user:7"}, Schedule: gcra.Steady(gcra.PerSecond(1, 2)), Cost: 1},
	}
	states := make([]gcra.State, len(checks))
	next := make([]gcra.State, len(checks))
	out := make([]gcra.Result, len(checks))
	for i := 0; i < 3; i++ {
		r, write, err := gcra.DecideAll(0, checks, states, next, out)
		if err != nil {
			panic(err)
		}
		if write {
			copy(states, next)
		}
		fmt.Printf("allowed=%-5v retry-after=%-4v bound by %v; tenant remaining %d\n",
			r.Allowed, r.RetryAfter, r.Limit, out[0].Remaining)
	}
	// Output:
	// allowed=true  retry-after=0s   bound by 1/1s burst 2 (T=1000000µs); tenant remaining 9
	// allowed=true  retry-after=0s   bound by 1/1s burst 2 (T=1000000µs); tenant remaining 8
	// allowed=false retry-after=1s   bound by 1/1s burst 2 (T=1000000µs); tenant remaining 8
}
