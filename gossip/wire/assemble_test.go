package wire_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/meridian-quota/meridian/gossip/wire"
	"github.com/meridian-quota/meridian/rebalance"
)

func reportChunks(t *testing.T, r *rebalance.Report) []*wire.ReportChunk {
	t.Helper()
	msgs, err := wire.EncodeReport(cluster, r, 42, wire.MinMessage)
	if err != nil {
		t.Fatal(err)
	}
	var out []*wire.ReportChunk
	for _, b := range msgs {
		m, err := wire.Decode(cluster, b, wire.DefaultLimits(), nil)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m.Report)
	}
	return out
}

func tableChunks(t *testing.T, tb *rebalance.Table) []*wire.TableChunk {
	t.Helper()
	msgs, err := wire.EncodeTable(cluster, tb, testKey, wire.MinMessage)
	if err != nil {
		t.Fatal(err)
	}
	var out []*wire.TableChunk
	for _, b := range msgs {
		m, err := wire.Decode(cluster, b, wire.DefaultLimits(), trusted)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m.Table)
	}
	return out
}

func TestAssemblerReports(t *testing.T) {
	want := testReport(200, 30)
	cs := reportChunks(t, want)
	if len(cs) < 4 {
		t.Fatalf("%d chunks, want at least 4", len(cs))
	}
	tests := []struct {
		name  string
		order []int
	}{
		{"in order", []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
		{"reversed", []int{9, 8, 7, 6, 5, 4, 3, 2, 1, 0}},
		{"shuffled", []int{3, 0, 9, 5, 1, 7, 2, 8, 6, 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := wire.NewAssembler(wire.DefaultLimits(), 2)
			var got *rebalance.Report
			n := 0
			for _, i := range tt.order {
				if i >= len(cs) {
					continue
				}
				n++
				r, done, err := a.AddReport(cs[i])
				if err != nil {
					t.Fatal(err)
				}
				if done != (n == len(cs)) {
					t.Fatalf("chunk %d (%d of %d): done %v", i, n, len(cs), done)
				}
				got = r
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatal("reassembled report differs")
			}
			if a.Pending() != 0 || a.Dropped() != 0 {
				t.Fatalf("pending %d dropped %d", a.Pending(), a.Dropped())
			}
		})
	}
}

func TestAssemblerRefuses(t *testing.T) {
	cs := reportChunks(t, testReport(200, 30))

	t.Run("duplicate chunk", func(t *testing.T) {
		a := wire.NewAssembler(wire.DefaultLimits(), 2)
		if _, _, err := a.AddReport(cs[1]); err != nil {
			t.Fatal(err)
		}
		_, _, err := a.AddReport(cs[1])
		if !errors.Is(err, wire.ErrInvalid) || !strings.Contains(err.Error(), "chunk 1: duplicate chunk") {
			t.Fatalf("%v", err)
		}
		// The set is kept and still completes.
		var done bool
		for i, c := range cs {
			if i != 1 {
				_, done, err = a.AddReport(c)
				if err != nil {
					t.Fatal(err)
				}
			}
		}
		if !done {
			t.Fatal("not done")
		}
	})

	t.Run("count disagrees", func(t *testing.T) {
		a := wire.NewAssembler(wire.DefaultLimits(), 2)
		if _, _, err := a.AddReport(cs[0]); err != nil {
			t.Fatal(err)
		}
		c := *cs[1]
		c.Count++
		_, _, err := a.AddReport(&c)
		if !errors.Is(err, wire.ErrInvalid) || !strings.Contains(err.Error(), "but chunk 0 says") {
			t.Fatalf("%v", err)
		}
		if a.Pending() != 0 || a.Dropped() != 1 {
			t.Fatalf("pending %d dropped %d", a.Pending(), a.Dropped())
		}
	})

	t.Run("other fields disagree", func(t *testing.T) {
		a := wire.NewAssembler(wire.DefaultLimits(), 2)
		if _, _, err := a.AddReport(cs[0]); err != nil {
			t.Fatal(err)
		}
		c := *cs[1]
		c.Report.Epoch++
		if _, _, err := a.AddReport(&c); !errors.Is(err, wire.ErrInvalid) {
			t.Fatalf("%v", err)
		}
	})

	t.Run("index out of range", func(t *testing.T) {
		a := wire.NewAssembler(wire.DefaultLimits(), 2)
		for _, c := range []wire.ReportChunk{{Index: 2, Count: 2}, {Index: -1, Count: 2}, {Index: 0, Count: 0}, {Index: 0, Count: 1 << 20}} {
			c.Report = cs[0].Report
			if _, _, err := a.AddReport(&c); !errors.Is(err, wire.ErrInvalid) {
				t.Errorf("index %d count %d: %v", c.Index, c.Count, err)
			}
		}
	})

	t.Run("too many keys", func(t *testing.T) {
		lim := wire.DefaultLimits()
		lim.MaxKeys = 50
		a := wire.NewAssembler(lim, 2)
		var err error
		for _, c := range cs {
			if _, _, err = a.AddReport(c); err != nil {
				break
			}
		}
		if !errors.Is(err, wire.ErrInvalid) || !strings.Contains(err.Error(), "more than 50 keys") {
			t.Fatalf("%v", err)
		}
	})

	t.Run("pending sets are bounded", func(t *testing.T) {
		a := wire.NewAssembler(wire.DefaultLimits(), 2)
		for agent := range 3 { // three partial reports, oldest first
			c := *cs[0]
			c.Report.Agent = string(rune('a' + agent))
			if _, _, err := a.AddReport(&c); err != nil {
				t.Fatal(err)
			}
		}
		if a.Pending() != 2 || a.Dropped() != 1 {
			t.Fatalf("pending %d dropped %d, want 2 and 1", a.Pending(), a.Dropped())
		}
		// Agent "a" was dropped: its chunk 1 starts a new set; "c" is kept.
		c := *cs[1]
		c.Report.Agent = "c"
		if _, _, err := a.AddReport(&c); err != nil {
			t.Fatal(err)
		}
		if a.Pending() != 2 || a.Dropped() != 1 {
			t.Fatalf("pending %d dropped %d", a.Pending(), a.Dropped())
		}
		c.Report.Agent = "a"
		if _, _, err := a.AddReport(&c); err != nil {
			t.Fatal(err)
		}
		if a.Pending() != 2 || a.Dropped() != 2 {
			t.Fatalf("pending %d dropped %d, want b dropped", a.Pending(), a.Dropped())
		}
	})

	t.Run("invalid limits", func(t *testing.T) {
		if _, _, err := wire.NewAssembler(wire.Limits{}, 1).AddReport(cs[0]); err == nil {
			t.Fatal("zero limits accepted")
		}
	})
}

func TestAssemblerTables(t *testing.T) {
	want := testTable(100, 30, "eu", "us")
	cs := tableChunks(t, want)
	if len(cs) < 3 {
		t.Fatalf("%d chunks", len(cs))
	}

	t.Run("header last", func(t *testing.T) {
		a := wire.NewAssembler(wire.DefaultLimits(), 1)
		var got *rebalance.Table
		for i := len(cs) - 1; i >= 0; i-- {
			tb, done, err := a.AddTable(cs[i])
			if err != nil || done != (i == 0) {
				t.Fatalf("chunk %d: %v %v", i, done, err)
			}
			got = tb
		}
		equalTables(t, got, want)
	})

	t.Run("header inconsistent with the rows", func(t *testing.T) {
		a := wire.NewAssembler(wire.DefaultLimits(), 1)
		c := *cs[1]
		c.Keys = append([]rebalance.KeyShares(nil), c.Keys...)
		c.Keys[2].Shares = []uint32{1, 2, 3}
		var err error
		for i := range cs {
			ch := cs[i]
			if i == 1 {
				ch = &c
			}
			if _, _, err = a.AddTable(ch); err != nil {
				break
			}
		}
		if !errors.Is(err, wire.ErrInvalid) || !strings.Contains(err.Error(), "chunk 1 key 2: shares has 3 entries for 2 regions") {
			t.Fatalf("%v", err)
		}
		if a.Pending() != 0 || a.Dropped() != 1 {
			t.Fatalf("pending %d dropped %d", a.Pending(), a.Dropped())
		}
	})

	t.Run("keys out of order across chunks", func(t *testing.T) {
		a := wire.NewAssembler(wire.DefaultLimits(), 1)
		c0, c1 := *cs[1], *cs[2]
		c0.Index, c1.Index = 2, 1
		var err error
		for _, ch := range append([]*wire.TableChunk{cs[0], &c0, &c1}, cs[3:]...) {
			if _, _, err = a.AddTable(ch); err != nil {
				break
			}
		}
		if !errors.Is(err, wire.ErrInvalid) || !strings.Contains(err.Error(), "keys not sorted and distinct") {
			t.Fatalf("%v", err)
		}
	})

	t.Run("header in the wrong chunk", func(t *testing.T) {
		a := wire.NewAssembler(wire.DefaultLimits(), 1)
		c := *cs[1]
		c.Header = cs[0].Header
		if _, _, err := a.AddTable(&c); !errors.Is(err, wire.ErrInvalid) {
			t.Fatalf("%v", err)
		}
		c = *cs[0]
		c.Header = nil
		if _, _, err := a.AddTable(&c); !errors.Is(err, wire.ErrInvalid) {
			t.Fatalf("%v", err)
		}
	})

	t.Run("one chunk", func(t *testing.T) {
		small := testTable(3, 8, "eu", "us")
		one := tableChunks(t, small)
		tb, done, err := wire.NewAssembler(wire.DefaultLimits(), 1).AddTable(one[0])
		if err != nil || !done {
			t.Fatal(done, err)
		}
		equalTables(t, tb, small)
	})
}
