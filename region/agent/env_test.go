package agent

import (
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"
)

// fromEnv runs FromEnv on vars alone (no process environment).
func fromEnv(vars map[string]string) (*EnvConfig, error) {
	var environ []string
	for k, v := range vars {
		environ = append(environ, k+"="+v)
	}
	slices.Sort(environ)
	lookup := func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	return FromEnv(lookup, environ, "pod-7")
}

// TestFromEnvUpstreamCompose: the environment of envoyproxy/ratelimit's
// docker-compose example configures an agent as upstream would run.
func TestFromEnvUpstreamCompose(t *testing.T) {
	env, err := fromEnv(map[string]string{
		"USE_STATSD": "true", "STATSD_HOST": "statsd", "STATSD_PORT": "9125", "LOG_LEVEL": "debug",
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379", "RUNTIME_ROOT": "/data",
		"RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_WATCH_ROOT": "false", "CONFIG_TYPE": "FILE",
		"CONFIG_GRPC_XDS_NODE_ID": "test-node-id", "CONFIG_GRPC_XDS_SERVER_URL": "xds:18000",
		"MEMCACHE_HOST_PORT": "memcached:11211",
	})
	if err != nil {
		t.Fatal(err)
	}
	c := env.Config
	if c.Region != EnvRegion || c.Agent != "pod-7" || !slices.Equal(c.Regions, []string{EnvRegion}) || c.Cluster.Enabled() {
		t.Errorf("identity %q/%q of %v (cluster %v), want a standalone %s agent named by the host", c.Region, c.Agent, c.Regions, c.Cluster.Enabled(), EnvRegion)
	}
	if c.Policy != "/data/ratelimit/config" {
		t.Errorf("policy %q, want /data/ratelimit/config", c.Policy)
	}
	if c.HTTP != "0.0.0.0:8080" || c.GRPC != "0.0.0.0:8081" {
		t.Errorf("listeners http %q grpc %q, want upstream's 0.0.0.0:8080 and 0.0.0.0:8081", c.HTTP, c.GRPC)
	}
	if r := c.Redis; r.Kind() != RedisSingle || r.Addr != "redis:6379" || r.Network != "tcp" {
		t.Errorf("redis %s %s %q, want single tcp redis:6379", r.Kind(), r.Network, r.Addr)
	}
	if env.LogLevel != slog.LevelDebug || env.Debug != "" || env.MetricsAddr != "" {
		t.Errorf("log level %v, debug %q, metrics %q", env.LogLevel, env.Debug, env.MetricsAddr)
	}
	warned := strings.Join(env.Warnings, "\n")
	for _, v := range []string{"$USE_STATSD", "$STATSD_HOST", "$STATSD_PORT", "$CONFIG_GRPC_XDS_NODE_ID", "$CONFIG_GRPC_XDS_SERVER_URL", "$MEMCACHE_HOST_PORT"} {
		if !strings.Contains(warned, v+":") {
			t.Errorf("no warning about %s:\n%s", v, warned)
		}
	}
	for _, v := range []string{"$REDIS_URL", "$RUNTIME_ROOT", "$LOG_LEVEL", "$CONFIG_TYPE", "$RUNTIME_WATCH_ROOT"} {
		if strings.Contains(warned, v+":") {
			t.Errorf("a warning about %s, which is honoured:\n%s", v, warned)
		}
	}
}

