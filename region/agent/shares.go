package agent

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-quota/meridian/rebalance"
	"github.com/meridian-quota/meridian/region"
)

// shareStats summarises this region's shares (ppm) over the keys of the
// table the agent applied last, as the table gives them and as they run
// once its lease lapses (each key at min(share, safe share)). Per-key
// shares are unbounded in number; these two aggregates are not.
type shareStats struct {
	mean, rateWeighted             float64
	meanLapsed, rateWeightedLapsed float64
}

// sharesOf is region's share statistics over t's keys, safe the region's
// floor; nil when t names no keys or not the region (every key then runs
// at the safe share). t has passed the node's Apply: every key has a share
// per region.
func sharesOf(t *rebalance.Table, region string, safe uint32) *shareStats {
	r := slices.Index(t.Regions, region)
	if r < 0 || len(t.Keys) == 0 {
		return nil
	}
	var sum, sumLapsed, w, wsum, wsumLapsed float64
	for i := range t.Keys {
		ks := &t.Keys[i]
		if r >= len(ks.Shares) {
			return nil
		}
		s, sl := float64(ks.Shares[r]), float64(min(ks.Shares[r], safe))
		sum += s
		sumLapsed += sl
		if iv := ks.Budget.IntervalMicros(); iv > 0 {
			rate := 1e6 / float64(iv) // events per second
			w += rate
			wsum += rate * s
			wsumLapsed += rate * sl
		}
	}
	n := float64(len(t.Keys))
	st := &shareStats{mean: sum / n, meanLapsed: sumLapsed / n}
	if w > 0 {
		st.rateWeighted, st.rateWeightedLapsed = wsum/w, wsumLapsed/w
	} else {
		st.rateWeighted, st.rateWeightedLapsed = st.mean, st.meanLapsed
	}
	return st
}

// noteApplied records the shares of a table the node accepted.
func (a *Agent) noteApplied(t *rebalance.Table) {
	a.shares.Store(sharesOf(t, a.cfg.Region, a.node.SafeShare()))
}

// shareInForce is the gauge meridian_share_in_force_ppm{stat}.
func (a *Agent) shareInForce(stat string, inTable, lapsed func(*shareStats) float64) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "meridian_share_in_force_ppm",
		Help: "This region's share (ppm) of the global limits over the keys of the table applied last: " +
			"stat=mean weighs every key equally, stat=rate_weighted weighs each by its budget's rate (the region's part of the summed global rate). " +
			"The safe share before the first table (or with a table naming no keys); each key at min(share, safe share) once the lease lapsed or while the table does not name this agent. " +
			"Regions running the same table sum to at most 1e6.",
		ConstLabels: prometheus.Labels{"stat": stat},
	}, func() float64 {
		st, tab := a.shares.Load(), a.node.Table()
		switch {
		case st == nil || !tab.HasTable:
			return float64(a.node.SafeShare())
		case tab.Lapsed || !tab.Named:
			return lapsed(st)
		default:
			return inTable(st)
		}
	})
}

// shareCollectors are the share gauges, one per stat.
func (a *Agent) shareCollectors() []prometheus.Collector {
	return []prometheus.Collector{
		a.shareInForce("mean", func(s *shareStats) float64 { return s.mean }, func(s *shareStats) float64 { return s.meanLapsed }),
		a.shareInForce("rate_weighted", func(s *shareStats) float64 { return s.rateWeighted }, func(s *shareStats) float64 { return s.rateWeightedLapsed }),
	}
}

// tableAge is now (µs) minus the applied table's Issued, in seconds; 0
// without a table.
func tableAge(t region.TableState, now int64) float64 {
	if !t.HasTable {
		return 0
	}
	return float64(now-t.Issued) / 1e6
}
