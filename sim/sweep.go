package sim

import (
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// Options selects what a sweep runs. Zero fields take the scenario's.
type Options struct {
	Strategies []string
	Intervals  []time.Duration
	Seeds      []uint64
	// Workers runs this many simulations at once (0: GOMAXPROCS). The
	// results do not depend on it.
	Workers int
	// Progress, if set, is called after each run with the runs done and
	// the total (from the worker goroutines, serialized).
	Progress func(done, total int)
	// Stop, when closed, starts no further run: Sweep returns ErrStopped
	// once the runs under way finish (a CLI closes it on SIGINT/SIGTERM).
	Stop <-chan struct{}
	// KeyDetail keeps every key's totals in the results (large for many keys).
	KeyDetail bool
	// Trace replays a validated trace instead of the scenario's workload.
	Trace *Trace
	// TimeTables fills each Result's TableTimes (Run.TimeTables).
	TimeTables bool
}

// Report is a sweep: every run, and per strategy × interval the metrics
// across seeds (mean and 95 % interval), with a recommendation.
type Report struct {
	Scenario       string `json:"scenario"`
	Description    string `json:"description,omitempty"`
	Cells          []Cell `json:"cells"`
	Recommendation string `json:"recommendation"`
	// Shift is the scenario's scripted shift (0: none, and no convergence).
	Shift Duration `json:"shift"`
	// Regions are the scenario's regions, in its order (a run's share
	// series are in this order); Warmup the part excluded from metrics.
	Regions []string  `json:"regions"`
	Warmup  Duration  `json:"warmup"`
	Bounds  string    `json:"bounds"`
	Runs    []*Result `json:"runs"`
}

// Stat is a metric's mean across seeds and the half-width of its 95 %
// confidence interval (Student's t; 0 with one seed).
type Stat struct {
	Mean float64 `json:"mean"`
	CI95 float64 `json:"ci95"`
}

// Cell is one strategy at one interval, across seeds. Per-key metrics are
// their demand-weighted mean across keys (P is the p99 across keys).
type Cell struct {
	Strategy string   `json:"strategy"`
	Interval Duration `json:"interval"`
	Seeds    int      `json:"seeds"`
	UA1s     Stat     `json:"ua_1s"`
	OA1s     Stat     `json:"oa_1s"`
	UA10s    Stat     `json:"ua_10s"`
	OA10s    Stat     `json:"oa_10s"`
	OABudget Stat     `json:"oa_budget"`
	PeakP99  Stat     `json:"peak_1s_p99"`
	Fairness Stat     `json:"fairness_1s"`
	// Convergence is the median across keys (Result.Convergence) over the
	// seeds whose median is a time; ConvergenceNever counts the seeds
	// whose median is "never", and NeverKeys the keys per seed that never
	// converged out of ConvergenceKeys. Hot* are the same over the keys
	// the oracle admits at 400/s or more.
	// ConvergenceRuns and HotRuns count the seeds that measured a key at
	// all (a key whose windows do not fit 5 times after the shift is not
	// measurable: Convergence.Unmeasurable); without any there is no
	// convergence to show.
	Convergence      Stat `json:"convergence_s"`
	ConvergenceNever int  `json:"convergence_never_seeds"`
	ConvergenceRuns  int  `json:"convergence_seeds"`
	NeverKeys        Stat `json:"never_converged_keys"`
	ConvergenceKeys  int  `json:"convergence_keys"`
	HotConvergence   Stat `json:"hot_convergence_s"`
	HotNever         int  `json:"hot_convergence_never_seeds"`
	HotRuns          int  `json:"hot_convergence_seeds"`
	Disagreement     Stat `json:"disagreement"`
	Messages         Stat `json:"messages_per_key_region_s"`
	Bytes            Stat `json:"bytes_per_key_region_s"`
}

// The recommendation's bounds: budget over-admission and peak.
const (
	maxOABudget = 0.01
	maxPeak     = 1.10
)

// Sweep runs sc for every strategy × interval × seed and summarizes.
func Sweep(sc *Scenario, opt Options) (*Report, error) {
	strategies := opt.Strategies
	if len(strategies) == 0 {
		strategies = sc.Strategies
	}
	intervals := opt.Intervals
	if len(intervals) == 0 {
		for _, iv := range sc.Intervals {
			intervals = append(intervals, iv.D())
		}
	}
	seeds := opt.Seeds
	if len(seeds) == 0 {
		seeds = sc.Seeds
	}
	type job struct {
		strategy string
		interval time.Duration
		seed     uint64
	}
	var jobs []job
	for _, st := range strategies {
		for _, iv := range intervals {
			for _, seed := range seeds {
				jobs = append(jobs, job{st, iv, seed})
			}
		}
	}
	// Validate every combination before simulating anything.
	for _, j := range jobs {
		c := *sc
		c.Strategies = []string{j.strategy}
		c.Intervals = []Duration{Duration(j.interval)}
		if err := c.Validate(); err != nil {
			return nil, err
		}
	}
	results := make([]*Result, len(jobs))
	errs := make([]error, len(jobs))
	workers := opt.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		next int
		done int
	)
	for range min(workers, len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if stopped(opt.Stop) {
					return
				}
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= len(jobs) {
					return
				}
				j := jobs[i]
				r, err := NewRun(sc, j.strategy, j.interval, j.seed, opt.Trace)
				if err == nil {
					if opt.TimeTables {
						r.TimeTables()
					}
					results[i], err = r.Simulate()
				}
				if err == nil && !opt.KeyDetail {
					results[i].Keys = nil
				}
				errs[i] = err
				mu.Lock()
				done++
				if opt.Progress != nil {
					opt.Progress(done, len(jobs))
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if stopped(opt.Stop) && done < len(jobs) {
		return nil, fmt.Errorf("%w after %d of %d runs", ErrStopped, done, len(jobs))
	}
	for i, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("sim: %s %s seed %d: %w", jobs[i].strategy, jobs[i].interval, jobs[i].seed, err)
		}
	}
	var regions []string
	for _, rg := range sc.Regions {
		regions = append(regions, rg.Name)
	}
	rep := &Report{Scenario: sc.Name, Description: strings.TrimSpace(sc.Description), Runs: results, Shift: sc.Shift,
		Regions: regions, Warmup: sc.Warmup,
		Bounds: fmt.Sprintf("OA_budget ≤ %.0f%% and P(1s, p99 across keys) ≤ %.2f", maxOABudget*100, maxPeak)}
	per := len(seeds)
	for c := 0; c < len(jobs); c += per {
		rs := results[c : c+per]
		cell := Cell{Strategy: jobs[c].strategy, Interval: Duration(jobs[c].interval), Seeds: per}
		cell.UA1s = stat(rs, func(r *Result) float64 { return r.Windows[0].UA.Mean })
		cell.OA1s = stat(rs, func(r *Result) float64 { return r.Windows[0].OA.Mean })
		cell.UA10s = stat(rs, func(r *Result) float64 { return r.Windows[1].UA.Mean })
		cell.OA10s = stat(rs, func(r *Result) float64 { return r.Windows[1].OA.Mean })
		cell.OABudget = stat(rs, func(r *Result) float64 { return r.OABudget.Mean })
		cell.PeakP99 = stat(rs, func(r *Result) float64 { return r.Windows[0].Peak.P99 })
		cell.Fairness = stat(rs, func(r *Result) float64 { return r.Windows[0].Fairness.Mean })
		cell.Convergence, cell.ConvergenceNever, cell.ConvergenceRuns = medianStat(rs, func(c *Convergence) (float64, bool, int) { return c.Median, c.MedianNever, c.Keys })
		cell.HotConvergence, cell.HotNever, cell.HotRuns = medianStat(rs, func(c *Convergence) (float64, bool, int) { return c.HotMedian, c.HotMedianNever, c.HotKeys })
		cell.NeverKeys = stat(rs, func(r *Result) float64 { return float64(r.Convergence.Never) })
		for _, r := range rs {
			cell.ConvergenceKeys = max(cell.ConvergenceKeys, r.Convergence.Keys)
		}
		cell.Disagreement = stat(rs, func(r *Result) float64 { return r.Disagreement })
		cell.Messages = stat(rs, func(r *Result) float64 { return r.Messages })
		cell.Bytes = stat(rs, func(r *Result) float64 { return r.Bytes })
		rep.Cells = append(rep.Cells, cell)
	}
	rep.Recommendation = recommend(rep.Cells)
	return rep, nil
}

