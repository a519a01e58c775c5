package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/internal/testenv"
	"github.com/meridian-quota/meridian/region/agent"
	"github.com/meridian-quota/meridian/region/agent/api"
)

// The tests here build the agent's Redis from an agent config file, with
// openRedis (what `meridian agent` runs), against real servers they start,
// and decide through the store it returns: never through a client built by
// hand. A decision counts only when its key then exists on the server it
// should be on.

// redisFixture is a directory holding an agent config, its policy and
// whatever files its redis section names.
type redisFixture struct {
	t      *testing.T
	dir    string
	prefix string
	log    *testenv.Buffer
	// secrets must never appear in an error or the log.
	secrets []string
}

func newRedisFixture(t *testing.T) *redisFixture {
	t.Helper()
	f := &redisFixture{t: t, dir: t.TempDir(), prefix: testenv.Prefix(t), log: &testenv.Buffer{}}
	f.write("policy.yaml", "domains:\n  - domain: api\n    descriptors:\n      - key: tenant\n        rate_limit: {unit: second, requests_per_unit: 10}\n")
	return f
}

// write writes a file (mode 0600) into the fixture's directory.
func (f *redisFixture) write(name, body string) string {
	f.t.Helper()
	p := filepath.Join(f.dir, name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		f.t.Fatal(err)
	}
	return p
}

// config writes agent.yaml whose redis section holds fields (YAML flow
// mapping entries) plus the fixture's prefix and a timeout a loaded
// machine meets, and loads it as `meridian agent --config` does.
func (f *redisFixture) config(fields string) *agent.Config {
	f.t.Helper()
	body := fmt.Sprintf("region: eu\nagent: eu-1\nregions: [eu]\npolicy: policy.yaml\ngrpc: \"\"\nhttp: 127.0.0.1:0\ndrain_delay: 0s\nredis: {%s, prefix: %q, timeout: 1s}\n", fields, f.prefix)
	cfg, err := agent.LoadConfig(f.write("agent.yaml", body))
	if err != nil {
		f.t.Fatalf("config {%s}: %v", fields, err)
	}
	return cfg
}

// open builds the agent's Redis from the redis section fields.
func (f *redisFixture) open(fields string) (*agentRedis, error) {
	f.t.Helper()
	cfg := f.config(fields)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rd, err := openRedis(ctx, &cfg.Redis, slog.New(slog.NewTextHandler(f.log, nil)))
	for _, s := range f.secrets {
		if err != nil && strings.Contains(err.Error(), s) || strings.Contains(f.log.String(), s) {
			f.t.Errorf("{%s}: a secret appears in the error (%v) or the log:\n%s", fields, err, f.log.String())
		}
	}
	if err == nil {
		f.t.Cleanup(func() { _ = rd.Close() })
	}
	return rd, err
}

// mustOpen is open that fails the test on an error.
func (f *redisFixture) mustOpen(fields string) *agentRedis {
	f.t.Helper()
	rd, err := f.open(fields)
	if err != nil {
		f.t.Fatalf("openRedis {%s}: %v", fields, err)
	}
	return rd
}

// refused asserts that openRedis refuses the fields with a configuration
// error containing each of want.
func (f *redisFixture) refused(fields string, want ...string) {
	f.t.Helper()
	_, err := f.open(fields)
	f.t.Logf("{%s}: %v", fields, err)
	if !errors.Is(err, agent.ErrConfig) {
		f.t.Errorf("openRedis {%s}: %v, want a configuration error", fields, err)
		return
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			f.t.Errorf("openRedis {%s}: %v\nwant it to contain %q", fields, err, w)
		}
	}
}

// decide admits one request for key name through rd's store and returns
// the Redis key it wrote.
func decide(t *testing.T, rd *agentRedis, name string) string {
	t.Helper()
	key, err := tryDecide(rd, name)
	if err != nil {
		t.Fatalf("decide %s: %v", name, err)
	}
	return key
}

