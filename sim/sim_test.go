package sim

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"
)

func mustScenario(t *testing.T, src string) *Scenario {
	t.Helper()
	sc, err := ParseScenario([]byte(src))
	if err != nil {
		t.Fatalf("ParseScenario: %v", err)
	}
	return sc
}

// raceEnabled reports whether the test binary was built with -race. The
// heavy sweeps then run a representative subset; the transition world runs
// fewer seeds.
func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

func sweep(t *testing.T, sc *Scenario, opt Options) *Report {
	t.Helper()
	rep, err := Sweep(sc, opt)
	if err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	return rep
}

// small is a short three-region scenario for the tests.
const small = `
name: small
duration: 40s
warmup: 10s
seeds: [1, 2]
regions: [{name: eu}, {name: us}, {name: ap}]
latency: {mean: 30ms, jitter: 5ms, loss: 0.01}
keys: {count: 20, zipf: 1, sigma: 1, over_fraction: 0.3, burst_seconds: 1, home_fraction: 0.7}
workload: {rate: 2000, cost_pareto: 2.5, cost_max: 5, retry: {max: 2, jitter: 0.5}}
faults:
  partitions: [{side: [ap], at: 20s, for: 5s}]
strategies: [ewma, static, replicated-counter]
intervals: [1s, 2s]
`

