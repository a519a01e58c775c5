// Package agent is the shell a region runs beside its gateways: it serves
// the region.Node's decisions over Envoy RLS v3 (gRPC) and a JSON API
// (HTTP), and owns what the pure core must not — listeners, the clock,
// tickers, configuration files, credentials, metrics and traces.
//
// # Model
//
// Every decision is the node's (region.Node): the agent maps an RLS or
// JSON request onto a region.Request, calls Node.Decide (or Reserve) with
// the host's wall clock in µs clamped never to go back (region.Clock: a
// step back stands still until the wall clock catches up; no start-up
// error is kept), and maps the answer back — one status per
// descriptor in request order, current_limit the global limit the key was
// sold, limit_remaining what this region will still admit now,
// duration_until_reset the reset when OK and the retry-after when over
// (ARCHITECTURE.md, "Interfaces to the outside"). The store the node
// decides on is wrapped in a Breaker, so that while Redis fails each
// limit's failure_mode decides at once. failure_mode error decides
// nothing: the call fails — RLS with gRPC Unavailable, so that Envoy's
// failure_mode_deny decides as it does when envoyproxy/ratelimit's Redis
// fails; POST /v1/decide and /v1/reserve with 503 and an
// api.ErrorResponse — and is counted in meridian_fallback_error_total. In
// a composite a closed limit still denies (closed wins over error), and an
// error limit keeps local and open ones from answering (package region,
// "Failure and shadow").
//
// # Life cycle
//
//	cfg, _ := agent.LoadConfig("agent.yaml")      // validated, every problem at once
//	br, _ := agent.NewBreaker(cfg.Breaker, store) // store: gcra/redisstore, wired by cmd
//	node, _ := region.NewNode(ncfg, policy, br)
//	a, _ := agent.New(*cfg, node, log, br.Collectors()...)
//	err := a.Run(ctx, grpcListener, httpListener) // until ctx ends, then drains
//
// The redis section names the region's Redis as production runs it: type
// single (addr), cluster (seed addrs) or sentinel (the Sentinels' addrs
// and master_name), db, an ACL username, the password from a file or an
// environment variable (password_file, password_env, or auth_env in
// envoyproxy/ratelimit's REDIS_AUTH form), TLS with a CA, a client
// certificate and a server name, and pool_size (see RedisConfig). The
// config holds only file paths and variable names; Credentials and
// RedisTLSConfig.Load read them, and nothing logs the values. cmd builds
// the go-redis client of that type in one place and refuses to start when
// Redis answers as another kind, or refuses the credentials or the TLS
// handshake.
//
// redis.type cluster says the region's Redis is a Cluster (redis.cluster:
// true is its deprecated spelling, accepted with a warning from
// Config.Warnings): cmd then uses a ClusterClient and sets
// region.Config.OneSlot, New and Reload refuse a policy in which one
// request can combine limits of a domain without hash_tag (their keys
// cannot share a slot), naming the limits. On a single node or a
// Sentinel's master any composite is decided. The breaker counts only
// errors that say Redis is failing: a store error that reports
// StoreHealthy() (redisstore's cross-slot, bad-input and malformed-state
// errors) or a gcra input error goes to the limits' failure modes without
// opening it.
//
// Run serves both listeners (TLS or mutual TLS when configured), ticks the
// node every 100 ms (demand reports, lease lapses), reloads the policy when
// its content changes — the file's, or that of every file under a policy
// directory, links followed, so a swapped RUNTIME_ROOT link counts — or
// RequestReload is called (SIGHUP in cmd), and logs fallback decisions at
// most once a second. A policy that does not load keeps the old one
// running (meridian_policy_reload_failing is 1 until one loads).
//
// FromEnv builds a standalone agent's Config from envoyproxy/ratelimit's
// environment variables (REDIS_URL, RUNTIME_ROOT, GRPC_PORT, ...), so that
// a container spec written for upstream runs the agent unchanged: each
// variable is honoured, mapped, ignored with a warning or refused with the
// reason (cmd uses it when no --config is given). When ctx ends it fails
// readiness, stops accepting and finishes in-flight requests.
//
// # Endpoints
//
// gRPC: envoy.service.ratelimit.v3.RateLimitService and grpc.health.v1.
// HTTP: POST /v1/decide, POST /v1/reserve, GET /v1/table, GET
// /v1/keys/{key}, /healthz, /readyz, /metrics, and upstream's /json (a
// protojson RateLimitRequest decided by ShouldRateLimit, answered with
// upstream's status codes) and /healthcheck. With bearer tokens
// configured, RLS, /v1/* and /json require "authorization: Bearer
// <token>" (the scheme in any case, RFC 7235: "bearer", "BEARER"); health
// and metrics stay open. The JSON types live in region/agent/api. POST
// bodies to /v1/* must be sent as application/json (a charset parameter
// only as utf-8; else 415) and be exactly one JSON object (trailing data is
// a 400) whose strings are UTF-8: a raw invalid byte or an unpaired
// surrogate escape is a 400, as gRPC refuses invalid UTF-8, rather than
// U+FFFD, which would put distinct byte strings in one bucket. /json takes
// its body as upstream's does (any content type; protojson, which refuses
// invalid UTF-8 too).
//
// POST /v1/reserve books at most reserve_max_wait ahead (default 1 s, the
// coordinator's default fence; a larger max_wait_ms is a 400), and the node
// books no further than that or the lease left. In a cluster the
// configuration refuses a reserve_max_wait, and New and Reload a policy
// lease.ttl, above cluster.coordinator.fence: booked future must act before
// the increase the fence holds back (ARCHITECTURE.md invariant 4; see
// package region, "Booked future"). cmd passes reserve_max_wait to the node
// as region.Config.MaxReserveWait.
//
// # Concurrency
//
// ShouldRateLimit and the HTTP handlers are safe for many goroutines and
// share pooled scratch space; Run owns the node's Tick and Apply and the
// reloads. Metrics are registered on the agent's own registry, every
// series created at start-up.
package agent
