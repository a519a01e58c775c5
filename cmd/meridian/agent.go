package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/meridian-quota/meridian/region"
	"github.com/meridian-quota/meridian/region/agent"
)

// agentGCPercent is the agent's GOGC unless the environment sets one.
const agentGCPercent = 400

const agentSynopsis = `
Run a region's agent beside its gateways: Envoy RLS v3 over gRPC and a JSON
API over HTTP, deciding on the region's Redis with the node's policy.

  meridian agent --config agent.yaml`

func runAgent(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("agent", agentSynopsis, stdout, stderr)
	path := fs.String("config", "", "the agent's YAML configuration (required)")
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	if *path == "" {
		fmt.Fprintln(stderr, "meridian agent: --config is required")
		return errUsage
	}
	cfg, err := agent.LoadConfig(*path)
	if err != nil {
		return err
	}
	if os.Getenv("GOGC") == "" {
		// The agent's live heap is a few MB (interned keys, pooled
		// buffers), so at Go's default GOGC=100 it collects many times a
		// second under load. 400 trades a few more MB for a tenth less CPU
		// per decision (measured: bench agent, 64 callers). GOGC in the
		// environment wins.
		debug.SetGCPercent(agentGCPercent)
	}
	data, err := os.ReadFile(cfg.Policy)
	if err != nil {
		return err
	}
	policy, err := region.ParsePolicy(data)
	if err != nil {
		return fmt.Errorf("%s: %w", cfg.Policy, err)
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	for _, w := range cfg.Warnings() {
		log.Warn(w)
	}
	// redis.type picks the client, and tells the node and the policy
	// checks whether a composite's keys must share a slot.
	rd, err := openRedis(ctx, &cfg.Redis, log)
	if err != nil {
		return err
	}
	defer rd.Close()
	client, store := rd.client, rd.store
	br, err := agent.NewBreaker(cfg.Breaker, store)
	if err != nil {
		return err
	}
	node, err := region.NewNode(nodeConfig(cfg), policy, br)
	if err != nil {
		return err
	}
	a, err := agent.New(*cfg, node, log, br.Collectors()...)
	if err != nil {
		return err
	}
	a.SetStoreCheck(func(ctx context.Context) error { return client.Ping(ctx).Err() })
	if t := cfg.Tracing; t.OTLPEndpoint != "" {
		opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(t.OTLPEndpoint)}
		if t.Insecure {
			opts = append(opts, otlptracegrpc.WithInsecure())
		}
		exp, err := otlptracegrpc.New(ctx, opts...)
		if err != nil {
			return fmt.Errorf("tracing: %w", err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp),
			sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(t.Sample))))
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = tp.Shutdown(sctx)
			cancel()
		}()
		a.SetTracerProvider(tp)
		br.SetTracerProvider(tp)
	}
	var gl, hl net.Listener
	if cfg.GRPC != "" {
		if gl, err = net.Listen("tcp", cfg.GRPC); err != nil {
			return err
		}
	}
	if cfg.HTTP != "" {
		if hl, err = net.Listen("tcp", cfg.HTTP); err != nil {
			return err
		}
	}
	var cl *cluster
	if cfg.Cluster.Enabled() {
		// Reports carry the store's clock: the coordinator's skew estimate
		// is then the one leases and effective times are compared with.
		redisNow := func(ctx context.Context) (int64, error) {
			t, err := client.Time(ctx).Result()
			if err != nil {
				return 0, err
			}
			return t.UnixMicro(), nil
		}
		if cl, err = joinCluster(ctx, cfg, node, a.Registry(), redisNow, version, log); err != nil {
			return err
		}
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				a.RequestReload()
				if cl != nil {
					// The memberlist keyring follows its key file: the
					// three-step rotation is three edits and three SIGHUPs.
					if err := cl.mem.ReloadKeys(); err != nil {
						log.Error("gossip keyring not reloaded", "err", err)
					} else {
						log.Info("gossip keyring reloaded")
					}
				}
			}
		}
	}()
	log.Info("agent serving", "region", cfg.Region, "agent", cfg.Agent, "grpc", cfg.GRPC, "http", cfg.HTTP,
		"policy", policy.Version(), "cluster", cfg.Cluster.Name, "redis", cfg.Redis.Kind(), "redis_addrs", strings.Join(cfg.Redis.Addresses(), ","))
	return serveWithCluster(ctx, a, cl, func(ctx context.Context) error { return a.Run(ctx, gl, hl) })
}
