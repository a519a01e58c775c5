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
	// OABudget: non-conforming admits ÷ (rate × measured duration), per key.
	OABudget Summary `json:"oa_budget"`
	// Disagreement: requests decided otherwise than the oracle ÷ requests.
	Disagreement float64 `json:"disagreement"`
	// Control cost per key-region per second. Bytes are an estimate until
	// gossip/wire exists (BytesEstimated).
	Messages       float64 `json:"messages_per_key_region_s"`
	Bytes          float64 `json:"bytes_per_key_region_s"`
	BytesEstimated bool    `json:"bytes_estimated"`

	Requests  int64 `json:"requests"`
	Retries   int64 `json:"retries"`
	Dropped   int64 `json:"dropped"`
	Fallbacks int64 `json:"fallbacks"`
	Lost      int64 `json:"lost_messages"`

	Keys []KeyResult `json:"keys,omitempty"`
	Top  []TopKey    `json:"top_keys,omitempty"`
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
	m := r.m
	res := &Result{Scenario: r.sc.Name, Strategy: r.strategy, Interval: Duration(time.Duration(r.interval) * time.Microsecond),
		Seed: r.seed, Requests: r.dec.Requests, Retries: r.dec.Retries, Dropped: r.dec.Dropped,
		Fallbacks: r.dec.Fallbacks, Lost: r.dec.Lost, BytesEstimated: true}
	measured := float64(r.end-r.warmup) / 1e6
	// Keys the oracle never admits are excluded.
	var keys []int
	var weights []float64
	for i := range r.keys {
		res.Offered += m.k[i].offered
		res.Admitted += m.k[i].admitted
		res.OracleAdmitted += m.k[i].oracle
		if m.k[i].oracle > 0 {
			keys = append(keys, i)
			weights = append(weights, float64(m.k[i].offered))
		}
	}
	vals := make([]float64, len(keys))
	for _, w := range m.wins {
		wr := WindowResult{Window: Duration(time.Duration(w.size) * time.Microsecond)}
		for j, i := range keys {
			vals[j] = float64(w.k[i].over) / float64(max(w.k[i].star, 1))
		}
		wr.OA = summarize(vals, weights)
		for j, i := range keys {
			vals[j] = float64(w.k[i].under) / float64(max(w.k[i].star, 1))
		}
		wr.UA = summarize(vals, weights)
		for j, i := range keys {
			vals[j] = w.k[i].peak
		}
		wr.Peak = summarize(vals, weights)
		var fv, fw []float64
		var cv, cw []float64
		for j, i := range keys {
			if w.k[i].fairN > 0 {
				fv = append(fv, w.k[i].fairSum/float64(w.k[i].fairN))
				fw = append(fw, weights[j])
			}
			if m.shift > 0 {
				if w.k[i].conv >= 0 {
					cv = append(cv, float64(w.k[i].conv)/1e6)
					cw = append(cw, weights[j])
				} else {
					wr.NotConverged++
				}
			}
		}
		wr.Fairness = summarize(fv, fw)
		wr.Convergence = summarize(cv, cw)
		res.Windows = append(res.Windows, wr)
	}
	for j, i := range keys {
		rate := 1e6 / float64(r.keys[i].budget.IntervalMicros())
		vals[j] = float64(m.k[i].nonconf) / (rate * measured)
	}
	res.OABudget = summarize(vals, weights)
	if m.totalRequests > 0 {
		res.Disagreement = float64(m.totalDis) / float64(m.totalRequests)
	}
	kr := float64(len(r.keys)*len(r.regions)) * float64(r.end) / 1e6
	res.Messages = float64(r.dec.Reports+r.dec.Tables+r.dec.Acks) / kr
	res.Bytes = float64(r.dec.ReportBytes+r.dec.TableBytes+r.dec.AckBytes) / kr
	w1 := m.wins[0]
	for i := range r.keys {
		k := &r.keys[i]
		res.Keys = append(res.Keys, KeyResult{Key: k.name, Budget: k.budget.String(), IntervalMicros: k.budget.IntervalMicros(),
			Burst: k.budget.Burst(), Offered: m.k[i].offered,
			OracleAdmitted: m.k[i].oracle, Admitted: m.k[i].admitted,
			OA1s:     float64(w1.k[i].over) / float64(max(w1.k[i].star, 1)),
			UA1s:     float64(w1.k[i].under) / float64(max(w1.k[i].star, 1)),
			OABudget: float64(m.k[i].nonconf) / (1e6 / float64(k.budget.IntervalMicros()) * measured)})
	}
	for _, i := range m.top {
		s := m.series[i]
		res.Top = append(res.Top, TopKey{Key: r.keys[i].name, Rate: 1e6 / float64(r.keys[i].budget.IntervalMicros()),
			Offered: s.Offered, Admitted: s.Admitted, Oracle: s.Oracle, Shares: s.Shares})
	}
	return res
}
