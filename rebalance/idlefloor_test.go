package rebalance

import (
	"slices"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/gcra"
)

// idleSetup is a coordinator over regions a, b and c (one member agent
// each, all acknowledging its first table) with one key k whose demand is
// all in a, at idle floors of 1 % (3,333 ppm per region) after 2 s. Agents
// report AgentIdleFloors unless old names one that does not (an agent of a
// release that runs keys no table names at its safe share).
func idleSetup(t *testing.T, old string) *Coordinator {
	t.Helper()
	cfg := unitConfig("a", "b", "c")
	cfg.IdleSafeFraction = 0.01
	cfg.FloorWindow = 2 * time.Second
	c := mustCoordinator(t, cfg, budget("k"))
	if err := c.MemberChange([]Member{{"a", "a1"}, {"b", "b1"}, {"c", "c1"}}); err != nil {
		t.Fatal(err)
	}
	if err := c.StartTerm(1, nil, 0); err != nil {
		t.Fatal(err)
	}
	first := take(c)[0]
	for _, r := range []string{"a", "b", "c"} {
		ackFenced(t, c, r, r+"1", first)
	}
	for _, r := range []string{"a", "b", "c"} {
		features := AgentIdleFloors
		if r+"1" == old {
			features = 0
		}
		demand := map[string]int64{}
		if r == "a" {
			demand["k"] = 900
		}
		observeFeatures(t, c, r, r+"1", 0, sec, demand, features)
	}
	return c
}

// ackFenced acknowledges tb for agent in region as an agent on its
// region's one store (identity 1 + the region's index) does: with the
// region fence it raised to tb.
func ackFenced(t *testing.T, c *Coordinator, region, agent string, tb *Table) {
	t.Helper()
	if err := c.AckFenced(region, agent, tb.Term, tb.Epoch, gcra.Fence{Term: tb.Term, Epoch: tb.Epoch}, uint64(1+c.ridx[region])); err != nil {
		t.Fatal(err)
	}
}

// settleFenced is settle with fenced acknowledgements.
func settleFenced(t *testing.T, c *Coordinator, now int64) {
	t.Helper()
	for i := 0; c.transition && i < 3; i++ {
		tb := c.Latest()
		for ri, agents := range tb.Agents {
			for _, a := range agents {
				ackFenced(t, c, tb.Regions[ri], a, tb)
			}
		}
		c.Tick(now)
		take(c)
	}
	if c.transition {
		t.Fatal("settle: the transition did not complete")
	}
}

// observeFeatures is observe with the report's Features.
func observeFeatures(t *testing.T, c *Coordinator, region, agent string, interval, now int64, demand map[string]int64, features uint32) {
	t.Helper()
	r := &Report{Region: region, Agent: agent, Interval: interval, Features: features}
	if tb := c.Latest(); tb != nil {
		r.Term, r.Epoch = tb.Term, tb.Epoch
	}
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range demand {
			if !yield(k) {
				return
			}
		}
	}) {
		r.Keys = append(r.Keys, KeyDemand{Key: k, Demand: Demand{Offered: demand[k], OfferedCost: demand[k]}})
	}
	if err := c.Observe(r, now); err != nil {
		t.Fatalf("Observe %s/%s interval %d: %v", region, agent, interval, err)
	}
}

// TestIdleFloors: regions that show no demand for a key are lowered to
// their idle floors — an acknowledged decrease — and the region with
// demand gets the rest, 993,334 ppm where the safe shares left it
// 933,334; while one agent does not say it runs unnamed keys at its idle
// floor, every region keeps its safe share.
func TestIdleFloors(t *testing.T) {
	t.Run("every agent", func(t *testing.T) {
		c := idleSetup(t, "")
		c.Tick(sec)
		tbs := take(c)
		if len(tbs) != 1 || !c.transition {
			t.Fatalf("want the decrease alone first, got %d tables (transition %v)", len(tbs), c.transition)
		}
		if got, want := sharesOf(tbs[0], "k"), []uint32{33333, 3333, 3333}; !slices.Equal(got, want) {
			t.Fatalf("decrease %v, want %v: b and c down to their idle floors, a waiting", got, want)
		}
		settleFenced(t, c, sec)
		if got, want := sharesOf(c.Latest(), "k"), []uint32{993334, 3333, 3333}; !slices.Equal(got, want) {
			t.Errorf("after the increase %v, want %v", got, want)
		}
	})
	t.Run("a region without a fence", func(t *testing.T) {
		c := idleSetup(t, "")
		// c1 decides on a store that keeps no region fence (a Redis
		// Cluster): an agent of c that missed a decrease would keep its
		// safe share, so c keeps it.
		first := c.Latest()
		if err := c.Ack("c", "c1", first.Term, first.Epoch); err != nil {
			t.Fatal(err)
		}
		c.Tick(sec)
		take(c)
		settleFenced(t, c, sec)
		if err := c.Ack("c", "c1", c.Latest().Term, c.Latest().Epoch); err != nil {
			t.Fatal(err)
		}
		if got, want := sharesOf(c.Latest(), "k"), []uint32{963334, 3333, 33333}; !slices.Equal(got, want) {
			t.Errorf("shares %v, want %v: c at its safe share", got, want)
		}
	})
	t.Run("an older agent", func(t *testing.T) {
		c := idleSetup(t, "c1")
		c.Tick(sec)
		take(c)
		settleFenced(t, c, sec)
		if got, want := sharesOf(c.Latest(), "k"), []uint32{933334, 33333, 33333}; !slices.Equal(got, want) {
			t.Errorf("shares %v, want %v: every region at its safe share at least", got, want)
		}
	})
}

