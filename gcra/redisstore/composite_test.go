package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/internal/testenv"
)

// TestCompositeWithoutTagOnOneNode: a single Redis (or Sentinel) has no
// slots, so a composite decides in one script call whatever its keys —
// untagged keys (every envoyproxy/ratelimit config has no hash_tag) and
// keys of different tags alike — all or nothing, on one lane, even when its
// keys' single decisions use different lanes.
//
// fails on 2023668: every composite with two untagged keys, or two tags,
// failed with ErrCrossSlot on a single non-cluster Redis.
func TestCompositeWithoutTagOnOneNode(t *testing.T) {
	c := testenv.Redis(t)
	cfg := DefaultConfig()
	cfg.Prefix = testenv.Prefix(t)
	cfg.Lanes = 4
	testenv.Cleanup(t, c, cfg.Prefix)
	s, err := New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	now := wallMicros()
	setNow(s, now)
	// Two untagged keys whose single decisions use different lanes (the
	// lane follows the key's slot, which depends on the test's prefix).
	tenant := gcra.Key{Name: "api/tenant=acme"}
	var route gcra.Key
	for i := 0; ; i++ {
		route = gcra.Key{Name: fmt.Sprintf("api/tenant=acme/route=%%2Fsearch%d", i)}
		if s.lanes.get(keySlot(s.RedisKey(tenant))) != s.lanes.get(keySlot(s.RedisKey(route))) {
			break
		}
	}
	tenantLim := gcra.Steady(gcra.PerHour(100, 10))
	routeLim := gcra.Steady(gcra.PerHour(10, 2))
	both := []gcra.Check{{Key: tenant, Schedule: tenantLim, Cost: 1}, {Key: route, Schedule: routeLim, Cost: 1}}
	out := make([]gcra.Result, 2)
	for i, want := range []bool{true, true, false, false} {
		r, err := s.DecideAll(ctx, both, out)
		if err != nil {
			t.Fatalf("composite %d: %v", i, err)
		}
		if r.Allowed != want {
			t.Fatalf("composite %d: allowed %v, want %v (the route's burst is 2)", i, r.Allowed, want)
		}
	}
	// The denied composites charged nothing: the tenant has 10 − 2 left.
	if out[0].Remaining != 8 || out[1].RetryAfter <= 0 {
		t.Errorf("after the denials: tenant %+v, route %+v; want 8 remaining and the route denying", out[0], out[1])
	}
	r, err := s.Decide(ctx, tenant, tenantLim, 8)
	if err != nil || !r.Allowed || r.Remaining != 0 {
		t.Errorf("tenant alone after the composites: %+v %v, want its 8 left admitted", r, err)
	}
	// Two tags decide together too: no slots to share.
	a, b := gcra.Key{Tag: "north", Name: "x"}, gcra.Key{Tag: "south", Name: "x"}
	if r, err := s.DecideAll(ctx, []gcra.Check{{Key: a, Schedule: routeLim, Cost: 2}, {Key: b, Schedule: routeLim, Cost: 2}}, out); err != nil || !r.Allowed {
		t.Errorf("composite of two tags: %+v %v, want admitted", r, err)
	}
	// Concurrent composites and single decisions over keys of different
	// lanes: each decision atomic, the totals exact.
	lim := gcra.Steady(gcra.FromInterval(60_000_000, 1000)) // the fixed now refills nothing
	keys := make([]gcra.Key, 6)
	for i := range keys {
		keys[i] = gcra.Key{Name: fmt.Sprintf("k%d", i)}
	}
	var wg sync.WaitGroup
	errc := make(chan error, 64)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := make([]gcra.Result, 3)
			for j := range 50 {
				ch := []gcra.Check{
					{Key: keys[(g+j)%6], Schedule: lim, Cost: 1},
					{Key: keys[(g+j+1)%6], Schedule: lim, Cost: 1},
					{Key: keys[(g+j+3)%6], Schedule: lim, Cost: 1},
				}
				if j%3 == 0 {
					if _, err := s.Decide(ctx, ch[0].Key, lim, 1); err != nil {
						errc <- err
						return
					}
				} else if r, err := s.DecideAll(ctx, ch, res); err != nil || !r.Allowed {
					errc <- errors.Join(err, fmt.Errorf("composite %+v", r))
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	// 8 callers × 50: 17 single decisions and 33 composites of 3 each.
	var total int64
	for _, k := range keys {
		r, err := s.Decide(ctx, k, lim, 0)
		if err != nil {
			t.Fatal(err)
		}
		total += 1000 - r.Remaining
	}
	if want := int64(8 * (17 + 33*3)); total != want {
		t.Errorf("%d units consumed over the keys, want %d", total, want)
	}
}