func TestDeterministicWhateverTheWorkers(t *testing.T) {
	sc := mustScenario(t, small)
	var out [2]bytes.Buffer
	opt := Options{KeyDetail: true}
	if raceEnabled() {
		// Fewer cells, still several per worker (see TestClosedNeverOverAdmits).
		opt.Intervals = []time.Duration{time.Second}
	}
	for i, workers := range []int{1, 3} {
		opt.Workers = workers
		rep := sweep(t, sc, opt)
		if err := rep.WriteJSON(&out[i]); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(out[0].Bytes(), out[1].Bytes()) {
		t.Fatal("the JSON report differs between 1 and 3 workers")
	}
	// A different seed gives a different run (the seed is used).
	a := sweep(t, sc, Options{Seeds: []uint64{1}, Strategies: []string{"ewma"}, Intervals: []time.Duration{time.Second}})
	b := sweep(t, sc, Options{Seeds: []uint64{2}, Strategies: []string{"ewma"}, Intervals: []time.Duration{time.Second}})
	if a.Runs[0].Requests == b.Runs[0].Requests {
		t.Errorf("seeds 1 and 2 made the same number of requests (%d)", a.Runs[0].Requests)
	}
}

// analytic is a scenario with every key offered 3× its budget at ≥ 1,000
// requests/s in all, 10 s of warm-up, no latency.
func analytic(t *testing.T, homeFraction float64, extra string) *Scenario {
	return mustScenario(t, fmt.Sprintf(`
name: analytic
duration: 70s
warmup: 10s
regions: [{name: eu}, {name: us}, {name: ap}]
keys: {count: 4, zipf: 0, ratio: 3, burst_seconds: 1, home_fraction: %v}
workload: {rate: 4000}
%s`, homeFraction, extra))
}

func TestAnalyticStaticSingleRegion(t *testing.T) {
	// All of a key's traffic in one region; static gives it a third.
	rep := sweep(t, analytic(t, 1, ""), Options{Strategies: []string{"static"}, Intervals: []time.Duration{time.Second}})
	ua := rep.Runs[0].Windows[0].UA.Mean
	if math.Abs(ua-2.0/3) > 0.02 {
		t.Errorf("static, single-region keys: UA = %.4f, want 2/3 within 0.02", ua)
	}
}

// TestAnalyticSafeFraction: a key whose traffic is all in one region can
// hold at most 1 − (R−1)/R·f of its budget there, where f is the fraction
// the other regions' floors share: IdleSafeFraction, since they show no
// demand for it (issue 18: with every region at its safe share of 10 % it
// lost 6.7 %; it loses 0.67 % at the default idle floors of 1 %, 2 % with
// both at 3 % — fails on 12c75e9, "field safe_fraction not found").
func TestAnalyticSafeFraction(t *testing.T) {
	for _, tt := range []struct {
		extra string
		want  float64
	}{
		{"", 0.01 * 2 / 3},
		{"idle_safe_fraction: 0.1", 0.1 * 2 / 3},
		{"safe_fraction: 0.03\nidle_safe_fraction: 0.03", 0.03 * 2 / 3},
	} {
		rep := sweep(t, analytic(t, 1, tt.extra), Options{Strategies: []string{"proportional"}, Intervals: []time.Duration{2 * time.Second}})
		if ua := rep.Runs[0].Windows[0].UA.Mean; math.Abs(ua-tt.want) > 0.003 {
			t.Errorf("%q: UA = %.4f, want %.4f within 0.003", tt.extra, ua, tt.want)
		}
	}
}

func TestAnalyticFullEvenSpread(t *testing.T) {
	// Traffic spread evenly: full admits the budget in each of 3 regions.
	rep := sweep(t, analytic(t, 0, ""), Options{Strategies: []string{"full"}, Intervals: []time.Duration{time.Second}})
	oa := rep.Runs[0].OABudget.Mean
	if math.Abs(oa-2) > 0.04 {
		t.Errorf("full, even spread: OA_budget = %.4f, want 2 (200 %%) within 0.04", oa)
	}
}

func TestAnalyticProportionalStationary(t *testing.T) {
	// No reservations or local leases here, so no fence is needed between
	// a decrease and its increase beyond twice the skew; no clock skew, so
	// a small skew margin.
	rep := sweep(t, analytic(t, 0.6, "fence: 2ms\nmax_skew: 1ms\n"), Options{Strategies: []string{"proportional"}, Intervals: []time.Duration{time.Second}})
	r := rep.Runs[0]
	dev := math.Abs(float64(r.Admitted-r.OracleAdmitted)) / float64(r.OracleAdmitted)
	if dev > 0.01 {
		t.Errorf("proportional, stationary demand, no latency: admitted %d vs oracle %d (%.2f%%), want within 1%%",
			r.Admitted, r.OracleAdmitted, 100*dev)
	}
}

func TestOracleAgainstItselfScoresZero(t *testing.T) {
	rep := sweep(t, mustScenario(t, small), Options{Strategies: []string{Oracle}})
	for _, r := range rep.Runs {
		for _, w := range r.Windows {
			if w.OA != (Summary{Keys: w.OA.Keys}) || w.UA != (Summary{Keys: w.UA.Keys}) || w.Fairness.Max != 0 {
				t.Errorf("oracle vs oracle, %s window: OA %+v UA %+v fairness %+v, want all 0", w.Window.D(), w.OA, w.UA, w.Fairness)
			}
		}
		if r.OABudget.Max != 0 || r.Disagreement != 0 || r.Admitted != r.OracleAdmitted {
			t.Errorf("oracle vs oracle: OA_budget %+v disagreement %v admitted %d vs %d", r.OABudget, r.Disagreement, r.Admitted, r.OracleAdmitted)
		}
	}
}

// TestOracleMatchesIndependentGCRA replays a random trace and recomputes
// each key's admitted cost with a plain GCRA written here.
func TestOracleMatchesIndependentGCRA(t *testing.T) {
	sc := mustScenario(t, `
name: trace
duration: 30s
regions: [{name: eu}, {name: us}]
keys: {count: 1, ratio: 2, burst_seconds: 2}
workload: {rate: 1}
`)
	rng := rand.New(rand.NewPCG(7, 7))
	type line struct {
		ts   int64
		key  string
		cost int64
	}
	var lines []line
	var b strings.Builder
	b.WriteString("ts_us,key,region,cost\n")
	ts := int64(0)
	for range 20000 {
		ts += rng.Int64N(3000)
		l := line{ts: ts, key: fmt.Sprintf("k%d", rng.IntN(5)), cost: 1 + rng.Int64N(3)}
		lines = append(lines, l)
		fmt.Fprintf(&b, "%d,%s,%s,%d\n", l.ts, l.key, []string{"eu", "us"}[rng.IntN(2)], l.cost)
	}
	path := filepath.Join(t.TempDir(), "trace.csv")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	tr, err := OpenTrace(path, sc)
	if err != nil {
		t.Fatal(err)
	}
	rep := sweep(t, sc, Options{Trace: tr, Strategies: []string{"ewma"}, Intervals: []time.Duration{time.Second}, KeyDetail: true})
	res := rep.Runs[0]
	if res.Requests != int64(len(lines)) {
		t.Fatalf("simulated %d requests, the trace has %d", res.Requests, len(lines))
	}
	for _, kr := range res.Keys {
		name := strings.TrimPrefix(kr.Key, "sim/k=")
		// The plainest GCRA: a key may take cost n at ts if, after
		// adding n emission intervals to max(tat, ts), it is at most
		// burst intervals ahead of ts.
		tat, want := int64(0), int64(0)
		for _, l := range lines {
			if l.key != name {
				continue
			}
			next := tat
			if l.ts > next {
				next = l.ts
			}
			next += l.cost * kr.IntervalMicros
			if next-l.ts <= kr.Burst*kr.IntervalMicros {
				tat = next
				want += l.cost
			}
		}
		if kr.OracleAdmitted != want {
			t.Errorf("%s: oracle admitted %d, independent GCRA %d", name, kr.OracleAdmitted, want)
		}
	}
}

// With failure_mode closed and no shadow mode, no Meridian strategy may
// admit beyond the budget in any window — through partitions, region loss
// and coordinator failover.
//
// Under the race detector it runs a representative subset (one scenario,
// two strategies, one interval): the detector looks for races in the code
// the sweep runs, not for the verdict, which the full matrix holds without
// it (.ci/run runs this package both ways).
func TestClosedNeverOverAdmits(t *testing.T) {
	strategies := []string{"static", "proportional", "ewma", "quantile", "maxmin", "doorman-proportional", "doorman-fair"}
	scenarios := []string{"partition", "region-failover", "coordinator-failover"}
	intervals := []time.Duration{time.Second, 5 * time.Second}
	duration := 100 * time.Second
	if raceEnabled() {
		strategies, scenarios, intervals, duration = []string{"quantile", "maxmin"}, scenarios[2:], intervals[:1], 60*time.Second
	}
	for _, name := range scenarios {
		t.Run(name, func(t *testing.T) {
			sc, err := Builtin(name)
			if err != nil {
				t.Fatal(err)
			}
			sc.Duration = Duration(duration)
			rep := sweep(t, sc, Options{Strategies: strategies, Intervals: intervals,
				Seeds: []uint64{1}, KeyDetail: true})
			for _, r := range rep.Runs {
				if r.OABudget.Max != 0 {
					for _, k := range r.Keys {
						if k.OABudget > 0 {
							t.Errorf("%s at %s: key %s admitted beyond its budget: OA_budget %.5f", r.Strategy, r.Interval.D(), k.Key, k.OABudget)
						}
					}
				}
			}
		})
	}
}

// With failure_mode local, a Redis outage's excess stays within two
// regional bursts per key (one episode).
func TestLocalFallbackBounded(t *testing.T) {
	sc := mustScenario(t, `
name: outage
duration: 60s
warmup: 5s
regions: [{name: eu, agents: 2}, {name: us}, {name: ap}]
latency: {mean: 20ms}
keys: {count: 10, zipf: 1, ratio: 3, burst_seconds: 2, home_fraction: 0.8}
workload: {rate: 3000}
failure_mode: local
faults:
  redis_outage: [{region: eu, at: 20s, for: 15s}]
`)
	rep := sweep(t, sc, Options{Strategies: []string{"ewma", "static"}, Intervals: []time.Duration{time.Second}, KeyDetail: true})
	for _, r := range rep.Runs {
		if r.Fallbacks == 0 {
			t.Fatalf("%s: no fallback decisions during the outage", r.Strategy)
		}
		measured := (sc.Duration - sc.Warmup).D().Seconds()
		for _, k := range r.Keys {
			excess := k.OABudget * measured * 1e6 / float64(k.IntervalMicros)
			if excess > float64(2*k.Burst) {
				t.Errorf("%s: key %s admitted %.1f beyond its budget, above two bursts (%d)", r.Strategy, k.Key, excess, 2*k.Burst)
			}
		}
	}
}

// With failure_mode error a Redis outage leaves every request of the
// region to the caller (the agent answers an error): the run counts each
// one in Errored, and scores what the caller does with it. The nodes
// decide, record and report the same whatever the caller does, so with
// on_error deny the run is the failure_mode closed run exactly, and with
// on_error admit it admits exactly the errored requests more — the
// over-admission the scorer then measures against the oracle. Without
// retries the workload does not depend on the answers, so these are
// identities, not tolerances. The reserve variant books with the nodes'
// Reserve; an admitted errored request is served at once.
func TestErrorModeLeavesTheCallToTheCaller(t *testing.T) {
	const src = `
name: error-outage
duration: 60s
warmup: 5s
regions: [{name: eu, agents: 2, weight: 8}, {name: us}, {name: ap}]
latency: {mean: 20ms}
keys: {count: 10, zipf: 1, ratio: 3, burst_seconds: 2, home_fraction: 0.8}
workload: {rate: 3000%s}
faults:
  redis_outage: [{region: eu, at: 20s, for: 15s}]
`
	run := func(t *testing.T, sc *Scenario) (res *Result, outage int64) {
		t.Helper()
		r, err := NewRun(sc, "static", time.Second, 1, nil)
		if err != nil {
			t.Fatal(err)
		}
		// The requests the outage meets: those offered in eu during it.
		r.OnArrival(func(a Arrival) {
			if a.Region == 0 && a.T >= 20e6 && a.T < 35e6 {
				outage++
			}
		})
		if res, err = r.Simulate(); err != nil {
			t.Fatal(err)
		}
		return res, outage
	}
	for _, tt := range []struct{ name, workload string }{
		{"decide", ""},
		{"reserve", ", retry: {max: 0, reserve: 500ms}"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			base := fmt.Sprintf(src, tt.workload)
			closed, _ := run(t, mustScenario(t, base+"failure_mode: closed\n"))
			deny, outage := run(t, mustScenario(t, base+"failure_mode: error\non_error: deny\n"))
			admit, _ := run(t, mustScenario(t, base+"failure_mode: error\n")) // on_error admit, Envoy's default
			if outage == 0 {
				t.Fatal("no request offered in eu during the outage")
			}
			// Every request eu offered during the outage reached the failing
			// store, but those the deny cache denied first (an exact
			// denial, not a fallback; reservations do not use it).
			errored := deny.Errored
			if errored == 0 || errored > outage || (tt.name == "reserve" && errored != outage) {
				t.Errorf("errored %d of the %d requests eu offered during the outage", errored, outage)
			}
			for name, r := range map[string]*Result{"deny": deny, "admit": admit, "closed": closed} {
				want := errored
				if name == "closed" {
					want = 0
				}
				if r.Errored != want || r.Fallbacks != errored {
					t.Errorf("%s: errored %d, fallbacks %d, want %d and %d", name, r.Errored, r.Fallbacks, want, errored)
				}
			}
			// on_error deny is failure_mode closed, but for the count.
			d := *deny
			d.Scenario, d.Errored = closed.Scenario, 0
			if !reflect.DeepEqual(&d, closed) {
				t.Errorf("on_error deny differs from failure_mode closed beyond Errored:\n deny   %+v\n closed %+v", &d, closed)
			}
			// on_error admit lets every errored request through: cost 1
			// each, all after the warm-up.
			if admit.Admitted != deny.Admitted+errored || admit.OracleAdmitted != deny.OracleAdmitted || admit.Offered != deny.Offered {
				t.Errorf("admitted %d (oracle %d, offered %d) with on_error admit, want %d + %d errored (oracle %d, offered %d)",
					admit.Admitted, admit.OracleAdmitted, admit.Offered, deny.Admitted, errored, deny.OracleAdmitted, deny.Offered)
			}
			// The keys are at 3× their budgets and eu offers most of their
			// traffic: admitting all of it for 15 s is over-admission the
			// scorer must see.
			if admit.OABudget.Max <= deny.OABudget.Max || admit.Windows[0].OA.Mean <= deny.Windows[0].OA.Mean {
				t.Errorf("OA_budget max %v, OA(1s) mean %v with on_error admit; want above on_error deny's %v, %v",
					admit.OABudget.Max, admit.Windows[0].OA.Mean, deny.OABudget.Max, deny.Windows[0].OA.Mean)
			}
		})
	}
}

