package memstore

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/meridian-quota/meridian/gcra"
)

// Clock returns the current time in microseconds. It must be safe for
// concurrent use; the store calls it with a shard's lock held.
type Clock func() int64

// WallClock is the Clock of a production store: time.Now in Unix
// microseconds.
func WallClock() int64 { return time.Now().UnixMicro() }

// MaxShards is the largest Config.Shards.
const MaxShards = 1 << 16

// minSweep is the smallest map size at which a shard sweeps itself.
const minSweep = 1024

// Config configures a Store. Its zero value is invalid; start from
// DefaultConfig.
type Config struct {
	// Clock is the store's clock for Decide, Reserve and DecideAll (µs).
	// It must not be nil. The *At methods take now from the caller instead.
	Clock Clock
	// Shards is the number of independently locked partitions of the key
	// space: a power of two between 1 and MaxShards.
	Shards int
	// MaxKeys is the most keys the store holds at once, rested or not. Each
	// shard holds at most MaxKeys/Shards, so MaxKeys must be at least Shards.
	MaxKeys int
	// ID is the store's identity as RaiseFence reports it (gcra.Fencer);
	// 0 draws a random one. A simulator sets it so that runs repeat.
	ID uint64
}

// DefaultConfig is the configuration of the embedded store.
func DefaultConfig() Config {
	return Config{
		Clock:   WallClock,  // decide on wall time; the simulator injects its virtual clock
		Shards:  64,         // a power of two; spreads lock contention over 2 cores and many goroutines
		MaxKeys: 10_000_000, // a hard cap so memory never grows without bound (~200 B plus the key each: ~2 GB)
	}
}

// Validate reports every problem with c at once.
func (c Config) Validate() error {
	var errs []error
	if c.Clock == nil {
		errs = append(errs, errors.New("memstore: Clock: must not be nil (use WallClock or a virtual clock)"))
	}
	shardsOK := c.Shards >= 1 && c.Shards <= MaxShards && c.Shards&(c.Shards-1) == 0
	if !shardsOK {
		errs = append(errs, fmt.Errorf("memstore: Shards %d: must be a power of two between 1 and %d", c.Shards, MaxShards))
	}
	switch {
	case c.MaxKeys < 1:
		errs = append(errs, fmt.Errorf("memstore: MaxKeys %d: must be at least 1", c.MaxKeys))
	case shardsOK && c.MaxKeys < c.Shards:
		errs = append(errs, fmt.Errorf("memstore: MaxKeys %d: must be at least Shards (%d), so that every shard holds a key", c.MaxKeys, c.Shards))
	}
	return errors.Join(errs...)
}

// ErrFull is returned, and nothing is decided, when a key must be created in
// a shard that holds Config.MaxKeys/Config.Shards live keys even after a
// sweep. The caller's failure policy decides the request.
var ErrFull = errors.New("memstore: full (Config.MaxKeys live keys)")

var (
	errZeroHandle    = errors.New("memstore: zero Handle")
	errForeignHandle = errors.New("memstore: Handle from another Store")
	errNilSchedule   = errors.New("memstore: nil schedule")
)

// Store is a concurrent in-memory gcra.Store. Create it with New; the zero
// Store is not usable. All methods are safe for concurrent use.
type Store struct {
	clock  Clock
	seed   maphash.Seed
	mask   uint64
	shards []shard
	fence  atomic.Pointer[gcra.Fence] // the region fence; nil: none held
	id     uint64                     // the store's identity for RaiseFence
}

var _ gcra.Fencer = (*Store)(nil)

var _ gcra.Store = (*Store)(nil)

// New returns an empty store, or the errors of cfg.Validate.
func New(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Store{
		clock:  cfg.Clock,
		seed:   maphash.MakeSeed(),
		mask:   uint64(cfg.Shards - 1),
		shards: make([]shard, cfg.Shards),
		id:     cfg.ID,
	}
	for i := range s.shards {
		s.shards[i] = shard{
			m:         make(map[gcra.Key]*entry),
			owner:     s,
			index:     i,
			limit:     cfg.MaxKeys / cfg.Shards,
			sweepAt:   minSweep,
			restBound: math.MinInt64,
			latest:    math.MinInt64,
		}
	}
	if s.id == 0 {
		s.id = rand.Uint64() | 1
	}
	return s, nil
}

