package memnet

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/meridian-quota/meridian/gossip/protocol"
)

// The bucket's keys, as gossip.Transport names them below its cluster
// prefix: the KV is one cluster's.
const (
	keyHead     = "table.head"
	chunkPrefix = "table."
	maxChunks   = 1 << 16
)

func chunkKey(term, epoch uint64, i int) string {
	return chunkPrefix + strconv.FormatUint(term, 10) + "." + strconv.FormatUint(epoch, 10) + "." + strconv.Itoa(i)
}

type entry struct {
	value []byte
	rev   uint64
}

// bucket is the KV bucket: one revision sequence for all keys, as a
// JetStream stream has.
type bucket struct {
	keys      map[string]entry
	seq       uint64
	down      bool  // KVDown until KVUp
	downUntil int64 // KVOutage
}

func (b *bucket) put(key string, value []byte) uint64 {
	b.seq++
	b.keys[key] = entry{value: append([]byte(nil), value...), rev: b.seq}
	return b.seq
}

// KVOutage makes every KV operation fail with ErrUnavailable from now for
// d, and drops every watch (re-created by its watcher once the bucket is
// back).
func (n *Network) KVOutage(d time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	until := n.clock.Now() + micros(d)
	n.bucket.downUntil = max(n.bucket.downUntil, until)
	n.afterFaultLocked()
	n.atLocked(until, func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		n.afterFaultLocked()
	})
}

// KVDown starts an outage that lasts until KVUp.
func (n *Network) KVDown() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.bucket.down = true
	n.afterFaultLocked()
}

// KVUp ends KVDown's outage (not KVOutage's).
func (n *Network) KVUp() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.bucket.down = false
	n.afterFaultLocked()
}

// LoseBucket deletes the bucket and recreates it empty: every key is gone
// and the revision sequence restarts at 1; every watch drops (its watcher
// re-creates it and, as gossip.Transport, delivers no head until one
// passes the last revision it saw).
func (n *Network) LoseBucket() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.bucket.keys = map[string]entry{}
	n.bucket.seq = 0
	for _, w := range n.watches {
		n.dropWatchLocked(w)
	}
}

// DropWatches drops the table watches of agent a (Agent empty: of a
// region; the zero Addr: every watch), as a consumer lost without a
// reconnect; each watcher re-creates its watch at once.
func (n *Network) DropWatches(a Addr) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, w := range n.watches {
		if a == (Addr{}) || w.a.addr == a || a.Agent == "" && w.a.addr.Region == a.Region {
			n.dropWatchLocked(w)
		}
	}
}

// SetKVHome places the bucket in region: agents cut from it (either way)
// cannot reach the KV. Empty (the default): every connected agent can.
func (n *Network) SetKVHome(region string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.kvHome = region
	n.afterFaultLocked()
}

// kvUpLocked reports whether a can reach the bucket now.
func (n *Network) kvUpLocked(a *Agent) bool {
	b := &n.bucket
	if !a.upLocked() || b.down || b.downUntil > n.clock.Now() {
		return false
	}
	if h := n.kvHome; h != "" && a.addr.Region != h {
		home := Addr{Region: h}
		if n.cutLocked(a.addr, home) || n.cutLocked(home, a.addr) {
			return false
		}
	}
	return true
}

// kvStep is one KV round trip: op runs at the bucket, under n.mu. A
// best-effort step's failure does not fail the call.
type kvStep struct {
	what       string
	op         func(b *bucket) error
	bestEffort bool
}

// applyLocked runs one step at the bucket, now.
func (a *Agent) applyLocked(st kvStep) error {
	if !a.n.kvUpLocked(a) {
		a.count.KVErrors++
		return wrapErr(st.what, ErrUnavailable)
	}
	return wrapErr(st.what, st.op(&a.n.bucket))
}

// run runs steps in order, each after the agent's KV latency, failing
// with ErrUnavailable when the bucket cannot be reached then. Without
// latency it runs them at once, on the caller's goroutine. When ctx ends
// first, run returns its error and the step under way may still apply
// later: the outcome is unknown, as on NATS.
func (a *Agent) run(ctx context.Context, steps ...kvStep) error {
	n := a.n
	for _, st := range steps {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("memnet: %s: %w", st.what, err)
		}
		n.mu.Lock()
		lat := n.kvLatencyLocked(a.addr)
		if lat == 0 {
			err := a.applyLocked(st)
			n.mu.Unlock()
			if err != nil && !st.bestEffort {
				return err
			}
			continue
		}
		done := make(chan error, 1)
		n.afterLocked(lat, func() {
			n.mu.Lock()
			err := a.applyLocked(st)
			n.mu.Unlock()
			done <- err
		})
		n.mu.Unlock()
		select {
		case err := <-done:
			if err != nil && !st.bestEffort {
				return err
			}
		case <-ctx.Done():
			return fmt.Errorf("memnet: %s: %w", st.what, ctx.Err())
		}
	}
	return nil
}

