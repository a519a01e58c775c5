package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gcra/redisstore"
	"github.com/meridian-quota/meridian/internal/regiontest"
	"github.com/meridian-quota/meridian/internal/testenv"
	"github.com/meridian-quota/meridian/rebalance"
	"github.com/meridian-quota/meridian/region"
)

const failurePolicy = `
domains:
  - domain: f
    descriptors:
      - key: closed
        rate_limit: {unit: hour, requests_per_unit: 100, burst: 10, failure_mode: closed}
      - key: open
        rate_limit: {unit: hour, requests_per_unit: 100, burst: 10, failure_mode: open}
      - key: local
        rate_limit: {unit: hour, requests_per_unit: 100, burst: 10, failure_mode: local}
`

// pausableStore starts a private redis-server (to SIGSTOP), a client and
// a store on it with a 30 ms timeout behind a breaker (3 failures, 200 ms
// cooldown), and parses policy: the failure-mode tests' set-up.
func pausableStore(t *testing.T, policy string) (*testenv.Server, *redis.Client, *Breaker, *region.Policy) {
	t.Helper()
	srv := testenv.StartRedis(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	scfg := redisstore.DefaultConfig()
	scfg.Timeout = 30 * time.Millisecond
	store, err := redisstore.New(c, scfg)
	if err != nil {
		t.Fatal(err)
	}
	br, err := NewBreaker(BreakerConfig{Failures: 3, Cooldown: Duration(200 * time.Millisecond)}, store)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := region.ParsePolicy([]byte(policy))
	if err != nil {
		t.Fatal(err)
	}
	return srv, c, br, pol
}

// TestRedisFailureModesAndBreaker pauses a private redis-server (SIGSTOP):
// every limit's failure mode decides within the timeout, the breaker opens
// and then fails calls at once, and once Redis is back a probe closes it;
// the counts show on /metrics.
func TestRedisFailureModesAndBreaker(t *testing.T) {
	srv, c, br, pol := pausableStore(t, failurePolicy)
	node, err := region.NewNode(region.DefaultConfig("eu", "eu-1", "eu"), pol, br)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMicro()
	tb := &rebalance.Table{Term: 1, Epoch: 1, Issued: now, Effective: now - 3600e6, Regions: []string{"eu"},
		Leases: []int64{now + 600e6}, Agents: [][]string{{"eu-1"}}}
	for _, k := range []string{"closed", "local", "open"} {
		tb.Keys = append(tb.Keys, rebalance.KeyShares{Key: region.KeyName("f", []region.Entry{{Key: k, Value: "x"}}),
			Budget: pol.Rules()[0].Limit, Shares: []uint32{rebalance.PPM}, Version: 1})
	}
	if err := node.Apply(tb, now); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.DrainDelay = 0 // stopped at once
	cfg.Region, cfg.Agent, cfg.Regions, cfg.Policy, cfg.ReloadEvery = "eu", "eu-1", []string{"eu"}, "unused", 0
	a, err := New(cfg, node, nil, br.Collectors()...)
	if err != nil {
		t.Fatal(err)
	}
	cl := serveRLS(t, a)
	decide := func(mode string) rlsv3.RateLimitResponse_Code {
		t.Helper()
		resp, err := cl.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "f",
			Descriptors: []*commonv3.RateLimitDescriptor{desc(nil, mode, "x")}})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Statuses[0].Code != resp.OverallCode {
			t.Errorf("%s: descriptor status %v, overall %v: the status must say which limit denied", mode, resp.Statuses[0].Code, resp.OverallCode)
		}
		return resp.OverallCode
	}
	for _, m := range []string{"closed", "open", "local"} {
		if got := decide(m); got != rlsv3.RateLimitResponse_OK {
			t.Fatalf("%s with Redis up: %v", m, got)
		}
	}
	a.SetStoreCheck(func(ctx context.Context) error { return c.Ping(ctx).Err() })
	hs0 := httptest.NewServer(a.Handler())
	defer hs0.Close()
	ready := func() int {
		resp, err := http.Get(hs0.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := ready(); got != 200 {
		t.Errorf("/readyz with Redis up: %d", got)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	if got := ready(); got != http.StatusServiceUnavailable {
		t.Errorf("/readyz with Redis paused: %d, want 503", got)
	}
	want := map[string]rlsv3.RateLimitResponse_Code{"closed": rlsv3.RateLimitResponse_OVER_LIMIT,
		"open": rlsv3.RateLimitResponse_OK, "local": rlsv3.RateLimitResponse_OK}
	for range 3 { // the third failure in a row opens the breaker
		for _, m := range []string{"closed", "open", "local"} {
			start := time.Now()
			if got := decide(m); got != want[m] {
				t.Errorf("%s with Redis paused: %v, want %v", m, got, want[m])
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("%s took %v with Redis paused: the timeout did not hold", m, d)
			}
		}
	}
	if !br.Open() {
		t.Fatal("breaker still closed after 9 failures")
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for br.Open() && time.Now().Before(deadline) {
		decide("open")
		time.Sleep(20 * time.Millisecond) // poll: the cooldown must pass before a probe
	}
	if br.Open() {
		t.Fatal("breaker did not close once Redis was back")
	}
	if got := decide("closed"); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("closed after recovery: %v", got)
	}
	hs := httptest.NewServer(a.Handler())
	defer hs.Close()
	resp, err := http.Get(hs.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	for _, line := range []string{"meridian_fallback_closed_total", "meridian_fallback_open_total", "meridian_fallback_local_total",
		"meridian_breaker_opens_total 1", "meridian_breaker_rejected_total", "meridian_breaker_open 0"} {
		if !strings.Contains(b.String(), line) {
			t.Errorf("/metrics lacks %q", line)
		}
	}
	if s := node.Stats(); s.FallbackClosed < 3 || s.FallbackOpen < 3 || s.FallbackLocal < 3 {
		t.Errorf("fallback counts %+v, want at least 3 of each mode", s)
	}
}

// Each RLS decision is a server span, each store call a client span under
// it.
func TestTracingSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	br, err := NewBreaker(BreakerConfig{Failures: 3, Cooldown: Duration(time.Second)}, regiontest.RedisStore(t))
	if err != nil {
		t.Fatal(err)
	}
	br.SetTracerProvider(tp)
	node := regiontest.Node(t, testPolicy, br)
	cfg := DefaultConfig()
	cfg.DrainDelay = 0 // stopped at once
	cfg.Region, cfg.Agent, cfg.Regions, cfg.Policy, cfg.ReloadEvery = "eu", "eu-1", []string{"eu"}, "unused", 0
	a, err := New(cfg, node, nil, br.Collectors()...)
	if err != nil {
		t.Fatal(err)
	}
	a.SetTracerProvider(tp)
	if _, err := a.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api",
		Descriptors: []*commonv3.RateLimitDescriptor{desc(nil, "tenant", "traced")}}); err != nil {
		t.Fatal(err)
	}
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want the RLS call and the store call", len(spans))
	}
	store, rls := spans[0], spans[1]
	if rls.Name() != "meridian.rls.ShouldRateLimit" || store.Name() != "meridian.store.DecideAll" || store.Parent().SpanID() != rls.SpanContext().SpanID() {
		t.Errorf("spans %q (parent %v) and %q (%v)", store.Name(), store.Parent().SpanID(), rls.Name(), rls.SpanContext().SpanID())
	}
}