// tCrit is Student's t at 97.5 % for n−1 degrees of freedom (n ≥ 2).
func tCrit(n int) float64 {
	table := []float64{0, 12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
		2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086}
	if df := n - 1; df < len(table) {
		return table[df]
	}
	return 1.96
}

func stat(rs []*Result, f func(*Result) float64) Stat {
	n := float64(len(rs))
	sum := 0.0
	for _, r := range rs {
		sum += f(r)
	}
	mean := sum / n
	if len(rs) < 2 {
		return Stat{Mean: mean}
	}
	ss := 0.0
	for _, r := range rs {
		d := f(r) - mean
		ss += d * d
	}
	sd := math.Sqrt(ss / (n - 1))
	return Stat{Mean: mean, CI95: tCrit(len(rs)) * sd / math.Sqrt(n)}
}

// medianStat is stat over the runs whose convergence median f gives is a
// time, how many runs' median is "never", and how many runs measured a key
// at all (f's third value: the keys measured; a run with none has no
// median and counts in neither).
func medianStat(rs []*Result, f func(*Convergence) (float64, bool, int)) (s Stat, never, runs int) {
	var timed []*Result
	for _, r := range rs {
		_, nv, keys := f(&r.Convergence)
		switch {
		case keys == 0:
			continue
		case nv:
			never++
		default:
			timed = append(timed, r)
		}
		runs++
	}
	if len(timed) == 0 {
		return Stat{}, never, runs
	}
	return stat(timed, func(r *Result) float64 { m, _, _ := f(&r.Convergence); return m }), never, runs
}

