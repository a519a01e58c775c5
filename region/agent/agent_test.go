package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meridian-quota/meridian/internal/regiontest"
	"github.com/meridian-quota/meridian/region"
)

// Hourly limits beside the seed trace's 5/s so that real time refills
// nothing the tests count on.
const testPolicy = `
domains:
  - domain: api
    hash_tag: tenant
    descriptors:
      - key: tenant
        rate_limit: {unit: second, requests_per_unit: 5, burst: 3}
        descriptors:
          - key: route
            value: /search
            rate_limit: {unit: hour, requests_per_unit: 2, burst: 2}
  - domain: users
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 100, burst: 10}
`

// start runs an agent for region eu alone, on real Redis — a standalone
// node, every key at its whole budget without a table — and returns an RLS
// client and the HTTP server's URL.
func start(t *testing.T) (*Agent, rlsv3.RateLimitServiceClient, string) {
	t.Helper()
	return startWith(t, nil)
}

// startWith is start with a hook to change the agent's config; the policy
// is written to a file the config names.
func startWith(t *testing.T, edit func(*Config)) (*Agent, rlsv3.RateLimitServiceClient, string) {
	t.Helper()
	return startOn(t, regiontest.Node(t, testPolicy, regiontest.RedisStore(t)), edit)
}

// startOn is startWith deciding with node (built under testPolicy).
func startOn(t *testing.T, node *region.Node, edit func(*Config)) (*Agent, rlsv3.RateLimitServiceClient, string) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Region, cfg.Agent, cfg.Regions = "eu", "eu-1", []string{"eu"}
	cfg.Policy = filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(cfg.Policy, []byte(testPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.ReloadEvery = 0 // the tests reload explicitly
	cfg.DrainDelay = 0  // the tests stop agents at once (TestDrainDelay drains)
	if edit != nil {
		edit(&cfg)
	}
	a, err := New(cfg, node, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.TLS.Enabled() {
		return a, nil, "" // the caller runs it on its own TLS listeners
	}
	cl := serveRLS(t, a)
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(srv.Close)
	return a, cl, srv.URL
}

// serveRLS runs a until the test ends, serving RLS on a loopback port, and
// returns a client of it.
func serveRLS(t testing.TB, a *Agent) rlsv3.RateLimitServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, lis, nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// giveAll applies a table giving eu the whole budget of each key (what a
// standalone node holds without one): for tests of the table views.
func giveAll(t *testing.T, a *Agent, keys ...string) { regiontest.GiveAll(t, a.node, keys...) }

func desc(hits *uint64, kv ...string) *commonv3.RateLimitDescriptor {
	d := &commonv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	if hits != nil {
		d.HitsAddend = wrapperspb.UInt64(*hits)
	}
	return d
}

func u64(v uint64) *uint64 { return &v }

func TestRLSSeedTrace(t *testing.T) {
	_, cl, _ := start(t)
	ctx := context.Background()
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{desc(nil, "tenant", "acme")}}
	// Seed 003: 5/s, burst 3 — three admitted back to back, the fourth
	// over with about 200 ms to wait.
	for i := range 4 {
		resp, err := cl.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		st := resp.Statuses[0]
		if i < 3 {
			if resp.OverallCode != rlsv3.RateLimitResponse_OK || st.LimitRemaining != uint32(2-i) {
				t.Fatalf("request %d: %v remaining %d, want OK with %d", i, resp.OverallCode, st.LimitRemaining, 2-i)
			}
			continue
		}
		if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || st.Code != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("request 4: %v, want OVER_LIMIT", resp.OverallCode)
		}
		if d := st.DurationUntilReset.AsDuration(); d <= 100*time.Millisecond || d > 200*time.Millisecond {
			t.Errorf("request 4: duration_until_reset %v, want the retry-after (≤ 200 ms)", d)
		}
		if cl := st.CurrentLimit; cl.RequestsPerUnit != 5 || cl.Unit != rlsv3.RateLimitResponse_RateLimit_SECOND {
			t.Errorf("current_limit %v, want 5 per second", cl)
		}
	}
}

