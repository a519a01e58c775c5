package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"

	"github.com/meridian-quota/meridian/internal/loadgen"
	"github.com/meridian-quota/meridian/region/agent"
)

const benchAgentSynopsis = `
Drive RLS v3 servers with closed-loop callers at each caller count:
--targets is a comma-separated list of name=host:port. Each request is
ShouldRateLimit for --domain with one descriptor --key=k<N>, N drawn from
--keys. The servers take turns in --rounds rounds of --duration/--rounds
each (a server's first round after --warmup, later ones after 200 ms), so
drift on a shared machine hits them alike. Prints decisions/s, p50, p99, max
over all rounds, the fraction allowed and errors, and each target's
throughput against the first one's. The default target is an agent on its
config's default grpc address. An agent with auth takes the bearer token
from --token or --token-file (sent to every target).

--metrics name=host:port,... names the HTTP address of each Meridian target:
its /metrics is read before and after each caller count, and the decisions
it answered from a failure mode (fallback) or its deny cache are printed. A
target that answered any from a fallback did not measure its store path:
its rows are marked INVALID and the command exits 1.

  meridian bench noop-rls --listen 127.0.0.1:9081 &
  meridian bench agent --targets noop=127.0.0.1:9081,agent=127.0.0.1:8081 --metrics agent=127.0.0.1:8080 --token-file tokens.txt`

