package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/internal/testenv"
	"github.com/meridian-quota/meridian/region/agent"
)

// TestRedisUnixSocket: redis.network unix — and upstream's
// REDIS_SOCKET_TYPE=unix with REDIS_URL a path — decide on a server that
// listens on a Unix socket.
func TestRedisUnixSocket(t *testing.T) {
	// A short directory: a socket's path is limited to about 100 bytes.
	dir, err := os.MkdirTemp("", "mrd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "redis.sock")
	srv := testenv.StartRedis(t, "--unixsocket", sock, "--unixsocketperm", "700")
	f := newRedisFixture(t)
	rd := f.mustOpen(`network: unix, addr: "` + sock + `"`)
	wantKey(t, srv.Client(), decide(t, rd, "unix-config"), "the socket's server")

	env, err := agent.FromEnv(func(k string) (string, bool) {
		v, ok := map[string]string{"REDIS_SOCKET_TYPE": "unix", "REDIS_URL": sock, "CACHE_KEY_PREFIX": f.prefix}[k]
		return v, ok
	}, nil, "pod")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rd, err = openRedis(ctx, &env.Config.Redis, slog.New(slog.NewTextHandler(f.log, nil)))
	if err != nil {
		t.Fatalf("openRedis from REDIS_SOCKET_TYPE=unix: %v", err)
	}
	defer rd.Close()
	wantKey(t, srv.Client(), decide(t, rd, "unix-env"), "the socket's server, from the environment")
}
