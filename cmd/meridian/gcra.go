package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meridian-quota/meridian/gcra"
)

const gcraSynopsis = `
Print the decision trace of one GCRA limit for a pattern of arrivals, on the
pure algorithm with explicit time (no store, no clock). Arrivals are offsets
from the start, either listed (--arrivals 0,0,0,0,250ms,250ms) or evenly
spaced from 0 through --for inclusive (--every 50ms --for 3s). With --reserve, each arrival books the next
slot if the wait is at most the given maxWait instead of being denied.

Example (seed trace: 5/s, burst 3):
  meridian gcra --limit 5/s --burst 3 --arrivals 0,0,0,0,250ms,250ms`

func runGCRA(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("gcra", gcraSynopsis, stdout, stderr)
	limitFlag := fs.String("limit", "", "rate as EVENTS/PERIOD: 5/s, 100/m, 1000/h, 30/10s (required unless --interval)")
	interval := fs.Duration("interval", 0, "emission interval T in whole µs instead of --limit (e.g. 200ms)")
	burst := fs.Int64("burst", 0, "events admitted back to back after idle (required, ≥ 1)")
	arrivals := fs.String("arrivals", "", "comma-separated arrival offsets (0, 250ms, 1.5s), non-decreasing")
	every := fs.Duration("every", 0, "evenly spaced arrivals: one every DURATION (with --for)")
	dur := fs.Duration("for", 0, "evenly spaced arrivals from 0 through this offset, inclusive (with --every)")
	cost := fs.Int64("cost", 1, "cost of each arrival (0 peeks)")
	reserve := fs.Duration("reserve", 0, "reserve instead of decide, with this maxWait (e.g. 2s)")
	quiet := fs.Bool("quiet", false, "print only the summary")
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	lim, err := limitFromFlags(*limitFlag, *interval, *burst)
	if err != nil {
		return err
	}
	times, err := arrivalTimes(*arrivals, *every, *dur)
	if err != nil {
		return err
	}
	if *cost < 0 {
		return fmt.Errorf("--cost %d: must not be negative", *cost)
	}
	maxWait := int64(-1)
	reserveSet := false
	fs.Visit(func(f *flag.Flag) { reserveSet = reserveSet || f.Name == "reserve" })
	if reserveSet {
		if maxWait, err = gcra.ValidateMaxWait(*reserve); err != nil {
			return fmt.Errorf("--reserve %s: %w", *reserve, err)
		}
	}
	return printTrace(stdout, lim, times, *cost, maxWait, *quiet)
}

// limitFromFlags builds and validates the limit.
func limitFromFlags(spec string, interval time.Duration, burst int64) (gcra.Limit, error) {
	switch {
	case spec != "" && interval != 0:
		return gcra.Limit{}, errors.New("give --limit or --interval, not both")
	case spec == "" && interval == 0:
		return gcra.Limit{}, errors.New("--limit (or --interval) is required")
	case burst < 1:
		return gcra.Limit{}, fmt.Errorf("--burst %d: must be at least 1", burst)
	}
	var l gcra.Limit
	if spec != "" {
		n, per, err := parseRate(spec)
		if err != nil {
			return gcra.Limit{}, fmt.Errorf("--limit %q: %w", spec, err)
		}
		l = gcra.New(n, per, burst)
	} else {
		if interval%time.Microsecond != 0 {
			return gcra.Limit{}, fmt.Errorf("--interval %s: must be a whole number of microseconds", interval)
		}
		l = gcra.FromInterval(int64(interval/time.Microsecond), burst)
	}
	return l, l.Validate()
}