func TestCurrentLimitLargeRates(t *testing.T) {
	for _, tt := range []struct {
		give gcra.Limit
		n    uint32
		unit rlsv3.RateLimitResponse_RateLimit_Unit
	}{
		{gcra.PerHour(3_000_000, 1000), 3_000_000, rlsv3.RateLimitResponse_RateLimit_HOUR},
		{gcra.New(1_000_000, 24*time.Hour, 1000), 1_000_000, rlsv3.RateLimitResponse_RateLimit_DAY},
		{gcra.New(5, 10*time.Second, 5), 30, rlsv3.RateLimitResponse_RateLimit_MINUTE},
		{gcra.PerSecond(1000, 100), 1000, rlsv3.RateLimitResponse_RateLimit_SECOND},
	} {
		if got := currentLimit(tt.give); got.RequestsPerUnit != tt.n || got.Unit != tt.unit {
			t.Errorf("currentLimit(%v) = %v, want %d per %v", tt.give, got, tt.n, tt.unit)
		}
	}
}

// ctxStore fails every call with the caller's context error.
type ctxStore struct{}

func (ctxStore) DecideAll(ctx context.Context, _ []gcra.Check, _ []gcra.Result) (gcra.Result, error) {
	return gcra.Result{}, ctx.Err()
}

