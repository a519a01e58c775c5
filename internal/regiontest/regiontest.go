// Package regiontest builds region nodes for the tests of the packages
// around region (the agent, the client): a standalone node on real Redis,
// and tables that give its region whole budgets.
package regiontest

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/gcra/redisstore"
	"github.com/meridian-quota/meridian/internal/testenv"
	"github.com/meridian-quota/meridian/rebalance"
	"github.com/meridian-quota/meridian/region"
)

// RedisStore returns a store on the shared Redis under a prefix unique to
// the test, deleted when it ends (failing in CI, skipping elsewhere, when
// Redis is missing).
func RedisStore(t testing.TB) *redisstore.Store {
	t.Helper()
	c := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	t.Cleanup(func() { testenv.Cleanup(t, c, prefix) })
	cfg := redisstore.DefaultConfig()
	cfg.Prefix = prefix
	s, err := redisstore.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Node returns agent eu-1 of region eu, the only region, deciding with
// store under the policy src: a standalone node (region.StandaloneConfig),
// whose safe share is the whole budget.
func Node(t testing.TB, src string, store region.Store) *region.Node {
	t.Helper()
	return NodeWith(t, region.StandaloneConfig("eu", "eu-1"), src, store)
}

// NodeWith is Node with the node's config cfg: for a test that needs a
// safe share below the whole budget.
func NodeWith(t testing.TB, cfg region.Config, src string, store region.Store) *region.Node {
	t.Helper()
	pol, err := region.ParsePolicy([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	n, err := region.NewNode(cfg, pol, store)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// GiveAll applies a table giving region eu the whole budget of each key,
// effective an hour back so that the keys hold their full bursts. A key's
// budget is the limit of the first policy rule its entries match.
func GiveAll(t testing.TB, n *region.Node, keys ...string) {
	t.Helper()
	now := time.Now().UnixMicro()
	tb := &rebalance.Table{Term: 1, Epoch: 1, Issued: now, Effective: now - 3600e6, Regions: []string{"eu"},
		Leases: []int64{now + 600e6}, Agents: [][]string{{"eu-1"}}}
	for _, k := range keys {
		domain, entries, err := region.ParseKeyName(k)
		if err != nil {
			t.Fatal(err)
		}
		var d region.Decision
		if err := n.Resolve(&region.Request{Domain: domain, Descriptors: []region.Descriptor{{Entries: entries}}, Cost: 0}, &d); err != nil || d.MatchOf(0) == nil {
			t.Fatalf("GiveAll: %s matches no limit (%v)", k, err)
		}
		tb.Keys = append(tb.Keys, rebalance.KeyShares{Key: k, Budget: d.MatchOf(0).Rule.Limit, Shares: []uint32{rebalance.PPM}, Version: 1})
	}
	slices.SortFunc(tb.Keys, func(a, b rebalance.KeyShares) int { return strings.Compare(a.Key, b.Key) })
	if err := n.Apply(tb, now); err != nil {
		t.Fatal(err)
	}
}
