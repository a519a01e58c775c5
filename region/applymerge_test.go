package region

import (
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gcra/memstore"
	"github.com/meridian-quota/meridian/rebalance"
)

// TestApplyMergeMatchesLookup: Apply finds each key's old row by merging
// the table's sorted keys with the old sorted names, and looks up only the
// rows kept reduced past them. A node forced to look every row up (its
// sorted prefix emptied before each Apply: how Apply found rows before
// the merge) must end up with the same rows after any sequence of tables
// that add keys, drop them, bring dropped ones back while they still run
// reduced, and change shares, named or not, on time or late, with leases
// lapsing between them — whatever order the kept-reduced rows are in.
func TestApplyMergeMatchesLookup(t *testing.T) {
	pol := mustPolicy(t, testPolicy)
	rapid.Check(t, func(rt *rapid.T) {
		mk := func() *Node {
			st, err := memstore.New(memstore.Config{Clock: func() int64 { return 0 }, Shards: 1, MaxKeys: 64})
			if err != nil {
				rt.Fatal(err)
			}
			n, err := NewNode(DefaultConfig("eu", "eu-1", regions...), pol, st)
			if err != nil {
				rt.Fatal(err)
			}
			return n
		}
		merged, looked := mk(), mk()
		name := func(i int) string { return KeyName("api", []Entry{{"tenant", fmt.Sprintf("t%02d", i)}}) }
		lim := gcra.PerHour(100, 10)
		now := int64(1_000_000)
		for epoch := uint64(1); epoch <= uint64(rapid.IntRange(1, 12).Draw(rt, "tables")); epoch++ {
			// Named or not (applied reduced), and now and then late (its
			// lease already passed: applied lapsed).
			lease := now + 60_000_000
			if rapid.IntRange(0, 5).Draw(rt, "late") == 0 {
				lease = now - 1
			}
			agents := [][]string{{"eu-1"}, {"us-1"}}
			if rapid.IntRange(0, 4).Draw(rt, "unnamed") == 0 {
				agents[0] = nil
			}
			tb := &rebalance.Table{Term: 1, Epoch: epoch, Issued: now, Effective: now + 100_000, Regions: regions,
				Leases: []int64{lease, lease}, Agents: agents}
			for i := range 20 {
				if rapid.Bool().Draw(rt, "named") {
					eu := uint32(rapid.IntRange(100_000, 900_000).Draw(rt, "eu"))
					tb.Keys = append(tb.Keys, rebalance.KeyShares{Key: name(i), Budget: lim,
						Shares: []uint32{eu, rebalance.PPM - eu}, Version: uint64(rapid.IntRange(1, 3).Draw(rt, "version"))})
				}
			}
			slices.SortFunc(tb.Keys, func(a, b rebalance.KeyShares) int {
				if a.Key < b.Key {
					return -1
				}
				return 1
			})
			s := *looked.snap.Load()
			s.rows.sorted = 0
			looked.snap.Store(&s)
			errM, errL := merged.Apply(tb, now), looked.Apply(tb, now)
			if (errM == nil) != (errL == nil) {
				rt.Fatalf("table %d: merged %v, looked up %v", epoch, errM, errL)
			}
			a, b := merged.snap.Load().rows, looked.snap.Load().rows
			if !slices.Equal(a.names, b.names) {
				rt.Fatalf("table %d: names %q, looked up %q", epoch, a.names, b.names)
			}
			for i := range a.rows {
				if *a.rows[i] != *b.rows[i] || a.index[a.names[i]] != i {
					rt.Fatalf("table %d: row %s: %+v, looked up %+v", epoch, a.names[i], *a.rows[i], *b.rows[i])
				}
			}
			now += int64(rapid.IntRange(0, 90_000_000).Draw(rt, "advance"))
			// The lease may pass before the next table: both nodes lapse
			// (lapse keeps the rows' order and the sorted prefix).
			merged.Tick(now)
			looked.Tick(now)
		}
	})
}