// tryDecide is decide returning the error.
func tryDecide(rd *agentRedis, name string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	k := gcra.Key{Tag: "acme", Name: name}
	// 5 an hour: the key lives until it is rested, 12 minutes after one
	// request, so it is still there when a test looks for it (on a
	// replica too).
	res, err := rd.store.Decide(ctx, k, gcra.Steady(gcra.New(5, time.Hour, 5)), 1)
	if err != nil {
		return "", err
	}
	if !res.Allowed || res.Remaining != 4 {
		return "", fmt.Errorf("first request on a rested key: %+v, want allowed with 4 remaining", res)
	}
	return rd.store.RedisKey(k), nil
}

// wantKey fails the test unless key exists through c.
func wantKey(t *testing.T, c redis.Cmdable, key, where string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if n, err := c.Exists(ctx, key).Result(); err != nil || n != 1 {
		t.Errorf("%s: EXISTS %s = %d, %v; want the decision's key there", where, key, n, err)
	}
}

// TestRedisAuth runs on a redis-server with requirepass and an ACL user
// holding only what the agent needs. A missing or wrong password, for the
// default user or the ACL user, is refused at start with an error naming
// the settings; the right one decides, from password_file (relative to the
// config file), password_env or auth_env in either REDIS_AUTH form. A user
// the ACL denies INFO decides too, with a warning that the kind was not
// checked. db selects the database, and a database the server lacks is
// refused.
func TestRedisAuth(t *testing.T) {
	const defaultPW, userPW = "default-pw-0123", "user-pw-4567"
	srv := testenv.StartRedisWith(t, testenv.RedisOptions{Password: defaultPW})
	f := newRedisFixture(t)
	f.secrets = []string{defaultPW, userPW, "not-the-password"}
	ctx := context.Background()
	// The agent's least privilege: the connection handshake, the script,
	// INFO for the kind check, and what the script calls, on its keys.
	acl := []any{"ACL", "SETUSER", "meridian", "on", ">" + userPW, "~" + f.prefix + "*",
		"+@connection", "+evalsha", "+eval", "+script|load", "+info", "+time", "+get", "+set", "+pttl"}
	if err := srv.Client().Do(ctx, acl...).Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	// The same without INFO: the kind check is skipped, with a warning.
	acl[2] = "noinfo"
	acl = slices.DeleteFunc(acl, func(a any) bool { return a == "+info" })
	if err := srv.Client().Do(ctx, acl...).Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	admin := srv.Client()
	t.Setenv("MERIDIAN_TEST_REDIS_PW", defaultPW)
	t.Setenv("MERIDIAN_TEST_REDIS_USER_PW", userPW)
	t.Setenv("MERIDIAN_TEST_REDIS_WRONG", "not-the-password")
	t.Setenv("MERIDIAN_TEST_REDIS_AUTH_PASS", defaultPW)
	t.Setenv("MERIDIAN_TEST_REDIS_AUTH_USER", "meridian:"+userPW)
	t.Setenv("MERIDIAN_TEST_REDIS_AUTH_WRONG_USER", "meridian:"+defaultPW)
	f.write("pw", defaultPW+"\n")
	addr := fmt.Sprintf("addr: %s", srv.Addr)

	t.Run("refused", func(t *testing.T) {
		f.refused(addr, "redis.addr "+srv.Addr+" refused the credentials (NOAUTH", "no password is configured: set redis.password_file")
		f.refused(addr+", password_env: MERIDIAN_TEST_REDIS_WRONG", "refused the credentials (WRONGPASS", "check the default user and the password in redis.password_env $MERIDIAN_TEST_REDIS_WRONG")
		f.refused(addr+", username: meridian, password_env: MERIDIAN_TEST_REDIS_PW", "refused the credentials (WRONGPASS")
		f.refused(addr+", auth_env: MERIDIAN_TEST_REDIS_AUTH_WRONG_USER", "refused the credentials (WRONGPASS", `check user "meridian" and the password in redis.auth_env $MERIDIAN_TEST_REDIS_AUTH_WRONG_USER`)
		f.refused(addr+", username: nobody, password_env: MERIDIAN_TEST_REDIS_USER_PW", "refused the credentials (WRONGPASS")
		f.refused(addr+", password_file: pw, db: 99", "redis.db 99: redis.addr "+srv.Addr+" refused it (ERR DB index is out of range)")
	})
	t.Run("decides", func(t *testing.T) {
		for i, fields := range []string{
			addr + ", password_file: pw",
			addr + ", password_env: MERIDIAN_TEST_REDIS_PW",
			addr + ", username: meridian, password_env: MERIDIAN_TEST_REDIS_USER_PW",
			addr + ", auth_env: MERIDIAN_TEST_REDIS_AUTH_PASS",
			addr + ", auth_env: MERIDIAN_TEST_REDIS_AUTH_USER",
		} {
			rd := f.mustOpen(fields)
			wantKey(t, admin, decide(t, rd, fmt.Sprintf("k%d", i)), fields)
		}
	})
	t.Run("no INFO", func(t *testing.T) {
		rd := f.mustOpen(addr + ", username: noinfo, password_env: MERIDIAN_TEST_REDIS_USER_PW")
		wantKey(t, admin, decide(t, rd, "noinfo"), "user noinfo")
		if !strings.Contains(f.log.String(), "redis: the user may not run INFO; the kind of Redis is not checked") {
			t.Errorf("no warning that the kind was not checked:\n%s", f.log.String())
		}
	})
	t.Run("db", func(t *testing.T) {
		rd := f.mustOpen(addr + ", password_file: pw, db: 3")
		key := decide(t, rd, "in-db-3")
		db3 := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: defaultPW, DB: 3})
		defer db3.Close()
		wantKey(t, db3, key, "db 3")
		if n, err := admin.Exists(ctx, key).Result(); err != nil || n != 0 {
			t.Errorf("db 0: EXISTS %s = %d, %v; want the key in db 3 only", key, n, err)
		}
	})
	if strings.Contains(f.log.String(), "ERROR") {
		t.Errorf("log:\n%s", f.log.String())
	}
}

