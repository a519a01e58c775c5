package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Configuring an agent from envoyproxy/ratelimit's environment variables,
// so that a container spec written for upstream runs Meridian unchanged.
// Each variable upstream's settings read is honoured (same meaning),
// mapped (to the Meridian field that does the same), ignored with a
// warning (it only tunes something Meridian does not have, such as statsd)
// or refused with an error that says why (it asks for behaviour Meridian
// does not have, such as memcache). /work/notes/env-readme.md, and the
// README, list them all.

// EnvConfig is an agent configured from the environment (FromEnv): the
// agent's Config and what the command around it sets up.
type EnvConfig struct {
	// Config is the agent's configuration: standalone (one region, no
	// cluster), policy from the runtime directory, Redis from REDIS_*.
	Config Config
	// Debug is DEBUG_HOST:DEBUG_PORT when either is set: a listener
	// serving /metrics and /debug/pprof/ (upstream's debug port serves
	// pprof and its stats). Empty: no debug listener.
	Debug string
	// MetricsAddr and MetricsPath are PROMETHEUS_ADDR and PROMETHEUS_PATH
	// when USE_PROMETHEUS is true: a listener serving the agent's metrics
	// (Meridian's series, not upstream's names). Empty: none (the metrics
	// are always on the HTTP port's /metrics).
	MetricsAddr, MetricsPath string
	// LogLevel is LOG_LEVEL; LogJSON is LOG_FORMAT=json.
	LogLevel slog.Level
	LogJSON  bool
	// HealthcheckStore is REDIS_HEALTH_CHECK_ACTIVE_CONNECTION: /healthcheck
	// also fails while Redis does not answer (Agent.SetHealthcheckStore).
	HealthcheckStore bool
	// Warnings name the variables set that Meridian accepts but does not
	// act on as upstream would; the command logs each.
	Warnings []string
}

// Upstream's defaults, where Meridian takes them over.
const (
	upstreamRuntimeRoot = "/srv/runtime_data/current"
	upstreamAppDir      = "config"
	upstreamRedisURL    = "/var/run/nutcracker/ratelimit.sock"
	upstreamHTTPPort    = 8080
	upstreamGRPCPort    = 8081
	upstreamDebugPort   = 6070
	// upstreamHost is where upstream binds every listener: all interfaces,
	// as a container needs. Meridian's config file defaults to loopback;
	// configured from the environment it binds as upstream does.
	upstreamHost = "0.0.0.0"
	// EnvRegion is the region an agent configured from the environment
	// runs as (standalone: the only one).
	EnvRegion = "local"
)

// genericEnv are upstream variables whose names other software sets too
// (a platform's PORT, a shell's HOST): alone they do not make the agent
// configure itself from the environment.
var genericEnv = []string{"HOST", "PORT", "LOG_LEVEL", "LOG_FORMAT", "DEBUG_HOST", "DEBUG_PORT"}

