package protocol_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gossip/protocol"
	"github.com/meridian-quota/meridian/gossip/wire"
	"github.com/meridian-quota/meridian/rebalance"
	"github.com/meridian-quota/meridian/region"
)

const cluster = "prod"

// Fixed coordinator keys, so every encoding is reproducible.
var (
	coordKey = ed25519.NewKeyFromSeed(seed(1))
	forger   = ed25519.NewKeyFromSeed(seed(2))
	trusted  = []ed25519.PublicKey{coordKey.Public().(ed25519.PublicKey)}
)

func seed(b byte) []byte {
	s := make([]byte, ed25519.SeedSize)
	s[0] = b
	return s
}

// table is a valid two-region table (term, epoch) of n keys.
func table(term, epoch uint64, n int) *rebalance.Table {
	t := &rebalance.Table{Term: term, Epoch: epoch, Issued: 1_700_000_000_000_000, Effective: 1_700_000_000_500_000,
		PolicyVersion: "v1", Regions: []string{"eu", "us"},
		Leases: []int64{1_700_000_010_000_000, 1_700_000_010_000_000},
		Agents: [][]string{{"a1"}, {"a1", "a2"}}}
	for i := range n {
		t.Keys = append(t.Keys, rebalance.KeyShares{
			Key:    fmt.Sprintf("api/tenant=t%05d", i),
			Budget: gcra.PerSecond(100, 20),
			Shares: []uint32{uint32(i*37) % 1_000_000, 1_000_000 - uint32(i*37)%1_000_000},
			Bursts: []int64{10, 10},
		})
	}
	return t
}

// encode signs t for clu with key in chunks of at most max bytes.
func encode(t *testing.T, clu string, tb *rebalance.Table, key ed25519.PrivateKey, max int) [][]byte {
	t.Helper()
	chunks, err := wire.EncodeTable(clu, tb, key, max)
	if err != nil {
		t.Fatal(err)
	}
	return chunks
}

func newReader() *protocol.TableReader {
	return protocol.NewTableReader(cluster, wire.DefaultLimits(), trusted)
}

// store serves the chunks of tables by (term, epoch), or fails.
type store struct {
	chunks map[[2]uint64][][]byte
	err    error
}

func (s *store) FetchChunks(_ context.Context, term, epoch uint64, count int) ([][]byte, error) {
	if s.err != nil {
		return nil, s.err
	}
	c, ok := s.chunks[[2]uint64{term, epoch}]
	if !ok || len(c) != count {
		return nil, fmt.Errorf("no table %d.%d of %d chunks", term, epoch, count)
	}
	return c[1:], nil
}

func TestTableReaderAssemblesChunks(t *testing.T) {
	want := table(4, 9, 300)
	chunks := encode(t, cluster, want, coordKey, wire.MinMessage)
	if len(chunks) < 3 {
		t.Fatalf("%d chunks: want a table of several", len(chunks))
	}
	r := newReader()
	got, need, err := r.Head(chunks[0])
	if err != nil || got != nil {
		t.Fatalf("Head = %v, %v: want chunks to fetch", got, err)
	}
	if wantNeed := (protocol.ChunkRequest{Term: 4, Epoch: 9, Count: len(chunks)}); *need != wantNeed {
		t.Fatalf("need %+v, want %+v", *need, wantNeed)
	}
	// Chunks may come in any order.
	rest := slices.Clone(chunks[1:])
	slices.Reverse(rest)
	got, err = r.Chunks(need, rest)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("assembled table differs from the one encoded")
	}
	msgs, bytes := r.Accepted()
	n := 0
	for _, c := range chunks {
		n += len(c)
	}
	if msgs != int64(len(chunks)) || bytes != int64(n) {
		t.Fatalf("Accepted = %d msgs %d bytes, want %d, %d", msgs, bytes, len(chunks), n)
	}

	// The same through the store port, with a fresh reader.
	s := &store{chunks: map[[2]uint64][][]byte{{4, 9}: chunks}}
	got, err = protocol.ReadTable(context.Background(), s, newReader(), chunks[0])
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ReadTable = %v: want the table", err)
	}
}

