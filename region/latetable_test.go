package region

import (
	"context"
	"testing"

	"github.com/meridian-quota/meridian/gcra/memstore"
	"github.com/meridian-quota/meridian/rebalance"
)

// An agent cut off while its lease lapses comes back to the tables it
// missed: one that restores the key's version, then one with a new version
// whose effective time (an increase's fence) is before the lapse. Every
// schedule the node makes must be one the store accepts: a change never
// takes effect before the version it replaces. Fails on 2023668: the new
// version took effect at its table's effective time, before the lapse's
// reduction it replaced, the store refused the schedule ("previous limit
// effective after the current one") and the key fell to its failure mode
// (Decision.Fallback, StoreErrors 1). Found by the transition world
// (sim, TestTransitionRandom).
func TestNodeLateTableBeforeALapseMakesAValidSchedule(t *testing.T) {
	const t0 = int64(1_700_000_000_000_000)
	var clock int64 = t0
	ms, err := memstore.New(memstore.Config{Clock: func() int64 { return clock }, Shards: 1, MaxKeys: 100})
	if err != nil {
		t.Fatal(err)
	}
	n, err := NewNode(DefaultConfig("eu", "eu-1", regions...), mustPolicy(t, testPolicy), ms)
	if err != nil {
		t.Fatal(err)
	}
	lease := func(tb *rebalance.Table, at int64) *rebalance.Table {
		tb.Leases = []int64{at, at}
		return tb
	}
	// (1,1) gives eu 60 %, lease until t0+10 s.
	if err := n.Apply(lease(table(1, 1, t0, t0, 1, 600_000, acme), t0+10e6), t0); err != nil {
		t.Fatal(err)
	}
	// Cut off: the lease lapses at t0+10 s.
	clock = t0 + 11e6
	n.Tick(clock)
	if !n.Table().Lapsed {
		t.Fatal("setup: the lease did not lapse")
	}
	// Back: (1,2) renews the lease with the same version (restored now),
	// then (1,3) raises eu with an effective time set before the lapse.
	if err := n.Apply(lease(table(1, 2, t0+5e6, t0+5e6, 1, 600_000, acme), t0+40e6), clock); err != nil {
		t.Fatal(err)
	}
	if err := n.Apply(lease(table(1, 3, t0+6e6, t0+8e6, 2, 700_000, acme), t0+40e6), clock); err != nil {
		t.Fatal(err)
	}
	var d Decision
	if err := n.Resolve(req(1, tenant("acme")), &d); err != nil || len(d.Matches) != 1 {
		t.Fatalf("resolve: %v", err)
	}
	if s := d.Matches[0].Schedule; !s.Valid() {
		t.Errorf("schedule %+v is not one the store accepts", s)
	}
	if err := n.Decide(context.Background(), clock, req(1, tenant("acme")), &d); err != nil {
		t.Fatal(err)
	}
	if d.Fallback || n.Stats().StoreErrors != 0 {
		t.Errorf("the store refused the decision: fallback %v, store errors %d", d.Fallback, n.Stats().StoreErrors)
	}
}

// A table that arrives after its own lease has passed (a late copy, a
// reconnect) is applied lapsed: the node never runs its shares, not even
// for the instants a store whose clock lags the node's still sees before
// now. Fails on 2023668: the node restored the table's share at now and
// reduced it again at now, so a store MaxSkew behind ran the restored 60 %
// (T=60 s instead of the safe 720 s). Found by the transition world.
func TestNodeTableArrivingAfterItsLeaseRunsReduced(t *testing.T) {
	const t0 = int64(1_700_000_000_000_000)
	n, err := NewNode(DefaultConfig("eu", "eu-1", regions...), mustPolicy(t, testPolicy), &breakable{})
	if err != nil {
		t.Fatal(err)
	}
	skew := n.cfg.MaxSkew.Microseconds()
	budget := n.Policy().Rules()[0].Limit
	safe := SafeLimit(budget, n.safe, len(regions))
	withLease := func(tb *rebalance.Table, at int64) *rebalance.Table {
		tb.Leases = []int64{at, at}
		return tb
	}
	if err := n.Apply(withLease(table(1, 1, t0, t0, 1, 600_000, acme), t0+10e6), t0); err != nil {
		t.Fatal(err)
	}
	now := t0 + 30e6
	n.Tick(now) // lapsed at t0+10 s
	// (1,2), same shares, issued at t0+5 s with a lease to t0+20 s,
	// arrives at t0+30 s.
	if err := n.Apply(withLease(table(1, 2, t0+5e6, t0+5e6, 1, 600_000, acme), t0+20e6), now); err != nil {
		t.Fatal(err)
	}
	for _, store := range []int64{now - skew, now, now + skew} {
		if got := limitAt(t, n, "acme", store); got != safe {
			t.Errorf("after a table whose lease had passed: limit at now%+dµs on the store = %v, want the safe %v", store-now, got, safe)
		}
	}
	// (1,3), a new version, likewise late.
	if err := n.Apply(withLease(table(1, 3, t0+6e6, t0+6e6, 2, 700_000, acme), t0+21e6), now+1); err != nil {
		t.Fatal(err)
	}
	for _, store := range []int64{now - skew, now, now + skew} {
		if got := limitAt(t, n, "acme", store); got != safe {
			t.Errorf("after a new version whose lease had passed: limit at now%+dµs on the store = %v, want the safe %v", store-now, got, safe)
		}
	}
	if !n.Table().Lapsed {
		t.Error("Table().Lapsed is false after a table whose lease had passed")
	}
}