// upstreamEnv is every variable envoyproxy/ratelimit's settings read
// (src/settings/settings.go, at f2fb157), or the prefix of a family of them
// (ending in "_") whose names nothing else uses. Other REDIS_* variables
// (another program's REDIS_HOST) are not upstream's and select nothing.
var upstreamEnv = []string{
	"HOST", "PORT", "DEBUG_HOST", "DEBUG_PORT", "GRPC_UDS", "GRPC_HOST", "GRPC_PORT",
	"GRPC_MAX_CONNECTION_AGE", "GRPC_MAX_CONNECTION_AGE_GRACE", "GRPC_SERVER_USE_TLS", "GRPC_SERVER_TLS_CERT",
	"GRPC_SERVER_TLS_KEY", "GRPC_CLIENT_TLS_CACERT", "GRPC_CLIENT_TLS_SAN", "LOG_LEVEL", "LOG_FORMAT",
	"CONFIG_TYPE", "FORCE_START_WITHOUT_INITIAL_CONFIG", "CONFIG_GRPC_XDS_", "XDS_CLIENT_",
	"USE_DOG_STATSD", "USE_DOG_STATSD_MOGRIFIERS", "USE_STATSD", "STATSD_HOST", "STATSD_PORT", "EXTRA_TAGS",
	"STATS_FLUSH_INTERVAL", "DISABLE_STATS", "USE_PROMETHEUS", "PROMETHEUS_ADDR", "PROMETHEUS_PATH",
	"PROMETHEUS_MAPPER_YAML", "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
	"RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY", "RUNTIME_IGNOREDOTFILES", "RUNTIME_WATCH_ROOT",
	"EXPIRATION_JITTER_MAX_SECONDS", "LOCAL_CACHE_SIZE_IN_BYTES", "NEAR_LIMIT_RATIO", "CACHE_KEY_PREFIX",
	"BACKEND_TYPE", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "LIMIT_RESPONSE_HEADERS_ENABLED",
	"LIMIT_LIMIT_HEADER", "LIMIT_REMAINING_HEADER", "LIMIT_RESET_HEADER", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
	"REDIS_SOCKET_TYPE", "REDIS_TYPE", "REDIS_URL", "REDIS_POOL_SIZE", "REDIS_AUTH", "REDIS_TLS",
	"REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY", "REDIS_TLS_CACERT", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
	"REDIS_PIPELINE_WINDOW", "REDIS_PIPELINE_LIMIT", "REDIS_CLUSTER_PIPELINE_PARALLELISM", "REDIS_PERSECOND",
	"REDIS_PERSECOND_", "REDIS_SENTINEL_AUTH", "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "REDIS_TIMEOUT",
	"REDIS_POOL_ON_EMPTY_BEHAVIOR", "REDIS_STARTUP_INITIAL_INTERVAL", "REDIS_STARTUP_MAX_INTERVAL",
	"REDIS_STARTUP_MAX_ELAPSED_TIME",
	"MEMCACHE_HOST_PORT", "MEMCACHE_MAX_IDLE_CONNS", "MEMCACHE_SRV", "MEMCACHE_SRV_REFRESH", "MEMCACHE_TLS",
	"MEMCACHE_TLS_CLIENT_CERT", "MEMCACHE_TLS_CLIENT_KEY", "MEMCACHE_TLS_CACERT", "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
	"SHADOW_MODE", "QUOTA_MODE", "RESPONSE_DYNAMIC_METADATA", "MERGE_DOMAIN_CONFIG",
	"TRACING_ENABLED", "TRACING_SERVICE_NAME", "TRACING_SERVICE_NAMESPACE", "TRACING_SERVICE_INSTANCE_ID",
	"TRACING_EXPORTER_PROTOCOL", "TRACING_SAMPLING_RATE",
}

