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

// kvOp runs op (under n.mu) after the agent's KV latency, failing with
// ErrUnavailable when the bucket cannot be reached then. When ctx ends
// first, kvOp returns its error and op may still run later: the outcome is
// unknown, as on NATS.
func (a *Agent) kvOp(ctx context.Context, what string, op func(b *bucket) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memnet: %s: %w", what, err)
	}
	n := a.n
	apply := func() error {
		if !n.kvUpLocked(a) {
			a.count.KVErrors++
			return ErrUnavailable
		}
		return op(&n.bucket)
	}
	n.mu.Lock()
	lat := n.kvLatencyLocked(a.addr)
	if lat == 0 {
		err := apply()
		n.mu.Unlock()
		return wrapErr(what, err)
	}
	done := make(chan error, 1)
	n.afterLocked(lat, func() {
		n.mu.Lock()
		err := apply()
		n.mu.Unlock()
		done <- err
	})
	n.mu.Unlock()
	select {
	case err := <-done:
		return wrapErr(what, err)
	case <-ctx.Done():
		return fmt.Errorf("memnet: %s: %w", what, ctx.Err())
	}
}

func wrapErr(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("memnet: %s: %w", what, err)
}

// Get returns key's value and revision; ErrNotFound (wrapped) when absent.
func (a *Agent) Get(ctx context.Context, key string) (value []byte, rev uint64, err error) {
	err = a.kvOp(ctx, "get "+key, func(b *bucket) error {
		a.count.KVGets++
		e, ok := b.keys[key]
		if !ok {
			return protocol.ErrNotFound
		}
		value, rev = append([]byte(nil), e.value...), e.rev
		return nil
	})
	return value, rev, err
}

// Create writes key only when absent; ErrConflict (wrapped) otherwise.
func (a *Agent) Create(ctx context.Context, key string, value []byte) (rev uint64, err error) {
	err = a.kvOp(ctx, "create "+key, func(b *bucket) error {
		a.count.KVPuts++
		if _, ok := b.keys[key]; ok {
			return protocol.ErrConflict
		}
		rev = b.put(key, value)
		a.n.headWrittenLocked(key, value, rev)
		return nil
	})
	return rev, err
}

// Update writes key only when its revision is rev (rev 0: when absent, as
// JetStream's expected-last-subject-sequence 0); ErrConflict (wrapped)
// otherwise.
func (a *Agent) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	var nrev uint64
	err := a.kvOp(ctx, "update "+key, func(b *bucket) error {
		a.count.KVPuts++
		e, ok := b.keys[key]
		if ok && e.rev != rev || !ok && rev != 0 {
			return protocol.ErrConflict
		}
		nrev = b.put(key, value)
		a.n.headWrittenLocked(key, value, nrev)
		return nil
	})
	return nrev, err
}

// StoreTable writes chunks[1:] (one KV write each), then compare-and-sets
// the head on revision prev (0: no head yet) — ErrFenced (wrapped) when it
// moved — and then purges the chunks of every table older than the one
// the head replaced, as gossip.Transport does. A failure between the
// writes leaves the chunks written and the head as it was.
func (a *Agent) StoreTable(ctx context.Context, prev uint64, term, epoch uint64, chunks [][]byte) (uint64, error) {
	if len(chunks) == 0 || len(chunks) > maxChunks {
		return 0, fmt.Errorf("memnet: store table: %d chunks: want 1..%d", len(chunks), maxChunks)
	}
	for i := 1; i < len(chunks); i++ {
		err := a.kvOp(ctx, fmt.Sprintf("store table %d.%d chunk %d", term, epoch, i), func(b *bucket) error {
			a.count.KVPuts++
			b.put(chunkKey(term, epoch, i), chunks[i])
			return nil
		})
		if err != nil {
			return 0, err
		}
	}
	var rev uint64
	err := a.kvOp(ctx, fmt.Sprintf("store table %d.%d head", term, epoch), func(b *bucket) error {
		a.count.KVPuts++
		e, ok := b.keys[keyHead]
		if prev == 0 && ok || prev != 0 && (!ok || e.rev != prev) {
			return protocol.ErrFenced
		}
		rev = b.put(keyHead, chunks[0])
		a.n.headWrittenLocked(keyHead, chunks[0], rev)
		return nil
	})
	if errors.Is(err, protocol.ErrFenced) {
		return 0, fmt.Errorf("%w (term %d epoch %d on revision %d)", protocol.ErrFenced, term, epoch, prev)
	}
	if err != nil {
		return 0, err
	}
	_ = a.kvOp(ctx, "purge old tables", func(b *bucket) error { // best effort, as on NATS
		purgeOld(b, tableID{term, epoch})
		return nil
	})
	return rev, nil
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
	head, rev, err = a.Get(ctx, keyHead)
	if errors.Is(err, protocol.ErrNotFound) {
		return nil, 0, false, nil
	}
	if err != nil {
		return nil, 0, false, err
	}
	return head, rev, true, nil
}

