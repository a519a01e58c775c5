package agent

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/meridian-quota/meridian/internal/regiontest"
)

// TestDrainDelay is issue 17's defect 9: on SIGTERM (Run's context
// ending) readiness fails at once — /readyz 503, gRPC health NOT_SERVING —
// while requests are still answered, and the listeners close only when the
// drain ends (here EndDrain, the second signal; the delay itself is a
// minute, so nothing below races a timer). Fails on 450c671, which has no
// drain delay: the listeners closed as soon as the context ended.
func TestDrainDelay(t *testing.T) {
	node := regiontest.Node(t, testPolicy, regiontest.RedisStore(t))
	cfg := DefaultConfig()
	cfg.Region, cfg.Agent, cfg.Regions, cfg.Policy, cfg.ReloadEvery = "eu", "eu-1", []string{"eu"}, "(test)", 0
	cfg.DrainDelay = Duration(time.Minute)
	a, err := New(cfg, node, nil)
	if err != nil {
		t.Fatal(err)
	}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + hl.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, gl, hl) }()
	conn, err := grpc.NewClient(gl.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	status := func() healthpb.HealthCheckResponse_ServingStatus {
		rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer rcancel()
		r, err := hc.Check(rctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatalf("health check: %v", err)
		}
		return r.GetStatus()
	}
	get := func(path string) int {
		resp, err := http.Get(url + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	decide := func() int {
		resp, err := http.Post(url+"/v1/decide", "application/json",
			strings.NewReader(`{"domain":"users","descriptors":[{"entries":[{"key":"user","value":"drain"}]}]}`))
		if err != nil {
			t.Fatalf("decide: %v", err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	waitUntil(t, "the agent ready", func() bool { return get("/readyz") == http.StatusOK })
	if s := status(); s != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health %v before the drain, want SERVING", s)
	}

	cancel() // SIGTERM
	waitUntil(t, "readiness failing", func() bool { return get("/readyz") == http.StatusServiceUnavailable })
	if s := status(); s != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health %v while draining, want NOT_SERVING", s)
	}
	if c := decide(); c != http.StatusOK {
		t.Errorf("POST /v1/decide while draining: %d, want 200 (requests are still answered)", c)
	}
	if c := get("/healthz"); c != http.StatusOK {
		t.Errorf("/healthz while draining: %d, want 200 (a liveness probe must not restart a draining agent)", c)
	}
	select {
	case err := <-done:
		t.Fatalf("Run returned while draining (%v)", err)
	default:
	}

	a.EndDrain() // the second signal
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(30 * time.Second): // guards against a hang only
		t.Fatal("Run did not return after EndDrain")
	}
	if _, err := http.Get(url + "/readyz"); err == nil {
		t.Error("the HTTP listener still answers after the drain")
	}
}

// TestDrainDelayEnds: the drain ends by itself after DrainDelay, and an
// EndDrain before the context ends makes it skip the wait.
func TestDrainDelayEnds(t *testing.T) {
	for _, early := range []bool{false, true} {
		node := regiontest.Node(t, testPolicy, regiontest.RedisStore(t))
		cfg := DefaultConfig()
		cfg.Region, cfg.Agent, cfg.Regions, cfg.Policy, cfg.ReloadEvery = "eu", "eu-1", []string{"eu"}, "(test)", 0
		cfg.DrainDelay = Duration(200 * time.Millisecond)
		if early {
			cfg.DrainDelay = Duration(4 * time.Minute)
		}
		a, err := New(cfg, node, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx, nil, nil) }()
		if early {
			a.EndDrain()
		}
		start := time.Now()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
		case <-time.After(60 * time.Second): // guards against a hang only
			t.Fatalf("early %v: Run did not return", early)
		}
		if took := time.Since(start); !early && took < 200*time.Millisecond {
			t.Errorf("Run returned %s after the context ended, before drain_delay (200ms)", took)
		}
	}
}

// waitUntil polls cond until it holds; the deadline only guards against
// hangs.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30 s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
