package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/region"
)

// BenchmarkControlCost measures the control traffic of a running cluster:
// three agents (one per region, real NATS and memberlist), 10,000 keys with
// demand in every region every interval, Δ = 2 s, as counted by the NATS
// server itself — every byte clients published to it (reports, acks, the
// coordinator's KV puts of table chunks and head, API requests) and it
// delivered (report and ack subscriptions, head watches, chunk fetches,
// API and publish-ack replies); one replica, so KV puts count once. It
// reports those bytes and messages per second and per key·region·second
// (the simulator's unit), and the agents' own counts by kind. Memberlist's
// gossip is not NATS traffic and is not counted.
//
// The agents run the shipped coordinator settings (strategy, hysteresis,
// lease, fence, skew) and the shipped report settings
// (region.DefaultConfig: delta reports). Loads: steady — each key's demand
// per region stationary (cost 300, 600, 900 per interval in the three
// regions, rotated per key: 90 % of its budget of 1,000/s), ±10 % uniform
// noise each interval; shifting — the same, and each interval a tenth of
// the keys rotate their demand one region on. It measures after warmup
// intervals (the keys learned, the shares settled); one iteration is one
// interval, so run it with -benchtime=8x.
//
//	go test -run '^$' -bench ControlCost -benchtime 8x ./cmd/meridian/
func BenchmarkControlCost(b *testing.B) {
	for _, load := range []struct {
		name  string
		shift bool
	}{{"steady", false}, {"shifting", true}} {
		b.Run(load.name, func(b *testing.B) { controlCost(b, 10_000, load.shift) })
	}
}

const benchPolicy = `
domains:
  - domain: api
    descriptors:
      - key: tenant
        rate_limit: {unit: second, requests_per_unit: 1000, burst: 5000}
`

// warmup is how many intervals controlCost runs before it measures.
const warmup = 12

func controlCost(b *testing.B, keys int, shift bool) {
	c := newTCluster(b)
	c.interval, c.shipped, c.policy = 2*time.Second, true, benchPolicy
	// Each region's demand comes as one request per interval (cost up to
	// 990): a burst of 2.5 intervals' budget fits it in the region's share
	// of the burst (about 46 % for the 900 region), so a key is admitted
	// at its demand, as steady traffic under its share would be, rather
	// than denied for the request's size (cost above the burst).
	if err := os.WriteFile(filepath.Join(c.dir, "policy.yaml"), []byte(benchPolicy), 0o600); err != nil {
		b.Fatal(err)
	}
	c.startAll()
	c.leader(10*time.Second, "")
	reqs := make([]region.Request, keys)
	for i := range reqs {
		reqs[i] = region.Request{Domain: "api", Descriptors: []region.Descriptor{{
			Entries: []region.Entry{{Key: "tenant", Value: fmt.Sprintf("tenant-%05d", i)}}}}}
	}
	rot := make([]int, keys) // key i's demand is rotated rot[i] regions on
	for i := range rot {
		rot[i] = i % len(tNames)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	interval := 0
	var d region.Decision
	offer := func() {
		if shift {
			for i := range rot {
				if i%10 == interval%10 {
					rot[i]++
				}
			}
		}
		interval++
		for ri, name := range tNames {
			a := c.agents[name]
			now := time.Now().UnixMicro()
			for i := range reqs {
				base := int64(300 * (1 + (ri+rot[i])%len(tNames)))
				reqs[i].Cost = base + rng.Int64N(base/5+1) - base/10
				_ = a.node.Decide(context.Background(), now, &reqs[i], &d)
			}
		}
	}
	kinds := [][2]string{{"report", "out"}, {"ack", "out"}, {"table", "in"}}
	agents := func() (bytes []float64) {
		bytes = make([]float64, len(kinds)+3)
		for _, name := range tNames {
			reg := c.agents[name].reg
			for k, kd := range kinds {
				bytes[k] += counter(b, reg, "meridian_cluster_bytes_total", map[string]string{"kind": kd[0], "direction": kd[1]})
			}
			bytes[len(kinds)] += counter(b, reg, "meridian_coordinator_tables_published_total", nil)
			bytes[len(kinds)+1] += counter(b, reg, "meridian_cluster_table_deltas_total", map[string]string{"outcome": "patched"})
			bytes[len(kinds)+2] += counter(b, reg, "meridian_cluster_table_deltas_total", map[string]string{"outcome": "missed"})
		}
		return bytes
	}
	server := func() (bytes, msgs float64) {
		ib, ob, im, om := c.nats.Traffic()
		return float64(ib + ob), float64(im + om)
	}
	// Warm up until the shares settle (the keys are learned, the ewma
	// reaches the stationary demand), then measure.
	for range warmup {
		offer()
		time.Sleep(c.interval)
	}
	a0 := agents()
	b0, m0 := server()
	start := time.Now()
	b.ResetTimer()
	for range b.N {
		offer()
		time.Sleep(c.interval - time.Since(start)%c.interval)
	}
	el := time.Since(start).Seconds()
	b.StopTimer()
	a1 := agents()
	b1, m1 := server()
	per := el * float64(keys) * float64(len(tNames))
	b.ReportMetric((b1-b0)/el, "bytes/s")
	b.ReportMetric((m1-m0)/el, "msgs/s")
	b.ReportMetric((b1-b0)/per, "bytes/key·region·s")
	b.ReportMetric((m1-m0)/per*1e6, "msgs/(10⁶·key·region·s)")
	for k, kd := range kinds {
		b.ReportMetric((a1[k]-a0[k])/per, kd[0]+"-B/key·region·s")
	}
	n := len(kinds)
	b.ReportMetric((a1[n]-a0[n])/float64(b.N), "tables/interval")
	b.ReportMetric((a1[n+1]-a0[n+1])/float64(b.N), "patched/interval")
	b.ReportMetric((a1[n+2]-a0[n+2])/float64(b.N), "missed/interval")
}
