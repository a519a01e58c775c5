package sim

import (
	"math"
	"slices"
	"sort"

	"github.com/meridian-quota/meridian/gcra"
)

// windowSizes are the metric windows of ARCHITECTURE.md, µs.
var windowSizes = []int64{1_000_000, 10_000_000}

// metrics accumulates the yardstick as the run streams: per key and
// window size, the current window's counts, folded into per-key sums when
// the window closes. Memory is per key (and per key and region), never per
// request or per window — except the series of the few top keys kept for
// charts.
type metrics struct {
	r       *Run
	regions int
	warmup  int64
	shift   int64
	wins    []*winMetrics

	// Per key, over the measured part of the run.
	offered, admitted, oracle []int64 // cost units
	meterTAT, nonconf         []int64 // OA_budget's conformance meter
	disagree                  []int64 // requests decided otherwise than the oracle
	requests                  []int64
	totalRequests, totalDis   int64

	top    []int // keys whose 1 s series are kept
	series map[int]*keySeries
}

// keySeries is one top key's per-second series.
type keySeries struct {
	Offered, Admitted, Oracle []int64
	Shares                    [][]float64 // per region, per second: the part of the budget in force
}

// winMetrics is one window size.
type winMetrics struct {
	size    int64
	cur     int64 // index of the open window
	a, as   []int64
	off     []int64
	ar, asr []int64 // per key·regions+region
	touched []int32
	mark    []bool

	over, under, star []int64   // Σ_w (A−A*)⁺, Σ_w (A*−A)⁺, Σ_w A*
	peak              []float64 // max_w A(w) / (rate·|w| + burst)
	fairSum           []float64 // Σ spread over over-budget windows
	fairN             []int64
	runStart, conv    []int64 // convergence: start of the current within-5 % run; converged time (−1: not yet)
	runLen            []int64
}

func newMetrics(r *Run) *metrics {
	n, R := len(r.keys), len(r.regions)
	m := &metrics{r: r, regions: R, warmup: r.warmup, shift: r.sc.Shift.us(),
		offered: make([]int64, n), admitted: make([]int64, n), oracle: make([]int64, n),
		meterTAT: make([]int64, n), nonconf: make([]int64, n), disagree: make([]int64, n),
		requests: make([]int64, n), series: map[int]*keySeries{}}
	for _, size := range windowSizes {
		w := &winMetrics{size: size, a: make([]int64, n), as: make([]int64, n), off: make([]int64, n),
			ar: make([]int64, n*R), asr: make([]int64, n*R), mark: make([]bool, n),
			over: make([]int64, n), under: make([]int64, n), star: make([]int64, n), peak: make([]float64, n),
			fairSum: make([]float64, n), fairN: make([]int64, n),
			runStart: make([]int64, n), conv: make([]int64, n), runLen: make([]int64, n)}
		for i := range w.conv {
			w.conv[i] = -1
			w.runStart[i] = -1
		}
		m.wins = append(m.wins, w)
	}
	// Keys are ranked by popularity: the first few are the top keys.
	for i := 0; i < min(n, 5); i++ {
		m.top = append(m.top, i)
		secs := int(r.end/1_000_000) + 1
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
	if s := m.series[i]; s != nil {
		sec := t / 1_000_000
		s.Offered[sec] += cost
		if allowed {
			s.Admitted[sec] += cost
		}
		if oracle {
			s.Oracle[sec] += cost
		}
	}
	if t < m.warmup {
		return
	}
	m.requests[i]++
	m.totalRequests++
	m.offered[i] += cost
	if allowed != oracle {
		m.disagree[i]++
		m.totalDis++
	}
	if oracle {
		m.oracle[i] += cost
	}
	if allowed {
		m.admitted[i] += cost
		// OA_budget: the admitted stream through GCRA(rate, burst) as a
		// conformance meter; non-conforming admits do not advance it.
		k := &m.r.keys[i]
		if next, res, err := gcra.Allow(k.budget, m.meterTAT[i], t, cost); err == nil && res.Allowed {
			m.meterTAT[i] = next
		} else {
			m.nonconf[i] += cost
		}
	}
	for _, w := range m.wins {
		if !w.mark[i] {
			w.mark[i] = true
			w.touched = append(w.touched, int32(i))
		}
		w.off[i] += cost
		if allowed {
			w.a[i] += cost
			w.ar[i*m.regions+ri] += cost
		}
		if oracle {
			w.as[i] += cost
			w.asr[i*m.regions+ri] += cost
		}
	}
}

// flush folds the open window of w into the per-key sums.
func (m *metrics) flush(w *winMetrics) {
	start := w.cur * w.size
	measured := start >= m.warmup
	for _, i32 := range w.touched {
		i := int(i32)
		a, as := w.a[i], w.as[i]
		if measured {
			w.over[i] += max(a-as, 0)
			w.under[i] += max(as-a, 0)
			w.star[i] += as
			k := &m.r.keys[i]
			capacity := float64(w.size)/float64(k.budget.IntervalMicros()) + float64(k.budget.Burst())
			w.peak[i] = max(w.peak[i], float64(a)/capacity)
			if w.off[i] > as { // the oracle denied some: the key is over budget
				lo, hi, any := math.Inf(1), math.Inf(-1), false
				for r := range m.regions {
					if s := w.asr[i*m.regions+r]; s > 0 {
						x := float64(w.ar[i*m.regions+r]) / float64(s)
						lo, hi, any = min(lo, x), max(hi, x), true
					}
				}
				if any {
					w.fairSum[i] += hi - lo
					w.fairN[i]++
				}
			}
			if m.shift > 0 && start >= m.shift && w.conv[i] < 0 {
				within := math.Abs(float64(a-as)) <= 0.05*float64(as)
				switch {
				case !within:
					w.runLen[i] = 0
				case w.runLen[i] == 0:
					w.runStart[i], w.runLen[i] = start, 1
				default:
					w.runLen[i]++
				}
				if w.runLen[i] >= 5 {
					w.conv[i] = w.runStart[i] - m.shift
				}
			}
		}
		w.a[i], w.as[i], w.off[i] = 0, 0, 0
		clear(w.ar[i*m.regions : (i+1)*m.regions])
		clear(w.asr[i*m.regions : (i+1)*m.regions])
		w.mark[i] = false
	}
	w.touched = w.touched[:0]
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
