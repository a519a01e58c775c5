package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
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
  meridian sim --scenario many-keys --bench        (simulated decisions per second)`

func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("sim", fmt.Sprintf(simSynopsis, strings.Join(sim.BuiltinNames(), ", ")), stdout, stderr)
	scenario := fs.String("scenario", "steady-skew", "built-in scenario name or YAML file")
	trace := fs.String("trace", "", "replay a trace (lines ts_us,key,region,cost) instead of the scenario's workload")
	strategies := fs.String("strategies", "", "comma-separated strategies (default: the scenario's)")
	intervals := fs.String("intervals", "", "comma-separated rebalance intervals, e.g. 1s,2s,5s (default: the scenario's)")
	seeds := fs.Int("seeds", 0, "number of seeds, 1..N (default: the scenario's seeds)")
	out := fs.String("out", "", "directory for report.json, cells.csv and report.html")
	format := fs.String("format", "table", "stdout format: table, json or csv")
	workers := fs.Int("workers", runtime.GOMAXPROCS(0), "simulations run at once (results do not depend on it)")
	bench := fs.Bool("bench", false, "report simulated decisions per second and peak memory instead of metrics")
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	usageErr := func(format string, a ...any) error {
		fmt.Fprintf(stderr, "meridian sim: "+format+"\n", a...)
		return errUsage
	}
	if *format != "table" && *format != "json" && *format != "csv" {
		return usageErr("--format %q: want table, json or csv", *format)
	}
	if *workers < 1 {
		return usageErr("--workers %d: must be at least 1", *workers)
	}
	if *seeds < 0 || *seeds > 1000 {
		return usageErr("--seeds %d: must be in [1, 1000]", *seeds)
	}
	sc, err := loadScenario(*scenario)
	if err != nil {
		return err
	}
	opt := sim.Options{Workers: *workers, KeyDetail: *out != ""}
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
	if isTerminal(stderr) {
		opt.Progress = func(done, total int) {
			const width = 30
			fill := width * done / total
			fmt.Fprintf(stderr, "\r[%s%s] %d/%d runs", strings.Repeat("#", fill), strings.Repeat(" ", width-fill), done, total)
			if done == total {
				fmt.Fprintln(stderr)
			}
		}
	}
	start := time.Now()
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
	}
	return rep.WriteTable(stdout)
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
