package redisstore

import (
	"context"
	"testing"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/internal/testenv"
)

// TestCheckState is issue 17's defect 10 (detection): a Redis that loses
// its data (here FLUSHALL on a private server, as a restart without
// persistence or a failover to a replica that had not caught up would)
// re-grants every key's burst; CheckState reports it once, and not on the
// first check or while the data stays. Fails on 6dc83cc, which had no way
// to tell.
func TestCheckState(t *testing.T) {
	srv := testenv.StartRedis(t)
	c := srv.Client()
	ctx := context.Background()
	cfg := DefaultConfig()
	cfg.Prefix = "state-test:"
	s, err := New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	check := func(want int) {
		t.Helper()
		got, err := s.CheckState(ctx)
		if err != nil || got != want {
			t.Fatalf("CheckState = %d, %v; want %d", got, err, want)
		}
	}
	check(0) // writes the marker
	check(0)
	lim := gcra.PerSecond(1, 5)
	for range 5 {
		if r, err := s.Decide(ctx, gcra.Key{Name: "k"}, gcra.Steady(lim), 1); err != nil || !r.Allowed {
			t.Fatalf("decide: %+v %v", r, err)
		}
	}
	if r, _ := s.Decide(ctx, gcra.Key{Name: "k"}, gcra.Steady(lim), 1); r.Allowed {
		t.Fatal("the burst of 5 admitted a sixth")
	}
	if err := c.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if r, _ := s.Decide(ctx, gcra.Key{Name: "k"}, gcra.Steady(lim), 1); !r.Allowed {
		t.Fatal("after the flush the key was still empty")
	}
	check(1) // the loss, once
	check(0)
	// A second store on the same Redis (another agent of the region) sees
	// the marker for the first time: not a loss.
	s2, err := New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := s2.CheckState(ctx); n != 0 || err != nil {
		t.Errorf("another store's first check: %d, %v; want 0", n, err)
	}
}
