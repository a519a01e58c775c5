package wire_test

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gossip/wire"
	"github.com/meridian-quota/meridian/rebalance"
)

func TestDefaultLimits(t *testing.T) {
	lim := wire.DefaultLimits()
	if err := lim.Validate(); err != nil {
		t.Fatal(err)
	}
	if lim.MaxKeys < 100_000 || lim.MaxKeyLen < 64 {
		t.Fatalf("%+v: 100,000 keys of 64 bytes must fit", lim)
	}
	err := wire.Limits{MaxKeyLen: gcra.MaxKeyLen + 1}.Validate()
	for _, want := range []string{"MaxMessage 0", "MaxKeys 0", "MaxKeyLen 1025", "MaxRegions 0", "MaxAgents 0", "MaxChunks 0", "MaxName 0"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to mention %q", err, want)
		}
	}
	if _, err := wire.Decode(cluster, nil, wire.Limits{}, nil); err == nil || errors.Is(err, wire.ErrInvalid) {
		t.Errorf("Decode with zero limits: %v, want a limits error", err)
	}
}

func TestReportRoundTrip(t *testing.T) {
	edge := testReport(2, 8)
	edge.Interval, edge.Term, edge.Epoch = -5, math.MaxUint64, 0
	edge.Keys[0].Demand = rebalance.Demand{Offered: math.MaxInt64, OfferedCost: math.MaxInt64, Admitted: math.MaxInt64, Denied: math.MaxInt64}
	edge.Keys[1].Demand = rebalance.Demand{}
	tests := []struct {
		name       string
		give       *rebalance.Report
		sent       int64
		maxMessage int
		wantChunks int // 0: don't check
	}{
		{"no keys", testReport(0, 0), 1, wire.DefaultMaxMessage, 1},
		{"one key", testReport(1, 16), 0, wire.DefaultMaxMessage, 1},
		{"no policy version", &rebalance.Report{Region: "r", Agent: "a", Keys: testReport(3, 5).Keys}, -7, wire.MinMessage, 1},
		{"edge values", edge, math.MinInt64, wire.MinMessage, 1},
		{"1000 keys in small messages", testReport(1000, 40), 1e15, wire.MinMessage, 0},
		{"100,000 keys", testReport(100_000, 40), 1e15, wire.DefaultMaxMessage, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msgs, err := wire.EncodeReport(cluster, tt.give, tt.sent, tt.maxMessage)
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantChunks > 0 && len(msgs) != tt.wantChunks {
				t.Fatalf("%d messages, want %d", len(msgs), tt.wantChunks)
			}
			total := 0
			for i, b := range msgs {
				total += len(b)
				m, err := wire.Decode(cluster, b, wire.DefaultLimits(), nil)
				if err != nil {
					t.Fatal(err)
				}
				if m.Report.Sent != tt.sent || m.Report.Index != i || m.Report.Count != len(msgs) {
					t.Fatalf("chunk %d: sent %d index %d count %d", i, m.Report.Sent, m.Report.Index, m.Report.Count)
				}
			}
			if n, k := wire.ReportSize(cluster, tt.give, tt.sent, tt.maxMessage); n != total || k != len(msgs) {
				t.Fatalf("ReportSize = %d bytes %d messages, encoded %d bytes %d messages", n, k, total, len(msgs))
			}
			lim := wire.DefaultLimits()
			lim.MaxMessage = max(tt.maxMessage, wire.MinMessage)
			got, _ := decodeAll(t, msgs, lim)
			if !reflect.DeepEqual(got, tt.give) {
				t.Fatalf("got %+v\nwant %+v", got, tt.give)
			}
			again, _ := wire.EncodeReport(cluster, tt.give, tt.sent, tt.maxMessage)
			if !reflect.DeepEqual(again, msgs) {
				t.Fatal("encoding is not deterministic")
			}
		})
	}
}