func TestScenarioErrors(t *testing.T) {
	base := `
name: x
duration: 10s
regions: [{name: eu}, {name: us}]
keys: {count: 5, ratio: 2}
workload: {rate: 100}
`
	tests := []struct {
		name, give, want string
	}{
		{"unknown field", base + "colour: red\n", "field colour not found"},
		{"unknown nested field", strings.Replace(base, "{rate: 100}", "{rate: 100, speed: 3}", 1), "field speed not found"},
		{"negative rate", strings.Replace(base, "{rate: 100}", "{rate: -5}", 1), "workload.rate: -5"},
		{"no regions", strings.Replace(base, "regions: [{name: eu}, {name: us}]", "regions: []", 1), "regions: empty"},
		{"duplicate region", strings.Replace(base, "{name: us}", "{name: eu}", 1), `regions[1].name: "eu" given twice`},
		{"bad duration", strings.Replace(base, "10s", "ten", 1), `"ten" is not a duration`},
		{"warmup too long", base + "warmup: 10s\n", "warmup: 10s: must be in [0, duration)"},
		{"jitter above mean", base + "latency: {mean: 10ms, jitter: 20ms}\n", "latency.jitter: 20ms above the mean 10ms"},
		{"loss of 1", base + "latency: {mean: 10ms, loss: 1}\n", "latency.loss: 1: must be in [0, 1)"},
		{"skew beyond max_skew", strings.Replace(base, "{name: us}", "{name: us, clock_skew: 400ms}", 1) + "max_skew: 500ms\n", "max_skew: 500ms: below twice the largest region clock skew"},
		{"no floor", base + "safe_fraction: 0\n", "safe_fraction: 0: must be in (0, 1]"},
		{"floor above the budget", base + "safe_fraction: 1.5\n", "safe_fraction: 1.5: must be in (0, 1]"},
		{"fence below twice the skew", base + "fence: 1ms\nmax_skew: 1ms\n", "fence: 1ms: below twice max_skew (1ms)"},
		{"unknown link region", base + "links: [{from: eu, to: mars, mean: 1ms}]\n", `links[0].to: unknown region "mars"`},
		{"unknown strategy", base + "strategies: [fifo]\n", `strategies[0]: unknown strategy "fifo"`},
		{"home strategy", base + "strategies: [home]\n", `"home" needs one home region`},
		{"interval too short", base + "intervals: [10ms]\n", "intervals[0]: 10ms: must be in [100ms, 10m]"},
		{"bad failure mode", base + "failure_mode: maybe\n", `failure_mode: "maybe"`},
		{"on_error without failure_mode error", base + "on_error: deny\n", `on_error: "deny": only failure_mode error leaves a decision to the caller (failure_mode is "closed")`},
		{"bad on_error", base + "failure_mode: error\non_error: retry\n", `on_error: "retry": want admit (Envoy's failure_mode_deny: false) or deny (true)`},
		{"fault outside the run", base + "faults: {redis_outage: [{region: eu, at: 8s, for: 5s}]}\n", "faults.redis_outage[0]: window [8s, 13s) must be non-empty and inside the run"},
		{"partition of every region", base + "faults: {partitions: [{side: [eu, us], at: 1s, for: 1s}]}\n", "faults.partitions[0].side: must name some regions, not all"},
		{"lognormal without sigma", strings.Replace(base, "{count: 5, ratio: 2}", "{count: 5}", 1), "keys.sigma"},
		{"zero keys", strings.Replace(base, "count: 5", "count: 0", 1), "keys.count: 0"},
		{"flash beyond keys", strings.Replace(base, "{rate: 100}", "{rate: 100, flash: [{region: eu, at: 1s, for: 1s, keys: 9, factor: 2}]}", 1), "workload.flash[0].keys: 9: must be in [1, keys.count]"},
		{"empty file", "", "empty file"},
		{"shared rules with reloads", strings.Replace(base, "ratio: 2}", "ratio: 2, shared_rules: true}", 1) + "faults: {policy_reloads: [{at: 2s, keys: 1, scale: 2}]}\n", "keys.shared_rules: true: cannot be combined with faults.policy_reloads"},
		{"reload scale 1", base + "faults: {policy_reloads: [{at: 2s, keys: 1, scale: 1}]}\n", "faults.policy_reloads[0].scale: 1: must be in [0.01, 100] and not 1"},
		{"reload scale 0", base + "faults: {policy_reloads: [{at: 2s, keys: 1, scale: 0}]}\n", "faults.policy_reloads[0].scale: 0"},
		{"reload beyond keys", base + "faults: {policy_reloads: [{at: 2s, keys: 6, scale: 2}]}\n", "faults.policy_reloads[0].keys: 6: must be in [1, keys.count 5]"},
		{"reload outside the run", base + "faults: {policy_reloads: [{at: 10s, keys: 1, scale: 2}]}\n", "faults.policy_reloads[0].at: 10s: outside the run"},
		{"reload spread past the end", base + "faults: {policy_reloads: [{at: 8s, keys: 1, scale: 2, spread: 3s}]}\n", "faults.policy_reloads[0].spread: 3s: must be at least 0 and end inside the run"},
		{"decide_fraction without reserve", strings.Replace(base, "{rate: 100}", "{rate: 100, retry: {max: 2, decide_fraction: 0.5}}", 1), "workload.retry.decide_fraction: 0.5: must be in [0, 1], and set only with reserve"},
		{"decide_fraction above 1", strings.Replace(base, "{rate: 100}", "{rate: 100, retry: {max: 2, reserve: 1s, decide_fraction: 2}}", 1), "workload.retry.decide_fraction: 2"},
		{"region decide_fraction without reserve", strings.Replace(base, "{name: us}", "{name: us, decide_fraction: 1}", 1), "regions[1].decide_fraction: 1: must be in [0, 1], and set only with workload.retry.reserve"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseScenario([]byte(tt.give))
			if err == nil || !errors.Is(err, ErrScenario) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want ErrScenario containing %q", err, tt.want)
			}
		})
	}
}

