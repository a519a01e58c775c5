package memstore

import (
	"context"
	"fmt"
	"time"

	"github.com/meridian-quota/meridian/gcra"
)

// DecideAt decides a request of the given cost (0 peeks) for h's key at now
// (µs) under sch, as gcra.Decide does, and writes the key's new state when
// gcra says to. It allocates nothing once the key exists. Bad input is an
// error and changes nothing; ErrFull means h's key was evicted and could not
// be re-created.
func (s *Store) DecideAt(h Handle, now int64, sch *gcra.Schedule, cost int64) (gcra.Result, error) {
	sh, err := s.handleShard(h)
	if err != nil {
		return gcra.Result{}, err
	}
	if err := s.checkSchedule(sch); err != nil {
		return gcra.Result{}, err
	}
	if cost < 0 {
		return gcra.Result{}, wrap(gcra.ErrNegativeCost)
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.observe(now)
	e, err := sh.live(h.e)
	if err != nil {
		return gcra.Result{}, err
	}
	return sh.decide(e, now, sch, cost)
}

// Bind implements gcra.Binder: it interns k, and the Binding decides on
// the handle at Config.Clock's now, skipping the key lookup.
func (s *Store) Bind(k gcra.Key) (gcra.Binding, error) {
	h, err := s.Intern(k)
	if err != nil {
		return nil, err
	}
	return &binding{s: s, h: h}, nil
}

type binding struct {
	s *Store
	h Handle
}

func (b *binding) Decide(ctx context.Context, sch *gcra.Schedule, cost int64) (gcra.Result, error) {
	if err := ctx.Err(); err != nil {
		return gcra.Result{}, err
	}
	if err := b.s.checkSchedule(sch); err != nil {
		return gcra.Result{}, err
	}
	if cost < 0 {
		return gcra.Result{}, wrap(gcra.ErrNegativeCost)
	}
	return b.s.decideOnClock(b.h.e.sh, b.h.e, gcra.Key{}, sch, cost)
}

// ReserveAt books the next slot for a request of the given cost for h's key
// at now (µs) if the wait is at most maxWaitMicros, as gcra.Reserve does,
// and writes the key's new state when gcra says to. It allocates nothing
// once the key exists.
func (s *Store) ReserveAt(h Handle, now int64, sch *gcra.Schedule, cost, maxWaitMicros int64) (gcra.Result, error) {
	sh, err := s.handleShard(h)
	if err != nil {
		return gcra.Result{}, err
	}
	if err := s.checkReserve(sch, cost, maxWaitMicros); err != nil {
		return gcra.Result{}, err
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.observe(now)
	e, err := sh.live(h.e)
	if err != nil {
		return gcra.Result{}, err
	}
	return sh.reserve(e, now, sch, cost, maxWaitMicros)
}

// DecideAllAt decides checks all or nothing at now (µs), as gcra.DecideAll
// does, for the keys of hs (checks[i].Key is ignored; hs[i] is used). It
// fills out, which must have len(checks) elements, with each limit's result
// and returns the combined one; it writes every key or none. hs must have
// len(checks) elements, 1 to gcra.MaxChecks of them, naming distinct keys.
// It allocates nothing once the keys exist.
func (s *Store) DecideAllAt(now int64, hs []Handle, checks []gcra.Check, out []gcra.Result) (gcra.Result, error) {
	if len(hs) != len(checks) {
		return gcra.Result{}, fmt.Errorf("memstore: DecideAllAt: %d handles for %d checks", len(hs), len(checks))
	}
	return s.decideAll(now, false, hs, checks, out)
}

// Decide implements gcra.Store: DecideAt on k at Config.Clock's now.
func (s *Store) Decide(ctx context.Context, k gcra.Key, sch gcra.Schedule, cost int64) (gcra.Result, error) {
	if err := ctx.Err(); err != nil {
		return gcra.Result{}, err
	}
	if err := k.Validate(); err != nil {
		return gcra.Result{}, wrap(err)
	}
	if err := s.checkSchedule(&sch); err != nil {
		return gcra.Result{}, err
	}
	if cost < 0 {
		return gcra.Result{}, wrap(gcra.ErrNegativeCost)
	}
	return s.decideOnClock(s.shardFor(k), nil, k, &sch, cost)
}

// decideOnClock decides on the store's clock, read under the shard's lock:
// on e (a bound key; revived if evicted) or, when e is nil, on k.
func (s *Store) decideOnClock(sh *shard, e *entry, k gcra.Key, sch *gcra.Schedule, cost int64) (gcra.Result, error) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.clock()
	sh.observe(now)
	var err error
	if e != nil {
		e, err = sh.live(e)
	} else {
		e, err = sh.find(k)
	}
	if err != nil {
		return gcra.Result{}, err
	}
	return sh.decide(e, now, sch, cost)
}

// Reserve implements gcra.Store: ReserveAt on k at Config.Clock's now, with
// maxWait rounded down to whole microseconds.
func (s *Store) Reserve(ctx context.Context, k gcra.Key, sch gcra.Schedule, cost int64, maxWait time.Duration) (gcra.Result, error) {
	if err := ctx.Err(); err != nil {
		return gcra.Result{}, err
	}
	if err := k.Validate(); err != nil {
		return gcra.Result{}, wrap(err)
	}
	wait, err := gcra.ValidateMaxWait(maxWait)
	if err != nil {
		return gcra.Result{}, wrap(err)
	}
	if err := s.checkReserve(&sch, cost, wait); err != nil {
		return gcra.Result{}, err
	}
	sh := s.shardFor(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.clock()
	sh.observe(now)
	e, err := sh.find(k)
	if err != nil {
		return gcra.Result{}, err
	}
	return sh.reserve(e, now, &sch, cost, wait)
}

// DecideAll implements gcra.Store: DecideAllAt on the checks' keys at
// Config.Clock's now, read once all the keys' shards are locked.
func (s *Store) DecideAll(ctx context.Context, checks []gcra.Check, out []gcra.Result) (gcra.Result, error) {
	if err := ctx.Err(); err != nil {
		return gcra.Result{}, err
	}
	if len(checks) == 1 && len(out) == 1 {
		// One limit: the composite machinery decides exactly what Decide
		// does, at more cost (the simulator's common case).
		r, err := s.Decide(ctx, checks[0].Key, checks[0].Schedule, checks[0].Cost)
		if err != nil {
			return gcra.Result{}, err
		}
		out[0] = r
		return r, nil
	}
	return s.decideAll(0, true, nil, checks, out)
}

func (s *Store) checkReserve(sch *gcra.Schedule, cost, maxWait int64) error {
	if err := s.checkSchedule(sch); err != nil {
		return err
	}
	switch {
	case cost < 0:
		return wrap(gcra.ErrNegativeCost)
	case maxWait < 0:
		return wrap(gcra.ErrNegativeWait)
	}
	return nil
}

// decide runs gcra.Decide on e and writes what it says to. sh.mu is held.
func (sh *shard) decide(e *entry, now int64, sch *gcra.Schedule, cost int64) (gcra.Result, error) {
	st, write, r, err := gcra.Decide(e.state(), now, sch, cost)
	if err != nil {
		return gcra.Result{}, wrap(err)
	}
	if write {
		sh.put(e, st)
	}
	return r, nil
}

// reserve runs gcra.Reserve on e and writes what it says to. sh.mu is held.
func (sh *shard) reserve(e *entry, now int64, sch *gcra.Schedule, cost, maxWait int64) (gcra.Result, error) {
	st, write, r, err := gcra.Reserve(e.state(), now, sch, cost, maxWait)
	if err != nil {
		return gcra.Result{}, wrap(err)
	}
	if write {
		sh.put(e, st)
	}
	return r, nil
}

// composite is the working set of one composite decision: slices of
// arrays on the caller's stack, sized for the common small composite.
type composite struct {
	sh     []*shard // per check
	locked []*shard // distinct shards, ascending by index
	ents   []*entry // per check, once resolved
	states []gcra.State
	next   []gcra.State
}

// smallComposite is the size of composite the stack arrays are shaped for
// first; zeroing arrays for gcra.MaxChecks would cost more than a small
// decision.
const smallComposite = 4

// decideAll is DecideAllAt (hs != nil, now given) and DecideAll (hs == nil,
// keys from checks, now from the clock once the shards are locked).
func (s *Store) decideAll(now int64, useClock bool, hs []Handle, checks []gcra.Check, out []gcra.Result) (gcra.Result, error) {
	n := len(checks)
	switch {
	case n == 0:
		return gcra.Result{}, wrap(gcra.ErrNoChecks)
	case n > gcra.MaxChecks:
		return gcra.Result{}, wrap(gcra.ErrTooManyChecks)
	case len(out) != n:
		return gcra.Result{}, fmt.Errorf("memstore: DecideAll: out has %d elements for %d checks", len(out), n)
	}
	if n <= smallComposite {
		var a struct {
			sh, locked [smallComposite]*shard
			ents       [smallComposite]*entry
			states     [smallComposite]gcra.State
			next       [smallComposite]gcra.State
		}
		c := composite{sh: a.sh[:n], locked: a.locked[:0], ents: a.ents[:n], states: a.states[:n], next: a.next[:n]}
		return s.compose(&c, now, useClock, hs, checks, out)
	}
	var a struct {
		sh, locked [gcra.MaxChecks]*shard
		ents       [gcra.MaxChecks]*entry
		states     [gcra.MaxChecks]gcra.State
		next       [gcra.MaxChecks]gcra.State
	}
	c := composite{sh: a.sh[:n], locked: a.locked[:0], ents: a.ents[:n], states: a.states[:n], next: a.next[:n]}
	return s.compose(&c, now, useClock, hs, checks, out)
}

// compose validates, locks, decides and unlocks a composite.
func (s *Store) compose(c *composite, now int64, useClock bool, hs []Handle, checks []gcra.Check, out []gcra.Result) (gcra.Result, error) {
	for i := range checks {
		if err := s.checkSchedule(&checks[i].Schedule); err != nil {
			return gcra.Result{}, err
		}
		if checks[i].Cost < 0 {
			return gcra.Result{}, wrap(gcra.ErrNegativeCost)
		}
		if hs != nil {
			sh, err := s.handleShard(hs[i])
			if err != nil {
				return gcra.Result{}, err
			}
			c.sh[i] = sh
		} else {
			if err := checks[i].Key.Validate(); err != nil {
				return gcra.Result{}, wrap(err)
			}
			c.sh[i] = s.shardFor(checks[i].Key)
		}
	}
	for i := 1; i < len(checks); i++ {
		ki := compositeKey(hs, checks, i)
		for j := range i {
			if compositeKey(hs, checks, j) == ki {
				return gcra.Result{}, fmt.Errorf("memstore: DecideAll: key %q/%q listed twice", ki.Tag, ki.Name)
			}
		}
	}
	c.lock()
	r, err := s.decideLocked(c, now, useClock, hs, checks, out)
	c.unlock()
	return r, err
}

func compositeKey(hs []Handle, checks []gcra.Check, i int) gcra.Key {
	if hs != nil {
		return hs[i].e.key
	}
	return checks[i].Key
}

// decideLocked resolves, decides and writes a composite whose shards are
// locked.
func (s *Store) decideLocked(c *composite, now int64, useClock bool, hs []Handle, checks []gcra.Check, out []gcra.Result) (gcra.Result, error) {
	if useClock {
		now = s.clock()
	}
	for _, sh := range c.locked {
		sh.observe(now)
	}
	for i := range c.ents {
		var e *entry
		var err error
		if hs != nil {
			e, err = c.sh[i].live(hs[i].e)
		} else {
			e, err = c.sh[i].find(checks[i].Key)
		}
		if err != nil {
			return gcra.Result{}, err
		}
		// Pinned, so that creating a later key in the same shard cannot
		// sweep it away.
		e.pinned = true
		c.ents[i] = e
		c.states[i] = e.state()
	}
	r, write, err := gcra.DecideAll(now, checks, c.states, c.next, out)
	if err != nil {
		return gcra.Result{}, wrap(err)
	}
	if write {
		for i, e := range c.ents {
			if c.next[i] != c.states[i] { // a peek (cost 0) writes nothing
				e.sh.put(e, c.next[i])
			}
		}
	}
	return r, nil
}

// lock locks the distinct shards of the checks in ascending index order.
func (c *composite) lock() {
	for _, sh := range c.sh {
		j := len(c.locked)
		for j > 0 && c.locked[j-1].index > sh.index {
			j--
		}
		if j > 0 && c.locked[j-1] == sh {
			continue
		}
		c.locked = c.locked[:len(c.locked)+1]
		for k := len(c.locked) - 1; k > j; k-- {
			c.locked[k] = c.locked[k-1]
		}
		c.locked[j] = sh
	}
	for _, sh := range c.locked {
		sh.mu.Lock()
	}
}

// unlock unpins the resolved entries and unlocks the shards.
func (c *composite) unlock() {
	for _, e := range c.ents {
		if e != nil {
			e.pinned = false
		}
	}
	for i := len(c.locked) - 1; i >= 0; i-- {
		c.locked[i].mu.Unlock()
	}
}
