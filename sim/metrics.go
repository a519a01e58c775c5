package sim

import (
	"math"
	"slices"
	"sort"
	"time"

	"github.com/meridian-quota/meridian/gcra"
)

// windowSizes are the metric windows of ARCHITECTURE.md, µs.
var windowSizes = []int64{1_000_000, 10_000_000}

// metrics accumulates the yardstick as the run streams: per key and
// window size, the current window's counts, folded into per-key sums when
// the window closes. Memory is per key (and per key and region), never per
// request or per window — except the series of the few top keys kept for
// charts. Each key's counters sit together (one struct per key, one per key
// and window), so recording a request touches a few cache lines.
type metrics struct {
	yardstick
	wins []*winMetrics

	k                       []keyM
	totalRequests, totalDis int64

	top    []int // keys whose 1 s series are kept
	series map[int]*keySeries

	// onRecord, if set, sees every decision record is given (a test hook).
	onRecord func(i, ri int, cost int64, allowed, oracle bool, t int64)
}

// yardstick is what the metrics know of the keys and the run: nothing of
// how the decisions were made, so that a simulated run and a Scorer share
// them.
type yardstick struct {
	names   []string     // key names, most popular first
	budgets []gcra.Limit // each key's global budget
	regions int
	warmup  int64 // µs: decisions before count toward windows, not totals
	shift   int64 // µs: convergence is measured from here (0: none)
	end     int64 // µs: the end of the run
}

// keyM is one key's totals over the measured part of the run.
type keyM struct {
	offered, admitted, oracle int64 // cost units
	meterTAT, nonconf         int64 // OA_budget's conformance meter
	// stepCredit (meter µs) is what forward clock steps of the regions in
	// stepRegions handed the key's stores and the meter has not yet used,
	// usable until stepUntil (µs), which each of their admits moves to
	// stepHold after it: see Run.creditClockStep.
	stepCredit, stepUntil, stepHold int64
	stepRegions                     uint64
	disagree, requests              int64 // requests decided otherwise than the oracle; requests
}

// keySeries is one top key's per-second series.
type keySeries struct {
	Offered, Admitted, Oracle []int64
	Shares                    [][]float64 // per region, per second: the part of the budget in force
}

// winKey is one key's state for one window size.
type winKey struct {
	a, as, off        int64   // the open window: admitted, oracle-admitted, offered
	over, under, star int64   // Σ_w (A−A*)⁺, Σ_w (A*−A)⁺, Σ_w A*
	peak              float64 // max_w A(w) / (rate·|w| + burst)
	fairSum           float64 // Σ spread over over-budget windows
	fairN             int64
	runStart, conv    int64 // convergence: start of the current within-5 % run; converged time (−1: not yet)
	runLen            int64
	mark              bool
}

// winMetrics is one window size.
type winMetrics struct {
	size    int64
	cur     int64 // index of the open window
	k       []winKey
	ar, asr []int64 // per key·regions+region: the open window's admitted and oracle-admitted
	touched []int32
}

func newMetrics(y yardstick) *metrics {
	n, R := len(y.budgets), y.regions
	m := &metrics{yardstick: y, k: make([]keyM, n), series: map[int]*keySeries{}}
	for _, size := range windowSizes {
		w := &winMetrics{size: size, k: make([]winKey, n), ar: make([]int64, n*R), asr: make([]int64, n*R)}
		for i := range w.k {
			w.k[i].conv, w.k[i].runStart = -1, -1
		}
		m.wins = append(m.wins, w)
	}
	// Keys are ranked by popularity: the first few are the top keys.
	for i := 0; i < min(n, 5); i++ {
		m.top = append(m.top, i)
		// One entry per second of the run, and none after it: a series
		// with a trailing second past the end dropped every chart to 0
		// at its last point.
		secs := int((y.end + 999_999) / 1_000_000)
		ks := &keySeries{Offered: make([]int64, secs), Admitted: make([]int64, secs), Oracle: make([]int64, secs)}
		for range R {
			ks.Shares = append(ks.Shares, make([]float64, secs))
		}
		m.series[i] = ks
	}
	return m
}

// advance closes every window that ended by t.
func (m *metrics) advance(t int64) {
	for _, w := range m.wins {
		if idx := t / w.size; idx > w.cur {
			m.flush(w)
			w.cur = idx
		}
	}
}

// record adds one decided request of key i in region ri at t.
func (m *metrics) record(i, ri int, cost int64, allowed, oracle bool, t int64) {
	if m.onRecord != nil {
		m.onRecord(i, ri, cost, allowed, oracle, t)
	}
	m.offer(i, cost, allowed != oracle, t)
	if allowed {
		m.served(i, ri, cost, false, t)
	}
	if oracle {
		m.served(i, ri, cost, true, t)
	}
}