func TestBuiltinsParse(t *testing.T) {
	names := BuiltinNames()
	for _, want := range []string{"steady-skew", "follow-the-sun", "flash-crowd", "region-failover", "partition", "retry-storm", "many-keys", "coordinator-failover", "mixed-reserve", "migrating", "huge"} {
		if _, err := Builtin(want); err != nil {
			t.Errorf("built-in %s: %v (have %v)", want, err, names)
		}
	}
	if _, err := Builtin("nope"); err == nil {
		t.Error("unknown built-in accepted")
	}
}

func TestTraceErrors(t *testing.T) {
	sc := mustScenario(t, `
name: x
duration: 10s
regions: [{name: eu}, {name: us}]
keys: {count: 1, ratio: 2}
workload: {rate: 1}
`)
	tests := []struct{ name, give, want string }{
		{"fields", "ts_us,key,region,cost\n1,a,eu\n", "trace line 2: 3 fields"},
		{"timestamp", "x,a,eu,1\n", `trace line 1: timestamp "x"`},
		{"negative timestamp", "-1,a,eu,1\n", `trace line 1: timestamp "-1"`},
		{"out of order", "5,a,eu,1\n6,a,eu,1\n4,a,us,1\n", "trace line 3: timestamp 4 before the previous line's 6"},
		{"region", "1,a,mars,1\n", `trace line 1: region "mars"`},
		{"cost", "1,a,eu,-2\n", `trace line 1: cost "-2"`},
		{"huge cost", "1,a,eu,4294967296\n", `trace line 1: cost "4294967296"`},
		{"empty key", "1,,eu,1\n", "trace line 1: key of 0 bytes"},
		{"blank line", "1,a,eu,1\n\n", "trace line 2: empty line"},
		{"empty", "", "trace: no lines"},
		{"header only", "ts_us,key,region,cost\n", "trace: no lines"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := readTrace("t", strings.NewReader(tt.give), sc)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want %q", err, tt.want)
			}
		})
	}
	// Issue 18: a trace that ends within the warm-up measured nothing and
	// printed a table of zeros with a recommendation (fails on 12c75e9:
	// no error).
	sc.Warmup = Duration(5 * time.Second)
	const short = "4000000,a,eu,1\n"
	_, err := readTrace("t", strings.NewReader(short), sc)
	if want := "run over it ends at 5s, within the scenario's warm-up of 5s"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("trace ending in the warm-up: err = %v, want %q", err, want)
	}
	if _, err := readTrace("t", strings.NewReader("5000000,a,eu,1\n"), sc); err != nil {
		t.Errorf("trace ending after the warm-up: %v", err)
	}
	// A trace gives each request's region: migrations would move nothing.
	sc.Keys.HomeFraction, sc.Keys.Migrations = 1, &MigrationSpec{Min: 1, Max: 1}
	if _, err := readTrace("t", strings.NewReader("5000000,a,eu,1\n"), sc); err == nil || !strings.Contains(err.Error(), "keys.migrations would move nothing") {
		t.Errorf("trace with migrations: err = %v", err)
	}
}