// Callers that give up must not open the breaker for everyone.
func TestBreakerIgnoresCancelledCallers(t *testing.T) {
	br, err := NewBreaker(BreakerConfig{Failures: 2, Cooldown: Duration(time.Minute)}, ctxStore{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 10 {
		_, _ = br.DecideAll(ctx, nil, nil)
	}
	if br.Open() {
		t.Error("cancelled callers opened the breaker")
	}
}

// hangStore holds each call until its caller's context ends.
type hangStore struct{}

func (hangStore) DecideAll(ctx context.Context, _ []gcra.Check, _ []gcra.Result) (gcra.Result, error) {
	<-ctx.Done()
	return gcra.Result{}, ctx.Err()
}

// TestBreakerOpensOnCallerDeadlines is issue 17's defect 8: a hung Redis
// (a private redis-server, SIGSTOPped) behind a Redis timeout longer than
// the callers' deadlines (1 s against a gateway's 20 ms) yields only the
// callers' deadline errors; those fired while Redis held the calls, so
// they count as failures and the breaker opens — the limits' failure
// modes decide at once instead of every call waiting out its caller's
// deadline. A caller that goes away (cancelled) or arrives with no time
// left still says nothing about the store. Fails on 3747a7b, where every
// error with the caller's context done was ignored and the breaker never
// opened.
func TestBreakerOpensOnCallerDeadlines(t *testing.T) {
	srv := testenv.StartRedis(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	scfg := redisstore.DefaultConfig()
	scfg.Timeout = time.Second // longer than the callers' deadlines
	store, err := redisstore.New(c, scfg)
	if err != nil {
		t.Fatal(err)
	}
	br, err := NewBreaker(BreakerConfig{Failures: 3, Cooldown: Duration(time.Minute)}, store)
	if err != nil {
		t.Fatal(err)
	}
	checks := []gcra.Check{{Key: gcra.Key{Name: "breaker:deadline"}, Schedule: gcra.Steady(gcra.PerSecond(10, 10)), Cost: 1}}
	out := make([]gcra.Result, 1)
	call := func(ctx context.Context) error {
		_, err := br.DecideAll(ctx, checks, out)
		return err
	}
	if err := call(context.Background()); err != nil {
		t.Fatalf("healthy Redis: %v", err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Resume() })
	for i := range 3 {
		if br.Open() {
			t.Fatalf("open after %d failures, want 3", i)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		err := call(ctx)
		cancel()
		if err == nil {
			t.Fatal("a paused Redis answered")
		}
	}
	if !br.Open() {
		t.Fatal("three calls timed out by their callers' deadlines in a hung Redis, and the breaker stayed closed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := call(ctx); !errors.Is(err, ErrBreakerOpen) {
		t.Errorf("open breaker: %v, want ErrBreakerOpen at once", err)
	}

	// Callers that go away mid-call, or come with no time left, do not
	// open it.
	hb, err := NewBreaker(BreakerConfig{Failures: 2, Cooldown: Duration(time.Minute)}, hangStore{})
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		ctx, cancel := context.WithCancel(context.Background())
		go func() { time.Sleep(time.Millisecond); cancel() }()
		_, _ = hb.DecideAll(ctx, nil, nil)
		late, lcancel := context.WithTimeout(context.Background(), -time.Second)
		_, _ = hb.DecideAll(late, nil, nil)
		lcancel()
	}
	if hb.Open() {
		t.Error("cancelled and late callers opened the breaker")
	}
}

// TestBreakerCountsRoundTripsNotDecisions pauses a private redis-server
// while 64 decisions are on their way: the store batches them into a few
// script calls, each of which times out, and the breaker (5 failures) must
// count those round trips, not the 64 decisions they carried — it opens
// exactly when 5 or more round trips failed. Fails on bbdb3c5, where every
// decision of a failed batch counted: one slow call opened the breaker
// (issue 19: 10–65 opens a run under load, the local fallback answering
// ~200,000 decisions).
func TestBreakerCountsRoundTripsNotDecisions(t *testing.T) {
	srv := testenv.StartRedis(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	scfg := redisstore.DefaultConfig()
	scfg.Timeout = 300 * time.Millisecond
	scfg.Lanes = 1 // every decision on one queue: one call in flight, the rest batched behind it
	store, err := redisstore.New(c, scfg)
	if err != nil {
		t.Fatal(err)
	}
	const failures = 5
	br, err := NewBreaker(BreakerConfig{Failures: failures, Cooldown: Duration(time.Minute)}, store)
	if err != nil {
		t.Fatal(err)
	}
	decide := func(key string) error {
		checks := []gcra.Check{{Key: gcra.Key{Name: key}, Schedule: gcra.Steady(gcra.PerSecond(10, 10)), Cost: 1}}
		_, err := br.DecideAll(context.Background(), checks, make([]gcra.Result, 1))
		return err
	}
	if err := decide("breaker:batch:warm"); err != nil {
		t.Fatalf("healthy Redis: %v", err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Resume() })
	const n = 64
	errs := make(chan error, n)
	for i := range n {
		go func() { errs <- decide(fmt.Sprintf("breaker:batch:%d", i)) }()
	}
	calls := map[uint64]int{}
	for range n {
		err := <-errs
		var rt *redisstore.RoundTripError
		if !errors.As(err, &rt) {
			t.Fatalf("a decision in a paused Redis: %v, want a RoundTripError", err)
		}
		calls[rt.Call]++
	}
	t.Logf("%d decisions failed in %d round trips: %v", n, len(calls), calls)
	if len(calls) >= failures {
		t.Fatalf("the %d decisions took %d round trips: the test needs fewer than %d to tell round trips from decisions", n, len(calls), failures)
	}
	if br.Open() {
		t.Fatalf("the breaker opened after %d failed round trips (%d decisions), want %d round trips", len(calls), n, failures)
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := decide("breaker:batch:after"); err != nil {
		t.Fatalf("Redis resumed: %v", err)
	}
}