// runAsync runs steps as run does, each after the agent's KV latency,
// entirely in the network's event context, and then calls done there
// (also without latency: done never runs before runAsync returns).
func (a *Agent) runAsync(done func(error), steps ...kvStep) {
	n := a.n
	if len(steps) == 0 {
		n.mu.Lock()
		n.afterLocked(0, func() { done(nil) })
		n.mu.Unlock()
		return
	}
	var next func(i int)
	next = func(i int) {
		if i == len(steps) {
			done(nil)
			return
		}
		n.mu.Lock()
		defer n.mu.Unlock()
		n.afterLocked(n.kvLatencyLocked(a.addr), func() {
			n.mu.Lock()
			err := a.applyLocked(steps[i])
			n.mu.Unlock()
			if err != nil && !steps[i].bestEffort {
				done(err)
				return
			}
			next(i + 1)
		})
	}
	next(0)
}

func wrapErr(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("memnet: %s: %w", what, err)
}

func (a *Agent) getStep(key string, out *entry) kvStep {
	return kvStep{what: "get " + key, op: func(b *bucket) error {
		a.count.KVGets++
		e, ok := b.keys[key]
		if !ok {
			return protocol.ErrNotFound
		}
		*out = entry{value: append([]byte(nil), e.value...), rev: e.rev}
		return nil
	}}
}

func (a *Agent) createStep(key string, value []byte, rev *uint64) kvStep {
	return kvStep{what: "create " + key, op: func(b *bucket) error {
		a.count.KVPuts++
		if _, ok := b.keys[key]; ok {
			return protocol.ErrConflict
		}
		*rev = b.put(key, value)
		a.n.headWrittenLocked(key, value, *rev)
		return nil
	}}
}

func (a *Agent) updateStep(key string, value []byte, prev uint64, rev *uint64) kvStep {
	return kvStep{what: "update " + key, op: func(b *bucket) error {
		a.count.KVPuts++
		e, ok := b.keys[key]
		if ok && e.rev != prev || !ok && prev != 0 {
			return protocol.ErrConflict
		}
		*rev = b.put(key, value)
		a.n.headWrittenLocked(key, value, *rev)
		return nil
	}}
}

// Get returns key's value and revision; ErrNotFound (wrapped) when absent.
func (a *Agent) Get(ctx context.Context, key string) (value []byte, rev uint64, err error) {
	var e entry
	err = a.run(ctx, a.getStep(key, &e))
	return e.value, e.rev, err
}

// Create writes key only when absent; ErrConflict (wrapped) otherwise.
func (a *Agent) Create(ctx context.Context, key string, value []byte) (rev uint64, err error) {
	err = a.run(ctx, a.createStep(key, value, &rev))
	return rev, err
}

// Update writes key only when its revision is rev (rev 0: when absent, as
// JetStream's expected-last-subject-sequence 0 does); ErrConflict
// (wrapped) otherwise.
func (a *Agent) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	var nrev uint64
	err := a.run(ctx, a.updateStep(key, value, rev, &nrev))
	return nrev, err
}

// GetAsync is Get without blocking: done runs in the network's event
// context once the call completes (see the package doc) — for a
// simulator that runs everything on the goroutine advancing a
// VirtualClock. So are CreateAsync, UpdateAsync, StoreTableAsync,
// LatestTableAsync and FetchChunksAsync.
func (a *Agent) GetAsync(key string, done func(value []byte, rev uint64, err error)) {
	var e entry
	a.runAsync(func(err error) { done(e.value, e.rev, err) }, a.getStep(key, &e))
}

// CreateAsync is Create without blocking (see GetAsync).
func (a *Agent) CreateAsync(key string, value []byte, done func(rev uint64, err error)) {
	var rev uint64
	a.runAsync(func(err error) { done(rev, err) }, a.createStep(key, value, &rev))
}

// UpdateAsync is Update without blocking (see GetAsync).
func (a *Agent) UpdateAsync(key string, value []byte, prev uint64, done func(rev uint64, err error)) {
	var rev uint64
	a.runAsync(func(err error) { done(rev, err) }, a.updateStep(key, value, prev, &rev))
}

