package agent

import (
	"bytes"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/bits"
	"mime"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/rebalance"
	"github.com/meridian-quota/meridian/region"
	"github.com/meridian-quota/meridian/region/agent/api"
)

// Agent is the shell around a region.Node: it serves Envoy RLS v3 over
// gRPC and a JSON API over HTTP, runs the node's loop (Tick), and exposes
// health and metrics. Every decision is the node's.
type Agent struct {
	rlsv3.UnimplementedRateLimitServiceServer

	cfg    Config
	node   *region.Node
	log    *slog.Logger
	reg    *prometheus.Registry
	health *health.Server
	ready  atomic.Bool
	// drainEnd is closed by EndDrain (once, endDrain).
	drainEnd chan struct{}
	endDrain sync.Once
	pool     sync.Pool // *work
	// now is the node's time: the wall clock (wall, µs since the Unix
	// epoch) through clock, which never goes back (region.Clock).
	now   func() int64
	wall  func() int64
	clock region.Clock

	decisions *prometheus.CounterVec
	byLimit   *prometheus.CounterVec
	limits    atomic.Pointer[map[*region.Rule]*[2]prometheus.Counter] // per rule: ok, over_limit
	retry     prometheus.Histogram
	errors    prometheus.Counter
	reloads   *prometheus.CounterVec
	denied    prometheus.Counter
	shares    atomic.Pointer[shareStats] // of the table applied last; nil: the safe share

	reloadMu    sync.Mutex                      // serializes Reload
	storeCheck  func(ctx context.Context) error // readiness: does the store answer?
	tokens      [][]byte                        // bearer tokens; none: no authentication
	tls         *tls.Config                     // nil: plaintext
	tracer      trace.Tracer
	reloadCh    chan struct{} // RequestReload → the Run loop
	policyAt    [32]byte      // policyDigest of the policy path as last loaded (or rejected)
	ctrl        Control       // nil: standalone
	fencer      gcra.Fencer   // SetFencer's; nil: no region fence
	fenceErrors atomic.Int64  // fence raises that failed
	// loadPolicy reads the policy path, a file or a directory
	// (region.LoadPolicy; tests substitute it).
	loadPolicy     func(path string, opt region.LoadOptions) (*region.Policy, error)
	reloadFailing  atomic.Bool // the policy on disk was rejected last time it was read
	healthAnyStore bool        // /healthcheck also asks the store (SetHealthcheckStore)
}

// work is one request's scratch space, pooled.
type work struct {
	d    region.Decision
	req  region.Request
	desc []region.Descriptor
	ents []region.Entry
}

