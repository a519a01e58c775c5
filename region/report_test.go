package region_test

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/meridian-quota/meridian/gcra/memstore"
	"github.com/meridian-quota/meridian/rebalance"
	"github.com/meridian-quota/meridian/region"
)

const reportPolicy = `
domains:
  - domain: api
    descriptors:
      - key: tenant
        rate_limit: {unit: second, requests_per_unit: 100000, burst: 100000}
`

// reportRig is one agent of region eu (of eu, us) reporting to a real
// coordinator: the node applies the coordinator's tables, so it reports
// deltas exactly when a production agent would.
type reportRig struct {
	t      testing.TB
	now    int64
	node   *region.Node
	coord  *rebalance.Coordinator
	policy *region.Policy
	keys   []string
	dt     int64
	deaf   bool // the node applies no table (cut off from the bus)
}

func newReportRig(t testing.TB, nkeys int, cfg func(*region.Config)) *reportRig {
	t.Helper()
	policy, err := region.ParsePolicy([]byte(reportPolicy))
	if err != nil {
		t.Fatal(err)
	}
	r := &reportRig{t: t, now: 1_700_000_000_000_000, policy: policy, dt: 1_000_000}
	store, _ := memstore.New(memstore.Config{Clock: func() int64 { return r.now }, Shards: 1, MaxKeys: 10 * nkeys})
	nc := region.DefaultConfig("eu", "eu-1", "eu", "us")
	nc.Interval = time.Second
	if cfg != nil {
		cfg(&nc)
	}
	if r.node, err = region.NewNode(nc, policy, store); err != nil {
		t.Fatal(err)
	}
	cc := rebalance.DefaultConfig("eu", "us")
	cc.Interval = time.Second
	var budgets []rebalance.Budget
	for i := range nkeys {
		k := region.KeyName("api", []region.Entry{{Key: "tenant", Value: fmt.Sprintf("t%03d", i)}})
		r.keys = append(r.keys, k)
		budgets = append(budgets, rebalance.Budget{Key: k, Limit: policy.Rules()[0].Limit})
	}
	if r.coord, err = rebalance.NewCoordinator(cc, budgets); err != nil {
		t.Fatal(err)
	}
	if err := r.coord.StartTerm(1, nil, r.now); err != nil {
		t.Fatal(err)
	}
	r.node.Tick(r.now)
	return r
}

// interval offers cost[i] to key i (0: none) and closes the interval: it
// returns the node's report, after the coordinator observed it (unless
// drop) and the node applied the coordinator's newest table.
func (r *reportRig) interval(cost []int64, drop bool) *rebalance.Report {
	var d region.Decision
	for i, c := range cost {
		if c == 0 {
			continue
		}
		req := &region.Request{Domain: "api", Cost: c, Descriptors: []region.Descriptor{{Entries: []region.Entry{{Key: "tenant", Value: fmt.Sprintf("t%03d", i)}}}}}
		if err := r.node.Decide(context.Background(), r.now, req, &d); err != nil {
			r.t.Fatal(err)
		}
	}
	r.now += r.dt
	rep := r.node.Tick(r.now)
	if rep == nil {
		r.t.Fatal("no report at the interval's end")
	}
	if !drop {
		if err := r.coord.Observe(rep, r.now); err != nil {
			r.t.Fatalf("observe: %v", err)
		}
	}
	r.coord.Tick(r.now)
	for _, tb := range r.coord.Ready() {
		if !r.deaf {
			_ = r.node.Apply(tb, r.now)
		}
	}
	r.coord.Advance()
	return rep
}

func listed(rep *rebalance.Report) map[string]int64 {
	m := map[string]int64{}
	for _, k := range rep.Keys {
		m[k.Key] = k.OfferedCost
	}
	return m
}

