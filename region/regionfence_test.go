package region

import (
	"context"
	"testing"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gcra/memstore"
)

// The region fence (Config.Fence; issue 17, defect 5): two agents of eu on
// one store. Once eu-2 applies a decrease and raises the store's fence to
// its table, eu-1 — still on the older table, as if partitioned from NATS —
// is refused by the store and decides at min(its share, safe share), never
// at its table's 90 %; with no fence held at all (a restarted store) every
// fenced decision runs so. Without Config.Fence, eu-1 keeps deciding at 90 %
// on the shared store: that is what the coordinator had to wait a lease
// for before, and why it may now count eu-2's acknowledgement for eu.
func TestNodeRegionFenceRefusesOlderTables(t *testing.T) {
	const t0 = int64(1_700_000_000_000_000)
	ctx := context.Background()
	budget := gcra.PerHour(100, 10)
	for _, fence := range []bool{true, false} {
		ms, err := memstore.New(memstore.Config{Clock: func() int64 { return t0 }, Shards: 1, MaxKeys: 100})
		if err != nil {
			t.Fatal(err)
		}
		set := func(c *Config) { c.Fence = fence }
		eu1, eu2 := fenceNode(t, ms, "eu-1", set), fenceNode(t, ms, "eu-2", set)
		safe := SafeLimit(budget, eu1.safe, len(regions))
		limitOf := func(n *Node) (gcra.Limit, gcra.Fence) { return fenceDecide(t, n, t0) }
		first := naming(table(1, 1, t0, t0-hour, 1, 900_000, acme), "eu-1", "eu-2")
		for _, n := range []*Node{eu1, eu2} {
			if err := n.Apply(first, t0); err != nil {
				t.Fatal(err)
			}
		}
		share90 := first.Keys[0].Limit(0)
		if fence {
			// No fence held yet: refused, decided at the safe share.
			if got, _ := limitOf(eu1); got != safe {
				t.Fatalf("with no fence held: decided at %v, want the safe %v", got, safe)
			}
			if _, _, err := ms.RaiseFence(ctx, gcra.Fence{Term: 1, Epoch: 1}); err != nil {
				t.Fatal(err)
			}
		}
		if got, f := limitOf(eu1); got != share90 || f.IsZero() != !fence {
			t.Fatalf("fence %v, table (1, 1) in force and fenced: decided at %v (fence %v), want the table's %v", fence, got, f, share90)
		}
		// eu-2 applies the decrease and raises the fence; eu-1 never hears
		// of it.
		second := naming(table(1, 2, t0, t0, 2, 100_000, acme), "eu-1", "eu-2")
		if err := eu2.Apply(second, t0); err != nil {
			t.Fatal(err)
		}
		if fence {
			if _, _, err := ms.RaiseFence(ctx, gcra.Fence{Term: 1, Epoch: 2}); err != nil {
				t.Fatal(err)
			}
		}
		before := eu1.Stats().Fenced
		got, _ := limitOf(eu1)
		if !fence {
			if got != share90 {
				t.Fatalf("without the fence eu-1 decided at %v, want its table's %v (the control)", got, share90)
			}
			continue
		}
		if got != safe {
			t.Fatalf("eu-1 behind the fence decided at %v, want min(90 %%, safe) = %v", got, safe)
		}
		if eu1.Stats().Fenced != before+1 {
			t.Fatalf("Stats.Fenced %d, want %d", eu1.Stats().Fenced, before+1)
		}
		if got, f := limitOf(eu2); got != second.Keys[0].Limit(0) || f != (gcra.Fence{Term: 1, Epoch: 2}) {
			t.Fatalf("eu-2 on the fenced table decided at %v (fence %v), want %v", got, f, second.Keys[0].Limit(0))
		}
	}
}

// TestNodeLapsedDecisionsCarryTheFence: an agent whose lease lapsed runs
// every key at min(last share, safe share) — what a region cut off whole
// keeps — but its decisions still carry its table's fence, so once a
// sibling applies a newer table (which may have lowered the region to its
// idle floor, rebalance's idle floors) the store refuses them and the
// agent decides at its idle floor. It fails on the commit before: lapsed
// decisions carried no fence and ran the safe share (explorer schedule
// 1474 of seed 53).
func TestNodeLapsedDecisionsCarryTheFence(t *testing.T) {
	const t0 = int64(1_700_000_000_000_000)
	ctx := context.Background()
	budget := gcra.PerHour(100, 10)
	clock := t0
	ms, err := memstore.New(memstore.Config{Clock: func() int64 { return clock }, Shards: 1, MaxKeys: 100})
	if err != nil {
		t.Fatal(err)
	}
	set := func(c *Config) { c.Fence, c.SafeFraction, c.IdleSafeFraction = true, 0.5, 0.1 }
	eu1, eu2 := fenceNode(t, ms, "eu-1", set), fenceNode(t, ms, "eu-2", set)
	safe := SafeLimit(budget, eu1.safe, len(regions))
	idle := SafeLimit(budget, eu1.idle, len(regions))
	limitOf := func(n *Node, now int64) gcra.Limit {
		l, _ := fenceDecide(t, n, now)
		return l
	}
	first := naming(table(1, 1, t0, t0-hour, 1, 900_000, acme), "eu-1", "eu-2")
	for _, n := range []*Node{eu1, eu2} {
		if err := n.Apply(first, t0); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := ms.RaiseFence(ctx, gcra.Fence{Term: 1, Epoch: 1}); err != nil {
		t.Fatal(err)
	}
	lapse := first.Leases[0] + 1
	clock = lapse
	eu1.Tick(lapse)
	if got := limitOf(eu1, lapse); got != safe {
		t.Fatalf("lapsed, the store's fence at its table: decided at %v, want min(90 %%, safe) = %v", got, safe)
	}
	second := naming(table(1, 2, lapse, lapse, 2, 50_000, acme), "eu-1", "eu-2")
	if err := eu2.Apply(second, lapse); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ms.RaiseFence(ctx, gcra.Fence{Term: 1, Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	if got := limitOf(eu1, lapse); got != idle {
		t.Fatalf("lapsed behind a sibling's newer fence: decided at %v, want the idle floor's %v", got, idle)
	}
}

// fenceNode is an agent of eu on store st, with every decision reaching
// the store and cfg's other fields set by set.
func fenceNode(t *testing.T, st gcra.Store, agent string, set func(*Config)) *Node {
	t.Helper()
	cfg := DefaultConfig("eu", agent, regions...)
	cfg.DenyCache = false // every decision reaches the store
	set(&cfg)
	n, err := NewNode(cfg, mustPolicy(t, testPolicy), st)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// fenceDecide decides one acme request at now on n and returns the limit
// that decided it and the fence it carried.
func fenceDecide(t *testing.T, n *Node, now int64) (gcra.Limit, gcra.Fence) {
	t.Helper()
	var d Decision
	if err := n.Decide(context.Background(), now, req(1, tenant("acme")), &d); err != nil || d.Fallback {
		t.Fatalf("decide: %v (fallback %v)", err, d.Fallback)
	}
	return d.Matches[0].Result.Limit, d.Matches[0].Schedule.Fence
}
