package region_test

import (
	"context"
	"fmt"

	"github.com/meridian-quota/meridian/gcra/memstore"
	"github.com/meridian-quota/meridian/rebalance"
	"github.com/meridian-quota/meridian/region"
)

func Example() {
	policy, err := region.ParsePolicy([]byte(`
domains:
  - domain: api
    hash_tag: tenant
    descriptors:
      - key: tenant
        rate_limit: {unit: second, requests_per_unit: 100, burst: 20}
`))
	if err != nil {
		panic(err)
	}
	now := int64(1_700_000_000_000_000) // µs: the simulator's virtual clock
	store, _ := memstore.New(memstore.Config{Clock: func() int64 { return now }, Shards: 1, MaxKeys: 100})
	node, err := region.NewNode(region.DefaultConfig("eu", "eu-1", "eu", "us"), policy, store)
	if err != nil {
		panic(err)
	}

	// The coordinator's table gives eu 75 % of tenant acme's budget,
	// effective a second ago, and names this agent (an agent a table does
	// not name runs at the safe share).
	key := region.KeyName("api", []region.Entry{{Key: "tenant", Value: "acme"}})
	err = node.Apply(&rebalance.Table{Term: 1, Epoch: 1, Issued: now, Effective: now - 1e6,
		Regions: []string{"eu", "us"}, Leases: []int64{now + 30e6, now + 30e6}, Agents: [][]string{{"eu-1"}, {"us-1"}},
		Keys: []rebalance.KeyShares{{Key: key, Budget: policy.Rules()[0].Limit, Shares: []uint32{750_000, 250_000}, Version: 1}}}, now)
	if err != nil {
		panic(err)
	}

	node.Tick(now) // opens the first report interval
	req := &region.Request{Domain: "api", Cost: 1,
		Descriptors: []region.Descriptor{{Entries: []region.Entry{{Key: "tenant", Value: "acme"}}}}}
	var d region.Decision
	admitted := 0
	for range 20 {
		if err := node.Decide(context.Background(), now, req, &d); err != nil {
			panic(err)
		}
		if d.Allowed {
			admitted++
		}
	}
	fmt.Println("limit in eu:", d.Matches[0].Schedule.Current.Limit)
	fmt.Println("admitted:", admitted, "retry after:", d.Result.RetryAfter)

	rep := node.Tick(now + 5e6) // the interval closed: this agent's report
	k := rep.Keys[0]
	fmt.Println(k.Key, "offered", k.Offered, "admitted", k.Admitted, "denied", k.Denied)
	// Output:
	// limit in eu: T=13334µs burst 15
	// admitted: 15 retry after: 13.334ms
	// api/tenant=acme offered 20 admitted 15 denied 5
}
