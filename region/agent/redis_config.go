package agent

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// Redis connection types (RedisConfig.Type).
const (
	RedisSingle   = "single"   // one server at addr
	RedisCluster  = "cluster"  // a Redis Cluster found from the seeds in addrs
	RedisSentinel = "sentinel" // the master the Sentinels in addrs name master_name
)

// DefaultRedisAddr is the server of type single when addr is empty.
const DefaultRedisAddr = "127.0.0.1:6379"

// RedisConfig is the region's Redis: how the agent reaches it (type,
// addresses, credentials, TLS, pool) and how the store uses it (prefix,
// timeout, lanes, write format). cmd/meridian builds the go-redis client
// from it in one place; this package reads only the files and variables
// it names (Credentials, RedisTLSConfig.Load). The password is never in
// the config file, and neither it nor the variables' values are ever
// logged or put in an error.
type RedisConfig struct {
	// Type is the kind of Redis: "single" (one server, the default),
	// "cluster" (Redis Cluster: one script call runs on one node, so a
	// request's limits must share a slot — a policy whose domain without
	// hash_tag lets one request combine limits is refused at load
	// (region.Policy.CheckOneSlot), and the node refuses a request whose
	// keys still cannot (region.Config.OneSlot)) or "sentinel" (the
	// master the Sentinels know by MasterName; a single node and a
	// Sentinel's master decide any composite). The agent refuses to start
	// when Redis answers as another kind. Empty means single, or cluster
	// when the deprecated Cluster is set.
	Type string `yaml:"type"`
	// Addr is the server of type single, host:port (empty:
	// DefaultRedisAddr). With type cluster it may name the one seed node
	// instead of Addrs; type sentinel refuses it (the master is found by
	// name).
	Addr string `yaml:"addr"`
	// Network is how Addr is dialled: "tcp" (the default; Addr is
	// host:port) or "unix" (Addr is the path of the server's Unix socket,
	// envoyproxy/ratelimit's REDIS_SOCKET_TYPE=unix; type single only).
	Network string `yaml:"network"`
	// Addrs are, with type cluster, the seed nodes (any of them; the
	// client discovers the rest) and, with type sentinel, the Sentinels;
	// each host:port, none twice. Type single refuses them.
	Addrs []string `yaml:"addrs"`
	// MasterName is the name the Sentinels monitor the master under
	// (type sentinel only, required there).
	MasterName string `yaml:"master_name"`
	// DB is the database number (SELECT) for types single and sentinel;
	// a Redis Cluster has only database 0, so type cluster refuses any
	// other.
	DB int `yaml:"db"`
	// Username is the ACL user (AUTH username password); empty: the
	// default user. It needs a password from PasswordFile or PasswordEnv.
	Username string `yaml:"username"`
	// PasswordFile is a file holding the password (one trailing line break
	// dropped), relative to the config file. PasswordEnv names an
	// environment variable holding it instead. AuthEnv names a variable in
	// envoyproxy/ratelimit's REDIS_AUTH form: "password", or
	// "user:password" split at the first colon (the user then comes from
	// the variable, so Username must be empty). At most one of the three;
	// none: no AUTH. The password reaches the servers of every type, not
	// the Sentinels (which the agent reaches without a password).
	PasswordFile string `yaml:"password_file"`
	PasswordEnv  string `yaml:"password_env"`
	AuthEnv      string `yaml:"auth_env"`
	// TLS to Redis (and to the Sentinels): see RedisTLSConfig.
	TLS RedisTLSConfig `yaml:"tls"`
	// PoolSize is go-redis's connection pool size per server (0: its
	// default, 10 per GOMAXPROCS, 5 per node of a Cluster).
	PoolSize int `yaml:"pool_size"`
	// Cluster is the deprecated spelling of Type "cluster" (it only ever
	// named a seed node in Addr). It still works, with a warning
	// (Config.Warnings); with Type single or sentinel it is an error.
	Cluster bool `yaml:"cluster"`
	// Prefix starts every key the store writes (redisstore.Config.Prefix:
	// no '{' or '}', at most 64 bytes). The agents of a region share it:
	// one key's state is one Redis key, whichever agent decides.
	Prefix string `yaml:"prefix"`
	// Timeout bounds each Redis call (one batched script call), in (0,
	// 10s]; past it the breaker counts a failure and the limits'
	// failure_mode decides.
	Timeout Duration `yaml:"timeout"`
	// Lanes is redisstore.Config.Lanes: how many batched script calls the
	// agent keeps in flight (keys map to a lane by hash slot).
	Lanes int `yaml:"lanes"`
	// WriteFormat is redisstore.Config.WriteFormat: "value" (the exact
	// state with its writer's limit), "value12" (the previous release's
	// 12-byte value) or "packed" (the integer of releases before that),
	// the last two for the first step of a rolling upgrade from such a
	// release; see the README's upgrade notes.
	WriteFormat string `yaml:"write_format"`
	// OnStateLoss is what the agent does when it finds that Redis lost
	// Meridian's keys (a restart without persistence, a failover to a
	// replica that had not caught up, a flush: redisstore.Store.CheckState,
	// every second): "count" (the default, also when empty: count it in meridian_redis_state_lost_total
	// and log it) or "conservative" (also run every global key at
	// min(share, safe share) until one burst window of its limit has
	// passed: region.Node.StateLost), trading admission for not
	// re-granting a region's whole share of every burst at once.
	OnStateLoss string `yaml:"on_state_loss"`
}

