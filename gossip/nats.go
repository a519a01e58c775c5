package gossip

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meridian-quota/meridian/gossip/protocol"
)

// ErrFenced is returned (wrapped) by [Transport.StoreTable] when the table
// head is no longer at the revision the caller named: another coordinator
// wrote since, and nothing of this table became visible.
var ErrFenced = protocol.ErrFenced

// ErrClosed is returned by the Transport's methods once [Transport.Close]
// was called.
var ErrClosed = errors.New("gossip: transport closed")

// The oldest nats-server the transport works with (see [Transport]).
const (
	minServerMajor = 2
	minServerMinor = 9
)

// NATSTLS names the PEM files of a TLS connection to NATS. The client
// certificate is optional; a CA file is needed unless the system roots
// verify the servers.
type NATSTLS struct {
	CAFile   string `yaml:"ca_file"`
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// enabled reports whether any TLS file is named.
func (t NATSTLS) enabled() bool { return t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" }

// NATSConfig configures [Dial]. [DefaultNATSConfig] documents each default.
// A NATSConfig holds no secret itself: the credential fields name files or
// environment variables, and neither errors nor logs ever contain what
// they hold. At most one authentication method may be set (none: the
// server allows anonymous clients).
type NATSConfig struct {
	// URLs are the servers to connect to (nats://, tls://, ws:// or wss://
	// host:port), tried in random order; the client also learns the other
	// servers of the cluster from the one it reaches. No credentials in
	// URLs: use the fields below.
	URLs []string `yaml:"urls"`

	// CredsFile is a .creds file (user JWT and nkey seed; decentralized
	// auth with an operator).
	CredsFile string `yaml:"creds_file"`
	// NKeySeedFile is a file holding an nkey user seed ("SU…").
	NKeySeedFile string `yaml:"nkey_seed_file"`
	// User authenticates with a password from PasswordFile (trailing line
	// break ignored) or the environment variable PasswordEnv.
	User         string `yaml:"user"`
	PasswordFile string `yaml:"password_file"`
	PasswordEnv  string `yaml:"password_env"`
	// TokenFile or TokenEnv holds a token (token authentication).
	TokenFile string `yaml:"token_file"`
	TokenEnv  string `yaml:"token_env"`

	// TLS, when any file is named, makes the connection require TLS.
	TLS NATSTLS `yaml:"tls"`

	// ReconnectWait is the first wait before reconnecting; each failed
	// round over the servers doubles it, with jitter, up to
	// MaxReconnectWait. The client retries forever, including the first
	// connection (Dial waits for it until its ctx ends).
	ReconnectWait    time.Duration `yaml:"reconnect_wait"`
	MaxReconnectWait time.Duration `yaml:"max_reconnect_wait"`
	// PingInterval is how often the client pings the server; two
	// unanswered pings drop the connection and start reconnecting.
	PingInterval time.Duration `yaml:"ping_interval"`
	// ReconnectBufSize bounds, in bytes, the reports and acks held while
	// reconnecting (sent once reconnected); past it publishing fails.
	// Tables and the election never use this buffer (see Transport).
	ReconnectBufSize int `yaml:"reconnect_buf_size"`

	// Bucket is the JetStream KV bucket holding the tables and the
	// election key, created by Dial if absent. Several Meridian clusters
	// may share it: every key starts with the cluster name.
	Bucket string `yaml:"bucket"`
	// Replicas of the bucket when Dial creates it (1..5).
	Replicas int `yaml:"replicas"`
	// PlacementCluster, when set, is the NATS cluster the bucket's stream
	// is placed in when Dial creates it (in a supercluster: the
	// coordinators' home region; see Transport).
	PlacementCluster string `yaml:"placement_cluster"`
}

// DefaultNATSConfig returns the configuration Meridian uses unless told
// otherwise.
func DefaultNATSConfig() NATSConfig {
	return NATSConfig{
		URLs:             []string{nats.DefaultURL}, // the NATS server beside the agent, on its standard port
		ReconnectWait:    250 * time.Millisecond,    // a restart or a leader move usually heals within a second
		MaxReconnectWait: 5 * time.Second,           // a long outage costs the servers little, and recovery is seen within a report interval
		PingInterval:     5 * time.Second,           // a silently dead path is dropped in ~10 s (nats.go's 2 min would outlive every lease)
		ReconnectBufSize: 1 << 20,                   // a few intervals of reports; anything older is superseded anyway
		Bucket:           "meridian",                // one bucket per NATS account; clusters differ by key prefix
		Replicas:         1,                         // runs on a single server; use 3 on a NATS cluster so the bucket outlives a server
		PlacementCluster: "",                        // the server places the stream (where the creating client is connected)
	}
}

var bucketRe = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// Validate reports every problem with c at once, each with its field path.
// It reads no file and no environment variable ([Dial] does); messages
// name the fields, files and variables, never their contents.
func (c *NATSConfig) Validate() error {
	var errs []error
	bad := func(field, format string, a ...any) {
		errs = append(errs, fmt.Errorf("nats.%s: %s", field, fmt.Sprintf(format, a...)))
	}
	if len(c.URLs) == 0 {
		bad("urls", "empty: at least one server is needed")
	}
	for i, s := range c.URLs {
		u, err := url.Parse(s)
		switch {
		case err != nil:
			// url's message quotes the input, which may hold a password.
			bad(fmt.Sprintf("urls[%d]", i), "not a URL")
		case u.User != nil:
			bad(fmt.Sprintf("urls[%d]", i), "credentials in the URL: use user/password_file, token_file, nkey_seed_file or creds_file")
		case !slices.Contains([]string{"nats", "tls", "ws", "wss"}, u.Scheme):
			bad(fmt.Sprintf("urls[%d]", i), "scheme %q: want nats, tls, ws or wss", u.Scheme)
		case u.Hostname() == "":
			bad(fmt.Sprintf("urls[%d]", i), "no host")
		}
	}

	var methods []string
	if c.CredsFile != "" {
		methods = append(methods, "creds_file")
	}
	if c.NKeySeedFile != "" {
		methods = append(methods, "nkey_seed_file")
	}
	if c.User != "" || c.PasswordFile != "" || c.PasswordEnv != "" {
		methods = append(methods, "user")
		switch {
		case c.User == "":
			bad("user", "empty while password_file or password_env is set")
		case c.PasswordFile != "" && c.PasswordEnv != "":
			bad("password_file", "set together with password_env: choose one")
		case c.PasswordFile == "" && c.PasswordEnv == "":
			bad("user", "no password_file or password_env")
		}
		if strings.ContainsFunc(c.User, unicode.IsSpace) {
			bad("user", "contains whitespace")
		}
	}
	if c.TokenFile != "" || c.TokenEnv != "" {
		methods = append(methods, "token")
		if c.TokenFile != "" && c.TokenEnv != "" {
			bad("token_file", "set together with token_env: choose one")
		}
	}
	if len(methods) > 1 {
		bad("auth", "%s are set: at most one authentication method", strings.Join(methods, ", "))
	}
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		bad("tls", "cert_file and key_file go together")
	}

	if c.ReconnectWait <= 0 {
		bad("reconnect_wait", "%v: must be positive", c.ReconnectWait)
	}
	if c.MaxReconnectWait < c.ReconnectWait {
		bad("max_reconnect_wait", "%v: must be at least reconnect_wait (%v)", c.MaxReconnectWait, c.ReconnectWait)
	}
	if c.PingInterval < 100*time.Millisecond {
		bad("ping_interval", "%v: must be at least 100ms", c.PingInterval)
	}
	if c.ReconnectBufSize < 0 {
		bad("reconnect_buf_size", "%d: must not be negative", c.ReconnectBufSize)
	}
	if !bucketRe.MatchString(c.Bucket) {
		bad("bucket", "%q: want letters, digits, '-' and '_' only", c.Bucket)
	}
	if c.Replicas < 1 || c.Replicas > 5 {
		bad("replicas", "%d: must be in [1, 5]", c.Replicas)
	}
	if c.PlacementCluster != "" && !validToken(c.PlacementCluster) {
		bad("placement_cluster", "%q: not a NATS cluster name", c.PlacementCluster)
	}
	return errors.Join(errs...)
}

var nameRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// checkName validates a cluster, region or agent name: 1 to 64 letters,
// digits, '-' or '_'. Names become NATS subject tokens and KV key tokens,
// so '.', '*', '>' and whitespace are excluded, and so is everything else
// that could mean something to either.
func checkName(s string) error {
	if nameRe.MatchString(s) {
		return nil
	}
	return fmt.Errorf("%q: want 1 to 64 letters, digits, '-' or '_' (no '.', '*', '>' or whitespace)", s)
}

// validToken reports whether s can be one token of a NATS subject.
func validToken(s string) bool {
	return s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return r == '.' || r == '*' || r == '>' || unicode.IsSpace(r) || unicode.IsControl(r)
	})
}

