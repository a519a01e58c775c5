package gossip

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meridian-quota/meridian/gossip/protocol"
	"github.com/meridian-quota/meridian/internal/natstest"
	"github.com/meridian-quota/meridian/internal/testenv"
)

// The transport's tests run against a real nats-server embedded in the test
// process (internal/natstest), and one against the machine's own server.
// Waits poll with a deadline; none asserts a duration.

// natsDeadline bounds every wait of these tests; on loopback everything
// happens within a second or two, failover included.
const natsDeadline = 15 * time.Second

// natsTestConfig is the default configuration aimed at url, reconnecting
// fast so that restarts heal quickly.
func natsTestConfig(url string) NATSConfig {
	cfg := DefaultNATSConfig()
	cfg.URLs = []string{url}
	cfg.ReconnectWait = 20 * time.Millisecond
	cfg.MaxReconnectWait = 200 * time.Millisecond
	return cfg
}

// natsLogger logs to the test's log and to buf (when not nil). nats.go
// calls its connection handlers on a goroutine of its own, possibly after
// the test ended; lines logged then are dropped.
func natsLogger(t testing.TB, buf *testenv.Buffer) *slog.Logger {
	tw := &testWriter{t: t}
	t.Cleanup(func() {
		tw.mu.Lock()
		tw.done = true
		tw.mu.Unlock()
	})
	var w interface{ Write([]byte) (int, error) } = tw
	if buf != nil {
		w = multiWriter{tw, buf}
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct {
	t    testing.TB
	mu   sync.Mutex
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

type multiWriter []interface{ Write([]byte) (int, error) }

func (m multiWriter) Write(p []byte) (int, error) {
	for _, w := range m {
		_, _ = w.Write(p)
	}
	return len(p), nil
}

// dialT dials cluster on cfg, closing the transport when the test ends.
func dialT(t testing.TB, cluster string, cfg NATSConfig) *Transport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), natsDeadline)
	defer cancel()
	tr, err := Dial(ctx, cluster, cfg, natsLogger(t, nil))
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(tr.Close)
	return tr
}

// recv returns the next value from ch or fails the test after natsDeadline.
func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(natsDeadline):
		t.Fatalf("%s: nothing within %v", what, natsDeadline)
		panic("unreachable")
	}
}

// checkErrs fails the test unless err contains every string of want, or,
// with no want, unless err is nil; what names the call.
func checkErrs(t testing.TB, what string, err error, want []string) {
	t.Helper()
	if len(want) == 0 {
		if err != nil {
			t.Fatalf("%s = %v, want nil", what, err)
		}
		return
	}
	if err == nil {
		t.Fatalf("%s = nil, want %q", what, want)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s = %v\nwant it to contain %q", what, err, w)
		}
	}
}

func bg(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), natsDeadline)
	t.Cleanup(cancel)
	return ctx
}

