package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"
)

// stateMarkers remembers the state markers a Store has seen (CheckState).
type stateMarkers struct {
	mu   sync.Mutex
	seen map[string]bool // marker key → seen present (or written) at a check
}

// CheckState reports how many of the Redis servers holding the store's keys
// lost them since the last check: restarted without persistence, failed
// over to a replica that had not caught up, flushed. A GCRA key that is gone
// reads as a full bucket, so every key on such a server has its whole burst
// again — a loss the limiter cannot see from the keys themselves.
//
// Each server (each Cluster master, by its slot ranges) holds a marker key
// under the prefix, written if absent (SET NX, no expiry). A marker this
// Store saw at an earlier check and finds absent is a loss; a marker seen
// for the first time (the first check, a new master) is not. Call it
// periodically (the agent does every second); the first call only writes
// the markers. A maxmemory-policy that may evict keys without an expiry
// (allkeys-*) can evict a marker too, which then reads as a loss: run the
// limiter's Redis with noeviction or a volatile-* policy. Safe for
// concurrent use.
func (s *Store) CheckState(ctx context.Context) (lost int, err error) {
	keys, err := s.markerKeys(ctx)
	if err != nil {
		return 0, err
	}
	created, failed := make([]bool, len(keys)), make([]bool, len(keys))
	var errs []error
	for i, k := range keys {
		ok, err := s.uc.SetNX(ctx, k, "meridian state marker", 0).Result()
		if err != nil {
			errs = append(errs, fmt.Errorf("redisstore: state marker %s: %w", k, err))
			failed[i] = true
			continue
		}
		created[i] = ok
	}
	s.markers.mu.Lock()
	defer s.markers.mu.Unlock()
	if s.markers.seen == nil {
		s.markers.seen = map[string]bool{}
	}
	for i, k := range keys {
		if failed[i] {
			continue // keeps its earlier state: seen or not
		}
		if created[i] && s.markers.seen[k] {
			lost++
		}
		s.markers.seen[k] = true
	}
	return lost, errors.Join(errs...)
}

// markerKeys returns the state marker keys: one, or on a Cluster one per
// master, in a slot that master serves (its first slot range).
func (s *Store) markerKeys(ctx context.Context) ([]string, error) {
	base := s.cfg.Prefix + "state"
	cc, ok := s.uc.(*redis.ClusterClient)
	if !ok {
		return []string{base}, nil
	}
	slots, err := cc.ClusterSlots(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("redisstore: state markers: CLUSTER SLOTS: %w", err)
	}
	var keys []string
	done := map[string]bool{} // master address → has a marker
	for _, r := range slots {
		if len(r.Nodes) == 0 || done[r.Nodes[0].Addr] {
			continue
		}
		k, ok := slotKey(base, r.Start, r.End)
		if !ok {
			return nil, fmt.Errorf("redisstore: state markers: no key found in slots %d–%d", r.Start, r.End)
		}
		done[r.Nodes[0].Addr] = true
		keys = append(keys, k)
	}
	return keys, nil
}

// slotKey returns base:{sN} for the smallest N whose slot is in [lo, hi].
func slotKey(base string, lo, hi int) (string, bool) {
	for n := 0; n < 1<<20; n++ {
		tag := "s" + strconv.Itoa(n)
		if sl := int(crc16(tag) % numSlots); sl >= lo && sl <= hi {
			return base + ":{" + tag + "}", true
		}
	}
	return "", false
}
