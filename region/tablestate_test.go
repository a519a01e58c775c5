package region

import (
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