// New returns an agent for node, with its own metrics registry (served on
// /metrics) holding the agent's series and extra (a Breaker's, say).
func New(cfg Config, node *region.Node, log *slog.Logger, extra ...prometheus.Collector) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.CheckPolicy(node.Policy()); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	// The node's clock: the wall clock, as leases and effective times are
	// instants on the coordinator's wall clock (a start-up error goes away
	// when NTP corrects the host), clamped never to go back (region.Clock)
	// for the deny cache, the reports and the local failure mode.
	a := &Agent{cfg: cfg, node: node, log: log, reg: prometheus.NewRegistry(), health: health.NewServer(),
		wall: func() int64 { return time.Now().UnixMicro() }, reloadCh: make(chan struct{}, 1), drainEnd: make(chan struct{})}
	a.now = func() int64 { return a.clock.Now(a.wall()) }
	tokens, err := cfg.Auth.Tokens()
	if err != nil {
		return nil, err
	}
	for _, t := range tokens {
		a.tokens = append(a.tokens, []byte(t))
	}
	if a.tls, err = cfg.TLS.Load(); err != nil {
		return nil, err
	}
	a.policyAt = policyDigest(cfg.Policy)
	a.loadPolicy = region.LoadPolicy
	// The node's policy was read before this digest: if what the path
	// holds now is another policy, or a broken one (edited in between),
	// forget the digest so that the first poll reloads it (or reports it).
	if p, err := a.loadPolicy(cfg.Policy, cfg.PolicyOptions.LoadOptions()); err == nil && p.Version() != node.Policy().Version() || errors.Is(err, region.ErrPolicy) {
		a.policyAt = [32]byte{}
	}
	a.pool.New = func() any { return new(work) }
	a.tracer = noop.NewTracerProvider().Tracer("meridian/agent")
	a.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "meridian_decisions_total", Help: "Requests decided, by protocol and result (ok, over_limit).",
	}, []string{"protocol", "result"})
	a.errors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "meridian_bad_requests_total", Help: "Requests refused as malformed (nothing consumed).",
	})
	for _, p := range []string{"rls", "http"} {
		for _, r := range []string{"ok", "over_limit"} {
			a.decisions.WithLabelValues(p, r) // every series exists from the start
		}
	}
	stat := func(name, help string, f func(region.Stats) int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(f(node.Stats())) })
	}
	a.byLimit = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "meridian_limit_decisions_total", Help: "Decisions per policy limit (its name, else its path) and result.",
	}, []string{"limit", "result"})
	a.retry = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "meridian_retry_after_seconds", Help: "Retry-after of denied requests.",
		Buckets: []float64{0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 3600},
	})
	a.bindLimits(node.Policy())
	tableGauge := func(name, help string, f func(region.TableState, int64) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help},
			func() float64 { return f(node.Table(), a.now()) })
	}
	a.reg.MustRegister(a.byLimit, a.retry,
		tableGauge("meridian_table_term", "Coordinator term of the table applied (0: none yet).", func(t region.TableState, _ int64) float64 { return float64(t.Term) }),
		tableGauge("meridian_table_epoch", "Epoch of the table applied.", func(t region.TableState, _ int64) float64 { return float64(t.Epoch) }),
		tableGauge("meridian_lease_seconds_left", "Time left on this region's lease (negative: lapsed; 0 without a table).", func(t region.TableState, now int64) float64 {
			if !t.HasTable {
				return 0
			}
			return float64(t.LeaseExpiry-now) / 1e6
		}),
		tableGauge("meridian_lease_lapsed", "1 once the lease passed without a newer table (keys at min(last, safe) share).", func(t region.TableState, _ int64) float64 {
			if t.Lapsed {
				return 1
			}
			return 0
		}),
		tableGauge("meridian_table_age_seconds", "Seconds since the coordinator issued the table applied (this agent's clock minus the coordinator's, so skew shifts it; 0 without a table). "+
			"The coordinator issues a table every interval (after an increase the next waits out the fence): an age well past interval + fence means tables stopped arriving.", tableAge),
	)
	a.reg.MustRegister(a.shareCollectors()...)
	a.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "meridian_policy_reloads_total", Help: "Policy reloads, by result (ok, rejected).",
	}, []string{"result"})
	a.reloads.WithLabelValues("ok")
	a.reloads.WithLabelValues("rejected")
	a.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "meridian_policy_reload_failing", Help: "1 while the policy on disk is rejected and the last good one still runs (the log says why).",
	}, func() float64 {
		if a.reloadFailing.Load() {
			return 1
		}
		return 0
	}))
	a.denied = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "meridian_unauthenticated_total", Help: "Requests refused for missing or wrong credentials.",
	})
	a.reg.MustRegister(a.decisions, a.errors, a.reloads, a.denied,
		stat("meridian_fallback_open_total", "Requests admitted by failure_mode open while the store failed.", func(s region.Stats) int64 { return s.FallbackOpen }),
		stat("meridian_fallback_closed_total", "Requests denied by failure_mode closed while the store failed.", func(s region.Stats) int64 { return s.FallbackClosed }),
		stat("meridian_fallback_local_total", "Requests decided in memory by failure_mode local while the store failed.", func(s region.Stats) int64 { return s.FallbackLocal }),
		stat("meridian_fallback_error_total", "Requests answered with an error by failure_mode error while the store failed (RLS Unavailable, HTTP 503: the caller's own failure policy decides).", func(s region.Stats) int64 { return s.FallbackError }),
		stat("meridian_shadow_would_deny_total", "Requests a shadow-mode limit would have denied.", func(s region.Stats) int64 { return s.ShadowDenied }),
		stat("meridian_store_errors_total", "Store calls that failed.", func(s region.Stats) int64 { return s.StoreErrors }),
		stat("meridian_deny_cache_hits_total", "Requests denied from the deny cache, without a Redis call.", func(s region.Stats) int64 { return s.DenyCacheHits }),
		stat("meridian_lease_hits_total", "Requests served from a local lease, without a Redis call.", func(s region.Stats) int64 { return s.LeaseHits }),
		stat("meridian_lease_takes_total", "Leases taken from Redis.", func(s region.Stats) int64 { return s.LeaseTakes }),
		stat("meridian_lease_stranded_units_total", "Leased units never served (the lease expired or its limit changed).", func(s region.Stats) int64 { return s.LeaseStranded }),
		stat("meridian_fenced_total", "Store calls the region fence refused: this agent ran an older table than another agent of its region had put in force (partitioned from NATS, or slow to receive it); each was decided again at min(share, safe share).", func(s region.Stats) int64 { return s.Fenced }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "meridian_fence_raise_errors_total",
			Help: "Region fence raises that failed (the coordinator then waits for this region's leases, not its fence)."},
			func() float64 { return float64(a.fenceErrors.Load()) }),
		stat("meridian_untracked_keys_total", "Checks on keys beyond the tracked-key cap (decided, not reported).", func(s region.Stats) int64 { return s.Overflow }),
	)
	a.reg.MustRegister(extra...)
	a.ready.Store(true) // the safe share is in force until a table arrives
	a.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	a.health.SetServingStatus(upstreamHealthService, healthpb.HealthCheckResponse_SERVING) // json_upstream.go
	return a, nil
}

// authorized reports whether an "authorization" value carries one of the
// configured bearer tokens (always, when none is configured). Comparison
// takes the same time whatever the token.
func (a *Agent) authorized(header string) bool {
	if len(a.tokens) == 0 {
		return true
	}
	got, ok := bearerToken(header)
	if !ok {
		return false
	}
	match := 0
	for _, t := range a.tokens {
		match |= subtle.ConstantTimeCompare([]byte(got), t)
	}
	return match == 1
}

