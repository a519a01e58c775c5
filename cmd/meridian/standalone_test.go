package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/meridian-quota/meridian/internal/testenv"
)

// TestStandaloneAgentEnforcesTheWholeLimit is issue 15's must-hold 4 on the
// binary's own path: `meridian agent` from a file with no cluster section
// (and no regions line), on the shared Redis, asked over RLS v3. 1000/s
// burst 200 admits 200 back to back; the next is admitted or told to retry
// after at most 1 ms; current_limit and RateLimit-Policy name 1000 per
// second, the limit enforced. Remaining and retry-after come from the
// answers (computed on Redis's clock): a slow machine only refills tokens.
//
// Fails on 4804b9e: the file needed regions, and the agent ran the key at
// the safe share, 10 % of it (burst 20, T = 10 ms): the 21st request was
// over with about 10 ms to wait while current_limit said 1000 per second.
func TestStandaloneAgentEnforcesTheWholeLimit(t *testing.T) {
	rc := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	t.Cleanup(func() { testenv.Cleanup(t, rc, prefix) })
	grpcAddr, httpAddr := deadAddr(t), deadAddr(t) // free a moment ago; the agent binds them
	policy := "domains:\n  - domain: api\n    descriptors:\n      - key: tenant\n        rate_limit: {unit: second, requests_per_unit: 1000, burst: 200}\n"
	conf := fmt.Sprintf("region: eu\nagent: eu-1\npolicy: policy.yaml\ngrpc: %s\nhttp: %s\nresponse_headers: true\nredis: {addr: %s, prefix: %q, timeout: 1s}\n",
		grpcAddr, httpAddr, rc.Options().Addr, prefix)
	stderr := runAgentFiles(t, map[string]string{"policy.yaml": policy, "agent.yaml": conf})
	ctx := t.Context()
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cl := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{{
		Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: "acme"}}}}}
	// Wait for the agent to serve with a domain the policy does not know:
	// answered OK, nothing consumed.
	if !poll(10*time.Second, func() bool {
		c, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := cl.ShouldRateLimit(c, &rlsv3.RateLimitRequest{Domain: "unknown", Descriptors: req.Descriptors})
		return err == nil
	}) {
		t.Fatalf("the agent did not serve RLS within 10 s\nstderr:\n%s", stderr.String())
	}
	for i := range 201 {
		resp, err := cl.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		st := resp.Statuses[0]
		if cl := st.CurrentLimit; cl.GetRequestsPerUnit() != 1000 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND {
			t.Fatalf("request %d: current_limit %v, want 1000 per second", i+1, cl)
		}
		if i == 0 {
			if st.LimitRemaining != 199 {
				t.Errorf("request 1: limit_remaining %d, want 199 (a fresh key holds the whole burst of 200)", st.LimitRemaining)
			}
			var policy string
			for _, h := range resp.ResponseHeadersToAdd {
				if h.Key == "RateLimit-Policy" {
					policy = h.Value
				}
			}
			if !strings.HasSuffix(policy, ";q=1000;w=1") {
				t.Errorf("RateLimit-Policy %q, want q=1000 per w=1 s", policy)
			}
		}
		if i < 200 {
			if resp.OverallCode != rlsv3.RateLimitResponse_OK || st.LimitRemaining < uint32(199-i) {
				t.Fatalf("request %d: %v remaining %d, want OK with at least %d left", i+1, resp.OverallCode, st.LimitRemaining, 199-i)
			}
			continue
		}
		if resp.OverallCode == rlsv3.RateLimitResponse_OK {
			break // the machine was slow enough to refill a token
		}
		if d := st.DurationUntilReset.AsDuration(); d <= 0 || d > time.Millisecond {
			t.Errorf("request 201: over with retry after %v, want at most 1 ms (the global T)", d)
		}
	}
}

// TestStandaloneSeveralRegionsRefused: `meridian agent` refuses a file
// listing several regions without a cluster section, saying why.
//
// Fails on 4804b9e: it loaded and ran every key at 5 % of its budget.
func TestStandaloneSeveralRegionsRefused(t *testing.T) {
	dir := t.TempDir()
	conf := "region: eu\nagent: eu-1\nregions: [eu, us]\npolicy: policy.yaml\ngrpc: \"\"\nhttp: 127.0.0.1:0\n"
	policy := "domains:\n  - domain: api\n    descriptors:\n      - key: tenant\n        rate_limit: {unit: second, requests_per_unit: 10}\n"
	for name, text := range map[string]string{"policy.yaml": policy, "agent.yaml": conf} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var stdout, stderr testenv.Buffer
	// Refused at load: run returns at once. Should it serve instead, the
	// context ends it (exit 0), which fails below.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	code := run(ctx, []string{"agent", "--config", filepath.Join(dir, "agent.yaml")}, &stdout, &stderr)
	if want := `regions: ["eu" "us"]: 2 regions without a cluster section`; code != 1 || !strings.Contains(stderr.String(), want) {
		t.Errorf("exit %d, stderr:\n%s\nwant exit 1 and %q", code, stderr.String(), want)
	}
}