// parseRate parses EVENTS/PERIOD where PERIOD is s, m, h or a Go duration.
func parseRate(s string) (int64, time.Duration, error) {
	num, unit, ok := strings.Cut(s, "/")
	if !ok {
		return 0, 0, errors.New("want EVENTS/PERIOD, e.g. 5/s or 100/10s")
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 1 {
		return 0, 0, fmt.Errorf("events %q: want a whole number ≥ 1", num)
	}
	switch unit {
	case "s", "second":
		return n, time.Second, nil
	case "m", "min", "minute":
		return n, time.Minute, nil
	case "h", "hour":
		return n, time.Hour, nil
	case "d", "day":
		return n, 24 * time.Hour, nil
	}
	per, err := time.ParseDuration(unit)
	if err != nil || per <= 0 {
		return 0, 0, fmt.Errorf("period %q: want s, m, h, d or a positive duration like 10s", unit)
	}
	return n, per, nil
}

// maxArrivals bounds the pattern so a typo cannot exhaust memory.
const maxArrivals = 10_000_000

// arrivalTimes returns the arrival offsets in µs.
func arrivalTimes(list string, every, dur time.Duration) ([]int64, error) {
	switch {
	case list != "" && (every != 0 || dur != 0):
		return nil, errors.New("give --arrivals or --every/--for, not both")
	case list != "":
		var out []int64
		prev := int64(0)
		for i, f := range strings.Split(list, ",") {
			f = strings.TrimSpace(f)
			d, err := time.ParseDuration(f)
			if f == "0" {
				d, err = 0, nil
			}
			if err != nil || d < 0 {
				return nil, fmt.Errorf("--arrivals item %d %q: want a non-negative duration like 250ms", i+1, f)
			}
			us := int64(d / time.Microsecond)
			if us >= gcra.MaxTime {
				return nil, fmt.Errorf("--arrivals item %d %q: beyond the 2^52 µs (about 142 years) the core can time", i+1, f)
			}
			if us < prev {
				return nil, fmt.Errorf("--arrivals item %d %q: before the previous arrival", i+1, f)
			}
			prev = us
			out = append(out, us)
		}
		return out, nil
	case every > 0 && dur > 0:
		if dur/time.Microsecond >= time.Duration(gcra.MaxTime) {
			return nil, fmt.Errorf("--for %s: beyond the 2^52 µs (about 142 years) the core can time", dur)
		}
		n := int64(dur/every) + 1
		if n > maxArrivals {
			return nil, fmt.Errorf("--every %s --for %s: %d arrivals, more than %d", every, dur, n, maxArrivals)
		}
		out := make([]int64, 0, n)
		for i := range n {
			out = append(out, int64(time.Duration(i)*every/time.Microsecond))
		}
		return out, nil
	}
	return nil, errors.New("give --arrivals, or --every and --for (both positive)")
}

// printTrace runs the pattern through gcra on one key and prints each
// decision and a summary.
func printTrace(w io.Writer, lim gcra.Limit, times []int64, cost, maxWait int64, quiet bool) error {
	sch := gcra.Steady(lim)
	var st gcra.State
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "limit %s, cost %d", lim, cost)
	if maxWait >= 0 {
		fmt.Fprintf(w, ", reserve with maxWait %s", time.Duration(maxWait)*time.Microsecond)
	}
	fmt.Fprintln(w)
	if !quiet {
		fmt.Fprintln(tw, "t\tresult\tremaining\tretry-after\treset-after\twait\tTAT\t")
	}
	admitted := 0
	var first, last int64 = -1, -1
	for _, now := range times {
		var (
			next  gcra.State
			write bool
			r     gcra.Result
			err   error
		)
		if maxWait >= 0 {
			next, write, r, err = gcra.Reserve(st, now, &sch, cost, maxWait)
		} else {
			next, write, r, err = gcra.Decide(st, now, &sch, cost)
		}
		if err != nil {
			return err
		}
		if write {
			st = next
		}
		verdict := "deny"
		switch {
		case r.TooLarge:
			verdict = "too-large"
		case r.Allowed && maxWait >= 0:
			verdict = "booked"
		case r.Allowed:
			verdict = "allow"
		}
		if r.Allowed {
			admitted++
			if first < 0 {
				first = now
			}
			last = now
		}
		if !quiet {
			retry := fmtDur(r.RetryAfter)
			if r.RetryAfter == gcra.Never {
				retry = "never"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t\n", fmtDur(time.Duration(now)*time.Microsecond), verdict,
				r.Remaining, retry, fmtDur(r.ResetAfter), fmtDur(r.Wait), fmtDur(time.Duration(st.TAT)*time.Microsecond))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "admitted %d of %d", admitted, len(times))
	if admitted > 1 {
		fmt.Fprintf(w, "; first at %s, last at %s", fmtDur(time.Duration(first)*time.Microsecond), fmtDur(time.Duration(last)*time.Microsecond))
	}
	fmt.Fprintln(w)
	return nil
}

func fmtDur(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	return d.String()
}