// bearerToken is the credentials of an "authorization" value in the Bearer
// scheme, whose name is case-insensitive (RFC 7235 §2.1: "bearer",
// "BEARER"), separated by one or more spaces.
func bearerToken(header string) (string, bool) {
	scheme, cred, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return "", false
	}
	cred = strings.Trim(cred, " ")
	return cred, cred != ""
}

// authUnary refuses RLS calls without a valid bearer token; gRPC health
// stays open for probes.
func (a *Agent) authUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	// Without tokens there is nothing to check (metadata.FromIncomingContext
	// copies every header: a few percent of a decision's CPU).
	if len(a.tokens) > 0 && !strings.HasPrefix(info.FullMethod, "/grpc.health.v1.Health/") {
		var v string
		if vs := metadata.ValueFromIncomingContext(ctx, "authorization"); len(vs) > 0 {
			v = vs[0]
		}
		if !a.authorized(v) {
			a.denied.Inc()
			return nil, status.Error(codes.Unauthenticated, "missing or invalid bearer token")
		}
	}
	return h(ctx, req)
}

// authHTTP guards an API handler.
func (a *Agent) authHTTP(h http.HandlerFunc) http.HandlerFunc {
	return func(rw http.ResponseWriter, r *http.Request) {
		if !a.authorized(r.Header.Get("Authorization")) {
			a.denied.Inc()
			rw.Header().Set("WWW-Authenticate", `Bearer realm="meridian"`)
			http.Error(rw, "missing or invalid bearer token", http.StatusUnauthorized)
			return
		}
		h(rw, r)
	}
}

// RequestReload asks the Run loop to reload the policy (SIGHUP).
func (a *Agent) RequestReload() {
	select {
	case a.reloadCh <- struct{}{}:
	default: // one is already pending
	}
}

// Reload reads the policy — the file, or every file of the directory
// Config.Policy names (region.LoadPolicy with Config.PolicyOptions) —
// validates it whole and swaps it in atomically; requests already resolved
// finish under the old policy. A broken policy is rejected with its errors
// (logged, counted in meridian_policy_reloads_total{result="rejected"},
// and meridian_policy_reload_failing is 1 until a good one loads) and the
// old policy stays. Call it on the Run loop's goroutine (RequestReload
// does).
func (a *Agent) Reload() error {
	a.reloadMu.Lock()
	defer a.reloadMu.Unlock()
	// The digest before the read: a change made while loading changes it
	// again, so the next poll loads that too.
	st := policyDigest(a.cfg.Policy)
	p, err := a.loadPolicy(a.cfg.Policy, a.cfg.PolicyOptions.LoadOptions())
	if err == nil {
		err = a.cfg.CheckPolicy(p)
		if err == nil {
			a.policyAt = st
			a.reloadFailing.Store(false)
			if p.Version() != a.node.Policy().Version() {
				a.bindLimits(p)
				a.node.SetPolicy(p)
				a.log.Info("policy reloaded", "version", p.Version())
			}
			a.reloads.WithLabelValues("ok").Inc()
			return nil
		}
	}
	a.policyAt = st // do not retry the same broken policy every poll
	a.reloadFailing.Store(true)
	a.reloads.WithLabelValues("rejected").Inc()
	a.log.Error("policy reload rejected; the old policy stays", "path", a.cfg.Policy, "err", err)
	return err
}

// SetStoreCheck makes /readyz answer ready only while check succeeds (cmd
// passes a Redis PING). The node always has a share in force — the safe
// share before the first table — so the store is what readiness waits for.
// Call it before Run.
func (a *Agent) SetStoreCheck(check func(ctx context.Context) error) { a.storeCheck = check }

// SetTracerProvider makes the agent trace each decision with tp (spans at
// the request and, through a Breaker given the same provider, at each store
// call). Call it before Run.
func (a *Agent) SetTracerProvider(tp trace.TracerProvider) {
	a.tracer = tp.Tracer("meridian/agent")
}

// Registry returns the agent's metrics registry.
func (a *Agent) Registry() *prometheus.Registry { return a.reg }

// errBadRequest marks a malformed request (answered InvalidArgument / 400).
var errBadRequest = errors.New("bad request")

// maxHits is the largest cost a request may carry (hits_addend is a uint32
// at request level; the per-descriptor one is a UInt64Value, capped here).
const maxHits = math.MaxUint32

// decide runs one request through the node: w.req is filled in.
func (a *Agent) decide(ctx context.Context, w *work) error {
	return a.node.Decide(ctx, a.now(), &w.req, &w.d)
}

