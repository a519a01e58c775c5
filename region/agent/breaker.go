package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/region"
)

// BreakerConfig configures the circuit breaker in front of the store.
type BreakerConfig struct {
	// Failures is how many store failures in a row open the breaker: a
	// failed round trip to the store counts once, whatever number of
	// batched decisions it failed.
	Failures int `yaml:"failures"`
	// Cooldown is how long it stays open before one call probes the store.
	Cooldown Duration `yaml:"cooldown"`
}

// ErrBreakerOpen is what the store returns while the breaker is open: the
// node's failure modes decide, without waiting on a store that is down.
var ErrBreakerOpen = errors.New("agent: circuit breaker open: the store is failing")

// Breaker is a region.Store in front of another: after Failures errors in
// a row it opens and fails every call at once for Cooldown, then lets one
// call through (half-open): success closes it, failure opens it again. The
// rule is region.BreakerPolicy's; Breaker is its shell — the lock, the
// clock, metrics, spans, and which errors are the store failing. Safe for
// concurrent use.
type Breaker struct {
	store region.Store
	now   func() int64 // µs on a clock that does not go back

	mu     sync.Mutex
	policy *region.BreakerPolicy
	// failed: the round trips (roundTrip) whose failure was counted
	// lately, so the other decisions one failed round trip carried count
	// as nothing more (a ring: round trips of several lanes interleave).
	failed [8]uint64
	nextF  int

	tracer  trace.Tracer
	state   prometheus.Gauge
	opens   prometheus.Counter
	shorts  prometheus.Counter
	latency prometheus.Histogram
}

// NewBreaker wraps store.
func NewBreaker(cfg BreakerConfig, store region.Store) (*Breaker, error) {
	if cfg.Failures < 1 || cfg.Cooldown <= 0 {
		return nil, fmt.Errorf("%w: breaker: failures %d must be ≥ 1 and cooldown %s positive", ErrConfig, cfg.Failures, cfg.Cooldown.D())
	}
	policy, err := region.NewBreakerPolicy(cfg.Failures, cfg.Cooldown.D())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	start := time.Now() // the monotonic clock: a wall-clock step neither stretches nor cuts a cooldown
	return &Breaker{store: store, policy: policy, now: func() int64 { return time.Since(start).Microseconds() },
		tracer: noop.NewTracerProvider().Tracer("meridian/store"),
		state: prometheus.NewGauge(prometheus.GaugeOpts{Name: "meridian_breaker_open",
			Help: "1 while the circuit breaker in front of Redis is open (failure modes decide)."}),
		opens: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_breaker_opens_total",
			Help: "Times the circuit breaker opened."}),
		shorts: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_breaker_rejected_total",
			Help: "Store calls refused at once while the breaker was open."}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "meridian_store_seconds",
			Help:    "Latency of store (Redis) calls, failed ones included.",
			Buckets: []float64{0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25}}),
	}, nil
}

// SetTracerProvider traces each store call with tp.
func (b *Breaker) SetTracerProvider(tp trace.TracerProvider) { b.tracer = tp.Tracer("meridian/store") }

// Collectors returns the breaker's metrics.
func (b *Breaker) Collectors() []prometheus.Collector {
	return []prometheus.Collector{b.state, b.opens, b.shorts, b.latency}
}

// Open reports whether the breaker is open.
func (b *Breaker) Open() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.policy.Open()
}

// allow reports whether a call may go to the store now, and whether it is
// the probe.
func (b *Breaker) allow() (ok, probe bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ok, probe = b.policy.Allow(b.now())
	if !ok {
		b.shorts.Inc()
	}
	return ok, probe
}

// storeHealthy is implemented by store errors that are about the call or
// one key's data while the store itself answers (or was never asked):
// gcra/redisstore's ErrCrossSlot, ErrBadInput and ErrMalformedState.
type storeHealthy interface {
	error
	StoreHealthy() bool
}

// gcraInputErrors are the gcra errors for input a store refuses before
// deciding anything.
var gcraInputErrors = []error{gcra.ErrInvalidLimit, gcra.ErrKeyTooLong, gcra.ErrEmptyKey, gcra.ErrNegativeCost,
	gcra.ErrNegativeWait, gcra.ErrWaitTooLong, gcra.ErrNoChecks, gcra.ErrTooManyChecks, gcra.ErrBadTime}

// errNoAnswer is a call's outcome until the store returns: if the store
// panics, the call says nothing about the store's health (it was a
// success, closing an open breaker, before).
var errNoAnswer = errors.New("agent: the store call did not return")

