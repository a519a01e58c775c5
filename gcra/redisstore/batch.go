package redisstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/meridian-quota/meridian/gcra"
)

type opKind uint8

const (
	opDecide    opKind = 1
	opReserve   opKind = 2
	opComposite opKind = 3
)

const (
	opQueued int32 = iota
	opTaken
	opAbandoned
)

// op is one decision on its way through a lane. Its caller owns it until it
// is queued; then the lane's runner fills res/err and signals done. A caller
// whose context ends first abandons it: a queued op is then skipped, a taken
// one is answered into its own buffers and dropped (never pooled again).
type op struct {
	kind    opKind
	maxWait int64
	checks  []gcra.Check
	keys    []string
	res     []gcra.Result
	err     error
	state   atomic.Int32
	done    chan struct{}
}

var opPool = sync.Pool{New: func() any { return &op{done: make(chan struct{}, 1)} }}

// lane is one queue of ops with at most one script call in flight, so the
// ops of one key run in the order they were submitted.
type lane struct {
	mu      sync.Mutex
	pending []*op
	busy    bool
}

type laneSet struct {
	fixed []lane                         // single node / Sentinel: by slot mod len
	slots [numSlots]atomic.Pointer[lane] // Cluster: one lane per slot, made on first use
}

func (ls *laneSet) init(cluster bool, n int) {
	if !cluster {
		ls.fixed = make([]lane, n)
	}
}

func (ls *laneSet) get(slot uint16) *lane {
	if ls.fixed != nil {
		return &ls.fixed[int(slot)%len(ls.fixed)]
	}
	p := &ls.slots[slot]
	if l := p.Load(); l != nil {
		return l
	}
	p.CompareAndSwap(nil, &lane{})
	return p.Load()
}

// run validates an op, routes it to its lane and waits for its answer.
func (s *Store) run(ctx context.Context, kind opKind, checks []gcra.Check, maxWait int64, out []gcra.Result) error {
	if err := validate(checks); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	o := opPool.Get().(*op)
	o.kind, o.maxWait, o.err = kind, maxWait, nil
	o.checks = append(o.checks[:0], checks...)
	o.keys = o.keys[:0]
	if cap(o.res) < len(checks) {
		o.res = make([]gcra.Result, len(checks))
	}
	o.res = o.res[:len(checks)]
	clear(o.res)
	o.state.Store(opQueued)
	var slot uint16
	for i := range checks {
		k := s.RedisKey(checks[i].Key)
		sl := keySlot(k)
		if i == 0 {
			slot = sl
		} else if sl != slot {
			opPool.Put(o)
			if checks[0].Key.Tag == "" || checks[i].Key.Tag == "" {
				return fmt.Errorf("%w: keys %q and %q: a key with an empty Tag hashes by its whole name, so a composite needs one non-empty Tag on every key",
					ErrCrossSlot, checks[0].Key.Name, checks[i].Key.Name)
			}
			return fmt.Errorf("%w: tags %q and %q", ErrCrossSlot, checks[0].Key.Tag, checks[i].Key.Tag)
		}
		o.keys = append(o.keys, k)
	}

	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		opPool.Put(o)
		return ctx.Err()
	}
	defer func() { <-s.sem }()

	l := s.lanes.get(slot)
	l.mu.Lock()
	if !l.busy {
		// Nothing in flight: go now, alone, on the caller's goroutine.
		l.busy = true
		l.mu.Unlock()
		o.state.Store(opTaken)
		s.exec(ctx, []*op{o})
		s.release(l)
	} else {
		l.pending = append(l.pending, o)
		l.mu.Unlock()
		select {
		case <-o.done:
		case <-ctx.Done():
			// Abandon: a queued op is skipped; a taken one is answered
			// into its own buffers and left to the garbage collector.
			o.state.CompareAndSwap(opQueued, opAbandoned)
			return ctx.Err()
		}
	}
	err := o.err
	if err == nil {
		copy(out, o.res)
	}
	opPool.Put(o)
	return err
}

// release ends a caller's inline call: if others queued meanwhile, a runner
// goroutine drains the lane; otherwise the lane goes idle.
func (s *Store) release(l *lane) {
	l.mu.Lock()
	if len(l.pending) == 0 {
		l.busy = false
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	go s.drain(l)
}

// drain sends the lane's queued ops, up to MaxBatch per script call, until
// the queue is empty.
func (s *Store) drain(l *lane) {
	batch := make([]*op, 0, s.cfg.MaxBatch)
	for {
		l.mu.Lock()
		if len(l.pending) == 0 {
			l.busy = false
			l.mu.Unlock()
			return
		}
		n := min(len(l.pending), s.cfg.MaxBatch)
		batch = batch[:0]
		for _, o := range l.pending[:n] {
			if o.state.CompareAndSwap(opQueued, opTaken) {
				batch = append(batch, o)
			}
		}
		rest := copy(l.pending, l.pending[n:])
		clear(l.pending[rest:])
		l.pending = l.pending[:rest]
		l.mu.Unlock()
		if len(batch) == 0 {
			continue
		}
		s.exec(context.Background(), batch)
		for _, o := range batch {
			o.done <- struct{}{}
		}
	}
}

// exec sends ops as one script call and stores each op's answer.
func (s *Store) exec(ctx context.Context, ops []*op) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	nchecks := 0
	for _, o := range ops {
		nchecks += len(o.checks)
	}
	keys := make([]string, 0, nchecks)
	args := make([]any, 0, 2+len(ops)*3+nchecks*10)
	args = append(args, s.testNow, len(ops))
	for _, o := range ops {
		keys = append(keys, o.keys...)
		args = append(args, int(o.kind))
		switch o.kind {
		case opReserve:
			args = append(args, o.maxWait)
		case opComposite:
			args = append(args, len(o.checks))
		}
		for i := range o.checks {
			args = appendCheck(args, &o.checks[i])
		}
	}
	reply, err := script.Run(ctx, s.c, keys, args...).Result()
	var vals []int64
	if err == nil {
		vals, err = replyInts(reply, 6*nchecks, make([]int64, 0, 6*nchecks))
	}
	if err != nil {
		err = fmt.Errorf("redisstore: eval gcra: %w", err)
		for _, o := range ops {
			o.err = err
		}
		return
	}
	for _, o := range ops {
		for i := range o.checks {
			r, derr := decode(vals[:6], &o.checks[i])
			vals = vals[6:]
			if derr != nil && (o.err == nil || o.err == errNotDecided) {
				o.err = derr
			}
			o.res[i] = r
		}
		if o.err == errNotDecided {
			o.err = fmt.Errorf("%w: code 4 (not decided) without a malformed check", ErrReply)
		}
	}
}
