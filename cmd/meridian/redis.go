package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/meridian-quota/meridian/gcra/redisstore"
	"github.com/meridian-quota/meridian/region/agent"
)

// scriptLoadTimeout bounds the agent's wait for Redis at start-up: once for
// the kind probe, once for the script load.
const scriptLoadTimeout = 2 * time.Second

// agentRedis is the agent's Redis as its config's redis section describes
// it: the go-redis client and the store deciding on it.
type agentRedis struct {
	client redis.UniversalClient
	store  *redisstore.Store
}

// Close closes the client.
func (r *agentRedis) Close() error { return r.client.Close() }

// redisDial is what every connection to the agent's Redis is opened with:
// the credentials and the TLS configuration read once from the files and
// variables the config names. Sentinels get the TLS, not the password.
type redisDial struct {
	rc         *agent.RedisConfig
	user, pass string
	tls        *tls.Config
}

// newRedisDial reads the credentials and TLS files rc names, reporting
// both kinds of problem at once. Errors name fields, files and variables,
// never a secret.
func newRedisDial(rc *agent.RedisConfig) (*redisDial, error) {
	user, pass, cerr := rc.Credentials()
	tc, terr := rc.TLS.Load()
	if err := errors.Join(cerr, terr); err != nil {
		return nil, fmt.Errorf("%w: %w", agent.ErrConfig, err)
	}
	return &redisDial{rc: rc, user: user, pass: pass, tls: tc}, nil
}

// client is the go-redis client of the config's type: a Client on the
// single server, a ClusterClient seeded with addrs, or a FailoverClient
// that asks the Sentinels for master_name. ContextTimeoutEnabled lets the
// store's redis.timeout cut a blocked read short.
func (d *redisDial) client() redis.UniversalClient {
	rc := d.rc
	addrs := rc.Addresses()
	switch rc.Kind() {
	case agent.RedisCluster:
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Username: d.user, Password: d.pass,
			TLSConfig: d.tls, Dialer: d.dialer(), PoolSize: rc.PoolSize, ContextTimeoutEnabled: true})
	case agent.RedisSentinel:
		return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: rc.MasterName, SentinelAddrs: addrs,
			Username: d.user, Password: d.pass, DB: rc.DB, TLSConfig: d.tls, Dialer: d.dialer(), PoolSize: rc.PoolSize,
			ContextTimeoutEnabled: true})
	}
	return redis.NewClient(&redis.Options{Network: rc.Network, Addr: addrs[0], Username: d.user, Password: d.pass, DB: rc.DB,
		TLSConfig: d.tls, Dialer: d.dialer(), PoolSize: rc.PoolSize, ContextTimeoutEnabled: true})
}

// tlsDialTimeout bounds a TLS dial whose context has no earlier deadline
// (go-redis's own DialTimeout default).
const tlsDialTimeout = 5 * time.Second

// dialer is, with TLS, a dialer whose handshake ends with its context:
// go-redis's own TLS dial (tls.DialWithDialer) ignores the context, so a
// server that accepts and then stalls the handshake would hold a decision
// for the whole dial timeout instead of its redis.timeout. Without TLS,
// nil: go-redis's dialer honours the context already.
func (d *redisDial) dialer() func(ctx context.Context, network, addr string) (net.Conn, error) {
	if d.tls == nil {
		return nil
	}
	td := &tls.Dialer{NetDialer: &net.Dialer{Timeout: tlsDialTimeout}, Config: d.tls}
	return td.DialContext
}

// credentials says which user and which source of the password were
// offered, for an error about a refusal: names, never the password.
func (d *redisDial) credentials() string {
	rc := d.rc
	user := "the default user"
	if d.user != "" {
		user = fmt.Sprintf("user %q", d.user)
	}
	switch {
	case rc.PasswordFile != "":
		return fmt.Sprintf("check %s and the password in redis.password_file %s", user, rc.PasswordFile)
	case rc.PasswordEnv != "":
		return fmt.Sprintf("check %s and the password in redis.password_env $%s", user, rc.PasswordEnv)
	case rc.AuthEnv != "":
		return fmt.Sprintf("check %s and the password in redis.auth_env $%s", user, rc.AuthEnv)
	}
	return "no password is configured: set redis.password_file, password_env or auth_env (and username for an ACL user)"
}