// storeSteps are StoreTable's round trips: chunks 1…, the head's
// compare-and-set, the purge.
func (a *Agent) storeSteps(prev, term, epoch uint64, chunks [][]byte, rev *uint64) []kvStep {
	var steps []kvStep
	for i := 1; i < len(chunks); i++ {
		steps = append(steps, kvStep{what: fmt.Sprintf("store table %d.%d chunk %d", term, epoch, i), op: func(b *bucket) error {
			a.count.KVPuts++
			b.put(chunkKey(term, epoch, i), chunks[i])
			return nil
		}})
	}
	steps = append(steps, kvStep{what: fmt.Sprintf("store table %d.%d head", term, epoch), op: func(b *bucket) error {
		a.count.KVPuts++
		e, ok := b.keys[keyHead]
		if prev == 0 && ok || prev != 0 && (!ok || e.rev != prev) {
			return fmt.Errorf("%w (term %d epoch %d on revision %d)", protocol.ErrFenced, term, epoch, prev)
		}
		*rev = b.put(keyHead, chunks[0])
		a.n.headWrittenLocked(keyHead, chunks[0], *rev)
		return nil
	}})
	return append(steps, kvStep{what: "purge old tables", bestEffort: true, op: func(b *bucket) error {
		purgeOld(b, tableID{term, epoch})
		return nil
	}})
}

func checkChunks(what string, count int) error {
	if count < 1 || count > maxChunks {
		return fmt.Errorf("memnet: %s: %d chunks: want 1..%d", what, count, maxChunks)
	}
	return nil
}

// StoreTable writes chunks[1:] (one KV write each), then compare-and-sets
// the head on revision prev (0: no head yet) — ErrFenced (wrapped) when it
// moved — and then purges, best effort, the chunks of every table older
// than the one the head replaced, as gossip.Transport does. A failure
// between the writes leaves the chunks written and the head as it was.
func (a *Agent) StoreTable(ctx context.Context, prev uint64, term, epoch uint64, chunks [][]byte) (uint64, error) {
	if err := checkChunks("store table", len(chunks)); err != nil {
		return 0, err
	}
	var rev uint64
	if err := a.run(ctx, a.storeSteps(prev, term, epoch, chunks, &rev)...); err != nil {
		return 0, err
	}
	return rev, nil
}

// StoreTableAsync is StoreTable without blocking (see GetAsync).
func (a *Agent) StoreTableAsync(prev uint64, term, epoch uint64, chunks [][]byte, done func(rev uint64, err error)) {
	if err := checkChunks("store table", len(chunks)); err != nil {
		a.runAsync(func(error) { done(0, err) })
		return
	}
	var rev uint64
	a.runAsync(func(err error) {
		if err != nil {
			rev = 0
		}
		done(rev, err)
	}, a.storeSteps(prev, term, epoch, chunks, &rev)...)
}

type tableID struct{ term, epoch uint64 }

func (a tableID) less(b tableID) bool {
	return a.term < b.term || a.term == b.term && a.epoch < b.epoch
}