func TestNATSConfigValidate(t *testing.T) {
	tests := []struct {
		name  string
		give  func(c *NATSConfig)
		want  []string // substrings of the error, all of them; none: valid
		never string   // a secret that must not appear
	}{
		{name: "default", give: func(*NATSConfig) {}},
		{name: "user and password file", give: func(c *NATSConfig) { c.User, c.PasswordFile = "u", "/run/secrets/p" }},
		{name: "token env", give: func(c *NATSConfig) { c.TokenEnv = "NATS_TOKEN" }},
		{name: "mTLS", give: func(c *NATSConfig) { c.TLS = NATSTLS{CAFile: "ca", CertFile: "c", KeyFile: "k"} }},
		{
			name: "every problem at once",
			give: func(c *NATSConfig) {
				c.URLs = []string{"nats://127.0.0.1:4222", "http://x:1", "nats://:4222"}
				c.ReconnectWait = 0
				c.MaxReconnectWait = -1
				c.PingInterval = time.Millisecond
				c.ReconnectBufSize = -2
				c.Bucket = "a.b"
				c.Replicas = 7
				c.PlacementCluster = "eu west"
			},
			want: []string{
				`nats.urls[1]: scheme "http"`, "nats.urls[2]: no host",
				"nats.reconnect_wait: 0s: must be positive", "nats.max_reconnect_wait",
				"nats.ping_interval", "nats.reconnect_buf_size", `nats.bucket: "a.b"`,
				"nats.replicas: 7", "nats.placement_cluster",
			},
		},
		{name: "no URL", give: func(c *NATSConfig) { c.URLs = nil }, want: []string{"nats.urls: empty"}},
		{
			name:  "credentials in a URL",
			give:  func(c *NATSConfig) { c.URLs = []string{"nats://meridian:hunter2@nats:4222"} },
			want:  []string{"nats.urls[0]: credentials in the URL"},
			never: "hunter2",
		},
		{
			name:  "unparsable URL with a password",
			give:  func(c *NATSConfig) { c.URLs = []string{"nats://u:hunter2@[::1"} },
			want:  []string{"nats.urls[0]: not a URL"},
			never: "hunter2",
		},
		{
			name: "two auth methods",
			give: func(c *NATSConfig) { c.CredsFile, c.TokenFile = "a.creds", "tok" },
			want: []string{"nats.auth: creds_file, token are set: at most one"},
		},
		{
			name: "three auth methods",
			give: func(c *NATSConfig) { c.NKeySeedFile, c.User, c.PasswordEnv, c.TokenEnv = "seed", "u", "P", "T" },
			want: []string{"nats.auth: nkey_seed_file, user, token are set"},
		},
		{name: "password without user", give: func(c *NATSConfig) { c.PasswordEnv = "P" }, want: []string{"nats.user: empty while password_file or password_env"}},
		{name: "user without password", give: func(c *NATSConfig) { c.User = "u" }, want: []string{"nats.user: no password_file or password_env"}},
		{name: "two password sources", give: func(c *NATSConfig) { c.User, c.PasswordFile, c.PasswordEnv = "u", "f", "E" }, want: []string{"nats.password_file: set together with password_env"}},
		{name: "two token sources", give: func(c *NATSConfig) { c.TokenFile, c.TokenEnv = "f", "E" }, want: []string{"nats.token_file: set together with token_env"}},
		{name: "cert without key", give: func(c *NATSConfig) { c.TLS.CertFile = "c" }, want: []string{"nats.tls: cert_file and key_file go together"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultNATSConfig()
			tt.give(&c)
			err := c.Validate()
			checkErrs(t, "Validate()", err, tt.want)
			if err != nil && tt.never != "" && strings.Contains(err.Error(), tt.never) {
				t.Errorf("Validate leaks a secret: %v", err)
			}
		})
	}
}

func TestNames(t *testing.T) {
	for _, good := range []string{"eu", "eu-west-1", "agent_7", strings.Repeat("a", 64)} {
		if err := checkName(good); err != nil {
			t.Errorf("checkName(%q): %v", good, err)
		}
	}
	for _, bad := range []string{"", "eu.west", "eu*", "eu>", "eu west", "eu\t", "é", strings.Repeat("a", 65)} {
		if err := checkName(bad); err == nil {
			t.Errorf("checkName(%q): nil, want an error", bad)
		}
	}

	srv := natstest.Start(t)
	if _, err := Dial(bg(t), "a.b", natsTestConfig(srv.URL()), nil); err == nil || !strings.Contains(err.Error(), "cluster") {
		t.Errorf("Dial with cluster a.b: %v, want a cluster error", err)
	}
	tr := dialT(t, "c1", natsTestConfig(srv.URL()))
	if err := tr.PublishReport("eu.west", "a1", [][]byte{{1}}); err == nil {
		t.Error("PublishReport with region eu.west: nil error")
	}
	if err := tr.PublishAck("eu", "a>", []byte{1}); err == nil {
		t.Error("PublishAck with agent a>: nil error")
	}
}

func TestServerVersion(t *testing.T) {
	tests := []struct {
		give string
		want bool
	}{
		{"2.9.0", true}, {"2.9.10", true}, {"2.10.1", true}, {"2.15.2", true}, {"3.0.0", true},
		{"2.11.0-beta.1", true}, {"2.8.4", false}, {"1.4.1", false}, {"", false}, {"garbage", false},
	}
	for _, tt := range tests {
		if got := versionAtLeast(tt.give, 2, 9); got != tt.want {
			t.Errorf("versionAtLeast(%q, 2, 9) = %v, want %v", tt.give, got, tt.want)
		}
	}
}

