package gossip

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/meridian-quota/meridian/internal/testenv"
	"github.com/meridian-quota/meridian/rebalance"
)

// Real memberlist members on 127.0.0.1 with the local profile; every wait
// polls with a deadline. Each test checks that nothing it logged contains
// its keys.

const waitFor = 5 * time.Second // generous bound for convergence on loopback

// newKey returns a random AES key of n bytes.
func newKey(t *testing.T, n int) []byte {
	t.Helper()
	k := make([]byte, n)
	if _, err := rand.Read(k); err != nil {
		t.Fatal(err)
	}
	return k
}

func b64(k []byte) string { return base64.StdEncoding.EncodeToString(k) }

// writeKeys writes a key file (atomically: ReloadKeys may read it).
func writeKeys(t *testing.T, path string, keys ...[]byte) {
	t.Helper()
	var b strings.Builder
	b.WriteString("# gossip keyring, primary first\n")
	for _, k := range keys {
		b.WriteString(b64(k) + "\n")
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func keyFile(t *testing.T, keys ...[]byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "gossip.keys")
	writeKeys(t, p, keys...)
	return p
}

// secretForms are the ways a key could leak into text.
func secretForms(k []byte) []string {
	return []string{
		base64.StdEncoding.EncodeToString(k),
		base64.RawStdEncoding.EncodeToString(k),
		base64.URLEncoding.EncodeToString(k),
		hex.EncodeToString(k),
		string(k),
		fmt.Sprint(k), // [12 34 …]
	}
}

// assertNoSecret fails if text contains any form of any key.
func assertNoSecret(t *testing.T, what, text string, keys ...[]byte) {
	t.Helper()
	for _, k := range keys {
		for _, f := range secretForms(k) {
			if strings.Contains(text, f) {
				t.Errorf("%s contains key material (%d-byte key)", what, len(k))
			}
		}
	}
}

// captureLogs returns a logger whose output (every level) is checked at
// the end of the test for the given keys, and shown if the test failed.
// Register it before the members so its check runs after they stopped.
func captureLogs(t *testing.T, keys *[][]byte) *slog.Logger {
	t.Helper()
	buf := &testenv.Buffer{}
	t.Cleanup(func() {
		out := buf.String()
		assertNoSecret(t, "logs", out, *keys...)
		if t.Failed() {
			t.Logf("logs:\n%s", out)
		}
	})
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// sharedKey sets up a test whose members share one new key of n bytes:
// it returns the key, a key file holding it and a logger checked for it
// (see captureLogs).
func sharedKey(t *testing.T, n int) (key []byte, file string, log *slog.Logger) {
	t.Helper()
	key = newKey(t, n)
	keys := [][]byte{key}
	return key, keyFile(t, key), captureLogs(t, &keys)
}

// localConfig is a local-profile member on a free loopback port.
func localConfig(keyFile string, join ...string) MemberConfig {
	c := DefaultMemberConfig()
	c.Profile = ProfileLocal
	c.Bind = "127.0.0.1:0"
	c.KeyFile = keyFile
	c.Join = join
	return c
}

// start starts a member that leaves when the test ends.
func start(t *testing.T, cfg MemberConfig, meta Meta, log *slog.Logger) *Members {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	m, err := StartMembers(ctx, cfg, meta, log)
	if err != nil {
		cancel()
		t.Fatalf("StartMembers(%s): %v", nodeName(meta), err)
	}
	t.Cleanup(func() {
		cancel()
		if err := m.Leave(waitFor); err != nil {
			t.Errorf("Leave(%s): %v", nodeName(meta), err)
		}
	})
	return m
}

// eventually polls cond every 10 ms until it returns nil, failing the
// test with its last error once d passed.
func eventually(t testing.TB, d time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func liveIs(m *Members, want []rebalance.Member) func() error {
	return func() error {
		if got := m.Live(); !slices.Equal(got, want) {
			return fmt.Errorf("%s sees Live %v, want %v", m.name, got, want)
		}
		return nil
	}
}

// triedJoin is a condition for eventually: m made at least n join
// attempts.
func triedJoin(m *Members, n int64) func() error {
	return func() error {
		if got := m.joinAttempts.Load(); got < n {
			return fmt.Errorf("%s made %d join attempts, want %d", m.name, got, n)
		}
		return nil
	}
}

func infoOf(m *Members, name string) (MemberInfo, bool) {
	for _, in := range m.Infos() {
		if nodeName(in.Meta) == name {
			return in, true
		}
	}
	return MemberInfo{}, false
}

// freePort returns a loopback port nothing listens on (TCP and UDP).
func freePort(t *testing.T) int {
	t.Helper()
	for range 20 {
		l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
		l.Close()
		if err == nil {
			u.Close()
			return port
		}
	}
	t.Fatal("no free port")
	return 0
}

var (
	metaA = Meta{Region: "eu-west", Agent: "a1", Role: "coordinator-candidate", Version: "v1.2.3"}
	metaB = Meta{Region: "eu-west", Agent: "a2", Role: "agent", Version: "v1.2.3"}
	metaC = Meta{Region: "us-east", Agent: "b1", Role: "agent", Version: "v1.2.4"}
)

func TestMembersJoinAndMetadata(t *testing.T) {
	key, file, log := sharedKey(t, 32)

	// B is told to join A before A exists: it must keep retrying.
	seed := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	b := start(t, localConfig(file, seed), metaB, log)
	eventually(t, waitFor, "B retries the absent seed", triedJoin(b, 2))
	if b.Joined() {
		t.Fatal("B joined a seed that does not exist")
	}

	cfgA := localConfig(file)
	cfgA.Bind = seed
	a := start(t, cfgA, metaA, log)
	if !a.Joined() {
		t.Error("A has no seeds: Joined() = false, want true")
	}
	if a.Addr() != seed {
		t.Errorf("A.Addr() = %q, want %q", a.Addr(), seed)
	}

	// C reads the same key from the environment, among comments.
	const env = "MERIDIAN_TEST_MEMBERS_KEY"
	t.Setenv(env, "# primary\n"+b64(key))
	cfgC := localConfig("", a.Addr())
	cfgC.KeyEnv = env
	c := start(t, cfgC, metaC, log)

	all := []*Members{a, b, c}
	want := []rebalance.Member{{Region: "eu-west", Agent: "a1"}, {Region: "eu-west", Agent: "a2"}, {Region: "us-east", Agent: "b1"}}
	for _, m := range all {
		eventually(t, waitFor, "everyone joins and sees three members", func() error {
			if !m.Joined() {
				return fmt.Errorf("%s: Joined() = false", m.name)
			}
			return liveIs(m, want)()
		})
	}
	for _, m := range all {
		for _, other := range all {
			in, ok := infoOf(m, other.name)
			if !ok {
				t.Errorf("%s does not list %s", m.name, other.name)
				continue
			}
			want := MemberInfo{Meta: other.self, Addr: other.Addr(), State: MemberAlive}
			if in != want {
				t.Errorf("%s sees %s as %+v, want %+v", m.name, other.name, in, want)
			}
		}
		for region, n := range map[string]int{"eu-west": 2, "us-east": 1, "ap-south": 0} {
			if got := m.LiveInRegion(region); got != n {
				t.Errorf("%s: LiveInRegion(%q) = %d, want %d", m.name, region, got, n)
			}
		}
	}
	select {
	case <-a.Changed():
	case <-time.After(waitFor):
		t.Error("A's Changed() never fired while B and C joined")
	}
}

func TestMembersRefuseOutsiders(t *testing.T) {
	key, wrong := newKey(t, 32), newKey(t, 32)
	keys := [][]byte{key, wrong}
	log := captureLogs(t, &keys)
	a := start(t, localConfig(keyFile(t, key)), metaA, log)

	plain := localConfig("", a.Addr())
	plain.AllowPlaintext = true
	tests := []struct {
		name string
		cfg  MemberConfig
	}{
		{"wrong key", localConfig(keyFile(t, wrong), a.Addr())},
		{"plaintext", plain},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			meta := Meta{Region: "eu-west", Agent: "intruder-" + strings.ReplaceAll(tt.name, " ", "-")}
			x := start(t, tt.cfg, meta, log)
			// Three failed attempts (≈ 0.3 s of backoff) bound the wait;
			// at no point may either side see the other.
			eventually(t, waitFor, "three join attempts", func() error {
				if x.Joined() {
					t.Fatal("Joined() = true, want false")
				}
				if _, ok := infoOf(a, nodeName(meta)); ok {
					t.Fatalf("A lists %s", nodeName(meta))
				}
				return triedJoin(x, 3)()
			})
			if got, want := x.Live(), []rebalance.Member{{Region: meta.Region, Agent: meta.Agent}}; !slices.Equal(got, want) {
				t.Errorf("outsider sees %v, want only itself", got)
			}
			if got := a.Live(); len(got) != 1 {
				t.Errorf("A sees %v, want only itself", got)
			}
		})
	}
}

func TestMembersLeaveAndFailure(t *testing.T) {
	_, file, log := sharedKey(t, 16)
	a := start(t, localConfig(file), metaA, log)
	b := start(t, localConfig(file, a.Addr()), metaB, log)
	c := start(t, localConfig(file, a.Addr()), metaC, log)
	want := []rebalance.Member{{Region: "eu-west", Agent: "a1"}, {Region: "eu-west", Agent: "a2"}, {Region: "us-east", Agent: "b1"}}
	for _, m := range []*Members{a, b, c} {
		eventually(t, waitFor, "three members", liveIs(m, want))
	}

	// B leaves gracefully: the others see it as left, no longer live.
	if err := b.Leave(2 * time.Second); err != nil {
		t.Fatalf("Leave: %v", err)
	}
	if err := b.Leave(2 * time.Second); err != nil {
		t.Fatalf("second Leave: %v", err)
	}
	withoutB := []rebalance.Member{{Region: "eu-west", Agent: "a1"}, {Region: "us-east", Agent: "b1"}}
	for _, m := range []*Members{a, c} {
		eventually(t, waitFor, "B seen as left", func() error {
			in, ok := infoOf(m, b.name)
			if !ok || in.State != MemberLeft {
				return fmt.Errorf("%s sees B as %+v (listed %v)", m.name, in, ok)
			}
			return liveIs(m, withoutB)()
		})
		if got := m.LiveInRegion("eu-west"); got != 1 {
			t.Errorf("%s: LiveInRegion(eu-west) = %d after B left, want 1", m.name, got)
		}
	}

	// C dies without a word: failure detection declares it dead.
	c.kill()
	eventually(t, waitFor, "C declared dead", func() error {
		in, ok := infoOf(a, c.name)
		if !ok || in.State != MemberDead {
			return fmt.Errorf("A sees C as %+v (listed %v)", in, ok)
		}
		return liveIs(a, []rebalance.Member{{Region: "eu-west", Agent: "a1"}})()
	})
	if err := c.Leave(time.Second); err != nil {
		t.Errorf("Leave after a crash: %v, want nil (no-op)", err)
	}
}

// keysOf returns a copy of m's keyring, primary first.
func keysOf(m *Members) [][]byte {
	m.keysMu.Lock()
	defer m.keysMu.Unlock()
	var out [][]byte
	for _, k := range m.keyring.GetKeys() {
		out = append(out, slices.Clone(k))
	}
	return out
}

// pingAll checks that every member reaches every other over UDP with the
// keys it has now (a probe both ways: ping encrypted by the sender's
// primary, ack by the receiver's).
func pingAll(t *testing.T, step string, ms []*Members) {
	t.Helper()
	for _, from := range ms {
		for _, to := range ms {
			if from == to {
				continue
			}
			addr, err := net.ResolveUDPAddr("udp", to.Addr())
			if err != nil {
				t.Fatal(err)
			}
			// A ping with the wrong keys never succeeds; retrying covers
			// a lost datagram or a busy machine, not a key mismatch.
			eventually(t, waitFor, step, func() error {
				if _, err := from.ml.Ping(to.name, addr); err != nil {
					return fmt.Errorf("%s cannot reach %s: %v", from.name, to.name, err)
				}
				return nil
			})
		}
	}
}

func TestMembersKeyRotation(t *testing.T) {
	oldK, newK := newKey(t, 32), newKey(t, 24)
	keys := [][]byte{oldK, newK}
	log := captureLogs(t, &keys)

	metas := []Meta{metaA, metaB, metaC}
	files := make([]string, len(metas))
	ms := make([]*Members, len(metas))
	for i, meta := range metas {
		files[i] = keyFile(t, oldK)
		var join []string
		if i > 0 {
			join = []string{ms[0].Addr()}
		}
		ms[i] = start(t, localConfig(files[i], join...), meta, log)
	}
	all := []rebalance.Member{{Region: "eu-west", Agent: "a1"}, {Region: "eu-west", Agent: "a2"}, {Region: "us-east", Agent: "b1"}}
	for _, m := range ms {
		eventually(t, waitFor, "three members", liveIs(m, all))
	}

	steps := []struct {
		name string
		file [][]byte
	}{
		{"1 install", [][]byte{oldK, newK}},
		{"2 switch", [][]byte{newK, oldK}},
		{"3 remove", [][]byte{newK}},
	}
	for _, st := range steps {
		for i, m := range ms {
			writeKeys(t, files[i], st.file...)
			if err := m.ReloadKeys(); err != nil {
				t.Fatalf("step %s: %s: ReloadKeys: %v", st.name, m.name, err)
			}
			if got := keysOf(m); !slices.EqualFunc(got, st.file, bytes.Equal) {
				t.Fatalf("step %s: %s keyring has %d keys, not the file's %d in order", st.name, m.name, len(got), len(st.file))
			}
			// Mid-step: some members are a step ahead of the others.
			pingAll(t, fmt.Sprintf("step %s after %s", st.name, m.name), ms)
		}
	}
	for _, m := range ms {
		if err := liveIs(m, all)(); err != nil {
			t.Error(err)
		}
	}

	// A broken file changes nothing and says where, not what.
	writeKeys(t, files[0], newK)
	if err := os.WriteFile(files[0], []byte(b64(newK)+"\n"+b64(oldK)[:20]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := ms[0].ReloadKeys()
	if err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("ReloadKeys with a bad line: %v, want an error naming line 2", err)
	}
	if err != nil {
		assertNoSecret(t, "ReloadKeys error", err.Error(), keys...)
	}
	if got := keysOf(ms[0]); !slices.EqualFunc(got, [][]byte{newK}, bytes.Equal) {
		t.Error("a failed ReloadKeys changed the keyring")
	}

	// A member with only the removed key cannot join any more; one with
	// the new key can.
	stale := start(t, localConfig(keyFile(t, oldK), ms[0].Addr()), Meta{Region: "eu-west", Agent: "stale"}, log)
	fresh := start(t, localConfig(keyFile(t, newK), ms[0].Addr()), Meta{Region: "eu-west", Agent: "fresh"}, log)
	eventually(t, waitFor, "the fresh member joins", func() error {
		if !fresh.Joined() {
			return errors.New("not joined")
		}
		if _, ok := infoOf(ms[0], fresh.name); !ok {
			return errors.New("A does not list it")
		}
		return nil
	})
	eventually(t, waitFor, "the stale member retries", triedJoin(stale, 3))
	if stale.Joined() {
		t.Error("a member with only the removed key joined")
	}
	for _, m := range ms {
		if _, ok := infoOf(m, stale.name); ok {
			t.Errorf("%s lists the stale member", m.name)
		}
	}
}

func TestMembersRejoinRestartedSeed(t *testing.T) {
	_, file, log := sharedKey(t, 32)
	a := start(t, localConfig(file), metaA, log)
	cfgB := localConfig(file, a.Addr())
	cfgB.RejoinInterval = 100 * time.Millisecond
	b := start(t, cfgB, metaB, log)
	both := []rebalance.Member{{Region: "eu-west", Agent: "a1"}, {Region: "eu-west", Agent: "a2"}}
	eventually(t, waitFor, "B joins A", liveIs(b, both))

	// The seed crashes and comes back at the same address with no seeds
	// of its own: B's re-join loop must bring the two together again.
	a.kill()
	eventually(t, waitFor, "B declares A dead", liveIs(b, []rebalance.Member{{Region: "eu-west", Agent: "a2"}}))
	cfgA := localConfig(file)
	cfgA.Bind = a.Addr()
	a2 := start(t, cfgA, metaA, log)
	eventually(t, waitFor, "B re-joins the restarted seed", liveIs(b, both))
	eventually(t, waitFor, "the restarted seed sees B", liveIs(a2, both))
	if b.rejoins.Load() == 0 {
		t.Error("the members met again without B's re-join loop: the test proves nothing")
	}
}

func TestMembersPlaintextReload(t *testing.T) {
	var keys [][]byte
	cfg := localConfig("")
	cfg.AllowPlaintext = true
	m := start(t, cfg, metaA, captureLogs(t, &keys))
	if err := m.ReloadKeys(); err == nil {
		t.Error("ReloadKeys on a plaintext member: nil error, want one")
	}
}

func TestMemberConfigValidate(t *testing.T) {
	good, short := newKey(t, 32), newKey(t, 20)
	secrets := [][]byte{good, short}
	goodFile := writeFile(t, "good", b64(good)+"\n")
	const env = "MERIDIAN_TEST_MEMBERS_KEYS"
	t.Setenv(env, b64(good)+", "+b64(newKey(t, 16))+"\n"+b64(newKey(t, 24)))
	const emptyEnv = "MERIDIAN_TEST_MEMBERS_EMPTY"
	t.Setenv(emptyEnv, "")

	withKey := func(f func(*MemberConfig)) MemberConfig {
		c := DefaultMemberConfig()
		c.KeyFile = goodFile
		f(&c)
		return c
	}
	tests := []struct {
		name     string
		give     MemberConfig
		wantErrs []string // each must appear; none: valid
	}{
		{"default with a key", withKey(func(*MemberConfig) {}), nil},
		{"keys from env", withKey(func(c *MemberConfig) { c.KeyFile, c.KeyEnv = "", env }), nil},
		{"plaintext allowed", withKey(func(c *MemberConfig) { c.KeyFile, c.AllowPlaintext = "", true }), nil},
		{"local with overrides", withKey(func(c *MemberConfig) {
			c.Profile, c.Bind, c.Advertise = ProfileLocal, "127.0.0.1:0", "10.1.2.3:7946"
			c.Join = []string{"seed.eu-west.example:7946", "[::1]:7946"}
			c.ProbeInterval, c.ProbeTimeout = 2*time.Second, time.Second
		}), nil},
		{"default without a key", DefaultMemberConfig(), []string{"members.key_file: no gossip key"}},
		{"bind without port", withKey(func(c *MemberConfig) { c.Bind = "x" }), []string{`members.bind: "x": missing port in address`}},
		{"bind to a name", withKey(func(c *MemberConfig) { c.Bind = "localhost:7946" }), []string{`members.bind: "localhost:7946": host must be an IP`}},
		{"bind port too big", withKey(func(c *MemberConfig) { c.Bind = "0.0.0.0:70000" }), []string{"members.bind", "port must be a number in [0, 65535]"}},
		{"advertise unspecified", withKey(func(c *MemberConfig) { c.Advertise = "0.0.0.0:7946" }), []string{`members.advertise: "0.0.0.0:7946": host must be a specific IP`}},
		{"advertise port 0", withKey(func(c *MemberConfig) { c.Advertise = "10.0.0.1:0" }), []string{"members.advertise", "[1, 65535]"}},
		{"seed without port", withKey(func(c *MemberConfig) { c.Join = []string{"10.0.0.1:7946", "seed"} }), []string{`members.join[1]: "seed": missing port`}},
		{"seed without host", withKey(func(c *MemberConfig) { c.Join = []string{":7946"} }), []string{`members.join[0]: ":7946": empty host`}},
		{"bad base64", withKey(func(c *MemberConfig) { c.KeyFile = writeFile(t, "b64", b64(good)+"\n"+b64(good)[:10]+"!!\n") }), []string{"members.key_file", "line 2: not standard base64"}},
		{"wrong key size", withKey(func(c *MemberConfig) { c.KeyFile = writeFile(t, "short", b64(short)) }), []string{"members.key_file", "line 1: key is 20 bytes; want 16, 24 or 32"}},
		{"same key twice", withKey(func(c *MemberConfig) { c.KeyFile = writeFile(t, "twice", b64(good)+"\n\n"+b64(good)) }), []string{"line 3: the same key as an earlier line"}},
		{"empty key file", withKey(func(c *MemberConfig) { c.KeyFile = writeFile(t, "empty", "# nothing yet\n") }), []string{"members.key_file", "no keys"}},
		{"missing key file", withKey(func(c *MemberConfig) { c.KeyFile = filepath.Join(t.TempDir(), "absent") }), []string{"members.key_file", "no such file"}},
		{"unset env", withKey(func(c *MemberConfig) { c.KeyFile, c.KeyEnv = "", "MERIDIAN_TEST_MEMBERS_UNSET" }), []string{"members.key_env: $MERIDIAN_TEST_MEMBERS_UNSET is not set"}},
		{"empty env", withKey(func(c *MemberConfig) { c.KeyFile, c.KeyEnv = "", emptyEnv }), []string{"members.key_env", "no keys"}},
		{"short key in env", withKey(func(c *MemberConfig) {
			t.Setenv(env+"_SHORT", b64(good)+","+b64(short))
			c.KeyFile, c.KeyEnv = "", env+"_SHORT"
		}), []string{"members.key_env", "key 2: key is 20 bytes"}},
		{"file and env", withKey(func(c *MemberConfig) { c.KeyEnv = env }), []string{"members.key_file, members.key_env: set one, not both"}},
		{"unknown profile", withKey(func(c *MemberConfig) { c.Profile = "moon" }), []string{`members.profile: "moon"`}},
		{"negative timings", withKey(func(c *MemberConfig) { c.ProbeInterval, c.SuspicionMult = -time.Second, -1 }), []string{"members.probe_interval: -1s", "members.suspicion_mult: -1"}},
		{"probe timeout above interval", withKey(func(c *MemberConfig) { c.Profile, c.ProbeTimeout = ProfileLocal, time.Second }), []string{"members.probe_timeout: 1s: must be below probe_interval 100ms"}},
		{"every problem at once", withKey(func(c *MemberConfig) {
			c.Profile, c.Bind, c.KeyFile, c.Join = "", "x", writeFile(t, "all", b64(short)), []string{"y"}
		}), []string{"members.profile", "members.bind", "members.join[0]", "line 1: key is 20 bytes"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.give.Validate()
			checkErrs(t, "Validate()", err, tt.wantErrs)
			if err == nil {
				return
			}
			assertNoSecret(t, "Validate error", err.Error(), secrets...)
			// StartMembers refuses the same config with the same words.
			_, serr := StartMembers(context.Background(), tt.give, metaA, nil)
			checkErrs(t, "StartMembers()", serr, tt.wantErrs[:1])
			assertNoSecret(t, "StartMembers error", serr.Error(), secrets...)
		})
	}
}

func TestMetaValidate(t *testing.T) {
	long := strings.Repeat("x", maxMetaField+1)
	tests := []struct {
		name     string
		give     Meta
		wantErrs []string
	}{
		{"valid", metaA, nil},
		{"longest", Meta{Region: long[:maxMetaField], Agent: long[:maxMetaField], Role: long[:maxMetaField], Version: long[:maxMetaField]}, nil},
		{"empty", Meta{}, []string{"meta.region: empty", "meta.agent: empty"}},
		{"over-long agent", Meta{Region: "eu", Agent: long}, []string{"meta.agent: 129 bytes; at most 128"}},
		{"over-long role and version", Meta{Region: "eu", Agent: "a", Role: long, Version: long}, []string{"meta.role: 129 bytes", "meta.version: 129 bytes"}},
		{"slash in region", Meta{Region: "eu/west", Agent: "a"}, []string{`meta.region: "eu/west": must not contain "/"`}},
		{"control character", Meta{Region: "eu", Agent: "a\n"}, []string{"meta.agent", "not printable"}},
		{"invalid utf-8", Meta{Region: "eu", Agent: "a", Version: "\xff"}, []string{"meta.version", "not printable"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkErrs(t, "Validate()", tt.give.Validate(), tt.wantErrs)
			if len(tt.wantErrs) == 0 {
				if n := len(encodeMeta(tt.give, true)); n > memberlist.MetaMaxSize {
					t.Errorf("encoded meta is %d bytes, above memberlist.MetaMaxSize %d", n, memberlist.MetaMaxSize)
				}
				return
			}
			cfg := localConfig("")
			cfg.AllowPlaintext = true
			_, err := StartMembers(context.Background(), cfg, tt.give, nil)
			checkErrs(t, "StartMembers()", err, tt.wantErrs[:1])
		})
	}
}

func TestMetaCodec(t *testing.T) {
	for _, leaving := range []bool{false, true} {
		b := encodeMeta(metaA, leaving)
		got, gotLeaving, err := decodeMeta(nodeName(metaA), b)
		if err != nil || got != metaA || gotLeaving != leaving {
			t.Errorf("round trip (leaving %v) = %+v, %v, %v", leaving, got, gotLeaving, err)
		}
		// Every truncation is an error, never a panic.
		for i := range len(b) {
			if _, _, err := decodeMeta("r/a", b[:i]); err == nil {
				t.Errorf("decode of the first %d of %d bytes: nil error", i, len(b))
			}
		}
	}
	// A later format appends fields: a format-1 reader ignores them.
	later := append(encodeMeta(metaB, false), 0x07, 'n', 'e', 'w')
	later[0] = 2
	if got, _, err := decodeMeta(nodeName(metaB), later); err != nil || got != metaB {
		t.Errorf("decode of a later format = %+v, %v; want %+v", got, err, metaB)
	}
	// Format 0 and over-long lengths are malformed.
	for _, b := range [][]byte{{0, 0, 0, 0}, {1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f}, {1, 0, 5, 'a'}} {
		if _, _, err := decodeMeta("r/a", b); err == nil {
			t.Errorf("decode %x: nil error", b)
		}
	}
	if r, a := splitNodeName("us-east/pod/7"); r != "us-east" || a != "pod/7" {
		t.Errorf("splitNodeName = %q, %q", r, a)
	}
	if r, a := splitNodeName("consul-server"); r != "" || a != "consul-server" {
		t.Errorf("splitNodeName of a foreign name = %q, %q", r, a)
	}
}

func TestMemberlistLogLines(t *testing.T) {
	tests := []struct {
		give      string
		wantLevel slog.Level
		wantMsg   string
		wantDrop  bool
	}{
		{give: "[DEBUG] memberlist: Stream connection from=127.0.0.1:1234\n", wantDrop: true},
		{give: "[TRACE] memberlist: x", wantDrop: true},
		{give: "[INFO] memberlist: Marking eu/a1 as failed, suspect timeout reached (0 peer confirmations)\n", wantLevel: slog.LevelInfo, wantMsg: "Marking eu/a1 as failed, suspect timeout reached (0 peer confirmations)"},
		{give: "[WARN] memberlist: Refuting a dead message (from: eu/a2)\n", wantLevel: slog.LevelWarn, wantMsg: "Refuting a dead message (from: eu/a2)"},
		{give: "[ERR] memberlist: Failed to receive remote state: No installed keys could decrypt the message\n", wantLevel: slog.LevelError, wantMsg: "Failed to receive remote state: No installed keys could decrypt the message"},
		{give: "[ERR] Failed to shutdown transport: x", wantLevel: slog.LevelError, wantMsg: "Failed to shutdown transport: x"},
		{give: "no level here\n", wantLevel: slog.LevelInfo, wantMsg: "no level here"},
		{give: "[NOTICE] memberlist: odd", wantLevel: slog.LevelInfo, wantMsg: "[NOTICE] memberlist: odd"},
		{give: "\n", wantDrop: true},
	}
	for _, tt := range tests {
		level, msg, ok := parseMemberlistLine(tt.give)
		if ok == tt.wantDrop || (ok && (level != tt.wantLevel || msg != tt.wantMsg)) {
			t.Errorf("parseMemberlistLine(%q) = %v, %q, %v; want %v, %q, drop %v", tt.give, level, msg, ok, tt.wantLevel, tt.wantMsg, tt.wantDrop)
		}
	}

	// Through the adapter memberlist's *log.Logger uses.
	var buf testenv.Buffer
	var stopping atomic.Bool
	l := newMemberlistLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), &stopping)
	l.Printf("[DEBUG] memberlist: dropped")
	l.Printf("[WARN] memberlist: kept %d", 1)
	stopping.Store(true)
	l.Printf("[ERR] memberlist: Failed to send gossip: use of closed network connection")
	out := buf.String()
	if strings.Contains(out, "dropped") || !strings.Contains(out, `level=WARN msg="kept 1" component=memberlist`) ||
		!strings.Contains(out, `level=DEBUG msg="Failed to send gossip: use of closed network connection"`) {
		t.Errorf("adapter wrote %q", out)
	}
}
