package rebalance

import (
	"fmt"
	"testing"

	"github.com/meridian-quota/meridian/gcra"
)

// Issue 17, defect 5: after the coordinator's process crashed — taking its
// own agent a1 with it — the new term waited for a1's acknowledgement,
// first in learning mode and then for the first decrease of a, until the
// stored lease plus skew: no rebalancing for a whole lease. With the region
// fence, a2's acknowledgement of each table with a fence at least that
// table, read back from a's store, proves the table in force in all of a:
// a1, were it alive and partitioned, is refused by that store. So learning
// ends and the increase follows as soon as a2 and b1 acknowledge.
//
// The subtests are the rule's edges: acknowledgements without a fence (a
// release that keeps none, a Redis Cluster) wait for the lease as before;
// so does a region whose agents acknowledged on two stores (one of them
// decides unfenced on the other), and a fence acknowledged by an agent
// that membership does not list proves nothing. Does not build on 87ff872
// (no AckFenced); there, with acknowledgements alone, the "no fence" case
// is what every failover did.
func TestFailoverOneFencedAckPerRegion(t *testing.T) {
	cfg := unitConfig("a", "b")
	lease := cfg.Lease.Microseconds() + cfg.MaxSkew.Microseconds()
	old := started(t, cfg, budget("k"))
	all := []Member{{Region: "a", Agent: "a1"}, {Region: "a", Agent: "a2"}, {Region: "b", Agent: "b1"}}
	if err := old.MemberChange(all); err != nil {
		t.Fatal(err)
	}
	observe(t, old, "a", "a1", 0, sec, map[string]int64{"k": 450})
	observe(t, old, "a", "a2", 0, sec, map[string]int64{"k": 450})
	observe(t, old, "b", "b1", 0, sec, map[string]int64{"k": 100})
	old.Tick(sec)
	take(old)
	settle(t, old, sec)
	stored := old.Latest()
	if s := sharesOf(stored, "k"); s[0] < 800_000 {
		t.Fatalf("setup: stored shares %v, want most of k in a", s)
	}
	const storeA, storeB = 0xa, 0xb
	for _, tc := range []struct {
		name string
		// ack acknowledges table tb for one agent as the shell would.
		ack      func(c *Coordinator, region, agent string, tb *Table) error
		members  []Member
		fastFail bool // the increase must come before the lease
	}{
		{"fenced", func(c *Coordinator, region, agent string, tb *Table) error {
			return c.AckFenced(region, agent, tb.Term, tb.Epoch, gcra.Fence{Term: tb.Term, Epoch: tb.Epoch}, map[string]uint64{"a": storeA, "b": storeB}[region])
		}, all[1:], true},
		{"no fence", func(c *Coordinator, region, agent string, tb *Table) error {
			return c.Ack(region, agent, tb.Term, tb.Epoch)
		}, all[1:], false},
		{"two stores in a", func(c *Coordinator, region, agent string, tb *Table) error {
			f := gcra.Fence{Term: tb.Term, Epoch: tb.Epoch}
			if agent == "a3" {
				return c.AckFenced(region, agent, tb.Term, tb.Epoch, f, 0xc)
			}
			return c.AckFenced(region, agent, tb.Term, tb.Epoch, f, map[string]uint64{"a": storeA, "b": storeB}[region])
		}, append(all[1:], Member{Region: "a", Agent: "a3"}), false},
		{"fence from a non-member", func(c *Coordinator, region, agent string, tb *Table) error {
			f := gcra.Fence{Term: tb.Term, Epoch: tb.Epoch}
			if agent == "a2" {
				return c.AckFenced(region, agent, tb.Term, tb.Epoch, f, storeA)
			}
			return c.Ack(region, agent, tb.Term, tb.Epoch)
		}, []Member{{Region: "b", Agent: "b1"}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := mustCoordinator(t, cfg, budget("k"))
			start := 2 * sec
			if err := c.MemberChange(tc.members); err != nil {
				t.Fatal(err)
			}
			if err := c.StartTerm(2, stored, start); err != nil {
				t.Fatal(err)
			}
			var inc *Table
			learnedAt := int64(-1)
			var acked []string
			for _, m := range tc.members {
				acked = append(acked, m.Region+"/"+m.Agent)
			}
			if tc.name == "fence from a non-member" {
				acked = append(acked, "a/a2")
			}
			for now := start; now <= start+3*lease && inc == nil; now += 10_000 {
				if now%sec == 0 && now > start {
					// Demand moves to b; a1 is gone and reports nothing.
					for _, ra := range acked {
						if ra[0] == 'a' {
							observe(t, c, "a", ra[2:], now/sec-1, now, map[string]int64{"k": 50})
						} else {
							observe(t, c, "b", ra[2:], now/sec-1, now, map[string]int64{"k": 950})
						}
					}
				}
				c.Tick(now)
				if learnedAt < 0 && !c.Learning() {
					learnedAt = now
				}
				for _, tb := range take(c) {
					if sharesOf(tb, "k")[1] > sharesOf(stored, "k")[1] {
						inc = tb
					}
					for _, ra := range acked {
						if err := tc.ack(c, ra[:1], ra[2:], tb); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			if inc == nil {
				t.Fatalf("no increase of b within three leases (learning ended at %dµs)", learnedAt)
			}
			at := inc.Issued - start
			t.Logf("%s: learning ended %.2f s and b's increase went out %.2f s after the term started (lease plus skew %.2f s)",
				tc.name, float64(learnedAt-start)/1e6, float64(at)/1e6, float64(lease)/1e6)
			switch {
			case tc.fastFail && at > 3*sec:
				t.Errorf("increase %.2f s after the term started, want within 3 Δ: a2's fenced acknowledgement proves a", float64(at)/1e6)
			case !tc.fastFail && stored.Leases[0]+cfg.MaxSkew.Microseconds() > inc.Issued:
				t.Errorf("increase at %dµs, before a's stored lease plus skew (%dµs): %s", inc.Issued, stored.Leases[0]+cfg.MaxSkew.Microseconds(),
					fmt.Sprintf("nothing proves a1 gone (%s)", tc.name))
			}
		})
	}
}
