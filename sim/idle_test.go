package sim

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/gossip/protocol"
	"github.com/meridian-quota/meridian/rebalance"
)

// TestIdleKeyRegainsShare is issue 17's defect 11, measured and bounded
// in virtual time on the production path (protocol.Term learning keys
// from reports, a protocol.Follower per agent, region.Node deciding): a
// key idle for longer than KeyIdle has left the table and runs at the
// safe share; when its traffic returns, its home region must run most of
// the key's budget (≥ 50 %; proportional gives a home region with 90 % of
// the demand ~84 %) within
//
//	2Δ + 2·(Fence + 2·MaxSkew) + 4 one-way latencies
//
// of the key's first request — the core's bound for a shift of demand
// (rebalance's doc): up to Δ until the interval holding the request
// closes, a latency for the report, up to Δ until the rebalance that sees
// it (the key enters the term then, with its demand), and, since that
// rebalance almost always lowers some other key, the transition: a
// latency each for the decrease, its acknowledgement (counted MaxSkew
// after it takes effect) and the increase, the Fence and its MaxSkew (the
// increase waits Fence on every store's clock) — and up to another
// Fence + 2·MaxSkew when the rebalance must wait for the previous increase
// to be in force. The accuracy issue (18) sets the target this must come
// down to; the test logs the measured times.
func TestIdleKeyRegainsShare(t *testing.T) {
	for _, tc := range []struct {
		dt   time.Duration
		seed uint64
	}{{time.Second, 1}, {time.Second, 2}, {time.Second, 3}, {2 * time.Second, 1}, {2 * time.Second, 2}, {2 * time.Second, 3}, {5 * time.Second, 1}} {
		dt := tc.dt
		t.Run(fmt.Sprintf("%v/seed%d", dt, tc.seed), func(t *testing.T) {
			sc := mustScenario(t, `
name: idle-key
duration: 200s
warmup: 0s
regions: [{name: eu}, {name: us}, {name: ap}]
latency: {mean: 40ms, jitter: 10ms}
keys: {count: 12, zipf: 0.5, ratio: 2, burst_seconds: 1, home_fraction: 0.9}
workload: {rate: 600}
faults:
  key_churn:
    - {at: 10s, for: 30s, keys: 4}
    - {at: 120s, for: 60s, keys: 4}
`)
			r, err := NewRun(sc, "proportional", dt, tc.seed, nil)
			if err != nil {
				t.Fatal(err)
			}
			const back = 120 * time.Second
			t0 := back.Microseconds()
			if idle := (back - 40*time.Second); idle <= protocol.DefaultKeyIdle {
				t.Fatalf("setup: the keys idle %v, not longer than KeyIdle %v", idle, protocol.DefaultKeyIdle)
			}
			churned := len(r.keys) - 4
			first := make([]int64, len(r.keys)) // first request after t0
			arrivals := make([][]int, len(r.keys))
			for k := range first {
				first[k] = -1
				arrivals[k] = make([]int, len(r.regions))
			}
			r.OnArrival(func(a Arrival) {
				if a.Key >= churned && a.T >= t0 {
					if first[a.Key] < 0 {
						first[a.Key] = a.T
					}
					arrivals[a.Key][a.Region]++
				}
			})
			home := func(k int) int {
				return slices.Index(arrivals[k], slices.Max(arrivals[k]))
			}
			got := make([]int64, len(r.keys)) // when home first ran ≥ 50 %
			for k := range got {
				got[k] = -1
			}
			inTable := func(name string) bool {
				return r.stored != nil && slices.ContainsFunc(r.stored.Keys, func(ks rebalance.KeyShares) bool { return ks.Key == name })
			}
			var wasOut []bool
			r.check = func(r *Run, e *event) error {
				if r.now < t0 {
					return nil
				}
				if wasOut == nil {
					// Just before the keys return they are out of the table.
					wasOut = make([]bool, len(r.keys))
					for k := churned; k < len(r.keys); k++ {
						wasOut[k] = !inTable(r.keys[k].name)
					}
				}
				for k := churned; k < len(r.keys); k++ {
					if got[k] >= 0 || first[k] < 0 {
						continue
					}
					if lowestShare(r, home(k), k) >= 500_000 {
						got[k] = r.now
					}
				}
				return nil
			}
			if _, err := r.Simulate(); err != nil {
				t.Fatal(err)
			}
			fence, skew := r.rcfg.Fence, r.rcfg.MaxSkew
			bound := 2*dt + 2*(fence+2*skew) + 4*60*time.Millisecond // latency: mean + jitter
			var worst time.Duration
			var took []string
			for k := churned; k < len(r.keys); k++ {
				if !wasOut[k] {
					t.Errorf("%s: still in the table after %v idle (KeyIdle %v)", r.keys[k].name, back-40*time.Second, protocol.DefaultKeyIdle)
				}
				if first[k] < 0 {
					t.Fatalf("%s: no request after %v", r.keys[k].name, back)
				}
				if got[k] < 0 {
					t.Errorf("%s: its home region %s never ran ≥ 50 %% of it after it came back at %v", r.keys[k].name, r.regions[home(k)].name, time.Duration(first[k])*time.Microsecond)
					continue
				}
				d := time.Duration(got[k]-first[k]) * time.Microsecond
				worst = max(worst, d)
				took = append(took, fmt.Sprintf("%s %v", r.keys[k].name, d.Round(time.Millisecond)))
				if d > bound {
					t.Errorf("%s: its home region %s ran ≥ 50 %% of it %v after its first request, above 2Δ + 2·(Fence + 2·MaxSkew) + 4 latencies = %v", r.keys[k].name, r.regions[home(k)].name, d, bound)
				}
			}
			t.Logf("Δ %v (Fence %v, MaxSkew %v): back from idle to ≥ 50 %% at home in %v (worst %v = %.1fΔ; bound %v)", dt, fence, skew, took, worst, float64(worst)/float64(dt), bound)
		})
	}
}

// lowestShare is the smallest part of key k's budget (ppm) that any agent
// of region ri runs it at now, by the schedule its node would decide it
// under (on the store's clock: the previous limit until the current one
// takes effect there).
func lowestShare(r *Run, ri, k int) int64 {
	rg := r.regions[ri]
	low := int64(1 << 62)
	for a, n := range rg.nodes {
		rule := n.Policy().Rules()[k]
		s := n.ScheduleAt(rule, r.keys[k].name, rg.nodeNow(a, r.now))
		l := s.Current.Limit
		if s.HasPrevious && r.now+rg.skew < s.Current.Effective {
			l = s.Previous.Limit
		}
		low = min(low, shareOfLimit(rule.Limit, l))
	}
	return low
}
