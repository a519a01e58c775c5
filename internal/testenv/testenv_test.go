package testenv

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// recordingTB records the outcome MustOrSkip chooses instead of ending the test.
type recordingTB struct {
	testing.TB
	fatal, skip string
}

func (r *recordingTB) Helper()                        {}
func (r *recordingTB) Fatalf(format string, a ...any) { r.fatal = fmt.Sprintf(format, a...) }
func (r *recordingTB) Skipf(format string, a ...any)  { r.skip = fmt.Sprintf(format, a...) }

func TestMustOrSkip(t *testing.T) {
	tests := []struct {
		name      string
		giveCI    string
		giveErr   error
		wantFatal string
		wantSkip  string
	}{
		{name: "no error in CI", giveCI: "true"},
		{name: "no error outside CI", giveCI: ""},
		{
			name:      "error in CI fails",
			giveCI:    "true",
			giveErr:   errors.New("boom"),
			wantFatal: "thing missing: boom (required when CI=true)",
		},
		{
			name:     "error outside CI skips loudly",
			giveCI:   "",
			giveErr:  errors.New("boom"),
			wantSkip: "SKIP: thing missing: boom; set CI=true to make this a failure",
		},
		{
			name:     "CI other than true skips",
			giveCI:   "1",
			giveErr:  errors.New("boom"),
			wantSkip: "SKIP: thing missing: boom; set CI=true to make this a failure",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(EnvCI, tt.giveCI)
			r := &recordingTB{TB: t}
			MustOrSkip(r, tt.giveErr, "thing missing")
			if r.fatal != tt.wantFatal || r.skip != tt.wantSkip {
				t.Errorf("got fatal %q, skip %q; want fatal %q, skip %q", r.fatal, r.skip, tt.wantFatal, tt.wantSkip)
			}
		})
	}
}

func TestPrefix(t *testing.T) {
	names := []string{
		"plain",
		"with {braces} and spaces",
		"unicode é ✓ / slash",
		strings.Repeat("long", 30),
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			a, b := Prefix(t), Prefix(t)
			if a == b {
				t.Errorf("two calls returned the same prefix %q", a)
			}
			for _, p := range []string{a, b} {
				if strings.ContainsAny(p, "{}") {
					t.Errorf("prefix %q contains a brace", p)
				}
				parts := strings.Split(p, ":")
				if len(parts) != 4 || parts[0] != "mtest" || parts[3] != "" {
					t.Fatalf("prefix %q: want mtest:NAME:RANDOM:", p)
				}
				if n := len(parts[1]); n == 0 || n > maxPrefixName {
					t.Errorf("prefix %q: name part has %d bytes, want 1..%d", p, n, maxPrefixName)
				}
				if strings.Trim(parts[1], "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != "" {
					t.Errorf("prefix %q: name part has characters outside [A-Za-z0-9_-]", p)
				}
				if len(parts[2]) != 8 || strings.Trim(parts[2], "0123456789abcdef") != "" {
					t.Errorf("prefix %q: random part is not 8 hex digits", p)
				}
			}
		})
	}
}

func TestSanitize(t *testing.T) {
	tests := []struct {
		give string
		n    int
		want string
	}{
		{"TestA/sub_case-1", 40, "TestA_sub_case-1"},
		{"a{b}c", 40, "a_b_c"},
		{"é✓x", 40, "__x"},
		{"abcdef", 4, "abcd"},
	}
	for _, tt := range tests {
		if got := sanitize(tt.give, tt.n); got != tt.want {
			t.Errorf("sanitize(%q, %d) = %q, want %q", tt.give, tt.n, got, tt.want)
		}
	}
}

func TestClusterHealthy(t *testing.T) {
	ok := "cluster_state:ok\r\ncluster_slots_assigned:16384\r\ncluster_known_nodes:3\r\n"
	if err := clusterHealthy(ok, 3); err != nil {
		t.Errorf("healthy info rejected: %v", err)
	}
	for _, bad := range []string{
		strings.Replace(ok, "state:ok", "state:fail", 1),
		strings.Replace(ok, "16384", "16000", 1),
		strings.Replace(ok, "known_nodes:3", "known_nodes:2", 1),
		"",
	} {
		if err := clusterHealthy(bad, 3); err == nil {
			t.Errorf("unhealthy info %q accepted", bad)
		}
	}
}

// setKeys writes n keys under prefix through c and returns their names.
func setKeys(ctx context.Context, t *testing.T, c redis.Cmdable, prefix string, n int) []string {
	t.Helper()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%sk%d", prefix, i)
		if err := c.Set(ctx, keys[i], i, time.Minute).Err(); err != nil {
			t.Fatalf("SET %s: %v", keys[i], err)
		}
	}
	return keys
}

// wantGone fails the test unless none of keys exists.
func wantGone(ctx context.Context, t *testing.T, c redis.Cmdable, keys []string) {
	t.Helper()
	for _, k := range keys {
		n, err := c.Exists(ctx, k).Result()
		if err != nil {
			t.Fatalf("EXISTS %s: %v", k, err)
		}
		if n != 0 {
			t.Errorf("key %s survived Cleanup", k)
		}
	}
}