// TestRedisTLS runs on TLS-only redis-servers (--port 0 --tls-port) with
// certificates made in the test: one verifying the agent against the CA,
// one also requiring a client certificate (tls-auth-clients yes). Verified
// by the CA (under the dialled IP or a server_name the certificate
// carries), with the client certificate, or without verification, the
// agent decides; a CA that did not sign the server's certificate, a
// server_name it does not carry, a missing client certificate and TLS to a
// plain server are refused at start, each naming the settings to check.
func TestRedisTLS(t *testing.T) {
	pki, other := testenv.NewPKI(t), testenv.NewPKI(t)
	srv := testenv.StartRedisWith(t, testenv.RedisOptions{TLS: pki})
	mtls := testenv.StartRedisWith(t, testenv.RedisOptions{TLS: pki, ClientAuth: true})
	plain := testenv.StartRedis(t)
	f := newRedisFixture(t)
	// The fixture's files, named relative to the config file.
	for name, from := range map[string]string{"ca.pem": pki.CAFile, "client.pem": pki.ClientCertFile,
		"client-key.pem": pki.ClientKeyFile, "other-ca.pem": other.CAFile} {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		f.write(name, string(b))
	}
	at := func(s *testenv.Server, tls string) string {
		return fmt.Sprintf("addr: %s, tls: {enabled: true, %s}", s.Addr, tls)
	}

	for i, tt := range []struct {
		srv    *testenv.Server
		fields string
	}{
		{srv, at(srv, "ca_file: ca.pem")},
		{srv, at(srv, "ca_file: ca.pem, server_name: localhost")},
		{srv, at(srv, "insecure_skip_verify: true")},
		{mtls, at(mtls, "ca_file: ca.pem, cert_file: client.pem, key_file: client-key.pem")},
	} {
		rd := f.mustOpen(tt.fields)
		wantKey(t, tt.srv.Client(), decide(t, rd, fmt.Sprintf("k%d", i)), tt.fields)
	}
	f.refused(at(srv, "ca_file: other-ca.pem"), "redis.addr "+srv.Addr+": its TLS certificate does not verify",
		"certificate signed by unknown authority", "check redis.tls.ca_file and server_name")
	f.refused(at(srv, "ca_file: ca.pem, server_name: redis.example"), "its TLS certificate does not verify", "redis.example")
	f.refused(at(mtls, "ca_file: ca.pem"), "redis.addr "+mtls.Addr+" refused the TLS handshake", "check redis.tls.cert_file and key_file")
	// A plain server answers a ClientHello only if its random bytes hold a
	// line break (then the handshake fails on the reply at once, and that
	// is refused at start); otherwise it waits for the line and the
	// handshake times out. Either way nothing is ever decided over it.
	if rd, err := f.open(at(plain, "ca_file: ca.pem")); err == nil {
		if _, err := tryDecide(rd, "never"); err == nil {
			t.Errorf("TLS to a plain server decided")
		}
	} else if !strings.Contains(err.Error(), "redis.addr "+plain.Addr+" does not answer TLS") {
		t.Errorf("TLS to a plain server: %v, want it refused as not answering TLS", err)
	}
}