// UpstreamEnv lists, sorted, the variables set in environ (os.Environ's
// form, "NAME=value") that are envoyproxy/ratelimit's and that nothing
// else is likely to set: when `meridian agent` is given no --config, any
// of them makes it configure itself from the environment (FromEnv). The
// generic ones (HOST, PORT, LOG_LEVEL, LOG_FORMAT, DEBUG_HOST, DEBUG_PORT)
// count only beside one of these.
func UpstreamEnv(environ []string) []string {
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if isUpstreamEnv(name) && !slices.Contains(genericEnv, name) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func isUpstreamEnv(name string) bool {
	for _, v := range upstreamEnv {
		if name == v || strings.HasSuffix(v, "_") && strings.HasPrefix(name, v) {
			return true
		}
	}
	return false
}

// secretEnv are the variables whose values no error or log shows.
var secretEnv = []string{"REDIS_AUTH", "REDIS_SENTINEL_AUTH", "REDIS_PERSECOND_AUTH", "REDIS_PERSECOND_SENTINEL_AUTH"}

// envReader reads variables through lookup, collecting every problem.
type envReader struct {
	lookup func(string) (string, bool)
	errs   []error
	warns  []string
}

// get is the variable's value and whether it is set; set but empty counts
// as unset (a container spec's `value: ""` means "leave the default").
func (e *envReader) get(name string) (string, bool) {
	v, ok := e.lookup(name)
	if !ok || v == "" {
		return "", false
	}
	return v, true
}

// bad records a problem with name: its value (unless secret, or masked)
// and why.
func (e *envReader) bad(name, format string, a ...any) {
	v, _ := e.get(name)
	shown := fmt.Sprintf("=%q", v)
	switch {
	case slices.Contains(secretEnv, name):
		shown = " (value not shown)"
	case strings.Contains(v, "@"):
		shown = fmt.Sprintf("=%q", maskURL(v))
	}
	e.errs = append(e.errs, fmt.Errorf("$%s%s: %s", name, shown, fmt.Sprintf(format, a...)))
}

func (e *envReader) warn(name, format string, a ...any) {
	e.warns = append(e.warns, fmt.Sprintf("$%s: %s", name, fmt.Sprintf(format, a...)))
}

func (e *envReader) str(name, def string) string {
	if v, ok := e.get(name); ok {
		return v
	}
	return def
}

// bool reads name as upstream does (strconv.ParseBool: 1, t, true, TRUE,
// 0, f, false, …).
func (e *envReader) bool(name string, def bool) bool {
	v, ok := e.get(name)
	if !ok {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		e.bad(name, "not a boolean (want true or false, 1 or 0)")
		return def
	}
	return b
}

func (e *envReader) int(name string, def, lo, hi int) int {
	v, ok := e.get(name)
	if !ok {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		e.bad(name, "want a whole number in [%d, %d]", lo, hi)
		return def
	}
	return n
}

func (e *envReader) duration(name string) (time.Duration, bool) {
	v, ok := e.get(name)
	if !ok {
		return 0, false
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		e.bad(name, "not a duration (want e.g. 10s or 250ms)")
		return 0, false
	}
	return d, true
}

// ignored warns about each set variable of names that Meridian does not
// use, for why.
func (e *envReader) ignored(why string, names ...string) {
	for _, n := range names {
		if _, ok := e.get(n); ok {
			e.warn(n, "ignored: %s", why)
		}
	}
}

// ignoredPrefix is ignored for every set variable starting with prefix.
func (e *envReader) ignoredPrefix(environ []string, why, prefix string) {
	for _, kv := range environ {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, prefix) {
			e.ignored(why, name)
		}
	}
}

// refused records an error for each of names that is true: a mode
// Meridian does not have.
func (e *envReader) refused(why string, names ...string) {
	for _, n := range names {
		if e.bool(n, false) {
			e.bad(n, "%s", why)
		}
	}
}