// ShouldRateLimit implements Envoy's RLS v3: domain and descriptors map to
// the node's request; hits_addend 0 at request level means 1, an explicit
// per-descriptor 0 peeks. Unknown domains and descriptors that match
// nothing answer OK with no limit, as Envoy's reference server does.
func (a *Agent) ShouldRateLimit(ctx context.Context, in *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	ctx, span := a.tracer.Start(ctx, "meridian.rls.ShouldRateLimit", serverSpan)
	if span.IsRecording() { // unsampled decisions build no attributes
		span.SetAttributes(attribute.String("meridian.domain", in.Domain), attribute.Int("meridian.descriptors", len(in.Descriptors)))
	}
	defer span.End()
	w := a.pool.Get().(*work)
	defer a.pool.Put(w)
	if err := a.fromRLS(in, w); err != nil {
		a.errors.Inc()
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := a.decide(ctx, w); err != nil {
		a.errors.Inc()
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := storeFailed(&w.d); err != nil {
		span.SetAttributes(attribute.Bool("meridian.fallback", true))
		a.countLimits(&w.d)
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	out := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	if !w.d.Allowed {
		out.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	for i := range in.Descriptors {
		m := w.d.MatchOf(i)
		st := rlsStatus(m)
		if m == nil && i < len(w.req.Descriptors) {
			// An unlimited descriptor: no limit, everything remaining,
			// as envoyproxy/ratelimit answers it.
			if r := a.node.Policy().Match(w.req.Domain, w.req.Descriptors[i].Entries); r != nil && r.Unlimited {
				st.LimitRemaining = math.MaxUint32
			}
		}
		out.Statuses = append(out.Statuses, st)
	}
	if a.cfg.ResponseHeaders {
		for _, h := range headerFields(&w.d) {
			out.ResponseHeadersToAdd = append(out.ResponseHeadersToAdd, &corev3.HeaderValue{Key: h[0], Value: h[1]})
		}
	}
	a.count("rls", w.d.Allowed)
	a.countLimits(&w.d)
	span.SetAttributes(attribute.Bool("meridian.allowed", w.d.Allowed), attribute.Bool("meridian.fallback", w.d.Fallback))
	return out, nil
}

// storeFailed is the error to answer when the store failed and a limit's
// failure_mode error left the request undecided (region.FailError), nil
// otherwise. envoyproxy/ratelimit fails the call when its Redis fails (its
// handler recovers the Redis error and returns it, which gRPC sends as
// Unknown); the agent sends Unavailable, what a failed backend is, and
// Envoy treats either as the call failing: its failure_mode_deny decides.
func storeFailed(d *region.Decision) error {
	if !d.Fallback || d.FallbackMode != region.FailError {
		return nil
	}
	return fmt.Errorf("rate limit store unavailable, and a limit's failure_mode is error: %v", d.StoreErr)
}

func (a *Agent) count(protocol string, allowed bool) {
	r := "ok"
	if !allowed {
		r = "over_limit"
	}
	a.decisions.WithLabelValues(protocol, r).Inc()
}

// countLimits counts each matched limit's outcome and a denial's
// retry-after.
func (a *Agent) countLimits(d *region.Decision) {
	cs := *a.limits.Load()
	for i := range d.Matches {
		m := &d.Matches[i]
		if c := cs[m.Rule]; c != nil {
			if over(m) {
				c[1].Inc()
			} else {
				c[0].Inc()
			}
		}
	}
	if !d.Allowed && d.Result.RetryAfter != gcra.Never {
		a.retry.Observe(d.Result.RetryAfter.Seconds())
	}
}

// bindLimits creates (and so initialises) the per-limit series of p's
// rules; label values are bounded by the policy.
func (a *Agent) bindLimits(p *region.Policy) {
	m := map[*region.Rule]*[2]prometheus.Counter{}
	for _, r := range p.Rules() {
		name := r.Name
		if name == "" {
			name = r.Domain + ":" + r.Path
		}
		m[r] = &[2]prometheus.Counter{a.byLimit.WithLabelValues(name, "ok"), a.byLimit.WithLabelValues(name, "over_limit")}
	}
	a.limits.Store(&m)
}

func (a *Agent) fromRLS(in *rlsv3.RateLimitRequest, w *work) error {
	hits := int64(in.HitsAddend)
	if hits == 0 {
		hits = 1
	}
	w.req = region.Request{Domain: in.Domain, Cost: hits}
	w.desc, w.ents = w.desc[:0], w.ents[:0]
	for i, d := range in.Descriptors {
		if d.GetIsNegativeHits() {
			return fmt.Errorf("%w: descriptors[%d]: negative hits (refilling tokens) are not supported", errBadRequest, i)
		}
		start := len(w.ents)
		for _, e := range d.Entries {
			w.ents = append(w.ents, region.Entry{Key: e.Key, Value: e.Value})
		}
		rd := region.Descriptor{Entries: w.ents[start:len(w.ents):len(w.ents)]}
		if o := d.GetLimit(); o != nil {
			l, err := overrideLimit(o)
			if err != nil {
				return fmt.Errorf("%w: descriptors[%d].limit: %v", errBadRequest, i, err)
			}
			rd.Override = l
		}
		if h := d.GetHitsAddend(); h != nil {
			if h.Value > maxHits {
				return fmt.Errorf("%w: descriptors[%d].hits_addend %d above 2^32−1", errBadRequest, i, h.Value)
			}
			rd.Cost, rd.HasCost = int64(h.Value), true
		}
		w.desc = append(w.desc, rd)
	}
	w.req.Descriptors = w.desc
	return nil
}

// overrideLimit turns Envoy's per-descriptor limit override into a limit
// with the default burst (one unit's worth).
func overrideLimit(o *commonv3.RateLimitDescriptor_RateLimitOverride) (gcra.Limit, error) {
	units := map[typev3.RateLimitUnit]time.Duration{
		typev3.RateLimitUnit_SECOND: time.Second, typev3.RateLimitUnit_MINUTE: time.Minute,
		typev3.RateLimitUnit_HOUR: time.Hour, typev3.RateLimitUnit_DAY: 24 * time.Hour,
	}
	period, ok := units[o.Unit]
	if !ok || o.RequestsPerUnit == 0 {
		return gcra.Limit{}, fmt.Errorf("unit %v with %d requests: want a second, minute, hour or day and at least 1", o.Unit, o.RequestsPerUnit)
	}
	if m := o.GetUnitMultiplier(); m != nil {
		if m.Value == 0 || m.Value > 1000 {
			return gcra.Limit{}, fmt.Errorf("unit_multiplier %d: want 1 to 1000", m.Value)
		}
		period *= time.Duration(m.Value)
	}
	rpu := int64(o.RequestsPerUnit)
	l := gcra.New(rpu, period, region.DefaultBurst(rpu, period))
	if err := l.Validate(); err != nil {
		return gcra.Limit{}, err
	}
	return l, nil
}

// rlsStatus is one descriptor's status: current_limit is the global limit
// the key was sold, limit_remaining what this region will still admit now,
// duration_until_reset max(TAT − now, 0) when OK and the retry-after when
// over (ARCHITECTURE.md, "Interfaces to the outside").
func rlsStatus(m *region.Match) *rlsv3.RateLimitResponse_DescriptorStatus {
	st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	if m == nil {
		return st
	}
	r := &m.Result
	st.CurrentLimit = ruleLimit(m.Rule)
	st.LimitRemaining = uint32(min(max(r.Remaining, 0), math.MaxUint32))
	if !over(m) {
		st.DurationUntilReset = durationpb.New(r.ResetAfter)
		return st
	}
	st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	if r.RetryAfter != gcra.Never {
		st.DurationUntilReset = durationpb.New(r.RetryAfter)
	}
	return st
}

// over reports whether the match's own limit denied: a limit that would
// have admitted, in a composite another limit denied, is reported OK with
// its untouched state (it was not charged); shadow limits never deny.
func over(m *region.Match) bool {
	return !m.Rule.Shadow && m.Denied()
}

// rlsUnits are the RLS units, shortest first, with the durations
// envoyproxy/ratelimit gives them (a week of 7 days, a month of 30, a year
// of 365: region's units).
var rlsUnits = []struct {
	name string
	d    time.Duration
	u    rlsv3.RateLimitResponse_RateLimit_Unit
}{
	{"second", time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
	{"minute", time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
	{"hour", time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
	{"day", 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
	{"week", 7 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_WEEK},
	{"month", 30 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_MONTH},
	{"year", 365 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_YEAR},
}

// zeroLimitUnit is the RLS unit (and its duration) a zero limit
// (requests_per_unit: 0) names: the rule's unit, or a second when it gives
// a period instead.
func zeroLimitUnit(r *region.Rule) (rlsv3.RateLimitResponse_RateLimit_Unit, time.Duration) {
	for _, u := range rlsUnits {
		if u.name == r.Unit {
			return u.u, u.d
		}
	}
	return rlsv3.RateLimitResponse_RateLimit_SECOND, time.Second
}

// ruleLimit is current_limit for a matched rule: its limit in RLS units,
// and for the zero limit 0 per the rule's unit, as envoyproxy/ratelimit
// answers requests_per_unit: 0 (the zero limit has no interval to convert).
func ruleLimit(r *region.Rule) *rlsv3.RateLimitResponse_RateLimit {
	if r.Limit.IsZero() {
		u, _ := zeroLimitUnit(r)
		return &rlsv3.RateLimitResponse_RateLimit{Unit: u}
	}
	return currentLimit(r.Limit)
}

// currentLimit expresses a limit in RLS units: its rate per the smallest
// unit (second … year) that holds its period, scaled (rounded down; past a
// year, per year and at least 1, since 0 reads as block-all).
func currentLimit(l gcra.Limit) *rlsv3.RateLimitResponse_RateLimit {
	events, period := l.Rate()
	if period <= 0 {
		// Built from an interval: per second from T.
		events, period = int64(time.Second)/max(int64(l.Interval()), 1), time.Second
	}
	u := rlsUnits[len(rlsUnits)-1]
	for _, c := range rlsUnits {
		if period <= c.d {
			u = c
			break
		}
	}
	// events · (u.d / period) without overflow: 128-bit product.
	hi, lo := bits.Mul64(uint64(events), uint64(u.d))
	n := uint64(math.MaxUint32)
	if hi < uint64(period) {
		if q, _ := bits.Div64(hi, lo, uint64(period)); q < n {
			n = q
		}
	}
	if n == 0 && events > 0 {
		n = 1
	}
	return &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: uint32(n), Unit: u.u}
}

// The HTTP API's types live in region/agent/api, for the client.
type (
	DecideRequest   = api.DecideRequest
	DescriptorIn    = api.DescriptorIn
	EntryIn         = api.EntryIn
	DecideResponse  = api.DecideResponse
	DescriptorOut   = api.DescriptorOut
	ReserveRequest  = api.ReserveRequest
	ReserveResponse = api.ReserveResponse
	ErrorResponse   = api.ErrorResponse
)

// rls is the same request as RLS would carry, so both protocols decide
// alike.
func rlsOf(in *DecideRequest) *rlsv3.RateLimitRequest {
	out := &rlsv3.RateLimitRequest{Domain: in.Domain, HitsAddend: in.HitsAddend}
	for _, d := range in.Descriptors {
		rd := &commonv3.RateLimitDescriptor{}
		for _, e := range d.Entries {
			rd.Entries = append(rd.Entries, &commonv3.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value})
		}
		if d.HitsAddend != nil {
			rd.HitsAddend = wrapperspb.UInt64(*d.HitsAddend)
		}
		out.Descriptors = append(out.Descriptors, rd)
	}
	return out
}

// maxBody bounds a JSON request body.
const maxBody = 1 << 20

// bodies pools the buffers request bodies are read into.
var bodies = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// decodeBody reads a JSON request body into v, answering the error itself
// when it cannot: 415 unless the Content-Type is application/json (a
// charset parameter, if any, must be utf-8: JSON text is UTF-8, RFC 8259);
// 400 for a body above maxBody, one that is not exactly one JSON object
// (trailing data after it is refused, not ignored), an unknown field, or a
// string that is not UTF-8 — raw invalid bytes or an unpaired UTF-16
// surrogate escape, which encoding/json would turn into U+FFFD so that
// distinct byte strings would share one bucket (gRPC refuses them too).
func (a *Agent) decodeBody(rw http.ResponseWriter, r *http.Request, what string, v any) bool {
	if err := jsonContentType(r.Header.Get("Content-Type")); err != nil {
		a.errors.Inc()
		http.Error(rw, what+": "+err.Error(), http.StatusUnsupportedMediaType)
		return false
	}
	buf := bodies.Get().(*bytes.Buffer)
	buf.Reset()
	defer func() {
		if buf.Cap() <= 64<<10 { // keep small buffers only
			bodies.Put(buf)
		}
	}()
	if _, err := buf.ReadFrom(http.MaxBytesReader(rw, r.Body, maxBody)); err != nil {
		a.badHTTP(rw, what+": "+err.Error())
		return false
	}
	body := buf.Bytes()
	if err := checkUTF8(body); err != nil {
		a.badHTTP(rw, what+": "+err.Error())
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		a.badHTTP(rw, what+": "+err.Error())
		return false
	}
	if _, err := dec.Token(); err != io.EOF {
		a.badHTTP(rw, fmt.Sprintf("%s: trailing data after the JSON object at byte %d: send one object per request", what, dec.InputOffset()))
		return false
	}
	return true
}

// jsonContentType accepts application/json, with any parameters, a
// charset only as utf-8.
func jsonContentType(ct string) error {
	if ct == "" {
		return errors.New("no Content-Type: send application/json")
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil {
		return fmt.Errorf("Content-Type %q: %v: send application/json", ct, err)
	}
	if mt != "application/json" {
		return fmt.Errorf("Content-Type %q: send application/json", mt)
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return fmt.Errorf("Content-Type charset %q: JSON is UTF-8 (RFC 8259); send charset=utf-8 or none", cs)
	}
	return nil
}

// checkUTF8 reports the first byte of body that is not UTF-8, or the first
// \u escape in a JSON string that is an unpaired UTF-16 surrogate (a high
// one not followed by a low one, or a low one alone). It does not check the
// JSON otherwise: the decoder does.
func checkUTF8(body []byte) error {
	if !utf8.Valid(body) {
		for i := 0; i < len(body); {
			r, n := utf8.DecodeRune(body[i:])
			if r == utf8.RuneError && n <= 1 {
				return fmt.Errorf("invalid UTF-8 at byte %d: strings must be UTF-8 (distinct byte strings would share one bucket)", i)
			}
			i += n
		}
	}
	in := false
	for i := 0; i < len(body); i++ {
		switch c := body[i]; {
		case c == '"':
			in = !in
		case c == '\\' && in:
			if i+1 < len(body) && body[i+1] == 'u' {
				r, ok := hex4(body, i+2)
				switch {
				case !ok:
				case utf16.IsSurrogate(r) && r < 0xdc00:
					if lo, ok := hex4(body, i+8); !ok || i+7 >= len(body) || body[i+6] != '\\' || body[i+7] != 'u' || lo < 0xdc00 || lo > 0xdfff {
						return fmt.Errorf("unpaired UTF-16 surrogate %s at byte %d: strings must be UTF-8", body[i:i+6], i)
					}
					i += 6
				case utf16.IsSurrogate(r):
					return fmt.Errorf("unpaired UTF-16 surrogate %s at byte %d: strings must be UTF-8", body[i:i+6], i)
				}
			}
			i++ // the escaped character (the rest of \uXXXX is hex)
		}
	}
	return nil
}

// hex4 is the rune of the four hex digits at b[i:i+4].
func hex4(b []byte, i int) (rune, bool) {
	if i < 0 || i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case '0' <= c && c <= '9':
			r = r<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

func (a *Agent) handleDecide(rw http.ResponseWriter, r *http.Request) {
	var in DecideRequest
	if !a.decodeBody(rw, r, "decide", &in) {
		return
	}
	w := a.pool.Get().(*work)
	defer a.pool.Put(w)
	if err := a.fromRLS(rlsOf(&in), w); err != nil {
		a.errors.Inc()
		http.Error(rw, "decide: "+err.Error(), http.StatusBadRequest)
		return
	}
	if err := a.decide(r.Context(), w); err != nil {
		a.errors.Inc()
		http.Error(rw, "decide: "+err.Error(), http.StatusBadRequest)
		return
	}
	if err := storeFailed(&w.d); err != nil {
		a.countLimits(&w.d)
		writeError(rw, http.StatusServiceUnavailable, "decide: "+err.Error())
		return
	}
	out := DecideResponse{Allowed: w.d.Allowed, Statuses: make([]DescriptorOut, len(in.Descriptors))}
	for i := range in.Descriptors {
		o := &out.Statuses[i]
		o.Code = "OK"
		m := w.d.MatchOf(i)
		if m == nil {
			continue
		}
		res := &m.Result
		o.Limit, o.Remaining, o.Shadow = m.Rule.Limit.String(), res.Remaining, m.Rule.Shadow
		o.ResetMs = ms(res.ResetAfter)
		if over(m) {
			o.Code = "OVER_LIMIT"
			if res.RetryAfter != gcra.Never {
				o.RetryAfterMs = ms(res.RetryAfter)
				o.ResetMs = o.RetryAfterMs
			}
		}
	}
	if hs := headerFields(&w.d); len(hs) > 0 {
		out.Headers = map[string]string{}
		for _, h := range hs {
			out.Headers[h[0]] = h[1]
		}
	}
	a.count("http", w.d.Allowed)
	a.countLimits(&w.d)
	writeJSON(rw, out)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Handler returns the HTTP API: POST /v1/decide and /v1/reserve, GET
// /v1/table and /v1/keys/{key} (admin views), /healthz, /readyz, /metrics.
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/decide", a.authHTTP(a.handleDecide))
	mux.HandleFunc("POST /v1/reserve", a.authHTTP(a.handleReserve))
	mux.HandleFunc("GET /v1/table", a.authHTTP(a.handleTable))
	mux.HandleFunc("GET /v1/keys/", a.authHTTP(a.handleKey))
	mux.HandleFunc("/healthz", func(rw http.ResponseWriter, _ *http.Request) { _, _ = rw.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(rw http.ResponseWriter, r *http.Request) {
		if !a.ready.Load() {
			http.Error(rw, "not ready: draining", http.StatusServiceUnavailable)
			return
		}
		if check := a.storeCheck; check != nil {
			ctx, cancel := context.WithTimeout(r.Context(), time.Second)
			err := check(ctx)
			cancel()
			if err != nil {
				http.Error(rw, "not ready: the store does not answer", http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = rw.Write([]byte("ready\n"))
	})
	mux.Handle("/metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{}))
	a.upstreamHTTP(mux) // envoyproxy/ratelimit's /json and /healthcheck (json_upstream.go)
	return mux
}

// RegisterGRPC registers the RLS and health services on s.
func (a *Agent) RegisterGRPC(s *grpc.Server) {
	rlsv3.RegisterRateLimitServiceServer(s, a)
	healthpb.RegisterHealthServer(s, a.health)
}

// grpcWorkers is the number of goroutines that serve RPCs. A handler waits
// for Redis, so the pool must cover the RPCs in flight: with fewer workers
// than that, grpc-go starts a fresh goroutine per RPC, whose stack then
// grows through the handler on every call (at 64 concurrent RPCs a pool of
// GOMAXPROCS workers spent a fifth more CPU per decision than this one;
// README, "Running an agent"). Beyond 256 in flight the extra RPCs get their
// own goroutines as before; an idle worker costs its parked stack.
const grpcWorkers = 256

// Now is the node's time, µs: the wall clock, never going back — the
// clock the agent ticks and decides with.
func (a *Agent) Now() int64 { return a.now() }

// EndDrain ends a drain's wait (Config.DrainDelay) at once: the second
// SIGTERM or interrupt. Before Run's context ends it makes the drain skip
// the wait.
func (a *Agent) EndDrain() { a.endDrain.Do(func() { close(a.drainEnd) }) }

// Run serves on the listeners (either may be nil) and runs the node's loop
// until ctx ends, then drains: readiness fails at once, the agent goes on
// serving (and following its cluster) for Config.DrainDelay or until
// EndDrain, then the servers stop accepting and finish in-flight requests.
func (a *Agent) Run(ctx context.Context, grpcLis, httpLis net.Listener) error {
	if a.node.Fences() != (a.fencer != nil) {
		return fmt.Errorf("%w: the node's region fence (region.Config.Fence %v) needs SetFencer exactly when it is set (fencer set: %v)",
			ErrConfig, a.node.Fences(), a.fencer != nil)
	}
	errc := make(chan error, 2)
	var gs *grpc.Server
	if grpcLis != nil {
		opts := []grpc.ServerOption{grpc.UnaryInterceptor(a.authUnary),
			// A pool of stream workers instead of a goroutine per RPC, and
			// write buffers shared between connections.
			grpc.NumStreamWorkers(grpcWorkers), grpc.SharedWriteBuffer(true)}
		if a.tls != nil {
			opts = append(opts, grpc.Creds(credentials.NewTLS(a.tls)))
		}
		gs = grpc.NewServer(opts...)
		a.RegisterGRPC(gs)
		go func() { errc <- gs.Serve(grpcLis) }()
	}
	var hs *http.Server
	if httpLis != nil {
		hs = &http.Server{Handler: a.Handler(), ReadHeaderTimeout: 5 * time.Second}
		if a.tls != nil {
			httpLis = tls.NewListener(httpLis, a.tls)
		}
		go func() {
			if err := hs.Serve(httpLis); !errors.Is(err, http.ErrServerClosed) {
				errc <- err
				return
			}
			errc <- nil
		}()
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var poll <-chan time.Time
	if every := time.Duration(a.cfg.ReloadEvery); every > 0 {
		pt := time.NewTicker(every)
		defer pt.Stop()
		poll = pt.C
	}
	var err error
	last, lastLog := a.node.Stats(), time.Now()
	var tables <-chan *rebalance.Table
	if a.ctrl != nil {
		tables = a.ctrl.Tables()
	}
	var ackTerm, ackEpoch uint64
	ackFenced := false // the last acknowledgement carried a fence covering its table
	fctx, fstop := context.WithCancel(context.Background())
	fences := a.startFences(fctx)
	defer func() {
		fstop()
		if fences != nil {
			fences.wg.Wait()
		}
	}()
	done := ctx.Done()
	var drained <-chan time.Time // the drain's wait; nil until it starts
	endc, skip := (<-chan struct{})(a.drainEnd), false
loop:
	for {
		select {
		case <-done:
			d := a.cfg.DrainDelay.D()
			if d <= 0 || skip {
				break loop
			}
			// Readiness fails first; requests keep being answered while
			// the endpoints' removal reaches the callers.
			a.ready.Store(false)
			a.health.Shutdown()
			a.log.Info("draining: not ready, closing the listeners after drain_delay (a second signal closes them now)", "drain_delay", d)
			dt := time.NewTimer(d)
			defer dt.Stop()
			done, drained = nil, dt.C
		case <-drained:
			break loop
		case <-endc:
			if done == nil {
				break loop
			}
			// Before the context ended: the drain will not wait.
			endc, skip = nil, true
		case t := <-tables:
			aerr := a.node.Apply(t, a.now())
			if aerr == nil {
				a.noteApplied(t)
				if ts := a.node.Table(); ts.Named && !ts.Lapsed {
					// The fence goes up before the acknowledgement that
					// carries it: decisions under older tables are refused
					// in this region from then on.
					fences.raise(t)
				}
			}
			a.ctrl.Applied(t, aerr)
		case <-fences.doneC():
			if (ackTerm != 0 || ackEpoch != 0) && !ackFenced && fences.covers(ackTerm, ackEpoch) {
				// The acknowledgement went out before the fence was up
				// (usually the fence is up long before the table's
				// effective time): again, with the fence read back.
				ackFenced = true
				a.ctrl.InForce(ackTerm, ackEpoch)
			}
		case err = <-errc:
			if err != nil {
				break loop
			}
		case <-a.reloadCh:
			_ = a.Reload()
		case <-poll:
			if a.policyChanged() {
				_ = a.Reload()
			}
		case <-tick.C:
			if now := time.Now(); now.Sub(lastLog) >= time.Second {
				// Fallback decisions are logged at most once a second.
				s := a.node.Stats()
				if d := (s.FallbackOpen + s.FallbackClosed + s.FallbackLocal + s.FallbackError) - (last.FallbackOpen + last.FallbackClosed + last.FallbackLocal + last.FallbackError); d > 0 {
					a.log.Warn("store failing: failure modes deciding", "fallback_decisions", d,
						"open", s.FallbackOpen-last.FallbackOpen, "closed", s.FallbackClosed-last.FallbackClosed,
						"local", s.FallbackLocal-last.FallbackLocal, "error", s.FallbackError-last.FallbackError,
						"store_errors", s.StoreErrors-last.StoreErrors)
				}
				last, lastLog = s, now
			}
			now := a.now()
			if rep := a.node.Tick(now); rep != nil {
				a.log.Debug("demand report", "interval", rep.Interval, "keys", len(rep.Keys))
				if a.ctrl != nil {
					a.ctrl.Report(rep)
				}
			}
			if a.ctrl != nil {
				if term, epoch := a.node.InForce(now); term != ackTerm || epoch != ackEpoch {
					ackTerm, ackEpoch = term, epoch
					ackFenced = fences.covers(term, epoch)
					a.ctrl.InForce(term, epoch)
				}
			}
		}
	}
	a.ready.Store(false)
	a.health.Shutdown()
	if hs != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = hs.Shutdown(sctx)
		cancel()
	}
	if gs != nil {
		gs.GracefulStop()
	}
	// In-flight requests are done: report what they saw.
	dctx, cancel := context.WithTimeout(context.Background(), a.node.Interval()+2*time.Second)
	a.drainReport(dctx)
	cancel()
	return err
}

var _ rlsv3.RateLimitServiceServer = (*Agent)(nil)
