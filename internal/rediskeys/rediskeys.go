// Package rediskeys deletes the keys under a prefix on any go-redis client:
// the cleanup behind testenv.Cleanup and the load generator's targets.
package rediskeys

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// DeletePrefix unlinks every key starting with prefix, with SCAN and
// pipelined UNLINKs: on every master of a *redis.ClusterClient, every shard
// of a *redis.Ring, otherwise on the client itself. An empty prefix is
// refused (it would delete every key).
func DeletePrefix(ctx context.Context, c redis.UniversalClient, prefix string) error {
	if prefix == "" {
		return errors.New("rediskeys: empty prefix would delete every key")
	}
	pattern := GlobEscape(prefix) + "*"
	node := func(ctx context.Context, n *redis.Client) error { return unlinkMatching(ctx, n, pattern) }
	switch c := c.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, node)
	case *redis.Ring:
		return c.ForEachShard(ctx, node)
	default:
		return unlinkMatching(ctx, c, pattern)
	}
}

// unlinkMatching unlinks the keys of one node matching pattern. Keys are
// unlinked one per command (pipelined), since a cluster node refuses a
// multi-key command whose keys lie in different slots.
func unlinkMatching(ctx context.Context, c redis.Cmdable, pattern string) error {
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, pattern, 1000).Result()
		if err != nil {
			return fmt.Errorf("scan %q: %w", pattern, err)
		}
		if len(keys) > 0 {
			_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, k := range keys {
					p.Unlink(ctx, k)
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("unlink %q: %w", pattern, err)
			}
		}
		if next == 0 {
			return nil
		}
		cursor = next
	}
}

// GlobEscape escapes the characters special to Redis glob-style patterns.
func GlobEscape(s string) string {
	var sb strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', ']', '\\':
			sb.WriteByte('\\')
		}
		sb.WriteByte(s[i])
	}
	return sb.String()
}
