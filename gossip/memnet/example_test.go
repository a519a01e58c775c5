package memnet_test

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/meridian-quota/meridian/gossip/memnet"
	"github.com/meridian-quota/meridian/gossip/protocol"
)

// A two-region cluster in virtual time: a report crosses a 40 ms link, a
// table is stored and watched (the watch sees the head before the store
// call returns: its purge is one more round trip), and a killed agent is
// reported dead after the detection delay.
func Example() {
	clk := memnet.NewVirtualClock(0)
	cfg := memnet.DefaultConfig()
	cfg.DetectDelay = 5 * time.Second
	n, err := memnet.New(clk, rand.New(rand.NewPCG(1, 1)), cfg)
	if err != nil {
		panic(err)
	}
	eu, us := n.Agent("eu", "eu-1"), n.Agent("us", "us-1")
	_ = n.SetLink(memnet.Addr{Region: "eu"}, memnet.Addr{Region: "us"}, memnet.Link{Latency: 40 * time.Millisecond})

	stop, _ := us.SubscribeReports(func(_ protocol.Sender, msg []byte) { fmt.Printf("%d ms: us got %s\n", clk.Now()/1000, msg) })
	defer stop()
	_ = eu.PublishReport("eu", "eu-1", [][]byte{[]byte("report 1")})

	defer us.WatchHeads(func(head []byte, rev uint64) {
		fmt.Printf("%d ms: us sees %s at revision %d\n", clk.Now()/1000, head, rev)
	})()
	eu.StoreTableAsync(0, 1, 1, [][]byte{[]byte("table 1.1")}, func(rev uint64, err error) {
		fmt.Printf("%d ms: eu stored revision %d, err %v\n", clk.Now()/1000, rev, err)
	})
	clk.Advance(time.Second)

	n.Kill(us.Addr())
	clk.Advance(5 * time.Second)
	fmt.Println("eu sees", eu.Live())
	// Output:
	// 0 ms: us sees table 1.1 at revision 1
	// 0 ms: eu stored revision 1, err <nil>
	// 40 ms: us got report 1
	// eu sees [{eu eu-1}]
}
