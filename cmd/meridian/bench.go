package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/internal/loadgen"
)

const benchSynopsis = `
Usage: meridian bench <what> [flags]   (meridian bench <what> --help for its flags)

Benchmarks:
  redis     decisions/s and latency of the Redis store (meridian) beside
            github.com/go-redis/redis_rate/v10 and a plain single-key GCRA script
            run by EVALSHA through go-redis's AutoPipeline, in one run on one Redis
  agent     decisions/s and latency of RLS v3 servers (an agent, a no-op server,
            envoyproxy/ratelimit...) at several caller counts, closed loop
  noop-rls  serve a no-op RLS v3 server (answers OK without work) to compare with`

const benchRedisSynopsis = `
Compare Redis-backed GCRA limiters in one run, on the same Redis, limit, key
space and concurrency. For each caller count, each target runs in turn:
--callers closed-loop goroutines decide keys drawn uniformly from --keys
distinct keys (each target under its own key prefix, deleted afterwards).
The targets take turns in --rounds rounds of --duration/--rounds each (a
target's first round after --warmup, later ones after 200 ms), so drift on
a shared machine hits them alike. The table shows decisions/s, p50, p99 and
max latency over all rounds, the fraction allowed and the errors; then the
ratio of meridian's throughput to redis_rate's per caller count.

Targets:
  meridian      gcra/redisstore with its default config (batched Lua calls)
  redis_rate    github.com/go-redis/redis_rate/v10 Limiter.Allow
  autopipeline  a plain single-key GCRA script by EVALSHA through the client's AutoPipeliner`

// benchTargets are the targets of `bench redis`, in the order they run.
var benchTargets = []string{loadgen.NameMeridian, loadgen.NameRedisRate, loadgen.NameAutoPipeline}

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fs := newFlags("bench", benchSynopsis, stdout, stderr)
		fs.Usage = func() { fmt.Fprintln(fs.Output(), strings.TrimSpace(benchSynopsis)) }
		if err := parseFlags(fs, args, stdout); err != nil {
			return err
		}
		fmt.Fprintln(stderr, "meridian bench: say what to benchmark: redis, agent or noop-rls")
		return errUsage
	}
	switch args[0] {
	case "redis":
		return runBenchRedis(ctx, args[1:], stdout, stderr)
	case "agent":
		return runBenchAgent(ctx, args[1:], stdout, stderr)
	case "noop-rls":
		return runNoopRLS(ctx, args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "meridian bench: unknown benchmark %q (want redis, agent or noop-rls)\n", args[0])
	return errUsage
}

// benchRedisOpts are the parsed flags of `bench redis`.
type benchRedisOpts struct {
	addr     string
	callers  []int
	run      loadgen.Config // Callers set per run
	rounds   int
	limit    gcra.Limit
	targets  []string
	limitArg string
}

func runBenchRedis(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench redis", benchRedisSynopsis, stdout, stderr)
	def := loadgen.DefaultConfig()
	addr := fs.String("addr", "127.0.0.1:6379", "Redis address (host:port)")
	callers := fs.String("callers", "1,8,64", "comma-separated caller counts")
	duration := fs.Duration("duration", 5*time.Second, "measured time per target per caller count, over all rounds")
	rounds := fs.Int("rounds", 5, "turns the targets take at each caller count")
	warmup := fs.Duration("warmup", def.Warmup, "discarded time before each target's first round")
	keys := fs.Int("keys", def.Keys, "distinct keys per target")
	limitFlag := fs.String("limit", "1000/s", "rate per key as EVENTS/PERIOD (5/s, 100/m, 30/10s)")
	burst := fs.Int64("burst", 100, "GCRA burst per key (the same number for every target)")
	targets := fs.String("targets", strings.Join(benchTargets, ","), "comma-separated targets to run, in this order")
	seed := fs.Uint64("seed", def.Seed, "seed of the callers' key sequences")
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	o, err := benchRedisFlags(*addr, *callers, *limitFlag, *burst, *targets)
	if err != nil {
		fmt.Fprintf(stderr, "meridian bench redis: %v\n", err)
		return errUsage
	}
	o.run = loadgen.Config{Callers: 1, Duration: *duration, Keys: *keys, Seed: *seed, Warmup: *warmup}
	o.rounds = *rounds
	if err := checkRounds(o.run, o.rounds); err != nil {
		fmt.Fprintf(stderr, "meridian bench redis: %v\n", err)
		return errUsage
	}
	return benchRedis(ctx, o, stdout)
}

