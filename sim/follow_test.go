package sim

import (
	"slices"
	"testing"
	"time"
)

// TestMovedKeyFollows measures issue 18's "shares follow demand slowly"
// in virtual time on the production path (protocol.Term, a
// protocol.Follower per agent, region.Node deciding): each key lives in
// one region (home_fraction 1) and moves once to another; the test takes
// the time from the move until every agent of the new region runs at
// least 80 % of the key's budget (the floors leave at most 93.3 %), and
// asserts the core's bound for a shift of demand (rebalance's doc, as
// TestIdleKeyRegainsShare states it) plus one Δ:
//
//	3Δ + 2·(Fence + 2·MaxSkew) + 4 one-way latencies
//
// The Δ more is the interval that holds the move: it reports demand in
// both regions, so the rebalance that sees it gives the new region only
// part of the key (≥ 50 % was TestIdleKeyRegainsShare's threshold), and 80 %
// needs the next interval's report. (Without it, 3 of 10 keys at Δ = 1 s
// and 3 of 9 at Δ = 5 s took longer than 2Δ + 2·(Fence + MaxSkew) + 4
// latencies.) It logs the median and the worst against issue 18's target, Fence +
// MaxSkew + 2 one-way latencies + 0.5 s (and 2Δ): the bound is what holds
// today, the target what event-driven rebalancing is to reach.
func TestMovedKeyFollows(t *testing.T) {
	for _, dt := range []time.Duration{time.Second, 2 * time.Second, 5 * time.Second} {
		t.Run(dt.String(), func(t *testing.T) {
			sc := mustScenario(t, `
name: moved-key
duration: 150s
warmup: 30s
regions: [{name: eu}, {name: us}, {name: ap}]
latency: {mean: 100ms, jitter: 10ms}
keys: {count: 12, zipf: 0.5, ratio: 2, burst_seconds: 1, home_fraction: 1, migrations: {min: 1, max: 1}}
workload: {rate: 1200}
`)
			r, err := NewRun(sc, "proportional", dt, 1, nil)
			if err != nil {
				t.Fatal(err)
			}
			got := make([]int64, len(r.keys)) // when the new home first ran ≥ 80 %
			for k := range got {
				got[k] = -1
			}
			r.check = func(r *Run, e *event) error {
				for k := range r.keys {
					mv := r.keys[k].moves[0]
					if got[k] >= 0 || r.now < mv.t {
						continue
					}
					if lowestShare(r, mv.to, k) >= 800_000 {
						got[k] = r.now
					}
				}
				return nil
			}
			if _, err := r.Simulate(); err != nil {
				t.Fatal(err)
			}
			fence, skew := r.rcfg.Fence, r.rcfg.MaxSkew
			const lat = 110 * time.Millisecond // mean + jitter
			bound := 3*dt + 2*(fence+2*skew) + 4*lat
			target := min(fence+skew+2*lat+500*time.Millisecond, 2*dt)
			var took []time.Duration
			for k := range r.keys {
				mv := r.keys[k].moves[0]
				if mv.t > r.end-(bound+time.Second).Microseconds() {
					continue // moved too late in the run to be measured
				}
				if got[k] < 0 {
					t.Errorf("%s: %s never ran ≥ 80 %% of it after it moved there at %v", r.keys[k].name, r.regions[mv.to].name, time.Duration(mv.t)*time.Microsecond)
					continue
				}
				d := time.Duration(got[k]-mv.t) * time.Microsecond
				took = append(took, d)
				if d > bound {
					t.Errorf("%s: %s ran ≥ 80 %% of it %v after the move, above 3Δ + 2·(Fence + 2·MaxSkew) + 4 latencies = %v", r.keys[k].name, r.regions[mv.to].name, d, bound)
				}
			}
			if len(took) < len(r.keys)/2 {
				t.Fatalf("only %d of %d keys' moves measured", len(took), len(r.keys))
			}
			slices.Sort(took)
			med, worst := took[len(took)/2], took[len(took)-1]
			t.Logf("Δ %v (Fence %v, MaxSkew %v, 100 ms links): %d moved keys at ≥ 80 %% in the new region after a median %v (%.1fΔ), worst %v; bound %v, issue 18's target %v",
				dt, fence, skew, len(took), med.Round(time.Millisecond), float64(med)/float64(dt), worst.Round(time.Millisecond), bound, target)
		})
	}
}
