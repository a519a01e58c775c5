package wire_test

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"pgregory.net/rapid"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gossip/wire"
	"github.com/meridian-quota/meridian/rebalance"
)

// nextTable draws a table that follows base: a later (term, epoch), the
// same regions, a new header, and rows changed, added and removed.
func nextTable(t *rapid.T, base *rebalance.Table) *rebalance.Table {
	n := *base
	n.Epoch = base.Epoch + 1 + rapid.Uint64Range(0, 3).Draw(t, "epoch step")
	if base.Epoch > 1<<62 {
		n.Term, n.Epoch = base.Term+1, 1
	}
	n.Issued = min(base.Issued+rapid.Int64Range(0, 10).Draw(t, "issued step"), gcra.MaxTime-1)
	n.Keys = nil
	R := len(base.Regions)
	for _, ks := range base.Keys {
		switch rapid.IntRange(0, 9).Draw(t, "fate") {
		case 0: // removed
			continue
		case 1: // shares moved within the row
			ks.Shares = slices.Clone(ks.Shares)
			if R > 1 && ks.Shares[0] > 0 {
				d := rapid.Uint32Range(1, ks.Shares[0]).Draw(t, "moved")
				ks.Shares[0] -= d
				ks.Shares[R-1] += d
			}
			ks.Version = min(ks.Version+1, 1<<60)
		case 2: // a new budget
			ks.Budget = budgetGen.Draw(t, "budget")
		}
		n.Keys = append(n.Keys, ks)
	}
	for _, k := range keysGen(20).Draw(t, "added") {
		k = "new/" + k
		if _, ok := slices.BinarySearchFunc(n.Keys, k, func(ks rebalance.KeyShares, k string) int { return strings.Compare(ks.Key, k) }); ok {
			continue
		}
		ks := rebalance.KeyShares{Key: k, Budget: budgetGen.Draw(t, "budget"), Shares: make([]uint32, R)}
		ks.Shares[0] = rapid.Uint32Range(0, 1_000_000).Draw(t, "share")
		n.Keys = append(n.Keys, ks)
	}
	slices.SortFunc(n.Keys, func(a, b rebalance.KeyShares) int { return strings.Compare(a.Key, b.Key) })
	return &n
}

// deltaCase draws a base table with room for the tables after it, the
// message size a reader accepts, and its limits.
func deltaCase(t *rapid.T) (base *rebalance.Table, max int, lim wire.Limits) {
	base = tableGen(t)
	if base.Epoch > 1<<61 || base.Term > 1<<61 {
		base.Term, base.Epoch = base.Term>>3, base.Epoch>>3
	}
	max = rapid.IntRange(wire.MinMessage, 8192).Draw(t, "maxMessage")
	lim = wire.DefaultLimits()
	lim.MaxMessage = max
	return base, max, lim
}

// readHead decodes chunk 0 of msgs.
func readHead(t fataler, msgs [][]byte, lim wire.Limits) *wire.TableChunk {
	t.Helper()
	m, err := wire.Decode(cluster, msgs[0], lim, trusted)
	if err != nil {
		t.Fatalf("head: %v", err)
	}
	return m.Table
}

// mapField returns msg with every field num's bytes replaced by f's
// result (a length-delimited field; nil drops it), the others as they were.
func mapField(msg []byte, num protowire.Number, f func([]byte) []byte) pb {
	var out pb
	for b := msg; len(b) > 0; {
		n, typ, k := protowire.ConsumeTag(b)
		l := protowire.ConsumeFieldValue(n, typ, b[k:])
		if n != num {
			out = append(out, b[:k+l]...)
		} else {
			v, _ := protowire.ConsumeBytes(b[k:])
			if w := f(v); w != nil {
				out = out.m(num, w)
			}
		}
		b = b[k+l:]
	}
	return out
}

// envBody returns the body of an envelope (field 4).
func envBody(msg []byte) (body []byte) {
	mapField(msg, 4, func(v []byte) []byte { body = v; return nil })
	return body
}

// stripDelta re-signs chunk 0 of a delta table without its delta field:
// the head a reader that does not know the field sees.
func stripDelta(t fataler, head []byte) []byte {
	t.Helper()
	body := envBody(head)
	out := mapField(body, 7, func([]byte) []byte { return nil })
	if len(out) == len(body) {
		t.Fatal("no delta field to strip")
	}
	return envelope(cluster, wire.KindTable, out, testKey)
}

