package region

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

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
