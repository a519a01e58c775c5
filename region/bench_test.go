package region

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/rebalance"

	"github.com/meridian-quota/meridian/gcra/memstore"
)

// benchNode is a node on a memstore with a table for 1,000 tenants and a
// request touching a tenant limit and its route limit (a composite).
func benchNode(b *testing.B) (*Node, []*Request) {
	b.Helper()
	var clock atomic.Int64
	clock.Store(1_700_000_000_000_000)
	ms, err := memstore.New(memstore.Config{Clock: clock.Load, Shards: 64, MaxKeys: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	n, err := NewNode(DefaultConfig("eu", "eu-1", regions...), mustPolicy(b, testPolicy), ms)
	if err != nil {
		b.Fatal(err)
	}
	reqs := make([]*Request, 1000)
	for i := range reqs {
		ten := fmt.Sprintf("tenant-%04d", i)
		reqs[i] = req(1, tenant(ten), tenant(ten, Entry{"route", "/search"}))
	}
	return n, reqs
}

// parallel runs f on the requests round-robin from every goroutine, each
// with its own Decision.
func parallel(b *testing.B, reqs []*Request, f func(r *Request, d *Decision) error) {
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var d Decision
		for i := 0; pb.Next(); i++ {
			if err := f(reqs[i%len(reqs)], &d); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkResolveRecord is the node's own per-request cost: resolve a
// two-limit request to keys and schedules, then record its outcome.
func BenchmarkResolveRecord(b *testing.B) {
	n, reqs := benchNode(b)
	parallel(b, reqs, func(r *Request, d *Decision) error {
		if err := n.Resolve(r, d); err != nil {
			return err
		}
		d.Allowed = true
		n.Record(d)
		return nil
	})
}

// BenchmarkDecideMemstore is a whole decision on the in-memory store:
// resolve, one composite DecideAll, record.
func BenchmarkDecideMemstore(b *testing.B) {
	n, reqs := benchNode(b)
	parallel(b, reqs, func(r *Request, d *Decision) error {
		return n.Decide(context.Background(), 1_700_000_000_000_000, r, d)
	})
}

// BenchmarkDecideSerial is one goroutine deciding one-limit requests on
// the in-memory store, as the simulator does.
func BenchmarkDecideSerial(b *testing.B) {
	n, _ := benchNode(b)
	reqs := make([]*Request, 1000)
	for i := range reqs {
		reqs[i] = req(1, tenant(fmt.Sprintf("tenant-%04d", i)))
	}
	var d Decision
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if err := n.Decide(context.Background(), 1_700_000_000_000_000, reqs[i%len(reqs)], &d); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkNodeHeapPerKey measures the heap a node holds per key in
// demand: a million tenants resolved and recorded (the node's key
// entries), then a table naming every one applied (its rows), as an agent
// of a cluster holds them. The keys' store state is the store's (Redis in
// production) and not counted. Run with -benchtime 1x: each iteration
// builds a node of a million keys.
func BenchmarkNodeHeapPerKey(b *testing.B) {
	const keys = 1_000_000
	var perKey, entries, rows float64
	for b.Loop() {
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		before := ms.HeapAlloc
		st, err := memstore.New(memstore.Config{Clock: func() int64 { return 0 }, Shards: 1, MaxKeys: 16})
		if err != nil {
			b.Fatal(err)
		}
		cfg := DefaultConfig("eu", "eu-1", regions...)
		cfg.MaxKeys = 2 * keys
		n, err := NewNode(cfg, mustPolicy(b, testPolicy), st)
		if err != nil {
			b.Fatal(err)
		}
		r := &Request{Domain: "api", Descriptors: []Descriptor{{Entries: []Entry{{"tenant", ""}}}}, Cost: 1}
		tenant := func(i int) string { return fmt.Sprintf("tenant-%07d", i) }
		var d Decision
		for i := range keys {
			r.Descriptors[0].Entries[0].Value = tenant(i)
			if err := n.Resolve(r, &d); err != nil {
				b.Fatal(err)
			}
			d.Allowed = true
			n.Record(&d)
		}
		runtime.GC()
		runtime.ReadMemStats(&ms)
		mid := ms.HeapAlloc
		// The table's own key strings, as an agent decodes them, count
		// with its rows.
		t := &rebalance.Table{Term: 1, Epoch: 1, Issued: 0, Effective: 0, Regions: regions,
			Leases: []int64{30e6, 30e6}, Agents: [][]string{{"eu-1"}, {"us-1"}}, Keys: make([]rebalance.KeyShares, keys)}
		lim := gcra.PerHour(100, 10)
		for i := range t.Keys {
			t.Keys[i] = rebalance.KeyShares{Key: KeyName("api", []Entry{{"tenant", tenant(i)}}), Budget: lim,
				Shares: []uint32{600_000, 400_000}, Version: 1}
		}
		slices.SortFunc(t.Keys, func(a, b rebalance.KeyShares) int { return strings.Compare(a.Key, b.Key) })
		if err := n.Apply(t, 0); err != nil {
			b.Fatal(err)
		}
		t = nil
		runtime.GC()
		runtime.ReadMemStats(&ms)
		after := ms.HeapAlloc
		entries = float64(mid-before) / keys
		rows = float64(after-mid) / keys
		perKey = float64(after-before) / keys
		runtime.KeepAlive(n)
	}
	b.ReportMetric(entries, "entry-B/key")
	b.ReportMetric(rows, "row-B/key")
	b.ReportMetric(perKey, "B/key")
}

// BenchmarkApply measures what an agent pays for each table of a large,
// churning cluster: 100,000 keys, each op a table one epoch on whose key
// set lost the 100 keys the op before added and gained 100 new ones (as
// tenants come and go idle), every share unchanged.
func BenchmarkApply(b *testing.B) {
	const keys, churn = 100_000, 100
	st, err := memstore.New(memstore.Config{Clock: func() int64 { return 0 }, Shards: 1, MaxKeys: 16})
	if err != nil {
		b.Fatal(err)
	}
	n, err := NewNode(DefaultConfig("eu", "eu-1", regions...), mustPolicy(b, testPolicy), st)
	if err != nil {
		b.Fatal(err)
	}
	lim := gcra.PerHour(100, 10)
	row := func(i int) rebalance.KeyShares {
		return rebalance.KeyShares{Key: KeyName("api", []Entry{{"tenant", fmt.Sprintf("tenant-%07d", i)}}), Budget: lim,
			Shares: []uint32{600_000, 400_000}, Version: 1}
	}
	base := make([]rebalance.KeyShares, keys)
	for i := range base {
		base[i] = row(2 * i) // the churned keys fall between them
	}
	table := func(epoch uint64, extra []rebalance.KeyShares) *rebalance.Table {
		ks := append(slices.Clone(base), extra...)
		slices.SortFunc(ks, func(a, b rebalance.KeyShares) int { return strings.Compare(a.Key, b.Key) })
		return &rebalance.Table{Term: 1, Epoch: epoch, Regions: regions, Leases: []int64{1 << 50, 1 << 50},
			Agents: [][]string{{"eu-1"}, {"us-1"}}, Keys: ks}
	}
	// The tables are built before the clock runs: an agent decodes them.
	const prebuilt = 16
	tables := make([]*rebalance.Table, prebuilt)
	for e := range tables {
		extra := make([]rebalance.KeyShares, churn)
		for j := range extra {
			extra[j] = row(2*((e*churn+j)*997%keys) + 1)
		}
		tables[e] = table(uint64(e+2), extra)
	}
	if err := n.Apply(table(1, nil), 0); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	epoch, now := 0, int64(0)
	for b.Loop() {
		t := tables[epoch%prebuilt]
		epoch++
		t.Epoch = uint64(epoch + 1)
		// An hour between tables: a dropped key's row, kept reduced while
		// state under its last limit may live (minutes at these limits),
		// is gone by the next table but one, and the keys a table adds
		// are new to the node.
		now += 3_600_000_000
		if err := n.Apply(t, now); err != nil {
			b.Fatal(err)
		}
	}
}
