package wire_test

import (
	"crypto/ed25519"
	"fmt"
	"reflect"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gossip/wire"
	"github.com/meridian-quota/meridian/rebalance"
)

const cluster = "prod"

// testKey is a fixed coordinator key, so encodings are reproducible.
var testKey = ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize))

func pub(k ed25519.PrivateKey) ed25519.PublicKey { return k.Public().(ed25519.PublicKey) }

var trusted = []ed25519.PublicKey{pub(testKey)}

// budgets are limits of every construction the codec must rebuild.
var budgets = []gcra.Limit{
	gcra.PerSecond(100, 20),
	gcra.PerMinute(7, 3),
	gcra.PerHour(3600, 60),
	gcra.New(3, 7*time.Second, 2),
	gcra.FromInterval(1234, 5),
	{},
}

// keyName is key i padded to n bytes; names sort in i order.
func keyName(i, n int) string { return fmt.Sprintf("k%0*d", n-1, i) }

// testTable is a valid table of n keys with names of keyLen bytes across
// regions (sorted), rows alternating with and without Bursts.
func testTable(n, keyLen int, regions ...string) *rebalance.Table {
	R := len(regions)
	t := &rebalance.Table{Term: 3, Epoch: 41, Issued: 1_700_000_000_000_000, Effective: 1_700_000_000_500_000,
		PolicyVersion: "sha256:0f3a", Regions: regions, Leases: make([]int64, R), Agents: make([][]string, R)}
	for r := range R {
		t.Leases[r] = t.Issued + int64(r+1)*10_000_000
		for a := range r {
			t.Agents[r] = append(t.Agents[r], fmt.Sprintf("agent-%d", a))
		}
	}
	if n > 0 {
		t.Keys = make([]rebalance.KeyShares, n)
	}
	for i := range n {
		ks := &t.Keys[i]
		ks.Key = keyName(i, keyLen)
		ks.Budget = budgets[i%len(budgets)]
		ks.Version = uint64(i % 17)
		ks.Shares = make([]uint32, R)
		left := uint32(1_000_000)
		for r := range R - 1 {
			ks.Shares[r] = uint32((i*7919 + r*104729) % int(left+1))
			left -= ks.Shares[r]
		}
		ks.Shares[R-1] = left
		if i%2 == 0 {
			ks.Bursts = make([]int64, R)
			for r := range R {
				ks.Bursts[r] = int64(i+r) % 50
			}
		}
	}
	return t
}

func testReport(n, keyLen int) *rebalance.Report {
	r := &rebalance.Report{Region: "eu-west", Agent: "agent-7", Interval: 850_000, Term: 3, Epoch: 40, PolicyVersion: "sha256:0f3a"}
	if n > 0 {
		r.Keys = make([]rebalance.KeyDemand, n)
	}
	for i := range n {
		r.Keys[i] = rebalance.KeyDemand{Key: keyName(i, keyLen), Demand: rebalance.Demand{
			Offered: int64(i % 1000), OfferedCost: int64(i%1000) * 3, Admitted: int64(i % 700), Denied: int64(i%1000)*3 - int64(i%700)}}
		if r.Keys[i].Denied < 0 {
			r.Keys[i].Denied = 0
		}
	}
	return r
}

// fataler is what testing.T and rapid.T share.
type fataler interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// decodeAll decodes and assembles msgs into one report or table.
func decodeAll(t fataler, msgs [][]byte, lim wire.Limits) (*rebalance.Report, *rebalance.Table) {
	t.Helper()
	a := wire.NewAssembler(lim, 4)
	for i, b := range msgs {
		if len(b) > lim.MaxMessage {
			t.Fatalf("message %d: %d bytes, above %d", i, len(b), lim.MaxMessage)
		}
		m, err := wire.Decode(cluster, b, lim, trusted)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		switch m.Kind {
		case wire.KindReport:
			r, done, err := a.AddReport(m.Report)
			if err != nil {
				t.Fatalf("message %d: %v", i, err)
			}
			if done != (i == len(msgs)-1) {
				t.Fatalf("message %d of %d: done %v", i, len(msgs), done)
			}
			if done {
				return r, nil
			}
		case wire.KindTable:
			tb, done, err := a.AddTable(m.Table)
			if err != nil {
				t.Fatalf("message %d: %v", i, err)
			}
			if done != (i == len(msgs)-1) {
				t.Fatalf("message %d of %d: done %v", i, len(msgs), done)
			}
			if done {
				return nil, tb
			}
		default:
			t.Fatalf("message %d: kind %v", i, m.Kind)
		}
	}
	t.Fatal("no messages")
	return nil, nil
}

func equalTables(t fataler, got, want *rebalance.Table) {
	t.Helper()
	if reflect.DeepEqual(got, want) {
		return
	}
	g, w := *got, *want
	g.Keys, w.Keys = nil, nil
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("header:\n got %+v\nwant %+v", g, w)
	}
	if len(got.Keys) != len(want.Keys) {
		t.Fatalf("%d keys, want %d", len(got.Keys), len(want.Keys))
	}
	for i := range got.Keys {
		if !reflect.DeepEqual(got.Keys[i], want.Keys[i]) {
			t.Fatalf("key %d:\n got %+v\nwant %+v", i, got.Keys[i], want.Keys[i])
		}
	}
	t.Fatal("tables differ")
}

// --- hand-built messages, for what the encoders refuse to write ---

type pb []byte

func (b pb) u(num protowire.Number, v uint64) pb {
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}
func (b pb) i(num protowire.Number, v int64) pb { return b.u(num, uint64(v)) }
func (b pb) z(num protowire.Number, v int64) pb { return b.u(num, protowire.EncodeZigZag(v)) }
func (b pb) s(num protowire.Number, v string) pb {
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), v)
}
func (b pb) m(num protowire.Number, v []byte) pb {
	return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), v)
}
func (b pb) f32(num protowire.Number, v uint32) pb {
	return protowire.AppendFixed32(protowire.AppendTag(b, num, protowire.Fixed32Type), v)
}
func (b pb) packed(num protowire.Number, v ...uint64) pb {
	var p []byte
	for _, x := range v {
		p = protowire.AppendVarint(p, x)
	}
	return b.m(num, p)
}

// envelope wraps body; a table is signed with key (unsigned if nil).
func envelope(clu string, kind wire.Kind, body []byte, key ed25519.PrivateKey) []byte {
	b := pb(nil).u(1, wire.Version).s(2, clu).u(3, uint64(kind)).m(4, body)
	if key != nil {
		b = b.m(5, ed25519.Sign(key, b))
	}
	return b
}

// reportBody is a valid report chunk body to build on.
func reportBody() pb {
	return pb(nil).s(1, "eu-west").s(2, "a1").z(3, 9).u(4, 1).u(5, 2).z(7, 100).f32(8, 0).f32(9, 1)
}

// headerBody is a valid table header of regions (agents: none).
func headerBody(regions ...string) pb {
	h := pb(nil).z(1, 10).z(2, 20)
	for _, r := range regions {
		h = h.s(4, r)
	}
	var leases []uint64
	for range regions {
		leases = append(leases, protowire.EncodeZigZag(1000))
	}
	h = h.packed(5, leases...)
	for range regions {
		h = h.m(6, nil)
	}
	return h
}

// row is a valid KeyShares of key with shares.
func row(key string, shares ...uint64) pb {
	return pb(nil).s(1, key).packed(3, shares...).i(7, 1000).i(8, 10)
}
