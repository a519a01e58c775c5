package gossip

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/meridian-quota/meridian/gossip/memnet"
	"github.com/meridian-quota/meridian/gossip/protocol"
	"github.com/meridian-quota/meridian/internal/natstest"
)

// The ports' conformance suite: one script over the semantics the protocol
// relies on — compare-and-set and fencing, LatestTable, FetchChunks and
// purging, WatchTables's order without duplicates, publish/subscribe, the
// KV's Create/Update conflicts — run against the real NATS transport and
// against gossip/memnet (real-time clock, no faults). Each run writes a
// transcript of what a caller observes (values, revisions, error
// classes); the two transcripts must be identical, so memnet is what the
// simulator may stand in for NATS with. Waits poll with natsDeadline,
// which only guards against hangs.

// portsAgent is one agent's ports.
type portsAgent struct {
	bus    protocol.Bus
	tables protocol.TableStore
	kv     protocol.KV
}

// portsTarget is one implementation: two agents of one cluster, on a
// bucket nothing else writes (revisions are compared exactly).
type portsTarget struct {
	a, b portsAgent
}

func natsTarget(t *testing.T) portsTarget {
	srv := natstest.Start(t)
	a := dialT(t, "conf", natsTestConfig(srv.URL()))
	b := dialT(t, "conf", natsTestConfig(srv.URL()))
	return portsTarget{
		a: portsAgent{bus: a, tables: a, kv: natsKVOf(a)},
		b: portsAgent{bus: b, tables: b, kv: natsKVOf(b)},
	}
}

// natsKVOf returns the election's KV adapter over tr's bucket (natsKV,
// gossip/kv.go), with the cluster's key prefix the election adds, so the
// suite checks the adapter's own error mapping against memnet's.
func natsKVOf(tr *Transport) protocol.KV {
	return prefixedKV{kv: natsKV{kv: tr.kv}, pre: tr.keyPre}
}

// prefixedKV puts the cluster's prefix before every key, as Campaign does.
type prefixedKV struct {
	kv  protocol.KV
	pre string
}

func (k prefixedKV) Get(ctx context.Context, key string) ([]byte, uint64, error) {
	return k.kv.Get(ctx, k.pre+key)
}

func (k prefixedKV) Create(ctx context.Context, key string, value []byte) (uint64, error) {
	return k.kv.Create(ctx, k.pre+key, value)
}

func (k prefixedKV) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	return k.kv.Update(ctx, k.pre+key, value, rev)
}

func memnetTarget(t *testing.T) portsTarget {
	n, err := memnet.New(memnet.NewRealClock(), rand.New(rand.NewPCG(1, 2)), memnet.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	a, b := n.Agent("eu", "eu-1"), n.Agent("us", "us-1")
	return portsTarget{a: portsAgent{a, a, a}, b: portsAgent{b, b, b}}
}

// errClass is what the protocol may branch on in an error.
func errClass(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, protocol.ErrFenced):
		return "fenced"
	case errors.Is(err, protocol.ErrConflict):
		return "conflict"
	case errors.Is(err, protocol.ErrNotFound):
		return "not found"
	}
	return "error"
}