// collect subscribes with subscribe (a Transport's SubscribeReports or
// SubscribeAcks) and returns the messages delivered and the subscription's
// stop, which also runs when the test ends. Every message must name its
// sender (the subject's region and agent).
func collect(t testing.TB, subscribe func(func(protocol.Sender, []byte)) (func(), error)) (<-chan []byte, func()) {
	t.Helper()
	ch := make(chan []byte, 64)
	stop, err := subscribe(func(from protocol.Sender, b []byte) {
		if from.Region == "" || from.Agent == "" {
			t.Errorf("message %q names no sender (%+v)", b, from)
		}
		ch <- b
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return ch, stop
}

func TestReportsAndAcksRoundTrip(t *testing.T) {
	srv := natstest.Start(t)
	agent := dialT(t, "c1", natsTestConfig(srv.URL()))
	coord := dialT(t, "c1", natsTestConfig(srv.URL()))

	reports, stopR := collect(t, coord.SubscribeReports)
	acks, _ := collect(t, coord.SubscribeAcks)

	chunks := [][]byte{[]byte("report-0"), []byte("report-1"), []byte("report-2")}
	if err := agent.PublishReport("eu", "eu-1", chunks); err != nil {
		t.Fatal(err)
	}
	if err := agent.PublishAck("us", "us-1", []byte("ack-7")); err != nil {
		t.Fatal(err)
	}
	for _, want := range chunks {
		if got := recv(t, reports, "report"); !bytes.Equal(got, want) {
			t.Fatalf("report: got %q, want %q (in order)", got, want)
		}
	}
	if got := recv(t, acks, "ack"); string(got) != "ack-7" {
		t.Fatalf("ack: got %q", got)
	}

	// The subjects are the documented ones.
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync("meridian.c1.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := agent.PublishReport("eu", "eu-2", [][]byte{[]byte("r")}); err != nil {
		t.Fatal(err)
	}
	if err := agent.PublishAck("eu", "eu-2", []byte("a")); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"meridian.c1.report.eu.eu-2", "meridian.c1.ack.eu.eu-2"} {
		m, err := sub.NextMsg(natsDeadline)
		if err != nil {
			t.Fatal(err)
		}
		if m.Subject != want {
			t.Errorf("subject %q, want %q", m.Subject, want)
		}
	}
	// The coordinator's callbacks saw those too, and stop ends delivery.
	recv(t, reports, "report eu-2")
	recv(t, acks, "ack eu-2")
	stopR()
	stopR() // idempotent
}

func TestClustersIsolated(t *testing.T) {
	srv := natstest.Start(t)
	a := dialT(t, "blue", natsTestConfig(srv.URL()))
	b := dialT(t, "green", natsTestConfig(srv.URL()))

	reports, _ := collect(t, b.SubscribeReports)
	if err := a.PublishReport("eu", "eu-1", [][]byte{[]byte("blue")}); err != nil {
		t.Fatal(err)
	}
	if err := b.PublishReport("eu", "eu-1", [][]byte{[]byte("green")}); err != nil {
		t.Fatal(err)
	}
	// Both went through the same server in this order: had blue's reached
	// green's subscriber, it would have come first.
	if got := recv(t, reports, "report"); string(got) != "green" {
		t.Fatalf("green's subscriber got %q first", got)
	}

	ctx := bg(t)
	if _, err := a.StoreTable(ctx, 0, 1, 1, [][]byte{[]byte("blue head")}); err != nil {
		t.Fatal(err)
	}
	if _, _, ok, err := b.LatestTable(ctx); err != nil || ok {
		t.Fatalf("green's LatestTable after blue stored one: ok=%v err=%v, want none", ok, err)
	}
	// Green's first table needs prev 0: blue's head is not its head.
	if _, err := b.StoreTable(ctx, 0, 1, 1, [][]byte{[]byte("green head")}); err != nil {
		t.Fatalf("green's first StoreTable: %v", err)
	}
}

func TestStoreTableFenced(t *testing.T) {
	srv := natstest.Start(t)
	first := dialT(t, "c1", natsTestConfig(srv.URL()))
	second := dialT(t, "c1", natsTestConfig(srv.URL()))
	ctx := bg(t)

	if _, _, ok, err := first.LatestTable(ctx); err != nil || ok {
		t.Fatalf("LatestTable on an empty bucket: ok=%v err=%v", ok, err)
	}
	rev1, err := first.StoreTable(ctx, 0, 1, 1, [][]byte{[]byte("first")})
	if err != nil {
		t.Fatal(err)
	}
	// A second writer that also believed there was no table.
	if _, err := second.StoreTable(ctx, 0, 1, 1, [][]byte{[]byte("second")}); !errors.Is(err, ErrFenced) {
		t.Fatalf("StoreTable on prev 0 over an existing head: %v, want ErrFenced", err)
	}
	rev2, err := first.StoreTable(ctx, rev1, 1, 2, [][]byte{[]byte("first again")})
	if err != nil {
		t.Fatal(err)
	}
	// A writer on the stale revision rev1, with chunks: fenced, and its
	// chunks never become part of a visible table.
	_, err = second.StoreTable(ctx, rev1, 2, 1, [][]byte{[]byte("second"), []byte("second chunk")})
	if !errors.Is(err, ErrFenced) {
		t.Fatalf("StoreTable on stale prev: %v, want ErrFenced", err)
	}
	head, rev, ok, err := second.LatestTable(ctx)
	if err != nil || !ok || string(head) != "first again" || rev != rev2 {
		t.Fatalf("LatestTable after the fenced write = %q rev %d ok=%v err=%v, want %q rev %d", head, rev, ok, err, "first again", rev2)
	}
	if rev2 <= rev1 {
		t.Fatalf("revisions %d then %d: not increasing", rev1, rev2)
	}
}

func TestStoreTableChunks(t *testing.T) {
	srv := natstest.Start(t)
	w := dialT(t, "c1", natsTestConfig(srv.URL()))
	r := dialT(t, "c1", natsTestConfig(srv.URL()))
	ctx := bg(t)

	table := func(term, epoch uint64) [][]byte {
		return [][]byte{
			fmt.Appendf(nil, "head %d.%d", term, epoch),
			fmt.Appendf(nil, "chunk 1 of %d.%d", term, epoch),
			fmt.Appendf(nil, "chunk 2 of %d.%d", term, epoch),
		}
	}
	var rev uint64
	ids := []tableID{{1, 1}, {1, 2}, {2, 1}, {2, 2}}
	for i, id := range ids {
		want := table(id.term, id.epoch)
		var err error
		if rev, err = w.StoreTable(ctx, rev, id.term, id.epoch, want); err != nil {
			t.Fatal(err)
		}
		head, hrev, ok, err := r.LatestTable(ctx)
		if err != nil || !ok || hrev != rev || !bytes.Equal(head, want[0]) {
			t.Fatalf("LatestTable = %q rev %d ok=%v err=%v, want %q rev %d", head, hrev, ok, err, want[0], rev)
		}
		got, err := r.FetchChunks(ctx, id.term, id.epoch, len(want))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.EqualFunc(got, want[1:], bytes.Equal) {
			t.Fatalf("FetchChunks = %q, want %q", got, want[1:])
		}
		if i > 0 {
			// The table just replaced keeps its chunks (a reader may be
			// fetching it).
			prev := ids[i-1]
			if _, err := r.FetchChunks(ctx, prev.term, prev.epoch, 3); err != nil {
				t.Fatalf("previous table %v purged too early: %v", prev, err)
			}
		}
		if i > 1 {
			old := ids[i-2]
			if _, err := r.FetchChunks(ctx, old.term, old.epoch, 3); err == nil {
				t.Fatalf("table %v, older than the previous one, still has its chunks", old)
			}
		}
	}
	if got, err := r.FetchChunks(ctx, 9, 9, 1); err != nil || len(got) != 0 {
		t.Fatalf("FetchChunks of a one-chunk table = %q, %v; want none", got, err)
	}
	for _, n := range []int{0, -1, maxChunks + 1} {
		if _, err := r.FetchChunks(ctx, 2, 2, n); err == nil {
			t.Errorf("FetchChunks count %d: nil error", n)
		}
	}
	if _, err := w.StoreTable(ctx, rev, 3, 1, nil); err == nil {
		t.Error("StoreTable with no chunks: nil error")
	}
}

type watched struct {
	head string
	rev  uint64
}

func TestWatchTables(t *testing.T) {
	srv := natstest.Start(t)
	w := dialT(t, "c1", natsTestConfig(srv.URL()))
	r := dialT(t, "c1", natsTestConfig(srv.URL()))
	ctx := bg(t)

	rev, err := w.StoreTable(ctx, 0, 1, 1, [][]byte{[]byte("h1")})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan watched, 16)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- r.WatchTables(wctx, func(head []byte, rev uint64) { got <- watched{string(head), rev} })
	}()
	defer func() {
		stop()
		if err := recv(t, done, "WatchTables return"); err != nil {
			t.Errorf("WatchTables: %v", err)
		}
	}()

	var seen []watched
	expect := func(head string) {
		t.Helper()
		v := recv(t, got, head)
		seen = append(seen, v)
		if v.head != head {
			t.Fatalf("watch delivered %q, want %q (so far %v)", v.head, head, seen)
		}
	}
	expect("h1") // the current head at start
	for _, h := range []string{"h2", "h3"} {
		if rev, err = w.StoreTable(ctx, rev, 1, uint64(len(seen)+1), [][]byte{[]byte(h)}); err != nil {
			t.Fatal(err)
		}
		expect(h)
	}

	// The server restarts (same store): the watch resumes and delivers
	// neither h3 again nor anything older.
	srv.Restart()
	eventually(t, natsDeadline, "h4 stored after the restart", func() error {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		nrev, err := w.StoreTable(sctx, rev, 1, 4, [][]byte{[]byte("h4")})
		if errors.Is(err, ErrFenced) {
			t.Fatalf("StoreTable after restart: %v", err)
		}
		if err == nil {
			rev = nrev
		}
		return err
	})
	expect("h4")
	if rev, err = w.StoreTable(ctx, rev, 1, 5, [][]byte{[]byte("h5")}); err != nil {
		t.Fatal(err)
	}
	expect("h5")
	select {
	case v := <-got:
		t.Fatalf("unexpected delivery %v after %v", v, seen)
	default:
	}
	for i := 1; i < len(seen); i++ {
		if seen[i].rev <= seen[i-1].rev {
			t.Fatalf("revisions not increasing: %v", seen)
		}
	}
}