// TestLoweredFloorKeptWhenUnacknowledged: b never acknowledges the
// decrease that took it to its idle floor, so once its lease passes it may
// run min(its last share, safe share) = 33,333 ppm, not 3,333. The increase
// then gives the key's rise up and b keeps 33,333. It fails without
// keepLowered (explorer schedule 210 of seed 10 at the shipped settings: a
// lost table left an agent on its safe share while the increase gave the
// rest away, Σ in force 1,029,943 ppm).
func TestLoweredFloorKeptWhenUnacknowledged(t *testing.T) {
	c := idleSetup(t, "")
	prev := c.Latest()
	c.Tick(sec)
	dec := take(c)[0]
	for _, r := range []string{"a", "c"} {
		ackFenced(t, c, r, r+"1", dec)
	}
	skew := int64(c.cfg.MaxSkew / time.Microsecond)
	for now := sec + 10_000; now < prev.Leases[1]+skew; now += 100_000 {
		c.Tick(now)
		for _, tb := range take(c) {
			if s := sharesOf(tb, "k"); s[0] > 33333 {
				t.Fatalf("t=%d: a raised to %v while b has not acknowledged its decrease", now, s)
			}
		}
	}
	c.Tick(prev.Leases[1] + skew)
	tbs := take(c)
	if len(tbs) == 0 || c.transition {
		t.Fatalf("the transition did not end at b's lease + skew (%d tables)", len(tbs))
	}
	got := sharesOf(tbs[len(tbs)-1], "k")
	if want := []uint32{33333, 33333, 3333}; !slices.Equal(got, want) {
		t.Errorf("after b's lease: %v, want %v (a's rise given up, b back to what it may run)", got, want)
	}
}

// TestSilentRegionHoldingTheBudget: a region holding almost the whole of a
// key falls silent while the others, at their idle floors, show demand
// again, so their floors rise to the safe share. The silent region keeps
// its share until its lease, so they keep what they hold meanwhile: the
// shares stay within the budget (without holdSilent's overflow branch they
// summed to 993,334 + 2 × 33,333 ppm).
func TestSilentRegionHoldingTheBudget(t *testing.T) {
	c := mustCoordinator(t, unitConfig("a", "b", "c"), budget("k"))
	cur := []uint32{993334, 3333, 3333}
	floor := []uint32{33333, 33333, 33333}
	d := []uint32{333334, 333333, 333333} // what the strategy asked for
	c.holdSilent(d, cur, floor, []bool{false, true, true}, []bool{false, false, false})
	if sum := int64(d[0]) + int64(d[1]) + int64(d[2]); sum > PPM || d[0] != cur[0] {
		t.Errorf("held a, live b and c: %v (Σ %d), want a kept at %d and Σ ≤ %d", d, sum, cur[0], PPM)
	}
	// Expired, a runs at most its safe share: the rest is the others'.
	d = []uint32{333334, 333333, 333333}
	floor = []uint32{33333, 33333, 33333}
	c.holdSilent(d, cur, floor, []bool{false, true, true}, []bool{true, false, false})
	if want := []uint32{33333, 483334, 483333}; !slices.Equal(d, want) {
		t.Errorf("expired a: %v, want %v", d, want)
	}
}

// TestBlindTermLeavesNewKeysOut: a term that starts with no stored table
// cannot know what earlier terms left each region; one may have lowered a
// region to its idle floor and given the rest away. So while it learns
// its tables leave out the keys new to it (they run as keys no table
// names: reduced, then at the idle floor), and only after its wait give
// them rows, at least the safe shares it counted them at. It fails
// without omitCold (explorer schedule 1067 of seed 50; 996, 1195 and
// 1697 of seed 52).
func TestBlindTermLeavesNewKeysOut(t *testing.T) {
	cfg := unitConfig("a", "b", "c")
	cfg.IdleSafeFraction = 0.01
	c := mustCoordinator(t, cfg, budget("k"))
	if err := c.StartTerm(2, nil, 0); err != nil {
		t.Fatal(err)
	}
	first := take(c)[0]
	if got := sharesOf(first, "k"); got != nil {
		t.Errorf("blind term's first table gives k %v, want no row", got)
	}
	c.Tick(c.learnUntil)
	tbs := take(c)
	if len(tbs) == 0 {
		t.Fatal("no table once the wait ended")
	}
	if got := sharesOf(tbs[len(tbs)-1], "k"); len(got) != 3 || got[0] < 33333 || got[1] < 33333 || got[2] < 33333 {
		t.Errorf("after the wait %v, want a row of at least the safe shares", got)
	}
}