func TestTableReaderOneChunk(t *testing.T) {
	want := table(1, 1, 3)
	chunks := encode(t, cluster, want, coordKey, wire.DefaultMaxMessage)
	if len(chunks) != 1 {
		t.Fatalf("%d chunks, want 1", len(chunks))
	}
	got, need, err := newReader().Head(chunks[0])
	if err != nil || need != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("Head = %v, %+v, %v: want the whole table", got != nil, need, err)
	}
	// ReadTable fetches nothing for it.
	got, err = protocol.ReadTable(context.Background(), &store{err: errors.New("no fetch expected")}, newReader(), chunks[0])
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ReadTable = %v", err)
	}
}

func TestTableReaderRefuses(t *testing.T) {
	big := table(4, 9, 300)
	good := encode(t, cluster, big, coordKey, wire.MinMessage)
	other := encode(t, cluster, table(4, 10, 300), coordKey, wire.MinMessage)
	forged := encode(t, cluster, big, forger, wire.MinMessage)
	foreign := encode(t, "staging", big, coordKey, wire.MinMessage)
	report, err := wire.EncodeReport(cluster, &rebalance.Report{Region: "eu", Agent: "a1", Interval: 7}, 0, wire.MinMessage)
	if err != nil {
		t.Fatal(err)
	}
	with := func(rest ...[]byte) [][]byte { return append([][]byte{good[0]}, rest...) }
	fails := errors.New("kv: timeout")

	tests := []struct {
		name      string
		give      [][]byte // head, then the chunks fetched
		giveFetch error    // the fetch fails
		want      string
	}{
		{name: "head of a forged table", give: forged, want: protocol.RefusedSignature},
		{name: "chunk of a forged table", give: with(forged[1:]...), want: protocol.RefusedSignature},
		{name: "head of another cluster", give: foreign, want: protocol.RefusedCluster},
		{name: "chunk of another cluster", give: with(foreign[1:]...), want: protocol.RefusedCluster},
		{name: "a non-first chunk as head", give: good[1:], want: protocol.RefusedMalformed},
		{name: "a report as head", give: report, want: protocol.RefusedMalformed},
		{name: "chunk of another table", give: with(other[1:]...), want: protocol.RefusedMalformed},
		{name: "truncated head", give: [][]byte{good[0][:len(good[0])/2]}, want: protocol.RefusedMalformed},
		{name: "truncated chunk", give: with(good[1][:len(good[1])-3]), want: protocol.RefusedMalformed},
		{name: "chunks missing", give: good[:len(good)-1], want: protocol.RefusedMalformed},
		{name: "head repeated as a chunk", give: with(good[0]), want: protocol.RefusedMalformed},
		{name: "empty head", give: [][]byte{nil}, want: protocol.RefusedMalformed},
		{name: "fetch fails", give: good, giveFetch: fails, want: protocol.RefusedUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newReader()
			tb, need, err := r.Head(tt.give[0])
			if err == nil && need != nil {
				tb, err = r.Chunks(need, tt.give[1:])
			}
			if tt.giveFetch != nil {
				s := &store{err: tt.giveFetch}
				tb, err = protocol.ReadTable(context.Background(), s, newReader(), tt.give[0])
				if !errors.Is(err, tt.giveFetch) {
					t.Fatalf("err %v, want the fetch's", err)
				}
			}
			if tb != nil || err == nil {
				t.Fatalf("read a table (err %v): want it refused", err)
			}
			if got := protocol.Classify(err); got != tt.want {
				t.Fatalf("Classify(%v) = %q, want %q", err, got, tt.want)
			}
		})
	}
}

func TestChunksWithoutHead(t *testing.T) {
	if _, err := newReader().Chunks(nil, nil); protocol.Classify(err) != protocol.RefusedMalformed {
		t.Fatalf("err %v: want malformed", err)
	}
}

