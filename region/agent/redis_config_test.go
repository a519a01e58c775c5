package agent

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// redisHead is a valid config up to its redis section.
const redisHead = "region: eu\nagent: eu-1\nregions: [eu]\npolicy: p.yaml\n"

// TestRedisConfigValid: each type loads with its addresses, and an empty
// type and addr mean a single server at DefaultRedisAddr.
func TestRedisConfigValid(t *testing.T) {
	tests := []struct {
		name      string
		give      string
		wantKind  string
		wantAddrs []string
		wantWarn  bool
	}{
		{"defaults", "", RedisSingle, []string{DefaultRedisAddr}, false},
		{"single addr", "redis: {addr: redis-eu:6379, db: 3, pool_size: 40}\n", RedisSingle, []string{"redis-eu:6379"}, false},
		{"explicit single", "redis: {type: single, addr: \"[::1]:6380\"}\n", RedisSingle, []string{"[::1]:6380"}, false},
		{"cluster seeds", "redis: {type: cluster, addrs: [a:7000, b:7001]}\n", RedisCluster, []string{"a:7000", "b:7001"}, false},
		{"cluster one seed in addr", "redis: {type: cluster, addr: a:7000}\n", RedisCluster, []string{"a:7000"}, false},
		{"deprecated cluster: true", "redis: {cluster: true, addr: a:7000}\n", RedisCluster, []string{"a:7000"}, true},
		{"cluster: true with type cluster", "redis: {cluster: true, type: cluster, addrs: [a:7000]}\n", RedisCluster, []string{"a:7000"}, true},
		{"sentinel", "redis: {type: sentinel, addrs: [s1:26379, s2:26379], master_name: mymaster, db: 2}\n", RedisSentinel, []string{"s1:26379", "s2:26379"}, false},
		{"username and password file", "redis: {username: meridian, password_file: pw}\n", RedisSingle, []string{DefaultRedisAddr}, false},
		{"auth_env", "redis: {auth_env: REDIS_AUTH}\n", RedisSingle, []string{DefaultRedisAddr}, false},
		{"tls", "redis: {tls: {enabled: true, ca_file: ca.pem, cert_file: c.pem, key_file: k.pem, server_name: redis.internal}}\n", RedisSingle, []string{DefaultRedisAddr}, false},
		{"tls without verification", "redis: {tls: {enabled: true, insecure_skip_verify: true}}\n", RedisSingle, []string{DefaultRedisAddr}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParseConfig([]byte(redisHead + tt.give))
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Redis.Kind(); got != tt.wantKind {
				t.Errorf("Kind() = %q, want %q", got, tt.wantKind)
			}
			if got := c.Redis.Addresses(); !slices.Equal(got, tt.wantAddrs) {
				t.Errorf("Addresses() = %q, want %q", got, tt.wantAddrs)
			}
			w := c.Warnings()
			if tt.wantWarn != (len(w) == 1 && strings.Contains(w[0], "redis.cluster is deprecated: write redis.type: cluster")) || !tt.wantWarn && len(w) > 0 {
				t.Errorf("Warnings() = %q, want a deprecation warning: %v", w, tt.wantWarn)
			}
		})
	}
}

