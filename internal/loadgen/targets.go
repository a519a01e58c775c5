package loadgen

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/meridian-quota/meridian/internal/rediskeys"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gcra/redisstore"
)

// Target names, as they appear in reports.
const (
	NameMeridian     = "meridian"
	NameRedisRate    = "redis_rate"
	NameAutoPipeline = "autopipeline"
	NamePlain        = "plain"
)

// closeTimeout bounds the key deletion done by a target's Close.
const closeTimeout = 30 * time.Second

// MeridianTarget decides through a redisstore.Store on c (DefaultConfig with
// the given prefix), key k being gcra.Key{Tag: strconv.Itoa(k), Name: "b"}
// under the steady limit lim at cost 1. It loads the store's script first,
// so an unreachable Redis fails here.
func MeridianTarget(ctx context.Context, c redis.UniversalClient, prefix string, lim gcra.Limit) (Target, error) {
	if err := checkPrefix(prefix); err != nil {
		return Target{}, err
	}
	if err := lim.Validate(); err != nil {
		return Target{}, err
	}
	cfg := redisstore.DefaultConfig()
	cfg.Prefix = prefix
	s, err := redisstore.New(c, cfg)
	if err != nil {
		return Target{}, err
	}
	if err := s.Load(ctx); err != nil {
		return Target{}, fmt.Errorf("loadgen: load meridian script: %w", err)
	}
	sch := gcra.Steady(lim)
	return Target{
		Name: NameMeridian,
		Decide: func(ctx context.Context, k int) (bool, error) {
			r, err := s.Decide(ctx, gcra.Key{Tag: strconv.Itoa(k), Name: "b"}, sch, 1)
			return r.Allowed, err
		},
		Close: func() { deleteKeys(c, prefix) },
	}, nil
}

// RedisRateTarget decides through github.com/go-redis/redis_rate/v10:
// Limiter.Allow with redis_rate.Limit{Rate: rate, Burst: burst, Period:
// period}, key k being prefix+strconv.Itoa(k) (redis_rate adds its own
// "rate:" in front). redis_rate's Burst is the GCRA burst, so pass the same
// number as the other targets' limit. It pings c first.
func RedisRateTarget(ctx context.Context, c *redis.Client, prefix string, rate, burst int, period time.Duration) (Target, error) {
	if err := checkPrefix(prefix); err != nil {
		return Target{}, err
	}
	if rate < 1 || burst < 1 || period <= 0 {
		return Target{}, fmt.Errorf("loadgen: redis_rate limit %d/%s burst %d: rate, burst and period must be positive", rate, period, burst)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		return Target{}, fmt.Errorf("loadgen: ping: %w", err)
	}
	l := redis_rate.NewLimiter(c)
	lim := redis_rate.Limit{Rate: rate, Burst: burst, Period: period}
	return Target{
		Name: NameRedisRate,
		Decide: func(ctx context.Context, k int) (bool, error) {
			r, err := l.Allow(ctx, prefix+strconv.Itoa(k), lim)
			if err != nil {
				return false, err
			}
			return r.Allowed > 0, nil
		},
		Close: func() { deleteKeys(c, "rate:"+prefix) },
	}, nil
}

// AutoPipelineTarget runs a plain single-key GCRA script (server TIME, one
// GET, one SET PX; no epochs, no batching of its own) by EVALSHA through
// c's blocking AutoPipeliner, which coalesces concurrent callers' commands
// into pipelines. Key k is prefix+strconv.Itoa(k), decided under lim at cost
// 1. The script is loaded first (SCRIPT LOAD); a NOSCRIPT later falls back
// to EVAL. Close does not close the AutoPipeliner, which c owns and shares.
func AutoPipelineTarget(ctx context.Context, c *redis.Client, prefix string, lim gcra.Limit) (Target, error) {
	ap, err := c.AutoPipeline()
	if err != nil {
		return Target{}, fmt.Errorf("loadgen: autopipeline: %w", err)
	}
	return scriptTarget(ctx, NameAutoPipeline, ap, c, prefix, lim)
}

// PlainTarget runs the same single-key script as AutoPipelineTarget by
// EVALSHA on c itself: one round trip per decision, no pipelining.
func PlainTarget(ctx context.Context, c *redis.Client, prefix string, lim gcra.Limit) (Target, error) {
	return scriptTarget(ctx, NamePlain, c, c, prefix, lim)
}

// singleKeyGCRA is GCRA on one key: ARGV[1] is T in µs, ARGV[2] the burst;
// cost 1. It replies {allowed (0|1), remaining}. TATs are µs since the
// epoch, below 2^53, so Lua doubles and SET's %.17g formatting are exact.
var singleKeyGCRA = redis.NewScript(`
local T = tonumber(ARGV[1])
local B = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or 0) or 0
if tat < now then tat = now end
local nxt = tat + T
if nxt - B * T > now then
  local slack = B * T - (tat - now)
  if slack < 0 then slack = 0 end
  return {0, math.floor(slack / T)}
end
redis.call('SET', KEYS[1], nxt, 'PX', math.ceil((nxt - now) / 1000))
return {1, math.floor((B * T - (nxt - now)) / T)}
`)

var _ redis.Scripter = (*redis.AutoPipeliner)(nil)

func scriptTarget(ctx context.Context, name string, sc redis.Scripter, c *redis.Client, prefix string, lim gcra.Limit) (Target, error) {
	if err := checkPrefix(prefix); err != nil {
		return Target{}, err
	}
	if err := lim.Validate(); err != nil {
		return Target{}, err
	}
	if lim.IsZero() {
		return Target{}, errors.New("loadgen: the zero limit denies everything; give a real limit")
	}
	if err := singleKeyGCRA.Load(ctx, c).Err(); err != nil {
		return Target{}, fmt.Errorf("loadgen: script load: %w", err)
	}
	t, b := lim.IntervalMicros(), lim.Burst()
	return Target{
		Name: name,
		Decide: func(ctx context.Context, k int) (bool, error) {
			reply, err := singleKeyGCRA.Run(ctx, sc, []string{prefix + strconv.Itoa(k)}, t, b).Result()
			if err != nil {
				return false, fmt.Errorf("evalsha gcra: %w", err)
			}
			arr, ok := reply.([]any)
			if !ok || len(arr) != 2 {
				return false, fmt.Errorf("evalsha gcra: reply %v, want [allowed remaining]", reply)
			}
			allowed, ok := arr[0].(int64)
			if !ok || (allowed != 0 && allowed != 1) {
				return false, fmt.Errorf("evalsha gcra: allowed %v, want 0 or 1", arr[0])
			}
			return allowed == 1, nil
		},
		Close: func() { deleteKeys(c, prefix) },
	}, nil
}

// checkPrefix refuses a prefix that would let Close delete keys that are
// not the target's.
func checkPrefix(prefix string) error {
	if prefix == "" {
		return errors.New("loadgen: empty key prefix (Close would delete every key)")
	}
	return nil
}

// deleteKeys unlinks every key starting with prefix; best effort (the keys
// expire on their own once rested).
func deleteKeys(c redis.UniversalClient, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	_ = rediskeys.DeletePrefix(ctx, c, prefix)
}
