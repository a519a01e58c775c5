package region

import (
	"context"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gcra/memstore"
	"github.com/meridian-quota/meridian/rebalance"
)

// TestDecisionLapsesAPassedLease: a node frozen past its lease (no Tick
// since) decides its next request at min(last, safe), not at the old
// table's share, which the coordinator has handed to the other regions by
// then. Fails on a0031d6: only Tick lapsed the lease, so the first
// decisions after a resume ran the old share — the explorer's region-return
// schedules put Σ in force at 1,042,627 ppm.
func TestDecisionLapsesAPassedLease(t *testing.T) {
	pol, cfg, n, clock := clockedNode(t, "domains:\n  - domain: api\n    descriptors:\n      - key: tenant\n        rate_limit: {unit: second, requests_per_unit: 1000, burst: 100}\n")
	const s = int64(time.Second / time.Microsecond)
	now := *clock
	req := &Request{Domain: "api", Descriptors: []Descriptor{{Entries: []Entry{{Key: "tenant", Value: "acme"}}}}}
	key := KeyName("api", req.Descriptors[0].Entries)
	rule := pol.Match("api", req.Descriptors[0].Entries)
	tb := &rebalance.Table{Term: 1, Epoch: 1, Issued: now, Effective: now - 60*s, Regions: cfg.Regions,
		Leases: []int64{now + 30*s, now + 30*s, now + 30*s}, Agents: [][]string{{"eu-1"}, {"us-1"}, {"ap-1"}},
		Keys: []rebalance.KeyShares{{Key: key, Budget: rule.Limit, Shares: []uint32{800_000, 100_000, 100_000}, Version: 1}}}
	if err := n.Apply(tb, now); err != nil {
		t.Fatal(err)
	}
	share := func() gcra.Limit { return n.Schedule(rule, key).Current.Limit }
	held := share()
	// Frozen: no Tick; the next call comes after the lease.
	after := now + 31*s
	*clock = after
	var d Decision
	if err := n.Decide(context.Background(), after, req, &d); err != nil {
		t.Fatal(err)
	}
	safe := SafeLimit(rule.Limit, n.safe, len(cfg.Regions))
	// A longer emission interval is a lower rate.
	if got := share(); got == held || got.IntervalMicros() < safe.IntervalMicros() {
		t.Errorf("after the lease, before any Tick: the node runs %v (held %v), want at most the safe share %v", got, held, safe)
	}
	if st := n.Table(); !st.Lapsed {
		t.Errorf("table state %+v: want lapsed", st)
	}
}

// clockedNode is eu-1 of three regions (eu, us, ap) under policy src, on
// a memstore whose clock the test sets (µs; it starts at 1,000 s).
func clockedNode(t *testing.T, src string) (*Policy, Config, *Node, *int64) {
	t.Helper()
	pol, err := ParsePolicy([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig("eu", "eu-1", "eu", "us", "ap")
	clock := new(int64)
	*clock = 1_000 * int64(time.Second/time.Microsecond)
	store, err := memstore.New(memstore.Config{Clock: func() int64 { return *clock }, Shards: 1, MaxKeys: 100})
	if err != nil {
		t.Fatal(err)
	}
	n, err := NewNode(cfg, pol, store)
	if err != nil {
		t.Fatal(err)
	}
	return pol, cfg, n, clock
}
