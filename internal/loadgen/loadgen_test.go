package loadgen

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fakeTarget decides on a fake clock: the i-th call (from 0, over all
// callers) takes latency(i) and is allowed when i is even; errEvery > 0
// fails every errEvery-th call instead.
type fakeTarget struct {
	clock    atomic.Int64 // ns
	calls    atomic.Int64
	latency  func(i int64) time.Duration
	errEvery int64
	keys     []int // keys seen, in order (single caller only)
}

var errFake = errors.New("fake failure")

func (f *fakeTarget) now() time.Duration { return time.Duration(f.clock.Load()) }

func (f *fakeTarget) target() Target {
	return Target{Name: "fake", Decide: func(_ context.Context, k int) (bool, error) {
		i := f.calls.Add(1) - 1
		f.clock.Add(int64(f.latency(i)))
		f.keys = append(f.keys, k)
		if f.errEvery > 0 && (i+1)%f.errEvery == 0 {
			return false, errFake
		}
		return i%2 == 0, nil
	}}
}

func TestRunCountsAndPercentiles(t *testing.T) {
	// Two warm-up calls of 500µs, then calls taking 1µs, 2µs, … 100µs:
	// exactly 100 measured calls fill the 5050µs run.
	f := &fakeTarget{latency: func(i int64) time.Duration {
		if i < 2 {
			return 500 * time.Microsecond
		}
		return time.Duration(i-1) * time.Microsecond
	}}
	cfg := Config{Callers: 1, Duration: 5050 * time.Microsecond, Keys: 7, Seed: 3, Warmup: time.Millisecond}
	r, err := run(context.Background(), cfg, f.target(), options{now: f.now, maxSamples: 1000})
	if err != nil {
		t.Fatal(err)
	}
	want := Report{
		Target: "fake", Callers: 1,
		Decisions: 100, Allowed: 50, Errors: 0,
		Elapsed:   5050 * time.Microsecond,
		PerSecond: 100 / 0.00505,
		P50:       50 * time.Microsecond, P99: 99 * time.Microsecond, Max: 100 * time.Microsecond,
		AllowedFraction: 0.5,
	}
	if len(r.samples) != 100 {
		t.Errorf("kept %d latency samples, want 100", len(r.samples))
	}
	r.samples = nil
	if !reflect.DeepEqual(r, want) {
		t.Errorf("report\n got %+v\nwant %+v", r, want)
	}
	if got := f.calls.Load(); got != 102 {
		t.Errorf("Decide called %d times, want 102 (2 warm-up + 100)", got)
	}
	for _, k := range f.keys {
		if k < 0 || k >= cfg.Keys {
			t.Fatalf("key %d outside [0, %d)", k, cfg.Keys)
		}
	}
}

func TestRunSeedFixesKeys(t *testing.T) {
	keys := func(seed uint64) []int {
		f := &fakeTarget{latency: func(int64) time.Duration { return time.Microsecond }}
		cfg := Config{Callers: 1, Duration: 200 * time.Microsecond, Keys: 1000, Seed: seed}
		if _, err := run(context.Background(), cfg, f.target(), options{now: f.now, maxSamples: 10}); err != nil {
			t.Fatal(err)
		}
		return f.keys
	}
	a, b, c := keys(1), keys(1), keys(2)
	if len(a) != 200 {
		t.Fatalf("got %d keys, want 200", len(a))
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("same seed, key %d differs: %d vs %d", i, a[i], b[i])
		}
	}
	same := 0
	for i := range a {
		if a[i] == c[i] {
			same++
		}
	}
	if same > 20 {
		t.Errorf("seeds 1 and 2 agree on %d of 200 keys", same)
	}
}

func TestRunReservoirKeepsMaxExact(t *testing.T) {
	// 1000 calls of 10µs and one of 1ms, with room for 10 samples: the
	// percentiles come from the sample, the maximum stays exact.
	f := &fakeTarget{latency: func(i int64) time.Duration {
		if i == 500 {
			return time.Millisecond
		}
		return 10 * time.Microsecond
	}}
	cfg := Config{Callers: 1, Duration: 1000*10*time.Microsecond + time.Millisecond, Keys: 1}
	r, err := run(context.Background(), cfg, f.target(), options{now: f.now, maxSamples: 10})
	if err != nil {
		t.Fatal(err)
	}
	if r.Decisions != 1001 || r.Max != time.Millisecond || r.P50 != 10*time.Microsecond {
		t.Errorf("Decisions %d Max %s P50 %s; want 1001, 1ms, 10µs", r.Decisions, r.Max, r.P50)
	}
}