// Transport is one agent's link to NATS: demand reports and acks as core
// NATS messages, and the share table and coordinator election in a
// JetStream KV bucket. Its methods are safe for concurrent use.
//
// # Subjects and keys
//
// Everything is namespaced by the cluster name given to [Dial], so several
// Meridian clusters can share one NATS account and bucket:
//
//	meridian.<cluster>.report.<region>.<agent>   demand reports (core NATS)
//	meridian.<cluster>.ack.<region>.<agent>      table acknowledgements (core NATS)
//	<cluster>.table.head                          KV: chunk 0 of the latest table; its revision fences writers
//	<cluster>.table.<term>.<epoch>.<i>            KV: chunk i ≥ 1 of table (term, epoch)
//	<cluster>.leader                              KV: the election record (see Campaign)
//
// Values are the bytes given (tables: gossip/wire chunks; the leader
// record: JSON). The bucket keeps one revision per key (History 1) and has
// no TTL.
//
// # Never replayed
//
// nats.go queues whatever is published while it reconnects and sends it
// once reconnected — JetStream API requests included, since they are
// ordinary requests: verified with nats.go v1.55.0, a KV Update issued
// while the server was down failed for its caller with a deadline, yet was
// applied by the server after the reconnect. A table must never be stored
// by a replay its coordinator gave up on, so the transport uses two
// connections: one for JetStream (tables, election) with that buffer
// disabled (ReconnectBufSize -1), so every KV call made while disconnected
// fails at once and nothing is sent later, and one for reports and acks
// with a bounded buffer (NATSConfig.ReconnectBufSize). A buffered report or
// ack replayed late is harmless: a report names its interval and the epoch
// it applied, an ack an epoch that was in force, and the coordinator
// treats both as the facts they were. An error from a KV call other than
// ErrFenced still means "outcome unknown" (the request may have reached
// the server before the connection broke): read LatestTable to find out.
//
// # Where the bucket lives
//
// In a multi-region deployment the regions' NATS clusters form a
// supercluster (gateways between clusters). The bucket is a JetStream
// stream placed in one cluster — NATSConfig.PlacementCluster, e.g. the
// coordinators' home region — with Replicas servers there; agents in the
// other regions reach it over the gateways, while reports and acks are
// routed by interest as usual. Losing that cluster stops elections and
// table changes: agents keep applying their last table until its leases
// lapse, then run at min(last share, safe share); coordinators see their
// writes fail and cannot be elected until it returns.
//
// # Server version
//
// The minimum is nats-server 2.9 (Dial checks the connected server's
// version). The transport relies only on what 2.9 has: KV buckets (a
// stream with one message per subject) read with direct get (new in 2.9),
// compare-and-set publishes on a subject's last sequence
// (Nats-Expected-Last-Subject-Sequence), KV watches (ordered push
// consumers delivering the last message per subject), stream info
// filtered by subject and purge by subject. It uses no per-message TTL
// (2.11) and no stream compression, subject transforms or multi-filter
// consumers (2.10): the election expires by the timestamps in its record,
// not by TTLs. TestSharedServer runs it against a 2.9.10 server.
type Transport struct {
	cluster string
	log     *slog.Logger
	pub     *nats.Conn // reports and acks: bounded reconnect buffer
	kvc     *nats.Conn // JetStream: no reconnect buffer, see above
	js      jetstream.JetStream
	kv      jetstream.KeyValue
	stream  jetstream.Stream // the bucket's stream (chunk listing and purging)

	keyPre  string // "<cluster>."
	subjPre string // "meridian.<cluster>."
	kvSubj  string // "$KV.<bucket>." : the stream subject of a key is kvSubj + key

	watch protocol.WatchConfig // WatchTables's timings

	closeOnce sync.Once
	closed    chan struct{}

	mu          sync.Mutex
	reconnected chan struct{} // closed and replaced each time kvc reconnects
}

