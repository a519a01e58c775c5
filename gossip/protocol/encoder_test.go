package protocol_test

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"testing"

	"github.com/meridian-quota/meridian/gossip/protocol"
	"github.com/meridian-quota/meridian/gossip/wire"
	"github.com/meridian-quota/meridian/rebalance"
)

// TestTableEncoderInBase drives the coordinator's TableEncoder and the
// agents' TableReader together over a store that purges as the bus does:
// a term's first table is a base (its chunks hold every row); the tables
// after it, while the agents read in-base heads, are one head each and no
// chunks; a reader that held the last table, one that held only an older
// one, and one that is new all read each table exactly as encoded — the
// new one fetching the base's chunks, the others nothing. Once the heads
// would cost more than a base, or the agents do not all read them, a new
// base goes out. A failed store makes the next table a base.
func TestTableEncoderInBase(t *testing.T) {
	st := &store{chunks: map[[2]uint64][][]byte{}}
	enc := protocol.NewTableEncoder(cluster, coordKey, wire.MinMessage, nil)
	ctx := context.Background()
	noFetch := &store{err: errors.New("fetched chunks")}
	cur := table(4, 1, 300)
	next := func(b *rebalance.Table, keys ...int) *rebalance.Table {
		n := *b
		n.Epoch++
		n.Keys = slices.Clone(b.Keys)
		for _, k := range keys {
			n.Keys[k].Shares = []uint32{500_000, 500_000}
			n.Keys[k].Version++
		}
		return &n
	}
	publish := func(tb *rebalance.Table, inBase bool) []byte {
		t.Helper()
		chunks, err := enc.Encode(tb, readsOf(inBase))
		if err != nil {
			t.Fatal(err)
		}
		st.chunks[[2]uint64{tb.Term, tb.Epoch}] = chunks
		enc.Stored(tb)
		return chunks[0]
	}
	read := func(r *protocol.TableReader, s protocol.ChunkFetcher, head []byte, want *rebalance.Table) {
		t.Helper()
		got, err := protocol.ReadTable(ctx, s, r, head)
		if err != nil {
			t.Fatalf("read %d.%d: %v", want.Term, want.Epoch, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("read table %d.%d differs from the one encoded", want.Term, want.Epoch)
		}
	}
	isInBase := func(head []byte) bool {
		m, err := wire.Decode(cluster, head, wire.DefaultLimits(), trusted)
		if err != nil {
			t.Fatal(err)
		}
		return m.Table.Delta != nil && m.Table.Delta.InBase
	}

	h := publish(cur, true) // no base yet: a base
	if isInBase(h) || len(st.chunks[[2]uint64{4, 1}]) < 3 {
		t.Fatalf("the term's first table: in-base %v, %d messages", isInBase(h), len(st.chunks[[2]uint64{4, 1}]))
	}
	follower, lagger := newReader(), newReader()
	read(follower, st, h, cur)
	read(lagger, st, h, cur)
	for i := range 5 {
		cur = next(cur, 10*i, 10*i+1)
		h = publish(cur, true)
		if !isInBase(h) {
			t.Fatalf("table %d after the base: not an in-base head", i+1)
		}
		read(follower, noFetch, h, cur) // holds the table before
		read(newReader(), st, h, cur)   // holds nothing: the base's chunks
	}
	read(lagger, noFetch, h, cur) // held only the base: its rows
	if p, m := follower.Deltas(); p != 5 || m != 0 {
		t.Fatalf("follower: %d patched, %d missed; want 5, 0", p, m)
	}
	if b, hs := enc.Counts(); b != 1 || hs != 5 {
		t.Fatalf("Counts = %d bases, %d heads; want 1, 5", b, hs)
	}

	// Every row changed since the base: a head costs more than a new base.
	all := make([]int, len(cur.Keys))
	for i := range all {
		all[i] = i
	}
	cur = next(cur, all...)
	if h = publish(cur, true); isInBase(h) {
		t.Fatal("a head carrying every row went out instead of a base")
	}
	read(follower, st, h, cur) // every row changed: no delta, the chunks
	read(lagger, st, h, cur)
	cur = next(cur, 7)
	if h = publish(cur, true); !isInBase(h) {
		t.Fatal("the table after the new base: not an in-base head")
	}
	read(lagger, noFetch, h, cur)
	read(follower, noFetch, h, cur)

	// An agent that does not read in-base heads: bases only.
	cur = next(cur, 3)
	if h = publish(cur, false); isInBase(h) {
		t.Fatal("an in-base head for agents that do not read them")
	}
	read(follower, noFetch, h, cur)

	// Agents that read in-base heads but not row patches (the release
	// before them): in-base heads whose changed rows go whole; then, with
	// every agent reading both, the same change as a row patch.
	patches := func(head []byte) (whole, patched int) {
		m, err := wire.Decode(cluster, head, wire.DefaultLimits(), trusted)
		if err != nil || m.Table.Delta == nil {
			t.Fatalf("head: not a delta head (%v)", err)
		}
		return len(m.Table.Delta.Changed), len(m.Table.Delta.Patched)
	}
	for _, reads := range []uint32{wire.FeatureInBase, wire.Features} {
		cur = next(cur, 11)
		chunks, err := enc.Encode(cur, reads)
		if err != nil {
			t.Fatal(err)
		}
		st.chunks[[2]uint64{cur.Term, cur.Epoch}] = chunks
		enc.Stored(cur)
		h = chunks[0]
		whole, patched := patches(h)
		if wantPatched := reads&wire.FeatureRowPatches != 0; !isInBase(h) || (patched > 0) != wantPatched || whole+patched == 0 {
			t.Fatalf("reads %#x: in-base %v, %d whole rows and %d patched", reads, isInBase(h), whole, patched)
		}
		read(follower, noFetch, h, cur)
		read(newReader(), st, h, cur)
	}

	// A failed store: the next table is a base whatever the agents read.
	cur = next(cur, 4)
	if _, err := enc.Encode(cur, wire.Features); err != nil {
		t.Fatal(err)
	}
	enc.Failed()
	cur = next(cur, 5)
	if h = publish(cur, true); isInBase(h) {
		t.Fatal("an in-base head after a failed store")
	}
	read(follower, st, h, cur)
}

// A reader handed chunks that are not the named base's refuses them and
// returns no table.
func TestTableReaderRefusesWrongBase(t *testing.T) {
	enc := protocol.NewTableEncoder(cluster, coordKey, wire.MinMessage, nil)
	b1 := table(4, 1, 300)
	c1, err := enc.Encode(b1, wire.Features)
	if err != nil {
		t.Fatal(err)
	}
	enc.Stored(b1)
	t2 := *b1
	t2.Epoch = 2
	t2.Keys = slices.Clone(b1.Keys)
	t2.Keys[0].Shares = []uint32{1, 999_999}
	t2.Keys[0].Version++
	c2, err := enc.Encode(&t2, wire.Features)
	if err != nil || len(c2) != 1 {
		t.Fatalf("in-base head: %d messages, %v", len(c2), err)
	}
	other := table(4, 1, 300)
	other.Keys[9].Shares = []uint32{2, 999_998}
	forged := encode(t, cluster, other, coordKey, wire.MinMessage) // another table 4.1
	for name, chunks := range map[string][][]byte{"another table's chunks": forged, "too few": c1[:len(c1)-1]} {
		st := &store{chunks: map[[2]uint64][][]byte{{4, 1}: chunks}}
		if got, err := protocol.ReadTable(context.Background(), st, newReader(), c2[0]); err == nil || got != nil {
			t.Errorf("%s: read %v, %v; want an error", name, got != nil, err)
		}
	}
}

// readsOf is the features agents report that read in-base heads (all
// this release's), or none.
func readsOf(inBase bool) uint32 {
	if inBase {
		return wire.Features
	}
	return 0
}

// busBytes is protocol.BusBytes of chunks, an in-base head when it is one
// message whose decoded delta says so.
func busBytes(chunks [][]byte, readers int) int {
	inBase := false
	if len(chunks) == 1 && wire.IsDeltaHead(chunks[0]) {
		m, err := wire.Decode(cluster, chunks[0], wire.DefaultLimits(), trusted)
		inBase = err == nil && m.Table.Delta.InBase
	}
	return protocol.BusBytes(chunks, readers, inBase)
}

// TestTableEncoderRents: rows that keep moving, a few new ones per table,
// make every in-base head carry all the moves since its base. The
// encoder re-bases once those heads have cost the bus what a base costs,
// which keeps it within 1.25× of the best fixed re-basing period chosen
// knowing the whole sequence (measured 1.02×). Fails on e0e0ed6, which
// re-based only once a single head cost more than a base: 2.18×.
func TestTableEncoderRents(t *testing.T) {
	const tables, moved = 60, 6
	seq := []*rebalance.Table{table(4, 1, 400)}
	for i := 1; i < tables; i++ {
		n := *seq[i-1]
		n.Epoch++
		n.Keys = slices.Clone(n.Keys)
		for j := range moved {
			k := &n.Keys[(i*moved+j)%len(n.Keys)]
			k.Shares = []uint32{k.Shares[1], k.Shares[0]}
			k.Version++
		}
		seq = append(seq, &n)
	}
	readers := len(seq[0].Regions)
	run := func(enc func(i int, tb *rebalance.Table) ([][]byte, error), stored func(*rebalance.Table)) int {
		total := 0
		for i, tb := range seq {
			chunks, err := enc(i, tb)
			if err != nil {
				t.Fatal(err)
			}
			total += busBytes(chunks, readers)
			stored(tb)
		}
		return total
	}
	e := protocol.NewTableEncoder(cluster, coordKey, wire.DefaultMaxMessage, nil)
	got := run(func(_ int, tb *rebalance.Table) ([][]byte, error) { return e.Encode(tb, wire.Features) }, e.Stored)
	best, bestK := 0, 0
	for k := 1; k <= tables; k++ {
		var base, prev *rebalance.Table
		var count int
		n := run(func(i int, tb *rebalance.Table) ([][]byte, error) {
			if i%k != 0 {
				if h, ok, err := wire.EncodeTableOn(cluster, tb, base, count, coordKey, wire.DefaultMaxMessage, wire.Features); err != nil || ok {
					return [][]byte{h}, err
				}
			}
			c, err := wire.EncodeTableBase(cluster, tb, prev, coordKey, wire.DefaultMaxMessage, wire.Features)
			base, count = tb, len(c)
			return c, err
		}, func(tb *rebalance.Table) { prev = tb })
		if best == 0 || n < best {
			best, bestK = n, k
		}
	}
	if float64(got) > 1.25*float64(best) {
		t.Fatalf("%d tables of %d moving rows: %d bus bytes, the best fixed period (%d) %d: %.2f×", tables, moved, got, bestK, best, float64(got)/float64(best))
	}
	t.Logf("%d tables of %d moving rows: %d bus bytes, the best fixed period (%d) %d: %.2f×", tables, moved, got, bestK, best, float64(got)/float64(best))
}