func TestReportOutputs(t *testing.T) {
	sc := mustScenario(t, small)
	rep := sweep(t, sc, Options{Seeds: []uint64{1, 2, 3}, Intervals: []time.Duration{time.Second, 2 * time.Second}})
	var table, csv, html bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "recommendation (") || strings.Count(table.String(), "\n") != 2+len(rep.Cells)+1 {
		t.Errorf("table:\n%s", table.String())
	}
	if err := rep.WriteCSV(&csv); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(csv.String(), "\n"); n != len(rep.Cells)+1 {
		t.Errorf("CSV has %d lines, want %d", n, len(rep.Cells)+1)
	}
	var md bytes.Buffer
	if err := rep.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	// A heading, a blank line, the header and its rule, one row per
	// strategy: each with UA and OA_budget at both intervals and P,
	// messages and bytes at the first (the middle of two).
	mdLines := strings.Split(strings.TrimSpace(md.String()), "\n")
	strategies := len(rep.Cells) / 2
	if len(mdLines) != 4+strategies || !strings.HasPrefix(mdLines[0], "**"+sc.Name+"** — use ") ||
		!strings.HasPrefix(mdLines[2], "| strategy | UA 1s: Δ=1s | 2s | OA_budget: Δ=1s | 2s | P p99 (1s) | msg/key·region/s (1s) | B/key·region/s (1s) |") {
		t.Errorf("markdown:\n%s", md.String())
	}
	for _, l := range mdLines[3:] {
		if strings.Count(l, "|") != 9 {
			t.Errorf("markdown row with %d cells: %s", strings.Count(l, "|")-1, l)
		}
	}
	if err := rep.WriteHTML(&html); err != nil {
		t.Fatal(err)
	}
	h := html.String()
	for _, want := range []string{"<svg", "share of the budget", "UA 1s against the interval", "</html>"} {
		if !strings.Contains(h, want) {
			t.Errorf("HTML lacks %q", want)
		}
	}
	for _, bad := range []string{"<script", "http://cdn", "https://"} {
		if strings.Contains(h, bad) {
			t.Errorf("HTML is not self-contained: has %q", bad)
		}
	}
	// Issue 18 (each fails on 12c75e9): the report opens with the
	// trade-off chart, one point per cell; shares are named by region, the
	// warm-up is shaded; and no series runs past the end (a last point
	// at 0 dropped every chart).
	if i, j := strings.Index(h, "Under-admission against control cost"), strings.Index(h, "<table>"); i < 0 || i > j {
		t.Errorf("the trade-off chart does not open the report (at %d, table at %d)", i, j)
	}
	if n := strings.Count(h, "<circle"); n != len(rep.Cells) {
		t.Errorf("trade-off chart has %d points, want one per cell (%d)", n, len(rep.Cells))
	}
	for _, want := range []string{">eu</text>", ">us</text>", ">ap</text>", "warm-up"} {
		if !strings.Contains(h, want) {
			t.Errorf("HTML lacks %q", want)
		}
	}
	if top := rep.Runs[0].Top[0]; len(top.Offered) != 40 || top.Offered[39] == 0 {
		t.Errorf("top key's series: %d seconds, last %d; want 40 with demand in the last", len(top.Offered), top.Offered[len(top.Offered)-1])
	}
	// Three seeds give a confidence interval.
	if rep.Cells[0].UA1s.CI95 == 0 {
		t.Error("no confidence interval with 3 seeds")
	}
}

