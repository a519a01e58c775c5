package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/region"
)

// BenchmarkControlCost10k measures the control traffic of a running
// cluster: three agents (one per region, real NATS and memberlist), 10,000
// keys with demand in every region every interval, Δ = 2 s. It reports the
// bytes and messages per second on the wire (reports and acks as sent,
// tables as each region fetches them), in all and per key·region·second,
// the unit the simulator reports. One iteration is one interval; run it with -benchtime=6x or
// more (the first intervals fill the coordinator's budgets).
//
//	go test -run '^$' -bench ControlCost -benchtime 8x ./cmd/meridian/
func BenchmarkControlCost10k(b *testing.B) {
	const keys = 10_000
	c := newTCluster(b)
	c.interval = 2 * time.Second
	c.startAll()
	c.leader(10*time.Second, "")
	reqs := make([]region.Request, keys)
	for i := range reqs {
		reqs[i] = region.Request{Domain: "api", Cost: 1, Descriptors: []region.Descriptor{{
			Entries: []region.Entry{{Key: "tenant", Value: fmt.Sprintf("tenant-%05d", i)}}}}}
	}
	var d region.Decision
	offer := func() {
		for _, name := range tNames {
			a := c.agents[name]
			now := time.Now().UnixMicro()
			for i := range reqs {
				_ = a.node.Decide(context.Background(), now, &reqs[i], &d)
			}
		}
	}
	// What crosses the network, counted once: every agent's reports and
	// acks as sent, and every agent's copy of each table as fetched (the
	// coordinator stores a table once; each region reads it) — what the
	// simulator counts.
	sum := func() (bytes, msgs float64) {
		for _, name := range tNames {
			reg := c.agents[name].reg
			for _, kd := range [][2]string{{"report", "out"}, {"ack", "out"}, {"table", "in"}} {
				l := map[string]string{"kind": kd[0], "direction": kd[1]}
				bytes += counter(b, reg, "meridian_cluster_bytes_total", l)
				msgs += counter(b, reg, "meridian_cluster_messages_total", l)
			}
		}
		return
	}
	// Two intervals to learn the keys, then measure.
	for range 2 {
		offer()
		time.Sleep(c.interval)
	}
	b0, m0 := sum()
	start := time.Now()
	b.ResetTimer()
	for range b.N {
		offer()
		time.Sleep(c.interval - time.Since(start)%c.interval)
	}
	el := time.Since(start).Seconds()
	b.StopTimer()
	b1, m1 := sum()
	b.ReportMetric((b1-b0)/el, "bytes/s")
	b.ReportMetric((m1-m0)/el, "msgs/s")
	b.ReportMetric((b1-b0)/el/keys/3, "bytes/key·region·s")
	b.ReportMetric((m1-m0)/el/keys/3*1e6, "msgs/(10⁶·key·region·s)")
}