// TestRedisConfigErrors: every problem of the redis section is reported at
// once, each with its field path.
func TestRedisConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		give string
		want []string
	}{
		{"unknown type", "redis: {type: ring}\n", []string{`redis.type: "ring": want single, cluster or sentinel`}},
		{"single with addrs and master", "redis: {addrs: [a:1], master_name: m}\n", []string{
			"redis.addrs: set with type single: name the server in addr",
			"redis.master_name: set with type single: only type sentinel finds its master by name"}},
		{"bad addresses", "redis: {addr: localhost}\n", []string{`redis.addr: "localhost": want host:port`}},
		{"bad port", "redis: {addr: \"h:99999\"}\n", []string{`redis.addr: "h:99999": want host:port (port "99999" is not a number in [1, 65535])`}},
		{"no host", "redis: {addr: \":6379\"}\n", []string{`redis.addr: ":6379": want host:port (no host)`}},
		{"cluster without seeds, with a db", "redis: {type: cluster, db: 1}\n", []string{
			"redis.addrs: empty: list the Cluster's seed nodes (host:port)",
			"redis.db: 1: a Redis Cluster has only database 0"}},
		{"cluster with addr and addrs", "redis: {type: cluster, addr: a:1, addrs: [b:1]}\n", []string{"redis.addr: set together with redis.addrs"}},
		{"cluster seeds malformed and twice", "redis: {type: cluster, addrs: [a:1, b, a:1]}\n", []string{
			`redis.addrs[1]: "b": want host:port`, `redis.addrs[2]: "a:1": listed twice (also addrs[0])`}},
		{"deprecated cluster with sentinel", "redis: {cluster: true, type: sentinel, addrs: [s:1], master_name: m}\n", []string{
			"redis.cluster: true, but redis.type is sentinel"}},
		{"deprecated cluster with explicit single", "redis: {cluster: true, type: single}\n", []string{
			"redis.cluster: true, but redis.type is single"}},
		{"sentinel without addrs or master, with addr", "redis: {type: sentinel, addr: m:6379}\n", []string{
			`redis.addr: "m:6379": not used with type sentinel`,
			"redis.addrs: empty: list the Sentinels (host:port)",
			"redis.master_name: empty: the name the Sentinels monitor the master under"}},
		{"negative db and pool", "redis: {db: -1, pool_size: -2}\n", []string{
			"redis.db: -1: must not be negative", "redis.pool_size: -2: must not be negative"}},
		{"two password sources", "redis: {password_file: pw, password_env: PW, auth_env: AUTH}\n", []string{
			"redis.password_file: set together with password_env and auth_env: choose one source of the password"}},
		{"username without password", "redis: {username: meridian}\n", []string{`redis.username: "meridian" has no password`}},
		{"username with auth_env", "redis: {username: meridian, auth_env: REDIS_AUTH}\n", []string{
			"redis.username: set together with redis.auth_env: the variable carries the user"}},
		{"username with a space", "redis: {username: \"a b\", password_env: PW}\n", []string{"redis.username: contains whitespace"}},
		{"tls fields without enabled", "redis: {tls: {ca_file: ca.pem, server_name: x}}\n", []string{
			"redis.tls.enabled: false, but ca_file, server_name set: set enabled: true, or remove them"}},
		{"tls half a key pair, CA and no verification", "redis: {tls: {enabled: true, cert_file: c.pem, ca_file: ca.pem, insecure_skip_verify: true}}\n", []string{
			"redis.tls: cert_file and key_file go together",
			"redis.tls.insecure_skip_verify: set together with ca_file"}},
		{"store fields too", "redis: {type: cluster, lanes: 0, timeout: 0s}\n", []string{
			"redis.addrs: empty", "redis.lanes: 0", "redis.timeout: 0s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(redisHead + tt.give))
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("err = %v, want ErrConfig", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("err = %v\nwant it to contain %q", err, w)
				}
			}
		})
	}
}

// TestRedisSecretNotShown: a password written where a variable's name
// belongs is refused without repeating it.
func TestRedisSecretNotShown(t *testing.T) {
	const secret = "hunter2-not-a-name!"
	for _, field := range []string{"password_env", "auth_env"} {
		_, err := ParseConfig([]byte(redisHead + "redis: {" + field + ": \"" + secret + "\"}\n"))
		if err == nil || !strings.Contains(err.Error(), "redis."+field+": not an environment variable name") {
			t.Errorf("%s: err = %v, want it refused", field, err)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("%s: the error shows the value: %v", field, err)
		}
	}
}

// TestRedisConfigPaths: the password and TLS files are relative to the
// config file, like its other files.
func TestRedisConfigPaths(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "agent.yaml")
	body := redisHead + "redis: {password_file: secrets/pw, tls: {enabled: true, ca_file: ca.pem, cert_file: /abs/c.pem, key_file: k.pem}}\n"
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct{ got, want string }{
		{c.Redis.PasswordFile, filepath.Join(dir, "secrets/pw")},
		{c.Redis.TLS.CAFile, filepath.Join(dir, "ca.pem")},
		{c.Redis.TLS.CertFile, "/abs/c.pem"},
		{c.Redis.TLS.KeyFile, filepath.Join(dir, "k.pem")},
	} {
		if f.got != f.want {
			t.Errorf("path %q, want %q", f.got, f.want)
		}
	}
}