func TestWatchTablesEmptyThenFirst(t *testing.T) {
	srv := natstest.Start(t)
	tr := dialT(t, "c1", natsTestConfig(srv.URL()))
	ctx, cancel := context.WithCancel(bg(t))
	got := make(chan watched, 4)
	done := make(chan error, 1)
	go func() {
		done <- tr.WatchTables(ctx, func(head []byte, rev uint64) { got <- watched{string(head), rev} })
	}()
	if _, err := tr.StoreTable(ctx, 0, 1, 1, [][]byte{[]byte("first")}); err != nil {
		t.Fatal(err)
	}
	if v := recv(t, got, "first head"); v.head != "first" {
		t.Fatalf("got %v", v)
	}
	// Close ends a running watch with ErrClosed.
	tr.Close()
	if err := recv(t, done, "WatchTables return"); !errors.Is(err, ErrClosed) {
		t.Fatalf("WatchTables after Close: %v, want ErrClosed", err)
	}
	cancel()
}

// TestKVNeverReplayed: what a coordinator stores while NATS is down fails
// at once and is not applied after the reconnect, while reports are
// buffered up to ReconnectBufSize.
func TestKVNeverReplayed(t *testing.T) {
	srv := natstest.Start(t)
	cfg := natsTestConfig(srv.URL())
	cfg.ReconnectBufSize = 4096
	tr := dialT(t, "c1", cfg)
	ctx := bg(t)
	rev, err := tr.StoreTable(ctx, 0, 1, 1, [][]byte{[]byte("h1")})
	if err != nil {
		t.Fatal(err)
	}

	srv.Shutdown()
	eventually(t, natsDeadline, "both connections down", func() error {
		if tr.kvc.IsConnected() || tr.pub.IsConnected() {
			return errors.New("still connected")
		}
		return nil
	})
	_, err = tr.StoreTable(ctx, rev, 1, 2, [][]byte{[]byte("h2"), []byte("h2 chunk")})
	if !errors.Is(err, nats.ErrReconnectBufExceeded) || errors.Is(err, ErrFenced) {
		t.Fatalf("StoreTable while disconnected: %v, want an immediate not-sent error", err)
	}
	if _, err := tr.FetchChunks(ctx, 1, 1, 2); err == nil {
		t.Fatal("FetchChunks while disconnected: nil error")
	}
	if err := tr.PublishReport("eu", "eu-1", [][]byte{make([]byte, 1000)}); err != nil {
		t.Fatalf("a small report while disconnected is buffered: %v", err)
	}
	// Once the buffer holds ReconnectBufSize bytes, publishing fails.
	var perr error
	for i := 0; i < 8 && perr == nil; i++ {
		perr = tr.PublishReport("eu", "eu-1", [][]byte{make([]byte, 1000)})
	}
	if !errors.Is(perr, nats.ErrReconnectBufExceeded) {
		t.Fatalf("reports past ReconnectBufSize: %v, want ErrReconnectBufExceeded", perr)
	}

	srv.Restart()
	eventually(t, natsDeadline, "reconnected with JetStream", func() error {
		head, hrev, ok, err := tr.LatestTable(ctx)
		if err != nil {
			return err
		}
		if !ok || string(head) != "h1" || hrev != rev {
			t.Fatalf("after reconnect the head is %q rev %d ok=%v, want h1 rev %d: a KV write was replayed", head, hrev, ok, rev)
		}
		return nil
	})
	if _, err := tr.FetchChunks(ctx, 1, 2, 2); err == nil {
		t.Fatal("the chunk put while disconnected was replayed")
	}
	if _, err := tr.StoreTable(ctx, rev, 1, 2, [][]byte{[]byte("h2")}); err != nil {
		t.Fatalf("StoreTable on the unchanged revision after reconnect: %v", err)
	}
}