// offer counts one request of key i offered at t; disagree says whether
// the system decided it otherwise than the oracle.
func (m *metrics) offer(i int, cost int64, disagree bool, t int64) {
	if i < len(m.top) {
		if s := m.series[i]; s != nil {
			s.Offered[t/1_000_000] += cost
		}
	}
	for _, w := range m.wins {
		wk := &w.k[i]
		if !wk.mark {
			wk.mark = true
			w.touched = append(w.touched, int32(i))
		}
		wk.off += cost
	}
	if t < m.warmup {
		return
	}
	km := &m.k[i]
	km.requests++
	m.totalRequests++
	km.offered += cost
	if disagree {
		km.disagree++
		m.totalDis++
	}
}

// served counts cost of key i served in region ri at t: by the system, or
// by the oracle when oracle is set. A decision is served when decided; a
// reservation when its wait ends.
func (m *metrics) served(i, ri int, cost int64, oracle bool, t int64) {
	if i < len(m.top) {
		if s := m.series[i]; s != nil {
			sec := t / 1_000_000
			if oracle {
				s.Oracle[sec] += cost
			} else {
				s.Admitted[sec] += cost
			}
		}
	}
	for _, w := range m.wins {
		wk := &w.k[i]
		if !wk.mark {
			wk.mark = true
			w.touched = append(w.touched, int32(i))
		}
		if oracle {
			wk.as += cost
			w.asr[i*m.regions+ri] += cost
		} else {
			wk.a += cost
			w.ar[i*m.regions+ri] += cost
		}
	}
	if t < m.warmup {
		return
	}
	km := &m.k[i]
	if oracle {
		km.oracle += cost
		return
	}
	km.admitted += cost
	// OA_budget: the admitted stream through GCRA(rate, burst) as a
	// conformance meter; non-conforming admits do not advance it.
	next, res, err := gcra.Allow(m.budgets[i], km.meterTAT, t, cost)
	if km.stepCredit > 0 && t > km.stepUntil {
		km.stepCredit = 0
	}
	if (err != nil || !res.Allowed) && km.stepCredit > 0 {
		// A clock step's refill, banked: the store kept it in its state
		// while the meter may have rested since (creditClockStep).
		km.meterTAT = max(0, km.meterTAT-km.stepCredit)
		km.stepCredit = 0
		next, res, err = gcra.Allow(m.budgets[i], km.meterTAT, t, cost)
	}
	if km.stepCredit > 0 && ri < 64 && km.stepRegions&(1<<ri) != 0 {
		km.stepUntil = max(km.stepUntil, t+km.stepHold) // its store has not rested
	}
	if err == nil && res.Allowed {
		km.meterTAT = next
	} else {
		km.nonconf += cost
	}
}

// flush folds the open window of w into the per-key sums.
func (m *metrics) flush(w *winMetrics) {
	start := w.cur * w.size
	measured := start >= m.warmup
	for _, i32 := range w.touched {
		i := int(i32)
		wk := &w.k[i]
		a, as := wk.a, wk.as
		if measured {
			wk.over += max(a-as, 0)
			wk.under += max(as-a, 0)
			wk.star += as
			b := &m.budgets[i]
			capacity := float64(w.size)/float64(b.IntervalMicros()) + float64(b.Burst())
			wk.peak = max(wk.peak, float64(a)/capacity)
			if wk.off > as { // the oracle denied some: the key is over budget
				lo, hi, any := math.Inf(1), math.Inf(-1), false
				for r := range m.regions {
					if s := w.asr[i*m.regions+r]; s > 0 {
						x := float64(w.ar[i*m.regions+r]) / float64(s)
						lo, hi, any = min(lo, x), max(hi, x), true
					}
				}
				if any {
					wk.fairSum += hi - lo
					wk.fairN++
				}
			}
			if m.shift > 0 && start >= m.shift && wk.conv < 0 {
				within := math.Abs(float64(a-as)) <= 0.05*float64(as)
				switch {
				case !within:
					wk.runLen = 0
				case wk.runLen == 0:
					wk.runStart, wk.runLen = start, 1
				default:
					wk.runLen++
				}
				if wk.runLen >= 5 {
					wk.conv = wk.runStart - m.shift
				}
			}
		}
		wk.a, wk.as, wk.off = 0, 0, 0
		clear(w.ar[i*m.regions : (i+1)*m.regions])
		clear(w.asr[i*m.regions : (i+1)*m.regions])
		wk.mark = false
	}
	w.touched = w.touched[:0]
}