// TestDeltaReports walks one agent through the cases of Config.ReportChange
// against a real coordinator's tables.
func TestDeltaReports(t *testing.T) {
	r := newReportRig(t, 3, nil)
	base := []int64{1000, 2000, 3000}
	// Until a table advertises delta reports, every report is full and
	// lists every key at its demand.
	rep := r.interval(base, false)
	if rep.Delta || len(rep.Keys) != 3 {
		t.Fatalf("before any table: delta %t, %d keys; want a full report of 3", rep.Delta, len(rep.Keys))
	}
	for r.node.Table().Term == 0 {
		r.interval(base, false)
	}
	// The first report under the table is full.
	rep = r.interval(base, false)
	if rep.Delta || len(rep.Keys) != 3 {
		t.Fatalf("first report under the table: delta %t, %d keys; want a full report of 3", rep.Delta, len(rep.Keys))
	}
	// ±10 % lists nothing.
	rep = r.interval([]int64{1100, 1800, 3300}, false)
	if !rep.Delta || len(rep.Keys) != 0 {
		t.Fatalf("within noise: delta %t, keys %v; want an empty delta", rep.Delta, listed(rep))
	}
	// A key that moves by half is listed, and once more after; one that
	// stops is listed at zero.
	rep = r.interval([]int64{1500, 0, 3000}, false)
	if got, want := listed(rep), map[string]int64{r.keys[0]: 1500, r.keys[1]: 0}; !rep.Delta || !mapsEqual(got, want) {
		t.Fatalf("after a change: delta %t, keys %v; want %v", rep.Delta, got, want)
	}
	rep = r.interval([]int64{1550, 0, 3000}, false)
	if got, want := listed(rep), map[string]int64{r.keys[0]: 1500, r.keys[1]: 0}; !rep.Delta || !mapsEqual(got, want) {
		t.Fatalf("the report after a change lists it again, as listed: delta %t, keys %v; want %v", rep.Delta, got, want)
	}
	rep = r.interval([]int64{1450, 0, 3000}, false)
	if !rep.Delta || len(rep.Keys) != 0 {
		t.Fatalf("settled: delta %t, keys %v; want an empty delta", rep.Delta, listed(rep))
	}
	// Within ReportRefresh (120 intervals of 1 s) every key with demand
	// is listed once more at its listed cost, each at its own offset,
	// in delta reports.
	refreshed := map[string]int{}
	for range 120 {
		rep = r.interval([]int64{1480, 0, 2900}, false)
		if !rep.Delta {
			t.Fatalf("interval %d: a full report with nothing asking for one", rep.Interval)
		}
		for k, v := range listed(rep) {
			if want := map[string]int64{r.keys[0]: 1500, r.keys[2]: 3000}[k]; v != want {
				t.Fatalf("refresh lists %q at %d; want its listed cost %d", k, v, want)
			}
			refreshed[k]++
		}
	}
	if want := map[string]int{r.keys[0]: 1, r.keys[2]: 1}; !maps.Equal(refreshed, want) {
		t.Fatalf("listed in 120 intervals: %v; want each key with demand once", refreshed)
	}
	// A denied key gets no tighter threshold (see changed): a cost above
	// the region's whole burst is denied, and 8 % more is not listed.
	for range 3 {
		r.interval([]int64{300_000, 0, 0}, false)
	}
	rep = r.interval([]int64{324_000, 0, 0}, false)
	if !rep.Delta || len(rep.Keys) != 0 {
		t.Fatalf("denied key 8 %% up: delta %t, keys %+v; want an empty delta", rep.Delta, rep.Keys)
	}
	// A lost report: the coordinator sees the gap in the next one, its
	// next table asks this agent to resync, and the report after is full.
	r.interval([]int64{100, 0, 0}, true)
	if rep = r.interval([]int64{100, 0, 0}, false); !rep.Delta {
		t.Fatal("the periodic full report fell here (the rig's phase is fixed): move the case")
	}
	if l := r.coord.Latest(); len(l.Resync) != 2 || !slices.Equal(l.Resync[0], []string{"eu-1"}) {
		t.Fatalf("after a gap: the table's resync lists %q; want eu-1 in eu", l.Resync)
	}
	if rep = r.interval([]int64{100, 0, 0}, false); rep.Delta || len(rep.Keys) != 1 {
		t.Fatalf("asked to resync: delta %t, %d keys; want a full report of 1", rep.Delta, len(rep.Keys))
	}
	if l := r.coord.Latest(); l.Resync != nil {
		t.Fatalf("after the full report: the table's resync lists %q; want none", l.Resync)
	}
	// Cut off for longer than the lease (30 s): once it lapses, every
	// report is full (they are lost here), and so is the first after.
	r.deaf = true
	fulls := 0
	for range 40 {
		if rep = r.interval([]int64{100, 0, 0}, true); !rep.Delta {
			fulls++
		}
	}
	if !r.node.Table().Lapsed || fulls < 9 {
		t.Fatalf("cut off 40 s: lapsed %t, %d full reports; want lapsed, and the last 10 full", r.node.Table().Lapsed, fulls)
	}
	r.deaf = false
	rep = r.interval([]int64{100, 0, 0}, false)
	if rep.Delta || len(rep.Keys) != 1 {
		t.Fatalf("first report after the cut: delta %t, %d keys; want a full report of 1", rep.Delta, len(rep.Keys))
	}
}

