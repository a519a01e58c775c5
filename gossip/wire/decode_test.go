package wire_test

import (
	"errors"
	"math"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gossip/wire"
)

// TestDecodeRefuses feeds Decode hand-built messages the encoders would
// never write.
func TestDecodeRefuses(t *testing.T) {
	lim := wire.DefaultLimits()
	lim.MaxChunks = 8
	rep := func(b pb) []byte { return envelope(cluster, wire.KindReport, b, nil) }
	tab := func(b pb) []byte { return envelope(cluster, wire.KindTable, b, testKey) }
	tab0 := func(hdr pb, rows ...pb) []byte {
		b := pb(nil).u(1, 3).u(2, 7).f32(3, 0).f32(4, 1).m(5, hdr)
		for _, r := range rows {
			b = b.m(6, r)
		}
		return tab(b)
	}
	tests := []struct {
		name string
		give []byte
		want string
	}{
		{"empty", nil, "version 0"},
		{"garbage", []byte{0xff, 0xff, 0xff}, "envelope at byte 0"},
		{"version 2", pb(nil).u(1, 2).s(2, cluster).u(3, 1).m(4, reportBody()), "version 2, this decoder reads version 1"},
		{"unknown kind", pb(nil).u(1, 1).s(2, cluster).u(3, 9).m(4, reportBody()), "unknown kind 9"},
		{"kind 257 (truncates to 1)", pb(nil).u(1, 1).s(2, cluster).u(3, 257).m(4, reportBody()), "unknown kind 257"},
		{"version twice", pb(nil).u(1, 1).u(1, 1).s(2, cluster).u(3, 1).m(4, reportBody()), "field 1 given twice"},
		{"version as bytes", pb(nil).s(1, "1").s(2, cluster).u(3, 1).m(4, reportBody()), "field 1: wire type 2, want 0"},
		{"huge body length", protowire.AppendVarint(protowire.AppendTag(pb(nil).u(1, 1).s(2, cluster).u(3, 1), 4, protowire.BytesType), 1<<40), "envelope at byte"},
		{"above MaxMessage", rep(reportBody().s(99, strings.Repeat("x", wire.DefaultMaxMessage))), "above the limit of 524288"},

		{"report without region", rep(pb(nil).s(2, "a").f32(9, 1)), "report chunk 0: region: empty name"},
		{"report without count", rep(reportBody()[:len(reportBody())-5]), "count 0 (missing)"},
		{"index ≥ count", rep(pb(nil).s(1, "r").s(2, "a").f32(8, 3).f32(9, 3)), "index 3, not below count 3"},
		{"count > MaxChunks", rep(pb(nil).s(1, "r").s(2, "a").f32(9, 9)), "count 9, above the limit of 8 chunks"},
		{"count 2^32-1", rep(pb(nil).s(1, "r").s(2, "a").f32(8, 1).f32(9, math.MaxUint32)), "above the limit of 8 chunks"},
		{"negative demand", rep(reportBody().m(10, pb(nil).s(1, "k").i(2, 5).i(5, -1))), "report chunk 0 key 0: negative demand"},
		{"key without name", rep(reportBody().m(10, pb(nil).i(2, 5))), "report chunk 0 key 0: key name of 0 bytes"},
		{"key name too long", rep(reportBody().m(10, pb(nil).s(1, strings.Repeat("k", 1025)))), "key name of 1025 bytes outside [1, 1024]"},
		{"key name twice", rep(reportBody().m(10, pb(nil).s(1, "k").s(1, "j"))), "field 1 given twice"},
		{"huge key length", rep(reportBody().m(10, protowire.AppendVarint([]byte{0x0a}, 1<<50))), "report chunk 0 key 0: field 1: unexpected EOF"},
		{"region name too long", rep(pb(nil).s(1, strings.Repeat("r", 257)).s(2, "a").f32(9, 1)), "name of 257 bytes, above the limit of 256"},
		{"keys as varint", rep(reportBody().u(10, 1)), "field 10: wire type 0, want 2"},
		{"ack without agent", envelope(cluster, wire.KindAck, pb(nil).s(1, "r"), nil), "ack: agent: empty name"},

		{"table of 2 regions, row of 3 shares", tab0(headerBody("eu", "us"), row("k", 1, 2, 3)), "wire: invalid message: table chunk 0 key 0: shares has 3 entries for 2 regions"},
		{"row of 3 shares in a later chunk", tab(pb(nil).f32(3, 1).f32(4, 2).m(6, row("k", 1, 2, 3)).m(6, row("l", 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65))), "table chunk 1 key 1: shares has 65 entries, above the limit of 64 regions"},
		{"shares sum above 10⁶", tab0(headerBody("eu", "us"), row("k", 600_000, 500_000)), "table chunk 0 key 0: shares sum to 1100000 ppm, above 1000000"},
		{"share above 2^32", tab0(headerBody("eu"), row("k", 1<<33)), "share 8589934592 of region 0 above 2^32"},
		{"bursts for 1 of 2 regions", tab0(headerBody("eu", "us"), row("k", 1, 2).packed(4, 5)), "bursts has 1 entries for 2 shares"},
		{"negative burst", tab0(headerBody("eu"), row("k", 1).packed(4, math.MaxUint64)), "burst -1 of region 0: negative"},
		{"truncated packed shares", tab0(headerBody("eu"), pb(nil).s(1, "k").m(3, []byte{0x01, 0x80}).i(7, 1000).i(8, 10)), "shares: a truncated varint"},
		{"invalid budget", tab0(headerBody("eu"), pb(nil).s(1, "k").packed(3, 1).i(7, 1000)), "budget: gcra: invalid limit"},
		{"budget with rate and interval", tab0(headerBody("eu"), pb(nil).s(1, "k").packed(3, 1).i(5, 10).i(6, 1e6).i(7, 10).i(8, 1)), "both a rate"},
		{"huge budget period", tab0(headerBody("eu"), pb(nil).s(1, "k").packed(3, 1).i(5, 10).i(6, math.MaxInt64).i(8, 1)), "budget period"},
		{"version above 2^60", tab0(headerBody("eu"), row("k", 1).u(2, 1<<61)), "version 2305843009213693952 above 2^60"},
		{"unsorted keys", tab0(headerBody("eu"), row("l", 1), row("k", 1)), "table chunk 0 key 1: keys not sorted and distinct"},
		{"duplicate keys", tab0(headerBody("eu"), row("k", 1), row("k", 1)), "keys not sorted and distinct"},
		{"unsorted regions", tab0(headerBody("us", "eu")), "region 1: regions not sorted and distinct"},
		{"leases for 1 of 2 regions", tab0(pb(nil).s(4, "eu").s(4, "us").packed(5, 2).m(6, nil).m(6, nil)), "1 leases for 2 regions"},
		{"negative lease", tab0(pb(nil).s(4, "eu").packed(5, 1).m(6, nil)), "lease -1µs outside"},
		{"no agent lists", tab0(pb(nil).s(4, "eu").packed(5, 2)), "0 agent lists for 1 regions"},
		{"unsorted agents", tab0(pb(nil).s(4, "eu").packed(5, 2).m(6, pb(nil).s(1, "b").s(1, "a"))), "agent 1: agents not sorted"},
		{"no regions", tab0(pb(nil)), "no regions"},
		{"65 regions", tab0(func() pb {
			h := pb(nil)
			for i := range 65 {
				h = h.s(4, keyName(i, 3))
			}
			return h
		}()), "more than 64 regions"},
		{"effective too late", tab0(pb(nil).z(2, 1<<52).s(4, "eu").packed(5, 2).m(6, nil)), "outside [0, 2^52)"},
		{"blind until too late", tab0(pb(nil).s(4, "eu").packed(5, 2).m(6, nil).z(9, 1<<52)), "blind until 4503599627370496µs outside [0, 2^52)"},
		{"blind until negative", tab0(pb(nil).s(4, "eu").packed(5, 2).m(6, nil).z(9, -1)), "blind until -1µs outside [0, 2^52)"},
		{"blind until twice", tab0(pb(nil).s(4, "eu").packed(5, 2).m(6, nil).z(9, 1).z(9, 2)), "field 9 given twice"},
		{"no header in chunk 0", tab(pb(nil).f32(4, 1)), "table chunk 0: no header"},
		{"header in chunk 1", tab(pb(nil).f32(3, 1).f32(4, 2).m(5, headerBody("eu"))), "table chunk 1: a header outside chunk 0"},
		{"group in a row", tab0(headerBody("eu"), row("k", 1).m(0, nil)), "invalid field number"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := wire.Decode(cluster, tt.give, lim, trusted)
			if err == nil {
				t.Fatalf("accepted: %+v", m)
			}
			if !errors.Is(err, wire.ErrInvalid) {
				t.Errorf("%v does not wrap ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q, want it to contain %q", err, tt.want)
			}
		})
	}
}

