package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/meridian-quota/meridian/sim"
)

const simSynopsis = `
Simulate a scenario for every strategy × interval × seed and compare each
with the oracle (one ideal global GCRA), printing an aligned table and a
recommendation. Built-in scenarios: %s.

  meridian sim --scenario steady-skew --intervals 1s,5s --seeds 3
  meridian sim --scenario my.yaml --out report/   (JSON, CSV and report.html)
  meridian sim --scenario many-keys --bench        (simulated decisions per second)
  meridian sim --explore 300 --seed 1              (random fault schedules, checked, failures shrunk)
  meridian sim --scenario shrunk.yaml --check      (replay a scenario with the explorer's checks)`

func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("sim", fmt.Sprintf(simSynopsis, strings.Join(sim.BuiltinNames(), ", ")), stdout, stderr)
	scenario := fs.String("scenario", "steady-skew", "built-in scenario name or YAML file")
	trace := fs.String("trace", "", "replay a trace (lines ts_us,key,region,cost) instead of the scenario's workload")
	strategies := fs.String("strategies", "", "comma-separated strategies (default: the scenario's)")
	intervals := fs.String("intervals", "", "comma-separated rebalance intervals, e.g. 1s,2s,5s (default: the scenario's)")
	seeds := fs.Int("seeds", 0, "number of seeds, 1..N (default: the scenario's seeds)")
	out := fs.String("out", "", "directory for report.json, cells.csv and report.html")
	format := fs.String("format", "table", "stdout format: table, json, csv or markdown (the README's strategy tables)")
	workers := fs.Int("workers", runtime.GOMAXPROCS(0), "simulations run at once (results do not depend on it)")
	bench := fs.Bool("bench", false, "report simulated decisions per second and peak memory instead of metrics")
	explore := fs.Int("explore", 0, "run N random fault schedules with the safety checks after every event, shrink each failure to a scenario file, exit 1 on any (--scenario sets the base; default the explorer's own)")
	seed := fs.Uint64("seed", 1, "with --explore: the seed every schedule derives from")
	first := fs.Int("first", 0, "with --explore: the first schedule's index (a long run in parts: --first 0 --explore 5000, then --first 5000 ...)")
	kinds := fs.String("kinds", "", "with --explore: comma-separated fault kinds to draw (default all: "+strings.Join(sim.FaultKinds(), ", ")+")")
	shrink := fs.Int("shrink", 200, "with --explore: runs spent shrinking each failure (0: print failures unshrunk)")
	check := fs.Bool("check", false, "run the scenario's runs with the explorer's checks (a shrunk failure's replay); exit 1 on a violation")
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	usageErr := func(format string, a ...any) error {
		fmt.Fprintf(stderr, "meridian sim: "+format+"\n", a...)
		return errUsage
	}
	if *format != "table" && *format != "json" && *format != "csv" && *format != "markdown" {
		return usageErr("--format %q: want table, json, csv or markdown", *format)
	}
	if *workers < 1 {
		return usageErr("--workers %d: must be at least 1", *workers)
	}
	if *seeds < 0 || *seeds > 1000 {
		return usageErr("--seeds %d: must be in [1, 1000]", *seeds)
	}
	if *explore < 0 {
		return usageErr("--explore %d: must not be negative", *explore)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *explore == 0 && (set["first"] || set["kinds"] || set["shrink"]) {
		return usageErr("--first, --kinds and --shrink go with --explore N")
	}
	if *explore > 0 {
		if set["check"] || set["trace"] || set["bench"] || set["out"] {
			return usageErr("--explore takes --seed, --first, --scenario, --kinds, --shrink and --workers only")
		}
		if *first < 0 {
			return usageErr("--first %d: must not be negative", *first)
		}
		if *shrink < 0 {
			return usageErr("--shrink %d: must not be negative", *shrink)
		}
		opt := sim.ExploreOptions{N: *explore, First: *first, Seed: *seed, Workers: *workers, MaxShrinkRuns: *shrink, Stop: ctx.Done()}
		if *shrink == 0 {
			opt.MaxShrinkRuns = -1
		}
		if n := *explore; n >= 1000 {
			// A long run says how far it got, every twentieth, on stderr.
			start := time.Now()
			opt.Progress = func(done int) {
				if done%(n/20) == 0 || done == n {
					fmt.Fprintf(stderr, "explore: %d of %d schedules in %s\n", done, n, time.Since(start).Round(time.Second))
				}
			}
		}
		if set["scenario"] {
			base, err := loadScenario(*scenario)
			if err != nil {
				return err
			}
			opt.Base = base
		}
		if *kinds != "" {
			opt.Kinds = strings.Split(*kinds, ",")
		}
		return runExplore(opt, stdout)
	}
	sc, err := loadScenario(*scenario)
	if err != nil {
		return err
	}
	if *check {
		return runCheck(sc, stdout)
	}
	opt := sim.Options{Workers: *workers, KeyDetail: *out != "", Stop: ctx.Done(), TimeTables: *bench}
	if *strategies != "" {
		opt.Strategies = strings.Split(*strategies, ",")
	}
	if *intervals != "" {
		for _, s := range strings.Split(*intervals, ",") {
			d, err := time.ParseDuration(strings.TrimSpace(s))
			if err != nil {
				return usageErr("--intervals: %q is not a duration", s)
			}
			opt.Intervals = append(opt.Intervals, d)
		}
	}
	for i := range *seeds {
		opt.Seeds = append(opt.Seeds, uint64(i+1))
	}
	if *trace != "" {
		tr, err := sim.OpenTrace(*trace, sc)
		if err != nil {
			return fmt.Errorf("%s: %w", *trace, err)
		}
		opt.Trace = tr
	}
	start := time.Now()
	if isTerminal(stderr) {
		opt.Progress = func(done, total int) {
			// \r and erase the line: a shorter line leaves nothing behind.
			fmt.Fprintf(stderr, "\r\x1b[K%s", progressLine(done, total, time.Since(start)))
			if done == total {
				fmt.Fprintln(stderr)
			}
		}
	}
	rep, err := sim.Sweep(sc, opt)
	if err != nil {
		return err
	}
	elapsed := time.Since(start)
	if *bench {
		var req int64
		for _, r := range rep.Runs {
			req += r.Requests
		}
		cpus := min(*workers, len(rep.Runs), runtime.GOMAXPROCS(0))
		fmt.Fprintf(stdout, "scenario %s: %d runs, %d simulated decisions in %s on %d workers\n", sc.Name, len(rep.Runs), req, elapsed.Round(time.Millisecond), cpus)
		fmt.Fprintf(stdout, "%.0f decisions/s in all, %.0f per core; peak RSS %s\n",
			float64(req)/elapsed.Seconds(), float64(req)/elapsed.Seconds()/float64(cpus), peakRSS())
		for _, r := range rep.Runs {
			fmt.Fprintf(stdout, "  %s %s seed %d: control %.3g B and %.3g messages per key·region·s; %s\n",
				r.Strategy, r.Interval.D(), r.Seed, r.Bytes, r.Messages, tableTimes(r.TableTimes))
		}
		return nil
	}
	if *out != "" {
		if err := writeReport(*out, rep); err != nil {
			return err
		}
	}
	switch *format {
	case "json":
		return rep.WriteJSON(stdout)
	case "csv":
		return rep.WriteCSV(stdout)
	case "markdown":
		return rep.WriteMarkdown(stdout)
	}
	return rep.WriteTable(stdout)
}

