package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// sentinelTimeout bounds the wait for a Sentinel to know its master and
// replica, and separately the wait for a failover to complete.
const sentinelTimeout = 30 * time.Second

// Sentinel is a Redis Sentinel deployment started by [StartSentinel] for one
// test: a master, one replica of it and one Sentinel monitoring the master
// under MasterName with quorum 1.
type Sentinel struct {
	// Addr is the Sentinel's address, "127.0.0.1:PORT".
	Addr string
	// MasterName is the name the Sentinel knows the master by.
	MasterName string
	// Master and Replica are the data servers as started; after
	// [Sentinel.Failover] their roles are swapped.
	Master, Replica *Server

	client *redis.SentinelClient
}

// Client returns a client of the Sentinel (SENTINEL commands). It is closed
// when the test ends.
func (s *Sentinel) Client() *redis.SentinelClient { return s.client }

// StartSentinel starts a master, a replica of it (--replicaof) and a
// Sentinel (redis-server --sentinel) monitoring the master as masterName,
// each as in [StartRedis], and returns once the replica's link is up and
// the Sentinel names the master's address and lists the replica (deadline
// 30 s). The Sentinel is stopped first when the test ends, so it never
// fails over a master being shut down. A missing redis-server fails the
// test in CI and skips it elsewhere.
func StartSentinel(t testing.TB, masterName string) *Sentinel {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	MustOrSkip(t, err, "redis-server not found")
	// No diskless-sync delay (5 s by default, to batch replicas): the
	// replica syncs at once, and so does the former master after a
	// failover.
	noDelay := []string{"--repl-diskless-sync-delay", "0"}
	master := StartRedis(t, noDelay...)
	replica := StartRedis(t, append(noDelay, "--replicaof", "127.0.0.1", fmt.Sprint(master.Port))...)
	err = poll(sentinelTimeout, nil, func(ctx context.Context) error {
		info, err := replica.client.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, "master_link_status:up") {
			return errors.New("replica's link to the master is not up")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("testenv: replica %s of %s: %v", replica.Addr, master.Addr, err)
	}

	// A Sentinel rewrites its configuration file, so it gets one of its own.
	conf := filepath.Join(t.TempDir(), "sentinel.conf")
	body := fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]d 1\nsentinel down-after-milliseconds %[1]s 2000\nsentinel failover-timeout %[1]s 10000\n",
		masterName, master.Port)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatalf("testenv: sentinel config: %v", err)
	}
	sn := startServer(t, spec{bin: bin, pre: []string{conf, "--sentinel"}})
	sc := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr})
	t.Cleanup(func() { _ = sc.Close() })
	s := &Sentinel{Addr: sn.Addr, MasterName: masterName, Master: master, Replica: replica, client: sc}
	if err := poll(sentinelTimeout, nil, func(ctx context.Context) error { return s.knows(ctx, master, replica) }); err != nil {
		t.Fatalf("testenv: sentinel %s: %v", sn.Addr, err)
	}
	return s
}

// knows checks that the Sentinel names master as the master and lists
// replica as its replica, neither down.
func (s *Sentinel) knows(ctx context.Context, master, replica *Server) error {
	addr, err := s.client.GetMasterAddrByName(ctx, s.MasterName).Result()
	if err != nil {
		return fmt.Errorf("get-master-addr-by-name: %w", err)
	}
	if got := strings.Join(addr, ":"); got != master.Addr {
		return fmt.Errorf("master is %s, want %s", got, master.Addr)
	}
	reps, err := s.client.Replicas(ctx, s.MasterName).Result()
	if err != nil {
		return fmt.Errorf("replicas: %w", err)
	}
	for _, r := range reps {
		if r["ip"]+":"+r["port"] == replica.Addr && !strings.Contains(r["flags"], "down") && r["master-link-status"] == "ok" {
			return nil
		}
	}
	return fmt.Errorf("replica %s not listed as up: %v", replica.Addr, reps)
}

// Failover makes the Sentinel promote the replica (SENTINEL FAILOVER) and
// returns once it names the former replica as the master and that server
// reports role:master (deadline 30 s). Master and Replica are swapped; the
// Sentinel turns the former master into a replica of the new one soon
// after, on its own schedule.
func (s *Sentinel) Failover(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	err := s.client.Failover(ctx, s.MasterName).Err()
	cancel()
	if err != nil {
		t.Fatalf("testenv: SENTINEL FAILOVER %s: %v", s.MasterName, err)
	}
	s.Master, s.Replica = s.Replica, s.Master
	err = poll(sentinelTimeout, nil, func(ctx context.Context) error {
		info, err := s.Master.client.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, "role:master") {
			return fmt.Errorf("%s is not a master yet", s.Master.Addr)
		}
		addr, err := s.client.GetMasterAddrByName(ctx, s.MasterName).Result()
		if err != nil {
			return fmt.Errorf("get-master-addr-by-name: %w", err)
		}
		if got := strings.Join(addr, ":"); got != s.Master.Addr {
			return fmt.Errorf("master is %s, want %s", got, s.Master.Addr)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("testenv: failover of %s: %v", s.MasterName, err)
	}
}
