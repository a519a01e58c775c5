package region

import (
	"context"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/gcra/memstore"
	"github.com/meridian-quota/meridian/rebalance"
)

// Σ over regions of the burst each region may run after idle — the
// table's burst where a node runs the table, the safe burst where it is
// cold — never exceeds the global burst. The table comes from the real
// coordinator, the admissions from real nodes on their regions' stores.
// Fails on 2023668: the burst split ignored the safe burst, and the safe
// bursts alone could sum above the global burst. With floors of 70 %, 10 %
// and 10 % and a burst of 3, the table gave each region 1 while a cold ap
// ran its safe burst of 2 (70 % of 3, rounded down): 4 admitted back to
// back against a burst of 3.
func TestColdRegionsSafeBurstCountedInTheSplit(t *testing.T) {
	const pol = `
domains:
  - domain: api
    descriptors:
      - {key: tenant, rate_limit: {unit: second, requests_per_unit: 30, burst: 3}}
`
	regions := []string{"ap", "eu", "us"}
	policy := mustPolicy(t, pol)
	key := KeyName("api", []Entry{{"tenant", "acme"}})
	budget := policy.Rules()[0].Limit
	cfg := rebalance.DefaultConfig(regions...)
	cfg.Interval, cfg.Lease, cfg.MaxSkew, cfg.Fence = time.Second, 10*time.Second, 10*time.Millisecond, 20*time.Millisecond
	cfg.Strategy = "proportional"
	// Floors an operator chose: ap keeps most of every budget.
	cfg.SafeShare = map[string]uint32{"ap": 700_000, "eu": 100_000, "us": 100_000}
	c, err := rebalance.NewCoordinator(cfg, []rebalance.Budget{{Key: key, Limit: budget}})
	if err != nil {
		t.Fatal(err)
	}
	const t0 = int64(1_700_000_000_000_000)
	if err := c.MemberChange([]rebalance.Member{{Region: "eu", Agent: "eu-1"}}); err != nil {
		t.Fatal(err)
	}
	if err := c.StartTerm(1, nil, t0); err != nil {
		t.Fatal(err)
	}
	var last *rebalance.Table
	for now := t0; now < t0+20e6; now += 10_000 {
		if (now-t0)%1e6 == 0 && now > t0 {
			rep := &rebalance.Report{Region: "eu", Agent: "eu-1", Interval: now/1e6 - 1,
				Keys: []rebalance.KeyDemand{{Key: key, Demand: rebalance.Demand{Offered: 90, OfferedCost: 90}}}}
			if last != nil {
				rep.Term, rep.Epoch = last.Term, last.Epoch
			}
			if err := c.Observe(rep, now); err != nil {
				t.Fatal(err)
			}
		}
		if last != nil && now >= last.Effective+cfg.MaxSkew.Microseconds() {
			if err := c.Ack("eu", "eu-1", last.Term, last.Epoch); err != nil {
				t.Fatal(err)
			}
		}
		c.Tick(now)
		for _, tb := range c.Ready() {
			last = tb
		}
		c.Advance()
	}
	ks := last.Keys[0]
	t.Logf("table shares %v bursts %v", ks.Shares, ks.Bursts)
	if ks.Shares[0] != 700_000 || ks.Shares[1] != 200_000 {
		t.Fatalf("setup: shares %v, want ap at its floor and eu with the rest of the budget", ks.Shares)
	}
	// One node per region, each on its region's store; eu's and us's
	// apply the table, ap's is cold (it just started, or is cut off).
	now := last.Effective + 60e6 // long idle: every key holds its full burst
	admitted := 0
	var per []int
	for _, r := range regions {
		ms, err := memstore.New(memstore.Config{Clock: func() int64 { return now }, Shards: 1, MaxKeys: 100})
		if err != nil {
			t.Fatal(err)
		}
		ncfg := DefaultConfig(r, r+"-1", regions...)
		ncfg.SafeShare = cfg.SafeShare[r]
		n, err := NewNode(ncfg, policy, ms)
		if err != nil {
			t.Fatal(err)
		}
		if r != "ap" {
			if err := n.Apply(last, now); err != nil {
				t.Fatal(err)
			}
		}
		got := 0
		for range 10 {
			var d Decision
			if err := n.Decide(context.Background(), now, &Request{Domain: "api", Descriptors: []Descriptor{{Entries: []Entry{{"tenant", "acme"}}}}, Cost: 1}, &d); err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				got++
			}
		}
		per = append(per, got)
		admitted += got
	}
	if b := budget.Burst(); int64(admitted) > b {
		t.Errorf("admitted %d back to back after idle (per region %v), above the global burst %d", admitted, per, b)
	}
}
