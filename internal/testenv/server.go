package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// startTimeout bounds the wait for a started redis-server to answer PING.
	startTimeout = 10 * time.Second
	// clusterTimeout bounds `redis-cli --cluster create`, and separately the
	// wait for every node to report a healthy cluster.
	clusterTimeout = 30 * time.Second
	// stopTimeout bounds SHUTDOWN NOSAVE and the wait for the process to exit
	// before it is killed.
	stopTimeout = 5 * time.Second
	// pollInterval is the pause between two readiness checks.
	pollInterval = 20 * time.Millisecond
	// probeTimeout bounds one readiness check.
	probeTimeout = 500 * time.Millisecond
	// startAttempts is how often a server is started on a fresh port when the
	// previous one exited before it was ready (typically: port taken between
	// choosing it and binding it).
	startAttempts = 5
	// clusterBusOffset is the distance from a node's port to its cluster bus port.
	clusterBusOffset = 10000
	// maxClusterPort keeps port+clusterBusOffset a valid port.
	maxClusterPort = 55000
	// clusterSlots is the number of hash slots of a Redis Cluster.
	clusterSlots = 16384
)

// Server is a private redis-server process started by [StartRedis] for one
// test. It keeps nothing on disk and is shut down when the test ends.
type Server struct {
	// Addr is the server's address, "127.0.0.1:PORT".
	Addr string
	// Port is the TCP port the server listens on.
	Port int

	client *redis.Client
	proc   *process
	paused atomic.Bool
}

// Pause stops the server process (SIGSTOP): it keeps its connections but
// answers nothing, as a hung Redis does, until Resume. The test's cleanup
// resumes a paused server before shutting it down.
func (s *Server) Pause() error {
	if s.proc == nil {
		return errors.New("testenv: Pause: not a process this package started")
	}
	s.paused.Store(true)
	return s.proc.cmd.Process.Signal(syscall.SIGSTOP)
}

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() error {
	if s.proc == nil {
		return errors.New("testenv: Resume: not a process this package started")
	}
	s.paused.Store(false)
	return s.proc.cmd.Process.Signal(syscall.SIGCONT)
}

// Client returns a client of the server. Every call returns the same client,
// safe for concurrent use; it is closed when the test ends.
func (s *Server) Client() *redis.Client { return s.client }

// StartRedis starts a redis-server (found on PATH) on a free loopback port
// with persistence off and a fresh t.TempDir as its directory, plus args
// (e.g. "--maxmemory", "10mb"), and returns once it answers PING. When the
// test ends the server is sent SHUTDOWN NOSAVE, killed if it has not exited
// within 5 s, and waited for. A missing redis-server binary fails the test in
// CI and skips it elsewhere; a server that does not come up fails the test.
func StartRedis(t testing.TB, args ...string) *Server {
	t.Helper()
	return StartRedisWith(t, RedisOptions{Args: args})
}

// RedisOptions configure a server started by [StartRedisWith].
type RedisOptions struct {
	// Password is the default user's password (requirepass); the server
	// then refuses every command before AUTH. Add ACL users through
	// [Server.Client], which authenticates with it.
	Password string
	// TLS, when set, makes the server speak TLS only (--port 0, the port
	// is its --tls-port) with the PKI's server certificate, trusting the
	// PKI's CA for client certificates.
	TLS *PKI
	// ClientAuth, with TLS, requires a client certificate the PKI's CA
	// signed (tls-auth-clients yes); without it, none is asked for.
	ClientAuth bool
	// Args are further redis-server arguments.
	Args []string
}

// StartRedisWith is [StartRedis] with a password and/or TLS. The readiness
// check, [Server.Client] and the shutdown all connect as a client that
// knows the password and, with TLS, trusts the PKI's CA and presents its
// client certificate.
func StartRedisWith(t testing.TB, o RedisOptions) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	MustOrSkip(t, err, "redis-server not found")
	sp := spec{bin: bin, opts: redis.Options{Password: o.Password}, extra: func(port int) []string {
		var args []string
		if o.Password != "" {
			args = append(args, "--requirepass", o.Password)
		}
		if o.TLS != nil {
			auth := "no"
			if o.ClientAuth {
				auth = "yes"
			}
			args = append(args, "--port", "0", "--tls-port", strconv.Itoa(port),
				"--tls-cert-file", o.TLS.ServerCertFile, "--tls-key-file", o.TLS.ServerKeyFile,
				"--tls-ca-cert-file", o.TLS.CAFile, "--tls-auth-clients", auth)
		}
		return append(args, o.Args...)
	}}
	if o.TLS != nil {
		sp.opts.TLSConfig = o.TLS.ClientTLS()
	}
	return startServer(t, sp)
}