func TestDialUnreachable(t *testing.T) {
	srv := natstest.Start(t)
	url := srv.URL()
	srv.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if tr, err := Dial(ctx, "c1", natsTestConfig(url), natsLogger(t, nil)); err == nil {
		tr.Close()
		t.Fatal("Dial to a stopped server: nil error")
	}

	// Dial waits for a server that comes up within its ctx.
	ctx, cancel = context.WithTimeout(context.Background(), natsDeadline)
	defer cancel()
	up := make(chan struct{})
	go func() {
		defer close(up)
		time.Sleep(100 * time.Millisecond) // let Dial's first attempt fail
		srv.Restart()
	}()
	tr, err := Dial(ctx, "c1", natsTestConfig(url), natsLogger(t, nil))
	<-up
	if err != nil {
		t.Fatalf("Dial while the server starts: %v", err)
	}
	tr.Close()
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestAuth(t *testing.T) {
	const (
		user     = "meridian"
		password = "pa55-w0rd-right"
		wrong    = "pa55-w0rd-wrong"
		token    = "t0ken-right"
	)
	seedFile, pub := newNKeySeedFile(t)
	users := natstest.Start(t, natstest.WithUsers(user, password), natstest.WithNKey(pub))
	tokens := natstest.Start(t, natstest.WithToken(token))
	certs := natstest.NewCerts(t)
	certs.VerifyClients = true
	tlsSrv := natstest.Start(t, natstest.WithTLS(certs))

	// mustDial dials with give applied to the config and checks the
	// outcome; logs and errors never contain a secret.
	mustDial := func(t *testing.T, url string, ok bool, give func(c *NATSConfig)) {
		t.Helper()
		var logs testenv.Buffer
		cfg := natsTestConfig(url)
		give(&cfg)
		// A refused client fails fast on an authorization error; on other
		// errors (a TLS handshake) it retries until the ctx ends.
		limit := natsDeadline
		if !ok {
			limit = time.Second
		}
		ctx, cancel := context.WithTimeout(context.Background(), limit)
		defer cancel()
		tr, err := Dial(ctx, "c1", cfg, natsLogger(t, &logs))
		if tr != nil {
			defer tr.Close()
		}
		for _, s := range []string{password, wrong, token} {
			if err != nil && strings.Contains(err.Error(), s) {
				t.Errorf("Dial error contains a secret: %v", err)
			}
			if strings.Contains(logs.String(), s) {
				t.Errorf("logs contain a secret: %s", logs.String())
			}
		}
		if ok != (err == nil) {
			t.Fatalf("Dial: %v, want success %v", err, ok)
		}
		if ok {
			// Authenticated clients reach JetStream, and publish.
			if _, err := tr.StoreTable(ctx, 0, 1, 1, [][]byte{[]byte("h")}); err != nil && !errors.Is(err, ErrFenced) {
				t.Fatalf("StoreTable: %v", err)
			}
			if err := tr.PublishReport("eu", "eu-1", [][]byte{[]byte("r")}); err != nil {
				t.Fatalf("PublishReport: %v", err)
			}
		}
	}

	t.Run("no credentials", func(t *testing.T) {
		mustDial(t, users.URL(), false, func(*NATSConfig) {})
	})
	t.Run("wrong password", func(t *testing.T) {
		f := writeFile(t, "pass", wrong+"\n")
		mustDial(t, users.URL(), false, func(c *NATSConfig) { c.User, c.PasswordFile = user, f })
	})
	t.Run("password file", func(t *testing.T) {
		f := writeFile(t, "pass", password+"\n")
		mustDial(t, users.URL(), true, func(c *NATSConfig) { c.User, c.PasswordFile = user, f })
	})
	t.Run("password env", func(t *testing.T) {
		t.Setenv("MERIDIAN_TEST_NATS_PASSWORD", password)
		mustDial(t, users.URL(), true, func(c *NATSConfig) { c.User, c.PasswordEnv = user, "MERIDIAN_TEST_NATS_PASSWORD" })
	})
	t.Run("nkey seed file", func(t *testing.T) {
		mustDial(t, users.URL(), true, func(c *NATSConfig) { c.NKeySeedFile = seedFile })
	})
	t.Run("token env", func(t *testing.T) {
		t.Setenv("MERIDIAN_TEST_NATS_TOKEN", token)
		mustDial(t, tokens.URL(), true, func(c *NATSConfig) { c.TokenEnv = "MERIDIAN_TEST_NATS_TOKEN" })
	})
	t.Run("wrong token file", func(t *testing.T) {
		f := writeFile(t, "tok", wrong)
		mustDial(t, tokens.URL(), false, func(c *NATSConfig) { c.TokenFile = f })
	})
	t.Run("unset token env", func(t *testing.T) {
		mustDial(t, tokens.URL(), false, func(c *NATSConfig) { c.TokenEnv = "MERIDIAN_TEST_NATS_TOKEN_UNSET" })
	})
	t.Run("mutual TLS", func(t *testing.T) {
		mustDial(t, tlsSrv.URL(), true, func(c *NATSConfig) {
			c.TLS = NATSTLS{CAFile: certs.CAFile, CertFile: certs.ClientCertFile, KeyFile: certs.ClientKeyFile}
		})
	})
	t.Run("TLS without the client certificate", func(t *testing.T) {
		mustDial(t, tlsSrv.URL(), false, func(c *NATSConfig) { c.TLS = NATSTLS{CAFile: certs.CAFile} })
	})
	t.Run("missing files", func(t *testing.T) {
		for _, give := range []func(c *NATSConfig){
			func(c *NATSConfig) { c.User, c.PasswordFile = user, "/nonexistent/pass" },
			func(c *NATSConfig) { c.NKeySeedFile = "/nonexistent/seed" },
			func(c *NATSConfig) { c.CredsFile = "/nonexistent/x.creds" },
			func(c *NATSConfig) { c.TLS.CAFile = "/nonexistent/ca.pem" },
		} {
			mustDial(t, users.URL(), false, give)
		}
	})
}

// TestSharedServer runs the transport and the election against the
// machine's own nats-server (2.9.10 here: the oldest version supported),
// in a bucket of its own, deleted afterwards.
func TestSharedServer(t *testing.T) {
	url := natstest.Shared(t)
	bucket := natstest.UniqueName("meridian_test_")
	cluster := natstest.UniqueName("t")
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("connect to %s: %v", url, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if js, err := jetstream.New(nc); err == nil {
			if err := js.DeleteKeyValue(ctx, bucket); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
				t.Errorf("delete bucket %s: %v", bucket, err)
			}
		}
		nc.Close()
	})
	t.Logf("nats-server %s at %s, bucket %s, cluster %s", nc.ConnectedServerVersion(), url, bucket, cluster)

	cfg := natsTestConfig(url)
	cfg.Bucket = bucket
	a := dialT(t, cluster, cfg)
	b := dialT(t, cluster, cfg)
	ctx := bg(t)

	// Tables: store, read, fetch, fence, purge.
	rev, err := a.StoreTable(ctx, 0, 1, 1, [][]byte{[]byte("h1"), []byte("h1 c1")})
	if err != nil {
		t.Fatal(err)
	}
	if head, hrev, ok, err := b.LatestTable(ctx); err != nil || !ok || string(head) != "h1" || hrev != rev {
		t.Fatalf("LatestTable = %q rev %d ok=%v err=%v", head, hrev, ok, err)
	}
	if got, err := b.FetchChunks(ctx, 1, 1, 2); err != nil || len(got) != 1 || string(got[0]) != "h1 c1" {
		t.Fatalf("FetchChunks = %q, %v", got, err)
	}
	got := make(chan watched, 8)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- b.WatchTables(wctx, func(head []byte, rev uint64) { got <- watched{string(head), rev} })
	}()
	if v := recv(t, got, "current head"); v.head != "h1" {
		t.Fatalf("watch started with %v", v)
	}
	for epoch := uint64(2); epoch <= 3; epoch++ {
		h := fmt.Sprintf("h%d", epoch)
		if rev, err = a.StoreTable(ctx, rev, 1, epoch, [][]byte{[]byte(h), []byte(h + " c1")}); err != nil {
			t.Fatal(err)
		}
		if v := recv(t, got, h); v.head != h || v.rev != rev {
			t.Fatalf("watch delivered %v, want %s rev %d", v, h, rev)
		}
	}
	stop()
	if err := recv(t, done, "WatchTables return"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.StoreTable(ctx, rev-1, 1, 4, [][]byte{[]byte("stale")}); !errors.Is(err, ErrFenced) {
		t.Fatalf("stale StoreTable: %v, want ErrFenced", err)
	}
	if _, err := b.FetchChunks(ctx, 1, 1, 2); err == nil {
		t.Error("table 1.1's chunks survived two newer tables (purge by subject filter)")
	}
	if _, err := b.FetchChunks(ctx, 1, 2, 2); err != nil {
		t.Errorf("the previous table's chunks were purged: %v", err)
	}

	// Election: one candidate is elected, seen by the other, and releases
	// the key when it stops.
	ecfg := ElectionConfig{ID: "eu/eu-1", TTL: time.Second}
	elected := make(chan uint64, 1)
	deposed := make(chan uint64, 1)
	cctx, cancel := context.WithCancel(ctx)
	cdone := make(chan error, 1)
	go func() {
		cdone <- a.Campaign(cctx, ecfg, 100*time.Millisecond, func(term uint64) { elected <- term }, func(term uint64) { deposed <- term })
	}()
	term := recv(t, elected, "elected")
	if l, ok, err := b.Leader(ctx); err != nil || !ok || l.ID != "eu/eu-1" || l.Term != term {
		t.Fatalf("Leader = %+v ok=%v err=%v, want eu/eu-1 term %d", l, ok, err, term)
	}
	cancel()
	if got := recv(t, deposed, "deposed"); got != term {
		t.Fatalf("deposed term %d, want %d", got, term)
	}
	if err := recv(t, cdone, "Campaign return"); err != nil {
		t.Fatal(err)
	}
	if l, ok, err := b.Leader(ctx); err != nil || ok {
		t.Fatalf("Leader after release = %+v ok=%v err=%v, want none", l, ok, err)
	}
}
