package sim

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/rebalance"
)

// exploreN is how many schedules a test runs: fewer under the race
// detector.
func exploreN(n, race int) int {
	if raceEnabled() {
		return race
	}
	return n
}

// TestExploreSeed1 is must-hold 2 of issue 16: `meridian sim --explore 300
// --seed 1` finds no violation (100 schedules under the race detector).
// Its known-failure list was 31 schedules of one defect — a region back
// from a loss longer than its lease ran its old table's shares until each
// of its agents ticked (region.Node lapsed a lease only in Tick) while the
// coordinator had given that share to the others, Σ in force 1,042,627
// ppm — and is empty since a decision lapses a passed lease too
// (region.TestDecisionLapsesAPassedLease). A new violation here is a
// finding: shrink it (the failure's YAML replays with --check) and fix it,
// or list it here with the seed that finds it.
func TestExploreSeed1(t *testing.T) {
	rep, err := Explore(ExploreOptions{N: exploreN(300, 100), Seed: 1, Workers: 2, MaxShrinkRuns: exploreN(200, 20)})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range rep.Failures {
		t.Errorf("schedule %d: %v, shrunk to %d events:\n%s", f.Schedule, f.Shrunk.Error(), f.Events, f.YAML)
	}
	if rep.Liveness == 0 {
		t.Errorf("no schedule ran the liveness check")
	}
	t.Logf("%d schedules, %d over-admitting, %d with the liveness check, %d checks, %d failures",
		rep.Schedules, rep.OverAdmitting, rep.Liveness, rep.Checks, len(rep.Failures))
}

// TestExploreDeterministic: the same seed gives the same report, whatever
// the number of workers.
func TestExploreDeterministic(t *testing.T) {
	n := exploreN(12, 4)
	a, err := Explore(ExploreOptions{N: n, Seed: 7, Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Explore(ExploreOptions{N: n, Seed: 7, Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Errorf("seed 7 with 1 and 3 workers: reports differ:\n%+v\n%+v", a, b)
	}
	for i := range 3 {
		if p, q := draw(ExploreBase(), 7, i, nil), draw(ExploreBase(), 7, i, nil); !reflect.DeepEqual(p, q) {
			t.Errorf("schedule %d drawn twice: %+v, then %+v", i, p, q)
		}
	}
}

// forgeLeases is the planted bug: an agent trusts a lease an hour longer
// than the coordinator granted (every table in flight gets its leases
// extended), so a partitioned region never lapses to its safe share while
// the coordinator hands the share it lost to the others.
func forgeLeases(r *Run, e *event) {
	if e.kind != evCoordTick && e.kind != evFailoverUp {
		return
	}
	for i, m := range r.msgs {
		t, ok := m.(*rebalance.Table)
		if !ok || slices.ContainsFunc(t.Leases, func(l int64) bool { return l > t.Issued+int64(30*time.Minute/time.Microsecond) }) {
			continue // not a table, or forged already
		}
		c := *t
		c.Leases = slices.Clone(t.Leases)
		for j := range c.Leases {
			c.Leases[j] += int64(time.Hour / time.Microsecond)
		}
		r.msgs[i] = &c
	}
}

// TestExploreFindsPlantedBug plants forgeLeases and checks the explorer
// finds it and shrinks it to a few events whose scenario file replays the
// same violation with the bug, and none without it (issue 16, must-hold 3).
func TestExploreFindsPlantedBug(t *testing.T) {
	rep, err := Explore(ExploreOptions{N: exploreN(20, 3), Seed: 1, Workers: 2, bug: forgeLeases, MaxShrinkRuns: exploreN(0, 30)})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Failures) == 0 {
		t.Fatalf("%d schedules with the planted bug: no violation found", rep.Schedules)
	}
	for _, f := range rep.Failures {
		if f.Events > 3 {
			t.Errorf("schedule %d shrank from %d to %d events, want at most 3:\n%s", f.Schedule, f.OriginalEvents, f.Events, f.YAML)
		}
		if f.Shrunk.Check != f.Violation.Check {
			t.Errorf("schedule %d: shrunk to %s, found %s", f.Schedule, f.Shrunk.Check, f.Violation.Check)
		}
	}
	f := rep.Failures[0]
	t.Logf("%d of %d schedules fail; schedule %d, shrunk in %d runs:\n%s", len(rep.Failures), rep.Schedules, f.Schedule, f.ShrinkRuns, f.YAML)
	sc, err := ParseScenario([]byte(f.YAML))
	if err != nil {
		t.Fatalf("the shrunk YAML does not parse: %v\n%s", err, f.YAML)
	}
	v, _, err := checkRun(sc, sc.Strategies[0], sc.Intervals[0].D(), sc.Seeds[0], forgeLeases)
	if err != nil {
		t.Fatal(err)
	}
	if v == nil || *v != f.Shrunk {
		t.Errorf("replay with the bug: %+v, want %+v", v, f.Shrunk)
	}
	vs, err := CheckScenario(sc)
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) != 0 {
		t.Errorf("replay without the bug: %+v, want no violation", vs)
	}
}

// loseTablesToAP is a planted liveness bug: from 30 s on, every table in
// flight to ap is replaced by a stale copy its agents' Followers refuse,
// as if the coordinator stopped publishing to it.
func loseTablesToAP(r *Run, e *event) {
	if r.now < 30_000_000 {
		return
	}
	for i, m := range r.msgs {
		if t, ok := m.(*rebalance.Table); ok && t.Term > 0 && r.regions[r.events.slotRegion(i)].name == "ap" {
			c := *t
			c.Term, c.Epoch = 0, 0
			r.msgs[i] = &c
		}
	}
}

// slotRegion is the region a table in msgs slot i goes to (-1: none).
func (h eventHeap) slotRegion(i int) int {
	for _, it := range h {
		if uint8(it.sk) == evTable && it.c == int64(i) {
			return int(it.a)
		}
	}
	return -1
}

// TestExploreFindsPlantedLivenessBug: the liveness check catches a region
// that stops receiving tables.
func TestExploreFindsPlantedLivenessBug(t *testing.T) {
	rep, err := Explore(ExploreOptions{N: exploreN(30, 8), Seed: 1, Workers: 2, Kinds: []string{"redis-outage", "move"}, bug: loseTablesToAP, MaxShrinkRuns: exploreN(0, 10)})
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, f := range rep.Failures {
		found = found || f.Shrunk.Check == CheckLiveness
		if f.Shrunk.Check == CheckLiveness && !strings.HasPrefix(f.Shrunk.Detail, "ap-") {
			t.Errorf("schedule %d: %v, want an agent of ap", f.Schedule, f.Shrunk.Error())
		}
	}
	if !found {
		t.Fatalf("%d schedules (%d with the liveness check): no %s violation in %+v", rep.Schedules, rep.Liveness, CheckLiveness, rep.Failures)
	}
	t.Logf("%d failures; the first:\n%s", len(rep.Failures), rep.Failures[0].YAML)
}