func TestRunErrors(t *testing.T) {
	tests := []struct {
		name      string
		giveEvery int64
		wantErrs  int64
		wantFail  bool
	}{
		{name: "under 1%", giveEvery: 200, wantErrs: 5},
		{name: "over 1%", giveEvery: 10, wantErrs: 100, wantFail: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeTarget{latency: func(int64) time.Duration { return time.Microsecond }, errEvery: tt.giveEvery}
			cfg := Config{Callers: 1, Duration: 1000 * time.Microsecond, Keys: 10}
			r, err := run(context.Background(), cfg, f.target(), options{now: f.now, maxSamples: 2000})
			if r.Errors != tt.wantErrs || r.Decisions != 1000-tt.wantErrs {
				t.Errorf("Errors %d Decisions %d, want %d and %d", r.Errors, r.Decisions, tt.wantErrs, 1000-tt.wantErrs)
			}
			if tt.wantFail {
				if !errors.Is(err, errFake) || !errors.Is(r.Err, errFake) {
					t.Errorf("err %v, Report.Err %v; want both to wrap errFake", err, r.Err)
				}
				return
			}
			if err != nil || r.Err != nil {
				t.Errorf("err %v, Report.Err %v; want nil", err, r.Err)
			}
		})
	}
}

// TestRunConcurrent runs real goroutines on the real clock: counts add up
// whatever the interleaving.
func TestRunConcurrent(t *testing.T) {
	var calls, allowed atomic.Int64
	target := Target{Name: "alt", Decide: func(context.Context, int) (bool, error) {
		calls.Add(1)
		ok := calls.Load()%2 == 0
		if ok {
			allowed.Add(1)
		}
		return ok, nil
	}}
	cfg := Config{Callers: 4, Duration: 20 * time.Millisecond, Keys: 100, Seed: 1}
	r, err := Run(context.Background(), cfg, target)
	if err != nil {
		t.Fatal(err)
	}
	if r.Decisions == 0 || r.Decisions != calls.Load() || r.Allowed != allowed.Load() {
		t.Errorf("Decisions %d Allowed %d; target saw %d calls, %d allowed", r.Decisions, r.Allowed, calls.Load(), allowed.Load())
	}
	if r.P50 > r.P99 || r.P99 > r.Max || r.PerSecond <= 0 || r.Elapsed < cfg.Duration {
		t.Errorf("inconsistent report %+v", r)
	}
}

func TestRunCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	target := Target{Name: "cancel", Decide: func(ctx context.Context, _ int) (bool, error) {
		cancel()
		return false, ctx.Err()
	}}
	cfg := Config{Callers: 2, Duration: time.Hour, Keys: 1}
	r, err := Run(ctx, cfg, target)
	if !errors.Is(err, context.Canceled) || r.Errors != 0 {
		t.Errorf("err %v, Errors %d; want context.Canceled and no counted errors", err, r.Errors)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Errorf("DefaultConfig: %v", err)
	}
	err := Config{Callers: 0, Duration: 0, Keys: 0, Warmup: -1}.Validate()
	for _, want := range []string{"Callers 0", "Duration 0s", "Keys 0", "Warmup -1ns"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to mention %q", err, want)
		}
	}
}

func TestPercentile(t *testing.T) {
	ms := func(ns ...int) []time.Duration {
		out := make([]time.Duration, len(ns))
		for i, n := range ns {
			out[i] = time.Duration(n) * time.Millisecond
		}
		return out
	}
	tests := []struct {
		give []time.Duration
		q    float64
		want time.Duration
	}{
		{give: nil, q: 0.5, want: 0},
		{give: ms(7), q: 0.99, want: 7 * time.Millisecond},
		{give: ms(1, 2), q: 0.5, want: time.Millisecond},
		{give: ms(1, 2, 3), q: 0.5, want: 2 * time.Millisecond},
		{give: ms(1, 2, 3, 4), q: 0.99, want: 4 * time.Millisecond},
		{give: ms(1, 2, 3, 4), q: 1, want: 4 * time.Millisecond},
	}
	for _, tt := range tests {
		if got := Percentile(tt.give, tt.q); got != tt.want {
			t.Errorf("Percentile(%v, %v) = %s, want %s", tt.give, tt.q, got, tt.want)
		}
	}
}

