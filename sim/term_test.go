package sim

import (
	"slices"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/gossip/protocol"
)

// TestTermLearnsKeysFromReports holds the run's coordinator to production's
// key life cycle (protocol.Term, as gossip.Loop runs it): no key is budgeted
// before a report names it, a key stays budgeted while reports name it, and
// it leaves the table once none has named it for KeyIdle. Keys here go on
// and off for spells longer than KeyIdle, so at the end of the run some
// were offered recently and others not for minutes.
func TestTermLearnsKeysFromReports(t *testing.T) {
	sc := mustScenario(t, `
name: key-life
duration: 240s
warmup: 10s
regions: [{name: eu}, {name: us}, {name: ap}]
latency: {mean: 20ms, jitter: 5ms}
keys: {count: 30, zipf: 0.5, ratio: 2, burst_seconds: 1, home_fraction: 0.6}
workload: {rate: 600, on_off: {alpha: 1.5, mean_on: 20s, mean_off: 90s}}
`)
	r, err := NewRun(sc, "ewma", time.Second, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.stored == nil || r.stored.Term != 1 || len(r.stored.Keys) != 0 {
		t.Fatalf("the first term's first table: %+v, want term 1 with no keys (none reported yet)", r.stored)
	}
	last := make([]int64, len(r.keys))
	for i := range last {
		last[i] = -1
	}
	r.OnArrival(func(a Arrival) { last[a.Key] = max(last[a.Key], a.T) })
	res, err := r.Simulate()
	if err != nil {
		t.Fatal(err)
	}
	in := map[string]bool{}
	for _, ks := range r.stored.Keys {
		in[ks.Key] = true
	}
	// A key offered at T is reported by the close of its interval (Δ)
	// plus a coordinator tick and a link's latency, and enters the next
	// table; margin covers that, the rebalance that drops an idle key,
	// and the end of the run (demand in its last seconds may not have
	// reached a table yet).
	const margin = 3_000_000
	idle := protocol.DefaultKeyIdle.Microseconds()
	var recent, gone int
	for i, k := range r.keys {
		switch {
		case last[i] >= 0 && last[i] < r.end-idle-margin:
			gone++
			if in[k.name] {
				t.Errorf("%s: last offered at %.1fs, still in the last table at %.0fs (KeyIdle %v)", k.name, float64(last[i])/1e6, float64(r.end)/1e6, protocol.DefaultKeyIdle)
			}
		case last[i] >= r.end-idle+margin && last[i] < r.end-margin:
			recent++
			if !in[k.name] {
				t.Errorf("%s: offered at %.1fs, missing from the last table", k.name, float64(last[i])/1e6)
			}
		}
	}
	t.Logf("%d keys offered recently (in the table), %d idle for longer than KeyIdle (not), %d in the last table", recent, gone, len(in))
	if recent == 0 || gone == 0 {
		t.Fatalf("%d keys offered recently, %d idle for longer than KeyIdle: want some of each", recent, gone)
	}
	if res.Overflow != 0 || res.QueueDropped != 0 {
		t.Errorf("overflow %d, queue dropped %d: want 0 under the defaults", res.Overflow, res.QueueDropped)
	}
}

// TestFailoverStartsFromTheStoredTable: a coordinator that comes back
// starts the next term from the table it last stored, as gossip.Loop does
// from the KV bucket's head: its first table keeps every key the stored
// one budgets, before any report of the new term has named them.
func TestFailoverStartsFromTheStoredTable(t *testing.T) {
	sc := mustScenario(t, `
name: failover
duration: 40s
warmup: 5s
regions: [{name: eu}, {name: us}, {name: ap}]
latency: {mean: 20ms}
keys: {count: 20, zipf: 1, ratio: 2, burst_seconds: 1, home_fraction: 0.7}
workload: {rate: 2000}
coordinator: {region: eu, failovers: [{at: 20s, for: 3s}]}
`)
	r, err := NewRun(sc, "ewma", time.Second, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	var before, first []string
	r.onArrival = func(Arrival) {
		switch {
		case r.now < 20e6:
			before = before[:0]
			for _, ks := range r.stored.Keys {
				before = append(before, ks.Key)
			}
		case first == nil && r.stored.Term == 2:
			first = []string{}
			for _, ks := range r.stored.Keys {
				first = append(first, ks.Key)
			}
		}
	}
	if _, err := r.Simulate(); err != nil {
		t.Fatal(err)
	}
	if r.stored.Term != 2 {
		t.Fatalf("the last stored table has term %d, want 2 after one failover", r.stored.Term)
	}
	if len(before) == 0 || !slices.Equal(first, before) {
		t.Errorf("term 2's first table names %d keys %v, want the %d the stored table had %v", len(first), first, len(before), before)
	}
}
