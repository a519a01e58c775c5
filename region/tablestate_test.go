package region

import (
	"errors"
	"testing"

	"github.com/meridian-quota/meridian/gcra/memstore"
	"github.com/meridian-quota/meridian/rebalance"
)

// TestTableStateIssuedAndSafeShare: Table reports the applied table's
// Issued (0 before any), keeps it through a lapse and a policy reload, and
// moves it with the next table; SafeShare is the configured floor.
func TestTableStateIssuedAndSafeShare(t *testing.T) {
	ms, err := memstore.New(memstore.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig("eu", "eu-1", regions...)
	n, err := NewNode(cfg, mustPolicy(t, testPolicy), ms)
	if err != nil {
		t.Fatal(err)
	}
	// 10 % split over two regions.
	if got, want := n.SafeShare(), uint32(50_000); got != want {
		t.Errorf("SafeShare = %d, want %d", got, want)
	}
	cfg.SafeShare = 123_456
	if n2, err := NewNode(cfg, mustPolicy(t, testPolicy), ms); err != nil {
		t.Fatal(err)
	} else if got := n2.SafeShare(); got != 123_456 {
		t.Errorf("SafeShare with an explicit floor = %d, want 123456", got)
	}

	if s := n.Table(); s.HasTable || s.Issued != 0 {
		t.Fatalf("before any table: %+v, want no table and Issued 0", s)
	}
	const now = int64(1_700_000_000_000_000)
	tb := table(1, 1, now-20e6, now-hour, 1, 700_000, acme)
	tb.Leases = []int64{now - 10e6, now - 10e6}
	if err := n.Apply(tb, now-20e6); err != nil {
		t.Fatal(err)
	}
	if got := n.Table().Issued; got != now-20e6 {
		t.Errorf("Issued = %d, want %d", got, now-20e6)
	}
	n.Tick(now - 19e6)
	n.Tick(now)
	if s := n.Table(); !s.Lapsed || s.Issued != now-20e6 {
		t.Errorf("after the lapse: %+v, want lapsed with Issued %d", s, now-20e6)
	}
	n.SetPolicy(mustPolicy(t, testPolicy))
	if got := n.Table().Issued; got != now-20e6 {
		t.Errorf("after SetPolicy: Issued = %d, want %d", got, now-20e6)
	}
	// A refused table changes nothing.
	if err := n.Apply(&rebalance.Table{Term: 1, Epoch: 1, Issued: now}, now); err == nil {
		t.Fatal("stale table applied")
	}
	if got := n.Table().Issued; got != now-20e6 {
		t.Errorf("after a refused table: Issued = %d, want %d", got, now-20e6)
	}
	if err := n.Apply(table(1, 2, now, now, 1, 700_000, acme), now); err != nil {
		t.Fatal(err)
	}
	if got := n.Table().Issued; got != now {
		t.Errorf("after the next table: Issued = %d, want %d", got, now)
	}
}

// A node refuses a table not ordered after the one it holds, by (term,
// epoch), whatever its epoch (ErrStaleTable), and a refused table changes
// nothing. (Moved here from the model agent of rebalance's transition
// tests.)
func TestNodeRefusesOlderTable(t *testing.T) {
	tests := []struct {
		give       [][2]uint64
		wantAccept []bool
	}{
		{[][2]uint64{{2, 5}, {1, 9}, {2, 5}, {2, 4}, {2, 6}, {3, 1}, {2, 99}}, []bool{true, false, false, false, true, true, false}},
		{[][2]uint64{{1, 1}, {1, 2}, {1, 1}}, []bool{true, true, false}},
	}
	const now = int64(1_700_000_000_000_000)
	for _, tt := range tests {
		n, err := NewNode(DefaultConfig("eu", "eu-1", regions...), mustPolicy(t, testPolicy), &breakable{})
		if err != nil {
			t.Fatal(err)
		}
		held := [2]uint64{}
		for i, te := range tt.give {
			err := n.Apply(table(te[0], te[1], now, now, 1, 500_000, acme), now)
			if got := err == nil; got != tt.wantAccept[i] || (err != nil && !errors.Is(err, ErrStaleTable)) {
				t.Errorf("after %v, Apply (%d,%d) = %v, want accepted %v", tt.give[:i], te[0], te[1], err, tt.wantAccept[i])
			}
			if err == nil {
				held = te
			}
			if st := n.Table(); [2]uint64{st.Term, st.Epoch} != held {
				t.Errorf("after %v: holds (%d,%d), want %v", tt.give[:i+1], st.Term, st.Epoch, held)
			}
		}
	}
}
