package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gcra/redisstore"
	"github.com/meridian-quota/meridian/internal/testenv"
	"github.com/meridian-quota/meridian/region"
)

// TestClusterSlotsAtLoad runs on a real three-master Redis Cluster. There a
// composite's keys must share a slot, so an agent that knows it is on a
// Cluster (redis.type: cluster, which cmd turns into a ClusterClient and
// region.Config.OneSlot) refuses at load, naming the limits, a domain
// without hash_tag whose limits one request can combine, and refuses a
// request whose keys still cannot share a slot (a limit override without the
// tag's entry) as a bad request; neither ever reaches Redis as a cross-slot
// error. A tagged policy decides its composites on the Cluster, and
// ErrCrossSlot from the store never opens the breaker.
//
// fails on 2023668: nothing said the store was a Cluster (no redis.cluster,
// no region.Config.OneSlot); the policy loaded, each of its composites
// failed in the store with ErrCrossSlot and fell to its failure mode, and
// five of them opened the breaker.
func TestClusterSlotsAtLoad(t *testing.T) {
	cl := testenv.StartCluster(t, 3)
	store := redisStoreOn(t, cl.Client())
	ctx := context.Background()
	ncfg := region.DefaultConfig("eu", "eu-1", "eu")
	ncfg.OneSlot = true

	t.Run("untagged composites refused at load", func(t *testing.T) {
		pol, err := region.ParsePolicy([]byte(envoyPolicy))
		if err != nil {
			t.Fatal(err)
		}
		_, err = region.NewNode(ncfg, pol, store)
		for _, want := range []string{`domain "api"`, "domains[0].descriptors[0]", "domains[0].descriptors[0].descriptors[0]", "hash_tag"} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("NewNode: err = %v, want it to name %q", err, want)
			}
		}
		if err != nil && strings.Contains(err.Error(), `domain "strict"`) {
			t.Errorf("NewNode: %v: a domain with one limit cannot combine limits", err)
		}
		// The agent's configuration says so too, at start and at reload.
		cfg := DefaultConfig()
		cfg.DrainDelay = 0 // stopped at once
		cfg.Region, cfg.Agent, cfg.Regions, cfg.ReloadEvery = "eu", "eu-1", []string{"eu"}, 0
		cfg.Redis.Type, cfg.Redis.Addrs = RedisCluster, cl.Addrs
		cfg.Policy = filepath.Join(t.TempDir(), "policy.yaml")
		if err := os.WriteFile(cfg.Policy, []byte(envoyPolicy), 0o644); err != nil {
			t.Fatal(err)
		}
		plain := region.DefaultConfig("eu", "eu-1", "eu") // a node not told: the agent still refuses
		n, err := region.NewNode(plain, pol, store)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := New(cfg, n, nil); err == nil || !strings.Contains(err.Error(), "domains[0].descriptors[0].descriptors[0]") {
			t.Errorf("agent.New: err = %v, want the limits named", err)
		}
		good, err := region.NewNode(ncfg, mustPolicyAgent(t, testPolicy), store)
		if err != nil {
			t.Fatal(err)
		}
		a, err := New(cfg, good, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Reload(); err == nil || !strings.Contains(err.Error(), `domain "api"`) {
			t.Errorf("Reload: err = %v, want the untagged policy refused", err)
		}
	})

	t.Run("tagged composites decide; untagged overrides are bad requests", func(t *testing.T) {
		br, err := NewBreaker(BreakerConfig{Failures: 5, Cooldown: Duration(time.Hour)}, store)
		if err != nil {
			t.Fatal(err)
		}
		n, err := region.NewNode(ncfg, mustPolicyAgent(t, testPolicy), br)
		if err != nil {
			t.Fatal(err)
		}
		var d region.Decision
		both := &region.Request{Domain: "api", Cost: 1, Descriptors: []region.Descriptor{
			{Entries: []region.Entry{{Key: "tenant", Value: "acme"}}},
			{Entries: []region.Entry{{Key: "tenant", Value: "acme"}, {Key: "route", Value: "/search"}}},
		}}
		if err := n.Decide(ctx, time.Now().UnixMicro(), both, &d); err != nil || d.Fallback || !d.Allowed {
			t.Errorf("tagged composite: allowed %v fallback %v err %v, want admitted by the Cluster", d.Allowed, d.Fallback, err)
		}
		over := gcra.PerSecond(10, 10)
		untagged := &region.Request{Domain: "api", Cost: 1, Descriptors: []region.Descriptor{
			{Entries: []region.Entry{{Key: "colour", Value: "red"}}, Override: over},
			{Entries: []region.Entry{{Key: "colour", Value: "blue"}}, Override: over},
		}}
		err = n.Decide(ctx, time.Now().UnixMicro(), untagged, &d)
		if !errors.Is(err, region.ErrBadRequest) || !strings.Contains(err.Error(), "slot") {
			t.Errorf("untagged overrides: err = %v (fallback %v), want a bad request about the slot", err, d.Fallback)
		}
		if s := n.Stats(); s.StoreErrors != 0 {
			t.Errorf("%d store errors", s.StoreErrors)
		}
	})

	t.Run("ErrCrossSlot never opens the breaker", func(t *testing.T) {
		br, err := NewBreaker(BreakerConfig{Failures: 5, Cooldown: Duration(time.Hour)}, store)
		if err != nil {
			t.Fatal(err)
		}
		lim := gcra.Steady(gcra.PerHour(100, 10))
		for i := range 5 {
			_, err := br.DecideAll(ctx, []gcra.Check{{Key: gcra.Key{Name: "a"}, Schedule: lim, Cost: 1}, {Key: gcra.Key{Name: "b"}, Schedule: lim, Cost: 1}},
				make([]gcra.Result, 2))
			if !errors.Is(err, redisstore.ErrCrossSlot) {
				t.Fatalf("call %d: %v, want ErrCrossSlot", i, err)
			}
		}
		if br.Open() {
			t.Error("five ErrCrossSlot opened the breaker")
		}
	})
}

func mustPolicyAgent(t *testing.T, src string) *region.Policy {
	t.Helper()
	p, err := region.ParsePolicy([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return p
}