// FromEnv configures an agent from envoyproxy/ratelimit's environment
// variables as lookup (os.LookupEnv) reads them; environ (os.Environ) names
// the variables set, for the families (REDIS_PERSECOND_…, MEMCACHE_…)
// whose members Meridian ignores. hostname names the agent. The agent is
// standalone — region EnvRegion, the only one, no cluster — its listeners
// on upstream's addresses (all interfaces; HTTP 8080, gRPC 8081), its
// policy the directory RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY
// (reloaded when any file in it changes), its Redis REDIS_URL. Every
// problem is reported at once, each naming its variable, its value (never
// REDIS_AUTH's) and why; Config.Validate runs last.
func FromEnv(lookup func(string) (string, bool), environ []string, hostname string) (*EnvConfig, error) {
	e := &envReader{lookup: lookup}
	out := &EnvConfig{Config: DefaultConfig()}
	c := &out.Config
	c.Region, c.Regions = EnvRegion, []string{EnvRegion}
	c.Agent = hostname
	if c.Agent == "" {
		c.Agent = "agent"
	}

	// Listeners.
	port := func(name string, def int) string { return strconv.Itoa(e.int(name, def, 1, 65535)) }
	c.HTTP = net.JoinHostPort(e.str("HOST", upstreamHost), port("PORT", upstreamHTTPPort))
	c.GRPC = net.JoinHostPort(e.str("GRPC_HOST", upstreamHost), port("GRPC_PORT", upstreamGRPCPort))
	if _, ok := e.get("GRPC_UDS"); ok {
		e.bad("GRPC_UDS", "Meridian serves gRPC on TCP only: unset it and point Envoy at GRPC_HOST:GRPC_PORT")
	}
	_, dh := e.get("DEBUG_HOST")
	_, dp := e.get("DEBUG_PORT")
	if dh || dp {
		out.Debug = net.JoinHostPort(e.str("DEBUG_HOST", upstreamHost), port("DEBUG_PORT", upstreamDebugPort))
	}
	if e.bool("GRPC_SERVER_USE_TLS", false) {
		e.bad("GRPC_SERVER_USE_TLS", "Meridian's TLS (the config file's tls section) serves the gRPC and the HTTP listener together; configure it with --config")
	} else {
		e.ignored("GRPC_SERVER_USE_TLS is not true", "GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY", "GRPC_CLIENT_TLS_CACERT", "GRPC_CLIENT_TLS_SAN")
	}
	for _, n := range []string{"GRPC_MAX_CONNECTION_AGE", "GRPC_MAX_CONNECTION_AGE_GRACE"} {
		if _, ok := e.duration(n); ok {
			e.warn(n, "ignored: Meridian does not age gRPC connections out")
		}
	}

	// Logging.
	switch lv := strings.ToLower(e.str("LOG_LEVEL", "info")); lv {
	case "trace", "debug":
		out.LogLevel = slog.LevelDebug
	case "info":
		out.LogLevel = slog.LevelInfo
	case "warn", "warning":
		out.LogLevel = slog.LevelWarn
	case "error", "fatal", "panic":
		out.LogLevel = slog.LevelError
	default:
		e.bad("LOG_LEVEL", "want trace, debug, info, warn, error, fatal or panic")
	}
	switch strings.ToLower(e.str("LOG_FORMAT", "text")) {
	case "text":
	case "json":
		out.LogJSON = true
	default:
		e.bad("LOG_FORMAT", "want text or json")
	}

	// The policy: upstream's runtime directory.
	switch ct := e.str("CONFIG_TYPE", "FILE"); {
	case strings.EqualFold(ct, "FILE"):
		e.ignoredPrefix(environ, "CONFIG_TYPE is FILE", "CONFIG_GRPC_XDS_")
		e.ignoredPrefix(environ, "CONFIG_TYPE is FILE", "XDS_CLIENT_")
	case strings.EqualFold(ct, "GRPC_XDS_SOTW"):
		e.bad("CONFIG_TYPE", "Meridian reads its policy from files only (RUNTIME_ROOT), not from an xDS server")
	default:
		e.bad("CONFIG_TYPE", "want FILE")
	}
	root := e.str("RUNTIME_ROOT", upstreamRuntimeRoot)
	sub := e.str("RUNTIME_SUBDIRECTORY", "")
	app := e.str("RUNTIME_APPDIRECTORY", upstreamAppDir)
	for _, p := range []struct{ name, v string }{{"RUNTIME_SUBDIRECTORY", sub}, {"RUNTIME_APPDIRECTORY", app}} {
		if filepath.IsAbs(p.v) || slices.Contains(strings.Split(filepath.ToSlash(p.v), "/"), "..") {
			e.bad(p.name, "must name a directory inside RUNTIME_ROOT (relative, no ..)")
		}
	}
	c.Policy = filepath.Join(root, sub, app)
	// Either way of watching upstream has — the RUNTIME_ROOT link swapped
	// (true), or the files in the config directory written (false) — is
	// a change of the directory's content, which the agent polls for.
	_ = e.bool("RUNTIME_WATCH_ROOT", true)
	c.PolicyOptions.IgnoreDotFiles = e.bool("RUNTIME_IGNOREDOTFILES", false)
	c.PolicyOptions.MergeDomains = e.bool("MERGE_DOMAIN_CONFIG", false)
	if e.bool("FORCE_START_WITHOUT_INITIAL_CONFIG", false) {
		e.bad("FORCE_START_WITHOUT_INITIAL_CONFIG", "Meridian starts only with a policy that loads")
	}
	_ = e.bool("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false) // always so: no policy, no agent

	e.redis(c, environ, out)

	// Metrics: Meridian's are Prometheus series on the HTTP port's /metrics.
	// Upstream's USE_STATSD defaults to true; only a spec that says so is
	// told.
	for _, n := range []string{"USE_STATSD", "USE_DOG_STATSD"} {
		if e.bool(n, false) {
			e.warn(n, "ignored: Meridian sends no statsd; scrape its Prometheus metrics at http://%s/metrics", c.HTTP)
		}
	}
	e.ignored("Meridian sends no statsd", "STATSD_HOST", "STATSD_PORT", "EXTRA_TAGS", "STATS_FLUSH_INTERVAL", "USE_DOG_STATSD_MOGRIFIERS")
	_ = e.bool("DISABLE_STATS", false)
	if e.bool("USE_PROMETHEUS", false) {
		out.MetricsAddr = e.str("PROMETHEUS_ADDR", ":9090")
		out.MetricsPath = e.str("PROMETHEUS_PATH", "/metrics")
		if !strings.HasPrefix(out.MetricsPath, "/") {
			e.bad("PROMETHEUS_PATH", "must start with /")
		}
		if _, p, err := net.SplitHostPort(out.MetricsAddr); err != nil || p == "" {
			e.bad("PROMETHEUS_ADDR", "want [host]:port")
		}
		e.warn("USE_PROMETHEUS", "Meridian's own series (meridian_*) are served at %s%s, not upstream's ratelimit_* names", out.MetricsAddr, out.MetricsPath)
	}
	e.ignored("Meridian's series are its own (no statsd mapping)", "PROMETHEUS_MAPPER_YAML", "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS")
	e.ignored("a fixed-window counter's tuning; Meridian's GCRA state expires exactly when a key rests", "EXPIRATION_JITTER_MAX_SECONDS")
	e.ignored("upstream's near-limit statistic; Meridian counts ok and over_limit per limit", "NEAR_LIMIT_RATIO")
	if v, ok := e.get("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"); ok {
		if b, err := strconv.ParseBool(v); err != nil {
			e.bad("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "not a boolean (want true or false, 1 or 0)")
		} else if !b {
			e.warn("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "false, but a denial never consumes in Meridian (GCRA: a denied request moves nothing), as with true")
		}
	}
	if e.int("LOCAL_CACHE_SIZE_IN_BYTES", 0, 0, 1<<40) > 0 {
		// region.Config.DenyCache is on in every agent: exact (it answers
		// only what Redis would), bounded by the tracked keys, not bytes.
		e.warn("LOCAL_CACHE_SIZE_IN_BYTES", "mapped to Meridian's deny cache, which is always on, exact and sized by the tracked keys: the byte size is not used")
	}

	// Responses and modes.
	if e.bool("LIMIT_RESPONSE_HEADERS_ENABLED", false) {
		c.ResponseHeaders = true
		e.warn("LIMIT_RESPONSE_HEADERS_ENABLED", "mapped to response_headers: Meridian adds RateLimit-Policy and RateLimit (IETF draft) and Retry-After when over, not RateLimit-Limit/-Remaining/-Reset")
	}
	for _, n := range []string{"LIMIT_LIMIT_HEADER", "LIMIT_REMAINING_HEADER", "LIMIT_RESET_HEADER"} {
		if _, ok := e.get(n); ok {
			e.bad(n, "Meridian's response header names are fixed (RateLimit-Policy, RateLimit, Retry-After)")
		}
	}
	e.refused("Meridian has no global shadow mode: set shadow_mode: true on the descriptors to shadow", "SHADOW_MODE")
	e.refused("Meridian has no global quota mode", "QUOTA_MODE")
	if e.bool("RESPONSE_DYNAMIC_METADATA", false) {
		e.warn("RESPONSE_DYNAMIC_METADATA", "ignored: Meridian's RLS answers carry no dynamic metadata")
	}
	if e.bool("TRACING_ENABLED", false) {
		e.bad("TRACING_ENABLED", "Meridian exports traces over OTLP/gRPC as its config file's tracing section says; configure it with --config")
	} else {
		for _, kv := range environ {
			if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "TRACING_") && name != "TRACING_ENABLED" {
				e.ignored("TRACING_ENABLED is not true", name)
			}
		}
	}
	e.ignoredPrefix(environ, "BACKEND_TYPE is not memcache (upstream ignores them too)", "MEMCACHE_")

	if len(e.errs) > 0 {
		return nil, fmt.Errorf("%w: from envoyproxy/ratelimit's environment variables: %w", ErrConfig, errors.Join(e.errs...))
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("from envoyproxy/ratelimit's environment variables: %w", err)
	}
	out.Warnings = e.warns
	return out, nil
}

// redis reads REDIS_* into c.Redis.
func (e *envReader) redis(c *Config, environ []string, out *EnvConfig) {
	r := &c.Redis
	switch bt := e.str("BACKEND_TYPE", "redis"); bt {
	case "redis":
	case "memcache":
		e.bad("BACKEND_TYPE", "Meridian decides on Redis only (GCRA in one Lua script call); set REDIS_URL")
	default:
		e.bad("BACKEND_TYPE", "want redis")
	}
	switch t := strings.ToLower(e.str("REDIS_TYPE", "single")); t {
	case RedisSingle, RedisCluster, RedisSentinel:
		r.Type = t
	default:
		e.bad("REDIS_TYPE", "want single, cluster or sentinel (any case)")
		r.Type = RedisSingle
	}
	url, urlSet := e.get("REDIS_URL")
	if !urlSet {
		url = upstreamRedisURL
	}
	sock, sockSet := e.get("REDIS_SOCKET_TYPE")
	sock = strings.ToLower(sock)
	switch {
	case !sockSet:
		// Upstream's default is unix, which dials a host:port as a file
		// name and fails; a path then means unix, anything else tcp.
		sock = "tcp"
		if strings.HasPrefix(url, "/") || strings.HasPrefix(url, ".") {
			sock = "unix"
		}
	case sock != "tcp" && sock != "unix":
		e.bad("REDIS_SOCKET_TYPE", "want tcp or unix")
		sock = "tcp"
	case sock == "unix" && r.Type != RedisSingle:
		// Upstream dials a Cluster's and the Sentinels' addresses over
		// TCP whatever it says.
		e.warn("REDIS_SOCKET_TYPE", "unix ignored with REDIS_TYPE %s: its addresses are dialled over TCP, as upstream does", r.Type)
		sock = "tcp"
	}
	badURL := func(_, format string, a ...any) { e.bad("REDIS_URL", format, a...) }
	addr := func(s string) string {
		s = strings.TrimSpace(s)
		if strings.Contains(s, "@") {
			// user:password@host with or without the scheme: never
			// quoted in an error (bad masks it).
			e.bad("REDIS_URL", "credentials in the URL: put them in REDIS_AUTH (\"password\" or \"user:password\"), which is never logged")
			return ""
		}
		rest, isURL := strings.CutPrefix(s, "redis://")
		if !isURL {
			return s
		}
		host, db, hasDB := strings.Cut(rest, "/")
		if hasDB && db != "" {
			n, err := strconv.Atoi(db)
			if err != nil || n < 0 {
				e.bad("REDIS_URL", "database %q: want a number", db)
			} else {
				r.DB = n
			}
		}
		return host
	}
	switch r.Type {
	case RedisSingle:
		if sock == "unix" {
			r.Network, r.Addr = "unix", url
			if !urlSet {
				e.warn("REDIS_URL", "unset: dialling upstream's default socket %s", upstreamRedisURL)
			}
			break
		}
		r.Network, r.Addr = "tcp", addr(url)
		if strings.Contains(url, ",") {
			e.bad("REDIS_URL", "a list with REDIS_TYPE single: set REDIS_TYPE cluster for seed nodes, or sentinel for \"master,sentinel1,...\"")
		} else if r.Addr != "" {
			checkHostPort(badURL, "", r.Addr)
		}
	case RedisCluster:
		for _, s := range strings.Split(url, ",") {
			if a := addr(s); a != "" {
				r.Addrs = append(r.Addrs, a)
			}
		}
		if len(r.Addrs) == 0 {
			e.bad("REDIS_URL", "want the Cluster's seed nodes, host:port,host:port,...")
		}
		for _, a := range r.Addrs {
			checkHostPort(badURL, "", a)
		}
	case RedisSentinel:
		parts := strings.Split(url, ",")
		if len(parts) < 2 || strings.TrimSpace(parts[0]) == "" {
			e.bad("REDIS_URL", "with REDIS_TYPE sentinel want the master name and the Sentinels: mymaster,host1:port,host2:port")
			break
		}
		r.MasterName = strings.TrimSpace(parts[0])
		for _, s := range parts[1:] {
			if a := addr(s); a != "" {
				r.Addrs = append(r.Addrs, a)
				checkHostPort(badURL, "", a)
			}
		}
	}
	if _, ok := e.get("REDIS_AUTH"); ok {
		// Read when the client is built (RedisConfig.Credentials), never
		// logged: "password", or "user:password" for an ACL user.
		r.AuthEnv = "REDIS_AUTH"
	}
	if _, ok := e.get("REDIS_SENTINEL_AUTH"); ok {
		e.bad("REDIS_SENTINEL_AUTH", "Meridian reaches the Sentinels without a password (REDIS_AUTH is the master's)")
	}
	if e.bool("REDIS_TLS", false) {
		t := &r.TLS
		t.Enabled = true
		t.CAFile = e.str("REDIS_TLS_CACERT", "")
		t.CertFile = e.str("REDIS_TLS_CLIENT_CERT", "")
		t.KeyFile = e.str("REDIS_TLS_CLIENT_KEY", "")
		if e.bool("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", false) {
			e.bad("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "Meridian verifies the server's name; name the one its certificate carries with redis.tls.server_name (--config)")
		}
	} else {
		e.ignored("REDIS_TLS is not true", "REDIS_TLS_CACERT", "REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")
	}
	// Unset: go-redis's default pool (10 connections per CPU), not
	// upstream's 10 in all.
	r.PoolSize = e.int("REDIS_POOL_SIZE", 0, 1, 1<<16)
	if d, ok := e.duration("REDIS_TIMEOUT"); ok {
		if d <= 0 || d > 10*time.Second {
			e.bad("REDIS_TIMEOUT", "must be in (0, 10s]: it bounds every decision's Redis call")
		} else {
			r.Timeout = Duration(d)
		}
	}
	switch p := strings.ToUpper(e.str("REDIS_POOL_ON_EMPTY_BEHAVIOR", "WAIT")); p {
	case "WAIT":
	case "CREATE", "ERROR":
		e.bad("REDIS_POOL_ON_EMPTY_BEHAVIOR", "not supported (upstream refuses it too): a full pool waits up to REDIS_TIMEOUT; raise REDIS_POOL_SIZE")
	default:
		e.bad("REDIS_POOL_ON_EMPTY_BEHAVIOR", "want WAIT")
	}
	if e.bool("REDIS_PERSECOND", false) {
		e.bad("REDIS_PERSECOND", "Meridian decides every limit on one Redis (REDIS_URL): a request's limits are one all-or-nothing script call")
	} else {
		e.ignoredPrefix(environ, "REDIS_PERSECOND is not true", "REDIS_PERSECOND_")
	}
	out.HealthcheckStore = e.bool("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", false)
	e.ignored("Meridian batches the decisions in flight into one script call per lane itself", "REDIS_PIPELINE_WINDOW", "REDIS_PIPELINE_LIMIT", "REDIS_CLUSTER_PIPELINE_PARALLELISM")
	e.ignored("Meridian starts without Redis and decides by each limit's failure_mode until it answers (/readyz waits for it)",
		"REDIS_STARTUP_INITIAL_INTERVAL", "REDIS_STARTUP_MAX_INTERVAL", "REDIS_STARTUP_MAX_ELAPSED_TIME")
	if p, ok := e.get("CACHE_KEY_PREFIX"); ok {
		if strings.ContainsAny(p, "{}") || len(p) > 64 {
			e.bad("CACHE_KEY_PREFIX", "a Redis key prefix may not contain { or } and is at most 64 bytes")
		} else {
			r.Prefix = p
		}
	}
}

// maskURL hides the credentials of redis://user:pass@host forms.
func maskURL(v string) string {
	parts := strings.Split(v, ",")
	for i, p := range parts {
		if at := strings.LastIndex(p, "@"); at >= 0 {
			parts[i] = "redis://*****@" + p[at+1:]
		}
	}
	return strings.Join(parts, ",")
}