func TestAckRoundTrip(t *testing.T) {
	for _, a := range []wire.Ack{
		{Region: "eu-west", Agent: "a1", Term: 3, Epoch: 41, Sent: 1_700_000_000_000_000},
		{Region: "r", Agent: "a"},
		{Region: "r", Agent: "a", Term: math.MaxUint64, Epoch: math.MaxUint64, Sent: math.MinInt64},
	} {
		b, err := wire.EncodeAck(cluster, a)
		if err != nil {
			t.Fatal(err)
		}
		if n := wire.AckSize(cluster, a); n != len(b) {
			t.Errorf("AckSize = %d, encoded %d", n, len(b))
		}
		m, err := wire.Decode(cluster, b, wire.DefaultLimits(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if m.Kind != wire.KindAck || *m.Ack != a {
			t.Errorf("got %+v, want %+v", m.Ack, a)
		}
	}
	if _, err := wire.EncodeAck(cluster, wire.Ack{Region: "r"}); err == nil {
		t.Error("an ack without an agent encoded")
	}
}

func TestTableRoundTrip(t *testing.T) {
	tests := []struct {
		name       string
		give       *rebalance.Table
		maxMessage int
		wantChunks int
	}{
		{"no keys", testTable(0, 0, "eu-west", "us-east"), wire.DefaultMaxMessage, 1},
		{"one region", testTable(5, 10, "solo"), wire.DefaultMaxMessage, 1},
		{"every budget kind", testTable(12, 20, "ap-south", "eu-west", "us-east"), wire.DefaultMaxMessage, 1},
		{"small messages", testTable(2000, 40, "ap-south", "eu-west", "us-east"), wire.MinMessage, 0},
		{"100,000 keys of 40 bytes", testTable(100_000, 40, "ap-south", "eu-west", "us-east"), wire.DefaultMaxMessage, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msgs, err := wire.EncodeTable(cluster, tt.give, testKey, tt.maxMessage)
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantChunks > 0 && len(msgs) != tt.wantChunks {
				t.Fatalf("%d messages, want %d", len(msgs), tt.wantChunks)
			}
			if tt.wantChunks == 0 && len(msgs) < 2 {
				t.Fatalf("%d messages, want it chunked", len(msgs))
			}
			total := 0
			for _, b := range msgs {
				total += len(b)
			}
			if n, k := wire.TableSize(cluster, tt.give, tt.maxMessage); n != total || k != len(msgs) {
				t.Fatalf("TableSize = %d bytes %d messages, encoded %d bytes %d messages", n, k, total, len(msgs))
			}
			lim := wire.DefaultLimits()
			lim.MaxMessage = tt.maxMessage
			_, got := decodeAll(t, msgs, lim)
			equalTables(t, got, tt.give)
			for i := range got.Keys {
				if got.Keys[i].Budget != tt.give.Keys[i].Budget {
					t.Fatalf("key %d: budget %v, want == %v", i, got.Keys[i].Budget, tt.give.Keys[i].Budget)
				}
			}
			// Chunks in reverse order assemble to the same table.
			a := wire.NewAssembler(lim, 1)
			for i := len(msgs) - 1; i >= 0; i-- {
				m, err := wire.Decode(cluster, msgs[i], lim, trusted)
				if err != nil {
					t.Fatal(err)
				}
				tb, done, err := a.AddTable(m.Table)
				if err != nil || done != (i == 0) {
					t.Fatalf("chunk %d: done %v, %v", i, done, err)
				}
				if done {
					equalTables(t, tb, tt.give)
				}
			}
		})
	}
}

func TestBudgetRoundTrip(t *testing.T) {
	for _, l := range budgets {
		tb := testTable(1, 4, "r")
		tb.Keys[0].Budget = l
		msgs, err := wire.EncodeTable(cluster, tb, testKey, wire.MinMessage)
		if err != nil {
			t.Fatal(err)
		}
		m, err := wire.Decode(cluster, msgs[0], wire.DefaultLimits(), trusted)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Table.Keys[0].Budget; got != l {
			t.Errorf("budget %v came back as %v", l, got)
		}
	}
}

func TestEncodeRefuses(t *testing.T) {
	bad := func(f func(*rebalance.Table)) *rebalance.Table {
		tb := testTable(3, 8, "a", "b")
		f(tb)
		return tb
	}
	tables := []struct {
		name string
		give *rebalance.Table
		want string
	}{
		{"shadow", bad(func(t *rebalance.Table) { t.Shadow = true }), "shadow"},
		{"unsorted regions", bad(func(t *rebalance.Table) { t.Regions = []string{"b", "a"} }), "regions not sorted"},
		{"short leases", bad(func(t *rebalance.Table) { t.Leases = t.Leases[:1] }), "1 leases for 2 regions"},
		{"row too long", bad(func(t *rebalance.Table) { t.Keys[1].Shares = []uint32{1, 2, 3} }), "key 1: shares has 3 entries for 2 regions"},
		{"unsorted keys", bad(func(t *rebalance.Table) { t.Keys[0], t.Keys[1] = t.Keys[1], t.Keys[0] }), "not sorted"},
		{"invalid budget", bad(func(t *rebalance.Table) { t.Keys[0].Budget = gcra.PerSecond(1, 0) }), "budget"},
		{"share above 10⁶", bad(func(t *rebalance.Table) { t.Keys[0].Shares = []uint32{2_000_000, 0} }), "above 1000000"},
	}
	for _, tt := range tables {
		_, err := wire.EncodeTable(cluster, tt.give, testKey, wire.DefaultMaxMessage)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q", tt.name, err, tt.want)
		}
	}
	if _, err := wire.EncodeTable(cluster, testTable(1, 4, "a"), testKey, 1023); err == nil {
		t.Error("maxMessage 1023 accepted")
	}
	if _, err := wire.EncodeTable(cluster, testTable(1, 4, "a"), testKey[:10], wire.MinMessage); err == nil {
		t.Error("a short private key accepted")
	}
	long := testTable(1, 4, "a")
	long.Keys[0].Key = strings.Repeat("k", gcra.MaxKeyLen)
	if _, err := wire.EncodeTable(cluster, long, testKey, wire.MinMessage); err == nil || !strings.Contains(err.Error(), "do not fit") {
		t.Errorf("a key larger than a message: %v", err)
	}
	if n, k := wire.TableSize(cluster, long, wire.MinMessage); n != 0 || k != 0 {
		t.Errorf("TableSize of a table that cannot be chunked = %d, %d", n, k)
	}
	r := testReport(2, 4)
	r.Keys[1].Denied = -1
	if _, err := wire.EncodeReport(cluster, r, 0, wire.MinMessage); err == nil || !strings.Contains(err.Error(), "negative") {
		t.Errorf("negative demand: %v", err)
	}
	if _, err := wire.EncodeReport("", testReport(1, 4), 0, wire.MinMessage); err == nil {
		t.Error("an empty cluster name accepted")
	}
}