// runExplore runs the explorer and prints a summary and each failure's
// shrunk scenario; any failure is an error (exit status 1).
func runExplore(opt sim.ExploreOptions, stdout io.Writer) error {
	start := time.Now()
	rep, err := sim.Explore(opt)
	if err != nil {
		return err
	}
	from := ""
	if rep.First > 0 {
		from = fmt.Sprintf(" (%d to %d)", rep.First, rep.First+rep.Schedules-1)
	}
	fmt.Fprintf(stdout, "explore: %d schedules%s from seed %d (%d over-admitting: OA_budget not checked; %d with the liveness checks, %d with the resume check), %d safety checks: %d violations in %s\n",
		rep.Schedules, from, rep.Seed, rep.OverAdmitting, rep.Liveness, rep.Resumed, rep.Checks, len(rep.Failures), time.Since(start).Round(time.Millisecond))
	for _, c := range rep.ByCheck() {
		fmt.Fprintf(stdout, "  %s: %d\n", c.Check, c.N)
	}
	// Each check's first failures in full; the rest in a line each (a
	// long run fails thousands of times on one defect).
	const full = 5
	shown := map[string]int{}
	for _, f := range rep.Failures {
		if shown[f.Shrunk.Check]++; shown[f.Shrunk.Check] > full {
			fmt.Fprintf(stdout, "schedule %d: %s at %s (%s), %d events\n", f.Schedule, f.Shrunk.Check, f.Shrunk.At.D(), f.Shrunk.Event, f.Events)
			continue
		}
		fmt.Fprintf(stdout, "\nschedule %d: %s at %s (%s), shrunk from %d to %d events:\n%s",
			f.Schedule, f.Shrunk.Check, f.Shrunk.At.D(), f.Shrunk.Event, f.OriginalEvents, f.Events, f.YAML)
	}
	if len(rep.Failures) > 0 {
		return fmt.Errorf("explore: %d of %d schedules violate a check", len(rep.Failures), rep.Schedules)
	}
	return nil
}