func TestFormatTable(t *testing.T) {
	var sb strings.Builder
	err := FormatTable(&sb, []Report{
		{Target: "meridian", Callers: 64, PerSecond: 91234.4, P50: 612 * time.Microsecond, P99: 1270 * time.Microsecond, Max: 9 * time.Millisecond, AllowedFraction: 0.9991},
		{Target: "redis_rate", Callers: 64, PerSecond: 37000, P50: 1700 * time.Microsecond, P99: 3 * time.Millisecond, Max: 12 * time.Millisecond, AllowedFraction: 1, Errors: 3},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := "" +
		"  target      callers  decisions/s     p50     p99      max  allowed  errors\n" +
		"  meridian         64        91234   612µs  1.27ms   9.00ms    0.999       0\n" +
		"  redis_rate       64        37000  1.70ms  3.00ms  12.00ms    1.000       3\n"
	if sb.String() != want {
		t.Errorf("FormatTable:\n%q\nwant:\n%q", sb.String(), want)
	}
}

// TestMerge merges two rounds measured on the fake clock: counts and time
// add up, and the percentiles are those of all samples together.
func TestMerge(t *testing.T) {
	round := func(first int64) Report {
		// 50 calls of 1..50µs, or 51..100µs: one caller, half allowed.
		f := &fakeTarget{latency: func(i int64) time.Duration { return time.Duration(first+i) * time.Microsecond }}
		var d time.Duration
		for i := range int64(50) {
			d += time.Duration(first+i) * time.Microsecond
		}
		r, err := run(context.Background(), Config{Callers: 1, Duration: d, Keys: 1, Seed: 1}, f.target(), options{now: f.now, maxSamples: 1000})
		if err != nil || r.Decisions != 50 {
			t.Fatalf("round from %dµs: %d decisions, err %v", first, r.Decisions, err)
		}
		return r
	}
	a, b := round(1), round(51)
	m := Merge(b, a)
	if m.Target != "fake" || m.Callers != 1 || m.Decisions != 100 || m.Allowed != 50 || m.Errors != 0 {
		t.Errorf("counts %+v", m)
	}
	if m.Elapsed != a.Elapsed+b.Elapsed || m.Elapsed != 5050*time.Microsecond {
		t.Errorf("Elapsed %s, want %s + %s = 5.05ms", m.Elapsed, a.Elapsed, b.Elapsed)
	}
	if want := 100 / 0.00505; m.PerSecond != want {
		t.Errorf("PerSecond %v, want %v", m.PerSecond, want)
	}
	if m.P50 != 50*time.Microsecond || m.P99 != 99*time.Microsecond || m.Max != 100*time.Microsecond {
		t.Errorf("P50 %s P99 %s Max %s, want 50µs 99µs 100µs (the rounds' samples together)", m.P50, m.P99, m.Max)
	}
	if m.AllowedFraction != 0.5 {
		t.Errorf("AllowedFraction %v", m.AllowedFraction)
	}
	if z := Merge(); z.Decisions != 0 || z.Target != "" {
		t.Errorf("Merge() = %+v, want the zero Report", z)
	}
}

// TestInterleave alternates two targets on fake clocks: each takes its
// turn every round, the first round warms up for Config.Warmup and later
// ones for Rewarm, and the merged report counts every measured decision.
func TestInterleave(t *testing.T) {
	var order []string // one caller, rounds one after another: no race
	fakes := map[string]*fakeTarget{}
	mk := func(name string) Target {
		f := &fakeTarget{latency: func(int64) time.Duration { return 100 * time.Microsecond }}
		fakes[name] = f
		inner := f.target()
		return Target{Name: name, Decide: func(ctx context.Context, k int) (bool, error) {
			if n := len(order); n == 0 || order[n-1] != name {
				order = append(order, name)
			}
			return inner.Decide(ctx, k)
		}}
	}
	runRound := func(ctx context.Context, cfg Config, tg Target) (Report, error) {
		return run(ctx, cfg, tg, options{now: fakes[tg.Name].now, maxSamples: 1000})
	}
	a, b := mk("a"), mk("b")
	// Three rounds of 10 ms: 100 calls of 100µs each; warm-up 1 s (10,000
	// calls) in the first round, Rewarm (200 ms: 2,000 calls) in the others.
	cfg := Config{Callers: 1, Duration: 30 * time.Millisecond, Keys: 10, Seed: 1, Warmup: time.Second}
	rs, err := interleave(context.Background(), cfg, 3, []Target{a, b}, runRound)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[0].Target != "a" || rs[1].Target != "b" {
		t.Fatalf("reports %+v, want a then b", rs)
	}
	if got := strings.Join(order, ""); got != "ababab" {
		t.Errorf("turns %q, want ababab", got)
	}
	for i, name := range []string{"a", "b"} {
		r := rs[i]
		if r.Decisions != 300 || r.Elapsed != cfg.Duration || r.PerSecond != 10_000 {
			t.Errorf("%s: %d decisions in %s (%v/s), want 300 in 30ms (10000/s)", name, r.Decisions, r.Elapsed, r.PerSecond)
		}
		if got, want := fakes[name].calls.Load(), int64(10_000+100+2*(2_000+100)); got != want {
			t.Errorf("%s: %d calls, want %d (warm-up 1s, then 200ms per later round)", name, got, want)
		}
	}
	if _, err := Interleave(context.Background(), cfg, 0, []Target{a}); err == nil || !strings.Contains(err.Error(), "rounds 0") {
		t.Errorf("rounds 0: err %v", err)
	}
	fakes["f"] = &fakeTarget{}
	failing := Target{Name: "f", Decide: func(context.Context, int) (bool, error) {
		fakes["f"].clock.Add(int64(time.Millisecond)) // its fake clock moves too
		return false, errFake
	}}
	rs, err = interleave(context.Background(), cfg, 3, []Target{a, failing, b}, runRound)
	if !errors.Is(err, errFake) || len(rs) != 2 || rs[1].Target != "f" {
		t.Errorf("a failing target: err %v, %d reports; want errFake and the reports of a and f", err, len(rs))
	}
}