// share records the part of top key i's budget region ri runs at, at t
// (one value per second; a key outside the top keys is not kept).
func (m *metrics) share(i, ri int, part float64, t int64) {
	s := m.series[i]
	if s == nil || t < 0 {
		return
	}
	if sec := t / 1_000_000; sec < int64(len(s.Shares[ri])) {
		s.Shares[ri][sec] = part
	}
}

// fill writes the metrics' part of a Result: the totals, the windows,
// OA_budget, disagreement, per-key totals and the top keys' series. The
// windows must have been closed (advance to end) first.
func (m *metrics) fill(res *Result) {
	measured := float64(m.end-m.warmup) / 1e6
	// Keys the oracle never admits are excluded.
	var keys []int
	var weights []float64
	for i := range m.k {
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
	if m.shift > 0 {
		res.Convergence = m.convergence(keys, weights, measured)
	}
	for j, i := range keys {
		rate := 1e6 / float64(m.budgets[i].IntervalMicros())
		vals[j] = float64(m.k[i].nonconf) / (rate * measured)
	}
	res.OABudget = summarize(vals, weights)
	if m.totalRequests > 0 {
		res.Disagreement = float64(m.totalDis) / float64(m.totalRequests)
	}
	w1 := m.wins[0]
	for i := range m.k {
		b := m.budgets[i]
		res.Keys = append(res.Keys, KeyResult{Key: m.names[i], Budget: b.String(), IntervalMicros: b.IntervalMicros(),
			Burst: b.Burst(), Offered: m.k[i].offered,
			OracleAdmitted: m.k[i].oracle, Admitted: m.k[i].admitted,
			OA1s:     float64(w1.k[i].over) / float64(max(w1.k[i].star, 1)),
			UA1s:     float64(w1.k[i].under) / float64(max(w1.k[i].star, 1)),
			OABudget: float64(m.k[i].nonconf) / (1e6 / float64(b.IntervalMicros()) * measured)})
	}
	for _, i := range m.top {
		s := m.series[i]
		res.Top = append(res.Top, TopKey{Key: m.names[i], Rate: 1e6 / float64(m.budgets[i].IntervalMicros()),
			Offered: s.Offered, Admitted: s.Admitted, Oracle: s.Oracle, Shares: s.Shares})
	}
}

// convergence is the run's Convergence over keys (weights: their
// offered cost): each key in 1 s windows when the oracle admitted it at
// hotRate or more over the measured seconds, else in 10 s windows.
func (m *metrics) convergence(keys []int, weights []float64, measured float64) Convergence {
	var c Convergence
	var all, hot, cv, cw []float64
	// Windows that close after the shift, per window size: a key whose
	// size has fewer than the 5 the rule needs cannot converge in this
	// run, whatever the system does.
	fits := func(w *winMetrics) bool { return m.end/w.size-(m.shift+w.size-1)/w.size >= 5 }
	for j, i := range keys {
		w, isHot := m.wins[1], float64(m.k[i].oracle) >= hotRate*measured
		if isHot {
			w = m.wins[0]
		}
		if !fits(w) {
			c.Unmeasurable++
			continue
		}
		if isHot {
			c.HotKeys++
		}
		c.Keys++
		conv := w.k[i].conv
		if conv < 0 {
			c.Never++
			if isHot {
				c.HotNever++
			}
			continue
		}
		s := float64(conv) / 1e6
		all, cv, cw = append(all, s), append(cv, s), append(cw, weights[j])
		if isHot {
			hot = append(hot, s)
		}
	}
	slices.Sort(all)
	slices.Sort(hot)
	c.Median, c.MedianNever = median(all, c.Keys)
	c.HotMedian, c.HotMedianNever = median(hot, c.HotKeys)
	c.Converged = summarize(cv, cw)
	return c
}

// Summary is a metric across keys: the demand-weighted mean (weights are
// offered cost), p50, p99 and max.
type Summary struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
	Keys int     `json:"keys"`
}

func summarize(vals, weights []float64) Summary {
	if len(vals) == 0 {
		return Summary{}
	}
	ws, sw := 0.0, 0.0
	for i, v := range vals {
		ws += v * weights[i]
		sw += weights[i]
	}
	sorted := slices.Clone(vals)
	sort.Float64s(sorted)
	q := func(p float64) float64 {
		idx := int(math.Ceil(p*float64(len(sorted)))) - 1
		return sorted[max(0, min(idx, len(sorted)-1))]
	}
	s := Summary{P50: q(0.5), P99: q(0.99), Max: sorted[len(sorted)-1], Keys: len(vals)}
	if sw > 0 {
		s.Mean = ws / sw
	}
	return s
}