func TestClassify(t *testing.T) {
	tests := []struct {
		give error
		want string
	}{
		{nil, ""},
		{wire.ErrSignature, protocol.RefusedSignature},
		{fmt.Errorf("x: %w", wire.ErrCluster), protocol.RefusedCluster},
		{fmt.Errorf("x: %w", wire.ErrInvalid), protocol.RefusedMalformed},
		{context.DeadlineExceeded, protocol.RefusedUnavailable},
	}
	for _, tt := range tests {
		if got := protocol.Classify(tt.give); got != tt.want {
			t.Errorf("Classify(%v) = %q, want %q", tt.give, got, tt.want)
		}
	}
}

func TestFollower(t *testing.T) {
	type offer struct {
		term, epoch uint64
		want        bool
		reason      string // when refused: TableStale unless set
	}
	tests := []struct {
		name   string
		offers []offer
	}{
		{"first table", []offer{{1, 1, true, ""}}},
		{"(0, 0) is no table", []offer{{0, 0, false, ""}, {0, 1, true, ""}}},
		{"newer epoch", []offer{{1, 1, true, ""}, {1, 2, true, ""}}},
		{"equal is stale", []offer{{1, 5, true, ""}, {1, 5, false, ""}}},
		{"older epoch is a replay", []offer{{1, 5, true, ""}, {1, 4, false, protocol.TableOlder}}},
		{"older term is a replay whatever its epoch", []offer{{2, 1, true, ""}, {1, 99, false, protocol.TableOlder}}},
		{"newer term with a lower epoch", []offer{{1, 9, true, ""}, {2, 1, true, ""}}},
		{"a refused table does not move the mark", []offer{{3, 3, true, ""}, {2, 9, false, protocol.TableOlder}, {3, 3, false, ""}, {3, 4, true, ""}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var f protocol.Follower
			for i, o := range tt.offers {
				deliver, reason := f.Offer(table(o.term, o.epoch, 1))
				if deliver != o.want {
					t.Fatalf("offer %d (%d, %d): deliver %v, want %v", i, o.term, o.epoch, deliver, o.want)
				}
				wantReason := o.reason
				if !o.want && wantReason == "" {
					wantReason = protocol.TableStale
				}
				if reason != wantReason {
					t.Fatalf("offer %d: reason %q, want %q", i, reason, wantReason)
				}
			}
		})
	}
	var f protocol.Follower
	if ok, reason := f.Offer(nil); ok || reason != protocol.TableStale {
		t.Fatalf("Offer(nil) = %v, %q", ok, reason)
	}
}

// Whatever tables the store and the watch produce, in whatever order and
// with repeats, the agent is handed a strictly increasing (term, epoch)
// sequence: exactly the offers that beat every earlier one.
func TestFollowerDeliversIncreasing(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		offers := rapid.SliceOf(rapid.Custom(func(t *rapid.T) [2]uint64 {
			return [2]uint64{rapid.Uint64Range(0, 4).Draw(t, "term"), rapid.Uint64Range(0, 6).Draw(t, "epoch")}
		})).Draw(t, "offers")
		var f protocol.Follower
		var best [2]uint64 // the largest offered so far
		var delivered [][2]uint64
		for _, o := range offers {
			deliver, _ := f.Offer(table(o[0], o[1], 0))
			beats := o[0] > best[0] || (o[0] == best[0] && o[1] > best[1])
			if deliver != beats {
				t.Fatalf("offer %v after best %v: deliver %v", o, best, deliver)
			}
			if deliver {
				delivered = append(delivered, o)
				best = o
			}
			if term, epoch := f.Last(); [2]uint64{term, epoch} != best {
				t.Fatalf("Last = (%d, %d), want %v", term, epoch, best)
			}
		}
		for i := 1; i < len(delivered); i++ {
			a, b := delivered[i-1], delivered[i]
			if !(b[0] > a[0] || (b[0] == a[0] && b[1] > a[1])) {
				t.Fatalf("delivered %v then %v", a, b)
			}
		}
	})
}