func TestRedisAndCleanup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := Redis(t)
	prefix := Prefix(t)
	other := Prefix(t)
	Cleanup(t, c, other)
	kept := setKeys(ctx, t, c, other, 1)

	var keys []string
	t.Run("writer", func(t *testing.T) {
		Cleanup(t, c, prefix)
		keys = setKeys(ctx, t, c, prefix, 25)
	})
	wantGone(ctx, t, c, keys)
	if n, err := c.Exists(ctx, kept...).Result(); err != nil || n != 1 {
		t.Errorf("key under another prefix: EXISTS = %d, %v; want 1", n, err)
	}
}

func TestStartRedis(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := StartRedis(t, "--maxmemory", "10mb")
	if want := fmt.Sprintf("127.0.0.1:%d", s.Port); s.Addr != want {
		t.Errorf("Addr = %q, want %q", s.Addr, want)
	}
	c := s.Client()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Errorf("GET = %q, %v; want \"v\"", got, err)
	}
	for param, want := range map[string]string{
		"save":       "",
		"appendonly": "no",
		"maxmemory":  "10485760",
	} {
		got, err := c.ConfigGet(ctx, param).Result()
		if err != nil {
			t.Fatalf("CONFIG GET %s: %v", param, err)
		}
		if got[param] != want {
			t.Errorf("CONFIG GET %s = %q, want %q", param, got[param], want)
		}
	}
	if other := StartRedis(t); other.Port == s.Port {
		t.Errorf("two servers share port %d", s.Port)
	}
}

func TestStartCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl := StartCluster(t, 3)
	if len(cl.Addrs) != 3 {
		t.Fatalf("Addrs = %v, want 3 nodes", cl.Addrs)
	}
	c := cl.Client()
	info, err := c.ClusterInfo(ctx).Result()
	if err != nil {
		t.Fatalf("CLUSTER INFO: %v", err)
	}
	if err := clusterHealthy(info, 3); err != nil {
		t.Errorf("cluster not healthy: %v", err)
	}

	// Enough keys to land on every master; Cleanup must reach them all.
	prefix := Prefix(t)
	var keys []string
	t.Run("writer", func(t *testing.T) {
		Cleanup(t, c, prefix)
		keys = setKeys(ctx, t, c, prefix, 60)
		for i, k := range keys {
			got, err := c.Get(ctx, k).Int()
			if err != nil || got != i {
				t.Errorf("GET %s = %d, %v; want %d", k, got, err, i)
			}
		}
		err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			n, err := m.DBSize(ctx).Result()
			if err == nil && n == 0 {
				err = fmt.Errorf("master %s holds no key", m.Options().Addr)
			}
			return err
		})
		if err != nil {
			t.Errorf("keys not spread over the masters: %v", err)
		}
	})
	wantGone(ctx, t, c, keys)
}

func TestStartRedisWithPassword(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := StartRedisWith(t, RedisOptions{Password: "pw-for-the-test"})
	if err := s.Client().Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET through Client (authenticated): %v", err)
	}
	anon := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer anon.Close()
	if err := anon.Get(ctx, "k").Err(); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Errorf("GET without the password: %v, want NOAUTH", err)
	}
}

func TestStartRedisWithTLS(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pki := NewPKI(t)
	s := StartRedisWith(t, RedisOptions{TLS: pki, ClientAuth: true})
	if err := s.Client().Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET over TLS with the client certificate: %v", err)
	}
	noCert := pki.ClientTLS()
	noCert.Certificates = nil
	other := NewPKI(t).ClientTLS()
	other.Certificates = nil
	for name, tc := range map[string]*tls.Config{"no client certificate": noCert, "another CA": other} {
		c := redis.NewClient(&redis.Options{Addr: s.Addr, TLSConfig: tc, MaxRetries: -1, DialerRetries: 1})
		if err := c.Ping(ctx).Err(); err == nil {
			t.Errorf("%s: PING succeeded", name)
		}
		c.Close()
	}
	plain := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialerRetries: 1, ReadTimeout: time.Second})
	defer plain.Close()
	if err := plain.Ping(ctx).Err(); err == nil {
		t.Error("plain TCP to the TLS port: PING succeeded")
	}
}

func TestStartSentinel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := StartSentinel(t, "testmaster")
	if err := s.Master.Client().Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET on the master: %v", err)
	}
	fc := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.MasterName, SentinelAddrs: []string{s.Addr}})
	defer fc.Close()
	if got, err := fc.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Errorf("GET through the Sentinel's master: %q, %v", got, err)
	}
	s.Failover(t)
	if err := s.Master.Client().Set(ctx, "after", "1", 0).Err(); err != nil {
		t.Errorf("SET on the promoted master: %v", err)
	}
}