// Timeouts of the transport's own background calls.
const (
	opTimeout  = 5 * time.Second // one KV call made in the background (resync)
	watchSetup = 2 * time.Second // creating the watch's consumer (one JetStream API round trip)
)

// Dial connects to NATS, waits for both connections and creates (or binds)
// the KV bucket, all within ctx: the first connection is retried with
// backoff until ctx ends, and Dial then returns the last connection error
// (an authentication failure ends it sooner). cluster namespaces every
// subject and key (see [Transport]). log receives connection events
// (disconnected, reconnected, closed) without credentials; nil discards.
func Dial(ctx context.Context, cluster string, cfg NATSConfig, log *slog.Logger) (*Transport, error) {
	var errs []error
	if err := checkName(cluster); err != nil {
		errs = append(errs, fmt.Errorf("cluster: %w", err))
	}
	if err := cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("gossip: dial: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	auth, err := cfg.authOptions()
	if err != nil {
		return nil, fmt.Errorf("gossip: dial: %w", err)
	}
	t := &Transport{
		cluster:     cluster,
		log:         log.With("cluster", cluster),
		keyPre:      cluster + ".",
		subjPre:     "meridian." + cluster + ".",
		kvSubj:      "$KV." + cfg.Bucket + ".",
		watch:       protocol.DefaultWatchConfig(), // resync and backoff: the same rule and timings as memnet's
		closed:      make(chan struct{}),
		reconnected: make(chan struct{}),
	}
	if t.kvc, err = t.connect(ctx, cfg, "kv", -1, auth); err != nil {
		return nil, err
	}
	if t.pub, err = t.connect(ctx, cfg, "pub", cfg.ReconnectBufSize, auth); err != nil {
		t.kvc.Close()
		return nil, err
	}
	if err := t.bind(ctx, cfg); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// authOptions loads the credentials and TLS files named by c.
func (c *NATSConfig) authOptions() ([]nats.Option, error) {
	var opts []nats.Option
	switch {
	case c.CredsFile != "":
		if _, err := os.Stat(c.CredsFile); err != nil {
			return nil, fmt.Errorf("nats.creds_file: %w", err)
		}
		opts = append(opts, nats.UserCredentials(c.CredsFile))
	case c.NKeySeedFile != "":
		o, err := nats.NkeyOptionFromSeed(c.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("nats.nkey_seed_file %s: not a readable nkey user seed", c.NKeySeedFile)
		}
		opts = append(opts, o)
	case c.User != "":
		pass, err := secret(c.PasswordFile, c.PasswordEnv, "password")
		if err != nil {
			return nil, err
		}
		opts = append(opts, nats.UserInfo(c.User, pass))
	case c.TokenFile != "" || c.TokenEnv != "":
		tok, err := secret(c.TokenFile, c.TokenEnv, "token")
		if err != nil {
			return nil, err
		}
		opts = append(opts, nats.Token(tok))
	}
	if c.TLS.enabled() {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if c.TLS.CAFile != "" {
			pem, err := os.ReadFile(c.TLS.CAFile)
			if err != nil {
				return nil, fmt.Errorf("nats.tls.ca_file: %w", err)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("nats.tls.ca_file %s: no PEM certificate", c.TLS.CAFile)
			}
		}
		if c.TLS.CertFile != "" {
			cert, err := tls.LoadX509KeyPair(c.TLS.CertFile, c.TLS.KeyFile)
			if err != nil {
				// tls's messages describe the files, never the key.
				return nil, fmt.Errorf("nats.tls: client certificate: %w", err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		opts = append(opts, nats.Secure(tc))
	}
	return opts, nil
}

// secret reads a password or token from file (one trailing line break
// dropped) or the environment variable env. Errors name the file or
// variable only.
func secret(file, env, what string) (string, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("nats: %s file: %w", what, err)
		}
		s := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
		if s == "" {
			return "", fmt.Errorf("nats: %s file %s is empty", what, file)
		}
		return s, nil
	}
	s := os.Getenv(env)
	if s == "" {
		return "", fmt.Errorf("nats: %s environment variable %s is unset or empty", what, env)
	}
	return s, nil
}

// connect opens one connection, named role in logs and in the server's
// connection list, and waits until it is up, closed or ctx ends.
func (t *Transport) connect(ctx context.Context, cfg NATSConfig, role string, bufSize int, auth []nats.Option) (*nats.Conn, error) {
	log := t.log.With("conn", role)
	up := make(chan struct{}, 1)
	down := make(chan struct{}, 1)
	signal := func(ch chan struct{}) {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	opts := append([]nats.Option{
		nats.Name("meridian/" + t.cluster + "/" + role),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.CustomReconnectDelay(backoff(cfg.ReconnectWait, cfg.MaxReconnectWait)),
		nats.PingInterval(cfg.PingInterval),
		nats.MaxPingsOutstanding(2),
		nats.ReconnectBufSize(bufSize),
		nats.ConnectHandler(func(nc *nats.Conn) {
			log.Info("NATS connected", "server", nc.ConnectedUrlRedacted())
			signal(up)
		}),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			log.Warn("NATS disconnected", "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("NATS reconnected", "server", nc.ConnectedUrlRedacted())
			if role == "kv" {
				t.mu.Lock()
				close(t.reconnected)
				t.reconnected = make(chan struct{})
				t.mu.Unlock()
			}
		}),
		nats.ClosedHandler(func(nc *nats.Conn) {
			log.Info("NATS connection closed", "err", nc.LastError())
			signal(down)
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if sub != nil {
				log.Warn("NATS subscription error", "subject", sub.Subject, "err", err)
				return
			}
			log.Warn("NATS error", "err", err)
		}),
	}, auth...)
	nc, err := nats.Connect(strings.Join(cfg.URLs, ","), opts...)
	if err != nil {
		return nil, fmt.Errorf("gossip: connect to NATS: %w", err)
	}
	if nc.IsConnected() {
		return nc, nil
	}
	select {
	case <-up:
		return nc, nil
	case <-down:
	case <-ctx.Done():
	}
	err = nc.LastError()
	nc.Close()
	if err == nil {
		err = ctx.Err()
	}
	return nil, fmt.Errorf("gossip: connect to NATS: %w", err)
}

// backoff returns nats.go's reconnect delay: first, doubling per failed
// round over the servers, capped at max, minus up to a quarter of jitter
// so that agents cut off together do not come back together.
func backoff(first, max time.Duration) func(attempts int) time.Duration {
	return func(attempts int) time.Duration {
		d := first
		for i := 1; i < attempts && d < max; i++ {
			d *= 2
		}
		d = min(d, max)
		return d - rand.N(d/4+1)
	}
}

// bind checks the server version and creates or binds the bucket.
func (t *Transport) bind(ctx context.Context, cfg NATSConfig) error {
	if v := t.kvc.ConnectedServerVersion(); !versionAtLeast(v, minServerMajor, minServerMinor) {
		return fmt.Errorf("gossip: nats-server %s: want %d.%d or newer", v, minServerMajor, minServerMinor)
	}
	js, err := jetstream.New(t.kvc)
	if err != nil {
		return fmt.Errorf("gossip: jetstream: %w", err)
	}
	t.js = js
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kcfg := jetstream.KeyValueConfig{
			Bucket:      cfg.Bucket,
			Description: "Meridian share tables and coordinator election",
			History:     1,
			Replicas:    cfg.Replicas,
			Storage:     jetstream.FileStorage,
		}
		if cfg.PlacementCluster != "" {
			kcfg.Placement = &jetstream.Placement{Cluster: cfg.PlacementCluster}
		}
		kv, err = js.CreateKeyValue(ctx, kcfg)
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, cfg.Bucket) // created meanwhile by another agent
		}
		if err == nil {
			t.log.Info("created KV bucket", "bucket", cfg.Bucket, "replicas", cfg.Replicas)
		} else {
			return fmt.Errorf("gossip: KV bucket %s does not exist and creating it failed (a NATS user that may not create streams, as `meridian keys` makes for agents that are not candidates, waits for a candidate to create it): %w", cfg.Bucket, err)
		}
	}
	if err != nil {
		return fmt.Errorf("gossip: KV bucket %s: %w", cfg.Bucket, err)
	}
	t.kv = kv
	st, err := js.Stream(ctx, "KV_"+cfg.Bucket)
	if err != nil {
		return fmt.Errorf("gossip: KV bucket %s: %w", cfg.Bucket, err)
	}
	t.stream = st
	if r := st.CachedInfo().Config.Replicas; r != cfg.Replicas {
		t.log.Warn("KV bucket exists with another replica count; keeping it", "bucket", cfg.Bucket, "replicas", r, "configured", cfg.Replicas)
	}
	return nil
}