// TestDecodeSkipsUnknown checks forward compatibility within a version:
// unknown fields of every wire type are skipped.
func TestDecodeSkipsUnknown(t *testing.T) {
	extra := func(b pb) pb {
		b = b.u(20, 7).s(21, "future").f32(22, 1)
		b = protowire.AppendFixed64(protowire.AppendTag(b, 23, protowire.Fixed64Type), 9)
		return protowire.AppendGroup(protowire.AppendTag(b, 24, protowire.StartGroupType), 24, pb(nil).u(1, 1))
	}
	body := extra(reportBody()).m(10, extra(pb(nil).s(1, "k").i(2, 3)))
	env := extra(pb(nil).u(1, 1).s(2, cluster).u(3, 1).m(4, body))
	m, err := wire.Decode(cluster, env, wire.DefaultLimits(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if k := m.Report.Report.Keys; len(k) != 1 || k[0].Key != "k" || k[0].Offered != 3 {
		t.Fatalf("keys %+v", k)
	}
	tb := pb(nil).f32(3, 0).f32(4, 1).m(5, extra(headerBody("eu"))).m(6, extra(row("k", 5)))
	if _, err := wire.Decode(cluster, envelope(cluster, wire.KindTable, extra(tb), testKey), wire.DefaultLimits(), trusted); err != nil {
		t.Fatal(err)
	}
}

// TestTruncated decodes every prefix of valid messages of each kind.
func TestTruncated(t *testing.T) {
	reps, _ := wire.EncodeReport(cluster, testReport(20, 10), 5, wire.MinMessage)
	ack, _ := wire.EncodeAck(cluster, wire.Ack{Region: "r", Agent: "a", Term: 1})
	tabs, _ := wire.EncodeTable(cluster, testTable(10, 10, "eu", "us"), testKey, wire.MinMessage)
	for _, b := range [][]byte{reps[0], ack, tabs[0]} {
		for n := range len(b) {
			if _, err := wire.Decode(cluster, b[:n], wire.DefaultLimits(), trusted); !errors.Is(err, wire.ErrInvalid) {
				t.Fatalf("%d of %d bytes: %v", n, len(b), err)
			}
		}
	}
}

// TestDecodeAllocations checks that what Decode allocates stays within a
// small multiple of the message, however large the lengths and counts it
// declares.
func TestDecodeAllocations(t *testing.T) {
	many := reportBody()
	for range 20_000 {
		many = many.m(10, pb(nil).s(1, "k"))
	}
	rows := pb(nil).f32(3, 1).f32(4, 2)
	for i := range 10_000 {
		rows = rows.m(6, row(keyName(i, 6), 1))
	}
	tests := []struct {
		name string
		give []byte
	}{
		{"declared body of 2^40", protowire.AppendVarint(protowire.AppendTag(pb(nil).u(1, 1).s(2, cluster).u(3, 1), 4, protowire.BytesType), 1<<40)},
		{"declared key of 2^50", envelope(cluster, wire.KindReport, reportBody().m(10, protowire.AppendVarint([]byte{0x0a}, 1<<50)), nil)},
		{"count 2^32-1", envelope(cluster, wire.KindReport, pb(nil).s(1, "r").s(2, "a").f32(9, math.MaxUint32), nil)},
		{"20,000 one-byte keys", envelope(cluster, wire.KindReport, many, nil)},
		{"10,000 minimal rows", envelope(cluster, wire.KindTable, rows, testKey)},
	}
	for _, tt := range tests {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		_, err := wire.Decode(cluster, tt.give, wire.DefaultLimits(), trusted)
		runtime.ReadMemStats(&after)
		got := after.TotalAlloc - before.TotalAlloc
		t.Logf("%s: %d bytes, allocated %d (%v)", tt.name, len(tt.give), got, err)
		if bound := uint64(16*len(tt.give) + 64<<10); got > bound {
			t.Errorf("%s (%d bytes, %v): allocated %d bytes, above %d", tt.name, len(tt.give), err, got, bound)
		}
	}
}

// An acknowledgement's region fence round-trips, and one that claims a
// fence without naming the store that holds it is refused: the
// coordinator could not tell which store it proves anything about.
func TestAckFence(t *testing.T) {
	a := wire.Ack{Region: "eu", Agent: "eu-1", Term: 3, Epoch: 40, Fence: gcra.Fence{Term: 3, Epoch: 41}, Store: 0xfeed}
	b, err := wire.EncodeAck(cluster, a)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != wire.AckSize(cluster, a) {
		t.Fatalf("AckSize %d, encoded %d bytes", wire.AckSize(cluster, a), len(b))
	}
	m, err := wire.Decode(cluster, b, wire.DefaultLimits(), nil)
	if err != nil || *m.Ack != a {
		t.Fatalf("decoded %+v, %v; want %+v", m.Ack, err, a)
	}
	a.Store = 0
	if _, err := wire.EncodeAck(cluster, a); err == nil {
		t.Fatal("EncodeAck took a fence with no store")
	}
	body := pb(nil).s(1, "eu").s(2, "eu-1").u(3, 3).u(4, 40).u(6, 3).u(7, 41)
	if _, err := wire.Decode(cluster, envelope(cluster, wire.KindAck, body, nil), wire.DefaultLimits(), nil); !errors.Is(err, wire.ErrInvalid) || !strings.Contains(err.Error(), "no store identity") {
		t.Fatalf("a fence with no store: %v, want ErrInvalid naming it", err)
	}
}

// TestDecodeKeepsNamesApart: the names of a decoded table's rows and a
// report's keys lie back to back in a string of their own, so a name kept
// after its message (a node's row, the coordinator's key) keeps the
// names, not the message's shares, bursts, budgets and counts. Before,
// each name was a substring of the whole body: the simulator's 300,000
// keys × 10 regions held 1.06 GB of old table bodies through the nodes'
// rows. It fails on that code: the names had the rest of each row between
// them.
func TestDecodeKeepsNamesApart(t *testing.T) {
	contiguous := func(what string, names []string) {
		t.Helper()
		for i := 1; i < len(names); i++ {
			prev, cur := unsafe.StringData(names[i-1]), unsafe.StringData(names[i])
			if uintptr(unsafe.Pointer(cur)) != uintptr(unsafe.Pointer(prev))+uintptr(len(names[i-1])) {
				t.Fatalf("%s: name %d %q does not follow name %d %q: the names keep more than themselves alive", what, i, names[i], i-1, names[i-1])
			}
		}
	}
	tb := testTable(500, 12, "ap", "eu", "us")
	msgs, err := wire.EncodeTable(cluster, tb, testKey, wire.DefaultMaxMessage)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 1 {
		t.Fatalf("%d chunks, want one", len(msgs))
	}
	_, got := decodeAll(t, msgs, wire.DefaultLimits())
	equalTables(t, got, tb)
	var names []string
	for _, ks := range got.Keys {
		names = append(names, ks.Key)
	}
	contiguous("table", names)
	// Nor do they share the message's bytes: read while decoding without
	// a copy, the names must have left it before Decode returned.
	clear(msgs[0])
	for i, ks := range got.Keys {
		if ks.Key != tb.Keys[i].Key {
			t.Fatalf("row %d: name %q after the message was overwritten, want %q", i, ks.Key, tb.Keys[i].Key)
		}
	}

	msgs, err = wire.EncodeReport(cluster, testReport(500, 12), 1, wire.DefaultMaxMessage)
	if err != nil {
		t.Fatal(err)
	}
	rep, _ := decodeAll(t, msgs, wire.DefaultLimits())
	names = names[:0]
	for _, k := range rep.Keys {
		names = append(names, k.Key)
	}
	contiguous("report", names)
}