func TestSignature(t *testing.T) {
	tb := testTable(3, 8, "eu-west", "us-east")
	msgs, err := wire.EncodeTable(cluster, tb, testKey, wire.DefaultMaxMessage)
	if err != nil {
		t.Fatal(err)
	}
	b := msgs[0]
	other := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{1}, ed25519.SeedSize))
	tests := []struct {
		name string
		keys []ed25519.PublicKey
		ok   bool
	}{
		{"trusted", trusted, true},
		{"second of two keys", []ed25519.PublicKey{pub(other), pub(testKey)}, true},
		{"wrong key", []ed25519.PublicKey{pub(other)}, false},
		{"no keys", nil, false},
		{"a malformed key", []ed25519.PublicKey{pub(testKey)[:5]}, false},
	}
	for _, tt := range tests {
		_, err := wire.Decode(cluster, b, wire.DefaultLimits(), tt.keys)
		if tt.ok != (err == nil) {
			t.Errorf("%s: %v", tt.name, err)
		}
		if !tt.ok && (!errors.Is(err, wire.ErrSignature) || !errors.Is(err, wire.ErrInvalid)) {
			t.Errorf("%s: %v, want ErrSignature and ErrInvalid", tt.name, err)
		}
	}
	// Any flipped byte is refused.
	for i := range b {
		c := bytes.Clone(b)
		c[i] ^= 0x20
		if _, err := wire.Decode(cluster, c, wire.DefaultLimits(), trusted); !errors.Is(err, wire.ErrInvalid) {
			t.Fatalf("byte %d flipped: %v", i, err)
		}
	}
	// A field after the signature, or none at all.
	if _, err := wire.Decode(cluster, pb(bytes.Clone(b)).u(9, 1), wire.DefaultLimits(), trusted); !errors.Is(err, wire.ErrSignature) {
		t.Errorf("a field after the signature: %v", err)
	}
	body := pb(nil).f32(3, 0).f32(4, 1).m(5, headerBody("r"))
	if _, err := wire.Decode(cluster, envelope(cluster, wire.KindTable, body, nil), wire.DefaultLimits(), trusted); !errors.Is(err, wire.ErrSignature) {
		t.Errorf("an unsigned table: %v", err)
	}
	if _, err := wire.Decode(cluster, envelope(cluster, wire.KindTable, body, testKey), wire.DefaultLimits(), trusted); err != nil {
		t.Errorf("a hand-signed table: %v", err)
	}
}

func TestOtherCluster(t *testing.T) {
	b, err := wire.EncodeAck("staging", wire.Ack{Region: "r", Agent: "a"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = wire.Decode(cluster, b, wire.DefaultLimits(), nil)
	if !errors.Is(err, wire.ErrCluster) || !errors.Is(err, wire.ErrInvalid) || !strings.Contains(err.Error(), `"staging"`) {
		t.Fatalf("%v, want ErrCluster naming staging", err)
	}
	msgs, _ := wire.EncodeTable("staging", testTable(1, 4, "r"), testKey, wire.MinMessage)
	if _, err := wire.Decode(cluster, msgs[0], wire.DefaultLimits(), trusted); !errors.Is(err, wire.ErrCluster) {
		t.Fatalf("table of another cluster: %v", err)
	}
}
