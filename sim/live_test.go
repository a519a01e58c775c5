package sim

import (
	"testing"
	"time"
)

// TestOnArrival: the hook sees every request the workload offers, in time
// order, dropped ones included; Request, KeyNames, Budgets and Policy agree.
func TestOnArrival(t *testing.T) {
	sc := mustScenario(t, `
name: arrivals
duration: 20s
warmup: 2s
seeds: [1]
regions: [{name: eu}, {name: us}]
keys: {count: 5, zipf: 1, ratio: 2, burst_seconds: 1, home_fraction: 0.5}
workload: {rate: 300}
faults: {region_loss: [{region: us, at: 5s, for: 3s}]}
strategies: [ewma]
intervals: [1s]
`)
	run, err := NewRun(sc, "ewma", time.Second, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []Arrival
	run.OnArrival(func(a Arrival) { got = append(got, a) })
	res, err := run.Simulate()
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(got)) != res.Requests+res.Dropped || res.Dropped == 0 {
		t.Fatalf("%d arrivals, want requests %d + dropped %d (> 0)", len(got), res.Requests, res.Dropped)
	}
	for i := 1; i < len(got); i++ {
		if got[i].T < got[i-1].T {
			t.Fatalf("arrival %d at %d before %d", i, got[i].T, got[i-1].T)
		}
	}
	names, budgets := run.KeyNames(), run.Budgets()
	for i, name := range names {
		q := run.Request(i)
		rule, err := run.Policy().RuleForKey(name)
		if err != nil || rule == nil {
			t.Fatalf("key %q: no rule (%v)", name, err)
		}
		if rule.Limit != budgets[i] {
			t.Errorf("key %q: rule limit %v, budget %v", name, rule.Limit, budgets[i])
		}
		if m := run.Policy().Match(q.Domain, q.Descriptors[0].Entries); m != rule {
			t.Errorf("key %q: its request matches another rule", name)
		}
		q.Descriptors[0].Entries[0].Value = "changed"
		if run.Request(i).Descriptors[0].Entries[0].Value == "changed" {
			t.Fatal("Request returned the run's own descriptors")
		}
	}
}