// versionAtLeast reports whether the server version v ("2.9.10",
// "2.11.0-beta.1") is at least major.minor.
func versionAtLeast(v string, major, minor int) bool {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(strings.TrimLeftFunc(parts[1], func(r rune) bool { return r == 'v' }))
	if err1 != nil || err2 != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
}

// Close closes both connections; pending reports and acks are dropped.
// Blocked calls return ErrClosed or a connection error. Close may be
// called more than once.
func (t *Transport) Close() {
	t.closeOnce.Do(func() {
		close(t.closed)
		if t.pub != nil {
			t.pub.Close()
		}
		if t.kvc != nil {
			t.kvc.Close()
		}
	})
}

// Connected reports whether both connections are up right now.
func (t *Transport) Connected() bool {
	return t.pub.IsConnected() && t.kvc.IsConnected()
}

// isClosed reports whether Close was called.
func (t *Transport) isClosed() bool {
	select {
	case <-t.closed:
		return true
	default:
		return false
	}
}

// reconnectSignal returns a channel closed at the next reconnect of the
// JetStream connection.
func (t *Transport) reconnectSignal() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.reconnected
}

func (t *Transport) subject(kind, region, agent string) (string, error) {
	if err := checkName(region); err != nil {
		return "", fmt.Errorf("gossip: region: %w", err)
	}
	if err := checkName(agent); err != nil {
		return "", fmt.Errorf("gossip: agent: %w", err)
	}
	return t.subjPre + kind + "." + region + "." + agent, nil
}

