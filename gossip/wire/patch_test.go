package wire_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/meridian-quota/meridian/gossip/wire"
	"github.com/meridian-quota/meridian/rebalance"
)

// stripPatches re-signs a delta head without its delta's row patches
// (TableDelta field 7): the head a reader of the release before
// FeatureRowPatches, which skips the field, sees.
func stripPatches(t fataler, head []byte) []byte {
	t.Helper()
	out := mapField(envBody(head), 7, func(d []byte) []byte {
		return mapField(d, 7, func([]byte) []byte { return nil })
	})
	return envelope(cluster, wire.KindTable, out, testKey)
}

// TestRowPatchProperties: with FeatureRowPatches, every changed row of a
// delta that keeps its key and budget goes as a row patch, on both kinds
// of delta head (on the table before, with chunks; in-base, without); a
// reader patches the same table as from whole rows; the head is never
// larger than without patches; and a reader of the release before, which
// skips the patches, never takes the head for the table — its patch fails
// the digest (ErrBase) and it reads the chunks, which hold every row.
func TestRowPatchProperties(t *testing.T) {
	var patched int
	rapid.Check(t, func(t *rapid.T) {
		base, max, lim := deltaCase(t)
		next := nextTable(t, base)
		check := func(kind string, with, without []byte) {
			h := readHead(t, [][]byte{with}, lim)
			if h.Delta == nil {
				t.Fatalf("%s: no delta", kind)
			}
			for _, c := range h.Delta.Changed {
				i, ok := slices.BinarySearchFunc(base.Keys, c.Key, func(ks rebalance.KeyShares, k string) int { return strings.Compare(ks.Key, k) })
				if ok && base.Keys[i].Budget == c.Budget {
					t.Fatalf("%s: row %q keeps its budget but went whole", kind, c.Key)
				}
			}
			patched += len(h.Delta.Patched)
			got, err := wire.Patch(base, h, lim)
			if err != nil {
				t.Fatalf("%s: %v", kind, err)
			}
			equalTables(t, got, next)
			if without != nil && len(with) > len(without) {
				t.Fatalf("%s: %d bytes with row patches, %d without", kind, len(with), len(without))
			}
			old, err := wire.Decode(cluster, stripPatches(t, with), lim, trusted)
			if err != nil {
				t.Fatal(err)
			}
			_, err = wire.Patch(base, old.Table, lim)
			switch {
			case len(h.Delta.Patched) > 0 && !errors.Is(err, wire.ErrBase):
				t.Fatalf("%s: a reader skipping %d row patches patched the base: %v", kind, len(h.Delta.Patched), err)
			case len(h.Delta.Patched) == 0 && err != nil:
				t.Fatalf("%s: no row patches to skip, yet: %v", kind, err)
			}
		}
		// A head on the table before, with every row in its chunks.
		msgs, err := wire.EncodeTableBase(cluster, next, base, testKey, max, wire.Features)
		if err != nil {
			t.Fatal(err)
		}
		plain, err := wire.EncodeTableBase(cluster, next, base, testKey, max, wire.FeatureInBase)
		if err != nil {
			t.Fatal(err)
		}
		if wire.IsDeltaHead(msgs[0]) {
			var without []byte
			if wire.IsDeltaHead(plain[0]) {
				without = plain[0]
			}
			check("head on the table before", msgs[0], without)
			_, whole := decodeAll(t, msgs, lim)
			equalTables(t, whole, next)
		}
		// An in-base head on base stored as a base.
		stored, err := wire.EncodeTableBase(cluster, base, nil, testKey, max, wire.Features)
		if err != nil {
			t.Fatal(err)
		}
		head, ok, err := wire.EncodeTableOn(cluster, next, base, len(stored), testKey, max, wire.Features)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			var without []byte
			if h, ok, _ := wire.EncodeTableOn(cluster, next, base, len(stored), testKey, max, wire.FeatureInBase); ok {
				without = h
			}
			check("in-base head", head, without)
		}
	})
	if patched == 0 {
		t.Fatal("no row patch in any run: the property was not exercised")
	}
}

