package natstest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/meridian-quota/meridian/internal/testenv"
)

// readyWait bounds how long Start and Restart wait for a server to accept
// connections (JetStream recovery of a small store takes milliseconds).
const readyWait = 10 * time.Second

// Option configures a server started by [Start].
type Option func(*config)

type config struct {
	users []*server.User
	nkeys []*server.NkeyUser
	token string
	certs *Certs
	conf  string
}

// WithUsers adds a user with a password; the server then refuses clients
// without valid credentials. It may be given several times, and combined
// with [WithNKey] but not with [WithToken] (nats-server refuses that mix).
func WithUsers(user, pass string) Option {
	return func(c *config) { c.users = append(c.users, &server.User{Username: user, Password: pass}) }
}

// WithToken makes the server require token authentication.
func WithToken(token string) Option {
	return func(c *config) { c.token = token }
}

// WithNKey adds an nkey user by its public key (a "U…" string, see
// github.com/nats-io/nkeys); clients prove it by signing with the seed.
func WithNKey(pub string) Option {
	return func(c *config) { c.nkeys = append(c.nkeys, &server.NkeyUser{Nkey: pub}) }
}

// WithTLS makes the server require TLS with certs' server certificate, and
// a client certificate signed by certs' CA when certs.VerifyClients is set.
// Create certs with [NewCerts].
func WithTLS(certs Certs) Option {
	return func(c *config) { c.certs = &certs }
}

// WithConfigFile starts the server from a nats-server configuration file
// (accounts, users and their permissions, included files), as the server
// binary would read it; listen address, JetStream store and logging are
// still the test's. It replaces the other options' authentication.
func WithConfigFile(path string) Option {
	return func(c *config) { c.conf = path }
}

// Server is an embedded nats-server with JetStream, owned by one test. Its
// methods may be called from any goroutine.
type Server struct {
	t    testing.TB
	cfg  config
	dir  string // JetStream store, kept across Restart
	port int    // chosen at Start, kept across Restart

	mu  sync.Mutex
	srv *server.Server // nil while shut down
}

// Start runs a server for the test t on 127.0.0.1 with a random port and
// JetStream in t.TempDir(); t.Cleanup shuts it down. It fails the test if
// the server does not come up.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	s := &Server{t: t, dir: t.TempDir(), port: -1}
	for _, o := range opts {
		o(&s.cfg)
	}
	s.start()
	t.Cleanup(s.Shutdown)
	return s
}

// options builds a fresh server.Options each time: nats-server keeps and
// mutates the struct it is given.
func (s *Server) options() *server.Options {
	if s.cfg.conf != "" {
		o, err := server.ProcessConfigFile(s.cfg.conf)
		if err != nil {
			s.t.Fatalf("natstest: %v", err)
		}
		o.ServerName, o.Host, o.Port, o.NoLog, o.NoSigs = "natstest", "127.0.0.1", s.port, true, true
		o.JetStream, o.StoreDir, o.JetStreamMaxMemory, o.JetStreamMaxStore = true, s.dir, 64<<20, 256<<20
		return o
	}
	o := &server.Options{
		ServerName:         "natstest",
		Host:               "127.0.0.1",
		Port:               s.port,
		NoLog:              true,
		NoSigs:             true,
		JetStream:          true,
		StoreDir:           s.dir,
		JetStreamMaxMemory: 64 << 20,
		JetStreamMaxStore:  256 << 20,
		Users:              s.cfg.users,
		Nkeys:              s.cfg.nkeys,
		Authorization:      s.cfg.token,
	}
	if c := s.cfg.certs; c != nil {
		tc, err := c.serverConfig()
		if err != nil {
			s.t.Fatalf("natstest: TLS: %v", err)
		}
		o.TLS, o.TLSConfig, o.TLSVerify, o.TLSTimeout = true, tc, c.VerifyClients, 2
	}
	return o
}

