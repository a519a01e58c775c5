package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"text/tabwriter"
	"time"
)

// Target is one system under test.
type Target struct {
	// Name identifies the target in reports.
	Name string
	// Decide decides one request for key (in [0, Config.Keys)). A denial is
	// allowed == false; an error means the call failed. It must be safe for
	// concurrent use.
	Decide func(ctx context.Context, key int) (allowed bool, err error)
	// Close releases what the target holds. It may be nil.
	Close func()
}

// Config configures Run. DefaultConfig documents each default.
type Config struct {
	// Callers is the number of concurrent closed-loop callers.
	Callers int
	// Duration is how long the measured part of the run lasts.
	Duration time.Duration
	// Keys is the size of the key space; keys are drawn uniformly from
	// [0, Keys).
	Keys int
	// Seed seeds every caller's key sequence.
	Seed uint64
	// Warmup is run before the measurement and discarded (0 for none).
	Warmup time.Duration
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Callers:  8,               // enough to show batching without swamping a small machine
		Duration: 5 * time.Second, // long enough for p99 to settle at tens of thousands of decisions/s
		Keys:     10_000,          // many tenants: few callers ever share a key
		Seed:     1,               // fixed, so two runs offer the same key sequences
		Warmup:   time.Second,     // connections dialled, scripts loaded, pools and caches warm
	}
}

// maxCallers bounds Config.Callers so a typo cannot start a million
// goroutines.
const maxCallers = 100_000

// Validate reports every problem with c.
func (c Config) Validate() error {
	var errs []error
	if c.Callers < 1 || c.Callers > maxCallers {
		errs = append(errs, fmt.Errorf("loadgen: Callers %d: must be in [1, %d]", c.Callers, maxCallers))
	}
	if c.Duration <= 0 {
		errs = append(errs, fmt.Errorf("loadgen: Duration %s: must be positive", c.Duration))
	}
	if c.Keys < 1 {
		errs = append(errs, fmt.Errorf("loadgen: Keys %d: must be at least 1", c.Keys))
	}
	if c.Warmup < 0 {
		errs = append(errs, fmt.Errorf("loadgen: Warmup %s: must not be negative", c.Warmup))
	}
	return errors.Join(errs...)
}

// Report is the outcome of one Run.
type Report struct {
	Target  string // Target.Name
	Callers int    // Config.Callers

	Decisions int64 // counted calls that returned a decision
	Allowed   int64 // of Decisions, how many were allowed
	Errors    int64 // counted calls that returned an error

	// Elapsed runs from the end of the warm-up to the end of the last
	// counted call.
	Elapsed time.Duration
	// PerSecond is Decisions / Elapsed.
	PerSecond float64
	// P50 and P99 are nearest-rank percentiles of the decisions' latencies
	// (estimated from a uniform sample beyond 2,097,152 decisions); Max is
	// exact. All are zero when there were no decisions.
	P50, P99, Max time.Duration
	// AllowedFraction is Allowed / Decisions (0 when there were none).
	AllowedFraction float64

	// Err is the first error Decide returned, set only when errors exceed
	// 1 % of the counted calls.
	Err error

	samples []time.Duration // the latency sample, sorted, for Merge
}

// maxSamples is the most latency samples one Run keeps (16 MiB).
const maxSamples = 1 << 21

// options are the parts of a run that tests replace.
type options struct {
	now        func() time.Duration // monotonic time since the run began
	maxSamples int
}

// Run drives target with cfg.Callers closed-loop callers for cfg.Warmup plus
// cfg.Duration and reports on the measured part. See the package
// documentation for what is counted and how percentiles are computed.
func Run(ctx context.Context, cfg Config, target Target) (Report, error) {
	start := time.Now()
	return run(ctx, cfg, target, options{
		now:        func() time.Duration { return time.Since(start) },
		maxSamples: maxSamples,
	})
}

// worker is one caller's tally.
type worker struct {
	decisions, allowed, errors int64
	firstErr                   error
	lastEnd                    time.Duration // end of the last counted call
	max                        time.Duration
	samples                    []time.Duration
	seen                       int64 // samples offered, for the reservoir
}