// probe is a one-connection client of one address for the start-up checks:
// no retries, so a Redis that does not answer costs one dial. A Sentinel
// is reached without the password and database.
func (d *redisDial) probe(addr string, sentinel bool) *redis.Client {
	o := &redis.Options{Network: d.rc.Network, Addr: addr, TLSConfig: d.tls, Dialer: d.dialer(), PoolSize: 1, MaxRetries: -1, DialerRetries: 1,
		ContextTimeoutEnabled: true}
	if !sentinel {
		o.Username, o.Password, o.DB = d.user, d.pass, d.rc.DB
	}
	return redis.NewClient(o)
}

// openRedis builds the agent's Redis client and store from rc — the one
// place the agent's connection is made — and checks it before the agent
// serves: a Redis that answers as another kind than redis.type, refuses
// the credentials or fails the TLS handshake on its certificate is a
// configuration error (checkRedisKind). Then it loads the script, so the
// first decisions do not spend their redis.timeout on a dial, NOSCRIPT and
// the script's compilation. A Redis that does not answer is not fatal: the
// limits' failure modes decide until it does (and /readyz waits for it).
func openRedis(ctx context.Context, rc *agent.RedisConfig, log *slog.Logger) (*agentRedis, error) {
	d, err := newRedisDial(rc)
	if err != nil {
		return nil, err
	}
	scfg := redisstore.DefaultConfig()
	scfg.Prefix = rc.Prefix
	scfg.Timeout = time.Duration(rc.Timeout)
	scfg.Lanes = rc.Lanes
	if scfg.WriteFormat, err = redisstore.ParseFormat(rc.WriteFormat); err != nil {
		return nil, err
	}
	client := d.client()
	store, err := redisstore.New(client, scfg)
	if err != nil {
		client.Close()
		return nil, err
	}
	switch scfg.WriteFormat {
	case redisstore.FormatPacked:
		log.Warn("redis.write_format is packed: writing the older releases' format for a rolling upgrade; windows above 36 h decide as zero limits until it is value again")
	case redisstore.FormatValue12:
		log.Warn("redis.write_format is value12: writing the previous release's 12-byte value for a rolling upgrade; set it to value once no agent of that release is left")
	}
	pctx, cancel := context.WithTimeout(ctx, scriptLoadTimeout)
	err = checkRedisKind(pctx, d, log)
	cancel()
	if err != nil {
		client.Close()
		return nil, err
	}
	lctx, cancel := context.WithTimeout(ctx, scriptLoadTimeout)
	defer cancel()
	if err := store.Load(lctx); err != nil {
		log.Warn("redis: script not loaded; the first decisions will load it", "type", rc.Kind(),
			"addrs", strings.Join(rc.Addresses(), ","), "err", err)
	}
	return &agentRedis{client: client, store: store}, nil
}

// checkRedisKind refuses to start when Redis answers and is not the kind
// redis.type says — a single-node client on a Cluster node would get MOVED
// for most keys, and the policy would have been checked for the wrong kind
// of store (a Cluster needs a request's limits in one slot) — or when it
// refuses the connection for a reason that will not pass (credentials,
// database, TLS: see refusal). Each address is asked alone, once, without
// retries (INFO server's redis_mode): the single server must be
// standalone, every Cluster seed a cluster node, every Sentinel a Sentinel
// that knows master_name, and the master a Sentinel names standalone (and
// it must take the credentials and db). A Redis that does not answer is not
// an error here: the failure modes decide until it does. A user the ACL
// denies INFO is not checked for kind, with a warning.
func checkRedisKind(ctx context.Context, d *redisDial, log *slog.Logger) error {
	rc := d.rc
	kind := rc.Kind()
	field := "redis.addr"
	if kind != agent.RedisSingle && len(rc.Addrs) > 0 {
		field = "redis.addrs"
	}
	sentinel := kind == agent.RedisSentinel
	want := map[string]string{agent.RedisSingle: "standalone", agent.RedisCluster: "cluster", agent.RedisSentinel: "sentinel"}[kind]
	for _, a := range rc.Addresses() {
		c := d.probe(a, sentinel)
		answered, err := d.wantMode(ctx, c, field+" "+a, want, log)
		var master []string
		if err == nil && answered && sentinel {
			master, err = c.Do(ctx, "sentinel", "get-master-addr-by-name", rc.MasterName).StringSlice()
			switch {
			case errors.Is(err, redis.Nil):
				err = fmt.Errorf("%w: redis.master_name %q: the Sentinel at %s monitors no master of that name", agent.ErrConfig, rc.MasterName, a)
			case err != nil || len(master) != 2:
				master, err = nil, nil // a Sentinel that does not say is left to the client
			}
		}
		c.Close()
		if err != nil {
			return err
		}
		if master != nil {
			mc := d.probe(net.JoinHostPort(master[0], master[1]), false)
			_, err := d.wantMode(ctx, mc, fmt.Sprintf("the master %q at %s", rc.MasterName, mc.Options().Addr), "standalone", log)
			mc.Close()
			return err // one Sentinel's answer is enough
		}
	}
	return nil
}

