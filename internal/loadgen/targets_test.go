package loadgen

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/internal/rediskeys"
	"github.com/meridian-quota/meridian/internal/testenv"
)

// TestTargets decides one key 300 times in a row through every target under
// 10/s with burst 100: the first 100 calls are admitted, and at most a few
// dozen more (one per 100 ms of the test), so every target enforces the same
// limit. Close leaves none of the target's keys behind.
func TestTargets(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	lim := gcra.PerSecond(10, 100)
	tests := []struct {
		name     string
		build    func(prefix string) (Target, error)
		keyspace string // prefix of the target's Redis keys, given its prefix
	}{
		{name: NameMeridian, build: func(p string) (Target, error) { return MeridianTarget(ctx, c, p, lim) }},
		{name: NameRedisRate, build: func(p string) (Target, error) { return RedisRateTarget(ctx, c, p, 10, 100, time.Second) }, keyspace: "rate:"},
		{name: NameAutoPipeline, build: func(p string) (Target, error) { return AutoPipelineTarget(ctx, c, p, lim) }},
		{name: NamePlain, build: func(p string) (Target, error) { return PlainTarget(ctx, c, p, lim) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := testenv.Prefix(t)
			testenv.Cleanup(t, c, tt.keyspace+prefix)
			tg, err := tt.build(prefix)
			if err != nil {
				t.Fatal(err)
			}
			if tg.Name != tt.name {
				t.Errorf("Name = %q, want %q", tg.Name, tt.name)
			}
			start := time.Now()
			allowed := 0
			for i := range 300 {
				ok, err := tg.Decide(ctx, 7)
				if err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
				if i < 100 && !ok {
					t.Fatalf("call %d denied within the burst", i)
				}
				if ok {
					allowed++
				}
			}
			refills := int(time.Since(start)/(100*time.Millisecond)) + 1
			if allowed > 100+refills {
				t.Errorf("%d of 300 allowed, want at most 100 + %d refills", allowed, refills)
			}
			if n := countKeys(ctx, t, c, tt.keyspace+prefix); n != 1 {
				t.Errorf("%d keys under the prefix, want 1", n)
			}
			tg.Close()
			if n := countKeys(ctx, t, c, tt.keyspace+prefix); n != 0 {
				t.Errorf("%d keys left after Close", n)
			}
		})
	}
}

func countKeys(ctx context.Context, t *testing.T, c *redis.Client, prefix string) int {
	t.Helper()
	keys, err := c.Keys(ctx, rediskeys.GlobEscape(prefix)+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return len(keys)
}

func TestTargetsRefuseEmptyPrefix(t *testing.T) {
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer c.Close()
	lim := gcra.PerSecond(10, 10)
	if _, err := MeridianTarget(ctx, c, "", lim); err == nil {
		t.Error("MeridianTarget accepted an empty prefix")
	}
	if _, err := RedisRateTarget(ctx, c, "", 10, 10, time.Second); err == nil {
		t.Error("RedisRateTarget accepted an empty prefix")
	}
	if _, err := PlainTarget(ctx, c, "", lim); err == nil {
		t.Error("PlainTarget accepted an empty prefix")
	}
}
