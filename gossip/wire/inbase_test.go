package wire_test

import (
	"errors"
	"testing"

	"pgregory.net/rapid"

	"github.com/meridian-quota/meridian/gossip/wire"
	"github.com/meridian-quota/meridian/rebalance"
)

// TestInBaseProperties: a base stored with EncodeTableBase holds every row
// in its chunks; a later table encoded on it with EncodeTableOn, however
// many tables later (a table that follows it: nextTable), is one head that reads the same table two ways —
// patched onto the base a reader holds, and patched onto the rows of the
// base's chunks (BaseRows) by a reader that holds nothing — and that a
// reader of the previous minor version, which skips the delta field, never
// reads as any table: its chunks under the table's own (term, epoch) do
// not exist, and the base's are another table's. The Assembler refuses the
// head itself.
func TestInBaseProperties(t *testing.T) {
	var runs, heads int
	rapid.Check(t, func(t *rapid.T) {
		runs++
		base, max, lim := deltaCase(t)
		stored, err := wire.EncodeTableBase(cluster, base, nil, testKey, max, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, whole := decodeAll(t, stored, lim)
		equalTables(t, whole, base)
		if h := readHead(t, stored, lim); len(base.Keys) > 0 && (len(h.Keys) > 0 || len(stored) < 2) {
			t.Fatalf("a base of %d rows: %d rows in its head, %d messages", len(base.Keys), len(h.Keys), len(stored))
		}
		next := nextTable(t, base)
		reads := rapid.SampledFrom([]uint32{wire.FeatureInBase, wire.Features}).Draw(t, "reads")
		head, ok, err := wire.EncodeTableOn(cluster, next, base, len(stored), testKey, max, reads)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return // no base rows, another region set, or a head above maxMessage
		}
		heads++
		if len(base.Keys) == 0 || len(stored) < 2 {
			t.Fatalf("an in-base head on a base of %d rows in %d messages", len(base.Keys), len(stored))
		}
		m, err := wire.Decode(cluster, head, lim, trusted)
		if err != nil {
			t.Fatal(err)
		}
		h := m.Table
		if h.Delta == nil || !h.Delta.InBase || h.Count != len(stored) || len(h.Keys) != 0 {
			t.Fatalf("head: delta %+v count %d rows %d; want in-base, count %d, no rows", h.Delta, h.Count, len(h.Keys), len(stored))
		}
		got, err := wire.Patch(base, h, lim)
		if err != nil {
			t.Fatal(err)
		}
		equalTables(t, got, next)
		var cs []*wire.TableChunk
		for _, b := range stored[1:] {
			c, err := wire.Decode(cluster, b, lim, trusted)
			if err != nil {
				t.Fatal(err)
			}
			cs = append(cs, c.Table)
		}
		rows, err := wire.BaseRows(base.Term, base.Epoch, len(stored), h.Header.Regions, cs, lim)
		if err != nil {
			t.Fatal(err)
		}
		got, err = wire.Patch(rows, h, lim)
		if err != nil {
			t.Fatalf("patched onto the base's chunks: %v", err)
		}
		equalTables(t, got, next)
		// The chunks of another table are no base.
		if _, err := wire.BaseRows(base.Term, base.Epoch+1, len(stored), h.Header.Regions, cs, lim); err == nil {
			t.Fatal("BaseRows took chunks of another table")
		}
		// The Assembler refuses the head; a reader that skips the delta
		// waits for chunks that do not exist and takes none of the base's.
		a := wire.NewAssembler(lim, 4)
		if _, _, err := a.AddTable(h); !errors.Is(err, wire.ErrInvalid) {
			t.Fatalf("Assembler took an in-base head: %v", err)
		}
		old, err := wire.Decode(cluster, stripDelta(t, head), lim, trusted)
		if err != nil {
			t.Fatal(err)
		}
		if tb, done, err := a.AddTable(old.Table); done || tb != nil {
			t.Fatalf("a reader without the delta field read the head as a table: %v", err)
		}
		for _, c := range cs {
			if tb, done, _ := a.AddTable(c); done || tb != nil {
				t.Fatal("a reader without the delta field assembled a table from the base's chunks")
			}
		}
	})
	if heads < runs/4 {
		t.Fatalf("%d in-base heads in %d runs: the property was hardly exercised", heads, runs)
	}
	t.Logf("%d in-base heads in %d runs", heads, runs)
}

// TestInBaseSmall: one changed row of a 1,000-key table stored as a base
// is an in-base head of a few hundred bytes and no chunks.
func TestInBaseSmall(t *testing.T) {
	base := testTable(1000, 24, "ap", "eu", "us")
	stored, err := wire.EncodeTableBase(cluster, base, nil, testKey, wire.DefaultMaxMessage, 0)
	if err != nil {
		t.Fatal(err)
	}
	next := *base
	next.Epoch += 2
	next.Keys = append([]rebalance.KeyShares(nil), base.Keys...)
	next.Keys[7].Shares = []uint32{100_000, 200_000, 700_000}
	next.Keys[7].Version++
	head, ok, err := wire.EncodeTableOn(cluster, &next, base, len(stored), testKey, wire.DefaultMaxMessage, wire.FeatureInBase)
	if err != nil || !ok {
		t.Fatalf("EncodeTableOn: ok %v, %v", ok, err)
	}
	n := 0
	for _, b := range stored {
		n += len(b)
	}
	if len(head) > 600 || n < 20_000 {
		t.Fatalf("in-base head of %d bytes, the base %d bytes in %d messages", len(head), n, len(stored))
	}
	t.Logf("in-base head %d bytes; the base %d bytes in %d messages", len(head), n, len(stored))
}