func TestRLSCompositeAndHits(t *testing.T) {
	_, cl, url := start(t)
	ctx := context.Background()
	both := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{
		desc(nil, "tenant", "t1"), desc(nil, "tenant", "t1", "route", "/search")}}
	// The route's burst of 2 holds; the tenant (burst 3) is never charged
	// for the denied composite (envoyproxy/ratelimit#1060).
	for i := range 3 {
		resp, err := cl.ShouldRateLimit(ctx, both)
		if err != nil {
			t.Fatal(err)
		}
		want := rlsv3.RateLimitResponse_OK
		if i == 2 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if resp.OverallCode != want {
			t.Fatalf("composite %d: %v, want %v", i, resp.OverallCode, want)
		}
		if i == 2 && (resp.Statuses[0].Code != rlsv3.RateLimitResponse_OK || resp.Statuses[1].Code != rlsv3.RateLimitResponse_OVER_LIMIT) {
			t.Errorf("composite 3: statuses %v %v, want the tenant OK and the route over", resp.Statuses[0].Code, resp.Statuses[1].Code)
		}
	}
	// Per-descriptor hits_addend 0 peeks: OK, nothing consumed.
	peek := &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 5, Descriptors: []*commonv3.RateLimitDescriptor{desc(u64(0), "tenant", "t1")}}
	resp, err := cl.ShouldRateLimit(ctx, peek)
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 1 {
		t.Fatalf("peek: %v %v, want OK with 1 remaining (3 − 2 charged)", resp, err)
	}
	// 2^32−1 can never fit: over, with no reset that invites a retry.
	huge := &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 1<<32 - 1, Descriptors: []*commonv3.RateLimitDescriptor{desc(nil, "tenant", "t1")}}
	resp, err = cl.ShouldRateLimit(ctx, huge)
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].DurationUntilReset != nil {
		t.Fatalf("2^32−1: %v %v, want OVER_LIMIT without a reset", resp, err)
	}
	// Request-level 0 means 1: the tenant's last token.
	one := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{desc(nil, "tenant", "t1")}}
	if resp, err = cl.ShouldRateLimit(ctx, one); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("hits 0: %v %v, want OK with 0 remaining", resp, err)
	}
	// A per-descriptor hits_addend above 2^32−1 is refused, nothing consumed.
	if _, err := cl.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "users", Descriptors: []*commonv3.RateLimitDescriptor{desc(u64(1<<32), "user", "u")}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("hits 2^32: err %v, want InvalidArgument", err)
	}
	// Unknown domain and unmatched descriptors: OK with no limit.
	for _, r := range []*rlsv3.RateLimitRequest{
		{Domain: "nope", Descriptors: []*commonv3.RateLimitDescriptor{desc(nil, "tenant", "t1")}},
		{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{desc(nil, "colour", "red")}},
	} {
		resp, err := cl.ShouldRateLimit(ctx, r)
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.Statuses) != 1 || resp.Statuses[0].CurrentLimit != nil {
			t.Errorf("%s: %v %v, want OK with no limit", r.Domain, resp, err)
		}
	}
	// The HTTP API decides the same: the tenant is now out of tokens.
	body, _ := json.Marshal(DecideRequest{Domain: "api", Descriptors: []DescriptorIn{{Entries: []EntryIn{{Key: "tenant", Value: "t1"}}}}})
	hr, err := http.Post(url+"/v1/decide", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer hr.Body.Close()
	var out DecideResponse
	if err := json.NewDecoder(hr.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if out.Allowed || out.Statuses[0].Code != "OVER_LIMIT" || out.Statuses[0].RetryAfterMs <= 0 {
		t.Errorf("HTTP decide: %+v, want OVER_LIMIT with a retry-after", out)
	}
	// Bad JSON is a 400.
	hr2, err := http.Post(url+"/v1/decide", "application/json", strings.NewReader(`{"domain": "api", "colour": 1}`))
	if err != nil {
		t.Fatal(err)
	}
	hr2.Body.Close()
	if hr2.StatusCode != http.StatusBadRequest {
		t.Errorf("unknown JSON field: status %d, want 400", hr2.StatusCode)
	}
}

func TestMetricsExposed(t *testing.T) {
	a, _, url := start(t)
	_ = a
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	for _, name := range []string{"meridian_decisions_total", "meridian_fallback_local_total", "meridian_shadow_would_deny_total",
		"meridian_store_errors_total", "meridian_deny_cache_hits_total", `meridian_limit_decisions_total{limit="api:domains[0].descriptors[0]",result="ok"} 0`,
		"meridian_lease_seconds_left", "meridian_table_epoch", "meridian_retry_after_seconds_bucket", "meridian_policy_reloads_total"} {
		if !strings.Contains(b.String(), name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	tests := []struct{ name, give, want string }{
		{"empty", "", "empty file"},
		{"unknown field", "region: eu\ncolour: red\n", "field colour not found"},
		{"missing identity", "policy: p.yaml\n", "region: empty"},
		{"region not listed", "region: eu\nagent: a\nregions: [us]\npolicy: p.yaml\n", `does not list region "eu"`},
		{"bad timeout", "region: eu\nagent: a\nregions: [eu]\npolicy: p.yaml\nredis: {timeout: 0s}\n", "redis.timeout: 0s"},
		{"bad lanes", "region: eu\nagent: a\nregions: [eu]\npolicy: p.yaml\nredis: {lanes: 0}\n", "redis.lanes: 0"},
		{"bad write format", "region: eu\nagent: a\nregions: [eu]\npolicy: p.yaml\nredis: {write_format: exact}\n", `redis.write_format: "exact": want value, value12 or packed`},
		{"bad on_state_loss", "region: eu\nagent: a\nregions: [eu]\npolicy: p.yaml\nredis: {on_state_loss: panic}\n", `redis.on_state_loss: "panic": want count or conservative`},
		{"drain_delay too long", "region: eu\nagent: a\nregions: [eu]\npolicy: p.yaml\ndrain_delay: 1h\n", `drain_delay: 1h0m0s: must be in [0s, 5m0s]`},
		{"no policy", "region: eu\nagent: a\nregions: [eu]\n", "policy: empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := ParseConfig([]byte(tt.give)); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want %q", err, tt.want)
			}
		})
	}
	c, err := ParseConfig([]byte("region: eu\nagent: eu-1\nregions: [eu]\npolicy: p.yaml\n"))
	if err != nil || c.GRPC != DefaultConfig().GRPC || time.Duration(c.Redis.Timeout) != 5*time.Millisecond {
		t.Errorf("defaults: %+v %v", c, err)
	}
}

