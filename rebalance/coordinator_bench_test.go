package rebalance

import (
	"fmt"
	"testing"
)

// BenchmarkRebalance measures one rebalance of 100,000 keys across 10
// regions, one agent per region reporting demand for every key each
// interval: Observe the ten reports, then Tick at the next Δ.
func BenchmarkRebalance(b *testing.B) {
	b.Run("observe+tick", func(b *testing.B) { benchRebalance(b, false) })
	b.Run("tick", func(b *testing.B) { benchRebalance(b, true) })
}

// benchRebalance times the reports and the Tick, or (tickOnly) the Tick.
func benchRebalance(b *testing.B, tickOnly bool) {
	const keys, nR = 100_000, 10
	c, cfg, budgets := benchCoordinator(b, keys, nR, func(i int) string { return fmt.Sprintf("tenant-%06d", i) })
	regions := cfg.Regions
	// Two sets of reports, alternated, so that shares keep moving.
	reports := make([][]Report, 2)
	for v := range reports {
		for ri, r := range regions {
			rep := Report{Region: r, Agent: r + "-1", Keys: make([]KeyDemand, keys)}
			for k := range keys {
				d := int64(10 + (k*7+ri*13+v*ri*31)%97)
				rep.Keys[k] = KeyDemand{Key: budgets[k].Key, Demand: Demand{Offered: d, OfferedCost: d, Admitted: d}}
			}
			reports[v] = append(reports[v], rep)
		}
	}
	dt := int64(cfg.Interval.Microseconds())
	now := int64(0)
	step := func(i int) {
		now += dt
		if tickOnly {
			b.StopTimer()
		}
		for ri := range reports[i%2] {
			r := &reports[i%2][ri]
			r.Interval = now/dt - 1
			if tb := c.Latest(); tb != nil {
				r.Term, r.Epoch = tb.Term, tb.Epoch
			}
			if err := c.Observe(r, now); err != nil {
				b.Fatal(err)
			}
		}
		if tickOnly {
			b.StartTimer()
		}
		c.Tick(now)
		c.Advance()
	}
	for i := range 3 {
		step(i) // warm up: every key has demand and shares
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		step(i)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*keys), "ns/key")
}

// BenchmarkUpdateKeys measures the coordinator's key churn at 100,000 keys
// across 10 regions: each op adds 100 keys it has never seen and removes
// the 100 added the op before, as a term does when reports name new
// tenants and others go idle.
func BenchmarkUpdateKeys(b *testing.B) {
	const keys, nR, churn = 100_000, 10, 100
	// The added keys fall between the first ones.
	c, _, _ := benchCoordinator(b, keys, nR, func(i int) string { return fmt.Sprintf("tenant-%07d", 2*i) })
	var last []string
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		add := make([]Budget, churn)
		names := make([]string, churn)
		for j := range add {
			// Spread over the key space: every row from the first new key
			// on moves.
			names[j] = fmt.Sprintf("tenant-%07d", 2*((i*churn+j)*997%keys)+1)
			add[j] = budget(names[j])
		}
		if err := c.UpdateKeys(add, last); err != nil {
			b.Fatal(err)
		}
		last = names
	}
}

// benchCoordinator is a coordinator of keys named name(i) across nR
// regions with the default strategy, at term 1 with its first table taken.
func benchCoordinator(b *testing.B, keys, nR int, name func(int) string) (*Coordinator, Config, []Budget) {
	regions := make([]string, nR)
	for i := range regions {
		regions[i] = fmt.Sprintf("r%02d", i)
	}
	cfg := unitConfig(regions...)
	cfg.Strategy = DefaultConfig().Strategy
	budgets := make([]Budget, keys)
	for i := range budgets {
		budgets[i] = budget(name(i))
	}
	c, err := NewCoordinator(cfg, budgets)
	if err != nil {
		b.Fatal(err)
	}
	if err := c.StartTerm(1, nil, 0); err != nil {
		b.Fatal(err)
	}
	c.Advance()
	return c, cfg, budgets
}
