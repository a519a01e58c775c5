package agent

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/meridian-quota/meridian/internal/regiontest"
	"github.com/meridian-quota/meridian/region"
)

const standalonePolicy = `
domains:
  - domain: api
    descriptors:
      - key: tenant
        rate_limit: {unit: second, requests_per_unit: 1000, burst: 200}
      - key: user
        rate_limit: {unit: second, requests_per_unit: 5, burst: 3}
`

// startStandalone runs an agent as `meridian agent` would from the config
// file body (no table, no Control): LoadConfig, the node from
// Config.NodeConfig on real Redis, RLS over gRPC and the HTTP API.
func startStandalone(t *testing.T, body string) (*Agent, rlsv3.RateLimitServiceClient, string) {
	t.Helper()
	dir := t.TempDir()
	for name, text := range map[string]string{"policy.yaml": standalonePolicy, "agent.yaml": body} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := LoadConfig(filepath.Join(dir, "agent.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.DrainDelay = 0 // stopped at once
	pol, err := region.ParsePolicy([]byte(standalonePolicy))
	if err != nil {
		t.Fatal(err)
	}
	node, err := region.NewNode(cfg.NodeConfig(), pol, regiontest.RedisStore(t))
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(*cfg, node, nil)
	if err != nil {
		t.Fatal(err)
	}
	cl := serveRLS(t, a)
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(srv.Close)
	return a, cl, srv.URL
}

// TestStandaloneEnforcesTheWholeLimit is issue 15's must-hold 4: a
// standalone agent (no cluster section, one region) with 1000/s burst 200
// admits 200 back to back, then the next is admitted or told to retry
// after at most 1 ms, and current_limit, RateLimit-Policy and /v1/keys say
// what is enforced. 5/s burst 3 admits 3. Every verdict is read from the
// answers (remaining and retry-after are computed on Redis's clock), so a
// slow machine only refills tokens: it can turn the next denial into an
// admission, never fail the test.
//
// Fails on 4804b9e: the standalone agent ran every key at the safe share,
// 10 % of the budget (1000/s burst 200 ran at T = 10 ms with burst 20: the
// 21st request was denied with about 10 ms to wait; 5/s burst 3 admitted 1
// and asked to retry after 2 s) while current_limit and RateLimit-Policy
// advertised the whole limit.
func TestStandaloneEnforcesTheWholeLimit(t *testing.T) {
	a, cl, url := startStandalone(t, "region: eu\nagent: eu-1\npolicy: policy.yaml\nresponse_headers: true\n")
	if got := a.node.SafeShare(); got != 1_000_000 {
		t.Fatalf("standalone safe share %d ppm, want 1000000 (the whole budget)", got)
	}
	ctx := context.Background()
	tests := []struct {
		key        string
		rate       uint32
		burst      int
		maxRetry   time.Duration // the next request's longest wait: T
		wantPolicy string
	}{
		{"tenant", 1000, 200, time.Millisecond, `"domains[0].descriptors[0]";q=1000;w=1`},
		{"user", 5, 3, 200 * time.Millisecond, `"domains[0].descriptors[1]";q=5;w=1`},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{desc(nil, tt.key, "acme")}}
			for i := range tt.burst + 1 {
				resp, err := cl.ShouldRateLimit(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				st := resp.Statuses[0]
				if cl := st.CurrentLimit; cl.RequestsPerUnit != tt.rate || cl.Unit != rlsv3.RateLimitResponse_RateLimit_SECOND {
					t.Fatalf("request %d: current_limit %v, want %d per second", i+1, cl, tt.rate)
				}
				if i == 0 {
					// A fresh key holds the whole burst: the first request
					// leaves burst − 1, whatever the clock does.
					if st.LimitRemaining != uint32(tt.burst-1) {
						t.Errorf("request 1: limit_remaining %d, want %d (the whole burst enforced)", st.LimitRemaining, tt.burst-1)
					}
					var policy string
					for _, h := range resp.ResponseHeadersToAdd {
						if h.Key == "RateLimit-Policy" {
							policy = h.Value
						}
					}
					if policy != tt.wantPolicy {
						t.Errorf("RateLimit-Policy %q, want %q", policy, tt.wantPolicy)
					}
				}
				if i < tt.burst {
					// Time passing only refills: never fewer left than back to back.
					if resp.OverallCode != rlsv3.RateLimitResponse_OK || st.LimitRemaining < uint32(tt.burst-1-i) {
						t.Fatalf("request %d: %v remaining %d, want OK with at least %d left", i+1, resp.OverallCode, st.LimitRemaining, tt.burst-1-i)
					}
					continue
				}
				if resp.OverallCode == rlsv3.RateLimitResponse_OK {
					return // the machine was slow enough to refill a token
				}
				if d := st.DurationUntilReset.AsDuration(); d <= 0 || d > tt.maxRetry {
					t.Errorf("request %d: over with retry after %v, want at most %v (the region's T is the global T)", i+1, d, tt.maxRetry)
				}
			}
		})
	}
	// /v1/keys shows both limits: the one sold and the one this region
	// runs; standalone they are the same.
	resp, err := http.Get(url + "/v1/keys/" + region.KeyName("api", []region.Entry{{Key: "tenant", Value: "acme"}}))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var kv KeyView
	if err := json.NewDecoder(resp.Body).Decode(&kv); err != nil || resp.StatusCode != 200 {
		t.Fatalf("/v1/keys: %d %v", resp.StatusCode, err)
	}
	if kv.Share != 1 || !strings.Contains(kv.Limit, "burst 200 (T=1000µs)") || kv.Regional != "T=1000µs burst 200" {
		t.Errorf("/v1/keys: limit %q regional %q share %v, want the regional limit the global one (share 1)", kv.Limit, kv.Regional, kv.Share)
	}
}