func TestOutcome(t *testing.T) {
	tests := []struct {
		give error
		want string
	}{
		{nil, protocol.TableApplied},
		{fmt.Errorf("apply: %w", region.ErrStaleTable), protocol.TableStale},
		{errors.New("bad row"), protocol.TableRefused},
	}
	for _, tt := range tests {
		if got := protocol.Outcome(tt.give); got != tt.want {
			t.Errorf("Outcome(%v) = %q, want %q", tt.give, got, tt.want)
		}
	}
}

func TestOutbox(t *testing.T) {
	b := protocol.NewOutbox(3)
	r1 := &rebalance.Report{Region: "eu", Agent: "a1", Interval: 1}
	r2 := &rebalance.Report{Region: "eu", Agent: "a1", Interval: 2}
	if !b.Ack(0, 0) || b.Len() != 0 {
		t.Fatalf("Ack(0, 0) queued something: no table in force is never acknowledged")
	}
	for i, ok := range []bool{b.Report(r1), b.Ack(2, 7), b.Report(r2), b.Ack(2, 8)} {
		if want := i < 3; ok != want {
			t.Fatalf("push %d: %v, want %v (capacity 3)", i, ok, want)
		}
	}
	want := []protocol.Out{{Report: r1}, {Term: 2, Epoch: 7}, {Report: r2}}
	for i, w := range want {
		o, ok := b.Next()
		if !ok || !reflect.DeepEqual(o, w) {
			t.Fatalf("Next %d = %+v, %v: want %+v", i, o, ok, w)
		}
		// Room again: what is pushed now comes after the rest (wrapping).
		if i == 0 && !b.Ack(3, 1) {
			t.Fatal("no room after Next")
		}
	}
	if o, ok := b.Next(); !ok || o != (protocol.Out{Term: 3, Epoch: 1}) {
		t.Fatalf("Next = %+v, %v: want the ack pushed after the first Next", o, ok)
	}
	if _, ok := b.Next(); ok || b.Len() != 0 {
		t.Fatal("outbox not empty")
	}
	if (protocol.Out{Report: r1}).Kind() != protocol.KindReport || (protocol.Out{Term: 1}).Kind() != protocol.KindAck {
		t.Fatal("Kind")
	}
}

func TestOutEncode(t *testing.T) {
	msgs, err := protocol.Out{Term: 2, Epoch: 7}.Encode(cluster, "eu", "a1", 1234, wire.MinMessage)
	if err != nil || len(msgs) != 1 {
		t.Fatalf("ack: %d messages, %v", len(msgs), err)
	}
	m, err := wire.Decode(cluster, msgs[0], wire.DefaultLimits(), nil)
	if err != nil || m.Kind != wire.KindAck || *m.Ack != (wire.Ack{Region: "eu", Agent: "a1", Term: 2, Epoch: 7, Sent: 1234}) {
		t.Fatalf("ack decodes as %+v, %v", m.Ack, err)
	}
	rep := &rebalance.Report{Region: "eu", Agent: "a1", Interval: 9, Term: 2, Epoch: 7,
		Keys: []rebalance.KeyDemand{{Key: "api/tenant=acme", Demand: rebalance.Demand{Offered: 3, Admitted: 2, Denied: 1}}}}
	msgs, err = protocol.Out{Report: rep}.Encode(cluster, "eu", "a1", 1234, wire.MinMessage)
	if err != nil || len(msgs) != 1 {
		t.Fatalf("report: %d messages, %v", len(msgs), err)
	}
	if m, err = wire.Decode(cluster, msgs[0], wire.DefaultLimits(), nil); err != nil || m.Kind != wire.KindReport || m.Report.Sent != 1234 {
		t.Fatalf("report decodes as %+v, %v", m.Report, err)
	}
}