func (s *Server) start() {
	s.t.Helper()
	srv, err := server.NewServer(s.options())
	if err != nil {
		s.t.Fatalf("natstest: new server: %v", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(readyWait) {
		srv.Shutdown()
		srv.WaitForShutdown()
		s.t.Fatalf("natstest: server on port %d not ready within %v", s.port, readyWait)
	}
	s.mu.Lock()
	s.srv = srv
	s.port = srv.Addr().(*net.TCPAddr).Port
	s.mu.Unlock()
}

// URL is the client URL, nats://127.0.0.1:<port>. It stays the same across
// [Server.Restart]. (With [WithTLS] clients upgrade to TLS on this URL.)
func (s *Server) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("nats://127.0.0.1:%d", s.port)
}

// Shutdown stops the server and waits for it to be gone; clients see the
// connection drop and start reconnecting. It does nothing if the server is
// already down.
func (s *Server) Shutdown() {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv == nil {
		return
	}
	srv.Shutdown()
	srv.WaitForShutdown()
}

// Restart shuts the server down (if it is up) and starts it again on the
// same port with the same JetStream store, so clients reconnect and every
// stream and KV bucket survives.
func (s *Server) Restart() {
	s.t.Helper()
	s.Shutdown()
	s.start()
}

// Running reports whether the server is up.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv != nil
}

// Environment variable read by [Shared].
const EnvURL = "MERIDIAN_NATS_URL"

// DefaultSharedURL is where [Shared] looks for the machine's NATS server
// (nats-server -js on the default port) when MERIDIAN_NATS_URL is unset.
const DefaultSharedURL = "nats://127.0.0.1:4222"

// Shared returns the URL of the machine's shared NATS server after checking
// that it accepts TCP connections. When it does not, the test fails in CI
// and is skipped loudly elsewhere (see testenv.MustOrSkip). Tests using it
// must namespace everything they create (see [UniqueName]) and delete it.
func Shared(t testing.TB) string {
	t.Helper()
	u := os.Getenv(EnvURL)
	if u == "" {
		u = DefaultSharedURL
	}
	pu, err := url.Parse(u)
	if err == nil && pu.Host == "" {
		err = fmt.Errorf("no host in %q", u)
	}
	if err == nil {
		var c net.Conn
		c, err = net.DialTimeout("tcp", pu.Host, 2*time.Second)
		if err == nil {
			c.Close()
		}
	}
	testenv.MustOrSkip(t, err, "NATS not reachable at "+u)
	return u
}

// UniqueName returns prefix followed by 12 random hex digits: a bucket,
// stream or cluster name no other test run uses ([A-Za-z0-9_-] only when
// prefix is).
func UniqueName(prefix string) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return prefix + hex.EncodeToString(b[:])
}

// running returns the running server, or fails the test (what names the
// caller) and returns nil.
func (s *Server) running(what string) *server.Server {
	s.t.Helper()
	s.mu.Lock()
	srv := s.srv
	s.mu.Unlock()
	if srv == nil {
		s.t.Fatalf("natstest: %s: the server is down", what)
	}
	return srv
}

// JetStreamAPI returns the server's own count of JetStream API requests
// since it started (the "api.total" of its /jsz monitoring endpoint) and
// of those that got an error response. A server that is down reports the
// test's failure.
func (s *Server) JetStreamAPI() (total, errs uint64) {
	s.t.Helper()
	srv := s.running("JetStreamAPI")
	if srv == nil {
		return 0, 0
	}
	info, err := srv.Jsz(&server.JSzOptions{})
	if err != nil {
		s.t.Fatalf("natstest: jsz: %v", err)
		return 0, 0
	}
	return info.API.Total, info.API.Errors
}

// Traffic returns the server's own counts since it started of the bytes
// and messages clients published to it (in: reports, acks, KV puts, API
// requests) and it delivered to clients (out: subscriptions, watches, KV
// reads, API and publish-ack replies) — its /varz in_bytes, out_bytes,
// in_msgs and out_msgs. A server that is down reports the test's failure.
func (s *Server) Traffic() (inBytes, outBytes, inMsgs, outMsgs int64) {
	s.t.Helper()
	srv := s.running("Traffic")
	if srv == nil {
		return 0, 0, 0, 0
	}
	v, err := srv.Varz(nil)
	if err != nil {
		s.t.Fatalf("natstest: varz: %v", err)
		return 0, 0, 0, 0
	}
	return v.InBytes, v.OutBytes, v.InMsgs, v.OutMsgs
}