// errNoChunk is FetchChunks's error for a chunk that is not there.
var errNoChunk = errors.New("no such chunk: purged, or never written")

// FetchChunks returns chunks 1 … count-1 of table (term, epoch); a missing
// chunk (purged two tables later) is an error — a plain one, as on NATS:
// read the head again.
func (a *Agent) FetchChunks(ctx context.Context, term, epoch uint64, count int) ([][]byte, error) {
	if count < 1 || count > maxChunks {
		return nil, fmt.Errorf("memnet: fetch table %d.%d: %d chunks: want 1..%d", term, epoch, count, maxChunks)
	}
	out := make([][]byte, 0, count-1)
	for i := 1; i < count; i++ {
		v, _, err := a.Get(ctx, chunkKey(term, epoch, i))
		if errors.Is(err, protocol.ErrNotFound) {
			// Not ErrNotFound: gossip.Transport's is jetstream's, which
			// the protocol cannot tell from other failures either.
			err = errNoChunk
		}
		if err != nil {
			return nil, fmt.Errorf("memnet: fetch table %d.%d chunk %d of %d: %w", term, epoch, i, count, err)
		}
		out = append(out, v)
	}
	return out, nil
}

// watch is one table watcher: a KV watch of the head while active, and
// the loop around it that re-creates it, resyncs and dedups, as
// gossip.Transport.WatchTables does.
type watch struct {
	a *Agent

	// Guarded by n.mu.
	active  bool
	gen     uint64 // bumped when the watch is created or dropped
	attempt uint64 // the create attempt that counts
	retry   time.Duration

	mu      sync.Mutex // held while fn runs
	fn      func([]byte, uint64)
	last    uint64
	stopped bool
}

// WatchHeads calls fn with the current head, if any, once its watch is up
// (after the agent's KV latency), and then with every newer head, in
// strictly increasing revisions, never one twice, in the network's event
// context (see the package doc) — WatchTables's semantics without a
// goroutine, for the simulator. A dropped watch is re-created at once and
// then with backoff (Config.WatchRetryMin … WatchRetryMax) while the
// bucket cannot be reached; re-created, it delivers the current head
// again, unless not newer than the last delivered. While up it rereads
// the head every Config.WatchResync. stop ends it and waits for a running
// fn; it must not be called from fn.
func (a *Agent) WatchHeads(fn func(head []byte, rev uint64)) (stop func()) {
	n := a.n
	w := &watch{a: a, fn: fn, retry: n.cfg.WatchRetryMin}
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
	if w.stopped || rev <= w.last {
		return
	}
	w.last = rev
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
		d := w.retry
		w.retry = min(2*w.retry, n.cfg.WatchRetryMax)
		n.scheduleCreateLocked(w, d)
		n.mu.Unlock()
		return
	}
	w.active = true
	w.gen++
	w.retry = n.cfg.WatchRetryMin
	w.a.count.KVWatches++
	n.scheduleResyncLocked(w)
	e, ok := n.bucket.keys[keyHead]
	n.mu.Unlock()
	if ok {
		w.offer(e.value, e.rev)
	}
}

func (n *Network) scheduleResyncLocked(w *watch) {
	g := w.gen
	n.afterLocked(n.cfg.WatchResync, func() {
		n.mu.Lock()
		if !w.active || w.gen != g {
			n.mu.Unlock()
			return
		}
		w.a.count.KVGets++
		n.scheduleResyncLocked(w)
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
			w.retry = n.cfg.WatchRetryMin
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
