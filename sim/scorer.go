package sim

import (
	"errors"
	"fmt"
	"time"

	"github.com/meridian-quota/meridian/gcra"
)

// Scorer scores decisions made outside the simulator — a live cluster —
// with the simulator's yardstick: it runs the oracle (one GCRA with each
// key's full budget, at true time) beside the decisions it is given, and
// returns the same Result a simulated run does (windows of 1 s and 10 s:
// OA, UA, peak ratio, fairness, convergence after Shift; OA_budget;
// disagreement; per-key totals; top-key series). The metric code is the
// simulator's own.
//
// As in the simulator, only windows that close by Duration are scored:
// choose a Duration that is a whole number of 10 s windows, or the 10 s
// metrics leave out the last partial window.
type Scorer struct {
	m        *metrics
	oracle   []int64 // each key's oracle TAT, µs
	last     int64   // the latest t decided at, µs
	requests int64   // decisions scored (before Duration)
	closed   bool    // Result was called
}

// ScoreConfig describes what a Scorer scores.
type ScoreConfig struct {
	// Keys are the key names, most popular first (the first five get
	// per-second series in Result.Top).
	Keys []string
	// Budgets are each key's global budget, in the order of Keys.
	Budgets []gcra.Limit
	// Regions are the region names, in the order Decide's r indexes.
	Regions []string
	// Warmup: decisions before it count toward windows but not toward the
	// totals (as in the simulator: windows starting before it are not scored).
	Warmup time.Duration
	// Duration is the scored span from t = 0. Decisions at or after it are
	// not scored, as the simulator stops at its end.
	Duration time.Duration
	// Shift: convergence is measured from here (0: none).
	Shift time.Duration
}

// maxScoreDuration bounds Duration as the simulator bounds a scenario (the
// top keys' series take memory per second).
const maxScoreDuration = 7 * 24 * time.Hour

// names reports an empty list, empty names and names given twice.
func names(bad func(string, ...any), what string, list []string) {
	if len(list) == 0 {
		bad("no %s", what)
	}
	seen := map[string]int{}
	for i, n := range list {
		if n == "" {
			bad("%s[%d]: empty", what, i)
			continue
		}
		if j, ok := seen[n]; ok {
			bad("%s[%d]: %q given twice (%s[%d])", what, i, n, what, j)
			continue
		}
		seen[n] = i
	}
}

// NewScorer validates cfg and returns a Scorer at t = 0. Every problem is
// reported at once.
func NewScorer(cfg ScoreConfig) (*Scorer, error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("sim: scorer: "+format, args...))
	}
	names(bad, "keys", cfg.Keys)
	if len(cfg.Budgets) != len(cfg.Keys) {
		bad("%d budgets for %d keys", len(cfg.Budgets), len(cfg.Keys))
	}
	for i, b := range cfg.Budgets {
		switch err := b.Validate(); {
		case err != nil:
			bad("budgets[%d]: %w", i, err)
		case b.IsZero():
			bad("budgets[%d]: the zero limit admits nothing: there is nothing to score", i)
		}
	}
	names(bad, "regions", cfg.Regions)
	switch {
	case cfg.Duration < time.Microsecond:
		bad("duration %s: must be at least 1µs", cfg.Duration)
	case cfg.Duration > maxScoreDuration:
		bad("duration %s: above %s", cfg.Duration, maxScoreDuration)
	}
	if cfg.Warmup < 0 || (cfg.Duration > 0 && cfg.Warmup >= cfg.Duration) {
		bad("warmup %s: must be in [0, duration)", cfg.Warmup)
	}
	if cfg.Shift < 0 || (cfg.Duration > 0 && cfg.Shift > cfg.Duration) {
		bad("shift %s: must be in [0, duration]", cfg.Shift)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Scorer{
		m: newMetrics(yardstick{names: append([]string(nil), cfg.Keys...), budgets: append([]gcra.Limit(nil), cfg.Budgets...),
			regions: len(cfg.Regions), warmup: cfg.Warmup.Microseconds(), shift: cfg.Shift.Microseconds(), end: cfg.Duration.Microseconds()}),
		oracle: make([]int64, len(cfg.Keys)),
	}, nil
}

// Decide records one request of key i offered in region r at t (µs since
// the scorer's start; a t earlier than the last one given is taken as the
// last), of cost, that the system admitted or not. It decides the oracle's
// verdict itself and returns it. A request at or after Duration, or after
// Result, is decided by the oracle but not scored.
//
// An i or r out of range or a negative cost panics (a bug in the caller).
// Decide is not safe for concurrent use.
func (s *Scorer) Decide(i, r int, cost int64, allowed bool, t int64) (oracle bool) {
	if i < 0 || i >= len(s.oracle) || r < 0 || r >= s.m.regions {
		panic(fmt.Sprintf("sim: Scorer.Decide: key %d of %d, region %d of %d: out of range", i, len(s.oracle), r, s.m.regions))
	}
	if cost < 0 {
		panic(fmt.Sprintf("sim: Scorer.Decide: negative cost %d", cost))
	}
	t = max(t, s.last)
	s.last = t
	// The oracle: one GCRA with the full budget, at true time.
	next, or, _ := gcra.Allow(s.m.budgets[i], s.oracle[i], t, cost)
	if or.Allowed {
		s.oracle[i] = next
	}
	if s.closed || t >= s.m.end {
		return or.Allowed
	}
	s.requests++
	s.m.advance(t)
	s.m.record(i, r, cost, allowed, or.Allowed, t)
	return or.Allowed
}

// Shares records, for the top-key series, the part of key i's budget
// region r runs at, at t (one value per second, the last given in a second
// wins; the simulator samples once a second). With no calls the series
// hold zeros. Keys outside the top five, a t outside [0, Duration) and
// calls after Result are ignored.
func (s *Scorer) Shares(i, r int, part float64, t int64) {
	if s.closed || i < 0 || i >= len(s.oracle) || r < 0 || r >= s.m.regions {
		return
	}
	s.m.share(i, r, part, t)
}

// Result closes every window up to Duration and builds the Result as a
// simulated run builds its metrics: totals after warm-up, windows,
// OA_budget, disagreement, per-key totals and top-key series. Requests is
// the number of decisions scored; the fields the scorer cannot know
// (Scenario, Seed, control cost, retries, drops, fallbacks, lost messages)
// are zero. Result ends the scoring: later calls to Decide and Shares are
// not scored, and a second Result returns the same values.
func (s *Scorer) Result(strategy string, interval time.Duration) *Result {
	if !s.closed {
		s.m.advance(s.m.end)
		s.closed = true
	}
	res := &Result{Strategy: strategy, Interval: Duration(interval), Requests: s.requests}
	s.m.fill(res)
	return res
}
