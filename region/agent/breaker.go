package agent

import (
	"context"
	"errors"
	"fmt"
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
	// Failures is how many store errors in a row open the breaker.
	Failures int `yaml:"failures"`
	// Cooldown is how long it stays open before one call probes the store.
	Cooldown Duration `yaml:"cooldown"`
}

// ErrBreakerOpen is what the store returns while the breaker is open: the
// node's failure modes decide, without waiting on a store that is down.
var ErrBreakerOpen = errors.New("agent: circuit breaker open: the store is failing")

// Breaker is a region.Store in front of another: after Failures errors in
// a row it opens and fails every call at once for Cooldown, then lets one
// call through (half-open): success closes it, failure opens it again. Safe
// for concurrent use.
type Breaker struct {
	store    region.Store
	failures int
	cooldown time.Duration
	now      func() time.Time

	mu       sync.Mutex
	fails    int
	open     bool
	openedAt time.Time
	probing  bool

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
	return &Breaker{store: store, failures: cfg.Failures, cooldown: cfg.Cooldown.D(), now: time.Now,
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
	return b.open
}

// allow reports whether a call may go to the store now.
func (b *Breaker) allow() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.open {
		return true
	}
	if b.probing || b.now().Sub(b.openedAt) < b.cooldown {
		b.shorts.Inc()
		return false
	}
	b.probing = true // half-open: this call probes
	return true
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

// notFailure reports whether a call's error says nothing about the store's
// health: its caller gave up (the context), the store refused the input,
// or it answered about one key's data (a malformed state is that key's
// problem; opening the breaker for it would fail every other key and
// domain). Such errors still go to the limits' failure modes.
func notFailure(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
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

// done records a call's outcome. An error that says nothing about the
// store's health (notFailure) neither opens nor closes the breaker.
func (b *Breaker) done(ctx context.Context, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil && notFailure(ctx, err) {
		b.probing = false
		return
	}
	if err == nil {
		b.fails, b.probing = 0, false
		if b.open {
			b.open = false
			b.state.Set(0)
		}
		return
	}
	b.fails++
	if b.probing || (!b.open && b.fails >= b.failures) {
		if !b.open {
			b.opens.Inc()
		}
		b.open, b.probing, b.openedAt = true, false, b.now()
		b.state.Set(1)
	}
}

// clientSpan and serverSpan are the span kinds, made once.
var (
	clientSpan = trace.WithSpanKind(trace.SpanKindClient)
	serverSpan = trace.WithSpanKind(trace.SpanKindServer)
)

// DecideAll implements region.Store.
func (b *Breaker) DecideAll(ctx context.Context, checks []gcra.Check, out []gcra.Result) (gcra.Result, error) {
	if !b.allow() {
		return gcra.Result{}, ErrBreakerOpen
	}
	sctx, span := b.tracer.Start(ctx, "meridian.store.DecideAll", clientSpan)
	if span.IsRecording() { // unsampled decisions build no attributes
		span.SetAttributes(attribute.Int("meridian.checks", len(checks)))
	}
	var err error
	defer func() { b.done(ctx, err) }() // even if the store panics
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
	if !b.allow() {
		return gcra.Result{}, ErrBreakerOpen
	}
	var err error
	defer func() { b.done(ctx, err) }()
	r, err := rs.Reserve(ctx, k, s, cost, maxWait)
	return r, err
}

var (
	_ region.Store    = (*Breaker)(nil)
	_ region.Reserver = (*Breaker)(nil)
)