// TestDeltaProperties: a table encoded from a base reads the same three
// ways — patched onto the base from its head alone, assembled from all its
// chunks, and assembled by a reader that skips the delta field — and its
// head is never larger than EncodeTable's.
func TestDeltaProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		base, max, lim := deltaCase(t)
		next := nextTable(t, base)
		msgs, err := wire.EncodeTableFrom(cluster, next, base, testKey, max)
		if err != nil {
			t.Fatal(err)
		}
		full, err := wire.EncodeTable(cluster, next, testKey, max)
		if err != nil {
			t.Fatal(err)
		}
		_, whole := decodeAll(t, msgs, lim)
		equalTables(t, whole, next)
		head := readHead(t, msgs, lim)
		if head.Delta == nil {
			if !slices.EqualFunc(msgs, full, bytes.Equal) {
				t.Fatal("without a delta the encoding is not EncodeTable's")
			}
			return
		}
		if whole, _ := wire.TableSize(cluster, next, max); len(msgs[0]) >= whole {
			t.Fatalf("delta head of %d bytes, the whole table %d", len(msgs[0]), whole)
		}
		got, err := wire.Patch(base, head, lim)
		if err != nil {
			t.Fatal(err)
		}
		equalTables(t, got, next)
		// The head read again by a reader now holding its table (a resync).
		again, err := wire.Patch(got, head, lim)
		if err != nil {
			t.Fatalf("the head read again onto its own table: %v", err)
		}
		equalTables(t, again, next)
		// A reader of the previous minor version skips field 7.
		old := slices.Clone(msgs)
		old[0] = stripDelta(t, msgs[0])
		_, oldGot := decodeAll(t, old, lim)
		equalTables(t, oldGot, next)
		// Another base with the same (term, epoch): refused as ErrBase, or
		// — when it differs only in rows the delta rewrites — patched to
		// exactly the table; never a wrong one.
		other := nextTable(t, base)
		other.Term, other.Epoch = base.Term, base.Epoch
		switch got, err := wire.Patch(other, head, lim); {
		case errors.Is(err, wire.ErrBase):
		case err != nil:
			t.Fatalf("patched onto another base: %v, not ErrBase", err)
		default:
			equalTables(t, got, next)
		}
	})
}

// TestDeltaSmallChange: one changed row of a 1,000-key table costs a head
// of a few hundred bytes, where the whole table is tens of kilobytes.
func TestDeltaSmallChange(t *testing.T) {
	base := testTable(1000, 24, "ap", "eu", "us")
	next := *base
	next.Epoch++
	next.Keys = slices.Clone(base.Keys)
	next.Keys[500].Shares = []uint32{100_000, 200_000, 700_000}
	next.Keys[500].Version++
	next.Keys = slices.Delete(next.Keys, 10, 11)
	lim := wire.DefaultLimits()
	msgs, err := wire.EncodeTableFrom(cluster, &next, base, testKey, wire.DefaultMaxMessage)
	if err != nil {
		t.Fatal(err)
	}
	full, _ := wire.TableSize(cluster, &next, wire.DefaultMaxMessage)
	head := readHead(t, msgs, lim)
	if head.Delta == nil || len(head.Delta.Changed) != 1 || !slices.Equal(head.Delta.Removed, []string{base.Keys[10].Key}) {
		t.Fatalf("delta %+v, want key 500 changed and key 10 removed", head.Delta)
	}
	if len(msgs[0]) > 400 || full < 20_000 {
		t.Fatalf("head of %d bytes, whole table %d", len(msgs[0]), full)
	}
	got, err := wire.Patch(base, head, lim)
	if err != nil {
		t.Fatal(err)
	}
	equalTables(t, got, &next)
	if &got.Keys[0].Shares[0] != &base.Keys[0].Shares[0] {
		t.Error("an unchanged row was copied")
	}
	if &got.Keys[499].Shares[0] == &head.Delta.Changed[0].Shares[0] {
		t.Error("a changed row still points into the head it came in")
	}
	// Regions differ: no delta.
	moved := next
	moved.Regions = []string{"ap", "eu", "za"}
	msgs, _ = wire.EncodeTableFrom(cluster, &moved, base, testKey, wire.DefaultMaxMessage)
	if readHead(t, msgs, lim).Delta != nil {
		t.Error("a delta across a change of regions")
	}
	// A base that is not before the table: no delta.
	msgs, _ = wire.EncodeTableFrom(cluster, base, &next, testKey, wire.DefaultMaxMessage)
	if readHead(t, msgs, lim).Delta != nil {
		t.Error("a delta on a later table")
	}
}