func TestFromEnv(t *testing.T) {
	tests := []struct {
		name  string
		give  map[string]string
		check func(t *testing.T, e *EnvConfig)
	}{
		{"upstream's defaults: a unix socket, the runtime root", map[string]string{"RUNTIME_SUBDIRECTORY": "ratelimit"}, func(t *testing.T, e *EnvConfig) {
			if r := e.Config.Redis; r.Network != "unix" || r.Addr != "/var/run/nutcracker/ratelimit.sock" {
				t.Errorf("redis %s %q, want upstream's default socket", r.Network, r.Addr)
			}
			if e.Config.Policy != "/srv/runtime_data/current/ratelimit/config" {
				t.Errorf("policy %q", e.Config.Policy)
			}
		}},
		{"a socket path", map[string]string{"REDIS_SOCKET_TYPE": "unix", "REDIS_URL": "/run/redis.sock"}, func(t *testing.T, e *EnvConfig) {
			if r := e.Config.Redis; r.Network != "unix" || r.Addr != "/run/redis.sock" {
				t.Errorf("redis %s %q", r.Network, r.Addr)
			}
		}},
		{"host:port without a socket type is tcp", map[string]string{"REDIS_URL": "10.0.0.1:6380"}, func(t *testing.T, e *EnvConfig) {
			if r := e.Config.Redis; r.Network != "tcp" || r.Addr != "10.0.0.1:6380" {
				t.Errorf("redis %s %q", r.Network, r.Addr)
			}
		}},
		{"a redis:// URL with a database", map[string]string{"REDIS_URL": "redis://cache:6379/3", "REDIS_SOCKET_TYPE": "TCP"}, func(t *testing.T, e *EnvConfig) {
			if r := e.Config.Redis; r.Addr != "cache:6379" || r.DB != 3 {
				t.Errorf("redis %q db %d", r.Addr, r.DB)
			}
		}},
		{"a cluster, any case", map[string]string{"REDIS_TYPE": "CLUSTER", "REDIS_URL": "n1:7000, n2:7001,n3:7002"}, func(t *testing.T, e *EnvConfig) {
			if r := e.Config.Redis; r.Kind() != RedisCluster || !slices.Equal(r.Addrs, []string{"n1:7000", "n2:7001", "n3:7002"}) {
				t.Errorf("redis %s %v", r.Kind(), r.Addrs)
			}
		}},
		{"a sentinel: master name, then the Sentinels", map[string]string{"REDIS_TYPE": "Sentinel", "REDIS_URL": "mymaster,s1:26379,s2:26379"}, func(t *testing.T, e *EnvConfig) {
			if r := e.Config.Redis; r.Kind() != RedisSentinel || r.MasterName != "mymaster" || !slices.Equal(r.Addrs, []string{"s1:26379", "s2:26379"}) {
				t.Errorf("redis %s %q %v", r.Kind(), r.MasterName, r.Addrs)
			}
		}},
		{"REDIS_AUTH by name, TLS, pool, timeout, prefix", map[string]string{"REDIS_URL": "r:6379", "REDIS_AUTH": "rl:s3cret-value", "REDIS_TLS": "true",
			"REDIS_TLS_CACERT": "/tls/ca.pem", "REDIS_TLS_CLIENT_CERT": "/tls/c.pem", "REDIS_TLS_CLIENT_KEY": "/tls/c.key",
			"REDIS_POOL_SIZE": "20", "REDIS_TIMEOUT": "50ms", "CACHE_KEY_PREFIX": "rl_"}, func(t *testing.T, e *EnvConfig) {
			r := e.Config.Redis
			if r.AuthEnv != "REDIS_AUTH" || r.Username != "" || r.PasswordEnv != "" {
				t.Errorf("auth_env %q username %q password_env %q", r.AuthEnv, r.Username, r.PasswordEnv)
			}
			if tl := r.TLS; !tl.Enabled || tl.CAFile != "/tls/ca.pem" || tl.CertFile != "/tls/c.pem" || tl.KeyFile != "/tls/c.key" {
				t.Errorf("tls %+v", tl)
			}
			if r.PoolSize != 20 || r.Timeout.D() != 50*time.Millisecond || r.Prefix != "rl_" {
				t.Errorf("pool %d timeout %s prefix %q", r.PoolSize, r.Timeout.D(), r.Prefix)
			}
		}},
		{"listeners, logs, debug and prometheus", map[string]string{"REDIS_URL": "r:6379", "HOST": "127.0.0.1", "PORT": "9080", "GRPC_HOST": "::1", "GRPC_PORT": "9081",
			"DEBUG_PORT": "9070", "LOG_LEVEL": "WARN", "LOG_FORMAT": "json", "USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": "127.0.0.1:9090"}, func(t *testing.T, e *EnvConfig) {
			c := e.Config
			if c.HTTP != "127.0.0.1:9080" || c.GRPC != "[::1]:9081" || e.Debug != "0.0.0.0:9070" {
				t.Errorf("http %q grpc %q debug %q", c.HTTP, c.GRPC, e.Debug)
			}
			if e.LogLevel != slog.LevelWarn || !e.LogJSON {
				t.Errorf("log %v json %v", e.LogLevel, e.LogJSON)
			}
			if e.MetricsAddr != "127.0.0.1:9090" || e.MetricsPath != "/metrics" {
				t.Errorf("metrics %q %q", e.MetricsAddr, e.MetricsPath)
			}
		}},
		{"merge, dot files, app directory, headers, health", map[string]string{"REDIS_URL": "r:6379", "MERGE_DOMAIN_CONFIG": "true", "RUNTIME_IGNOREDOTFILES": "1",
			"RUNTIME_ROOT": "/rt", "RUNTIME_APPDIRECTORY": "limits", "LIMIT_RESPONSE_HEADERS_ENABLED": "true", "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION": "true",
			"LOCAL_CACHE_SIZE_IN_BYTES": "1048576"}, func(t *testing.T, e *EnvConfig) {
			c := e.Config
			if !c.PolicyOptions.MergeDomains || !c.PolicyOptions.IgnoreDotFiles || c.Policy != "/rt/limits" {
				t.Errorf("policy %q options %+v", c.Policy, c.PolicyOptions)
			}
			if !c.ResponseHeaders || !e.HealthcheckStore {
				t.Errorf("response_headers %v healthcheck store %v", c.ResponseHeaders, e.HealthcheckStore)
			}
			if !strings.Contains(strings.Join(e.Warnings, "\n"), "$LOCAL_CACHE_SIZE_IN_BYTES: mapped to Meridian's deny cache") {
				t.Errorf("warnings %q", e.Warnings)
			}
		}},
		{"empty values are unset", map[string]string{"REDIS_URL": "r:6379", "PORT": "", "REDIS_TYPE": "", "LOG_LEVEL": ""}, func(t *testing.T, e *EnvConfig) {
			if e.Config.HTTP != "0.0.0.0:8080" || e.Config.Redis.Kind() != RedisSingle || e.LogLevel != slog.LevelInfo {
				t.Errorf("http %q type %s level %v", e.Config.HTTP, e.Config.Redis.Kind(), e.LogLevel)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := fromEnv(tt.give)
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, e)
		})
	}
}