// TestStandaloneConfig: without a cluster section the agent's region is
// the only one and holds every budget whole unless safe_fraction says
// otherwise; several regions are a load error; safe_fraction is checked
// for the mode.
//
// Fails on 4804b9e: safe_fraction was not a field, regions [eu, us]
// without a cluster loaded (and ran 5 % of every limit), and a file
// without regions was refused.
func TestStandaloneConfig(t *testing.T) {
	const cluster = "cluster: {name: c, nats: {urls: [nats://x]}, members: {bind: 127.0.0.1:7946, allow_plaintext: true}, coordinator: {verify_keys_env: K%s}}\n"
	tests := []struct {
		name     string
		give     string
		wantErr  string
		wantFrac float64
		wantPPM  uint32
	}{
		{name: "standalone, regions left out", give: "region: eu\n", wantFrac: 1, wantPPM: 1_000_000},
		{name: "standalone, one region", give: "region: eu\nregions: [eu]\n", wantFrac: 1, wantPPM: 1_000_000},
		{name: "standalone, a part by hand", give: "region: eu\nsafe_fraction: 0.5\n", wantFrac: 0.5, wantPPM: 500_000},
		{name: "standalone, several regions", give: "region: eu\nregions: [eu, us]\n",
			wantErr: `regions: ["eu" "us"]: 2 regions without a cluster section: a standalone agent holds the whole of every budget in its region, so each region would admit the full limit; add a cluster section to share the budgets between the regions, or list only "eu"`},
		{name: "standalone, above 1", give: "region: eu\nsafe_fraction: 1.5\n", wantErr: "safe_fraction: 1.5: must be in (0, 1]"},
		{name: "negative", give: "region: eu\nsafe_fraction: -0.1\n", wantErr: "safe_fraction: -0.1: must be in (0, 1]"},
		{name: "not a number", give: "region: eu\nsafe_fraction: .nan\n", wantErr: "safe_fraction: NaN: must be in (0, 1]"},
		{name: "cluster default", give: "region: eu\nregions: [eu, us]\n" + strings.ReplaceAll(cluster, "%s", ""), wantFrac: 0.1, wantPPM: 50_000},
		{name: "cluster, the coordinator's", give: "region: eu\nregions: [eu, us]\n" + strings.ReplaceAll(cluster, "%s", ", safe_fraction: 0.2"), wantFrac: 0.2, wantPPM: 100_000},
		{name: "cluster, top level", give: "region: eu\nregions: [eu, us]\nsafe_fraction: 0.3\n" + strings.ReplaceAll(cluster, "%s", ""), wantFrac: 0.3, wantPPM: 150_000},
		{name: "cluster, both agreeing", give: "region: eu\nregions: [eu, us]\nsafe_fraction: 0.3\n" + strings.ReplaceAll(cluster, "%s", ", safe_fraction: 0.3"), wantFrac: 0.3, wantPPM: 150_000},
		{name: "cluster, both differing", give: "region: eu\nregions: [eu, us]\nsafe_fraction: 0.3\n" + strings.ReplaceAll(cluster, "%s", ", safe_fraction: 0.2"),
			wantErr: "safe_fraction: 0.3 differs from cluster.coordinator.safe_fraction 0.2: the node's floors and the coordinator's must agree"},
		{name: "cluster, the whole budget", give: "region: eu\nregions: [eu, us]\nsafe_fraction: 1\n" + strings.ReplaceAll(cluster, "%s", ""),
			wantErr: "safe_fraction: 1: in a cluster the floors would be the whole budget"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParseConfig([]byte("agent: eu-1\npolicy: p.yaml\n" + tt.give))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := c.ResolvedSafeFraction(); got != tt.wantFrac {
				t.Errorf("ResolvedSafeFraction = %v, want %v", got, tt.wantFrac)
			}
			nc := c.NodeConfig()
			node, err := region.NewNode(nc, mustPolicy(t), ctxStore{})
			if err != nil {
				t.Fatal(err)
			}
			if got := node.SafeShare(); got != tt.wantPPM {
				t.Errorf("node safe share %d ppm, want %d", got, tt.wantPPM)
			}
		})
	}
	if f := (&Config{SafeFraction: math.Inf(1)}); f.Validate() == nil {
		t.Error("safe_fraction +Inf accepted")
	}
}

func mustPolicy(t *testing.T) *region.Policy {
	t.Helper()
	p, err := region.ParsePolicy([]byte(standalonePolicy))
	if err != nil {
		t.Fatal(err)
	}
	return p
}