// PublishReport sends one core NATS message per chunk of a demand report
// on meridian.<cluster>.report.<region>.<agent>, in order. While
// reconnecting the messages are buffered (see Transport); an error means
// the buffer is full, the transport is closed or a chunk is over the
// server's max_payload.
func (t *Transport) PublishReport(region, agent string, msgs [][]byte) error {
	subj, err := t.subject("report", region, agent)
	if err != nil {
		return err
	}
	for i, m := range msgs {
		if err := t.pub.Publish(subj, m); err != nil {
			return fmt.Errorf("gossip: publish report chunk %d of %d: %w", i+1, len(msgs), err)
		}
	}
	return nil
}

// PublishAck sends a table acknowledgement on
// meridian.<cluster>.ack.<region>.<agent>, buffered like reports.
func (t *Transport) PublishAck(region, agent string, msg []byte) error {
	subj, err := t.subject("ack", region, agent)
	if err != nil {
		return err
	}
	if err := t.pub.Publish(subj, msg); err != nil {
		return fmt.Errorf("gossip: publish ack: %w", err)
	}
	return nil
}

// SubscribeReports calls fn with every report message of the cluster (all
// regions and agents), one at a time on one goroutine, in the order the
// server delivered them. fn must not keep msg past its return unless it
// owns it (it does: each call gets a fresh slice) and should return
// quickly; past the pending limits messages are dropped and logged. stop
// ends the subscription and waits for a running fn to return; it must not
// be called from fn. The subscription survives reconnects.
func (t *Transport) SubscribeReports(fn func(from protocol.Sender, msg []byte)) (stop func(), err error) {
	return t.subscribe("report", fn)
}

