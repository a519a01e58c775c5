package wire_test

import (
	"bytes"
	"reflect"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gossip/wire"
	"github.com/meridian-quota/meridian/rebalance"
)

var nameGen = rapid.StringMatching(`[a-z0-9._/=-]{1,12}`)

func keysGen(max int) *rapid.Generator[[]string] {
	return rapid.Custom(func(t *rapid.T) []string {
		ks := rapid.SliceOfNDistinct(rapid.StringMatching(`[a-zA-Z0-9/=_\x{e9}-]{1,90}`), 0, max, rapid.ID[string]).Draw(t, "keys")
		slices.Sort(ks)
		return ks
	})
}

var budgetGen = rapid.Custom(func(t *rapid.T) gcra.Limit {
	for {
		var l gcra.Limit
		switch rapid.IntRange(0, 2).Draw(t, "kind") {
		case 0:
			return l
		case 1:
			l = gcra.New(rapid.Int64Range(1, 1e6).Draw(t, "rate"),
				time.Duration(rapid.Int64Range(1, 86_400e6).Draw(t, "period µs"))*time.Microsecond,
				rapid.Int64Range(1, 1e5).Draw(t, "burst"))
		default:
			l = gcra.FromInterval(rapid.Int64Range(1, 1e9).Draw(t, "interval"), rapid.Int64Range(1, 1e5).Draw(t, "burst"))
		}
		if l.Validate() == nil {
			return l
		}
	}
})

func reportGen(t *rapid.T) *rebalance.Report {
	r := &rebalance.Report{Region: nameGen.Draw(t, "region"), Agent: nameGen.Draw(t, "agent"),
		Interval: rapid.Int64().Draw(t, "interval"), Term: rapid.Uint64().Draw(t, "term"), Epoch: rapid.Uint64().Draw(t, "epoch"),
		PolicyVersion: rapid.StringMatching(`[a-f0-9]{0,64}`).Draw(t, "policy"),
		Features:      rapid.Uint32().Draw(t, "features"), Delta: rapid.Bool().Draw(t, "delta")}
	for _, k := range keysGen(200).Draw(t, "keys") {
		d := func(s string) int64 { return rapid.Int64Min(0).Draw(t, s) }
		r.Keys = append(r.Keys, rebalance.KeyDemand{Key: k, Demand: rebalance.Demand{
			Offered: d("offered"), OfferedCost: d("cost"), Admitted: d("admitted"), Denied: d("denied")}})
	}
	return r
}

func tableGen(t *rapid.T) *rebalance.Table {
	regions := rapid.SliceOfNDistinct(nameGen, 1, 6, rapid.ID[string]).Draw(t, "regions")
	slices.Sort(regions)
	R := len(regions)
	tb := &rebalance.Table{Term: rapid.Uint64().Draw(t, "term"), Epoch: rapid.Uint64().Draw(t, "epoch"),
		Issued: rapid.Int64Range(0, gcra.MaxTime-1).Draw(t, "issued"), Effective: rapid.Int64Range(0, gcra.MaxTime-1).Draw(t, "effective"),
		PolicyVersion: rapid.StringMatching(`[a-f0-9]{0,64}`).Draw(t, "policy"), Regions: regions,
		Leases: make([]int64, R), Agents: make([][]string, R), Features: rapid.Uint32().Draw(t, "features"),
		BlindUntil: rapid.OneOf(rapid.Just(int64(0)), rapid.Int64Range(0, gcra.MaxTime-1)).Draw(t, "blind until")}
	for r := range R {
		tb.Leases[r] = rapid.Int64Range(0, gcra.MaxTime-1).Draw(t, "lease")
		if a := rapid.SliceOfNDistinct(nameGen, 0, 5, rapid.ID[string]).Draw(t, "agents"); len(a) > 0 {
			slices.Sort(a)
			tb.Agents[r] = a
		}
	}
	if rapid.Bool().Draw(t, "resync") {
		tb.Resync = make([][]string, R)
		for r := range R {
			if a := rapid.SliceOfNDistinct(nameGen, 0, 3, rapid.ID[string]).Draw(t, "resync agents"); len(a) > 0 {
				slices.Sort(a)
				tb.Resync[r] = a
			}
		}
	}
	for _, k := range keysGen(150).Draw(t, "keys") {
		ks := rebalance.KeyShares{Key: k, Budget: budgetGen.Draw(t, "budget"), Version: rapid.Uint64Range(0, 1<<60).Draw(t, "version"),
			Shares: make([]uint32, R)}
		left := uint32(1_000_000)
		for r := range R {
			ks.Shares[r] = rapid.Uint32Range(0, left).Draw(t, "share")
			left -= ks.Shares[r]
		}
		if rapid.Bool().Draw(t, "bursts") {
			ks.Bursts = make([]int64, R)
			for r := range R {
				ks.Bursts[r] = rapid.Int64Min(0).Draw(t, "burst")
			}
		}
		tb.Keys = append(tb.Keys, ks)
	}
	return tb
}

func TestReportProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r := reportGen(t)
		sent := rapid.Int64().Draw(t, "sent")
		max := rapid.IntRange(wire.MinMessage, 8192).Draw(t, "maxMessage")
		msgs, err := wire.EncodeReport(cluster, r, sent, max)
		if err != nil {
			t.Fatal(err)
		}
		total := 0
		for _, b := range msgs {
			total += len(b)
		}
		if n, k := wire.ReportSize(cluster, r, sent, max); n != total || k != len(msgs) {
			t.Fatalf("ReportSize = %d, %d; encoded %d, %d", n, k, total, len(msgs))
		}
		lim := wire.DefaultLimits()
		lim.MaxMessage = max
		got, _ := decodeAll(t, msgs, lim)
		if !equalReports(got, r) {
			t.Fatalf("got %+v\nwant %+v", got, r)
		}
		again, _ := wire.EncodeReport(cluster, r, sent, max)
		if !slices.EqualFunc(again, msgs, bytes.Equal) {
			t.Fatal("not deterministic")
		}
	})
}

func TestTableProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		tb := tableGen(t)
		max := rapid.IntRange(wire.MinMessage, 8192).Draw(t, "maxMessage")
		msgs, err := wire.EncodeTable(cluster, tb, testKey, max)
		if err != nil {
			t.Fatal(err)
		}
		total := 0
		for _, b := range msgs {
			total += len(b)
		}
		if n, k := wire.TableSize(cluster, tb, max); n != total || k != len(msgs) {
			t.Fatalf("TableSize = %d, %d; encoded %d, %d", n, k, total, len(msgs))
		}
		lim := wire.DefaultLimits()
		lim.MaxMessage = max
		_, got := decodeAll(t, msgs, lim)
		equalTables(t, got, tb)
	})
}

// equalReports is reflect.DeepEqual but for nil and empty Keys.
func equalReports(a, b *rebalance.Report) bool {
	x, y := *a, *b
	x.Keys, y.Keys = nil, nil
	return reflect.DeepEqual(x, y) && slices.Equal(a.Keys, b.Keys)
}