func run(ctx context.Context, cfg Config, target Target, opt options) (Report, error) {
	if err := cfg.Validate(); err != nil {
		return Report{}, err
	}
	if target.Decide == nil {
		return Report{}, errors.New("loadgen: Target.Decide is nil")
	}
	perWorker := max(opt.maxSamples/cfg.Callers, 1)
	ws := make([]worker, cfg.Callers)
	for i := range ws {
		ws[i].samples = make([]time.Duration, 0, perWorker)
	}
	warmAt := opt.now() + cfg.Warmup
	endAt := warmAt + cfg.Duration

	var wg sync.WaitGroup
	for i := range ws {
		wg.Go(func() {
			w := &ws[i]
			keys := rand.New(rand.NewPCG(cfg.Seed, uint64(i)))
			reservoir := rand.New(rand.NewPCG(cfg.Seed, uint64(i)|1<<63))
			for ctx.Err() == nil {
				t0 := opt.now()
				if t0 >= endAt {
					return
				}
				ok, err := target.Decide(ctx, keys.IntN(cfg.Keys))
				t1 := opt.now()
				if t0 < warmAt {
					continue
				}
				if err != nil {
					if ctx.Err() != nil {
						return // the run was cancelled, not the target's fault
					}
					w.errors++
					if w.firstErr == nil {
						w.firstErr = err
					}
					w.lastEnd = t1
					continue
				}
				w.decisions++
				if ok {
					w.allowed++
				}
				w.lastEnd = t1
				d := t1 - t0
				w.max = max(w.max, d)
				w.seen++
				if len(w.samples) < cap(w.samples) {
					w.samples = append(w.samples, d)
				} else if j := reservoir.Int64N(w.seen); j < int64(len(w.samples)) {
					w.samples[j] = d
				}
			}
		})
	}
	wg.Wait()

	r := Report{Target: target.Name, Callers: cfg.Callers}
	var firstErr error
	var lastEnd time.Duration
	n := 0
	for i := range ws {
		w := &ws[i]
		r.Decisions += w.decisions
		r.Allowed += w.allowed
		r.Errors += w.errors
		r.Max = max(r.Max, w.max)
		lastEnd = max(lastEnd, w.lastEnd)
		if firstErr == nil {
			firstErr = w.firstErr
		}
		n += len(w.samples)
	}
	all := make([]time.Duration, 0, n)
	for i := range ws {
		all = append(all, ws[i].samples...)
	}
	slices.Sort(all)
	r.samples = all
	r.P50 = Percentile(all, 0.50)
	r.P99 = Percentile(all, 0.99)
	if lastEnd > warmAt {
		// The window runs to the deadline, or past it to the end of the
		// last call that started before it.
		if ctx.Err() == nil {
			lastEnd = max(lastEnd, endAt)
		}
		r.Elapsed = lastEnd - warmAt
		r.PerSecond = float64(r.Decisions) / r.Elapsed.Seconds()
	}
	if r.Decisions > 0 {
		r.AllowedFraction = float64(r.Allowed) / float64(r.Decisions)
	}
	if err := ctx.Err(); err != nil {
		return r, err
	}
	if r.Errors*100 > r.Decisions+r.Errors {
		r.Err = fmt.Errorf("loadgen: %s: %d of %d calls failed, first: %w", target.Name, r.Errors, r.Decisions+r.Errors, firstErr)
		return r, r.Err
	}
	return r, nil
}

// Merge combines reports of one target at one caller count, measured in
// separate rounds, into one: counts and elapsed time add up, so PerSecond
// is all decisions over all measured time; P50 and P99 come from the
// rounds' latency samples together; Max is the largest; Err is the first
// round's that has one. Merge of no reports is the zero Report.
func Merge(rs ...Report) Report {
	if len(rs) == 0 {
		return Report{}
	}
	out := Report{Target: rs[0].Target, Callers: rs[0].Callers}
	n := 0
	for _, r := range rs {
		out.Decisions += r.Decisions
		out.Allowed += r.Allowed
		out.Errors += r.Errors
		out.Elapsed += r.Elapsed
		out.Max = max(out.Max, r.Max)
		if out.Err == nil {
			out.Err = r.Err
		}
		n += len(r.samples)
	}
	out.samples = make([]time.Duration, 0, n)
	for _, r := range rs {
		out.samples = append(out.samples, r.samples...)
	}
	slices.Sort(out.samples)
	out.P50 = Percentile(out.samples, 0.50)
	out.P99 = Percentile(out.samples, 0.99)
	if out.Elapsed > 0 {
		out.PerSecond = float64(out.Decisions) / out.Elapsed.Seconds()
	}
	if out.Decisions > 0 {
		out.AllowedFraction = float64(out.Allowed) / float64(out.Decisions)
	}
	return out
}