// TestFromEnvRefuses: each value Meridian cannot honour is an error that
// names the variable, shows its value (never a secret's) and says why —
// all of them at once.
func TestFromEnvRefuses(t *testing.T) {
	tests := []struct {
		name string
		give map[string]string
		want []string // in the error
	}{
		{"memcache", map[string]string{"BACKEND_TYPE": "memcache"}, []string{`$BACKEND_TYPE="memcache": Meridian decides on Redis only`}},
		{"an unknown backend", map[string]string{"BACKEND_TYPE": "etcd"}, []string{`$BACKEND_TYPE="etcd": want redis`}},
		{"xDS", map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW"}, []string{`$CONFIG_TYPE="GRPC_XDS_SOTW": Meridian reads its policy from files only`}},
		{"a redis type", map[string]string{"REDIS_TYPE": "ring"}, []string{`$REDIS_TYPE="ring": want single, cluster or sentinel`}},
		{"a socket type", map[string]string{"REDIS_SOCKET_TYPE": "udp", "REDIS_URL": "r:1"}, []string{`$REDIS_SOCKET_TYPE="udp": want tcp or unix`}},
		{"sentinel without a master", map[string]string{"REDIS_TYPE": "sentinel", "REDIS_URL": "s1:26379"}, []string{`$REDIS_URL="s1:26379": with REDIS_TYPE sentinel want the master name`}},
		{"a list for single", map[string]string{"REDIS_URL": "a:1,b:2"}, []string{`$REDIS_URL="a:1,b:2": a list with REDIS_TYPE single`}},
		{"no port", map[string]string{"REDIS_URL": "redis", "REDIS_SOCKET_TYPE": "tcp"}, []string{`$REDIS_URL="redis": "redis": want host:port`}},
		{"ports", map[string]string{"REDIS_URL": "r:1", "PORT": "http", "GRPC_PORT": "70000", "DEBUG_PORT": "0"}, []string{
			`$PORT="http": want a whole number in [1, 65535]`, `$GRPC_PORT="70000"`, `$DEBUG_PORT="0"`}},
		{"booleans and levels", map[string]string{"REDIS_URL": "r:1", "RUNTIME_WATCH_ROOT": "maybe", "LOG_LEVEL": "loud", "LOG_FORMAT": "xml"}, []string{
			`$RUNTIME_WATCH_ROOT="maybe": not a boolean`, `$LOG_LEVEL="loud": want trace, debug`, `$LOG_FORMAT="xml": want text or json`}},
		{"modes Meridian lacks", map[string]string{"REDIS_URL": "r:1", "SHADOW_MODE": "true", "QUOTA_MODE": "1", "REDIS_PERSECOND": "true",
			"GRPC_UDS": "/tmp/rl.sock", "GRPC_SERVER_USE_TLS": "true", "TRACING_ENABLED": "true", "FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
			"LIMIT_LIMIT_HEADER": "X-Limit", "REDIS_POOL_ON_EMPTY_BEHAVIOR": "CREATE"}, []string{
			`$SHADOW_MODE="true": Meridian has no global shadow mode`, `$QUOTA_MODE="1"`, `$REDIS_PERSECOND="true": Meridian decides every limit on one Redis`,
			`$GRPC_UDS="/tmp/rl.sock"`, `$GRPC_SERVER_USE_TLS="true"`, `$TRACING_ENABLED="true"`, `$FORCE_START_WITHOUT_INITIAL_CONFIG="true"`,
			`$LIMIT_LIMIT_HEADER="X-Limit"`, `$REDIS_POOL_ON_EMPTY_BEHAVIOR="CREATE"`}},
		{"TLS without the name check", map[string]string{"REDIS_URL": "r:1", "REDIS_TLS": "true", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "true"}, []string{
			`$REDIS_TLS_SKIP_HOSTNAME_VERIFICATION="true": Meridian verifies the server's name`}},
		{"a runtime directory outside the root", map[string]string{"REDIS_URL": "r:1", "RUNTIME_SUBDIRECTORY": "../etc"}, []string{`$RUNTIME_SUBDIRECTORY="../etc": must name a directory inside RUNTIME_ROOT`}},
		{"a prefix with a brace", map[string]string{"REDIS_URL": "r:1", "CACHE_KEY_PREFIX": "{rl}"}, []string{`$CACHE_KEY_PREFIX="{rl}"`}},
		{"secrets stay out of errors", map[string]string{"REDIS_URL": "redis://u:hunter2@r:1", "REDIS_AUTH": "user:hunter2", "REDIS_SENTINEL_AUTH": "hunter2"}, []string{
			`$REDIS_URL="redis://*****@r:1": credentials in the URL`, `$REDIS_SENTINEL_AUTH (value not shown)`}},
		// Fails on f96aee6: without the redis:// scheme the address was
		// checked as host:port and the error quoted it whole, password
		// included ("u:hunter2@r:1": want host:port).
		{"credentials without the scheme", map[string]string{"REDIS_URL": "u:hunter2@r:1"}, []string{
			`$REDIS_URL="redis://*****@r:1": credentials in the URL`}},
		{"credentials in a Sentinel address", map[string]string{"REDIS_TYPE": "sentinel", "REDIS_URL": "m,u:hunter2@s1:26379"}, []string{
			`credentials in the URL`}},
		{"credentials in a Cluster seed", map[string]string{"REDIS_TYPE": "cluster", "REDIS_URL": "a:1,:hunter2@b:2"}, []string{
			`credentials in the URL`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := fromEnv(tt.give)
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, ErrConfig) {
				t.Errorf("not an ErrConfig: %v", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("a secret in the error:\n%v", err)
			}
		})
	}
}

func TestUpstreamEnv(t *testing.T) {
	tests := []struct {
		give []string
		want []string
	}{
		{nil, nil},
		{[]string{"PATH=/bin", "HOME=/root"}, nil},
		{[]string{"PORT=8080", "HOST=x", "LOG_LEVEL=debug"}, nil}, // a platform's, a shell's
		{[]string{"PORT=8080", "REDIS_URL=r:6379", "RUNTIME_ROOT=/data", "REDIS_URL=again"}, []string{"REDIS_URL", "RUNTIME_ROOT"}},
		{[]string{"MEMCACHE_HOST_PORT=m:1", "REDIS_PERSECOND_URL=x", "USE_STATSD=false"}, []string{"MEMCACHE_HOST_PORT", "REDIS_PERSECOND_URL", "USE_STATSD"}},
		{[]string{"REDISX=1", "RUNTIME=1", "REDIS_HOST=cache", "TRACING=1"}, nil}, // not upstream's
		{[]string{"TRACING_SAMPLING_RATE=0.5", "CONFIG_GRPC_XDS_NODE_ID=n"}, []string{"CONFIG_GRPC_XDS_NODE_ID", "TRACING_SAMPLING_RATE"}},
	}
	for _, tt := range tests {
		if got := UpstreamEnv(tt.give); !slices.Equal(got, tt.want) {
			t.Errorf("UpstreamEnv(%q) = %q, want %q", tt.give, got, tt.want)
		}
	}
}

// TestRedisNetwork: redis.network dials a Unix socket for type single only.
func TestRedisNetwork(t *testing.T) {
	tests := []struct {
		give RedisConfig
		want string // "" accepted
	}{
		{RedisConfig{Network: "unix", Addr: "/run/redis.sock"}, ""},
		{RedisConfig{Network: "tcp", Addr: "r:6379"}, ""},
		{RedisConfig{Network: "unix"}, "redis.addr: empty with network unix"},
		{RedisConfig{Network: "udp", Addr: "r:6379"}, `redis.network: "udp": want tcp or unix`},
		{RedisConfig{Network: "unix", Type: RedisCluster, Addrs: []string{"a:1"}}, "redis.network: unix with type cluster"},
		{RedisConfig{Network: "tcp", Addr: "/run/redis.sock"}, "redis.addr"},
	}
	for _, tt := range tests {
		c := DefaultConfig()
		c.Region, c.Agent, c.Regions, c.Policy = "eu", "eu-1", []string{"eu"}, "p.yaml"
		tt.give.Prefix, tt.give.Timeout, tt.give.Lanes, tt.give.WriteFormat = c.Redis.Prefix, c.Redis.Timeout, c.Redis.Lanes, c.Redis.WriteFormat
		c.Redis = tt.give
		err := c.Validate()
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%+v: %v", tt.give, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%+v: %v, want %q", tt.give, err, tt.want)
		}
	}
}