// recommend picks, among Meridian's strategies (not the baselines), the
// cell with the lowest UA(1s) among those within the bounds (ties: fewer
// messages).
func recommend(cells []Cell) string {
	best := -1
	for i, c := range cells {
		if c.Strategy == ReplicatedCounter || c.Strategy == Oracle || c.Strategy == "full" {
			continue
		}
		if c.OABudget.Mean > maxOABudget || c.PeakP99.Mean > maxPeak {
			continue
		}
		if best < 0 || c.UA1s.Mean < cells[best].UA1s.Mean ||
			(c.UA1s.Mean == cells[best].UA1s.Mean && c.Messages.Mean < cells[best].Messages.Mean) {
			best = i
		}
	}
	if best < 0 {
		return fmt.Sprintf("no Meridian strategy stays within OA_budget ≤ %.0f%% and P ≤ %.2f here", maxOABudget*100, maxPeak)
	}
	c := cells[best]
	return fmt.Sprintf("use %s at %s: lowest UA(1s) %.1f%% with OA_budget %.2f%% and P %.2f", c.Strategy, c.Interval.D(),
		100*c.UA1s.Mean, 100*c.OABudget.Mean, c.PeakP99.Mean)
}

func pct(s Stat) string {
	if s.CI95 == 0 {
		return fmt.Sprintf("%.1f%%", 100*s.Mean)
	}
	return fmt.Sprintf("%.1f±%.1f%%", 100*s.Mean, 100*s.CI95)
}

func num(s Stat, prec int) string {
	if s.CI95 == 0 {
		return strconv.FormatFloat(s.Mean, 'f', prec, 64)
	}
	return strconv.FormatFloat(s.Mean, 'f', prec, 64) + "±" + strconv.FormatFloat(s.CI95, 'f', prec, 64)
}

// conv is a cell's convergence for display: "-" without a scripted
// shift, "never" when the median key never converged (in every seed),
// and the keys that never did, when some did not (a mean over seeds).
func (rep *Report) conv(c Cell) string {
	if rep.Shift == 0 {
		return "-"
	}
	if c.ConvergenceRuns == 0 {
		return "- (no key measurable)"
	}
	s := num(c.Convergence, 1)
	switch {
	case c.ConvergenceNever == c.ConvergenceRuns:
		s = "never"
	case c.ConvergenceNever > 0:
		s += fmt.Sprintf(", never in %d/%d seeds", c.ConvergenceNever, c.ConvergenceRuns)
	}
	if c.NeverKeys.Mean > 0 {
		s += fmt.Sprintf(" (%s/%d keys never)", strconv.FormatFloat(math.Round(10*c.NeverKeys.Mean)/10, 'f', -1, 64), c.ConvergenceKeys)
	}
	return s
}

// WriteTable writes the cells as an aligned table ending with the
// recommendation.
func (rep *Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "scenario %s: %d runs\n", rep.Scenario, len(rep.Runs))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "strategy\tinterval\tUA 1s\tOA 1s\tUA 10s\tOA 10s\tOA_budget\tP 1s p99\tfairness\tconverge s\tdisagree\tmsg/kr/s\tB/kr/s\t")
	for _, c := range rep.Cells {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", c.Strategy, c.Interval.D(),
			pct(c.UA1s), pct(c.OA1s), pct(c.UA10s), pct(c.OA10s), pct(c.OABudget), num(c.PeakP99, 2),
			num(c.Fairness, 2), rep.conv(c), pct(c.Disagreement), num(c.Messages, 3), num(c.Bytes, 1))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "recommendation (%s): %s\n", rep.Bounds, rep.Recommendation)
	return err
}