// SubscribeAcks is SubscribeReports for acknowledgements.
func (t *Transport) SubscribeAcks(fn func(from protocol.Sender, msg []byte)) (stop func(), err error) {
	return t.subscribe("ack", fn)
}

// subscribe subscribes to kind's subjects, naming each message's sender by
// the subject it came on (kind.<region>.<agent>).
func (t *Transport) subscribe(kind string, fn func(protocol.Sender, []byte)) (func(), error) {
	pre := t.subjPre + kind + "."
	subj := pre + "*.*"
	done := make(chan struct{})
	sub, err := t.pub.Subscribe(subj, func(m *nats.Msg) {
		r, a, _ := strings.Cut(strings.TrimPrefix(m.Subject, pre), ".")
		fn(protocol.Sender{Region: r, Agent: a}, m.Data)
	})
	if err != nil {
		return nil, fmt.Errorf("gossip: subscribe %s: %w", subj, err)
	}
	sub.SetClosedHandler(func(string) { close(done) })
	// Make the interest known to the server before returning, so that a
	// message published after this call is delivered. Offline, the
	// subscription is sent with the reconnect.
	if t.pub.IsConnected() {
		if err := t.pub.FlushTimeout(opTimeout); err != nil && t.pub.IsConnected() {
			_ = sub.Unsubscribe()
			return nil, fmt.Errorf("gossip: subscribe %s: %w", subj, err)
		}
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			if err := sub.Unsubscribe(); err != nil {
				// Closed connection: its close ends the delivery goroutine.
				t.log.Debug("unsubscribe", "subject", subj, "err", err)
			}
			<-done
		})
	}, nil
}

// Keys of the bucket, below the cluster prefix.
const (
	keyHead   = "table.head"
	keyLeader = "leader"
)

func (t *Transport) chunkKey(term, epoch uint64, i int) string {
	return t.keyPre + "table." + strconv.FormatUint(term, 10) + "." + strconv.FormatUint(epoch, 10) + "." + strconv.Itoa(i)
}

// isConflict reports whether err is a failed compare-and-set (the key
// exists for a Create, or moved for an Update).
func isConflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}

// kvErr wraps a KV call's error, naming ErrClosed once the transport is
// closed.
func (t *Transport) kvErr(what string, err error) error {
	if t.isClosed() {
		return fmt.Errorf("gossip: %s: %w", what, ErrClosed)
	}
	if errors.Is(err, nats.ErrReconnectBufExceeded) {
		return fmt.Errorf("gossip: %s: NATS disconnected (not sent): %w", what, err)
	}
	return fmt.Errorf("gossip: %s: %w", what, err)
}

// maxChunks bounds a table's chunk count (a sanity bound on a decoded
// head's count field).
const maxChunks = 1 << 16

// StoreTable publishes a table given as its encoded chunks (chunks[0], the
// head, carries what a reader needs to fetch the rest). It writes
// chunks[1:] under <cluster>.table.<term>.<epoch>.<i> with plain puts,
// then compare-and-sets <cluster>.table.head to chunks[0] on revision prev
// (0: the head must not exist yet). The compare-and-set is the
// publication: if the head moved since prev, StoreTable returns an error
// wrapping ErrFenced and no reader ever sees this table. It returns the
// head's new revision. Afterwards it purges, best effort, the chunks of
// every table older than the newest one below this that has chunks, so a
// reader still fetching the previous table finds its chunks (a reader that
// loses them, two tables later, gets an error from FetchChunks and rereads
// the head). An in-base head (one chunk, wire.EncodeTableOn) writes none,
// so the base it names keeps its chunks until a newer base is stored after
// it.
//
// Any other error leaves the outcome unknown (see Transport): read
// LatestTable before trying again.
func (t *Transport) StoreTable(ctx context.Context, prev uint64, term, epoch uint64, chunks [][]byte) (rev uint64, err error) {
	if len(chunks) == 0 || len(chunks) > maxChunks {
		return 0, fmt.Errorf("gossip: store table: %d chunks: want 1..%d", len(chunks), maxChunks)
	}
	for i := 1; i < len(chunks); i++ {
		if _, err := t.kv.Put(ctx, t.chunkKey(term, epoch, i), chunks[i]); err != nil {
			return 0, t.kvErr(fmt.Sprintf("store table %d.%d chunk %d", term, epoch, i), err)
		}
	}
	if prev == 0 {
		rev, err = t.kv.Create(ctx, t.keyPre+keyHead, chunks[0])
	} else {
		rev, err = t.kv.Update(ctx, t.keyPre+keyHead, chunks[0], prev)
	}
	if isConflict(err) {
		return 0, fmt.Errorf("%w (term %d epoch %d on revision %d)", ErrFenced, term, epoch, prev)
	}
	if err != nil {
		return 0, t.kvErr(fmt.Sprintf("store table %d.%d head", term, epoch), err)
	}
	t.purgeOld(ctx, term, epoch)
	return rev, nil
}

