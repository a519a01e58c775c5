package memstore

import (
	"fmt"
	"math"
	"strings"
	"sync"

	"github.com/meridian-quota/meridian/gcra"
)

// entry is one key's state. key and sh never change; the other fields are
// guarded by sh.mu.
type entry struct {
	key gcra.Key
	sh  *shard
	// val is the key's state as every store keeps it — gcra.Value, the
	// bytes Redis holds for the key — and rested its expiry (gcra.State's
	// Rested, which Redis keeps as the key's PX); has is false while the
	// key holds no state.
	val    gcra.Value
	rested int64
	has    bool
	// dead marks an entry evicted from sh.m; handles to it re-find or
	// revive their key.
	dead bool
	// pinned marks an entry held by a composite decision in progress;
	// sweeps keep it.
	pinned bool
}

// shard is one lock's worth of keys. Padded to two cache lines so that
// neighbouring shards' locks do not share one.
type shard struct {
	mu    sync.Mutex
	m     map[gcra.Key]*entry
	owner *Store
	index int
	// limit is the most keys the shard holds (MaxKeys/Shards).
	limit int
	// sweepAt is the map size at which the shard next sweeps itself.
	sweepAt int
	// restBound is a lower bound on the earliest now at which a sweep can
	// drop anything (math.MinInt64 when an entry holds no state).
	restBound int64
	// latest is the latest now a decision on this shard has used; automatic
	// sweeps run at it.
	latest int64
	_      [64]byte
}

// observe records that a decision runs at now.
// A now outside gcra's range is ignored here (gcra refuses the decision),
// so a bad clock value cannot make the shard sweep live keys.
func (sh *shard) observe(now int64) {
	if now > sh.latest && now < gcra.MaxTime {
		sh.latest = now
	}
}

// state is the key's stored state, decoded from its Value as a Redis key's
// would be, with Rested from its expiry.
func (e *entry) state() gcra.State {
	if !e.has {
		return gcra.State{}
	}
	st, err := gcra.DecodeValue(e.val[:])
	if err != nil {
		// Unreachable: put stores only what EncodeValue made of a state gcra
		// wrote (its TAT is within MaxWindow of a now below MaxTime).
		panic(fmt.Sprintf("memstore: stored value %x: %v", e.val, err))
	}
	st.Rested = e.rested
	return st
}

// put stores a state gcra said to write.
func (sh *shard) put(e *entry, st gcra.State) {
	e.val, e.rested, e.has = gcra.EncodeValue(st), st.Rested, true
	if st.Rested < sh.restBound {
		sh.restBound = st.Rested
	}
}

// find returns k's live entry, creating it with no state if needed.
func (sh *shard) find(k gcra.Key) (*entry, error) {
	if e, ok := sh.m[k]; ok {
		return e, nil
	}
	if err := sh.room(); err != nil {
		return nil, err
	}
	e := &entry{key: cloneKey(k), sh: sh}
	sh.m[e.key] = e
	sh.restBound = math.MinInt64
	return e, nil
}

// live returns the live entry for e's key: e itself unless it was evicted,
// then the key's current entry, or e revived with no state.
func (sh *shard) live(e *entry) (*entry, error) {
	if !e.dead {
		return e, nil
	}
	if cur, ok := sh.m[e.key]; ok {
		return cur, nil
	}
	if err := sh.room(); err != nil {
		return nil, err
	}
	e.dead = false
	e.has = false
	sh.m[e.key] = e
	sh.restBound = math.MinInt64
	return e, nil
}

// room makes room for one more key: it sweeps when the map has grown to
// sweepAt or is full, and reports ErrFull if it is still full.
func (sh *shard) room() error {
	if n := len(sh.m); n >= sh.sweepAt || n >= sh.limit {
		sh.sweep(sh.latest)
	}
	if len(sh.m) >= sh.limit {
		return ErrFull
	}
	return nil
}

// sweep drops the entries rested at now (or holding no state), except
// pinned ones, and returns how many it dropped. After dropping most of the
// map it copies the survivors into a new map, so that the old one's memory
// is released.
func (sh *shard) sweep(now int64) int {
	before := len(sh.m)
	removed := 0
	if now >= sh.restBound {
		bound := int64(math.MaxInt64)
		for k, e := range sh.m {
			switch {
			case e.pinned:
				if !e.has {
					bound = math.MinInt64
				} else {
					bound = min(bound, e.rested)
				}
			case !e.has || e.rested <= now:
				delete(sh.m, k)
				e.dead = true
				removed++
			default:
				bound = min(bound, e.rested)
			}
		}
		sh.restBound = bound
	}
	after := before - removed
	if removed > after {
		m := make(map[gcra.Key]*entry, after)
		for k, e := range sh.m {
			m[k] = e
		}
		sh.m = m
	}
	sh.sweepAt = max(minSweep, 2*after)
	return removed
}

// cloneKey copies k's strings into one allocation, so that a stored key
// does not keep a caller's larger buffer alive.
func cloneKey(k gcra.Key) gcra.Key {
	var b strings.Builder
	b.Grow(len(k.Tag) + len(k.Name))
	b.WriteString(k.Tag)
	b.WriteString(k.Name)
	s := b.String()
	return gcra.Key{Tag: s[:len(k.Tag)], Name: s[len(k.Tag):]}
}