// Handle is an interned key: a small value that reaches the key's state
// without hashing the key. It stays valid for the life of the Store that
// returned it, across evictions of its key (see the package documentation).
// The zero Handle is invalid. Handles may be copied and used concurrently.
type Handle struct {
	e *entry
}

// Key returns the key h was interned for; the zero Key for the zero Handle.
func (h Handle) Key() gcra.Key {
	if h.e == nil {
		return gcra.Key{}
	}
	return h.e.key
}

// Intern validates k and returns a Handle for it, creating the key (with no
// state) if the store does not hold it. It fails with ErrFull when the key's
// shard is full. Intern copies k's strings, so the caller may reuse their
// memory.
func (s *Store) Intern(k gcra.Key) (Handle, error) {
	if err := k.Validate(); err != nil {
		return Handle{}, fmt.Errorf("memstore: %w", err)
	}
	sh := s.shardFor(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, err := sh.find(k)
	if err != nil {
		return Handle{}, err
	}
	return Handle{e: e}, nil
}

// Get returns the state stored for k and true, or the zero State and false
// when the store holds no state for k (never written, or evicted). It is an
// admin view: a key that is rested but not yet swept is returned as stored.
func (s *Store) Get(k gcra.Key) (gcra.State, bool) {
	sh := s.shardFor(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[k]
	if !ok || !e.has {
		return gcra.State{}, false
	}
	return e.state(), true
}

// Len returns the number of keys the store holds, including interned keys
// with no state and rested keys not yet swept.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// Sweep drops every key rested at now (Rested ≤ now) or holding no state, in
// every shard, and returns how many it dropped. Keys in use by a concurrent
// composite decision are kept. Stores sweep themselves; Sweep is for callers
// that want memory back at a moment of their choosing.
func (s *Store) Sweep(now int64) int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.sweep(now)
		sh.mu.Unlock()
	}
	return n
}

// shardFor hashes k onto its shard.
func (s *Store) shardFor(k gcra.Key) *shard {
	h := maphash.String(s.seed, k.Name)
	if k.Tag != "" {
		h ^= maphash.String(s.seed, k.Tag) * 0x9e3779b97f4a7c15
	}
	return &s.shards[h&s.mask]
}

// handleShard checks that h belongs to s and returns its shard.
func (s *Store) handleShard(h Handle) (*shard, error) {
	switch {
	case h.e == nil:
		return nil, errZeroHandle
	case h.e.sh.owner != s:
		return nil, errForeignHandle
	}
	return h.e.sh, nil
}

// checkSchedule is the cheap validation every decision runs, and the
// region fence: a fenced schedule below the fence held, or with none held,
// is refused (gcra.ErrFenced).
func (s *Store) checkSchedule(sch *gcra.Schedule) error {
	switch {
	case sch == nil:
		return errNilSchedule
	case !sch.Valid():
		return fmt.Errorf("memstore: %w", sch.Validate())
	case !sch.Fence.IsZero():
		if f := s.fence.Load(); f == nil || sch.Fence.Less(*f) {
			return gcra.ErrFenced
		}
	}
	return nil
}

// Fence returns the region fence the store holds (ok false: none).
func (s *Store) Fence() (f gcra.Fence, ok bool) {
	if p := s.fence.Load(); p != nil {
		return *p, true
	}
	return gcra.Fence{}, false
}

// RaiseFence implements gcra.Fencer: the fence only rises, and the store's
// identity is random per Store (a new Store — a restarted process — holds
// no fence and has another).
func (s *Store) RaiseFence(ctx context.Context, f gcra.Fence) (gcra.Fence, uint64, error) {
	if err := ctx.Err(); err != nil {
		return gcra.Fence{}, 0, err
	}
	for {
		old := s.fence.Load()
		if old != nil && !old.Less(f) {
			return *old, s.id, nil
		}
		nf := f
		if s.fence.CompareAndSwap(old, &nf) {
			return nf, s.id, nil
		}
	}
}

// wrap adds the package's context to an error from gcra.
func wrap(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("memstore: %w", err)
}