func mapsEqual(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestDeltaReportsConform drives random demand, with reports lost at
// random, through a node and the real coordinator, and checks two things
// every interval. (1) The coordinator fed the delta reports holds the
// demand they describe (the spec: a listed key takes its cost, zero drops
// it, the rest keep theirs; a full report replaces all), and issues exactly
// the tables of one fed, each interval, the full report of that demand —
// so Observe's merge is that spec. (2) What
// the coordinator holds for each key is within ReportChange of its demand
// in the interval, unless a report since the key last changed was lost,
// and a full report puts every key back within it.
func TestDeltaReportsConform(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		const nkeys = 6
		r := newReportRig(t, nkeys, nil)
		var budgets []rebalance.Budget
		for _, k := range r.keys {
			budgets = append(budgets, rebalance.Budget{Key: k, Limit: r.policy.Rules()[0].Limit})
		}
		spec, err := rebalance.NewCoordinator(func() rebalance.Config {
			c := rebalance.DefaultConfig("eu", "us")
			c.Interval = time.Second
			return c
		}(), budgets)
		if err != nil {
			rt.Fatal(err)
		}
		if err := spec.StartTerm(1, nil, r.now); err != nil {
			rt.Fatal(err)
		}
		held := map[string]int64{} // the spec's view: the agent's demand as the coordinator should hold it
		stale := map[string]bool{} // a report that changed the key was lost since
		level := make([]int64, nkeys)
		for i := range level {
			level[i] = rapid.Int64Range(0, 3000).Draw(rt, "level")
		}
		steps := rapid.IntRange(5, 80).Draw(rt, "steps")
		for range steps {
			cost := make([]int64, nkeys)
			for i := range cost {
				switch rapid.IntRange(0, 9).Draw(rt, "move") {
				case 0:
					level[i] = rapid.Int64Range(0, 3000).Draw(rt, "level")
				case 1:
					level[i] = 0
				}
				if level[i] > 0 {
					noise := level[i] / 10
					cost[i] = max(1, level[i]+rapid.Int64Range(-noise, noise).Draw(rt, "noise"))
				}
			}
			drop := rapid.IntRange(0, 9).Draw(rt, "drop") == 0
			rep := r.interval(cost, drop)
			switch {
			case drop && !rep.Delta:
				for _, k := range r.keys {
					stale[k] = true
				}
			case drop:
				for _, k := range rep.Keys {
					stale[k.Key] = true
				}
			default:
				if !rep.Delta {
					clear(held)
					clear(stale)
				}
				for _, k := range rep.Keys {
					delete(stale, k.Key)
					if k.OfferedCost == 0 {
						delete(held, k.Key)
					} else {
						held[k.Key] = k.OfferedCost
					}
					if k.Denied > 0 {
						rt.Fatalf("key %q denied %d: the budget should hold every cost drawn", k.Key, k.Denied)
					}
				}
			}
			if !drop {
				full := &rebalance.Report{Region: rep.Region, Agent: rep.Agent, Interval: rep.Interval, Term: rep.Term, Epoch: rep.Epoch, PolicyVersion: rep.PolicyVersion}
				for _, k := range r.keys {
					if v, ok := held[k]; ok {
						full.Keys = append(full.Keys, rebalance.KeyDemand{Key: k, Demand: rebalance.Demand{Offered: 1, OfferedCost: v, Admitted: v}})
					}
				}
				if err := spec.Observe(full, r.now); err != nil {
					rt.Fatalf("spec observe: %v", err)
				}
			}
			if got := r.coord.AgentDemand("eu", "eu-1"); !mapsEqual(got, held) && !(len(got) == 0 && len(held) == 0) {
				rt.Fatalf("interval %d: the coordinator holds %v for the agent, the reports describe %v", rep.Interval, got, held)
			}
			spec.Tick(r.now)
			got, want := r.coord.Latest(), spec.Latest()
			if (got == nil) != (want == nil) || got != nil && !slices.EqualFunc(got.Keys, want.Keys, func(a, b rebalance.KeyShares) bool {
				return a.Key == b.Key && slices.Equal(a.Shares, b.Shares) && slices.Equal(a.Bursts, b.Bursts)
			}) {
				rt.Fatalf("interval %d: the coordinator fed deltas holds another table than one fed the full reports they describe:\n%+v\n%+v", rep.Interval, got, want)
			}
			spec.Advance()
			if !rep.Delta && rep.Term == 0 {
				continue // no table yet: full reports of the demand itself
			}
			for i, k := range r.keys {
				if stale[k] {
					continue
				}
				h, c := float64(held[k]), float64(cost[i])
				if math.Abs(h-c) > 0.2*max(h, c)+1e-9 {
					rt.Fatalf("interval %d: key %d offered %v, the coordinator holds %v: more than ReportChange apart", rep.Interval, i, c, h)
				}
			}
		}
	})
}