// wantMode asks c for INFO server and returns a configuration error when
// its redis_mode is not want (what names the server for the message), or
// when c's connection was refused for good; answered reports whether the
// server answered at all.
func (d *redisDial) wantMode(ctx context.Context, c redis.Cmdable, what, want string, log *slog.Logger) (answered bool, _ error) {
	info, err := c.Info(ctx, "server").Result()
	var rerr redis.Error
	if errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "NOPERM") {
		log.Warn("redis: the user may not run INFO; the kind of Redis is not checked", "server", what, "err", err)
		return true, nil
	}
	if err != nil {
		return false, d.refusal(what, err)
	}
	var mode string
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_mode:"); ok {
			mode = v
		}
	}
	if mode == "" || mode == want {
		return true, nil // a server that does not say (a proxy) is taken as configured
	}
	var is, hint string
	switch mode {
	case "cluster":
		is, hint = "a Redis Cluster node", "set redis.type: cluster and list the seed nodes in redis.addrs (the policy is then checked for one-slot composites)"
	case "sentinel":
		is, hint = "a Sentinel", "set redis.type: sentinel, list the Sentinels in redis.addrs and name the master in redis.master_name"
	default:
		is, hint = "a single Redis, not a Redis Cluster node nor a Sentinel", "set redis.type: single and name it in redis.addr"
	}
	return true, fmt.Errorf("%w: redis.type is %s, but %s is %s (redis_mode %s): %s", agent.ErrConfig, d.rc.Kind(), what, is, mode, hint)
}

// refusal is the configuration error err stands for when Redis refused
// the connection for a reason retrying will not fix: credentials (WRONGPASS,
// NOAUTH), the database number, the server's certificate, a server that
// does not speak TLS, or a TLS handshake the server refused (a client
// certificate it wants). Anything else (not reachable, timed out, loading)
// is nil: the failure modes decide until Redis answers. Redis's messages
// and the TLS errors never carry the password.
func (d *redisDial) refusal(what string, err error) error {
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		switch {
		case strings.HasPrefix(msg, "WRONGPASS"), strings.HasPrefix(msg, "NOAUTH"),
			strings.HasPrefix(msg, "ERR AUTH"), strings.Contains(msg, "without any password configured"):
			return fmt.Errorf("%w: %s refused the credentials (%s): %s", agent.ErrConfig, what, msg, d.credentials())
		case strings.Contains(msg, "DB index is out of range"):
			return fmt.Errorf("%w: redis.db %d: %s refused it (%s)", agent.ErrConfig, d.rc.DB, what, msg)
		}
		return nil
	}
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		record   tls.RecordHeaderError
		op       *net.OpError
	)
	switch {
	case errors.As(err, &verify), errors.As(err, &unknown), errors.As(err, &hostname), errors.As(err, &invalid):
		return fmt.Errorf("%w: %s: its TLS certificate does not verify (%v): check redis.tls.ca_file and server_name",
			agent.ErrConfig, what, err)
	case errors.As(err, &record):
		return fmt.Errorf("%w: %s does not answer TLS (%v): is redis.tls.enabled right?", agent.ErrConfig, what, err)
	case errors.As(err, &op) && op.Op == "remote error":
		return fmt.Errorf("%w: %s refused the TLS handshake (%v): check redis.tls.cert_file and key_file (a server with tls-auth-clients wants a certificate its CA signed)",
			agent.ErrConfig, what, err)
	}
	return nil
}
