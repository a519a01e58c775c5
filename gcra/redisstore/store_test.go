package redisstore

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/meridian-quota/meridian/gcra"
)

func TestNewRefusesRing(t *testing.T) {
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer ring.Close()
	if _, err := New(ring, DefaultConfig()); err == nil || !strings.Contains(err.Error(), "Ring is not supported") {
		t.Fatalf("New(Ring) = %v, want a refusal", err)
	}
	if _, err := New(nil, DefaultConfig()); err == nil {
		t.Fatal("New(nil) succeeded")
	}
}

func TestCompositeDuplicateKeyRefused(t *testing.T) {
	s, c := newTestStore(t)
	lim := gcra.Steady(gcra.PerSecond(10, 2))
	k := gcra.Key{Tag: "t", Name: "k"}
	checks := []gcra.Check{{Key: k, Schedule: lim, Cost: 1}, {Key: k, Schedule: lim, Cost: 1}}
	_, err := s.DecideAll(context.Background(), checks, make([]gcra.Result, 2))
	if err == nil || !strings.Contains(err.Error(), "listed twice") {
		t.Fatalf("err = %v, want a refusal naming the duplicate", err)
	}
	if n, _ := c.Exists(context.Background(), s.RedisKey(k)).Result(); n != 0 {
		t.Fatal("a refused composite wrote its key")
	}
}
