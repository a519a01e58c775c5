package region

import (
	"context"
	"testing"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gcra/memstore"
	"github.com/meridian-quota/meridian/rebalance"
)

// limitAt is the limit the store applies to key name at storeNow (µs on
// the store's clock) under the schedule n passes it now.
func limitAt(t *testing.T, n *Node, name string, storeNow int64) gcra.Limit {
	t.Helper()
	var d Decision
	if err := n.Resolve(req(1, tenant(name)), &d); err != nil || len(d.Matches) != 1 {
		t.Fatalf("resolve %s: %v", name, err)
	}
	s := &d.Matches[0].Schedule
	if s.HasPrevious && storeNow < s.Current.Effective {
		return s.Previous.Limit
	}
	return s.Current.Limit
}

// naming is table with region eu's agents set to agents.
func naming(tb *rebalance.Table, agents ...string) *rebalance.Table {
	tb.Agents = [][]string{agents, {"us-1"}}
	return tb
}

// An agent that no table names runs every key at min(last share, safe
// share), as after a lease lapse — the coordinator waits for no
// acknowledgement of it and may give the rest of the budget away (invariant
// 1) — and runs the table again once a later table names it. Fails on
// 2023668: the node never read Table.Agents and ran eu's 90 % while the
// table named only eu-2.
func TestNodeUnnamedAgentRunsAtMinOfLastAndSafe(t *testing.T) {
	const t0 = int64(1_700_000_000_000_000)
	budget := gcra.PerHour(100, 10)
	n, err := NewNode(DefaultConfig("eu", "eu-1", regions...), mustPolicy(t, testPolicy), &breakable{})
	if err != nil {
		t.Fatal(err)
	}
	safe := SafeLimit(budget, n.safe, len(regions))
	share := func(s uint32) gcra.Limit {
		ks := rebalance.KeyShares{Budget: budget, Shares: []uint32{s, rebalance.PPM - s}}
		return ks.Limit(0)
	}
	steps := []struct {
		name      string
		table     *rebalance.Table // applied at at
		at        int64
		checks    []int64 // store times
		want      []gcra.Limit
		wantNamed bool
	}{
		{"named: the table's 90 %", naming(table(1, 1, t0, t0-hour, 1, 900_000, acme), "eu-1"), t0,
			[]int64{t0}, []gcra.Limit{share(900_000)}, true},
		{"a renewal naming only eu-2: min(90 %, safe)", naming(table(1, 2, t0+1e6, t0+1e6, 1, 900_000, acme), "eu-2"), t0 + 1e6,
			[]int64{t0 + 1e6, t0 + 10e6}, []gcra.Limit{safe, safe}, false},
		{"a new version, still unnamed: never its 80 %", naming(table(1, 3, t0+2e6, t0+3e6, 2, 800_000, acme), "eu-2"), t0 + 2e6,
			[]int64{t0 + 2e6, t0 + 3e6, t0 + 10e6}, []gcra.Limit{safe, safe, safe}, false},
		{"named again: the table's 80 %", naming(table(1, 4, t0+4e6, t0+4e6, 2, 800_000, acme), "eu-1", "eu-2"), t0 + 4e6,
			[]int64{t0 + 4e6, t0 + 10e6}, []gcra.Limit{share(800_000), share(800_000)}, true},
	}
	for _, st := range steps {
		if err := n.Apply(st.table, st.at); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := n.Table().Named; got != st.wantNamed {
			t.Errorf("%s: Table().Named = %v, want %v", st.name, got, st.wantNamed)
		}
		for i, at := range st.checks {
			if got := limitAt(t, n, "acme", at); got != st.want[i] {
				t.Errorf("%s: limit at t0%+dµs = %v, want %v", st.name, at-t0, got, st.want[i])
			}
		}
	}
	// A cold agent whose first table does not name it never runs the
	// table's share, before or after the table takes effect.
	cold, err := NewNode(DefaultConfig("eu", "eu-3", regions...), mustPolicy(t, testPolicy), &breakable{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cold.Apply(naming(table(1, 5, t0, t0+1e6, 3, 900_000, acme), "eu-1"), t0); err != nil {
		t.Fatal(err)
	}
	for _, at := range []int64{t0, t0 + 1e6, t0 + 10e6} {
		if got := limitAt(t, cold, "acme", at); got != safe {
			t.Errorf("cold and unnamed: limit at t0%+dµs = %v, want the safe limit %v", at-t0, got, safe)
		}
	}
}

// Two agents of one region decide on one store while the tables name only
// one of them, then both: the unnamed one runs the key in its version's
// reduced epoch slot while its sibling runs the table's slot, so each reads
// the other's state as newer than its own (kept as stored) or older than
// its previous change (empty at it). Either way the region's admissions
// conform to the largest limit its agents run: replayed through a GCRA
// meter at the table's limit, none is non-conforming.
func TestNodeSiblingsOnOneStoreStayWithinTheLimit(t *testing.T) {
	const pol = `
domains:
  - domain: api
    descriptors:
      - {key: tenant, rate_limit: {unit: second, requests_per_unit: 100, burst: 10}}
`
	const t0 = int64(1_700_000_000_000_000)
	policy := mustPolicy(t, pol)
	budget := policy.Rules()[0].Limit
	key := KeyName("api", []Entry{{"tenant", "acme"}})
	var clock int64
	ms, err := memstore.New(memstore.Config{Clock: func() int64 { return clock }, Shards: 1, MaxKeys: 100})
	if err != nil {
		t.Fatal(err)
	}
	var nodes []*Node
	for _, a := range []string{"eu-1", "eu-2"} {
		n, err := NewNode(DefaultConfig("eu", a, regions...), policy, ms)
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
	}
	tab := func(epoch, version uint64, at int64, share uint32, eu ...string) *rebalance.Table {
		return &rebalance.Table{Term: 1, Epoch: epoch, Issued: at, Effective: at, Regions: regions,
			Leases: []int64{at + 60e6, at + 60e6}, Agents: [][]string{eu, {"us-1"}},
			Keys: []rebalance.KeyShares{{Key: key, Budget: budget, Shares: []uint32{share, rebalance.PPM - share}, Version: version}}}
	}
	// Every table in the run, applied by both nodes at its time.
	tables := []*rebalance.Table{
		tab(1, 1, t0, 600_000, "eu-1", "eu-2"),
		tab(2, 1, t0+2e6, 600_000, "eu-1"),         // eu-2 unnamed: reduced, same version
		tab(3, 2, t0+4e6, 800_000, "eu-1"),         // a new version, eu-2 still unnamed
		tab(4, 2, t0+6e6, 800_000, "eu-1", "eu-2"), // eu-2 restored
		tab(5, 3, t0+8e6, 500_000, "eu-2"),         // a decrease; eu-1 unnamed
	}
	r := &Request{Domain: "api", Descriptors: []Descriptor{{Entries: []Entry{{"tenant", "acme"}}}}, Cost: 1}
	meter := int64(0) // the meter's TAT, at the largest regional limit of the run (80 %)
	ks := rebalance.KeyShares{Budget: budget, Shares: []uint32{800_000, 200_000}}
	most := ks.Limit(0)
	admitted, nonconforming := [2]int{}, 0
	next := 0
	for clock = t0; clock < t0+10e6; clock += 500 { // 2,000 requests/s, both agents in turn
		for next < len(tables) && tables[next].Effective <= clock {
			for _, n := range nodes {
				if err := n.Apply(tables[next], clock); err != nil {
					t.Fatal(err)
				}
			}
			next++
		}
		i := int(clock/500) % 2
		var d Decision
		if err := nodes[i].Decide(context.Background(), clock, r, &d); err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			continue
		}
		admitted[i]++
		tat, res, err := gcra.Allow(most, meter, clock, 1)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Allowed {
			nonconforming++
			continue
		}
		meter = tat
	}
	t.Logf("admitted %v in 10 s", admitted)
	if nonconforming > 0 {
		t.Errorf("%d admissions above the largest regional limit %v", nonconforming, most)
	}
	// The region's largest limit is 60 % for 4 s, 80 % for 4 s, 50 % for
	// 2 s: 660 at the rates, plus at most the largest burst, 8.
	if sum := admitted[0] + admitted[1]; sum > 660+8 {
		t.Errorf("admitted %d in 10 s, above the 668 the region's limits allow", sum)
	}
	if admitted[0] == 0 || admitted[1] == 0 {
		t.Errorf("admitted %v: both agents should admit", admitted)
	}
}
