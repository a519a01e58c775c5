package agent

import (
	"context"
	"io"
	"net/http"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// envoyproxy/ratelimit's HTTP surface, answered as its server does, so that
// clients and probes written for it work unchanged: /json (its
// "http/1 handler … for clients that cannot use the gRPC interface") and
// /healthcheck, and the gRPC health service it registers under its own
// name.

// upstreamHealthService is the service name envoyproxy/ratelimit's gRPC
// health server reports (a probe may ask for it by name).
const upstreamHealthService = "ratelimit"

// upstreamHTTP registers the upstream handlers on mux (Handler calls it).
func (a *Agent) upstreamHTTP(mux *http.ServeMux) {
	// Any method, as upstream's router registers the path: its clients
	// POST, and a GET with a body is decided alike.
	mux.HandleFunc("/json", a.authHTTP(a.handleUpstreamJSON))
	mux.HandleFunc("/healthcheck", a.handleUpstreamHealth)
}

// handleUpstreamJSON answers upstream's /json: the body is a
// RateLimitRequest in protojson (unknown fields refused, as protojson
// does), decided by ShouldRateLimit — the RLS path itself, so the answer is
// the one gRPC gives — and the RateLimitResponse comes back in protojson.
// Status codes are upstream's: 200 OK, 429 when the overall code is
// OVER_LIMIT, 400 when the body does not read or parse or the decision
// fails (upstream answers 400 for any error ShouldRateLimit returns,
// whatever its gRPC code), 500 when the response has no code or does not
// marshal; errors carry the status text only, as upstream's do.
func (a *Agent) handleUpstreamJSON(rw http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(rw, r.Body, maxBody))
	if err != nil {
		a.errors.Inc()
		a.log.Debug("/json: reading the body", "err", err)
		upstreamStatus(rw, http.StatusBadRequest)
		return
	}
	var req rlsv3.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		a.errors.Inc()
		a.log.Debug("/json: not a RateLimitRequest", "err", err)
		upstreamStatus(rw, http.StatusBadRequest)
		return
	}
	resp, err := a.ShouldRateLimit(r.Context(), &req)
	if err != nil {
		a.log.Debug("/json: decision failed", "err", err)
		upstreamStatus(rw, http.StatusBadRequest)
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil || resp.GetOverallCode() == rlsv3.RateLimitResponse_UNKNOWN {
		a.log.Error("/json: no answer to send", "err", err)
		upstreamStatus(rw, http.StatusInternalServerError)
		return
	}
	rw.Header().Set("Content-Type", "application/json")
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		rw.WriteHeader(http.StatusTooManyRequests)
	}
	_, _ = rw.Write(out)
}

// upstreamStatus answers code with its status text, as upstream's
// writeHttpStatus does.
func upstreamStatus(rw http.ResponseWriter, code int) {
	http.Error(rw, http.StatusText(code), code)
}

// SetHealthcheckStore makes /healthcheck also fail while the store does
// not answer (upstream's REDIS_HEALTH_CHECK_ACTIVE_CONNECTION); by default
// it fails only while the agent drains, as upstream's fails only after
// SIGTERM, so a liveness probe on it never restarts agents because Redis
// is down (their failure modes decide meanwhile; /readyz waits for Redis).
// Call it before Run.
func (a *Agent) SetHealthcheckStore(on bool) { a.healthAnyStore = on }

// handleUpstreamHealth answers upstream's /healthcheck: 200 "OK" while
// healthy, else 500 with no body.
func (a *Agent) handleUpstreamHealth(rw http.ResponseWriter, r *http.Request) {
	healthy := a.ready.Load()
	if check := a.storeCheck; healthy && a.healthAnyStore && check != nil {
		ctx, cancel := context.WithTimeout(r.Context(), time.Second)
		healthy = check(ctx) == nil
		cancel()
	}
	if !healthy {
		rw.WriteHeader(http.StatusInternalServerError)
		return
	}
	_, _ = rw.Write([]byte("OK"))
}
