package client_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/meridian-quota/meridian/internal/regiontest"
	"github.com/meridian-quota/meridian/region/agent"
	"github.com/meridian-quota/meridian/region/agent/api"
	"github.com/meridian-quota/meridian/region/client"
)

const policy = `
domains:
  - domain: api
    hash_tag: tenant
    descriptors:
      - key: tenant
        rate_limit: {unit: second, requests_per_unit: 5, burst: 2, name: tenant}
`

// agentURL runs a standalone agent on real Redis: its one region holds
// every budget whole.
func agentURL(t *testing.T) string {
	t.Helper()
	node := regiontest.Node(t, policy, regiontest.RedisStore(t))
	cfg := agent.DefaultConfig()
	cfg.Region, cfg.Agent, cfg.Regions, cfg.Policy = "eu", "eu-1", []string{"eu"}, "unused"
	a, err := agent.New(cfg, node, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(srv.Close)
	return srv.URL
}

func byTenant(r *http.Request) []api.DescriptorIn {
	t := r.Header.Get("X-Tenant")
	if t == "" {
		return nil
	}
	return []api.DescriptorIn{{Entries: []api.EntryIn{{Key: "tenant", Value: t}}}}
}

func TestMiddleware(t *testing.T) {
	c := &client.Client{BaseURL: agentURL(t)}
	h := client.Middleware(c, client.Options{Domain: "api", Describe: byTenant})(
		http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { rw.Write([]byte("hello")) }))
	do := func() *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, "/x", nil)
		r.Header.Set("X-Tenant", "acme")
		h.ServeHTTP(rec, r)
		return rec
	}
	// Burst 2: two through, carrying what remains.
	for want := 1; want >= 0; want-- {
		rec := do()
		if rec.Code != 200 || rec.Body.String() != "hello" {
			t.Fatalf("allowed: %d %q", rec.Code, rec.Body.String())
		}
		if got := rec.Header().Get("RateLimit"); !strings.HasPrefix(got, fmt.Sprintf(`"tenant";r=%d;t=`, want)) {
			t.Errorf("RateLimit %q, want r=%d", got, want)
		}
		if got := rec.Header().Get("RateLimit-Policy"); got != `"tenant";q=5;w=1` {
			t.Errorf("RateLimit-Policy %q", got)
		}
	}
	rec := do()
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "1" {
		t.Fatalf("over: %d Retry-After %q, want 429 with 1 (200 ms rounded up)", rec.Code, rec.Header().Get("Retry-After"))
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("content type %q", ct)
	}
	var p struct {
		Type, Title string
		Status      int
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Status != 429 || p.Title == "" || p.Type != "about:blank" {
		t.Errorf("problem body %q (%v)", rec.Body.String(), err)
	}
	// A request no descriptor describes is not limited.
	rec2 := httptest.NewRecorder()
	h.ServeHTTP(rec2, httptest.NewRequest(http.MethodGet, "/x", nil))
	if rec2.Code != 200 {
		t.Errorf("undescribed request: %d", rec2.Code)
	}
}

func TestMiddlewareAgentDown(t *testing.T) {
	down := httptest.NewServer(http.NotFoundHandler())
	url := down.URL
	down.Close()
	for _, tt := range []struct {
		failOpen bool
		want     int
	}{{true, 200}, {false, 503}} {
		h := client.Middleware(&client.Client{BaseURL: url}, client.Options{Domain: "api", Describe: byTenant, FailOpen: tt.failOpen})(
			http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {}))
		rec := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, "/x", nil)
		r.Header.Set("X-Tenant", "acme")
		h.ServeHTTP(rec, r)
		if rec.Code != tt.want {
			t.Errorf("FailOpen %v: %d, want %d", tt.failOpen, rec.Code, tt.want)
		}
	}
}

// A 4xx from the agent never fails open: a client must not skip its limit
// by sending a descriptor the agent refuses.
func TestMiddlewareNeverFailsOpenOn4xx(t *testing.T) {
	c := &client.Client{BaseURL: agentURL(t)}
	h := client.Middleware(c, client.Options{Domain: "api", FailOpen: true, Describe: byTenant})(
		http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {}))
	rec := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodGet, "/x", nil)
	r.Header.Set("X-Tenant", strings.Repeat("x", 300)) // above the agent's 256-byte value limit
	h.ServeHTTP(rec, r)
	if rec.Code != http.StatusBadRequest {
		t.Errorf("oversized descriptor with FailOpen: %d, want 400", rec.Code)
	}
	bad := client.Middleware(&client.Client{BaseURL: c.BaseURL + "/nowhere"}, client.Options{Domain: "api", FailOpen: true, Describe: byTenant})(
		http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {}))
	rec = httptest.NewRecorder()
	r = httptest.NewRequest(http.MethodGet, "/x", nil)
	r.Header.Set("X-Tenant", "acme")
	bad.ServeHTTP(rec, r)
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("agent answering 404 with FailOpen: %d, want 503", rec.Code)
	}
}
