package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

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