// notFailure reports whether a call's error says nothing about the store's
// health: its caller went away (its context cancelled) or had no time
// left when the call began (late), the store call panicked (errNoAnswer),
// the store refused the input, or it answered about one key's data (a
// malformed state is that key's problem; opening the breaker for it would
// fail every other key and domain). Such errors still go to the limits'
// failure modes.
//
// Which deadline fired decides a timeout: the store's own (the Redis
// timeout) is a failure, and so is the caller's when it fired while the
// store held the call — the store did not answer in the time the caller
// gave it. Callers whose deadlines are shorter than the Redis timeout (a
// gateway's 20 ms against a 1 s timeout) otherwise never open the breaker
// in front of a hung Redis, and every decision waits out the caller's
// deadline, whose expiry makes the gateway's own failure setting decide
// instead of the limit's failure_mode (issue 17, defect 8). A healthy
// store still answers most calls, and a success breaks the run of
// failures that opens the breaker.
func notFailure(ctx context.Context, late bool, err error) bool {
	if cerr := ctx.Err(); cerr != nil && (late || !errors.Is(cerr, context.DeadlineExceeded)) {
		return true
	}
	if err == errNoAnswer {
		return true
	}
	if h, ok := errors.AsType[storeHealthy](err); ok && h.StoreHealthy() {
		return true
	}
	for _, e := range gcraInputErrors {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// roundTrip is implemented by store errors that name the round trip to
// the store that failed: gcra/redisstore's RoundTripError, shared by every
// decision a failed script call carried or that waited on it.
type roundTrip interface {
	error
	RoundTrip() uint64
}

// outcome classifies a call's error for the policy: an error that says
// nothing about the store's health (notFailure) neither opens nor closes
// the breaker.
func outcome(ctx context.Context, late bool, err error) region.BreakerOutcome {
	switch {
	case err == nil:
		return region.BreakerSucceeded
	case notFailure(ctx, late, err):
		return region.BreakerIgnored
	}
	return region.BreakerFailed
}

// done records the outcome of a call allow let through; late says the
// caller's context had ended before the call began.
//
// A failure counts once per failed round trip to the store, not once per
// decision: the Redis store batches concurrent decisions into one script
// call, so one slow call (a GC pause, a busy core) failed up to MaxBatch
// decisions at once, and with them the Failures "in a row" that should
// mean the store failed that many times (issue 19: under load the breaker
// opened 10–65 times a run and the local fallback answered ~200,000
// decisions).
func (b *Breaker) done(ctx context.Context, probe, late bool, err error) {
	o := outcome(ctx, late, err)
	b.mu.Lock()
	defer b.mu.Unlock()
	if o == region.BreakerFailed {
		o = b.once(err)
	}
	opened, closed := b.policy.Done(b.now(), probe, o)
	switch {
	case opened:
		b.opens.Inc()
		b.state.Set(1)
	case closed:
		b.state.Set(0)
	}
}

// once is a failure's outcome the first time its round trip fails, and
// BreakerIgnored for the other decisions that round trip carried. The
// caller holds mu.
func (b *Breaker) once(err error) region.BreakerOutcome {
	rt, ok := errors.AsType[roundTrip](err)
	if !ok {
		return region.BreakerFailed
	}
	id := rt.RoundTrip()
	if id != 0 && slices.Contains(b.failed[:], id) {
		return region.BreakerIgnored
	}
	b.failed[b.nextF] = id
	b.nextF = (b.nextF + 1) % len(b.failed)
	return region.BreakerFailed
}

// clientSpan and serverSpan are the span kinds, made once.
var (
	clientSpan = trace.WithSpanKind(trace.SpanKindClient)
	serverSpan = trace.WithSpanKind(trace.SpanKindServer)
)

// DecideAll implements region.Store.
func (b *Breaker) DecideAll(ctx context.Context, checks []gcra.Check, out []gcra.Result) (gcra.Result, error) {
	ok, probe := b.allow()
	if !ok {
		return gcra.Result{}, ErrBreakerOpen
	}
	sctx, span := b.tracer.Start(ctx, "meridian.store.DecideAll", clientSpan)
	if span.IsRecording() { // unsampled decisions build no attributes
		span.SetAttributes(attribute.Int("meridian.checks", len(checks)))
	}
	err, late := errNoAnswer, ctx.Err() != nil
	defer func() { b.done(ctx, probe, late, err) }() // even if the store panics
	start := time.Now()
	r, err := b.store.DecideAll(sctx, checks, out)
	b.latency.Observe(time.Since(start).Seconds())
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "store failed")
	}
	span.End()
	return r, err
}

// Reserve implements region.Reserver when the wrapped store does.
func (b *Breaker) Reserve(ctx context.Context, k gcra.Key, s gcra.Schedule, cost int64, maxWait time.Duration) (gcra.Result, error) {
	rs, ok := b.store.(region.Reserver)
	if !ok {
		return gcra.Result{}, region.ErrNoReserve
	}
	ok, probe := b.allow()
	if !ok {
		return gcra.Result{}, ErrBreakerOpen
	}
	err, late := errNoAnswer, ctx.Err() != nil
	defer func() { b.done(ctx, probe, late, err) }()
	r, err := rs.Reserve(ctx, k, s, cost, maxWait)
	return r, err
}

var (
	_ region.Store    = (*Breaker)(nil)
	_ region.Reserver = (*Breaker)(nil)
)
