package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/meridian-quota/meridian/internal/rediskeys"
)

// pingTimeout bounds the reachability check of the shared Redis.
const pingTimeout = 2 * time.Second

// cleanupTimeout bounds the key deletion done by [Cleanup].
const cleanupTimeout = 30 * time.Second

// Redis returns a client of the shared Redis at MERIDIAN_REDIS_ADDR (default
// [DefaultRedisAddr]) after checking it answers PING within 2 s. An
// unreachable Redis fails the test in CI and skips it elsewhere. The client is
// closed when the test ends. Tests sharing this Redis must confine their keys
// to a [Prefix] and should remove them with [Cleanup].
func Redis(t testing.TB) *redis.Client {
	t.Helper()
	addr := os.Getenv(EnvRedisAddr)
	if addr == "" {
		addr = DefaultRedisAddr
	}
	c := redis.NewClient(&redis.Options{Addr: addr})
	ctx, cancel := context.WithTimeout(context.Background(), pingTimeout)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		_ = c.Close()
		MustOrSkip(t, err, "Redis not reachable at "+addr)
		return nil // not reached: MustOrSkip ends the test
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// maxPrefixName is the longest test-name part of a [Prefix], in bytes.
const maxPrefixName = 40

// Prefix returns a key prefix unique to this call:
// "mtest:" + the test name with every byte outside [A-Za-z0-9_-] replaced by
// '_' and cut to 40 bytes + ":" + 8 random hex digits + ":". It never contains
// '{' or '}', so it never forms a Redis Cluster hash tag. Prefix deletes
// nothing; pair it with [Cleanup].
func Prefix(t testing.TB) string {
	t.Helper()
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("testenv: random prefix: %v", err)
	}
	return "mtest:" + sanitize(t.Name(), maxPrefixName) + ":" + hex.EncodeToString(b[:]) + ":"
}

// sanitize maps s to [A-Za-z0-9_-], one '_' per other rune, and cuts the
// result to at most n bytes.
func sanitize(s string, n int) string {
	var sb strings.Builder
	for _, r := range s {
		if sb.Len() == n {
			break
		}
		switch {
		case 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z', '0' <= r && r <= '9', r == '_', r == '-':
			sb.WriteRune(r)
		default:
			sb.WriteByte('_')
		}
	}
	return sb.String()
}

// Cleanup registers a t.Cleanup that deletes every key starting with prefix,
// using SCAN and UNLINK. For a *redis.ClusterClient it scans every master, for
// a *redis.Ring every shard, and otherwise the client itself. Cleanups run in
// reverse order, so call Cleanup after the call that returned c (whose own
// cleanup closes it). A failed deletion fails the test.
func Cleanup(t testing.TB, c redis.UniversalClient, prefix string) {
	t.Helper()
	if prefix == "" {
		t.Fatalf("testenv: Cleanup with an empty prefix would delete every key")
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		if err := rediskeys.DeletePrefix(ctx, c, prefix); err != nil {
			t.Errorf("testenv: delete keys under %q: %v", prefix, err)
		}
	})
}