// TestNoDeltaReportsToAnOldCoordinator: a coordinator of the previous
// release reads every report as full, so an agent must not send it a
// delta — its tables advertise nothing (no Features), and the agent's
// reports stay full, every key at its demand in the interval, noise and
// all.
func TestNoDeltaReportsToAnOldCoordinator(t *testing.T) {
	r := newReportRig(t, 2, nil)
	for r.node.Table().Term == 0 {
		r.interval([]int64{1000, 2000}, false)
	}
	tb := *r.coord.Latest()
	tb.Epoch, tb.Features = tb.Epoch+100, 0 // the old coordinator's next table
	if err := r.node.Apply(&tb, r.now); err != nil {
		t.Fatal(err)
	}
	for i, c := range [][]int64{{1000, 2000}, {1050, 1900}, {990, 2010}} {
		r.now += r.dt
		var d region.Decision
		for k, cost := range c {
			req := &region.Request{Domain: "api", Cost: cost, Descriptors: []region.Descriptor{{Entries: []region.Entry{{Key: "tenant", Value: fmt.Sprintf("t%03d", k)}}}}}
			if err := r.node.Decide(context.Background(), r.now-1, req, &d); err != nil {
				t.Fatal(err)
			}
		}
		rep := r.node.Tick(r.now)
		if got, want := listed(rep), map[string]int64{r.keys[0]: c[0], r.keys[1]: c[1]}; rep.Delta || !mapsEqual(got, want) {
			t.Fatalf("report %d under a table without features: delta %t, keys %v; want full, %v", i, rep.Delta, got, want)
		}
	}
}

// TestCostDemandReports: a coordinator that reads only a key's offered
// cost (rebalance.FeatureCostDemand) gets that alone — no request count,
// admitted or denied on the bus — and one of the release before, whose
// tables lack the bit, gets the whole demand as before.
func TestCostDemandReports(t *testing.T) {
	r := newReportRig(t, 1, nil)
	for r.node.Table().Term == 0 {
		r.interval([]int64{1000}, false)
	}
	if f := r.coord.Latest().Features; f&rebalance.FeatureCostDemand == 0 {
		t.Fatalf("the coordinator's table advertises %#x, without FeatureCostDemand", f)
	}
	decide := func() *rebalance.Report {
		t.Helper()
		r.now += r.dt
		var d region.Decision
		for range 3 {
			req := &region.Request{Domain: "api", Cost: 4000, Descriptors: []region.Descriptor{{Entries: []region.Entry{{Key: "tenant", Value: "t000"}}}}}
			if err := r.node.Decide(context.Background(), r.now-1, req, &d); err != nil {
				t.Fatal(err)
			}
		}
		return r.node.Tick(r.now)
	}
	// A full report (the first under a table with a new epoch lists every key).
	rep := decide()
	if len(rep.Keys) != 1 {
		t.Fatalf("report lists %d keys, want 1", len(rep.Keys))
	}
	if got := rep.Keys[0].Demand; got.OfferedCost != 12000 || got.Offered != 0 || got.Admitted != 0 || got.Denied != 0 {
		t.Fatalf("to a coordinator reading offered cost alone: %+v; want offered cost 12000 and nothing else", got)
	}
	tb := *r.coord.Latest()
	tb.Epoch, tb.Features = tb.Epoch+100, rebalance.FeatureDeltaReports // the release before's next table
	if err := r.node.Apply(&tb, r.now); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		rep = decide()
		if len(rep.Keys) == 1 {
			break
		}
	}
	if len(rep.Keys) != 1 {
		t.Fatalf("report lists %d keys, want 1", len(rep.Keys))
	}
	if got := rep.Keys[0].Demand; got.OfferedCost != 12000 || got.Offered != 3 || got.Admitted+got.Denied != 12000 {
		t.Fatalf("to a coordinator of the release before: %+v; want 3 requests, 12000 offered, admitted and denied summing to it", got)
	}
}