// runPortsSuite runs the script on tg and returns its transcript.
func runPortsSuite(t *testing.T, tg portsTarget) []string {
	ctx := bg(t)
	var out []string
	note := func(format string, a ...any) { out = append(out, fmt.Sprintf(format, a...)) }
	a, b := tg.a, tg.b

	// Tables.
	head, rev, ok, err := b.tables.LatestTable(ctx)
	note("latest on an empty bucket: %q rev %d ok %v %s", head, rev, ok, errClass(err))

	type seen struct {
		head string
		rev  uint64
	}
	watch := func() (<-chan seen, func() error) {
		ch := make(chan seen, 16)
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- b.tables.WatchTables(wctx, func(h []byte, r uint64) { ch <- seen{string(h), r} })
		}()
		return ch, func() error { cancel(); return recv(t, done, "WatchTables return") }
	}
	got, stopWatch := watch()
	// The head delivered next, once: a duplicate or an older head would
	// come first, the watch being ordered.
	expect := func(want string) {
		t.Helper()
		v := recv(t, got, "watch "+want)
		note("watch: %s rev %d", v.head, v.rev)
		if v.head != want {
			t.Errorf("watch delivered %v, want %s", v, want)
		}
	}

	store := func(w portsAgent, prev, term, epoch uint64, n int) uint64 {
		t.Helper()
		chunks := [][]byte{fmt.Appendf(nil, "h%d.%d", term, epoch)}
		for i := 1; i < n; i++ {
			chunks = append(chunks, fmt.Appendf(nil, "h%d.%d c%d", term, epoch, i))
		}
		rev, err := w.tables.StoreTable(ctx, prev, term, epoch, chunks)
		note("store %d.%d (%d chunks) on rev %d: rev %d %s", term, epoch, n, prev, rev, errClass(err))
		return rev
	}
	fetch := func(term, epoch uint64, n int) {
		c, err := b.tables.FetchChunks(ctx, term, epoch, n)
		note("fetch %d.%d: %q %s", term, epoch, c, errClass(err))
	}

	r1 := store(a, 0, 1, 1, 3)
	expect("h1.1")
	store(b, 0, 1, 1, 1) // a second first table
	head, rev, ok, err = b.tables.LatestTable(ctx)
	note("latest: %q rev %d ok %v %s", head, rev, ok, errClass(err))
	fetch(1, 1, 3)
	fetch(1, 1, 1)
	r2 := store(a, r1, 1, 2, 2)
	expect("h1.2")
	r3 := store(a, r2, 1, 3, 2)
	expect("h1.3")
	store(b, r2, 2, 1, 2) // stale: fenced, though its chunk was written
	store(b, r3+7, 2, 1, 1)
	fetch(1, 1, 3) // purged two tables later
	fetch(1, 2, 2)
	fetch(1, 3, 2)
	r4 := store(b, r3, 2, 1, 1) // a successor writes on the head it read
	expect("h2.1")
	store(a, r3, 1, 4, 1) // the deposed writer is fenced
	if err := stopWatch(); err != nil {
		t.Errorf("WatchTables: %v", err)
	}
	got, stopWatch = watch() // a new watch starts with the current head
	expect("h2.1")
	store(b, r4, 2, 2, 1)
	expect("h2.2")
	if err := stopWatch(); err != nil {
		t.Errorf("WatchTables: %v", err)
	}
	select {
	case v := <-got:
		note("watch after stop: %v", v)
	default:
	}

	// Bus: every subscriber, the publisher included, gets every message.
	var mu sync.Mutex
	bySub := map[string][]string{}
	sub := func(name string, subscribe func(func(protocol.Sender, []byte)) (func(), error)) func() {
		stop, err := subscribe(func(from protocol.Sender, m []byte) {
			mu.Lock()
			defer mu.Unlock()
			bySub[name] = append(bySub[name], from.Region+"/"+from.Agent+":"+string(m))
		})
		if err != nil {
			t.Fatalf("subscribe %s: %v", name, err)
		}
		return stop
	}
	stops := []func(){
		sub("a reports", a.bus.SubscribeReports), sub("a acks", a.bus.SubscribeAcks),
		sub("b reports", b.bus.SubscribeReports), sub("b acks", b.bus.SubscribeAcks),
	}
	note("connected: %v %v", a.bus.Connected(), b.bus.Connected())
	note("publish report: %s", errClass(a.bus.PublishReport("eu", "eu-1", [][]byte{[]byte("r0"), []byte("r1"), []byte("r2")})))
	note("publish ack: %s", errClass(b.bus.PublishAck("us", "us-1", []byte("ack"))))
	note("publish bad name: %s", errClass(a.bus.PublishAck("eu", "eu.1", []byte("x"))))
	note("flush: %s", errClass(a.bus.Flush(ctx)))
	want := map[string]int{"a reports": 3, "b reports": 3, "a acks": 1, "b acks": 1}
	eventually(t, natsDeadline, "every message delivered", func() error {
		mu.Lock()
		defer mu.Unlock()
		for name, n := range want {
			if len(bySub[name]) < n {
				return fmt.Errorf("%s: %q", name, bySub[name])
			}
		}
		return nil
	})
	for _, s := range stops {
		s()
	}
	mu.Lock()
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range bySub {
			if !yield(k) {
				return
			}
		}
	}) {
		m := slices.Clone(bySub[name])
		slices.Sort(m) // the Bus promises no order
		note("%s: %s", name, strings.Join(m, " "))
	}
	mu.Unlock()

	// KV: the election's key, in the same bucket (one revision sequence).
	v, kr, err := a.kv.Get(ctx, "leader")
	note("kv get absent: %q %d %s", v, kr, errClass(err))
	kr1, err := a.kv.Create(ctx, "leader", []byte("eu"))
	note("kv create: %d %s", kr1, errClass(err))
	kr, err = b.kv.Create(ctx, "leader", []byte("us"))
	note("kv create again: %d %s", kr, errClass(err))
	kr, err = b.kv.Update(ctx, "leader", []byte("us"), kr1+1)
	note("kv update on a wrong rev: %d %s", kr, errClass(err))
	kr2, err := b.kv.Update(ctx, "leader", []byte("us"), kr1)
	note("kv update: %d %s", kr2, errClass(err))
	kr, err = a.kv.Update(ctx, "leader", []byte("eu"), kr1)
	note("kv stale update: %d %s", kr, errClass(err))
	v, kr, err = a.kv.Get(ctx, "leader")
	note("kv get: %q %d %s", v, kr, errClass(err))
	kr, err = a.kv.Update(ctx, "other", []byte("x"), 0)
	note("kv update absent on rev 0: %d %s", kr, errClass(err))
	kr, err = a.kv.Update(ctx, "third", []byte("x"), 5)
	note("kv update absent on rev 5: %d %s", kr, errClass(err))
	return out
}

func TestPortsConformance(t *testing.T) {
	var transcripts [2][]string
	for i, tt := range []struct {
		name   string
		target func(*testing.T) portsTarget
	}{
		{"nats", natsTarget},
		{"memnet", memnetTarget},
	} {
		t.Run(tt.name, func(t *testing.T) {
			transcripts[i] = runPortsSuite(t, tt.target(t))
		})
	}
	if t.Failed() {
		return
	}
	nats, mem := transcripts[0], transcripts[1]
	for i := range max(len(nats), len(mem)) {
		var n, m string
		if i < len(nats) {
			n = nats[i]
		}
		if i < len(mem) {
			m = mem[i]
		}
		if n != m {
			t.Errorf("line %d:\n  nats:   %s\n  memnet: %s", i+1, n, m)
		}
	}
	if !t.Failed() {
		t.Logf("identical transcripts:\n%s", strings.Join(mem, "\n"))
	}
}
