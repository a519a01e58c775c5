package sim

import (
	"time"
)

// Result is one run's measurements, as ARCHITECTURE.md defines them.
type Result struct {
	Scenario string   `json:"scenario"`
	Strategy string   `json:"strategy"`
	Interval Duration `json:"interval"`
	Seed     uint64   `json:"seed"`

	// Over the measured part of the run (after warm-up), cost units.
	Offered        int64 `json:"offered"`
	Admitted       int64 `json:"admitted"`
	OracleAdmitted int64 `json:"oracle_admitted"`

	// Windows holds OA, UA, P, fairness and convergence per window size.
	Windows []WindowResult `json:"windows"`
	// Convergence after the scripted shift as ARCHITECTURE.md defines it:
	// each key in 1 s windows, or in 10 s windows when the oracle admits
	// it under 400/s (none without a shift).
	Convergence Convergence `json:"convergence"`
	// OABudget: non-conforming admits ÷ (rate × measured duration), per key.
	OABudget Summary `json:"oa_budget"`
	// Disagreement: requests decided otherwise than the oracle ÷ requests.
	Disagreement float64 `json:"disagreement"`
	// Control cost per key-region per second: messages (chunks) and
	// bytes as gossip/wire encodes them. BytesEstimated is set only for
	// the replicated-counter baseline, whose sync batches are estimated.
	Messages       float64 `json:"messages_per_key_region_s"`
	Bytes          float64 `json:"bytes_per_key_region_s"`
	BytesEstimated bool    `json:"bytes_estimated"`

	Requests  int64 `json:"requests"`
	Retries   int64 `json:"retries"`
	Dropped   int64 `json:"dropped"`
	Fallbacks int64 `json:"fallbacks"`
	// Errored counts the fallbacks failure_mode error left to the caller
	// (Scenario.OnError decided them); they are among Fallbacks.
	Errored int64 `json:"errored"`
	Lost    int64 `json:"lost_messages"`
	// What production's protocol code refused or counted (omitted when
	// zero): reports the coordinator's queue dropped, reported keys beyond
	// its MaxKeys (per report naming them), and tables an agent's
	// protocol.Follower found stale (not newer than the last delivered —
	// a later table overtook them on the links).
	QueueDropped int64 `json:"queue_dropped,omitempty"`
	Overflow     int64 `json:"keys_overflow,omitempty"`
	StaleTables  int64 `json:"stale_tables,omitempty"`

	Keys []KeyResult `json:"keys,omitempty"`
	Top  []TopKey    `json:"top_keys,omitempty"`
	// TableTimes, with Options.TimeTables, is the wall time of each table
	// the coordinator made: its term's Tick (the rebalance, when one was
	// due) and the table's encoding, signature and store, as gossip.Loop
	// does them. It is the machine's time, not the scenario's, so no
	// report format carries it.
	TableTimes []time.Duration `json:"-"`
}

// WindowResult is the per-window metrics for one window size.
type WindowResult struct {
	Window Duration `json:"window"`
	OA     Summary  `json:"oa"`
	UA     Summary  `json:"ua"`
	Peak   Summary  `json:"peak"`
	// Fairness is the mean spread across regions of A_r/A*_r while a key
	// is over budget (the oracle scores 0).
	Fairness Summary `json:"fairness"`
	// Convergence is seconds from the scripted shift until 5 consecutive
	// windows are within 5 % of the oracle (keys that converged).
	Convergence  Summary `json:"convergence_s"`
	NotConverged int     `json:"not_converged"`
}

// Convergence is, over the keys the oracle admits, the time from the
// scripted shift until 5 consecutive windows are within 5 % of the
// oracle's admits: 1 s windows for a key the oracle admits at 400/s or
// more over the measured part of the run ("hot"), 10 s windows for the
// others. A key that never gets there is counted in Never, never left
// out: its time is later than any, so a median it falls on is "never"
// (MedianNever; Median is then 0). A key whose windows do not fit 5 times
// between the shift and the end cannot converge in the run, whatever the
// system does: it is counted in Unmeasurable instead. With no key measured
// (Keys 0) there is no median.
type Convergence struct {
	Keys         int     `json:"keys"`
	Never        int     `json:"never"`
	Unmeasurable int     `json:"unmeasurable,omitempty"`
	Median       float64 `json:"median_s"`
	MedianNever  bool    `json:"median_never"`
	// Converged is across the keys that converged (demand-weighted mean,
	// percentiles), in seconds.
	Converged Summary `json:"converged_s"`
	// The same over the hot keys alone.
	HotKeys        int     `json:"hot_keys"`
	HotNever       int     `json:"hot_never"`
	HotMedian      float64 `json:"hot_median_s"`
	HotMedianNever bool    `json:"hot_median_never"`
}

// hotRate is the oracle's admits/s (cost units) from which a key's
// convergence is measured in 1 s windows.
const hotRate = 400

// median is the median of n values of which vals (sorted) are finite and
// the other n − len(vals) later than any; never when it falls on those.
func median(vals []float64, n int) (m float64, never bool) {
	if n == 0 {
		return 0, false
	}
	lo, hi := (n-1)/2, n/2 // the middle one, or the two middle ones
	if hi >= len(vals) {
		return 0, true
	}
	return (vals[lo] + vals[hi]) / 2, false
}

// KeyResult is one key's totals.
type KeyResult struct {
	Key            string  `json:"key"`
	Budget         string  `json:"budget"`
	IntervalMicros int64   `json:"budget_interval_us"`
	Burst          int64   `json:"budget_burst"`
	Offered        int64   `json:"offered"`
	OracleAdmitted int64   `json:"oracle_admitted"`
	Admitted       int64   `json:"admitted"`
	OA1s           float64 `json:"oa_1s"`
	UA1s           float64 `json:"ua_1s"`
	OABudget       float64 `json:"oa_budget"`
}

// TopKey is a most popular key's series, one value per simulated second.
type TopKey struct {
	Key      string  `json:"key"`
	Rate     float64 `json:"budget_rate"`
	Offered  []int64 `json:"offered"`
	Admitted []int64 `json:"admitted"`
	Oracle   []int64 `json:"oracle"`
	// Shares: per region (in the scenario's order), per second, the part
	// of the budget the region ran at.
	Shares [][]float64 `json:"shares"`
}

func (r *Run) result() *Result {
	res := &Result{Scenario: r.sc.Name, Strategy: r.strategy, Interval: Duration(time.Duration(r.interval) * time.Microsecond),
		Seed: r.seed, Requests: r.dec.Requests, Retries: r.dec.Retries, Dropped: r.dec.Dropped,
		Fallbacks: r.dec.Fallbacks, Errored: r.dec.Errored, Lost: r.dec.Lost, BytesEstimated: r.strategy == ReplicatedCounter,
		QueueDropped: r.dec.QueueDropped, Overflow: r.dec.Overflow, StaleTables: r.dec.StaleTables}
	r.m.fill(res)
	res.TableTimes = r.tableTimes
	kr := float64(len(r.keys)*len(r.regions)) * float64(r.end) / 1e6
	res.Messages = float64(r.dec.Reports+r.dec.Tables+r.dec.Acks) / kr
	res.Bytes = float64(r.dec.ReportBytes+r.dec.TableBytes+r.dec.AckBytes) / kr
	return res
}