func runBenchAgent(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	def := loadgen.DefaultConfig()
	fs := newFlags("bench agent", benchAgentSynopsis, stdout, stderr)
	targets := fs.String("targets", "agent="+agent.DefaultConfig().GRPC, "name=host:port,... of RLS servers")
	token := fs.String("token", "", "bearer token sent as \"authorization: Bearer <token>\" (visible in ps: prefer --token-file)")
	tokenFile := fs.String("token-file", "", "file whose first line that is neither empty nor a # comment is the bearer token (an agent's auth.tokens_file works)")
	callers := fs.String("callers", "1,8,64", "comma-separated caller counts")
	duration := fs.Duration("duration", 5*time.Second, "measured time per target per caller count, over all rounds")
	rounds := fs.Int("rounds", 5, "turns the targets take at each caller count")
	warmup := fs.Duration("warmup", def.Warmup, "discarded time before each target's first round")
	keys := fs.Int("keys", def.Keys, "distinct descriptor values")
	domain := fs.String("domain", "api", "RLS domain")
	key := fs.String("key", "tenant", "descriptor key")
	metricsFlag := fs.String("metrics", "", "name=host:port,... the HTTP address of each Meridian target, whose /metrics says what it answered from a fallback or its deny cache")
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	counts, err := parseCallers(*callers)
	switch {
	case err != nil:
		fmt.Fprintf(stderr, "meridian bench agent: --callers %q: %v; give caller counts like 1,8,64\n", *callers, err)
		return errUsage
	case *targets == "":
		fmt.Fprintln(stderr, "meridian bench agent: --targets is empty; give name=host:port,... of the RLS servers to drive")
		return errUsage
	}
	var dial []grpc.DialOption
	switch tok, err := benchToken(*token, *tokenFile); {
	case err != nil:
		fmt.Fprintf(stderr, "meridian bench agent: %v\n", err)
		return errUsage
	case tok != "":
		dial = append(dial, grpc.WithPerRPCCredentials(bearer(tok)))
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
	metricsAddr := map[string]string{}
	if *metricsFlag != "" {
		for _, m := range strings.Split(*metricsFlag, ",") {
			name, addr, ok := strings.Cut(m, "=")
			if !ok || name == "" || addr == "" || !slices.ContainsFunc(ts, func(t tgt) bool { return t.name == name }) {
				fmt.Fprintf(stderr, "meridian bench agent: --metrics: %q is not name=host:port of a target in --targets\n", m)
				return errUsage
			}
			metricsAddr[name] = addr
		}
	}
	run := loadgen.Config{Callers: 1, Duration: *duration, Keys: *keys, Seed: 1, Warmup: *warmup}
	if err := checkRounds(run, *rounds); err != nil {
		fmt.Fprintf(stderr, "meridian bench agent: %v\n", err)
		return errUsage
	}
	var reports []loadgen.Report
	var answers []answered
	for _, n := range counts {
		targets := make([]loadgen.Target, 0, len(ts))
		closeAll := func() {
			for _, t := range targets {
				if t.Close != nil {
					t.Close()
				}
			}
		}
		for _, t := range ts {
			target, err := loadgen.RLSTarget(t.name, t.addr, *domain, *key, dial...)
			if err != nil {
				closeAll()
				return err
			}
			targets = append(targets, target)
		}
		cfg := run
		cfg.Callers = n
		before, err := scrapeAll(ctx, metricsAddr)
		if err != nil {
			closeAll()
			return err
		}
		rs, err := loadgen.Interleave(ctx, cfg, *rounds, targets)
		closeAll()
		if err != nil {
			return fmt.Errorf("at %d callers: %w", n, err)
		}
		after, err := scrapeAll(ctx, metricsAddr)
		if err != nil {
			return err
		}
		for i := range rs {
			if b, ok := before[rs[i].Target]; ok {
				answers = append(answers, answered{callers: n, target: rs[i].Target, counts: after[rs[i].Target].minus(b)})
			}
		}
		reports = append(reports, rs...)
	}
	if err := loadgen.FormatTable(stdout, reports); err != nil {
		return err
	}
	invalid := 0
	if len(answers) > 0 {
		fmt.Fprintln(stdout)
	}
	for _, a := range answers {
		c := a.counts
		fb := c.fallback()
		fmt.Fprintf(stdout, "callers %3d: %s answered %.0f decisions: %.0f from a fallback (open %.0f, closed %.0f, local %.0f, error %.0f), %.0f from its deny cache",
			a.callers, a.target, c.decisions, fb, c.open, c.closed, c.local, c.err, c.denyCache)
		if fb > 0 {
			invalid++
			fmt.Fprint(stdout, " — INVALID: not its store path")
		}
		fmt.Fprintln(stdout)
	}
	fmt.Fprintln(stdout)
	for i := 0; i < len(reports); i += len(ts) {
		base := reports[i]
		for _, r := range reports[i+1 : i+len(ts)] {
			fmt.Fprintf(stdout, "callers %3d: %s/%s = %.2f×\n", base.Callers, r.Target, base.Target, r.PerSecond/base.PerSecond)
		}
	}
	if invalid > 0 {
		return fmt.Errorf("bench agent: %d of the measured rows answered from a fallback (marked INVALID above): the store path was not measured", invalid)
	}
	return nil
}

// answered is what one Meridian target's /metrics counted over one caller
// count's rounds.
type answered struct {
	callers int
	target  string
	counts  answerCounts
}

// answerCounts are a Meridian agent's decision counters.
type answerCounts struct {
	decisions, open, closed, local, err, denyCache float64
}

func (a answerCounts) fallback() float64 { return a.open + a.closed + a.local + a.err }

func (a answerCounts) minus(b answerCounts) answerCounts {
	return answerCounts{a.decisions - b.decisions, a.open - b.open, a.closed - b.closed, a.local - b.local, a.err - b.err, a.denyCache - b.denyCache}
}

// scrapeAll reads every named target's counters (name → host:port).
func scrapeAll(ctx context.Context, addrs map[string]string) (map[string]answerCounts, error) {
	out := make(map[string]answerCounts, len(addrs))
	for name, addr := range addrs {
		c, err := scrapeAnswers(ctx, addr)
		if err != nil {
			return nil, fmt.Errorf("bench agent: --metrics %s=%s: %w", name, addr, err)
		}
		out[name] = c
	}
	return out, nil
}

// scrapeAnswers reads a Meridian agent's decision, fallback and deny-cache
// counters from http://addr/metrics, each summed over its labels.
func scrapeAnswers(ctx context.Context, addr string) (answerCounts, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return answerCounts{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answerCounts{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return answerCounts{}, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return answerCounts{}, fmt.Errorf("GET /metrics: %w", err)
	}
	sum := func(name string) float64 {
		v := 0.0
		if f := fams[name]; f != nil {
			for _, m := range f.GetMetric() {
				v += m.GetCounter().GetValue()
			}
		}
		return v
	}
	if fams["meridian_decisions_total"] == nil {
		return answerCounts{}, errors.New("no meridian_decisions_total: not a Meridian agent's /metrics")
	}
	return answerCounts{decisions: sum("meridian_decisions_total"), open: sum("meridian_fallback_open_total"),
		closed: sum("meridian_fallback_closed_total"), local: sum("meridian_fallback_local_total"),
		err: sum("meridian_fallback_error_total"), denyCache: sum("meridian_deny_cache_hits_total")}, nil
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

// checkRounds checks a run's flags and --rounds together: every round must
// measure something.
func checkRounds(run loadgen.Config, rounds int) error {
	if rounds < 1 {
		return fmt.Errorf("--rounds %d: must be at least 1", rounds)
	}
	if err := run.Validate(); err != nil {
		return err
	}
	if run.Duration/time.Duration(rounds) <= 0 {
		return fmt.Errorf("--duration %s --rounds %d: every round must measure something", run.Duration, rounds)
	}
	return nil
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

// benchToken is the bearer token of --token or --token-file (not both):
// the file's first line that is neither empty nor a # comment, as the
// agent reads its tokens_file. "" without either.
func benchToken(token, file string) (string, error) {
	switch {
	case token != "" && file != "":
		return "", fmt.Errorf("--token and --token-file: give one")
	case token != "":
		return strings.TrimSpace(token), nil
	case file == "":
		return "", nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("--token-file: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			return line, nil
		}
	}
	return "", fmt.Errorf("--token-file %s: no token in it", file)
}

// bearer sends "authorization: Bearer <token>" with every RPC, over
// plaintext too (the benchmark's connections are).
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }
