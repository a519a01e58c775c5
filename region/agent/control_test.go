package agent

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/meridian-quota/meridian/internal/regiontest"
	"github.com/meridian-quota/meridian/rebalance"
	"github.com/meridian-quota/meridian/region"
)

// linkRecorder is a Control that records what the agent hands it.
type linkRecorder struct {
	mu      sync.Mutex
	reports []*rebalance.Report
	flushed bool
	tables  chan *rebalance.Table
	applied []error
}

func (r *linkRecorder) Report(rep *rebalance.Report) {
	r.mu.Lock()
	r.reports = append(r.reports, rep)
	r.mu.Unlock()
}
func (r *linkRecorder) InForce(term, epoch uint64)      {}
func (r *linkRecorder) Tables() <-chan *rebalance.Table { return r.tables }
func (r *linkRecorder) Applied(t *rebalance.Table, err error) {
	r.mu.Lock()
	r.applied = append(r.applied, err)
	r.mu.Unlock()
}
func (r *linkRecorder) Flush(ctx context.Context) error {
	r.mu.Lock()
	r.flushed = true
	r.mu.Unlock()
	return nil
}
func (r *linkRecorder) Status() ControlStatus { return ControlStatus{Cluster: "test"} }

// TestDrainFlushesLastReport: on shutdown the agent finishes in-flight
// requests, then closes the interval they fell in and hands its report to
// the coordinator link, flushed — the last demand is not lost.
func TestDrainFlushesLastReport(t *testing.T) {
	ncfg := region.DefaultConfig("eu", "eu-1", "eu")
	ncfg.Interval = 300 * time.Millisecond
	pol, err := region.ParsePolicy([]byte(testPolicy))
	if err != nil {
		t.Fatal(err)
	}
	node, err := region.NewNode(ncfg, pol, regiontest.RedisStore(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.DrainDelay = 0 // stopped at once
	cfg.Region, cfg.Agent, cfg.Regions, cfg.Policy, cfg.ReloadEvery = "eu", "eu-1", []string{"eu"}, "(test)", 0
	cfg.Interval = Duration(ncfg.Interval)
	a, err := New(cfg, node, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec, lis, stop := runLinked(t, a)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cl := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{{
		Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: "drain"}}}}}
	// Wait for one report to go out so the next requests fall in a fresh
	// interval, then decide three and stop at once.
	deadline := time.Now().Add(5 * time.Second)
	for {
		rec.mu.Lock()
		n := len(rec.reports)
		rec.mu.Unlock()
		if n > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for range 3 {
		if _, err := cl.ShouldRateLimit(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if !rec.flushed {
		t.Error("the link was not flushed on drain")
	}
	key := region.KeyName("api", []region.Entry{{Key: "tenant", Value: "drain"}})
	var offered int64
	for _, rep := range rec.reports {
		for _, k := range rep.Keys {
			if k.Key == key {
				offered += k.Offered
			}
		}
	}
	if offered != 3 {
		t.Errorf("reports carry %d requests for %s, want the 3 decided before the drain", offered, key)
	}
}

// runLinked runs a with a linkRecorder as its Control, serving RLS on a
// loopback listener; stop ends the run (draining) and returns Run's error.
func runLinked(t *testing.T, a *Agent) (rec *linkRecorder, lis net.Listener, stop func() error) {
	t.Helper()
	rec = &linkRecorder{tables: make(chan *rebalance.Table)}
	a.SetControl(rec)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, lis, nil) }()
	return rec, lis, func() error {
		cancel()
		return <-done
	}
}