// TestDeltaRefused: a delta head that breaks the format's rules is
// refused, whatever else it carries, and so is a table whose chunks do not
// hold the rows its digest names.
func TestDeltaRefused(t *testing.T) {
	lim := wire.DefaultLimits()
	digest := make([]byte, wire.DigestSize)
	delta := func(extra pb) pb {
		return append(pb(nil).u(1, 3).u(2, 1).m(3, digest).m(4, row("a", 10, 20)).s(5, "b"), extra...)
	}
	head := func(idx, count uint32, d pb, rows ...pb) []byte {
		b := pb(nil).u(1, 3).u(2, 2).f32(3, idx).f32(4, count)
		if idx == 0 {
			b = b.m(5, headerBody("eu", "us"))
		}
		b = b.m(7, d)
		if d == nil {
			b = b.m(7, delta(nil)).m(7, delta(nil))
		}
		for _, r := range rows {
			b = b.m(6, r)
		}
		return envelope(cluster, wire.KindTable, b, testKey)
	}
	for name, tc := range map[string]struct {
		msg  []byte
		want string
	}{
		"valid":              {head(0, 2, delta(nil)), ""},
		"rows in the head":   {head(0, 2, delta(nil), row("z", 1, 2)), "a delta head with 1 rows"},
		"one chunk":          {head(0, 1, delta(nil)), "a delta head of a table of 1 chunk"},
		"outside chunk 0":    {head(1, 2, delta(nil)), "a delta outside chunk 0"},
		"short digest":       {head(0, 2, pb(nil).u(1, 3).u(2, 1).m(3, digest[:8])), "digest of 8 bytes"},
		"later base":         {head(0, 2, pb(nil).u(1, 3).u(2, 2).m(3, digest)), "does not precede it"},
		"changed unsorted":   {head(0, 2, pb(nil).m(3, digest).m(4, row("b", 1, 2)).m(4, row("a", 1, 2))), "keys not sorted"},
		"wrong regions":      {head(0, 2, pb(nil).m(3, digest).m(4, row("b", 1, 2, 3))), "3 entries for 2 regions"},
		"removed unsorted":   {head(0, 2, pb(nil).m(3, digest).s(5, "b").s(5, "a")), "removed key 1: keys not sorted"},
		"removed empty":      {head(0, 2, pb(nil).m(3, digest).s(5, "")), "removed key 0: name of 0 bytes"},
		"changed and gone":   {head(0, 2, pb(nil).m(3, digest).m(4, row("a", 1, 2)).s(5, "a")), `key "a" both changed and removed`},
		"delta given twice":  {head(0, 2, nil), "given twice"},
		"overcommitted row":  {head(0, 2, pb(nil).m(3, digest).m(4, row("a", 900_000, 200_000))), "above 1000000"},
		"digest given twice": {head(0, 2, delta(pb(nil).m(3, digest))), "given twice"},
	} {
		_, err := wire.Decode(cluster, tc.msg, lim, trusted)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", name, err)
		case tc.want != "" && (err == nil || !errors.Is(err, wire.ErrInvalid) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: err %v, want one saying %q", name, err, tc.want)
		}
	}

	// Chunks that disagree with the digest: the assembler refuses the table.
	base := testTable(50, 8, "eu", "us")
	next := *base
	next.Epoch++
	next.Keys = slices.Clone(base.Keys)
	next.Keys[7].Version++
	msgs, err := wire.EncodeTableFrom(cluster, &next, base, testKey, wire.DefaultMaxMessage)
	if err != nil {
		t.Fatal(err)
	}
	liar := next
	liar.Keys = slices.Clone(next.Keys)
	liar.Keys[8].Version += 5
	lies, _ := wire.EncodeTableFrom(cluster, &liar, base, testKey, wire.DefaultMaxMessage)
	a := wire.NewAssembler(lim, 2)
	for i, b := range [][]byte{msgs[0], lies[1]} {
		m, err := wire.Decode(cluster, b, lim, trusted)
		if err != nil {
			t.Fatal(err)
		}
		_, done, err := a.AddTable(m.Table)
		if i == 1 && (done || !errors.Is(err, wire.ErrInvalid) || !strings.Contains(err.Error(), "digest")) {
			t.Fatalf("chunks of another table joined: done %v err %v", done, err)
		}
	}
	// A removal the base lacks, and the patched result's digest: ErrBase.
	h := readHead(t, msgs, lim)
	short := *base
	short.Keys = base.Keys[1:]
	if _, err := wire.Patch(&short, h, lim); !errors.Is(err, wire.ErrBase) {
		t.Fatalf("patched onto a base lacking a row: %v", err)
	}
	gone := readHead(t, mustEncode(t, &short, base), lim)
	if _, err := wire.Patch(&next, gone, lim); !errors.Is(err, wire.ErrBase) {
		t.Fatalf("patched onto another (term, epoch): %v", err)
	}
}

func mustEncode(t *testing.T, tb, base *rebalance.Table) [][]byte {
	t.Helper()
	c := *tb
	c.Epoch = base.Epoch + 1
	msgs, err := wire.EncodeTableFrom(cluster, &c, base, testKey, wire.DefaultMaxMessage)
	if err != nil {
		t.Fatal(err)
	}
	return msgs
}