// Reserving clients (seed 000) against retrying ones on the retry-storm
// workload: fewer calls per admitted request, and still no over-admission.
func TestReservingClients(t *testing.T) {
	base, err := Builtin("retry-storm")
	if err != nil {
		t.Fatal(err)
	}
	base.Duration = Duration(60 * time.Second)
	if raceEnabled() {
		base.Warmup, base.Duration = Duration(5*time.Second), Duration(20*time.Second) // see TestClosedNeverOverAdmits
	}
	base.Seeds = []uint64{1}
	run := func(retry *RetrySpec) *Result {
		sc := *base
		sc.Workload.Retry = retry
		rep := sweep(t, &sc, Options{Strategies: []string{"ewma"}, Intervals: []time.Duration{time.Second}})
		return rep.Runs[0]
	}
	plain := run(nil)
	retrying := run(&RetrySpec{Max: 5, Jitter: 0.5})
	reserving := run(&RetrySpec{Max: 5, Jitter: 0.5, Reserve: Duration(2 * time.Second)})
	perAdmitted := func(r *Result) float64 { return float64(r.Requests) / float64(r.Admitted) }
	t.Logf("calls per admitted: no retries %.2f, retrying %.2f, reserving %.2f", perAdmitted(plain), perAdmitted(retrying), perAdmitted(reserving))
	if retrying.Requests <= plain.Requests {
		t.Errorf("retries did not inflate offered requests: %d vs %d", retrying.Requests, plain.Requests)
	}
	if perAdmitted(reserving) >= perAdmitted(retrying) {
		t.Errorf("reserving clients made %.2f calls per admitted request, retrying ones %.2f: want fewer", perAdmitted(reserving), perAdmitted(retrying))
	}
	for _, r := range []*Result{retrying, reserving} {
		if r.OABudget.Max != 0 {
			t.Errorf("OA_budget %+v with closed limits", r.OABudget)
		}
	}
}

// TestMixedReserveHoldsTheBudget: deciding and reserving clients on the
// same keys through a shift of demand (the mixed-reserve scenario). Booked
// future acts when its wait ends, beside the deciding clients' admissions,
// so it must never outlive the fence before the increase the shift brings
// (ARCHITECTURE.md invariant 4): OA_budget 0 for every strategy.
//
// fails on 2023668 (its region package under this simulator and scenario):
// the node booked up to the lease left, so eu's clients booked 20 s ahead;
// OA_budget mean 4.9–8.1 % (max per key 9.3–15.9 %) for every strategy that
// moves shares (static, which does not, scored 0).
func TestMixedReserveHoldsTheBudget(t *testing.T) {
	sc, err := Builtin("mixed-reserve")
	if err != nil {
		t.Fatal(err)
	}
	opt := Options{KeyDetail: true}
	if raceEnabled() {
		// A representative subset (see TestClosedNeverOverAdmits).
		opt.Strategies, opt.Intervals = []string{"ewma"}, []time.Duration{time.Second}
	}
	rep := sweep(t, sc, opt)
	for _, r := range rep.Runs {
		t.Logf("%s at %s: OA_budget mean %.5f max %.5f; admitted %d, oracle %d, offered %d", r.Strategy, r.Interval.D(),
			r.OABudget.Mean, r.OABudget.Max, r.Admitted, r.OracleAdmitted, r.Offered)
		if r.OABudget.Max != 0 {
			for _, k := range r.Keys {
				if k.OABudget > 0 {
					t.Errorf("%s at %s: key %s admitted beyond its budget: OA_budget %.5f", r.Strategy, r.Interval.D(), k.Key, k.OABudget)
				}
			}
		}
	}
}

