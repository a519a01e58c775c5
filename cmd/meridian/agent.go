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

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/meridian-quota/meridian/gcra/redisstore"
	"github.com/meridian-quota/meridian/region"
	"github.com/meridian-quota/meridian/region/agent"
)

// agentGCPercent is the agent's GOGC unless the environment sets one.
const agentGCPercent = 400

// scriptLoadTimeout bounds the agent's wait for Redis at start-up.
const scriptLoadTimeout = 2 * time.Second

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
	// redis.cluster picks the client, and tells the node and the policy
	// checks that a composite's keys must share a slot.
	var client redis.UniversalClient
	if cfg.Redis.Cluster {
		client = redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{cfg.Redis.Addr}, ContextTimeoutEnabled: true})
	} else {
		client = redis.NewClient(&redis.Options{Addr: cfg.Redis.Addr, ContextTimeoutEnabled: true})
	}
	defer client.Close()
	scfg := redisstore.DefaultConfig()
	scfg.Prefix = cfg.Redis.Prefix
	scfg.Timeout = time.Duration(cfg.Redis.Timeout)
	scfg.Lanes = cfg.Redis.Lanes
	if scfg.WriteFormat, err = redisstore.ParseFormat(cfg.Redis.WriteFormat); err != nil {
		return err
	}
	store, err := redisstore.New(client, scfg)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	if scfg.WriteFormat == redisstore.FormatPacked {
		log.Warn("redis.write_format is packed: writing the older releases' format for a rolling upgrade; windows above 36 h decide as zero limits until it is value again")
	}
	// Load the script before serving, so the first decisions do not spend
	// their redis.timeout on a dial, NOSCRIPT and the script's compilation.
	// A Redis that does not answer is not fatal: the limits' failure modes
	// decide until it does (and /readyz waits for it).
	lctx, cancel := context.WithTimeout(ctx, scriptLoadTimeout)
	if err := store.Load(lctx); err != nil {
		log.Warn("redis: script not loaded; the first decisions will load it", "addr", cfg.Redis.Addr, "err", err)
	}
	err = checkRedisKind(lctx, client, cfg.Redis.Cluster)
	cancel()
	if err != nil {
		return err
	}
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
		"policy", policy.Version(), "cluster", cfg.Cluster.Name)
	return serveWithCluster(ctx, a, cl, func(ctx context.Context) error { return a.Run(ctx, gl, hl) })
}

// checkRedisKind refuses to start when Redis answers and is not the kind
// redis.cluster says: a single-node client on a Cluster node would get
// MOVED for most keys, and the policy would have been checked for the wrong
// kind of store (a Cluster needs a request's limits in one slot). A Redis
// that does not answer is not an error here: the failure modes decide until
// it does.
func checkRedisKind(ctx context.Context, c redis.UniversalClient, cluster bool) error {
	info, err := c.Info(ctx, "cluster").Result()
	switch {
	case err != nil && cluster && strings.Contains(err.Error(), "cluster support disabled"):
		return fmt.Errorf("%w: redis.cluster is true, but redis.addr is not a Redis Cluster node (%v)", agent.ErrConfig, err)
	case err != nil:
		return nil
	case !cluster && strings.Contains(info, "cluster_enabled:1"):
		return fmt.Errorf("%w: redis.addr is a Redis Cluster node: set redis.cluster: true (the policy is then checked for one-slot composites)", agent.ErrConfig)
	}
	return nil
}
