package region

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/meridian-quota/meridian/gcra/memstore"
)

// denyTwins are two nodes of one agent's region on twin memstores with one
// clock: one with the deny cache, one without, so that for the same request
// at the same instant the second's answer is the store's.
func denyTwins(t *testing.T) (with, without *Node, clock *atomic.Int64) {
	t.Helper()
	clock = new(atomic.Int64)
	clock.Store(1_700_000_000_000_000)
	mk := func(cache bool) *Node {
		ms, err := memstore.New(memstore.Config{Clock: clock.Load, Shards: 1, MaxKeys: 100})
		if err != nil {
			t.Fatal(err)
		}
		cfg := DefaultConfig("eu", "eu-1", regions...)
		cfg.DenyCache = cache
		n, err := NewNode(cfg, mustPolicy(t, testPolicy), ms)
		if err != nil {
			t.Fatal(err)
		}
		now := clock.Load()
		// eu: tenant 50/h burst 5, route /search 25/h burst 2.
		if err := n.Apply(table(1, 1, now, now-hour, 1, 500_000, acme, acmeSearch), now); err != nil {
			t.Fatal(err)
		}
		return n
	}
	return mk(true), mk(false), clock
}

// sameAnswer fails unless the cache's decision d1 reports what the store's
// d2 does: the answer, the combined result and every limit's own result.
func sameAnswer(t *testing.T, step int, d1, d2 *Decision) {
	t.Helper()
	if d1.Allowed != d2.Allowed || d1.Result != d2.Result || len(d1.Matches) != len(d2.Matches) {
		t.Fatalf("step %d: cache allowed %v %+v, store allowed %v %+v", step, d1.Allowed, d1.Result, d2.Allowed, d2.Result)
	}
	for j := range d1.Matches {
		if m1, m2 := &d1.Matches[j], &d2.Matches[j]; m1.Result != m2.Result || m1.Denied() != m2.Denied() {
			t.Fatalf("step %d: limit %s: cache %+v (denied %v), store %+v (denied %v)", step, m1.Key.Name,
				m1.Result, m1.Denied(), m2.Result, m2.Denied())
		}
	}
}

// TestNodeDenyCacheReportsWhatTheStoreWould: a request the deny cache
// answers reports, for every limit of it, what the store would have said for
// the same request at the same instant — the limit that denies its own
// retry-after, reset and remaining, and the others of a composite their own
// untouched state — not a bare denial.
//
// fails on 2023668: after the route limit denied a composite, the cache's
// next answer gave the tenant limit (which would have admitted) "remaining 0,
// reset 0" where the store said 3 remaining, reset 2m24s; and a cost-2
// request denied with one token left was reported remaining 0 where the
// store said 1.
func TestNodeDenyCacheReportsWhatTheStoreWould(t *testing.T) {
	with, without, clock := denyTwins(t)
	ctx := context.Background()
	both := req(1, tenant("acme"), tenant("acme", Entry{"route", "/search"}))
	var d1, d2 Decision
	step := 0
	decide := func(r *Request) {
		t.Helper()
		step++
		now := clock.Load()
		if err := with.Decide(ctx, now, r, &d1); err != nil {
			t.Fatal(err)
		}
		if err := without.Decide(ctx, now, r, &d2); err != nil {
			t.Fatal(err)
		}
		sameAnswer(t, step, &d1, &d2)
	}
	// The route's burst of 2 goes; the third composite is denied by the
	// store, the fourth at the same instant by the cache.
	for range 4 {
		decide(both)
	}
	if h := with.Stats().DenyCacheHits; h != 1 {
		t.Fatalf("%d deny-cache hits, want 1 (the fourth composite)", h)
	}
	if r := &d1.Matches[0].Result; r.Remaining != 3 || r.Allowed || d1.Matches[0].Denied() {
		t.Errorf("tenant limit in a composite the route denied: %+v, want 3 remaining, not itself denied", *r)
	}
	// A single limit with one token left, asked for two.
	decide(req(2, tenant("acme"))) // tenant 3 → 1
	decide(req(2, tenant("acme"))) // denied by the store: 1 left
	decide(req(2, tenant("acme"))) // denied by the cache
	if r := &d1.Matches[0].Result; r.Remaining != 1 || r.Allowed {
		t.Errorf("cost 2 with 1 token left: %+v, want denied with 1 remaining", *r)
	}
	// Then a random timeline: every answer the cache gives is the store's.
	rng := rand.New(rand.NewPCG(5, 6))
	for range 3000 {
		clock.Add(rng.Int64N(30e6)) // tenant refills a token every 72 s, the route every 144 s
		switch rng.IntN(4) {
		case 0:
			decide(req(int64(1+rng.IntN(3)), tenant("acme")))
		case 1:
			decide(req(1, tenant("acme", Entry{"route", "/search"})))
		default:
			decide(req(int64(rng.IntN(3)), tenant("acme"), tenant("acme", Entry{"route", "/search"})))
		}
	}
	h := with.Stats().DenyCacheHits
	t.Logf("%d of %d requests answered from the deny cache", h, step)
	if h < 500 {
		t.Errorf("only %d deny-cache hits in the timeline", h)
	}
}

// TestNodeDenialAllocatesNothing: a denial the store decides, which the
// deny cache then keeps, allocates nothing once the key is known — the
// hot path's rule (ARCHITECTURE: no allocation per request). Each round
// comes an hour after the last (the table's lease has lapsed, so the key
// runs its floor, a burst of 1): it admits one request (which clears the
// cache), then sends one the store denies (which fills it) and one the
// cache denies. Fails on e4c19e5: the
// cache kept each denial in a new struct, one allocation per denial the
// store decided.
func TestNodeDenialAllocatesNothing(t *testing.T) {
	n, _, clock := denyTwins(t)
	r := req(1, tenant("acme"))
	var d Decision
	round := func() {
		clock.Add(hour) // refilled: the first request is admitted
		for i := range 3 {
			if err := n.Decide(context.Background(), clock.Load(), r, &d); err != nil {
				t.Fatal(err)
			}
			if d.Allowed != (i == 0) {
				t.Fatalf("request %d of a round: allowed %v; want the first admitted, then denials", i, d.Allowed)
			}
		}
	}
	round() // the key's entry, its store state and the cache's part exist
	hits := n.Stats().DenyCacheHits
	if allocs := testing.AllocsPerRun(20, round); allocs != 0 {
		t.Errorf("%v allocations a round of one admission and two denials; want 0", allocs)
	}
	if n.Stats().DenyCacheHits == hits {
		t.Error("no denial came from the cache: the test no longer exercises it")
	}
}
