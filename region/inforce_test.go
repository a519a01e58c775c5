package region

import "testing"

// An acknowledgement claims a table in force on the store: its effective
// time has passed on the store's clock, which may lag the node's by
// MaxSkew. So InForce must never name a table before its effective time
// plus MaxSkew on the node's clock — also when a newer table supersedes it
// in between. Fails on 2023668: Apply recorded the superseded table as the
// one in force as soon as its effective time had passed, and InForce named
// (1,1) 2 µs after its effective time, 499,998 µs before effective +
// MaxSkew.
func TestNodeInForceNeverBeforeEffectivePlusSkew(t *testing.T) {
	n, err := NewNode(DefaultConfig("eu", "eu-1", regions...), mustPolicy(t, testPolicy), &breakable{})
	if err != nil {
		t.Fatal(err)
	}
	skew := n.cfg.MaxSkew.Microseconds()
	const e1 = int64(1_700_000_000_000_000)
	e2 := e1 + 10*skew
	if err := n.Apply(table(1, 1, e1-skew, e1, 1, 500_000, acme), e1+1); err != nil {
		t.Fatal(err)
	}
	// (1,2) supersedes (1,1) before (1,1) is surely in force on the store.
	if err := n.Apply(table(1, 2, e1, e2, 2, 600_000, acme), e1+2); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		now              int64
		wantTerm, wantEp uint64
	}{
		{e1 + 2, 0, 0},
		{e1 + skew - 1, 0, 0},
		// (1,1) runs on the store from e1 until (1,2) takes effect at e2.
		{e1 + skew, 1, 1},
		{e2 + skew - 1, 1, 1},
		{e2 + skew, 1, 2},
	}
	for _, tt := range tests {
		if term, epoch := n.InForce(tt.now); term != tt.wantTerm || epoch != tt.wantEp {
			t.Errorf("InForce(e1%+dµs) = (%d,%d), want (%d,%d)", tt.now-e1, term, epoch, tt.wantTerm, tt.wantEp)
		}
	}
	// A table superseded by one that takes effect before it never comes
	// into force: InForce skips it.
	m, err := NewNode(DefaultConfig("eu", "eu-1", regions...), mustPolicy(t, testPolicy), &breakable{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Apply(table(1, 1, e1-skew, e2, 1, 500_000, acme), e1); err != nil {
		t.Fatal(err)
	}
	if err := m.Apply(table(1, 2, e1, e1, 2, 600_000, acme), e1+1); err != nil {
		t.Fatal(err)
	}
	for _, now := range []int64{e1 + skew - 1, e1 + skew, e2 + skew} {
		want := [2]uint64{1, 2}
		if now < e1+skew {
			want = [2]uint64{}
		}
		if term, epoch := m.InForce(now); [2]uint64{term, epoch} != want {
			t.Errorf("superseded by an earlier change: InForce(e1%+dµs) = (%d,%d), want %v", now-e1, term, epoch, want)
		}
	}
}