// runCheck replays sc's runs with the explorer's checks.
func runCheck(sc *sim.Scenario, stdout io.Writer) error {
	vs, err := sim.CheckScenario(sc)
	if err != nil {
		return err
	}
	for _, v := range vs {
		fmt.Fprintf(stdout, "%s: %s\n", sc.Name, v.Error())
	}
	if len(vs) > 0 {
		return fmt.Errorf("check: %d violations", len(vs))
	}
	fmt.Fprintf(stdout, "%s: no violation\n", sc.Name)
	return nil
}

func loadScenario(arg string) (*sim.Scenario, error) {
	if !strings.ContainsAny(arg, "./") {
		return sim.Builtin(arg)
	}
	data, err := os.ReadFile(arg)
	if err != nil {
		return nil, err
	}
	sc, err := sim.ParseScenario(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", arg, err)
	}
	return sc, nil
}

func writeReport(dir string, rep *sim.Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	write := func(name string, f func(io.Writer) error) error {
		var b bytes.Buffer
		if err := f(&b); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, name), b.Bytes(), 0o644)
	}
	return errors.Join(
		write("report.json", rep.WriteJSON),
		write("cells.csv", rep.WriteCSV),
		write("report.html", rep.WriteHTML),
	)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// peakRSS reads the process's peak resident set (VmHWM) on Linux.
func peakRSS() string {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "unknown"
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(rest)
			if kb, err := strconv.ParseInt(f[0], 10, 64); err == nil {
				return fmt.Sprintf("%.0f MiB", float64(kb)/1024)
			}
		}
	}
	return "unknown"
}

// progressLine is a sweep's progress bar after done of total runs in
// elapsed: the runs, the time so far and, while runs remain, an estimate
// of the time left (the runs so far took that long each).
func progressLine(done, total int, elapsed time.Duration) string {
	const width = 30
	fill := width * done / max(total, 1)
	s := fmt.Sprintf("[%s%s] %d/%d runs, %s", strings.Repeat("#", fill), strings.Repeat(" ", width-fill), done, total, elapsed.Round(time.Second))
	if done > 0 && done < total {
		left := time.Duration(float64(elapsed) / float64(done) * float64(total-done))
		s += fmt.Sprintf(", about %s left", left.Round(time.Second))
	}
	return s
}

// tableTimes summarizes the wall time of a run's tables: the coordinator's
// Tick (with the rebalance when one was due) and the table's encoding,
// signature and store. The coordinator is one, not sharded.
func tableTimes(ds []time.Duration) string {
	if len(ds) == 0 {
		return "the coordinator made no table"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	q := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return fmt.Sprintf("%d tables, coordinator wall time per table p50 %s, p90 %s, max %s",
		len(s), q(0.5).Round(time.Microsecond), q(0.9).Round(time.Microsecond), s[len(s)-1].Round(time.Microsecond))
}