// TestReplicatedCounterSendsOnlyWhatIsNew: the baseline counts a message
// only when a region has admissions another has not seen. One key whose
// traffic is all in one region makes two messages per sync (to each other
// region), not one per region pair: before issue 18 every pair counted at
// every sync, empty or not — three times too many here (fails on 12c75e9:
// 6 per sync).
func TestReplicatedCounterSendsOnlyWhatIsNew(t *testing.T) {
	sc := mustScenario(t, `
name: one-region
duration: 20s
warmup: 5s
regions: [{name: eu}, {name: us}, {name: ap}]
keys: {count: 1, ratio: 2, burst_seconds: 1, home_fraction: 1}
workload: {rate: 200}
`)
	rep := sweep(t, sc, Options{Strategies: []string{ReplicatedCounter}, Intervals: []time.Duration{time.Second}})
	res := rep.Runs[0]
	syncs := sc.Duration.D() / sc.Sync.D()
	msgs := res.Messages * float64(len(sc.Regions)) * sc.Duration.D().Seconds() // one key
	perSync := msgs / float64(syncs)
	if perSync < 1.9 || perSync > 2.0 {
		t.Errorf("%.0f messages over %d syncs (%.2f each), want 2 per sync: the home region to each other one", msgs, syncs, perSync)
	}
	// A message lost on the link was still sent: it counts, and in Lost
	// (as Meridian's own messages do; a review found lost batches left
	// out, which flattered the baseline).
	sc.Latency = LinkSpec{Mean: Duration(10 * time.Millisecond), Loss: 0.5}
	res = sweep(t, sc, Options{Strategies: []string{ReplicatedCounter}, Intervals: []time.Duration{time.Second}}).Runs[0]
	msgs = res.Messages * float64(len(sc.Regions)) * sc.Duration.D().Seconds()
	if perSync := msgs / float64(syncs); perSync < 1.9 || perSync > 2.0 || res.Lost < int64(msgs/4) {
		t.Errorf("with half the messages lost: %.0f messages (%.2f a sync), %d lost; want 2 a sync and about half lost", msgs, perSync, res.Lost)
	}
}

// TestReportSaysNever: a cell whose median key never converged prints
// "never", not 0.0 (issue 18; fails on 12c75e9, which printed the
// converged keys' mean — 0.0 with none), and the keys that never
// converged are in the table and the CSV.
func TestReportSaysNever(t *testing.T) {
	rep := &Report{Scenario: "x", Shift: Duration(time.Second), Cells: []Cell{
		{Strategy: "ewma", Interval: Duration(time.Second), Seeds: 2, ConvergenceRuns: 2, ConvergenceNever: 2, NeverKeys: Stat{Mean: 60}, ConvergenceKeys: 100},
		{Strategy: "static", Interval: Duration(time.Second), Seeds: 3, ConvergenceRuns: 3, Convergence: Stat{Mean: 4.5}, NeverKeys: Stat{Mean: 47.0 + 2.0/3}, ConvergenceKeys: 100},
		{Strategy: "maxmin", Interval: Duration(time.Second), Seeds: 2, ConvergenceRuns: 2, Convergence: Stat{Mean: 2}, ConvergenceKeys: 100},
		{Strategy: "proportional", Interval: Duration(time.Second), Seeds: 2},
	}}
	var table, csv bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"never (60/100 keys never)", "4.5 (47.7/100 keys never)", " 2.0 ", "- (no key measurable)"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	if err := rep.WriteCSV(&csv); err != nil {
		t.Fatal(err)
	}
	var md bytes.Buffer
	if err := rep.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md.String(), "| never (60/100 keys never) |") || !strings.Contains(md.String(), "| converge s (1s) |") {
		t.Errorf("markdown lacks the convergence column or ewma's never:\n%s", md.String())
	}
	var empty bytes.Buffer
	if err := (&Report{Scenario: "none"}).WriteHTML(&empty); err != nil || !strings.Contains(empty.String(), "</html>") {
		t.Errorf("a report with no cells: %v\n%s", err, empty.String())
	}
	lines := strings.Split(strings.TrimSpace(csv.String()), "\n")
	head := strings.Split(lines[0], ",")
	ewma := strings.Split(lines[1], ",")
	col := func(name string) string {
		i := slices.Index(head, name)
		if i < 0 {
			t.Fatalf("CSV has no column %q: %s", name, lines[0])
		}
		return ewma[i]
	}
	if col("never_converged_keys") != "60" || col("convergence_never_seeds") != "2" || col("convergence_keys") != "100" {
		t.Errorf("CSV row %s", lines[1])
	}
}

