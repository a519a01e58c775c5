package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/meridian-quota/meridian/internal/loadgen"
)

const benchAgentSynopsis = `
Drive RLS v3 servers with closed-loop callers, each server in turn at each
caller count: --targets is a comma-separated list of name=host:port. Each
request is ShouldRateLimit for --domain with one descriptor --key=k<N>, N
drawn from --keys. Prints decisions/s, p50, p99, max, the fraction allowed
and errors, and each target's throughput against the first one's.

  meridian bench noop-rls --listen 127.0.0.1:9081 &
  meridian bench agent --targets noop=127.0.0.1:9081,agent=127.0.0.1:8081`

func runBenchAgent(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	def := loadgen.DefaultConfig()
	fs := newFlags("bench agent", benchAgentSynopsis, stdout, stderr)
	targets := fs.String("targets", "", "name=host:port,... of RLS servers (required)")
	callers := fs.String("callers", "1,8,64", "comma-separated caller counts")
	duration := fs.Duration("duration", 5*time.Second, "measured time per target per caller count")
	warmup := fs.Duration("warmup", def.Warmup, "discarded time before each measurement")
	keys := fs.Int("keys", def.Keys, "distinct descriptor values")
	domain := fs.String("domain", "api", "RLS domain")
	key := fs.String("key", "tenant", "descriptor key")
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	counts, err := parseCallers(*callers)
	if err != nil || *targets == "" {
		fmt.Fprintf(stderr, "meridian bench agent: --targets name=host:port,... and --callers N,... are required (%v)\n", err)
		return errUsage
	}
	type tgt struct{ name, addr string }
	var ts []tgt
	for _, t := range strings.Split(*targets, ",") {
		name, addr, ok := strings.Cut(t, "=")
		if !ok || name == "" || addr == "" {
			fmt.Fprintf(stderr, "meridian bench agent: --targets: %q is not name=host:port\n", t)
			return errUsage
		}
		ts = append(ts, tgt{name, addr})
	}
	var reports []loadgen.Report
	for _, n := range counts {
		for _, t := range ts {
			target, err := loadgen.RLSTarget(t.name, t.addr, *domain, *key)
			if err != nil {
				return err
			}
			cfg := loadgen.Config{Callers: n, Duration: *duration, Keys: *keys, Seed: 1, Warmup: *warmup}
			rep, err := loadgen.Run(ctx, cfg, target)
			if target.Close != nil {
				target.Close()
			}
			if err != nil {
				return err
			}
			reports = append(reports, rep)
		}
	}
	if err := loadgen.FormatTable(stdout, reports); err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	for i := 0; i < len(reports); i += len(ts) {
		base := reports[i]
		for _, r := range reports[i+1 : i+len(ts)] {
			fmt.Fprintf(stdout, "callers %3d: %s/%s = %.2f×\n", base.Callers, r.Target, base.Target, r.PerSecond/base.PerSecond)
		}
	}
	return nil
}

func runNoopRLS(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench noop-rls", "Serve a no-op RLS v3 server (every request OK, no work) until interrupted.", stdout, stderr)
	listen := fs.String("listen", "127.0.0.1:9081", "address to serve on")
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, "no-op RLS server on", lis.Addr())
	return loadgen.ServeNoopRLS(ctx, lis)
}

// parseCallers reads a comma-separated list of caller counts.
func parseCallers(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("--callers %q: want comma-separated whole numbers ≥ 1", s)
		}
		out = append(out, n)
	}
	return out, nil
}