// TestRedisCluster runs on a three-master Redis Cluster: type cluster with
// the seed nodes decides on the node that holds the key's slot (the
// deprecated cluster: true with one seed in addr too), and a composite
// whose keys share a tag decides in one call. The kind check refuses to
// start on a Redis of another kind than redis.type says, for each type,
// and leaves a Redis that does not answer to the failure modes.
func TestRedisCluster(t *testing.T) {
	cl := testenv.StartCluster(t, 3)
	single := testenv.StartRedis(t)
	f := newRedisFixture(t)
	seeds := "type: cluster, addrs: [" + strings.Join(cl.Addrs, ", ") + "]"

	rd := f.mustOpen(seeds + ", pool_size: 4")
	if _, ok := rd.client.(*redis.ClusterClient); !ok {
		t.Fatalf("type cluster built a %T", rd.client)
	}
	for i := range 3 {
		wantKey(t, cl.Client(), decide(t, rd, fmt.Sprintf("k%d", i)), seeds)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	lim := gcra.Steady(gcra.PerSecond(10, 2))
	checks := []gcra.Check{{Key: gcra.Key{Tag: "acme", Name: "a"}, Schedule: lim, Cost: 1}, {Key: gcra.Key{Tag: "acme", Name: "b"}, Schedule: lim, Cost: 1}}
	if res, err := rd.store.DecideAll(ctx, checks, make([]gcra.Result, 2)); err != nil || !res.Allowed {
		t.Errorf("composite on one slot: %+v, %v", res, err)
	}

	old := f.config("cluster: true, addr: " + cl.Addrs[1])
	if w := old.Warnings(); len(w) != 1 || !strings.Contains(w[0], "redis.cluster is deprecated") {
		t.Errorf("cluster: true: warnings %q", w)
	}
	wantKey(t, cl.Client(), decide(t, f.mustOpen("cluster: true, addr: "+cl.Addrs[1]), "old-spelling"), "cluster: true")

	f.refused("addr: "+cl.Addrs[0], "redis.type is single, but redis.addr "+cl.Addrs[0]+" is a Redis Cluster node", "set redis.type: cluster")
	f.refused("type: cluster, addrs: ["+cl.Addrs[0]+", "+single.Addr+"]",
		"redis.type is cluster, but redis.addrs "+single.Addr+" is a single Redis, not a Redis Cluster node", "set redis.type: single")
	f.refused("cluster: true, addr: "+single.Addr, "redis.type is cluster, but redis.addr "+single.Addr+" is a single Redis")

	// Nothing listening: the agent starts, the failure modes decide, and
	// the script load is logged.
	dead := deadAddr(t)
	for _, fields := range []string{"addr: " + dead, "type: cluster, addrs: [" + dead + "]", "type: sentinel, addrs: [" + dead + "], master_name: m"} {
		if _, err := f.open(fields); err != nil {
			t.Errorf("{%s}: %v, want the agent to start", fields, err)
		}
	}
	if !strings.Contains(f.log.String(), "redis: script not loaded") {
		t.Errorf("log lacks the script-load warning:\n%s", f.log.String())
	}
}

// deadAddr is a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestRedisSentinel runs on a Sentinel monitoring a master with one
// replica: type sentinel with the Sentinel's address and the master's name
// decides on the master, in the configured database, and the decision
// reaches the replica; after the Sentinel fails the master over, the same
// client decides on the promoted replica, found by name again. A master
// name the Sentinel does not know, a data server listed as a Sentinel and
// a Sentinel given as a single server are refused at start.
func TestRedisSentinel(t *testing.T) {
	s := testenv.StartSentinel(t, "meridian-eu")
	f := newRedisFixture(t)
	fields := fmt.Sprintf("type: sentinel, addrs: [%s], master_name: %s, db: 2", s.Addr, s.MasterName)
	rd := f.mustOpen(fields)
	if _, ok := rd.client.(*redis.Client); !ok {
		t.Fatalf("type sentinel built a %T, want the failover *redis.Client", rd.client)
	}
	db2 := func(srv *testenv.Server) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, DB: 2})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	key := decide(t, rd, "before")
	wantKey(t, db2(s.Master), key, "the master, db 2")
	replica := db2(s.Replica)
	if !poll(10*time.Second, func() bool { n, _ := replica.Exists(context.Background(), key).Result(); return n == 1 }) {
		t.Errorf("the decision's key did not reach the replica")
	}

	s.Failover(t)
	// Until the Sentinel demotes it, the old master still takes writes
	// (lost when it resyncs as a replica); then it refuses them (READONLY)
	// and the client, told of the switch, asks the Sentinel again. So
	// decide on fresh keys until one is on the promoted master.
	promoted := db2(s.Master)
	n := 0
	if !poll(30*time.Second, func() bool {
		n++
		k, err := tryDecide(rd, fmt.Sprintf("after-%d", n))
		if err != nil {
			return false
		}
		got, err := promoted.Exists(context.Background(), k).Result()
		return err == nil && got == 1
	}) {
		t.Fatalf("no decision on the promoted master %s within 30 s of the failover (%d tried)", s.Master.Addr, n)
	}

	f.refused(fmt.Sprintf("type: sentinel, addrs: [%s], master_name: nobody", s.Addr),
		`redis.master_name "nobody": the Sentinel at `+s.Addr+" monitors no master of that name")
	f.refused(fmt.Sprintf("type: sentinel, addrs: [%s], master_name: %s", s.Master.Addr, s.MasterName),
		"redis.type is sentinel, but redis.addrs "+s.Master.Addr+" is a single Redis")
	f.refused("addr: "+s.Addr, "redis.type is single, but redis.addr "+s.Addr+" is a Sentinel", "set redis.type: sentinel")
}