// purgeOld deletes the chunks of every table older than cur's predecessor
// (the newest table below cur). Deleting uses no revision, as a stream
// purge by subject does not.
func purgeOld(b *bucket, cur tableID) {
	ids := map[string]tableID{}
	var prev tableID
	for k := range b.keys {
		f := strings.Split(strings.TrimPrefix(k, chunkPrefix), ".")
		if !strings.HasPrefix(k, chunkPrefix) || len(f) != 3 {
			continue
		}
		t, err1 := strconv.ParseUint(f[0], 10, 64)
		e, err2 := strconv.ParseUint(f[1], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		id := tableID{t, e}
		ids[k] = id
		if id.less(cur) && prev.less(id) {
			prev = id
		}
	}
	for k, id := range ids {
		if id.less(prev) {
			delete(b.keys, k)
		}
	}
}

// LatestTable returns the head and its revision; ok false when there is
// none.
func (a *Agent) LatestTable(ctx context.Context) (head []byte, rev uint64, ok bool, err error) {
	var e entry
	return latest(e, a.run(ctx, a.getStep(keyHead, &e)))
}

// LatestTableAsync is LatestTable without blocking (see GetAsync).
func (a *Agent) LatestTableAsync(done func(head []byte, rev uint64, ok bool, err error)) {
	var e entry
	a.runAsync(func(err error) { done(latest(e, err)) }, a.getStep(keyHead, &e))
}

func latest(e entry, err error) ([]byte, uint64, bool, error) {
	if errors.Is(err, protocol.ErrNotFound) {
		return nil, 0, false, nil
	}
	if err != nil {
		return nil, 0, false, err
	}
	return e.value, e.rev, true, nil
}

// errNoChunk is FetchChunks's error for a chunk that is not there.
var errNoChunk = errors.New("no such chunk: purged, or never written")

// fetchSteps read chunks 1 … count-1 into out.
func (a *Agent) fetchSteps(term, epoch uint64, count int, out [][]byte) []kvStep {
	steps := make([]kvStep, 0, count-1)
	for i := 1; i < count; i++ {
		key := chunkKey(term, epoch, i)
		steps = append(steps, kvStep{what: fmt.Sprintf("fetch table %d.%d chunk %d of %d", term, epoch, i, count), op: func(b *bucket) error {
			a.count.KVGets++
			e, ok := b.keys[key]
			if !ok {
				// Not ErrNotFound: gossip.Transport's is jetstream's,
				// which the protocol cannot tell from other failures
				// either.
				return errNoChunk
			}
			out[i-1] = append([]byte(nil), e.value...)
			return nil
		}})
	}
	return steps
}

// FetchChunks returns chunks 1 … count-1 of table (term, epoch); a missing
// chunk (purged two tables later) is an error — a plain one, as on NATS:
// read the head again.
func (a *Agent) FetchChunks(ctx context.Context, term, epoch uint64, count int) ([][]byte, error) {
	what := fmt.Sprintf("fetch table %d.%d", term, epoch)
	if err := checkChunks(what, count); err != nil {
		return nil, err
	}
	out := make([][]byte, count-1)
	if err := a.run(ctx, a.fetchSteps(term, epoch, count, out)...); err != nil {
		return nil, err
	}
	return out, nil
}

// FetchChunksAsync is FetchChunks without blocking (see GetAsync).
func (a *Agent) FetchChunksAsync(term, epoch uint64, count int, done func(chunks [][]byte, err error)) {
	what := fmt.Sprintf("fetch table %d.%d", term, epoch)
	if err := checkChunks(what, count); err != nil {
		a.runAsync(func(error) { done(nil, err) })
		return
	}
	out := make([][]byte, count-1)
	a.runAsync(func(err error) {
		if err != nil {
			out = nil
		}
		done(out, err)
	}, a.fetchSteps(term, epoch, count, out)...)
}

// watch is one table watcher: a KV watch of the head while active, and
// the loop around it that re-creates it, resyncs and dedups, deciding
// through protocol's HeadOrder and WatchTimer as
// gossip.Transport.WatchTables does through HeadWatch.
type watch struct {
	a *Agent

	// Guarded by n.mu.
	active  bool
	gen     uint64 // bumped when the watch is created or dropped
	attempt uint64 // the create attempt that counts
	timer   protocol.WatchTimer

	mu      sync.Mutex // held while fn runs
	fn      func([]byte, uint64)
	order   protocol.HeadOrder
	stopped bool
}

// watchConfig is the protocol's form of c's watch timing.
func (c Config) watchConfig() protocol.WatchConfig {
	return protocol.WatchConfig{Resync: c.WatchResync, RetryMin: c.WatchRetryMin, RetryMax: c.WatchRetryMax}
}

// WatchHeads calls fn with the current head, if any, once its watch is up
// (after the agent's KV latency), and then with every newer head, in
// strictly increasing revisions, never one twice, in the network's event
// context (see the package doc) — WatchTables's semantics without a
// goroutine, for the simulator. A dropped watch is re-created at once and
// then with backoff (Config.WatchRetryMin … WatchRetryMax) while the
// bucket cannot be reached; re-created, it delivers the current head
// again, unless it is the last delivered (a recreated bucket's lower
// revision included: protocol.HeadOrder.Rewatch). While up it rereads
// the head every Config.WatchResync. stop ends it and waits for a running
// fn; it must not be called from fn.
func (a *Agent) WatchHeads(fn func(head []byte, rev uint64)) (stop func()) {
	n := a.n
	w := &watch{a: a, fn: fn, timer: protocol.NewWatchTimer(n.cfg.watchConfig())}
	n.mu.Lock()
	n.watches = append(n.watches, w)
	n.scheduleCreateLocked(w, 0)
	n.mu.Unlock()
	return func() {
		w.mu.Lock()
		w.stopped = true
		w.mu.Unlock()
		n.mu.Lock()
		if i := indexOf(n.watches, w); i >= 0 {
			n.watches = append(n.watches[:i:i], n.watches[i+1:]...)
		}
		w.active = false
		w.attempt++
		n.mu.Unlock()
	}
}

// WatchTables is protocol.TableStore's watch: WatchHeads with fn called on
// the caller's goroutine, until ctx ends (it then returns nil).
func (a *Agent) WatchTables(ctx context.Context, fn func(head []byte, rev uint64)) error {
	type item struct {
		head []byte
		rev  uint64
	}
	var (
		mu    sync.Mutex
		queue []item
		sig   = make(chan struct{}, 1)
	)
	stop := a.WatchHeads(func(head []byte, rev uint64) {
		mu.Lock()
		queue = append(queue, item{head, rev})
		mu.Unlock()
		select {
		case sig <- struct{}{}:
		default:
		}
	})
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-sig:
		}
		mu.Lock()
		batch := queue
		queue = nil
		mu.Unlock()
		for _, it := range batch {
			if ctx.Err() != nil {
				return nil
			}
			fn(it.head, it.rev)
		}
	}
}