// TestTableReaderPatchesDeltas: a reader that read a table patches the
// delta head that follows it from the head alone (ReadTable fetches
// nothing); a reader that missed a table, or a new one, reads the same head
// from its chunks; Resume seeds the base. Every path yields the same table.
func TestTableReaderPatchesDeltas(t *testing.T) {
	t1 := table(4, 9, 300)
	next := func(b *rebalance.Table, key int) *rebalance.Table {
		n := *b
		n.Epoch++
		n.Keys = slices.Clone(b.Keys)
		n.Keys[key].Shares = []uint32{500_000, 500_000}
		n.Keys[key].Version++
		return &n
	}
	t2 := next(t1, 7)
	t3 := next(t2, 200)
	st := &store{chunks: map[[2]uint64][][]byte{}}
	put := func(tb, base *rebalance.Table) []byte {
		c, err := wire.EncodeTableFrom(cluster, tb, base, coordKey, wire.MinMessage)
		if err != nil {
			t.Fatal(err)
		}
		st.chunks[[2]uint64{tb.Term, tb.Epoch}] = c
		return c[0]
	}
	h1, h2, h3 := put(t1, nil), put(t2, t1), put(t3, t2)
	ctx := context.Background()
	read := func(r *protocol.TableReader, s protocol.ChunkFetcher, head []byte, want *rebalance.Table) {
		t.Helper()
		got, err := protocol.ReadTable(ctx, s, r, head)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("read table %d.%d differs from the one encoded", want.Term, want.Epoch)
		}
	}
	noFetch := &store{err: errors.New("a delta head on the reader's base fetched chunks")}

	r := newReader()
	read(r, st, h1, t1)
	read(r, noFetch, h2, t2)
	read(r, noFetch, h3, t3)
	if p, m := r.Deltas(); p != 2 || m != 0 {
		t.Fatalf("Deltas = %d patched %d missed, want 2, 0", p, m)
	}
	read(r, noFetch, h3, t3) // a resync reads the head it holds again
	msgs, _ := r.Accepted()
	if want := int64(len(st.chunks[[2]uint64{4, 9}]) + 3); msgs != want {
		t.Fatalf("Accepted %d messages, want %d (table 1's chunks and three heads)", msgs, want)
	}

	// Missed t2: t3's head is on another base and is read from its chunks,
	// after which the reader patches again.
	r = newReader()
	read(r, st, h1, t1)
	read(r, st, h3, t3)
	if p, m := r.Deltas(); p != 0 || m != 1 {
		t.Fatalf("after a missed table, Deltas = %d patched %d missed, want 0, 1", p, m)
	}
	t4 := next(t3, 0)
	read(r, noFetch, put(t4, t3), t4)

	// A new reader reads a delta head from its chunks; Resume lets one
	// patch it.
	read(newReader(), st, h2, t2)
	r = newReader()
	r.Resume(t1)
	read(r, noFetch, h2, t2)
	// A failed fetch of a missed delta's chunks is "unavailable", not a
	// verdict on the table.
	r = newReader()
	r.Resume(t3)
	if _, err := protocol.ReadTable(ctx, noFetch, r, h2); err == nil || protocol.Classify(err) != protocol.RefusedUnavailable {
		t.Fatalf("ReadTable of a delta on a base not held, fetch failing: %v (%s)", err, protocol.Classify(err))
	}
}

// TestTableReaderHeader: Header verifies a head and returns its table's
// header without fetching a chunk, so a coordinator whose write was fenced
// can tell who wrote a head whose chunks are gone; it refuses what Head
// refuses.
func TestTableReaderHeader(t *testing.T) {
	tb := table(4, 9, 300)
	chunks := encode(t, cluster, tb, coordKey, wire.MinMessage)
	h, err := newReader().Header(chunks[0])
	if err != nil || h.Term != 4 || h.Epoch != 9 || h.Keys != nil || !slices.Equal(h.Regions, tb.Regions) {
		t.Fatalf("Header = %+v, %v: want table 4/9's header, no rows", h, err)
	}
	if _, err := newReader().Header(chunks[1]); !errors.Is(err, wire.ErrInvalid) {
		t.Fatalf("Header of chunk 1: %v", err)
	}
	forged := encode(t, cluster, tb, forger, wire.MinMessage)
	if _, err := newReader().Header(forged[0]); protocol.Classify(err) != protocol.RefusedSignature {
		t.Fatalf("Header of a forged head: %v", err)
	}
}
