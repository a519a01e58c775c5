package main

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/meridian-quota/meridian/internal/loadgen"
	"github.com/meridian-quota/meridian/internal/testenv"
)

func TestBenchRedis(t *testing.T) {
	c := testenv.Redis(t) // fails in CI, skips elsewhere, when Redis is missing
	var stdout, stderr strings.Builder
	args := []string{"bench", "redis", "--addr", c.Options().Addr,
		"--duration", "300ms", "--warmup", "0s", "--callers", "1,4", "--keys", "100"}
	if code := run(context.Background(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	out := stdout.String()
	for _, target := range []string{"meridian", "redis_rate", "autopipeline"} {
		for _, callers := range []string{"1", "4"} {
			if !hasRow(out, target, callers) {
				t.Errorf("no row for %s at %s callers in:\n%s", target, callers, out)
			}
		}
	}
	for _, want := range []string{"callers   1: meridian/redis_rate = ", "callers   4: meridian/redis_rate = "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestBenchAgent drives two no-op RLS servers in turns: a row per server
// and caller count, and each server's ratio to the first.
func TestBenchAgent(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var addrs []string
	for range 2 {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { defer close(done); _ = loadgen.ServeNoopRLS(ctx, lis) }()
		t.Cleanup(func() { cancel(); <-done })
		addrs = append(addrs, lis.Addr().String())
	}
	var stdout, stderr strings.Builder
	args := []string{"bench", "agent", "--targets", "one=" + addrs[0] + ",two=" + addrs[1],
		"--duration", "200ms", "--rounds", "4", "--warmup", "0s", "--callers", "1,3", "--keys", "10"}
	if code := run(ctx, args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	out := stdout.String()
	for _, target := range []string{"one", "two"} {
		for _, callers := range []string{"1", "3"} {
			if !hasRow(out, target, callers) {
				t.Errorf("no row for %s at %s callers in:\n%s", target, callers, out)
			}
		}
	}
	for _, want := range []string{"callers   1: two/one = ", "callers   3: two/one = "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// hasRow reports whether out has a table row starting with target and
// callers and reporting no errors.
func hasRow(out, target, callers string) bool {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 8 && f[0] == target && f[1] == callers && f[7] == "0" {
			return true
		}
	}
	return false
}

func TestBenchUsage(t *testing.T) {
	tests := []struct {
		name       string
		give       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{name: "help", give: []string{"bench", "--help"}, wantCode: 0, wantStdout: "redis "},
		{name: "redis help", give: []string{"bench", "redis", "--help"}, wantCode: 0, wantStdout: "-callers"},
		{name: "nothing", give: []string{"bench"}, wantCode: 2, wantStderr: "redis"},
		{name: "unknown", give: []string{"bench", "disk"}, wantCode: 2, wantStderr: `unknown benchmark "disk"`},
		{name: "bad flags", give: []string{"bench", "redis", "--callers", "0", "--targets", "meridian,x"}, wantCode: 2, wantStderr: `unknown target "x"`},
		{name: "unreachable", give: []string{"bench", "redis", "--addr", "127.0.0.1:1"}, wantCode: 1, wantStderr: "not reachable"},
		{name: "no rounds", give: []string{"bench", "redis", "--rounds", "0"}, wantCode: 2, wantStderr: "--rounds 0: must be at least 1"},
		{name: "rounds too short", give: []string{"bench", "agent", "--targets", "a=127.0.0.1:1", "--duration", "3ns", "--rounds", "5"}, wantCode: 2, wantStderr: "every round must measure something"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr strings.Builder
			code := run(context.Background(), tt.give, &stdout, &stderr)
			if code != tt.wantCode || !strings.Contains(stdout.String(), tt.wantStdout) || !strings.Contains(stderr.String(), tt.wantStderr) {
				t.Errorf("run(%q) = %d, want %d\nstdout (want %q):\n%s\nstderr (want %q):\n%s",
					tt.give, code, tt.wantCode, tt.wantStdout, stdout.String(), tt.wantStderr, stderr.String())
			}
		})
	}
}
