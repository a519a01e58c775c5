package wire_test

import (
	"crypto/ed25519"
	"fmt"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gossip/wire"
	"github.com/meridian-quota/meridian/rebalance"
)

// A coordinator encodes a signed table; an agent decodes the chunks,
// checks the signature and assembles the table.
func Example() {
	coordinator := ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize))
	table := &rebalance.Table{
		Term: 1, Epoch: 7, Issued: 1_000_000, Effective: 1_500_000,
		Regions: []string{"eu-west", "us-east"},
		Leases:  []int64{31_000_000, 31_000_000},
		Agents:  [][]string{{"eu-1"}, {"us-1", "us-2"}},
		Keys: []rebalance.KeyShares{
			{Key: "api/tenant=acme", Budget: gcra.PerSecond(100, 20), Shares: []uint32{700_000, 300_000}, Version: 3},
			{Key: "api/tenant=zeta", Budget: gcra.PerMinute(60, 5), Shares: []uint32{500_000, 500_000}, Version: 1},
		},
	}
	msgs, err := wire.EncodeTable("prod", table, coordinator, wire.DefaultMaxMessage)
	if err != nil {
		panic(err)
	}
	size, n := wire.TableSize("prod", table, wire.DefaultMaxMessage)
	fmt.Printf("%d message(s), %d bytes (TableSize: %d, %d)\n", len(msgs), len(msgs[0]), size, n)

	lim := wire.DefaultLimits()
	trusted := []ed25519.PublicKey{coordinator.Public().(ed25519.PublicKey)}
	asm := wire.NewAssembler(lim, 16)
	for _, b := range msgs {
		m, err := wire.Decode("prod", b, lim, trusted)
		if err != nil {
			panic(err)
		}
		t, done, err := asm.AddTable(m.Table)
		if err != nil {
			panic(err)
		}
		if done {
			for _, ks := range t.Keys {
				fmt.Printf("%s %v shares %v\n", ks.Key, ks.Budget, ks.Shares)
			}
		}
	}

	// A message of another cluster is refused.
	b, _ := wire.EncodeAck("staging", wire.Ack{Region: "eu-west", Agent: "eu-1", Term: 1, Epoch: 7})
	_, err = wire.Decode("prod", b, lim, nil)
	fmt.Println(err)
	// Output:
	// 1 message(s), 229 bytes (TableSize: 229, 1)
	// api/tenant=acme 100/1s burst 20 (T=10000µs) shares [700000 300000]
	// api/tenant=zeta 60/1m0s burst 5 (T=1000000µs) shares [500000 500000]
	// wire: other cluster: message for "staging", this is "prod"
}
