package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gcra/memstore"
	"github.com/meridian-quota/meridian/internal/testenv"
)

// fenceStore is what the fence tests drive: both stores, the same calls.
type fenceStore interface {
	gcra.Store
	gcra.Fencer
}

// TestFenceConformance runs one sequence of fence raises and fenced
// decisions on Redis and on the memstore and requires the same outcome at
// every step: a fenced decision below the fence held, or with none held,
// is gcra.ErrFenced, writes nothing (also for the other checks of a
// composite), and is not a store failure; the fence never goes down; an
// unfenced decision ignores it. On Redis, deleting the fence key (what a
// restart or eviction does) refuses fenced decisions again.
func TestFenceConformance(t *testing.T) {
	ctx := context.Background()
	rs, rc := newTestStore(t)
	ms, err := memstore.New(memstore.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	lim := gcra.PerSecond(10, 10)
	at := func(term, epoch uint64) gcra.Schedule {
		s := gcra.Steady(lim)
		s.Fence = gcra.Fence{Term: term, Epoch: epoch}
		return s
	}
	k1, k2 := gcra.Key{Name: "a"}, gcra.Key{Name: "b"}
	for _, tc := range []struct {
		name string
		s    fenceStore
		lose func()
	}{
		{"redis", rs, func() { rc.Del(ctx, rs.fenceKey) }},
		{"memstore", ms, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.s
			remaining := func(k gcra.Key) int64 {
				t.Helper()
				r, err := s.Decide(ctx, k, gcra.Steady(lim), 0)
				if err != nil {
					t.Fatal(err)
				}
				return r.Remaining
			}
			fenced := func(what string, err error) {
				t.Helper()
				if !errors.Is(err, gcra.ErrFenced) {
					t.Fatalf("%s: err %v, want gcra.ErrFenced", what, err)
				}
				if h, ok := errors.AsType[interface {
					error
					StoreHealthy() bool
				}](err); !ok || !h.StoreHealthy() {
					t.Fatalf("%s: a fence refusal must say the store is healthy", what)
				}
			}
			if _, err := s.Decide(ctx, k1, gcra.Steady(lim), 1); err != nil {
				t.Fatalf("unfenced decision with no fence held: %v", err)
			}
			_, err := s.Decide(ctx, k2, at(1, 1), 1)
			fenced("fenced decision with no fence held", err)
			if got := remaining(k2); got != 10 {
				t.Fatalf("a refused decision wrote: %d left, want 10", got)
			}
			held, id, err := s.RaiseFence(ctx, gcra.Fence{Term: 3, Epoch: 5})
			if err != nil || held != (gcra.Fence{Term: 3, Epoch: 5}) || id == 0 {
				t.Fatalf("RaiseFence(3, 5) = %v, %d, %v", held, id, err)
			}
			held, id2, err := s.RaiseFence(ctx, gcra.Fence{Term: 2, Epoch: 9})
			if err != nil || held != (gcra.Fence{Term: 3, Epoch: 5}) || id2 != id {
				t.Fatalf("RaiseFence(2, 9) = %v, %d, %v: want the fence kept at (3, 5) and the identity %d", held, id2, err, id)
			}
			_, err = s.Decide(ctx, k2, at(3, 4), 1)
			fenced("decision under (3, 4) with fence (3, 5)", err)
			_, err = s.Reserve(ctx, k2, at(2, 99), 1, time.Second)
			fenced("reservation under (2, 99)", err)
			out := make([]gcra.Result, 2)
			_, err = s.DecideAll(ctx, []gcra.Check{{Key: k1, Schedule: gcra.Steady(lim), Cost: 1}, {Key: k2, Schedule: at(3, 4), Cost: 1}}, out)
			fenced("composite with one check below the fence", err)
			if got := remaining(k1); got != 9 {
				t.Fatalf("a refused composite wrote its unfenced check: %d left, want 9", got)
			}
			for _, f := range []gcra.Fence{{Term: 3, Epoch: 5}, {Term: 3, Epoch: 6}, {Term: 4, Epoch: 0}} {
				if _, err := s.Decide(ctx, k2, at(f.Term, f.Epoch), 1); err != nil {
					t.Fatalf("decision under %v with fence (3, 5): %v", f, err)
				}
			}
			if got := remaining(k2); got != 7 {
				t.Fatalf("%d left after three admissions, want 7", got)
			}
			if tc.lose == nil {
				return
			}
			tc.lose()
			_, err = s.Decide(ctx, k2, at(9, 9), 1)
			fenced("fenced decision after the fence was lost", err)
		})
	}
}

// TestFenceIdentity: two prefixes on one server are two stores; a bad fence
// is refused.
func TestFenceIdentity(t *testing.T) {
	ctx := context.Background()
	a, c := newTestStore(t)
	cfg := a.cfg
	cfg.Prefix += "other:"
	b, err := New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Cleanup(t, c, cfg.Prefix)
	_, ida, err := a.RaiseFence(ctx, gcra.Fence{Term: 1, Epoch: 1})
	if err != nil {
		t.Fatal(err)
	}
	_, idb, err := b.RaiseFence(ctx, gcra.Fence{Term: 1, Epoch: 1})
	if err != nil {
		t.Fatal(err)
	}
	if ida == idb {
		t.Fatalf("two prefixes have one identity %d", ida)
	}
	if _, _, err := a.RaiseFence(ctx, gcra.Fence{}); !errors.Is(err, ErrBadInput) {
		t.Fatalf("zero fence: %v, want ErrBadInput", err)
	}
}

// TestFenceConfirmedOnReplicas: with a replica, RaiseFence returns only once
// the replica has the write (WAIT), and fails — so the agent reports no new
// fence and the coordinator waits for the region's leases — when the
// replica cannot confirm it (here: paused). A failover to a replica that
// missed the write would otherwise hold an older fence, which admits what
// the newer one refused.
func TestFenceConfirmedOnReplicas(t *testing.T) {
	ctx := context.Background()
	noDelay := []string{"--repl-diskless-sync-delay", "0"}
	master := testenv.StartRedis(t, noDelay...)
	replica := testenv.StartRedis(t, append(noDelay, "--replicaof", "127.0.0.1", fmt.Sprint(master.Port))...)
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err := replica.Client().Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			if n, _ := master.Client().Info(ctx, "replication").Result(); strings.Contains(n, "connected_slaves:1") {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica's link never came up: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cfg := DefaultConfig()
	cfg.FenceWait = 10 * time.Second // a guard against a hang, not a verdict: a loaded replica confirms late
	s, err := New(master.Client(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	held, id, err := s.RaiseFence(ctx, gcra.Fence{Term: 2, Epoch: 3})
	if err != nil || held != (gcra.Fence{Term: 2, Epoch: 3}) || id == 0 {
		t.Fatalf("RaiseFence with a live replica = %v, %d, %v", held, id, err)
	}
	if v, err := replica.Client().Get(ctx, s.fenceKey).Result(); err != nil || len(v) != 16 {
		t.Fatalf("the replica holds %q, %v: want the 16-byte fence", v, err)
	}
	if err := replica.Pause(); err != nil {
		t.Fatal(err)
	}
	// A paused replica never confirms, whatever the wait.
	s.cfg.FenceWait = 200 * time.Millisecond
	defer func() { _ = replica.Resume() }()
	if _, _, err := s.RaiseFence(ctx, gcra.Fence{Term: 2, Epoch: 4}); err == nil || !strings.Contains(err.Error(), "replicas confirmed") {
		t.Fatalf("RaiseFence with the replica paused: %v, want an unconfirmed-write error", err)
	}
}
