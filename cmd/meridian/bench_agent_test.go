package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/meridian-quota/meridian/internal/testenv"
	"github.com/meridian-quota/meridian/region/agent"
)

// tokenRLS answers OK to RPCs carrying "authorization: Bearer <token>" and
// Unauthenticated to the others, counting each.
type tokenRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	token       string
	ok, refused atomic.Int64
}

func (s *tokenRLS) ShouldRateLimit(ctx context.Context, in *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if v := metadata.ValueFromIncomingContext(ctx, "authorization"); len(v) != 1 || v[0] != "Bearer "+s.token {
		s.refused.Add(1)
		return nil, status.Error(codes.Unauthenticated, "missing or invalid bearer token")
	}
	s.ok.Add(1)
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

// TestBenchAgentToken: bench agent sends the token of --token or
// --token-file with every call.
func TestBenchAgentToken(t *testing.T) {
	const token = "bench-token-0123456789"
	srv := &tokenRLS{token: token}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(gs, srv)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	file := filepath.Join(t.TempDir(), "tokens.txt")
	if err := os.WriteFile(file, []byte("# the bench's token\n\n"+token+"\nanother-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"bench", "agent", "--targets", "a=" + lis.Addr().String(), "--duration", "40ms", "--rounds", "1", "--warmup", "0s", "--callers", "1", "--keys", "3"}
	for _, flags := range [][]string{{"--token", token}, {"--token-file", file}} {
		before := srv.ok.Load()
		var stdout, stderr strings.Builder
		if code := run(context.Background(), append(append([]string{}, base...), flags...), &stdout, &stderr); code != 0 {
			t.Fatalf("%s: exit %d\nstdout:\n%s\nstderr:\n%s", flags[0], code, stdout.String(), stderr.String())
		}
		if !hasRow(stdout.String(), "a", "1") || srv.ok.Load() == before {
			t.Errorf("%s: no call authenticated (refused %d):\n%s", flags[0], srv.refused.Load(), stdout.String())
		}
	}
	if srv.refused.Load() != 0 {
		t.Errorf("%d calls refused", srv.refused.Load())
	}
	for _, tt := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--token", token, "--token-file", file}, "--token and --token-file: give one"},
		{[]string{"--token-file", filepath.Join(t.TempDir(), "none")}, "--token-file: open"},
	} {
		var stdout, stderr strings.Builder
		if code := run(context.Background(), append(append([]string{}, base...), tt.flags...), &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), tt.want) {
			t.Errorf("%q: exit %d, stderr %q, want 2 and %q", tt.flags, code, stderr.String(), tt.want)
		}
	}
}

// TestBenchAgentDefaultTarget: with no --targets the benchmark drives an
// agent on its config's default gRPC address.
func TestBenchAgentDefaultTarget(t *testing.T) {
	var stdout, stderr strings.Builder
	if code := run(context.Background(), []string{"bench", "agent", "--help"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	want := `"agent=` + agent.DefaultConfig().GRPC + `"`
	if !strings.Contains(stdout.String(), want) {
		t.Errorf("--targets default is not %s:\n%s", want, stdout.String())
	}
}

// TestBenchAgentMarksFallbackRuns is issue 19's honest agent benchmark: a
// run in which an agent answered from a failure mode measured the
// fallback, not its store path. bench agent reads the agent's /metrics
// around each caller count, prints what it answered from a fallback and
// its deny cache, and marks such a run INVALID (exit 1). Fails on acfb61d,
// whose bench agent printed the fallback's decisions/s as the agent's.
func TestBenchAgentMarksFallbackRuns(t *testing.T) {
	free := func() string {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer lis.Close()
		return lis.Addr().String()
	}
	policy := "domains:\n  - domain: api\n    descriptors:\n      - key: tenant\n        rate_limit: {unit: second, requests_per_unit: 1000000, burst: 1000000, failure_mode: local}\n"
	start := func(redisAddr string) (grpcAddr, httpAddr string) {
		grpcAddr, httpAddr = free(), free()
		// A Redis timeout no call of a working Redis outlives, however
		// loaded the machine: with the 5 ms default, CI under -race with
		// another job beside it saw 5 calls time out and the working
		// Redis's run marked INVALID. A dead one refuses at once.
		conf := fmt.Sprintf("region: eu\nagent: eu-1\nregions: [eu]\npolicy: policy.yaml\ngrpc: %s\nhttp: %s\nredis: {addr: %q, timeout: 5s}\n", grpcAddr, httpAddr, redisAddr)
		runAgentFiles(t, map[string]string{"policy.yaml": policy, "agent.yaml": conf})
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if resp, err := http.Get("http://" + httpAddr + "/healthz"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return grpcAddr, httpAddr
				}
			}
			if time.Now().After(deadline) {
				t.Fatal("agent not healthy within 10 s")
			}
		}
	}
	bench := func(grpcAddr, httpAddr string) (int, string) {
		var stdout, stderr strings.Builder
		code := run(context.Background(), []string{"bench", "agent", "--targets", "agent=" + grpcAddr, "--metrics", "agent=" + httpAddr,
			"--duration", "100ms", "--rounds", "1", "--warmup", "0s", "--callers", "1,2", "--keys", "3"}, &stdout, &stderr)
		return code, stdout.String() + stderr.String()
	}
	// Redis down: every decision comes from failure_mode local.
	dead := free()
	code, out := bench(start(dead))
	if code != 1 || strings.Count(out, "— INVALID") != 2 || !strings.Contains(out, "answered from a fallback") {
		t.Fatalf("Redis down: exit %d, want 1 with both caller counts INVALID:\n%s", code, out)
	}
	// A working Redis: the store path, nothing from a fallback.
	srv := testenv.StartRedis(t)
	code, out = bench(start(srv.Addr))
	if code != 0 || strings.Contains(out, "INVALID") || !strings.Contains(out, ": 0 from a fallback (open 0, closed 0, local 0, error 0)") {
		t.Fatalf("Redis up: exit %d, want 0 and no fallback answers:\n%s", code, out)
	}
	// --metrics must name a target.
	var stdout, stderr strings.Builder
	if code := run(context.Background(), []string{"bench", "agent", "--targets", "a=127.0.0.1:1", "--metrics", "b=127.0.0.1:2"}, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "is not name=host:port of a target") {
		t.Errorf("--metrics of no target: exit %d, stderr %q", code, stderr.String())
	}
}