// WriteMarkdown writes the cells as the README's strategy tables do: a
// heading with the recommendation, then one row per strategy with its UA
// (1 s windows) and OA_budget at every interval of the sweep, and at the
// middle interval (the sweep's only one, or 2 s of 1 s, 2 s and 5 s) its
// peak ratio p99, control messages and bytes per key·region·s and, with a
// scripted shift, its convergence.
func (rep *Report) WriteMarkdown(w io.Writer) error {
	var ivs []Duration
	var strats []string
	at := map[string]map[Duration]Cell{}
	for _, c := range rep.Cells {
		if !slices.Contains(ivs, c.Interval) {
			ivs = append(ivs, c.Interval)
		}
		if at[c.Strategy] == nil {
			strats = append(strats, c.Strategy)
			at[c.Strategy] = map[Duration]Cell{}
		}
		at[c.Strategy][c.Interval] = c
	}
	slices.Sort(ivs)
	if len(ivs) == 0 {
		_, err := fmt.Fprintf(w, "**%s** — no cells\n", rep.Scenario)
		return err
	}
	mid := ivs[(len(ivs)-1)/2]
	var b strings.Builder
	fmt.Fprintf(&b, "**%s** — %s\n\n", rep.Scenario, rep.Recommendation)
	head := func(what string) {
		for i, iv := range ivs {
			if i == 0 {
				fmt.Fprintf(&b, " | %s: Δ=%s", what, iv.D())
			} else {
				fmt.Fprintf(&b, " | %s", iv.D())
			}
		}
	}
	b.WriteString("| strategy")
	head("UA 1s")
	head("OA_budget")
	fmt.Fprintf(&b, " | P p99 (%[1]s) | msg/key·region/s (%[1]s) | B/key·region/s (%[1]s)", mid.D())
	cols := 1 + 2*len(ivs) + 3
	if rep.Shift != 0 {
		fmt.Fprintf(&b, " | converge s (%s)", mid.D())
		cols++
	}
	b.WriteString(" |\n|" + strings.Repeat(" --- |", cols) + "\n")
	for _, st := range strats {
		row := at[st]
		b.WriteString("| " + st)
		for _, f := range []func(Cell) Stat{func(c Cell) Stat { return c.UA1s }, func(c Cell) Stat { return c.OABudget }} {
			for _, iv := range ivs {
				if c, ok := row[iv]; ok {
					fmt.Fprintf(&b, " | %.1f%%", 100*f(c).Mean)
				} else {
					b.WriteString(" | -")
				}
			}
		}
		if c, ok := row[mid]; ok {
			fmt.Fprintf(&b, " | %.2f | %.3f | %.1f", c.PeakP99.Mean, c.Messages.Mean, c.Bytes.Mean)
			if rep.Shift != 0 {
				b.WriteString(" | " + rep.conv(c))
			}
		} else {
			b.WriteString(strings.Repeat(" | -", cols-1-2*len(ivs)))
		}
		b.WriteString(" |\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON writes the whole report, indented; byte-identical for the same
// scenario, options and seeds.
func (rep *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// WriteCSV writes one row per cell.
func (rep *Report) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	head := []string{"scenario", "strategy", "interval_s", "seeds"}
	for _, n := range []string{"ua_1s", "oa_1s", "ua_10s", "oa_10s", "oa_budget", "peak_1s_p99", "fairness_1s",
		"convergence_s", "disagreement", "messages_per_key_region_s", "bytes_per_key_region_s",
		"never_converged_keys", "hot_convergence_s"} {
		head = append(head, n, n+"_ci95")
	}
	head = append(head, "convergence_keys", "convergence_seeds", "convergence_never_seeds", "hot_convergence_seeds", "hot_convergence_never_seeds")
	if err := cw.Write(head); err != nil {
		return err
	}
	f := func(x float64) string { return strconv.FormatFloat(x, 'g', 6, 64) }
	for _, c := range rep.Cells {
		row := []string{rep.Scenario, c.Strategy, f(c.Interval.D().Seconds()), strconv.Itoa(c.Seeds)}
		for _, s := range []Stat{c.UA1s, c.OA1s, c.UA10s, c.OA10s, c.OABudget, c.PeakP99, c.Fairness, c.Convergence,
			c.Disagreement, c.Messages, c.Bytes, c.NeverKeys, c.HotConvergence} {
			row = append(row, f(s.Mean), f(s.CI95))
		}
		row = append(row, strconv.Itoa(c.ConvergenceKeys), strconv.Itoa(c.ConvergenceRuns), strconv.Itoa(c.ConvergenceNever),
			strconv.Itoa(c.HotRuns), strconv.Itoa(c.HotNever))
		if err := cw.Write(row); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// ErrStopped is returned by Sweep and Explore when their Stop channel was
// closed before every run was done.
var ErrStopped = errors.New("sim: stopped")

func stopped(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}