// tableID orders tables as the coordinator does: by term, then epoch.
type tableID struct{ term, epoch uint64 }

func (a tableID) less(b tableID) bool {
	return a.term < b.term || a.term == b.term && a.epoch < b.epoch
}

// purgeOld removes the chunks of the tables older than the newest one
// below cur (cur's predecessor), with filtered stream purges that leave no
// delete markers behind. Failures are logged, not returned.
func (t *Transport) purgeOld(ctx context.Context, term, epoch uint64) {
	prefix := t.kvSubj + t.keyPre + "table."
	info, err := t.stream.Info(ctx, jetstream.WithSubjectFilter(prefix+"*.*.*"))
	if err != nil {
		t.log.Debug("list table chunks", "err", err)
		return
	}
	cur := tableID{term, epoch}
	seen := map[tableID]bool{}
	var prev tableID
	for subj := range info.State.Subjects {
		f := strings.Split(strings.TrimPrefix(subj, prefix), ".")
		if len(f) != 3 {
			continue
		}
		a, err1 := strconv.ParseUint(f[0], 10, 64)
		b, err2 := strconv.ParseUint(f[1], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		id := tableID{a, b}
		seen[id] = true
		if id.less(cur) && prev.less(id) {
			prev = id
		}
	}
	for id := range seen {
		if !id.less(prev) {
			continue
		}
		filter := fmt.Sprintf("%s%d.%d.*", prefix, id.term, id.epoch)
		if err := t.stream.Purge(ctx, jetstream.WithPurgeSubject(filter)); err != nil {
			t.log.Debug("purge table chunks", "term", id.term, "epoch", id.epoch, "err", err)
			return
		}
	}
}

// LatestTable returns the table head (chunk 0) and its revision, or
// ok=false when no table was ever stored in this cluster.
func (t *Transport) LatestTable(ctx context.Context) (head []byte, rev uint64, ok bool, err error) {
	e, err := t.kv.Get(ctx, t.keyPre+keyHead)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, false, nil
	}
	if err != nil {
		return nil, 0, false, t.kvErr("latest table", err)
	}
	return e.Value(), e.Revision(), true, nil
}

// FetchChunks returns chunks 1 … count-1 of table (term, epoch), in order
// (none for count 1). A missing chunk is an error: the table was purged
// after two newer ones were stored, or a replica serving the read lags;
// read the head again.
func (t *Transport) FetchChunks(ctx context.Context, term, epoch uint64, count int) ([][]byte, error) {
	if count < 1 || count > maxChunks {
		return nil, fmt.Errorf("gossip: fetch table %d.%d: %d chunks: want 1..%d", term, epoch, count, maxChunks)
	}
	out := make([][]byte, 0, count-1)
	for i := 1; i < count; i++ {
		e, err := t.kv.Get(ctx, t.chunkKey(term, epoch, i))
		if err != nil {
			return nil, t.kvErr(fmt.Sprintf("fetch table %d.%d chunk %d of %d", term, epoch, i, count), err)
		}
		out = append(out, e.Value())
	}
	return out, nil
}

// WatchTables calls fn with the current table head, if any, and then with
// every newer head, until ctx ends (it then returns nil) or the transport
// is closed (ErrClosed). fn runs on the caller's goroutine, one call at a
// time, and sees strictly increasing revisions: never an older head after
// a newer one, never the same one twice.
//
// It survives reconnects and server restarts: a KV watch (an ordered
// consumer) delivers the changes, and after each reconnect the watch is
// recreated, which delivers the current head again; besides, the head is
// reread every few seconds in case the watch stalled without a
// reconnect. A head whose revision went backwards (the bucket was deleted
// and recreated) is not delivered until it passes the last one seen. Those
// decisions, and the backoff between failed attempts to create the watch,
// are protocol.HeadWatch's, shared with memnet.
func (t *Transport) WatchTables(ctx context.Context, fn func(head []byte, rev uint64)) error {
	// Everything below stops when ctx ends or the transport closes; the
	// end tells the two apart.
	ctx, cancel := cancelOn(ctx, t.closed)
	defer cancel()
	key := t.keyPre + keyHead
	hw := protocol.NewHeadWatch(t.watch)
	deliver := func(e jetstream.KeyValueEntry) {
		if e == nil || e.Operation() != jetstream.KeyValuePut || !hw.Seen(e.Revision()) {
			return
		}
		fn(e.Value(), e.Revision())
	}
	for ctx.Err() == nil {
		reconnected := t.reconnectSignal()
		w, end, err := t.watchHead(ctx, key, reconnected)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			retry := time.NewTimer(untilMicros(hw.Failed(nowMicros())))
			if hw.Failures() == 1 {
				t.log.Warn("table watch: retrying", "err", err)
			}
			select {
			case <-ctx.Done():
			case <-reconnected:
			case <-retry.C:
			}
			retry.Stop()
			continue
		}
		if n := hw.Failures(); n > 0 {
			t.log.Info("table watch: resumed", "after_failures", n)
		}
		t.follow(ctx, w, reconnected, hw.Up(nowMicros()), &hw.WatchTimer, deliver)
		stopWatch(w)
		end()
	}
	if t.isClosed() {
		return ErrClosed
	}
	return nil
}