// TestRedisCredentials: each source yields the user and password it
// holds, envoyproxy/ratelimit's REDIS_AUTH form split at the first colon;
// a missing or empty source is an error naming the field and the file or
// variable, never the value.
func TestRedisCredentials(t *testing.T) {
	dir := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Setenv("MERIDIAN_TEST_PW", "env-secret")
	t.Setenv("MERIDIAN_TEST_AUTH_PASS", "only-a-password")
	t.Setenv("MERIDIAN_TEST_AUTH_USER", "meridian:pass:with:colons")
	t.Setenv("MERIDIAN_TEST_AUTH_NOPASS", "meridian:")
	t.Setenv("MERIDIAN_TEST_EMPTY", "")
	tests := []struct {
		name               string
		give               RedisConfig
		wantUser, wantPass string
		wantErr            string
	}{
		{"none", RedisConfig{}, "", "", ""},
		{"file, line break dropped", RedisConfig{Username: "u", PasswordFile: file("pw", "file-secret\r\n")}, "u", "file-secret", ""},
		{"file without line break", RedisConfig{PasswordFile: file("pw2", "s3")}, "", "s3", ""},
		{"env", RedisConfig{Username: "u", PasswordEnv: "MERIDIAN_TEST_PW"}, "u", "env-secret", ""},
		{"auth_env password", RedisConfig{AuthEnv: "MERIDIAN_TEST_AUTH_PASS"}, "", "only-a-password", ""},
		{"auth_env user:password", RedisConfig{AuthEnv: "MERIDIAN_TEST_AUTH_USER"}, "meridian", "pass:with:colons", ""},
		{"missing file", RedisConfig{PasswordFile: filepath.Join(dir, "nope")}, "", "", "redis.password_file: open " + filepath.Join(dir, "nope")},
		{"empty file", RedisConfig{PasswordFile: file("empty", "\n")}, "", "", "redis.password_file " + filepath.Join(dir, "empty") + ": empty"},
		{"unset env", RedisConfig{PasswordEnv: "MERIDIAN_TEST_UNSET"}, "", "", "redis.password_env: $MERIDIAN_TEST_UNSET is unset or empty"},
		{"empty auth_env", RedisConfig{AuthEnv: "MERIDIAN_TEST_EMPTY"}, "", "", "redis.auth_env: $MERIDIAN_TEST_EMPTY is unset or empty"},
		{"auth_env user without password", RedisConfig{AuthEnv: "MERIDIAN_TEST_AUTH_NOPASS"}, "", "", `redis.auth_env: $MERIDIAN_TEST_AUTH_NOPASS is "user:" with an empty password`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			user, pass, err := tt.give.Credentials()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				for _, s := range []string{"secret", "meridian:", "only-a-password", "colons"} {
					if strings.Contains(err.Error(), s) {
						t.Errorf("err = %v shows %q", err, s)
					}
				}
				return
			}
			if err != nil || user != tt.wantUser || pass != tt.wantPass {
				t.Errorf("Credentials() = %q, %q, %v; want %q, %q", user, pass, err, tt.wantUser, tt.wantPass)
			}
		})
	}
}

// TestRedisTLSLoad: a disabled section builds nothing; the files' errors
// name the field.
func TestRedisTLSLoad(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if c, err := (RedisTLSConfig{}).Load(); c != nil || err != nil {
		t.Errorf("disabled: %v, %v; want nil, nil", c, err)
	}
	c, err := RedisTLSConfig{Enabled: true, ServerName: "redis.internal"}.Load()
	if err != nil || c.ServerName != "redis.internal" || c.RootCAs != nil || len(c.Certificates) != 0 {
		t.Errorf("enabled, host roots: %+v, %v", c, err)
	}
	for _, tt := range []struct {
		give RedisTLSConfig
		want string
	}{
		{RedisTLSConfig{Enabled: true, CAFile: filepath.Join(dir, "none.pem")}, "redis.tls.ca_file: open "},
		{RedisTLSConfig{Enabled: true, CAFile: notPEM}, "redis.tls.ca_file " + notPEM + ": no PEM certificate in it"},
		{RedisTLSConfig{Enabled: true, CertFile: notPEM, KeyFile: notPEM}, "redis.tls: client certificate " + notPEM},
	} {
		if _, err := tt.give.Load(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Load(%+v) = %v, want %q", tt.give, err, tt.want)
		}
	}
}
