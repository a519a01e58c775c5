package redisstore

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

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
// ops it carries run in the order they were queued. An op uses its first
// key's lane.
type lane struct {
	mu      sync.Mutex
	pending []*op
	busy    bool          // a script call of this lane is being built or is in flight
	call    atomic.Uint64 // the lane's latest script call (Store.calls): what a queued op waits on
	parked  bool          // the lane's runner waits on wake for the next queue
	wake    chan struct{} // capacity 1: release hands the queue to a parked runner
}

func newLane() *lane { return &lane{wake: make(chan struct{}, 1)} }

type laneSet struct {
	fixed []lane                         // single node / Sentinel: by slot mod len
	slots [numSlots]atomic.Pointer[lane] // Cluster: one lane per slot, made on first use
}

func (ls *laneSet) init(cluster bool, n int) {
	if !cluster {
		ls.fixed = make([]lane, n)
		for i := range ls.fixed {
			ls.fixed[i].wake = make(chan struct{}, 1)
		}
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
	p.CompareAndSwap(nil, newLane())
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
	if s.cfg.WriteFormat == FormatPacked {
		packedLimits(o.checks)
	}
	o.keys = o.keys[:0]
	if cap(o.res) < len(checks) {
		o.res = make([]gcra.Result, len(checks))
	}
	o.res = o.res[:len(checks)]
	clear(o.res)
	o.state.Store(opQueued)
	// The op goes to its first key's lane. On a Cluster every key of a
	// composite must be in that slot (one script call runs on one node);
	// a single node or Sentinel has no slots, so a composite of any keys
	// runs there in one call, atomically.
	var slot uint16
	for i := range checks {
		k := s.RedisKey(checks[i].Key)
		if i == 0 {
			slot = keySlot(k)
		} else if s.cluster && keySlot(k) != slot {
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
		call := s.nextCall(l)
		l.mu.Unlock()
		o.state.Store(opTaken)
		s.exec(ctx, []*op{o}, call)
		s.release(l)
	} else {
		l.pending = append(l.pending, o)
		l.mu.Unlock()
		select {
		case <-o.done:
		case <-ctx.Done():
			// Abandon: a queued op is skipped; a taken one is answered
			// into its own buffers and left to the garbage collector.
			// The store held it: it waited on the lane's call in flight,
			// whose round trip is what failed to answer in time.
			o.state.CompareAndSwap(opQueued, opAbandoned)
			return &RoundTripError{Call: l.call.Load(), Err: ctx.Err()}
		}
	}
	err := o.err
	if err == nil {
		copy(out, o.res)
	}
	opPool.Put(o)
	return err
}

// release ends a caller's inline call: if others queued meanwhile, the
// lane's runner drains them (woken if parked, started if not); otherwise the
// lane goes idle.
func (s *Store) release(l *lane) {
	l.mu.Lock()
	if len(l.pending) == 0 {
		l.busy = false
		l.mu.Unlock()
		return
	}
	if l.parked {
		l.parked = false
		l.mu.Unlock()
		l.wake <- struct{}{}
		return
	}
	l.mu.Unlock()
	go s.runner(l)
}

// runnerLinger is how long a lane's runner stays parked for the next queue
// before its goroutine ends. Under steady load the runner lives on and its
// stack, grown through go-redis once, is reused: a fresh goroutine per
// queue spent a few percent of the agent's CPU growing stacks. An idle
// store holds no goroutines once it has lingered (the store has no Close).
const runnerLinger = 50 * time.Millisecond

// runner drains the lane, parks, and drains again each time release hands
// it a queue, until it has been parked for runnerLinger. At most one runner
// holds a lane: one is started only when none is parked, and a parked one
// that times out leaves only if no release has claimed it meanwhile.
func (s *Store) runner(l *lane) {
	batch := make([]*op, 0, s.cfg.MaxBatch)
	t := time.NewTimer(runnerLinger)
	defer t.Stop()
	for {
		batch = s.drain(l, batch)
		t.Reset(runnerLinger)
		select {
		case <-l.wake:
		case <-t.C:
			l.mu.Lock()
			if l.parked {
				l.parked = false
				l.mu.Unlock()
				return
			}
			l.mu.Unlock()
			<-l.wake // claimed just now: the hand-over is on its way
		}
	}
}

// drain sends the lane's queued ops, up to MaxBatch per script call, until
// the queue is empty; then it parks the runner and leaves the lane idle.
func (s *Store) drain(l *lane, batch []*op) []*op {
	for {
		l.mu.Lock()
		if len(l.pending) == 0 {
			l.busy = false
			l.parked = true
			l.mu.Unlock()
			clear(batch[:cap(batch)])
			return batch[:0]
		}
		// Up to MaxBatch checks per call (a composite counts each of its
		// checks, and always goes whole), which also keeps every schedule
		// index the script sees below 2^10.
		batch = batch[:0]
		n, checks := 0, 0
		for _, o := range l.pending {
			if len(batch) > 0 && checks+len(o.checks) > s.cfg.MaxBatch {
				break
			}
			n++
			if o.state.CompareAndSwap(opQueued, opTaken) {
				batch = append(batch, o)
				checks += len(o.checks)
			}
		}
		rest := copy(l.pending, l.pending[n:])
		clear(l.pending[rest:])
		l.pending = l.pending[:rest]
		if len(batch) == 0 {
			l.mu.Unlock()
			continue
		}
		call := s.nextCall(l)
		l.mu.Unlock()
		s.exec(context.Background(), batch, call)
		for _, o := range batch {
			o.done <- struct{}{}
		}
		if len(batch) > 1 {
			s.regroup(l, len(batch))
		}
	}
}

// regroupWait bounds how long drain waits for the callers it just answered
// to come back with their next decision.
const regroupWait = 20 * time.Microsecond

// regroup gives the callers just answered a moment to queue their next
// decisions before the next script call goes out. Without it, batching
// phase-locks under closed-loop load: the first caller back would go out
// alone and the rest would queue behind it, so batches alternate between
// one op and all the others, and every call pays Redis's fixed cost for
// little work. It yields rather than sleeps, and stops as soon as the queue
// is as long as the batch just sent, or after regroupWait.
func (s *Store) regroup(l *lane, want int) {
	deadline := time.Now().Add(regroupWait)
	for {
		l.mu.Lock()
		n := len(l.pending)
		l.mu.Unlock()
		if n >= want || n >= s.cfg.MaxBatch || time.Now().After(deadline) {
			return
		}
		runtime.Gosched()
	}
}

// opWord packs what the script needs of one check into one integer below
// 2^53 (see gcra.lua): (index·4 + kind)·2^40 + cost. A cost above 2^39
// exceeds every Burst (gcra.MaxBurst), so capping it keeps the decision
// (too large) and the packing exact.
func opWord(kind opKind, index int, cost int64) int64 {
	return (int64(index)*4+int64(kind))<<40 + min(cost, 1<<39)
}

// scratch is one script call's working memory, pooled: exec builds the
// batch in it and parses the reply into it, so a call allocates little
// beyond what go-redis does.
type scratch struct {
	scheds []*gcra.Schedule
	idx    []int
	keys   []string
	batch  []byte
	args   [4]any
	vals   []int64
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// nextCall numbers the next script call of lane l.
func (s *Store) nextCall(l *lane) uint64 {
	id := s.calls.Add(1)
	l.call.Store(id)
	return id
}

// exec sends ops as script call number call and stores each op's answer.
func (s *Store) exec(ctx context.Context, ops []*op, call uint64) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	sc := scratchPool.Get().(*scratch)
	defer func() {
		// Drop references into the ops and the reply before pooling.
		clear(sc.scheds)
		clear(sc.keys)
		sc.args = [4]any{}
		scratchPool.Put(sc)
	}()
	nvals := 0
	scheds, idx, keys := sc.scheds[:0], sc.idx[:0], sc.keys[:0]
	// Many checks share a schedule (one policy limit, one share): send each
	// distinct schedule once and refer to it by index.
	for _, o := range ops {
		nvals += len(o.checks) * replyWidth(o.kind)
		keys = append(keys, o.keys...)
		for i := range o.checks {
			sch := &o.checks[i].Schedule
			j := -1
			for k := max(0, len(scheds)-16); k < len(scheds); k++ { // bounded: a batch of distinct limits stays linear
				if *scheds[k] == *sch {
					j = k
					break
				}
			}
			if j < 0 {
				j = len(scheds)
				scheds = append(scheds, sch)
			}
			idx = append(idx, j+1)
		}
	}
	sc.scheds, sc.idx, sc.keys = scheds, idx, keys
	// The batch: one string of big-endian 64-bit integers (see gcra.lua).
	b := appendInt(sc.batch[:0], int64(len(ops)))
	b = appendInt(b, int64(len(scheds)))
	fenced := false
	for _, sch := range scheds {
		b = appendSchedule(b, sch, !s.cluster)
		fenced = fenced || (!s.cluster && !sch.Fence.IsZero())
	}
	fence := ""
	if fenced {
		keys = append(keys, s.fenceKey)
		sc.keys = keys
		fence = "1"
	}
	for _, o := range ops {
		if o.kind == opComposite {
			b = appendInt(b, opWord(opComposite, 0, int64(len(o.checks))))
			for i := range o.checks {
				b = appendInt(b, opWord(0, idx[i], o.checks[i].Cost))
			}
		} else {
			b = appendInt(b, opWord(o.kind, idx[0], o.checks[0].Cost))
			if o.kind == opReserve {
				b = appendInt(b, o.maxWait)
			}
		}
		idx = idx[len(o.checks):]
	}
	sc.batch = b
	// go-redis writes the arguments out before Run returns, so the batch
	// buffer can be reused by the next call.
	sc.args[0], sc.args[1], sc.args[2], sc.args[3] = s.testNow, b, s.format, fence
	reply, err := s.script.Run(ctx, s.c, keys, sc.args[:]...).Result()
	var vals []int64
	if err == nil {
		if vals, err = replyInts(reply, nvals, sc.vals[:0]); err == nil {
			sc.vals = vals[:0]
		}
	}
	if err != nil {
		err = &RoundTripError{Call: call, Err: fmt.Errorf("redisstore: eval gcra: %w", err)}
		for _, o := range ops {
			o.err = err
		}
		return
	}
	for _, o := range ops {
		w := replyWidth(o.kind)
		for i := range o.checks {
			r, derr := decode(vals[:w], &o.checks[i])
			vals = vals[w:]
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
