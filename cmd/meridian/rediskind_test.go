package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/meridian-quota/meridian/internal/testenv"
	"github.com/meridian-quota/meridian/region/agent"
)

// TestCheckRedisKind: the agent refuses to start on a Redis of another kind
// than redis.cluster says, and says which setting to change; a Redis that
// does not answer is left to the failure modes.
func TestCheckRedisKind(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	single := testenv.Redis(t)
	if err := checkRedisKind(ctx, single, false); err != nil {
		t.Errorf("single node, redis.cluster false: %v", err)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{single.Options().Addr}})
	defer cc.Close()
	if err := checkRedisKind(ctx, cc, true); !errors.Is(err, agent.ErrConfig) || !strings.Contains(err.Error(), "not a Redis Cluster node") {
		t.Errorf("single node, redis.cluster true: %v, want a config error", err)
	}
	cl := testenv.StartCluster(t, 3)
	node := redis.NewClient(&redis.Options{Addr: cl.Addrs[0]})
	defer node.Close()
	if err := checkRedisKind(ctx, node, false); !errors.Is(err, agent.ErrConfig) || !strings.Contains(err.Error(), "set redis.cluster: true") {
		t.Errorf("Cluster node, redis.cluster false: %v, want a config error", err)
	}
	if err := checkRedisKind(ctx, cl.Client(), true); err != nil {
		t.Errorf("Cluster, redis.cluster true: %v", err)
	}
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1})
	defer dead.Close()
	if err := checkRedisKind(ctx, dead, false); err != nil {
		t.Errorf("no Redis: %v, want nil (the failure modes decide)", err)
	}
}
