package redisstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// keysUnder returns every key of one node starting with prefix (SCAN). The
// prefixes of testenv.Prefix and of these tests hold no glob characters.
func keysUnder(t *testing.T, c redis.Cmdable, prefix string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []string
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, prefix+"*", 1000).Result()
		if err != nil {
			t.Fatalf("SCAN %s*: %v", prefix, err)
		}
		out = append(out, keys...)
		if next == 0 {
			return out
		}
		cursor = next
	}
}

// wantNoKeys fails the test if any key starts with prefix.
func wantNoKeys(t *testing.T, c redis.Cmdable, prefix, what string) {
	t.Helper()
	if keys := keysUnder(t, c, prefix); len(keys) != 0 {
		t.Errorf("%s: wrote %d keys under %q, want none: %q", what, len(keys), prefix, keys)
	}
}

// setNow makes s decide at the given µs instead of the server's TIME.
func setNow(s *Store, us int64) { s.testNow = strconv.FormatInt(us, 10) }

// wallMicros is the wall clock in µs: a realistic explicit now, so the
// TTLs the script derives from it are sane.
func wallMicros() int64 { return time.Now().UnixMicro() }

// waitFor polls cond every few milliseconds until it holds or timeout
// passes; it reports whether it held.
func waitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}