// poll calls cond every 20 ms until it holds or timeout passes, and
// reports whether it held.
func poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// captureLog is a go-redis logger writing to w.
type captureLog struct{ w io.Writer }

func (l captureLog) Printf(_ context.Context, format string, v ...any) {
	fmt.Fprintf(l.w, "redis: "+format+"\n", v...)
}

// TestRedisPasswordNeverShown runs `meridian agent` on a redis-server with
// requirepass and an ACL user. A wrong password stops the agent with an
// error naming the variable; the right ones (from password_file for the
// default user, from auth_env as "user:password") decide over POST
// /v1/decide, the decision's key landing in Redis. No password, right or
// wrong, ever appears in the agent's output, its error, or go-redis's own
// log.
func TestRedisPasswordNeverShown(t *testing.T) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	defaultPW, userPW, wrongPW := "dflt-"+hex.EncodeToString(b[:4]), "user-"+hex.EncodeToString(b[4:]), "wrong-"+hex.EncodeToString(b[2:6])
	srv := testenv.StartRedisWith(t, testenv.RedisOptions{Password: defaultPW})
	f := newRedisFixture(t)
	ctx := context.Background()
	if err := srv.Client().Do(ctx, "ACL", "SETUSER", "meridian", "on", ">"+userPW, "~"+f.prefix+"*", "+@all").Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	var redisLog testenv.Buffer
	redis.SetLogger(captureLog{&redisLog})
	defer redis.SetLogger(captureLog{os.Stderr}) // where go-redis's default logger writes
	f.write("pw", defaultPW+"\n")
	t.Setenv("MERIDIAN_TEST_REDIS_WRONG", wrongPW)
	t.Setenv("MERIDIAN_TEST_REDIS_AUTH", "meridian:"+userPW)

	agentYAML := func(redisFields string) (path, httpAddr string) {
		httpAddr = deadAddr(t) // free a moment ago; the agent binds it
		body := fmt.Sprintf("region: eu\nagent: eu-1\nregions: [eu]\npolicy: policy.yaml\ngrpc: \"\"\nhttp: %s\ndrain_delay: 0s\nredis: {addr: %s, %s, prefix: %q, timeout: 1s}\n",
			httpAddr, srv.Addr, redisFields, f.prefix)
		return f.write("agent.yaml", body), httpAddr
	}
	var outputs []string
	shown := func(what string) {
		t.Helper()
		for _, out := range outputs {
			for _, pw := range []string{defaultPW, userPW, wrongPW} {
				if strings.Contains(out, pw) {
					t.Errorf("%s: a password appears in the output:\n%s", what, out)
				}
			}
		}
	}

	t.Run("wrong password", func(t *testing.T) {
		path, _ := agentYAML("password_env: MERIDIAN_TEST_REDIS_WRONG")
		var stdout, stderr testenv.Buffer
		code := run(ctx, []string{"agent", "--config", path}, &stdout, &stderr)
		outputs = append(outputs, stdout.String(), stderr.String())
		if code != 1 || !strings.Contains(stderr.String(), "refused the credentials (WRONGPASS") ||
			!strings.Contains(stderr.String(), "redis.password_env $MERIDIAN_TEST_REDIS_WRONG") {
			t.Errorf("exit %d, stderr:\n%s\nwant exit 1 and the refusal naming the variable", code, stderr.String())
		}
	})
	for _, fields := range []string{"password_file: pw", "auth_env: MERIDIAN_TEST_REDIS_AUTH"} {
		t.Run(fields, func(t *testing.T) {
			path, httpAddr := agentYAML(fields)
			actx, cancel := context.WithCancel(ctx)
			var stdout, stderr testenv.Buffer
			done := make(chan int, 1)
			go func() { done <- run(actx, []string{"agent", "--config", path}, &stdout, &stderr) }()
			defer func() {
				cancel()
				select {
				case code := <-done:
					if code != 0 {
						t.Errorf("agent exited %d\nstderr:\n%s", code, stderr.String())
					}
				case <-time.After(10 * time.Second):
					t.Errorf("agent did not stop within 10 s of its context ending")
				}
				outputs = append(outputs, stdout.String(), stderr.String())
			}()
			body := `{"domain":"api","descriptors":[{"entries":[{"key":"tenant","value":"acme"}]}]}`
			var resp *http.Response
			if !poll(10*time.Second, func() bool {
				var err error
				resp, err = http.Post("http://"+httpAddr+"/v1/decide", "application/json", strings.NewReader(body))
				return err == nil
			}) {
				t.Fatalf("the agent did not serve within 10 s\nstderr:\n%s", stderr.String())
			}
			var got api.DecideResponse
			err := json.NewDecoder(resp.Body).Decode(&got)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK || !got.Allowed {
				t.Errorf("POST /v1/decide: %d %+v %v", resp.StatusCode, got, err)
			}
			keys, err := srv.Client().Keys(ctx, f.prefix+"*").Result()
			if err != nil || len(keys) == 0 {
				t.Errorf("no key under %q after the decision (%v): it was not decided in Redis", f.prefix, err)
			}
			_ = srv.Client().Del(ctx, keys...).Err()
		})
	}
	outputs = append(outputs, redisLog.String())
	shown("agent output, errors and go-redis's log")
}
