package agent

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gcra/redisstore"
	"github.com/meridian-quota/meridian/internal/testenv"
	"github.com/meridian-quota/meridian/region"
)

// envoyPolicy is a policy as envoyproxy/ratelimit users write it: no
// hash_tag, and a request matching two limits (tenant, tenant and route);
// beside it a domain whose limit fails closed.
const envoyPolicy = `
domains:
  - domain: api
    descriptors:
      - key: tenant
        rate_limit: {unit: hour, requests_per_unit: 100, burst: 10}
        descriptors:
          - key: route
            rate_limit: {unit: hour, requests_per_unit: 10, burst: 2}
  - domain: strict
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 100, burst: 10, failure_mode: closed}
`

// redisStoreOn is a store on c under a prefix unique to the test.
func redisStoreOn(t *testing.T, c redis.UniversalClient) *redisstore.Store {
	t.Helper()
	cfg := redisstore.DefaultConfig()
	cfg.Prefix = testenv.Prefix(t)
	testenv.Cleanup(t, c, cfg.Prefix)
	s, err := redisstore.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestUntaggedCompositesOnOneRedis: on a single Redis, a request matching
// two limits of a domain without hash_tag is decided by Redis, all or
// nothing, and leaves the breaker — shared by every domain of the agent —
// closed.
//
// fails on 2023668: each composite failed in the store as cross-slot and
// fell to its failure mode; after five the breaker opened, and a fresh key
// of the closed domain was denied.
func TestUntaggedCompositesOnOneRedis(t *testing.T) {
	br, err := NewBreaker(BreakerConfig{Failures: 5, Cooldown: Duration(time.Hour)}, redisStoreOn(t, testenv.Redis(t)))
	if err != nil {
		t.Fatal(err)
	}
	pol, err := region.ParsePolicy([]byte(envoyPolicy))
	if err != nil {
		t.Fatal(err)
	}
	node, err := region.NewNode(region.DefaultConfig("eu", "eu-1", "eu"), pol, br)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	both := &region.Request{Domain: "api", Cost: 1, Descriptors: []region.Descriptor{
		{Entries: []region.Entry{{Key: "tenant", Value: "acme"}}},
		{Entries: []region.Entry{{Key: "tenant", Value: "acme"}, {Key: "route", Value: "/search"}}},
	}}
	var d region.Decision
	fallbacks := 0
	for range 6 {
		if err := node.Decide(ctx, time.Now().UnixMicro(), both, &d); err != nil {
			t.Fatal(err)
		}
		if d.Fallback {
			fallbacks++
		}
	}
	if s := node.Stats(); fallbacks > 0 || s.StoreErrors > 0 {
		t.Errorf("%d of 6 composites fell to their failure mode (%d store errors): the store did not decide them", fallbacks, s.StoreErrors)
	}
	if br.Open() {
		t.Error("the breaker opened")
	}
	fresh := &region.Request{Domain: "strict", Cost: 1, Descriptors: []region.Descriptor{{Entries: []region.Entry{{Key: "user", Value: "new"}}}}}
	if err := node.Decide(ctx, time.Now().UnixMicro(), fresh, &d); err != nil || !d.Allowed || d.Fallback {
		t.Errorf("fresh key of the closed domain: allowed %v fallback %v err %v, want admitted by Redis", d.Allowed, d.Fallback, err)
	}
}

// TestBreakerCountsOnlyStoreFailures: store errors that are about the call
// or one key's data — Redis answered, or was never asked — never open the
// breaker: a key holding foreign data (ErrMalformedState), a reservation
// whose wait the window cannot hold (gcra.ErrWaitTooLong), a schedule or a
// composite the store refuses before sending anything. Redis not answering
// still opens it. (ErrCrossSlot, which only a Cluster returns, is in
// TestClusterSlotsAtLoad.)
//
// fails on 2023668: five malformed-state, wait-too-long or duplicate-key
// errors in a row opened the breaker for every domain of the agent.
func TestBreakerCountsOnlyStoreFailures(t *testing.T) {
	c := testenv.Redis(t)
	store := redisStoreOn(t, c)
	ctx := context.Background()
	lim := gcra.Steady(gcra.PerHour(100, 10))
	poisoned := gcra.Key{Name: "poisoned"}
	if err := c.Set(ctx, store.RedisKey(poisoned), "not a state", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	badEpoch := gcra.Change(gcra.Version{Limit: gcra.PerHour(100, 10), Epoch: 7}, gcra.Version{Limit: gcra.PerHour(50, 5), Epoch: 7})
	calls := []struct {
		name string
		call func(*Breaker) error
	}{
		{"malformed state", func(b *Breaker) error {
			_, err := b.DecideAll(ctx, []gcra.Check{{Key: poisoned, Schedule: lim, Cost: 1}}, make([]gcra.Result, 1))
			return err
		}},
		{"wait beyond the window", func(b *Breaker) error {
			_, err := b.Reserve(ctx, gcra.Key{Name: "r"}, lim, 1, gcra.MaxWindow)
			return err
		}},
		{"refused schedule", func(b *Breaker) error {
			_, err := b.DecideAll(ctx, []gcra.Check{{Key: gcra.Key{Name: "s"}, Schedule: badEpoch, Cost: 1}}, make([]gcra.Result, 1))
			return err
		}},
		{"key listed twice", func(b *Breaker) error {
			k := gcra.Key{Name: "twice"}
			_, err := b.DecideAll(ctx, []gcra.Check{{Key: k, Schedule: lim, Cost: 1}, {Key: k, Schedule: lim, Cost: 1}}, make([]gcra.Result, 2))
			return err
		}},
	}
	for _, tt := range calls {
		t.Run(tt.name, func(t *testing.T) {
			br, err := NewBreaker(BreakerConfig{Failures: 5, Cooldown: Duration(time.Hour)}, store)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 5 {
				if err := tt.call(br); err == nil {
					t.Fatalf("call %d: no error", i)
				}
			}
			if br.Open() {
				t.Fatalf("five %s errors opened the breaker", tt.name)
			}
			if _, err := br.DecideAll(ctx, []gcra.Check{{Key: gcra.Key{Name: "fresh"}, Schedule: lim, Cost: 1}}, make([]gcra.Result, 1)); err != nil {
				t.Errorf("a fresh key after them: %v", err)
			}
		})
	}
	t.Run("Redis down still opens it", func(t *testing.T) {
		down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1, DialTimeout: 100 * time.Millisecond})
		t.Cleanup(func() { down.Close() })
		s, err := redisstore.New(down, redisstore.DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		br, err := NewBreaker(BreakerConfig{Failures: 5, Cooldown: Duration(time.Hour)}, s)
		if err != nil {
			t.Fatal(err)
		}
		for range 5 {
			_, _ = br.DecideAll(ctx, []gcra.Check{{Key: gcra.Key{Name: "k"}, Schedule: lim, Cost: 1}}, make([]gcra.Result, 1))
		}
		if !br.Open() {
			t.Error("five refused connections left the breaker closed")
		}
	})
}
