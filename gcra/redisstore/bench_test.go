package redisstore_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/internal/loadgen"
	"github.com/meridian-quota/meridian/internal/testenv"
)

// Benchmark settings, shared with `meridian bench redis` defaults: every
// target decides the same limit over the same number of keys.
const (
	benchKeys  = 10_000
	benchRate  = 1000
	benchBurst = 100
)

// benchTargets builds every target on the shared Redis, each under its own
// prefix, deleted when the benchmark ends.
func benchTargets(b *testing.B, names ...string) []loadgen.Target {
	b.Helper()
	ctx := context.Background()
	c := testenv.Redis(b)
	lim := gcra.PerSecond(benchRate, benchBurst)
	var ts []loadgen.Target
	for _, name := range names {
		prefix := testenv.Prefix(b)
		var t loadgen.Target
		var err error
		switch name {
		case loadgen.NameMeridian:
			t, err = loadgen.MeridianTarget(ctx, c, prefix, lim)
		case loadgen.NameRedisRate:
			t, err = loadgen.RedisRateTarget(ctx, c, prefix, benchRate, benchBurst, time.Second)
		case loadgen.NameAutoPipeline:
			t, err = loadgen.AutoPipelineTarget(ctx, c, prefix, lim)
		case loadgen.NamePlain:
			t, err = loadgen.PlainTarget(ctx, c, prefix, lim)
		}
		if err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		b.Cleanup(t.Close)
		ts = append(ts, t)
	}
	return ts
}

// BenchmarkDecide compares the store with redis_rate and a plain
// single-key script through go-redis's AutoPipeline, at 1, 8 and 64
// closed-loop callers on one Redis. Each sub-benchmark starts exactly
// `callers` goroutines that together make b.N decisions over 10,000 keys
// (1000/s, burst 100 each) and reports decisions/s, p50 and p99 latency in
// µs and the fraction allowed. ns/op is wall time per decision (1/throughput).
func BenchmarkDecide(b *testing.B) {
	ts := benchTargets(b, loadgen.NameMeridian, loadgen.NameRedisRate, loadgen.NameAutoPipeline)
	for _, t := range ts {
		b.Run("target="+t.Name, func(b *testing.B) {
			for _, callers := range []int{1, 8, 64} {
				b.Run("callers="+strconv.Itoa(callers), func(b *testing.B) {
					benchDecide(b, t, callers)
				})
			}
		})
	}
}

func benchDecide(b *testing.B, t loadgen.Target, callers int) {
	ctx := context.Background()
	lat := make([][]time.Duration, callers)
	for i := range lat {
		lat[i] = make([]time.Duration, 0, b.N/callers+1)
	}
	var next, allowed atomic.Int64
	var firstErr error
	var errOnce sync.Once
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for w := range callers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(1, uint64(w)))
			for next.Add(1) <= int64(b.N) {
				k := r.IntN(benchKeys)
				t0 := time.Now()
				ok, err := t.Decide(ctx, k)
				d := time.Since(t0)
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
				if ok {
					allowed.Add(1)
				}
				lat[w] = append(lat[w], d)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(float64(loadgen.Percentile(all, 0.50))/float64(time.Microsecond), "p50-µs")
	b.ReportMetric(float64(loadgen.Percentile(all, 0.99))/float64(time.Microsecond), "p99-µs")
	b.ReportMetric(float64(allowed.Load())/float64(b.N), "allowed")
}

// BenchmarkDecideLone is one caller deciding in a plain loop, with no
// latency bookkeeping: the store's lone caller runs its script call inline
// (no batching wait, no hand-off), so it should cost about what one EVALSHA
// costs, plain or through the AutoPipeliner.
func BenchmarkDecideLone(b *testing.B) {
	ts := benchTargets(b, loadgen.NameMeridian, loadgen.NameAutoPipeline, loadgen.NamePlain)
	ctx := context.Background()
	for _, t := range ts {
		b.Run("target="+t.Name, func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 0))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := t.Decide(ctx, r.IntN(benchKeys)); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
		})
	}
}
