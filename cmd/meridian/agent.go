package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/meridian-quota/meridian/gcra/redisstore"
	"github.com/meridian-quota/meridian/region"
	"github.com/meridian-quota/meridian/region/agent"
)

// agentGCPercent is the agent's GOGC unless the environment sets one.
const agentGCPercent = 400

const agentSynopsis = `
Run a region's agent beside its gateways: Envoy RLS v3 over gRPC and a JSON
API over HTTP, deciding on the region's Redis with the node's policy.

  meridian agent --config agent.yaml

Without --config, envoyproxy/ratelimit's environment variables configure a
standalone agent, so a container spec written for it runs unchanged:

  REDIS_SOCKET_TYPE=tcp REDIS_URL=redis:6379 RUNTIME_ROOT=/data \
    RUNTIME_SUBDIRECTORY=ratelimit meridian agent`

func runAgent(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("agent", agentSynopsis, stdout, stderr)
	path := fs.String("config", "", "the agent's YAML configuration (required unless envoyproxy/ratelimit's environment variables are set)")
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	var (
		cfg *agent.Config
		env *agent.EnvConfig // nil: configured from the file
		err error
	)
	if *path != "" {
		if cfg, err = agent.LoadConfig(*path); err != nil {
			return err
		}
	} else {
		names := agent.UpstreamEnv(os.Environ())
		if len(names) == 0 {
			fmt.Fprintln(stderr, "meridian agent: --config is required (or envoyproxy/ratelimit's environment: REDIS_URL, RUNTIME_ROOT, ...)")
			return errUsage
		}
		host, _ := os.Hostname()
		if env, err = agent.FromEnv(os.LookupEnv, os.Environ(), host); err != nil {
			return fmt.Errorf("no --config, so configured from the environment (%s set): %w", strings.Join(names, ", "), err)
		}
		cfg = &env.Config
	}
	if os.Getenv("GOGC") == "" {
		// The agent's live heap is a few MB (interned keys, pooled
		// buffers), so at Go's default GOGC=100 it collects many times a
		// second under load. 400 trades a few more MB for a tenth less CPU
		// per decision (measured: bench agent, 64 callers). GOGC in the
		// environment wins.
		debug.SetGCPercent(agentGCPercent)
	}
	// A file, or a directory of envoyproxy/ratelimit files.
	policy, err := region.LoadPolicy(cfg.Policy, cfg.PolicyOptions.LoadOptions())
	if err != nil {
		if !strings.Contains(err.Error(), cfg.Policy) {
			err = fmt.Errorf("%s: %w", cfg.Policy, err)
		}
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	if env != nil {
		opts := &slog.HandlerOptions{Level: env.LogLevel}
		if env.LogJSON {
			log = slog.New(slog.NewJSONHandler(stderr, opts))
		} else {
			log = slog.New(slog.NewTextHandler(stderr, opts))
		}
		for _, w := range env.Warnings {
			log.Warn(w)
		}
	}
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
	ncfg := nodeConfig(cfg)
	ncfg.Fence = regionFenced(cfg)
	node, err := region.NewNode(ncfg, policy, br)
	if err != nil {
		return err
	}
	stateLost := prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_redis_state_lost_total",
		Help: "Times the region's Redis (a Cluster master) was found to have lost Meridian's keys — restarted without persistence, failed over to a replica that had not caught up, flushed — re-granting every key's burst."})
	a, err := agent.New(*cfg, node, log, append(br.Collectors(), stateLost)...)
	if err != nil {
		return err
	}
	if ncfg.Fence {
		a.SetFencer(store) // the store itself: a fence write is not a decision for the breaker
	}
	var onLoss func()
	if cfg.Redis.OnStateLoss == "conservative" {
		onLoss = func() { node.StateLost(a.Now()) }
	}
	go watchRedisState(ctx, store, stateLost, onLoss, log)
	a.SetStoreCheck(func(ctx context.Context) error { return client.Ping(ctx).Err() })
	if env != nil {
		a.SetHealthcheckStore(env.HealthcheckStore)
		stop, err := serveEnvListeners(env, a.Registry(), log)
		if err != nil {
			return err
		}
		defer stop()
	}
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
	from := *path
	if env != nil {
		from = "environment"
	}
	log.Info("agent serving", "config", from, "region", cfg.Region, "agent", cfg.Agent, "grpc", cfg.GRPC, "http", cfg.HTTP,
		"policy", policy.Version(), "cluster", cfg.Cluster.Name, "redis", cfg.Redis.Kind(), "redis_addrs", strings.Join(cfg.Redis.Addresses(), ","))
	// The first SIGTERM or interrupt ends ctx (main): the agent drains,
	// not ready for drain_delay. A second one ends the wait.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	served := make(chan struct{})
	defer close(served)
	go func() {
		for n := 0; ; {
			select {
			case <-served:
				return
			case <-sigs:
				if n++; n == 2 {
					log.Info("second signal: closing the listeners now")
					a.EndDrain()
				}
			}
		}
	}()
	return serveWithCluster(ctx, a, cl, func(ctx context.Context) error { return a.Run(ctx, gl, hl) })
}

// serveEnvListeners opens the listeners an agent configured from
// upstream's environment adds: the debug port (DEBUG_HOST:DEBUG_PORT:
// /metrics and /debug/pprof/) and USE_PROMETHEUS's PROMETHEUS_ADDR (the
// metrics at PROMETHEUS_PATH). It returns once they listen; stop closes
// them.
func serveEnvListeners(env *agent.EnvConfig, reg *prometheus.Registry, log *slog.Logger) (stop func(), err error) {
	metrics := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	var servers []*http.Server
	stop = func() {
		for _, s := range servers {
			_ = s.Close()
		}
	}
	serve := func(what, addr string, h http.Handler) error {
		lis, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		s := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
		servers = append(servers, s)
		go func() {
			if err := s.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
				log.Error(what+" stopped", "err", err)
			}
		}()
		log.Info(what+" serving", "addr", lis.Addr().String())
		return nil
	}
	if env.Debug != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", metrics)
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		if err := serve("debug listener (DEBUG_HOST:DEBUG_PORT)", env.Debug, mux); err != nil {
			stop()
			return nil, err
		}
	}
	if env.MetricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle(env.MetricsPath, metrics)
		if err := serve("metrics listener (PROMETHEUS_ADDR)", env.MetricsAddr, mux); err != nil {
			stop()
			return nil, err
		}
	}
	return stop, nil
}

// watchRedisState checks every second that the region's Redis still holds
// Meridian's state (redisstore.Store.CheckState), and counts and logs each
// loss — every key on a server that lost its data has its whole burst
// again, which no decision can tell — and calls onLoss (nil: none; the
// conservative mode, redis.on_state_loss).
func watchRedisState(ctx context.Context, store *redisstore.Store, lost prometheus.Counter, onLoss func(), log *slog.Logger) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		n, err := store.CheckState(cctx)
		cancel()
		if n > 0 {
			lost.Add(float64(n))
			log.Warn("Redis lost Meridian's state: every key on it starts again with its whole burst (restart without persistence, failover to a replica that had not caught up, or a flush)",
				"servers", n, "conservative", onLoss != nil)
			if onLoss != nil {
				onLoss()
			}
		}
		if err != nil && ctx.Err() == nil {
			log.Debug("redis state check", "err", err)
		}
	}
}