// TestMigrationsMoveAKeysHome: with home_fraction 1 and migrations, each
// key is offered traffic in exactly one region at a time — its home until
// its first move, then each move's region from the move on — and every key
// moves between min and max times, each to another region. (Issue 18's
// migrating tenants; new here.)
func TestMigrationsMoveAKeysHome(t *testing.T) {
	const yml = `
name: m
duration: 30s
warmup: 5s
regions: [{name: eu}, {name: us}, {name: ap}]
keys: {count: 10, zipf: 1, ratio: 1, burst_seconds: 1, home_fraction: 1, migrations: {min: 1, max: 3}}
workload: {rate: 2000}
`
	sc := mustScenario(t, yml)
	r, err := NewRun(sc, "static", time.Second, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	moved := map[int]bool{}
	r.m.onRecord = func(i, ri int, _ int64, _, _ bool, ts int64) {
		if want := r.homeAt(i, ts); ri != want {
			t.Fatalf("key %d offered in region %d at %dµs, want %d (moves %v)", i, ri, ts, want, r.keys[i].moves)
		}
		if ri != r.keys[i].home {
			moved[i] = true
		}
	}
	if _, err := r.Simulate(); err != nil {
		t.Fatal(err)
	}
	for i := range r.keys {
		k := &r.keys[i]
		if n := len(k.moves); n < 1 || n > 3 {
			t.Errorf("key %d moved %d times, want 1 to 3", i, n)
		}
		prev := k.home
		for _, m := range k.moves {
			if m.to == prev || m.t < 5_000_000 || m.t >= 30_000_000 {
				t.Errorf("key %d: move %+v from region %d", i, m, prev)
			}
			prev = m.to
		}
	}
	if len(moved) < 8 {
		t.Errorf("only %d of 10 keys were offered traffic away from their first home", len(moved))
	}
	for _, bad := range []string{"migrations: {min: 2, max: 1}", "migrations: {min: -1, max: 1}"} {
		if _, err := ParseScenario([]byte(strings.Replace(yml, "migrations: {min: 1, max: 3}", bad, 1))); err == nil || !strings.Contains(err.Error(), "keys.migrations") {
			t.Errorf("%s: err = %v", bad, err)
		}
	}
}

// TestSharedRulesKeepKeysApart runs keys.shared_rules: the policy has one
// rule per distinct budget, far fewer than keys, yet each key keeps the
// budget its own demand drew (rounded down to the grid) and its own row in
// the tables — as a tenant=* rule gives every tenant its own limit.
func TestSharedRulesKeepKeysApart(t *testing.T) {
	const yml = `
name: s
duration: 12s
warmup: 2s
regions: [{name: eu}, {name: us}]
keys: {count: 1000, zipf: 0.5, sigma: 1, over_fraction: 0.3, burst_seconds: 1, home_fraction: 0.7}
workload: {rate: 6000}
`
	perKey, err := NewRun(mustScenario(t, yml), "ewma", time.Second, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	shared, err := NewRun(mustScenario(t, strings.Replace(yml, "home_fraction: 0.7}", "home_fraction: 0.7, shared_rules: true}", 1)), "ewma", time.Second, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	rules := shared.policy.Rules()
	if len(rules) < 2 || len(rules) > len(shared.keys)/4 {
		t.Fatalf("%d rules for %d keys, want a few shared ones", len(rules), len(shared.keys))
	}
	seen := map[string]bool{}
	for i := range shared.keys {
		k, p := &shared.keys[i], &perKey.keys[i]
		if seen[k.name] {
			t.Fatalf("key %d: name %q given twice", i, k.name)
		}
		seen[k.name] = true
		if got := shared.policy.Match("sim", k.req.Descriptors[0].Entries); got != rules[k.rule] || k.budget != rules[k.rule].Limit {
			t.Fatalf("key %d (%s): resolves to %v, budget %v; want rule %d (%v)", i, k.name, got, k.budget, k.rule, rules[k.rule].Limit)
		}
		// Rounded down by at most one grid step (2^(1/16): 4.3 %), give or
		// take the one request per period budgetFor rounds to (and the 1 %
		// validRate may add above 10,000/s).
		ps, pp := float64(k.reqs[0])/k.period.Seconds(), float64(p.reqs[0])/p.period.Seconds()
		one := 1 / min(k.period.Seconds(), p.period.Seconds())
		if ps > pp*1.01+one || ps < pp/math.Exp2(1.0/sharedSteps)*0.99-one {
			t.Errorf("key %d: shared budget %.4g/s, per-key %.4g/s: not within one grid step below", i, ps, pp)
		}
	}
	if _, err := shared.Simulate(); err != nil {
		t.Fatal(err)
	}
	// Every key with demand has a row of its own in the tables.
	for _, rg := range shared.regions {
		if n := rg.nodes[0].Table().Keys; n <= len(rules) {
			t.Errorf("%s: the table in force has %d keys, no more than the %d rules", rg.name, n, len(rules))
		}
	}
	// The safety checks run on it too: each key measured against its own
	// rule, not the rule at its key's index (which panicked).
	v, err := CheckRun(mustScenario(t, strings.Replace(yml, "home_fraction: 0.7}", "home_fraction: 0.7, shared_rules: true}", 1)), "ewma", time.Second, 1)
	if err != nil || v != nil {
		t.Fatalf("CheckRun: violation %v, err %v", v, err)
	}
}

// TestTimeTablesChangesNoResult: timing the coordinator's tables (what
// `meridian sim --bench` prints) records one wall time per table the
// coordinator made and leaves the report byte-identical.
func TestTimeTablesChangesNoResult(t *testing.T) {
	sc := mustScenario(t, small)
	opt := Options{Seeds: []uint64{1}, Strategies: []string{"ewma"}, Intervals: []time.Duration{time.Second}, KeyDetail: true}
	var out [2]bytes.Buffer
	for i, timed := range []bool{false, true} {
		opt.TimeTables = timed
		rep := sweep(t, sc, opt)
		if err := rep.WriteJSON(&out[i]); err != nil {
			t.Fatal(err)
		}
		got := rep.Runs[0].TableTimes
		if !timed && got != nil {
			t.Errorf("untimed run recorded %d table times", len(got))
		}
		// The coordinator rebalances every interval (and renews leases
		// between), so the run makes at least one table per two seconds.
		if timed && len(got) < int(sc.Duration.D()/time.Second)/2 {
			t.Errorf("timed run recorded %d table times in %s at Δ = 1s", len(got), sc.Duration.D())
		}
		for _, d := range got {
			if d < 0 {
				t.Fatalf("a table took %s", d)
			}
		}
	}
	if !bytes.Equal(out[0].Bytes(), out[1].Bytes()) {
		t.Fatal("timing the tables changed the JSON report")
	}
}
