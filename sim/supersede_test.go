package sim

import (
	"testing"
	"time"
)

// demo20 is `meridian demo --duration 20s`'s workload: the hottest key's
// home is ap (80 % of its traffic), over budget (≈198/s offered 330/s).
const demo20 = `
name: demo
duration: 20s
warmup: 3333ms
shift: 8s
seeds: [1]
regions: [{name: eu}, {name: us}, {name: ap}]
latency: {mean: 1ms}
coordinator: {region: us}
keys: {count: 20, zipf: 1.0, sigma: 0.8, over_fraction: 0.4, burst_seconds: 1, home_fraction: 0.8}
workload:
  rate: 1200
  moves: [{from: eu, to: ap, at: 8s}]
strategies: [ewma]
intervals: [2s]
lease: 10s
`

// apIdx is ap's index in demo20's regions (the order of TopKey.Shares).
const apIdx = 2

// demoTop runs demo20 and returns its hottest key's series.
func demoTop(t *testing.T) TopKey {
	t.Helper()
	sc := mustScenario(t, demo20)
	r, err := NewRun(sc, "ewma", 2*time.Second, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Simulate()
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Top) == 0 {
		t.Fatal("no top key series")
	}
	return res.Top[0]
}

// Once the home region's share is in force, its admissions follow at once.
// They lagged 8 s: the coordinator rebalanced at the very instant its
// increase took effect (the increase's fence), the table reached the
// regions a link latency later, before any request had been admitted under
// the increase, so the key's state was still written under the floors (a
// 66-unit burst at T ≈ 150 ms, TAT ~10 s ahead) — older than the change the
// new table keeps, which the store reads as its TAT carried into the 80 %
// share as debt. ap admitted ~15/s from t = 7 s to 15 s at share 0.81.
func TestDemoAdmissionsFollowTheShareInForce(t *testing.T) {
	top, ap := demoTop(t), apIdx
	first := -1
	for s, v := range top.Shares[ap] {
		if v > 0.5 {
			first = s
			break
		}
	}
	if first < 0 {
		t.Fatalf("ap's share never above 0.5: %v", top.Shares[ap])
	}
	for s := first + 1; s < len(top.Admitted)-1; s++ {
		if a, o := top.Admitted[s], top.Oracle[s]; float64(a) < 0.8*float64(o) {
			t.Errorf("t=%ds: admitted %d, oracle %d, with ap's share %.2f in force since t≈%ds\nadmitted %v\noracle   %v",
				s, a, o, top.Shares[ap][s], first, top.Admitted, top.Oracle)
			break
		}
	}
}

// The first rebalance sees the first interval's demand, so the home
// region's share is in force by Δ + the decrease's wait (MaxSkew and an
// acknowledgement) + Fence ≈ 4.7 s. With the coordinator ticking in
// lockstep with the agents (and before them), every rebalance ran a link
// latency before the reports of the interval that had just closed arrived:
// the first one saw no demand at all and the share came ~2 s later.
func TestDemoFirstRebalanceSeesTheFirstInterval(t *testing.T) {
	top, ap := demoTop(t), apIdx
	if s := top.Shares[ap][5]; s < 0.5 {
		t.Errorf("ap's share at t=5s is %.3f, want its demand's (~0.8)\nshares %v", s, top.Shares[ap])
	}
}
