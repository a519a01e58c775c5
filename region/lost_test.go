package region

import (
	"context"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/rebalance"
)

// TestStateLostRunsTheSafeShareForABurstWindow is the conservative mode of
// issue 17's defect 10: after the store lost its state, a key runs at
// min(share, safe share) — rate and burst — until one burst window of its
// limit has passed, through decisions and prepared requests alike, then at
// its share again; a key whose window is shorter comes back first. Fails
// on edda97d, which had no such mode (a flushed store granted the region's
// whole share's burst at once).
func TestStateLostRunsTheSafeShareForABurstWindow(t *testing.T) {
	pol, cfg, n, clock := clockedNode(t, `domains:
  - domain: api
    descriptors:
      - key: tenant
        rate_limit: {unit: second, requests_per_unit: 100, burst: 100}
      - key: daily
        rate_limit: {unit: day, requests_per_unit: 86400, burst: 1000}
`)
	const s = int64(time.Second / time.Microsecond)
	now := *clock
	tenant := &Request{Domain: "api", Cost: 1, Descriptors: []Descriptor{{Entries: []Entry{{Key: "tenant", Value: "acme"}}}}}
	daily := &Request{Domain: "api", Cost: 1, Descriptors: []Descriptor{{Entries: []Entry{{Key: "daily", Value: "acme"}}}}}
	tKey, dKey := KeyName("api", tenant.Descriptors[0].Entries), KeyName("api", daily.Descriptors[0].Entries)
	tRule, dRule := pol.Match("api", tenant.Descriptors[0].Entries), pol.Match("api", daily.Descriptors[0].Entries)
	tb := &rebalance.Table{Term: 1, Epoch: 1, Issued: now, Effective: now - 60*s, Regions: cfg.Regions,
		Leases: []int64{now + 3600*s, now + 3600*s, now + 3600*s}, Agents: [][]string{{"eu-1"}, {"us-1"}, {"ap-1"}},
		Keys: []rebalance.KeyShares{
			{Key: dKey, Budget: dRule.Limit, Shares: []uint32{800_000, 100_000, 100_000}, Version: 1},
			{Key: tKey, Budget: tRule.Limit, Shares: []uint32{800_000, 100_000, 100_000}, Version: 1}}}
	if err := n.Apply(tb, now); err != nil {
		t.Fatal(err)
	}
	limit := func(rule *Rule, key string) gcra.Limit { return n.Schedule(rule, key).Current.Limit }
	share, safe := limit(tRule, tKey), SafeLimit(tRule.Limit, n.safe, len(cfg.Regions))
	dShare, dSafe := limit(dRule, dKey), SafeLimit(dRule.Limit, n.safe, len(cfg.Regions))
	if share.Burst() <= safe.Burst() || dShare.Burst() <= dSafe.Burst() {
		t.Fatalf("set-up: shares %v, %v not above the safe shares %v, %v", share, dShare, safe, dSafe)
	}
	// A prepared request, resolved before the loss.
	p, err := n.Prepare(tenant)
	if err != nil {
		t.Fatal(err)
	}
	burst := func(decide func() bool) int {
		c := 0
		for decide() && c < 1000 {
			c++
		}
		return c
	}
	ctx := context.Background()
	preparedBurst := func() int {
		return burst(func() bool {
			d, err := n.DecidePrepared(ctx, *clock, p, 1)
			if err != nil {
				t.Fatal(err)
			}
			return d.Allowed
		})
	}
	if got := preparedBurst(); got != int(share.Burst()) {
		t.Fatalf("before the loss: a burst of %d, want the share's %d", got, share.Burst())
	}

	// The store loses its state (as a flushed Redis would: ten seconds on,
	// the bucket is full either way) and the agent tells the node.
	*clock += 10 * s
	n.StateLost(*clock)
	if got := limit(tRule, tKey); got != minLimit(share, safe) {
		t.Errorf("after the loss: %v, want the safe share %v", got, minLimit(share, safe))
	}
	if got := preparedBurst(); got != int(safe.Burst()) {
		t.Errorf("after the loss: a prepared request's burst %d, want the safe share's %d (not the share's %d)", got, safe.Burst(), share.Burst())
	}
	if st := n.Stats(); st.StateLost != 1 {
		t.Errorf("Stats.StateLost %d, want 1", st.StateLost)
	}
	// The tenant's window (1 s) passes; the daily key's (1000 s) does not.
	*clock += 2 * s
	n.Tick(*clock)
	if got := limit(tRule, tKey); got != share {
		t.Errorf("a burst window after the loss: %v, want the share %v again", got, share)
	}
	if got := limit(dRule, dKey); got != minLimit(dShare, dSafe) {
		t.Errorf("the daily key within its window: %v, want the safe share %v", got, minLimit(dShare, dSafe))
	}
	*clock += 1000 * s
	n.Tick(*clock)
	if got := limit(dRule, dKey); got != dShare {
		t.Errorf("the daily key after its window: %v, want the share %v", got, dShare)
	}
	if n.lost.Load() != nil {
		t.Error("the conservative mode did not end")
	}
}
