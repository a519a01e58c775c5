package agent

import (
	"context"
	"fmt"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/meridian-quota/meridian/gcra/memstore"
	"github.com/meridian-quota/meridian/internal/regiontest"
)

// benchAgent is an agent on the in-memory store and 1,000 one-tenant RLS
// requests.
func benchAgent(b *testing.B) (*Agent, []*rlsv3.RateLimitRequest) {
	b.Helper()
	ms, err := memstore.New(memstore.DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	node := regiontest.Node(b, testPolicy, ms)
	cfg := DefaultConfig()
	cfg.Region, cfg.Agent, cfg.Regions, cfg.Policy = "eu", "eu-1", []string{"eu"}, "unused"
	a, err := New(cfg, node, nil)
	if err != nil {
		b.Fatal(err)
	}
	reqs := make([]*rlsv3.RateLimitRequest, 1000)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{desc(nil, "tenant", fmt.Sprintf("t%d", i))}}
	}
	return a, reqs
}

// BenchmarkShouldRateLimit is the agent's own cost per RLS decision above
// the store: mapping the request, the node's resolve and record, building
// the response — on the in-memory store, without gRPC.
func BenchmarkShouldRateLimit(b *testing.B) {
	a, reqs := benchAgent(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for i := 0; pb.Next(); i++ {
			if _, err := a.ShouldRateLimit(context.Background(), reqs[i%len(reqs)]); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkRLSOverGRPC is a whole RLS decision over loopback gRPC on the
// in-memory store: client, server and node in one process.
func BenchmarkRLSOverGRPC(b *testing.B) {
	a, reqs := benchAgent(b)
	cl := serveRLS(b, a)
	b.SetParallelism(32)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for i := 0; pb.Next(); i++ {
			if _, err := cl.ShouldRateLimit(context.Background(), reqs[i%len(reqs)]); err != nil {
				b.Fatal(err)
			}
		}
	})
}