// TestRowPatchSmall: a third of a 1,000-key table's rows move; with row
// patches the in-base head is well under half the bytes of whole rows.
func TestRowPatchSmall(t *testing.T) {
	base := testTable(1000, 24, "ap", "eu", "us")
	stored, err := wire.EncodeTableBase(cluster, base, nil, testKey, wire.DefaultMaxMessage, wire.Features)
	if err != nil {
		t.Fatal(err)
	}
	next := *base
	next.Epoch += 2
	next.Keys = slices.Clone(base.Keys)
	for i := 0; i < len(next.Keys); i += 3 {
		next.Keys[i].Shares = []uint32{100_000, 200_000, 700_000}
		next.Keys[i].Version++
	}
	with, ok, err := wire.EncodeTableOn(cluster, &next, base, len(stored), testKey, 1<<20, wire.Features)
	if err != nil || !ok {
		t.Fatalf("EncodeTableOn: ok %v, %v", ok, err)
	}
	without, ok, err := wire.EncodeTableOn(cluster, &next, base, len(stored), testKey, 1<<20, wire.FeatureInBase)
	if err != nil || !ok {
		t.Fatalf("EncodeTableOn: ok %v, %v", ok, err)
	}
	if 2*len(with) > len(without) {
		t.Fatalf("in-base head of 334 changed rows: %d bytes with row patches, %d without", len(with), len(without))
	}
	t.Logf("in-base head of 334 changed rows: %d bytes with row patches, %d without", len(with), len(without))
}

// TestRowPatchRefused: a row patch that cannot be read is refused when
// decoded (ErrInvalid), and one that does not fit the base the reader
// holds is refused when patched (ErrBase), saying which and why.
func TestRowPatchRefused(t *testing.T) {
	lim := wire.DefaultLimits()
	base := testTable(4, 8, "eu", "us")
	base.Term, base.Epoch = 3, 1
	base.Keys[1].Version = 5
	digest := make([]byte, wire.DigestSize)
	patch := func(index uint64, step int64, shares ...uint64) pb {
		return pb(nil).u(1, index).z(2, step).packed(3, shares...)
	}
	head := func(d pb) []byte {
		b := pb(nil).u(1, 3).u(2, 2).f32(3, 0).f32(4, 2).m(5, headerBody("eu", "us"))
		b = b.m(7, append(pb(nil).u(1, 3).u(2, 1).m(3, digest), d...))
		return envelope(cluster, wire.KindTable, b, testKey)
	}
	for name, tc := range map[string]struct {
		delta   pb
		decode  string // refused by Decode (ErrInvalid), saying this
		patched string // else refused by Patch (ErrBase), saying this
	}{
		"unsorted":          {delta: pb(nil).m(7, patch(2, 1, 1, 2)).m(7, patch(1, 1, 1, 2)), decode: "index 1 after 2"},
		"twice":             {delta: pb(nil).m(7, patch(2, 1, 1, 2)).m(7, patch(2, 1, 1, 2)), decode: "index 2 after 2"},
		"wrong regions":     {delta: pb(nil).m(7, patch(1, 1, 1, 2, 3)), decode: "3 entries for 2 regions"},
		"bursts short":      {delta: pb(nil).m(7, patch(1, 1, 1, 2).packed(4, 1)), decode: "bursts has 1 entries for 2 shares"},
		"index too large":   {delta: pb(nil).m(7, patch(uint64(lim.MaxKeys), 1, 1, 2)), decode: "at most"},
		"step twice":        {delta: pb(nil).m(7, patch(1, 1, 1, 2).z(2, 1)), decode: "given twice"},
		"beyond the base":   {delta: pb(nil).m(7, patch(4, 1, 1, 2)), patched: "patches row 4; its base 3.1 has 4"},
		"patched, removed":  {delta: pb(nil).s(5, base.Keys[1].Key).m(7, patch(1, 1, 1, 2)), patched: "both removes and patches"},
		"patched, whole":    {delta: pb(nil).m(4, row(base.Keys[1].Key, 1, 2)).m(7, patch(1, 1, 1, 2)), patched: "both changes and patches"},
		"version below 0":   {delta: pb(nil).m(7, patch(1, -6, 1, 2)), patched: "version 5 stepped by -6"},
		"version past 2^60": {delta: pb(nil).m(7, patch(1, 1<<62, 1, 2)), patched: "leaves [0, 2^60]"},
		"overcommitted":     {delta: pb(nil).m(7, patch(1, 1, 900_000, 200_000)), patched: "above 1000000"},
		"other digest":      {delta: pb(nil).m(7, patch(1, 1, 1, 2)), patched: "digest"},
	} {
		m, err := wire.Decode(cluster, head(tc.delta), lim, trusted)
		if tc.decode != "" {
			if err == nil || !errors.Is(err, wire.ErrInvalid) || !strings.Contains(err.Error(), tc.decode) {
				t.Errorf("%s: decoded with err %v, want ErrInvalid saying %q", name, err, tc.decode)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if _, err := wire.Patch(base, m.Table, lim); !errors.Is(err, wire.ErrBase) || !strings.Contains(err.Error(), tc.patched) {
			t.Errorf("%s: patched with err %v, want ErrBase saying %q", name, err, tc.patched)
		}
	}
}
