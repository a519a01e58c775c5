package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meridian-quota/meridian/region"
)

const errorModePolicy = `
domains:
  - domain: f
    descriptors:
      - key: error
        rate_limit: {unit: hour, requests_per_unit: 100, burst: 10, failure_mode: error}
      - key: closed
        rate_limit: {unit: hour, requests_per_unit: 100, burst: 10, failure_mode: closed}
      - key: local
        rate_limit: {unit: hour, requests_per_unit: 100, burst: 10, failure_mode: local}
`

// TestFailureModeErrorOnBothProtocols pauses a private redis-server: a
// request with a failure_mode error limit fails — RLS with Unavailable
// (Envoy's failure_mode_deny then decides), POST /v1/decide and
// /v1/reserve with 503 and a JSON error — and is counted as a fallback
// decision; a closed limit in the same composite still denies (closed wins
// over error), a local one does not make it decide (error wins over
// local). With Redis back the same requests are decided.
//
// Fails on 4804b9e: failure_mode error was parsed and then decided as
// open: the RLS call answered OK, HTTP 200 allowed.
func TestFailureModeErrorOnBothProtocols(t *testing.T) {
	srv, _, br, pol := pausableStore(t, errorModePolicy)
	cfg := DefaultConfig()
	cfg.DrainDelay = 0 // stopped at once
	cfg.Region, cfg.Agent, cfg.Regions, cfg.Policy, cfg.ReloadEvery = "eu", "eu-1", []string{"eu"}, "unused", 0
	node, err := region.NewNode(cfg.NodeConfig(), pol, br)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(cfg, node, nil, br.Collectors()...)
	if err != nil {
		t.Fatal(err)
	}
	cl := serveRLS(t, a)
	hs := httptest.NewServer(a.Handler())
	t.Cleanup(hs.Close)
	rls := func(keys ...string) (*rlsv3.RateLimitResponse, error) {
		in := &rlsv3.RateLimitRequest{Domain: "f"}
		for _, k := range keys {
			in.Descriptors = append(in.Descriptors, desc(nil, k, "x"))
		}
		return cl.ShouldRateLimit(context.Background(), in)
	}
	post := func(path, body string) (int, string) {
		resp, err := http.Post(hs.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String()
	}
	const decideBody = `{"domain": "f", "descriptors": [{"entries": [{"key": "error", "value": "x"}]}]}`
	const reserveBody = `{"domain": "f", "descriptors": [{"entries": [{"key": "error", "value": "x"}]}], "max_wait_ms": 10}`

	if resp, err := rls("error"); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("Redis up: %v %v, want OK", resp, err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	for range 3 { // before and after the breaker opens
		if _, err := rls("error"); status.Code(err) != codes.Unavailable {
			t.Errorf("error limit, Redis paused: %v, want Unavailable", err)
		}
		if _, err := rls("local", "error"); status.Code(err) != codes.Unavailable {
			t.Errorf("local and error limits, Redis paused: %v, want Unavailable (error wins over local)", err)
		}
		if resp, err := rls("error", "closed"); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("error and closed limits, Redis paused: %v %v, want OVER_LIMIT (closed wins over error)", resp, err)
		}
	}
	for _, tt := range []struct{ path, body string }{{"/v1/decide", decideBody}, {"/v1/reserve", reserveBody}} {
		code, body := post(tt.path, tt.body)
		var er ErrorResponse
		if code != http.StatusServiceUnavailable || json.Unmarshal([]byte(body), &er) != nil || !strings.Contains(er.Error, "failure_mode is error") {
			t.Errorf("POST %s, Redis paused: %d %s, want 503 with a JSON error", tt.path, code, body)
		}
	}
	if got := node.Stats().FallbackError; got != 3*2+2 {
		t.Errorf("Stats.FallbackError = %d, want %d", got, 3*2+2)
	}
	resp, err := http.Get(hs.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var m bytes.Buffer
	_, _ = m.ReadFrom(resp.Body)
	resp.Body.Close()
	if !strings.Contains(m.String(), "meridian_fallback_error_total 8") {
		t.Errorf("/metrics lacks meridian_fallback_error_total 8")
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	// The breaker probes again after its cooldown: poll until decided.
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := rls("error")
		if err == nil {
			if resp.OverallCode != rlsv3.RateLimitResponse_OK {
				t.Errorf("Redis back: %v, want OK", resp.OverallCode)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redis back, still failing after 10 s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, body := post("/v1/decide", decideBody); code != http.StatusOK {
		t.Errorf("POST /v1/decide, Redis back: %d %s, want 200", code, body)
	}
}