// benchRedisFlags checks and converts the flags that need parsing.
func benchRedisFlags(addr, callers, limitSpec string, burst int64, targets string) (benchRedisOpts, error) {
	o := benchRedisOpts{addr: addr, limitArg: limitSpec}
	var errs []error
	var err error
	if o.callers, err = parseCallers(callers); err != nil {
		errs = append(errs, err)
	}
	n, per, err := parseRate(limitSpec)
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("--limit %q: %w", limitSpec, err))
	case burst < 1:
		errs = append(errs, fmt.Errorf("--burst %d: must be at least 1", burst))
	case n > 1<<31-1 || burst > 1<<31-1:
		errs = append(errs, fmt.Errorf("--limit %q --burst %d: too large for redis_rate", limitSpec, burst))
	default:
		o.limit = gcra.New(n, per, burst)
		if err := o.limit.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("--limit %q --burst %d: %w", limitSpec, burst, err))
		}
	}
	for _, s := range strings.Split(targets, ",") {
		s = strings.TrimSpace(s)
		switch {
		case !slices.Contains(benchTargets, s):
			errs = append(errs, fmt.Errorf("--targets: unknown target %q (want %s)", s, strings.Join(benchTargets, ", ")))
		case slices.Contains(o.targets, s):
			errs = append(errs, fmt.Errorf("--targets: %q listed twice", s))
		default:
			o.targets = append(o.targets, s)
		}
	}
	return o, errors.Join(errs...)
}

// pingTimeout bounds the check that Redis answers before the benchmark.
const pingTimeout = 3 * time.Second

func benchRedis(ctx context.Context, o benchRedisOpts, stdout io.Writer) error {
	if err := probeRedis(ctx, o.addr); err != nil {
		return err
	}
	c := redis.NewClient(&redis.Options{Addr: o.addr}) // defaults: what an application would use
	defer c.Close()

	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return err
	}
	run := "mbench:" + hex.EncodeToString(b[:]) + ":"
	ts := make([]loadgen.Target, 0, len(o.targets))
	defer func() {
		for _, t := range ts {
			t.Close()
		}
	}()
	events, period := o.limit.Rate()
	for _, name := range o.targets {
		prefix := run + name + ":"
		var t loadgen.Target
		var err error
		switch name {
		case loadgen.NameMeridian:
			t, err = loadgen.MeridianTarget(ctx, c, prefix, o.limit)
		case loadgen.NameRedisRate:
			t, err = loadgen.RedisRateTarget(ctx, c, prefix, int(events), int(o.limit.Burst()), period)
		case loadgen.NameAutoPipeline:
			t, err = loadgen.AutoPipelineTarget(ctx, c, prefix, o.limit)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		ts = append(ts, t)
	}

	fmt.Fprintf(stdout, "Redis %s; limit %s per key; %d keys per target; %s measured in %d rounds after %s warm-up; seed %d; GOMAXPROCS %d\n\n",
		o.addr, o.limit, o.run.Keys, o.run.Duration, o.rounds, o.run.Warmup, o.run.Seed, runtime.GOMAXPROCS(0))
	var reports []loadgen.Report
	var runErr error
	for _, n := range o.callers {
		cfg := o.run
		cfg.Callers = n
		rs, err := loadgen.Interleave(ctx, cfg, o.rounds, ts)
		reports = append(reports, rs...)
		if err != nil {
			runErr = fmt.Errorf("at %d callers: %w", n, err)
			break
		}
	}
	if err := loadgen.FormatTable(stdout, reports); err != nil {
		return err
	}
	if runErr != nil {
		return runErr
	}
	printRatios(stdout, reports)
	return nil
}

// probeRedis checks once, without retries, that Redis answers PING.
func probeRedis(ctx context.Context, addr string) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("Redis at %s is not reachable: %w", addr, err)
	}
	return nil
}

// printRatios prints meridian's throughput over redis_rate's for every
// caller count that ran both.
func printRatios(w io.Writer, reports []loadgen.Report) {
	type pair struct{ meridian, redisRate float64 }
	var order []int
	by := map[int]*pair{}
	for _, r := range reports {
		p := by[r.Callers]
		if p == nil {
			p = &pair{}
			by[r.Callers] = p
			order = append(order, r.Callers)
		}
		switch r.Target {
		case loadgen.NameMeridian:
			p.meridian = r.PerSecond
		case loadgen.NameRedisRate:
			p.redisRate = r.PerSecond
		}
	}
	first := true
	for _, n := range order {
		p := by[n]
		if p.meridian == 0 || p.redisRate == 0 {
			continue
		}
		if first {
			fmt.Fprintln(w)
			first = false
		}
		fmt.Fprintf(w, "callers %3d: meridian/redis_rate = %.2f×\n", n, p.meridian/p.redisRate)
	}
}