func TestAuthOnBothProtocols(t *testing.T) {
	const token = "s3cret-token-0123456789"
	t.Setenv("MERIDIAN_TEST_TOKENS", "other-token-abcdefghij,"+token)
	a, cl, url := startWith(t, func(c *Config) { c.Auth.TokensEnv = "MERIDIAN_TEST_TOKENS" })
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{desc(nil, "tenant", "acme")}}
	for _, md := range []string{"", "Bearer wrong-token-0123456789", token} {
		ctx := context.Background()
		if md != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", md)
		}
		if _, err := cl.ShouldRateLimit(ctx, req); status.Code(err) != codes.Unauthenticated {
			t.Errorf("RLS with %q: %v, want Unauthenticated", md, err)
		}
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token)
	if resp, err := cl.ShouldRateLimit(ctx, req); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Errorf("RLS with the token: %v %v", resp, err)
	}
	body := `{"domain": "api", "descriptors": [{"entries": [{"key": "tenant", "value": "acme"}]}]}`
	for _, tt := range []struct {
		header string
		want   int
	}{{"", 401}, {"Bearer nope-nope-nope-nope-nope", 401}, {"Bearer " + token, 200}} {
		r, _ := http.NewRequest(http.MethodPost, url+"/v1/decide", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		if tt.header != "" {
			r.Header.Set("Authorization", tt.header)
		}
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tt.want {
			t.Errorf("HTTP with %q: %d, want %d", tt.header, resp.StatusCode, tt.want)
		}
	}
	if resp, err := http.Get(url + "/healthz"); err != nil || resp.StatusCode != 200 {
		t.Errorf("/healthz must stay open: %v %v", resp, err)
	}
	if _, err := New(Config{}, a.node, nil); err == nil {
		t.Error("an invalid config was accepted")
	}
	t.Setenv("MERIDIAN_SHORT", "short")
	cfg := a.cfg
	cfg.Auth = AuthConfig{TokensEnv: "MERIDIAN_SHORT"}
	if _, err := New(cfg, a.node, nil); err == nil || strings.Contains(err.Error(), "short\"") {
		t.Errorf("short token: %v (must be refused without showing it)", err)
	}
}

// Reloads under concurrent load: every answer comes from one whole policy
// (5/s or 7/s), a broken file is rejected and the old policy stays.
func TestHotReloadUnderLoad(t *testing.T) {
	a, cl, _ := start(t)
	pol := func(rate int) string {
		return strings.Replace(testPolicy, "requests_per_unit: 5, burst: 3", fmt.Sprintf("requests_per_unit: %d, burst: 3", rate), 1)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var mu sync.Mutex
	seen := map[uint32]int{}
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{desc(nil, "tenant", fmt.Sprintf("t%d", g))}}
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := cl.ShouldRateLimit(context.Background(), req)
				if err != nil {
					t.Error(err)
					return
				}
				n := resp.Statuses[0].CurrentLimit.GetRequestsPerUnit()
				mu.Lock()
				seen[n]++
				mu.Unlock()
			}
		}()
	}
	for i := range 20 {
		rate := 5 + 2*(i%2)
		if err := os.WriteFile(a.cfg.Policy, []byte(pol(rate)), 0o644); err != nil {
			t.Fatal(err)
		}
		a.RequestReload()
		time.Sleep(10 * time.Millisecond)
	}
	before := a.node.Policy().Version()
	if err := os.WriteFile(a.cfg.Policy, []byte("domains: [{domain: api, descriptors: [{key: tenant, rate_limit: {unit: fortnight}}]}]"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := a.Reload(); err == nil {
		t.Error("a broken policy was accepted")
	}
	close(stop)
	wg.Wait()
	if a.node.Policy().Version() != before {
		t.Error("the broken file replaced the policy")
	}
	for n := range seen {
		if n != 5 && n != 7 {
			t.Errorf("a response carried %d/s: from neither whole policy (seen %v)", n, seen)
		}
	}
	if seen[5] == 0 || seen[7] == 0 {
		t.Errorf("both policies should have answered under load: %v", seen)
	}
}

func TestRLSResponseHeaders(t *testing.T) {
	_, cl, _ := startWith(t, func(c *Config) { c.ResponseHeaders = true })
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{desc(nil, "tenant", "acme")}}
	hdr := func(resp *rlsv3.RateLimitResponse) map[string]string {
		m := map[string]string{}
		for _, h := range resp.ResponseHeadersToAdd {
			m[h.Key] = h.Value
		}
		return m
	}
	var resp *rlsv3.RateLimitResponse
	var err error
	for range 4 {
		if resp, err = cl.ShouldRateLimit(context.Background(), req); err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode == rlsv3.RateLimitResponse_OK {
			h := hdr(resp)
			if !strings.HasPrefix(h["RateLimit-Policy"], `"domains[0].descriptors[0]";q=5;w=1`) || !strings.Contains(h["RateLimit"], ";r=") || h["Retry-After"] != "" {
				t.Errorf("allowed: headers %v", h)
			}
		}
	}
	h := hdr(resp)
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || h["Retry-After"] != "1" || !strings.HasSuffix(h["RateLimit"], ";r=0;t=1") {
		t.Errorf("over: %v headers %v, want Retry-After 1 and r=0;t=1", resp.OverallCode, h)
	}
}

func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatal(err)
		}
	}
	return resp.StatusCode
}

