package agent

import (
	"math"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gcra/memstore"
	"github.com/meridian-quota/meridian/rebalance"
	"github.com/meridian-quota/meridian/region"
)

func TestSharesOf(t *testing.T) {
	tb := &rebalance.Table{Regions: []string{"eu", "us"}, Keys: []rebalance.KeyShares{
		{Key: "a", Budget: gcra.PerSecond(100, 10), Shares: []uint32{600_000, 400_000}},
		{Key: "b", Budget: gcra.PerSecond(10, 10), Shares: []uint32{20_000, 980_000}},
	}}
	got := sharesOf(tb, "eu", 50_000)
	want := shareStats{
		mean:               (600_000 + 20_000) / 2.0,
		rateWeighted:       (100*600_000 + 10*20_000) / 110.0,
		meanLapsed:         (50_000 + 20_000) / 2.0,
		rateWeightedLapsed: (100*50_000 + 10*20_000) / 110.0,
	}
	if got == nil {
		t.Fatal("sharesOf = nil")
	}
	for _, c := range []struct {
		name      string
		got, want float64
	}{{"mean", got.mean, want.mean}, {"rateWeighted", got.rateWeighted, want.rateWeighted},
		{"meanLapsed", got.meanLapsed, want.meanLapsed}, {"rateWeightedLapsed", got.rateWeightedLapsed, want.rateWeightedLapsed}} {
		if math.Abs(c.got-c.want) > 1e-6 {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	// Regions summed stay within 1e6 (us: its shares, same weights).
	us := sharesOf(tb, "us", 50_000)
	if s := got.mean + us.mean; s > rebalance.PPM+1e-6 {
		t.Errorf("mean shares sum to %v over the regions", s)
	}
	if s := got.rateWeighted + us.rateWeighted; s > rebalance.PPM+1e-6 {
		t.Errorf("rate-weighted shares sum to %v over the regions", s)
	}
	if sharesOf(&rebalance.Table{Regions: []string{"eu"}}, "eu", 1) != nil {
		t.Error("a table naming no keys has share statistics")
	}
	if sharesOf(tb, "ap", 1) != nil {
		t.Error("a table not naming the region has share statistics")
	}
}

// gauge returns the value of the series name{labels} in a's registry, and
// whether it exists.
func gauge(t *testing.T, a *Agent, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := a.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for k, v := range labels {
				if !hasLabel(m, k, v) {
					continue series
				}
			}
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

func hasLabel(m *dto.Metric, k, v string) bool {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == k && lp.GetValue() == v {
			return true
		}
	}
	return false
}

// TestShareAndTableAgeMetrics: the share gauges and the table age exist
// from the start (the safe share, age 0), follow a table the agent's loop
// applies, and drop to min(share, safe) when its lease lapses.
func TestShareAndTableAgeMetrics(t *testing.T) {
	ncfg := region.DefaultConfig("eu", "eu-1", "eu", "us")
	ncfg.Interval = 200 * time.Millisecond // the drain waits at most one
	pol, err := region.ParsePolicy([]byte(testPolicy))
	if err != nil {
		t.Fatal(err)
	}
	ms, err := memstore.New(memstore.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	node, err := region.NewNode(ncfg, pol, ms)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.DrainDelay = 0 // stopped at once
	cfg.Region, cfg.Agent, cfg.Regions, cfg.Policy, cfg.ReloadEvery = "eu", "eu-1", []string{"eu", "us"}, "(test)", 0
	cfg.Interval = Duration(ncfg.Interval)
	a, err := New(cfg, node, nil)
	if err != nil {
		t.Fatal(err)
	}
	safe := float64(node.SafeShare()) // 10 % over two regions
	if safe != 50_000 {
		t.Fatalf("safe share %v, want 50000", safe)
	}
	mean := map[string]string{"stat": "mean"}
	weighted := map[string]string{"stat": "rate_weighted"}
	for _, l := range []map[string]string{mean, weighted} {
		if v, ok := gauge(t, a, "meridian_share_in_force_ppm", l); !ok || v != safe {
			t.Errorf("at start: share %v = %v (exists %v), want the safe share %v", l, v, ok, safe)
		}
	}
	if v, ok := gauge(t, a, "meridian_table_age_seconds", nil); !ok || v != 0 {
		t.Errorf("at start: table age %v (exists %v), want 0", v, ok)
	}

	rec, _, stop := runLinked(t, a)
	defer func() {
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	now := time.Now().UnixMicro()
	issued := now - 3e6 // three seconds ago
	tb := &rebalance.Table{Term: 1, Epoch: 1, Issued: issued, Effective: now - 3600e6, Regions: []string{"eu", "us"},
		Leases: []int64{now + 1e6, now + 1e6}, Agents: [][]string{{"eu-1"}, {"us-1"}},
		Keys: []rebalance.KeyShares{
			{Key: region.KeyName("api", []region.Entry{{Key: "tenant", Value: "a"}}), Budget: gcra.PerSecond(5, 3), Shares: []uint32{800_000, 200_000}, Version: 1},
			{Key: region.KeyName("api", []region.Entry{{Key: "tenant", Value: "b"}}), Budget: gcra.PerSecond(5, 3), Shares: []uint32{40_000, 960_000}, Version: 1},
		}}
	rec.tables <- tb
	waitUntil(t, "the table's shares", func() bool {
		v, _ := gauge(t, a, "meridian_share_in_force_ppm", mean)
		return v == 420_000
	})
	if v, _ := gauge(t, a, "meridian_share_in_force_ppm", weighted); v != 420_000 {
		t.Errorf("rate-weighted share %v, want 420000 (equal budgets)", v)
	}
	if v, _ := gauge(t, a, "meridian_table_age_seconds", nil); v < 3 || v > 10 {
		t.Errorf("table age %v s, want about 3", v)
	}
	// The lease ends a second after now: the keys drop to min(share, safe).
	waitUntil(t, "the lapse", func() bool {
		v, _ := gauge(t, a, "meridian_share_in_force_ppm", mean)
		return v == (50_000+40_000)/2
	})
	if v, _ := gauge(t, a, "meridian_lease_lapsed", nil); v != 1 {
		t.Errorf("lease_lapsed %v after the lapse, want 1", v)
	}
}