// Cluster is a Redis Cluster of private redis-server processes started by
// [StartCluster] for one test, every node a master, no replicas.
type Cluster struct {
	// Addrs lists the nodes' addresses, "127.0.0.1:PORT".
	Addrs []string

	client *redis.ClusterClient
}

// Client returns a cluster client seeded with every node. Every call returns
// the same client, safe for concurrent use; it is closed when the test ends.
func (c *Cluster) Client() *redis.ClusterClient { return c.client }

// StartCluster starts n ≥ 3 cluster-enabled redis-server processes on free
// loopback ports (each port ≤ 55000 with its cluster bus port, port+10000,
// free too), joins them with `redis-cli --cluster create … --cluster-replicas
// 0`, and returns once every node reports cluster_state:ok, all 16384 slots
// assigned and all n nodes known (deadline 30 s). The nodes are stopped as in
// [StartRedis] when the test ends. Missing redis-server or redis-cli binaries
// fail the test in CI and skip it elsewhere. Forming a cluster takes a few
// seconds.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	if n < 3 {
		t.Fatalf("testenv: StartCluster needs at least 3 nodes, got %d", n)
	}
	server, err := exec.LookPath("redis-server")
	MustOrSkip(t, err, "redis-server not found")
	cli, err := exec.LookPath("redis-cli")
	MustOrSkip(t, err, "redis-cli not found")

	confDir := t.TempDir()
	nodes := make([]*Server, n)
	addrs := make([]string, n)
	for i := range nodes {
		nodes[i] = startServer(t, spec{bin: server, needBus: true, extra: func(port int) []string {
			return []string{
				"--cluster-enabled", "yes",
				"--cluster-config-file", filepath.Join(confDir, fmt.Sprintf("nodes-%d.conf", port)),
				"--cluster-node-timeout", "2000",
			}
		}})
		addrs[i] = nodes[i].Addr
	}

	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("testenv: redis-cli --cluster create: %v\n%s", err, out)
	}

	err = poll(clusterTimeout, nil, func(ctx context.Context) error {
		for _, node := range nodes {
			info, err := node.client.ClusterInfo(ctx).Result()
			if err != nil {
				return fmt.Errorf("%s: cluster info: %w", node.Addr, err)
			}
			if err := clusterHealthy(info, n); err != nil {
				return fmt.Errorf("%s: %w", node.Addr, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("testenv: cluster %v did not become healthy: %v", addrs, err)
	}

	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = cc.Close() })
	return &Cluster{Addrs: addrs, client: cc}
}

// clusterHealthy checks a CLUSTER INFO reply: state ok, every slot assigned,
// n nodes known.
func clusterHealthy(info string, n int) error {
	fields := make(map[string]string)
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	want := []struct{ key, value string }{
		{"cluster_state", "ok"},
		{"cluster_slots_assigned", strconv.Itoa(clusterSlots)},
		{"cluster_known_nodes", strconv.Itoa(n)},
	}
	for _, w := range want {
		if got := fields[w.key]; got != w.value {
			return fmt.Errorf("%s is %q, want %q", w.key, got, w.value)
		}
	}
	return nil
}

// errExited reports a server process that exited before it was ready.
var errExited = errors.New("redis-server exited before it was ready")

// spec is how to start one server.
type spec struct {
	bin string
	// pre are the arguments before the common ones (a Sentinel's
	// configuration file must come first).
	pre []string
	// extra are the arguments after them, given the port.
	extra func(port int) []string
	// needBus asks for a port whose cluster bus port is free too.
	needBus bool
	// opts is the connection the readiness check, Server.Client and the
	// shutdown use (password, TLS); Addr is filled in.
	opts redis.Options
}

// startServer starts sp.bin as a redis-server with the common arguments and
// sp's, retrying on a fresh port when the process exits before it is ready,
// and registers its shutdown.
func startServer(t testing.TB, sp spec) *Server {
	t.Helper()
	var err error
	for range startAttempts {
		var port int
		port, err = freePort(sp.needBus)
		if err != nil {
			break
		}
		var s *Server
		s, err = tryStart(t, sp, port)
		if err == nil {
			return s
		}
		if !errors.Is(err, errExited) {
			break
		}
	}
	t.Fatalf("testenv: start redis-server: %v", err)
	return nil
}

// tryStart starts one redis-server on port and waits for it to answer PING.
// On failure it leaves no process behind.
func tryStart(t testing.TB, sp spec, port int) (*Server, error) {
	dir := t.TempDir()
	logPath := filepath.Join(dir, "redis-server.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	args := append(slices.Clone(sp.pre),
		"--save", "",
		"--appendonly", "no",
		"--bind", "127.0.0.1",
		"--port", strconv.Itoa(port),
		"--dir", dir,
	)
	if sp.extra != nil {
		args = append(args, sp.extra(port)...)
	}
	cmd := exec.Command(sp.bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	setDeathSignal(cmd)
	err = cmd.Start()
	_ = logFile.Close() // the child holds its own descriptor
	if err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go p.wait()

	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	opts := sp.opts
	opts.Addr = addr
	c := redis.NewClient(&opts)
	err = poll(startTimeout, p.done, func(ctx context.Context) error { return c.Ping(ctx).Err() })
	if err != nil {
		_ = c.Close()
		p.kill()
		return nil, fmt.Errorf("%s: %w\n--- %s ---\n%s", addr, err, logPath, tail(logPath, 2048))
	}
	srv := &Server{Addr: addr, Port: port, client: c, proc: p}
	t.Cleanup(func() {
		if srv.paused.Load() {
			_ = srv.Resume()
		}
		_ = c.Close()
		p.shutdown(opts)
	})
	return srv, nil
}

// process is a started redis-server and the outcome of waiting for it.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and been reaped
	err  error         // the exit status; read only after done is closed
}

func (p *process) wait() {
	p.err = p.cmd.Wait()
	close(p.done)
}

// kill kills the process and waits for it.
func (p *process) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// shutdown asks the server at opts.Addr to exit without saving, kills it if
// it has not exited within stopTimeout, and waits for it.
func (p *process) shutdown(opts redis.Options) {
	opts.MaxRetries = -1
	c := redis.NewClient(&opts)
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	_ = c.ShutdownNoSave(ctx).Err() // the server drops the connection: an error is expected
	_ = c.Close()
	select {
	case <-p.done:
	case <-ctx.Done():
		p.kill()
	}
}

// poll calls check every pollInterval until it returns nil, timeout passes,
// or exited is closed (a nil exited is never closed). Each check gets a
// context bounded by probeTimeout.
func poll(timeout time.Duration, exited <-chan struct{}, check func(context.Context) error) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		err := check(ctx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %w", timeout, err)
		}
		select {
		case <-exited:
			return errExited
		case <-tick.C:
		}
	}
}

// freePort returns a loopback TCP port that was free a moment ago. With
// needBus the port is at most maxClusterPort and port+clusterBusOffset was
// free too. The caller must cope with losing the port to another process
// before binding it.
func freePort(needBus bool) (int, error) {
	var err error
	for range 100 {
		var port int
		port, err = listenFree(0)
		if err != nil {
			continue
		}
		if !needBus {
			return port, nil
		}
		if port > maxClusterPort {
			continue
		}
		if _, err = listenFree(port + clusterBusOffset); err == nil {
			return port, nil
		}
	}
	if err == nil {
		err = errors.New("every port offered was above the cluster limit")
	}
	return 0, fmt.Errorf("no free loopback port: %w", err)
}

// listenFree listens on 127.0.0.1:port (0: any), closes the listener and
// returns the port it had.
func listenFree(port int) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// tail returns at most the last n bytes of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