// nowMicros is the shell's clock for protocol.HeadWatch: µs on the
// monotonic clock since the process started (a wall-clock step must not
// stall a resync).
func nowMicros() int64 { return time.Since(monoStart).Microseconds() }

var monoStart = time.Now()

// untilMicros returns how long from now until instant at (nowMicros).
func untilMicros(at int64) time.Duration {
	return max(time.Duration(at-nowMicros())*time.Microsecond, 0)
}

// cancelOn returns a copy of ctx that also ends when done is closed.
func cancelOn(ctx context.Context, done <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-done:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// watchHead creates the KV watch of key and returns it with the function
// that ends it. The consumer-creation request is abandoned after
// watchSetup, or as soon as the connection reconnects: a request written
// just before a disconnect is lost, and waiting out the timeout would only
// delay the retry.
//
// The context kv.Watch is given is the watch's whole life, not only its
// creation's: nats.go unsubscribes the watch's ordered consumer when that
// context ends. Bounding it with the creation timeout (or cancelling it
// when watchHead returned) ended every watch at once, and WatchTables
// re-created it in a loop — hundreds of JetStream API requests per agent
// per Δ on an idle cluster (issue 17, defect 1). So the creation is
// bounded by a timer beside it, and the context lives until the caller
// ends the watch.
func (t *Transport) watchHead(ctx context.Context, key string, reconnected <-chan struct{}) (jetstream.KeyWatcher, context.CancelFunc, error) {
	wctx, end := context.WithCancel(ctx)
	type result struct {
		w   jetstream.KeyWatcher
		err error
	}
	done := make(chan result, 1)
	go func() {
		w, err := t.kv.Watch(wctx, key)
		done <- result{w, err}
	}()
	setup := time.NewTimer(watchSetup)
	defer setup.Stop()
	var why error
	select {
	case r := <-done:
		if r.err != nil {
			end()
			return nil, nil, r.err
		}
		return r.w, end, nil
	case <-setup.C:
		why = fmt.Errorf("creating the watch: no answer within %v", watchSetup)
	case <-reconnected:
		why = errors.New("creating the watch: the connection reconnected")
	}
	end() // abandons the request in flight
	if r := <-done; r.w != nil {
		stopWatch(r.w) // created just as it was abandoned
	}
	if ctx.Err() != nil {
		return nil, nil, ctx.Err()
	}
	return nil, nil, why
}

// follow delivers a watch's entries until ctx ends, the KV connection
// reconnects or the watch ends (to be recreated), and rereads the head at
// resyncAt and then when timer says.
func (t *Transport) follow(ctx context.Context, w jetstream.KeyWatcher, reconnected <-chan struct{}, resyncAt int64, timer *protocol.WatchTimer, deliver func(jetstream.KeyValueEntry)) {
	resync := time.NewTimer(untilMicros(resyncAt))
	defer resync.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-reconnected:
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			deliver(e) // nil marks the end of the initial values
		case <-resync.C:
			resyncAt = timer.NextResync(resyncAt)
			gctx, cancel := context.WithTimeout(ctx, opTimeout)
			e, err := t.kv.Get(gctx, t.keyPre+keyHead)
			cancel()
			if err == nil {
				deliver(e)
			}
			resync.Reset(untilMicros(resyncAt))
		}
	}
}

// stopWatch stops w and drains its channel, so that nats.go's delivery
// goroutine, which may be blocked on the channel, can finish (bounded, in
// case the connection is gone and the channel is never closed).
func stopWatch(w jetstream.KeyWatcher) {
	_ = w.Stop()
	timeout := time.NewTimer(time.Second)
	defer timeout.Stop()
	for {
		select {
		case _, ok := <-w.Updates():
			if !ok {
				return
			}
		case <-timeout.C:
			return
		}
	}
}