// Rewarm is the warm-up before every round of Interleave after a target's
// first (at most Config.Warmup): connections and caches are already warm,
// but a server that sat idle while the others ran gets a moment to ramp up.
const Rewarm = 200 * time.Millisecond

// Interleave runs the targets in turn, rounds times, each round measuring
// cfg.Duration/rounds, and merges each target's rounds (see Merge). A
// target's first round warms up for cfg.Warmup, later ones for
// min(Rewarm, cfg.Warmup). Alternating in short rounds puts every target
// through the same drift of a shared machine (other tenants, thermal and
// frequency changes), so the ratio between targets is steadier than when
// each runs once for the whole duration. It stops at the first error and
// returns the merged reports of the targets so far with it.
func Interleave(ctx context.Context, cfg Config, rounds int, targets []Target) ([]Report, error) {
	return interleave(ctx, cfg, rounds, targets, Run)
}

// interleave is Interleave with the run of one round replaceable (tests
// run rounds on a fake clock).
func interleave(ctx context.Context, cfg Config, rounds int, targets []Target,
	runRound func(context.Context, Config, Target) (Report, error)) ([]Report, error) {
	if rounds < 1 {
		return nil, fmt.Errorf("loadgen: rounds %d: must be at least 1", rounds)
	}
	per := cfg
	per.Duration = cfg.Duration / time.Duration(rounds)
	if err := per.Validate(); err != nil {
		return nil, err
	}
	got := make([][]Report, len(targets))
	merged := func() []Report {
		out := make([]Report, 0, len(targets))
		for _, rs := range got {
			if len(rs) > 0 {
				out = append(out, Merge(rs...))
			}
		}
		return out
	}
	for round := range rounds {
		if round == 1 {
			per.Warmup = min(Rewarm, cfg.Warmup)
		}
		for i, t := range targets {
			r, err := runRound(ctx, per, t)
			got[i] = append(got[i], r)
			if err != nil {
				return merged(), err
			}
		}
	}
	return merged(), nil
}

// Percentile returns the nearest-rank q-quantile (0 < q ≤ 1) of sorted, an
// ascending slice: the smallest element with at least q·len(sorted)
// elements at or below it. It returns 0 for an empty slice.
func Percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	// ceil(q·n), forgiving the float error of q·n landing just above an
	// integer (0.99·100 must be rank 99, not 100).
	rank := int(math.Ceil(q*float64(len(sorted)) - 1e-9))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// FormatTable writes reports as an aligned table indented by two spaces, one
// row per report in the order given: target, callers, decisions/s, p50, p99, max, allowed
// fraction, errors.
func FormatTable(w io.Writer, reports []Report) error {
	// Numbers align right; the target column is padded to align left.
	width := len("target")
	for _, r := range reports {
		width = max(width, len(r.Target))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-*s\tcallers\tdecisions/s\tp50\tp99\tmax\tallowed\terrors\t\n", width, "target")
	for _, r := range reports {
		fmt.Fprintf(tw, "%-*s\t%d\t%.0f\t%s\t%s\t%s\t%.3f\t%d\t\n",
			width, r.Target, r.Callers, r.PerSecond, FormatLatency(r.P50), FormatLatency(r.P99), FormatLatency(r.Max),
			r.AllowedFraction, r.Errors)
	}
	return tw.Flush()
}

// FormatLatency formats d in µs below a millisecond ("412µs") and in ms
// with two decimals from there on ("1.27ms").
func FormatLatency(d time.Duration) string {
	if d < time.Millisecond {
		return fmt.Sprintf("%dµs", d/time.Microsecond)
	}
	return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
}