// Kind is the connection type in force: Type, or cluster when the
// deprecated Cluster is set, else single.
func (r *RedisConfig) Kind() string {
	switch {
	case r.Type != "":
		return r.Type
	case r.Cluster:
		return RedisCluster
	}
	return RedisSingle
}

// Addresses lists the addresses the client dials first: type single its
// server (Addr or DefaultRedisAddr), type cluster its seeds (Addrs, or
// Addr), type sentinel the Sentinels (Addrs).
func (r *RedisConfig) Addresses() []string {
	switch r.Kind() {
	case RedisSingle:
		if r.Addr == "" {
			return []string{DefaultRedisAddr}
		}
		return []string{r.Addr}
	case RedisCluster:
		if len(r.Addrs) == 0 && r.Addr != "" {
			return []string{r.Addr}
		}
	}
	return slices.Clone(r.Addrs)
}

// RedisTLSConfig is TLS from the agent to Redis. Without a CA file the
// host's roots verify the server; the server's name is ServerName, else
// the host of the address dialled (an IP address must then be in the
// certificate's IP SANs).
type RedisTLSConfig struct {
	// Enabled turns TLS on. The other fields are refused without it (a
	// typo must not turn TLS off).
	Enabled bool `yaml:"enabled"`
	// CAFile is the PEM bundle of CAs that verify the server (relative to
	// the config file); empty: the host's roots.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are the agent's client certificate and key, PEM
	// (for a Redis started with tls-auth-clients); both or neither.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName is the name verified in the server's certificate (and
	// sent as SNI) instead of the dialled host: for servers reached by IP
	// or through a name their certificate does not carry.
	ServerName string `yaml:"server_name"`
	// InsecureSkipVerify accepts any server certificate: encryption
	// without authentication, for tests only. Refused with CAFile.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// envName is what an environment variable's name looks like. A field that
// should name one and does not may hold the secret itself, so the errors
// about it never show it.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// validate adds the section's connection errors, each with its field
// path; Config.Validate checks the store's fields.
func (r *RedisConfig) validate(bad func(field, format string, a ...any)) {
	kind := r.Kind()
	switch r.Type {
	case "", RedisSingle, RedisCluster, RedisSentinel:
	default:
		bad("redis.type", "%q: want single, cluster or sentinel", r.Type)
	}
	if r.Cluster && r.Type != "" && r.Type != RedisCluster {
		bad("redis.cluster", "true, but redis.type is %s: cluster: true is the deprecated spelling of type: cluster; remove it", r.Type)
	}
	if r.MasterName != "" && kind != RedisSentinel {
		bad("redis.master_name", "set with type %s: only type sentinel finds its master by name", kind)
	}
	switch r.Network {
	case "", "tcp":
	case "unix":
		if kind != RedisSingle {
			bad("redis.network", "unix with type %s: only type single dials a Unix socket", kind)
		}
	default:
		bad("redis.network", "%q: want tcp or unix", r.Network)
	}
	switch kind {
	case RedisSingle:
		switch {
		case r.Network == "unix" && r.Addr == "":
			bad("redis.addr", "empty with network unix: name the server's socket file")
		case r.Network == "unix":
		case r.Addr != "":
			checkHostPort(bad, "redis.addr", r.Addr)
		}
		if len(r.Addrs) > 0 {
			bad("redis.addrs", "set with type single: name the server in addr (addrs lists a Cluster's seed nodes or the Sentinels)")
		}
	case RedisCluster:
		switch {
		case r.Addr != "" && len(r.Addrs) > 0:
			bad("redis.addr", "set together with redis.addrs: list every seed node in addrs")
		case r.Addr != "":
			checkHostPort(bad, "redis.addr", r.Addr)
		case len(r.Addrs) == 0:
			bad("redis.addrs", "empty: list the Cluster's seed nodes (host:port)")
		}
		if r.DB != 0 {
			bad("redis.db", "%d: a Redis Cluster has only database 0", r.DB)
		}
	case RedisSentinel:
		if r.Addr != "" {
			bad("redis.addr", "%q: not used with type sentinel: the Sentinels in addrs name the master (master_name)", r.Addr)
		}
		if len(r.Addrs) == 0 {
			bad("redis.addrs", "empty: list the Sentinels (host:port)")
		}
		if r.MasterName == "" {
			bad("redis.master_name", "empty: the name the Sentinels monitor the master under")
		}
	}
	if kind == RedisCluster || kind == RedisSentinel {
		for i, a := range r.Addrs {
			field := fmt.Sprintf("redis.addrs[%d]", i)
			if j := slices.Index(r.Addrs, a); j < i {
				bad(field, "%q: listed twice (also addrs[%d])", a, j)
				continue
			}
			checkHostPort(bad, field, a)
		}
	}
	if r.DB < 0 {
		bad("redis.db", "%d: must not be negative", r.DB)
	}
	if r.PoolSize < 0 {
		bad("redis.pool_size", "%d: must not be negative (0: go-redis's default)", r.PoolSize)
	}

	var sources []string
	for _, s := range []struct{ name, v string }{{"password_file", r.PasswordFile}, {"password_env", r.PasswordEnv}, {"auth_env", r.AuthEnv}} {
		if s.v != "" {
			sources = append(sources, s.name)
		}
	}
	if len(sources) > 1 {
		bad("redis."+sources[0], "set together with %s: choose one source of the password", strings.Join(sources[1:], " and "))
	}
	for _, e := range []struct{ name, v string }{{"password_env", r.PasswordEnv}, {"auth_env", r.AuthEnv}} {
		if e.v != "" && !envName.MatchString(e.v) {
			bad("redis."+e.name, "not an environment variable name ([A-Za-z_][A-Za-z0-9_]*); the value is not shown, in case it is the secret itself")
		}
	}
	switch {
	case r.Username == "":
	case strings.ContainsFunc(r.Username, unicode.IsSpace):
		bad("redis.username", "contains whitespace")
	case r.AuthEnv != "":
		bad("redis.username", "set together with redis.auth_env: the variable carries the user (\"user:password\")")
	case r.PasswordFile == "" && r.PasswordEnv == "":
		bad("redis.username", "%q has no password: set password_file or password_env", r.Username)
	}

	t := r.TLS
	if !t.Enabled {
		var set []string
		for _, f := range []struct {
			name string
			set  bool
		}{{"ca_file", t.CAFile != ""}, {"cert_file", t.CertFile != ""}, {"key_file", t.KeyFile != ""},
			{"server_name", t.ServerName != ""}, {"insecure_skip_verify", t.InsecureSkipVerify}} {
			if f.set {
				set = append(set, f.name)
			}
		}
		if len(set) > 0 {
			bad("redis.tls.enabled", "false, but %s set: set enabled: true, or remove them", strings.Join(set, ", "))
		}
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		bad("redis.tls", "cert_file and key_file go together")
	}
	if t.InsecureSkipVerify && t.CAFile != "" {
		bad("redis.tls.insecure_skip_verify", "set together with ca_file: nothing would be verified against the CA; choose one")
	}
}

// checkHostPort reports addr unless it is host:port with a host and a
// port number.
func checkHostPort(bad func(field, format string, a ...any), field, addr string) {
	host, port, err := net.SplitHostPort(addr)
	if err == nil {
		var n int
		n, err = strconv.Atoi(port)
		switch {
		case err != nil || n < 1 || n > 65535:
			err = fmt.Errorf("port %q is not a number in [1, 65535]", port)
		case host == "":
			err = fmt.Errorf("no host")
		}
	}
	if err != nil {
		bad(field, "%q: want host:port (%v)", addr, err)
	}
}

// Warnings lists what c accepts but should be written differently
// (deprecated spellings); cmd logs each at start-up.
func (c *Config) Warnings() []string {
	var w []string
	if c.Redis.Cluster {
		w = append(w, "redis.cluster is deprecated: write redis.type: cluster (and list the seed nodes in redis.addrs)")
	}
	return w
}

// Credentials reads the ACL user and the password r names: from
// PasswordFile (one trailing line break dropped) or PasswordEnv with
// Username, or from AuthEnv ("password", or "user:password" split at the
// first colon). No source: Username and no password (no AUTH unless
// Username is set, which Validate refuses). Errors name the field and the
// file or variable, never the value.
func (r *RedisConfig) Credentials() (user, pass string, err error) {
	switch {
	case r.PasswordFile != "":
		b, err := os.ReadFile(r.PasswordFile)
		if err != nil {
			return "", "", fmt.Errorf("redis.password_file: %w", err)
		}
		pass = strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
		if pass == "" {
			return "", "", fmt.Errorf("redis.password_file %s: empty", r.PasswordFile)
		}
		return r.Username, pass, nil
	case r.PasswordEnv != "":
		if pass = os.Getenv(r.PasswordEnv); pass == "" {
			return "", "", fmt.Errorf("redis.password_env: $%s is unset or empty", r.PasswordEnv)
		}
		return r.Username, pass, nil
	case r.AuthEnv != "":
		v := os.Getenv(r.AuthEnv)
		if v == "" {
			return "", "", fmt.Errorf("redis.auth_env: $%s is unset or empty", r.AuthEnv)
		}
		user, pass, ok := strings.Cut(v, ":")
		if !ok {
			return "", v, nil
		}
		if pass == "" {
			return "", "", fmt.Errorf("redis.auth_env: $%s is \"user:\" with an empty password", r.AuthEnv)
		}
		return user, pass, nil
	}
	return r.Username, "", nil
}

// Load builds the client's TLS configuration: nil when TLS is not
// enabled. Errors name the field and the file.
func (t RedisTLSConfig) Load() (*tls.Config, error) {
	if !t.Enabled {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("redis.tls.ca_file: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("redis.tls.ca_file %s: no PEM certificate in it", t.CAFile)
		}
	}
	if t.CertFile != "" || t.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			// tls's messages describe the files, never the key.
			return nil, fmt.Errorf("redis.tls: client certificate %s: %w", t.CertFile, err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}