func (w *watch) offer(head []byte, rev uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped || !w.order.Seen(rev) {
		return
	}
	w.fn(append([]byte(nil), head...), rev)
}

// scheduleCreateLocked tries to create w's watch after delay plus the
// agent's KV latency; a later attempt supersedes it.
func (n *Network) scheduleCreateLocked(w *watch, delay time.Duration) {
	w.attempt++
	att := w.attempt
	n.afterLocked(delay+n.kvLatencyLocked(w.a.addr), func() { n.createWatch(w, att) })
}

func (n *Network) createWatch(w *watch, att uint64) {
	n.mu.Lock()
	if w.attempt != att || w.active || indexOf(n.watches, w) < 0 {
		n.mu.Unlock()
		return
	}
	if !n.kvUpLocked(w.a) {
		w.a.count.KVErrors++
		now := n.clock.Now()
		n.scheduleCreateLocked(w, time.Duration(w.timer.Failed(now)-now)*time.Microsecond)
		n.mu.Unlock()
		return
	}
	w.active = true
	w.gen++
	w.a.count.KVWatches++
	n.scheduleResyncLocked(w, w.timer.Up(n.clock.Now()))
	e, ok := n.bucket.keys[keyHead]
	n.mu.Unlock()
	w.mu.Lock()
	w.order.Rewatch() // its first head is the current one, whatever its revision
	w.mu.Unlock()
	if ok {
		w.offer(e.value, e.rev)
	}
}

// scheduleResyncLocked has w reread the head at instant at while the
// watch is up, and then on w.timer's schedule.
func (n *Network) scheduleResyncLocked(w *watch, at int64) {
	g := w.gen
	n.atLocked(at, func() {
		n.mu.Lock()
		if !w.active || w.gen != g {
			n.mu.Unlock()
			return
		}
		w.a.count.KVGets++
		n.scheduleResyncLocked(w, w.timer.NextResync(n.clock.Now()))
		e, ok := n.bucket.keys[keyHead]
		n.mu.Unlock()
		if ok {
			w.offer(e.value, e.rev)
		}
	})
}

// dropWatchLocked ends w's watch (if up) and has it re-created at once.
func (n *Network) dropWatchLocked(w *watch) {
	if !w.active {
		return
	}
	w.active = false
	w.gen++
	n.scheduleCreateLocked(w, 0)
}

// refreshWatchesLocked drops the watches of agents that lost the bucket
// and re-creates at once, backoff reset, those that can reach it again.
func (n *Network) refreshWatchesLocked() {
	for _, w := range n.watches {
		up := n.kvUpLocked(w.a)
		switch {
		case w.active && !up:
			n.dropWatchLocked(w)
		case !w.active && up:
			w.timer.Reset()
			n.scheduleCreateLocked(w, 0)
		}
	}
}

// headWrittenLocked pushes a new head to every active watch, each after
// its agent's KV latency.
func (n *Network) headWrittenLocked(key string, value []byte, rev uint64) {
	if key != keyHead {
		return
	}
	v := append([]byte(nil), value...)
	for _, w := range n.watches {
		if !w.active {
			continue
		}
		g := w.gen
		n.afterLocked(n.kvLatencyLocked(w.a.addr), func() {
			n.mu.Lock()
			ok := w.active && w.gen == g
			n.mu.Unlock()
			if ok {
				w.offer(v, rev)
			}
		})
	}
}