func TestReserveAndAdminViews(t *testing.T) {
	a, _, url := start(t)
	key := region.KeyName("api", []region.Entry{{Key: "tenant", Value: "acme"}})
	giveAll(t, a, key) // the table view below needs a table
	post := func(body string) (int, ReserveResponse) {
		resp, err := http.Post(url+"/v1/reserve", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out ReserveResponse
		if resp.StatusCode == 200 {
			_ = json.NewDecoder(resp.Body).Decode(&out)
		}
		return resp.StatusCode, out
	}
	one := `{"domain": "api", "descriptors": [{"entries": [{"key": "tenant", "value": "acme"}]}], "max_wait_ms": 500}`
	// 5/s burst 3: three at once, then slots 200 ms apart.
	for i := range 5 {
		code, out := post(one)
		if code != 200 || !out.Booked {
			t.Fatalf("reserve %d: %d %+v", i, code, out)
		}
		if i == 4 && (out.WaitMs < 300 || out.WaitMs > 400) {
			t.Errorf("fifth reservation waits %.1f ms, want about 400", out.WaitMs)
		}
	}
	if code, out := post(strings.Replace(one, "500", "50", 1)); code != 200 || out.Booked || out.RetryAfterMs <= 50 {
		t.Errorf("beyond max_wait: %d %+v, want refused with a retry-after", code, out)
	}
	two := `{"domain": "api", "descriptors": [{"entries": [{"key": "tenant", "value": "acme"}]}, {"entries": [{"key": "tenant", "value": "acme"}, {"key": "route", "value": "/search"}]}], "max_wait_ms": 10}`
	if code, _ := post(two); code != http.StatusUnprocessableEntity {
		t.Errorf("composite reserve: %d, want 422", code)
	}
	if code, _ := post(strings.Replace(one, "500", "-1", 1)); code != 400 {
		t.Errorf("negative max_wait: %d, want 400", code)
	}
	var tv TableView
	if code := getJSON(t, url+"/v1/table", &tv); code != 200 || !tv.HasTable || tv.Term != 1 || tv.Keys != 1 || tv.LeaseLeftMs <= 0 || tv.InForceEpoch != 1 {
		t.Errorf("table view: %d %+v", code, tv)
	}
	var kv KeyView
	if code := getJSON(t, url+"/v1/keys/"+key, &kv); code != 200 || kv.Share != 1 || kv.Remaining != 0 || kv.NextAdmissionMs <= 0 {
		t.Errorf("key view: %d %+v", code, kv)
	}
	if code := getJSON(t, url+"/v1/keys/api/colour=red", &kv); code != http.StatusNotFound {
		t.Errorf("key with no limit: %d, want 404", code)
	}
	if code := getJSON(t, url+"/v1/keys/api", &kv); code != http.StatusBadRequest {
		t.Errorf("malformed key: %d, want 400", code)
	}
}

// A descriptor's limit override applies in a known domain even where the
// policy has no limit, at the safe share (the coordinator does not know it).
// The node runs at a 10 % floor, as in a cluster before its first table: a
// standalone node's floor is the whole budget, where "at the safe share"
// and "at the whole override" look the same.
func TestRLSLimitOverride(t *testing.T) {
	node := regiontest.NodeWith(t, region.DefaultConfig("eu", "eu-1", "eu"), testPolicy, regiontest.RedisStore(t))
	_, cl, _ := startOn(t, node, nil)
	d := desc(nil, "colour", "red") // no policy limit
	d.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 100, Unit: typev3.RateLimitUnit_SECOND}
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{d}}
	ok := 0
	for i := range 30 {
		resp, err := cl.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode == rlsv3.RateLimitResponse_OK {
			ok++
		}
		if cl := resp.Statuses[0].CurrentLimit; cl.GetRequestsPerUnit() != 100 {
			t.Fatalf("current_limit %v, want the override's 100/s", cl)
		}
		// One region, safe share 10 %: 10/s with a burst of 10, so the
		// first call (the key starts full) leaves 9, however long the
		// calls take.
		if i == 0 && (resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 9) {
			t.Errorf("first call: %v remaining %d, want OK with 9 (burst 10 at the safe share)", resp.OverallCode, resp.Statuses[0].LimitRemaining)
		}
	}
	// The burst is always there; refill only adds (a slow machine's).
	if ok < 10 {
		t.Errorf("admitted %d under the override at the safe share, want at least the burst of 10", ok)
	}
	bad := desc(nil, "colour", "red")
	bad.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 0, Unit: typev3.RateLimitUnit_SECOND}
	if _, err := cl.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{bad}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("zero override: %v, want InvalidArgument", err)
	}
}
