package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/internal/testenv"
)

// memReading is INFO memory used_memory and MEMORY STATS clients.normal
// (the clients' buffers and structures, which are not the keys' cost).
type memReading struct{ used, clients int64 }

func (m memReading) data() int64 { return m.used - m.clients }

// readMemory reads used_memory and clients.normal once they have settled:
// three readings 50 ms apart whose difference agrees within 1 KiB, or the
// last reading after 3 s. What settles is the server cron's work (active
// rehashing finishing a dict's growth, one dict per tick, and the client
// statistics): the server runs with hz 100, so 100 ms span ten ticks.
func readMemory(t *testing.T, c *redis.Client) memReading {
	t.Helper()
	ctx := context.Background()
	read := func() memReading {
		info, err := c.Info(ctx, "memory").Result()
		if err != nil {
			t.Fatalf("INFO memory: %v", err)
		}
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatalf("used_memory %q: %v", v, err)
				}
				return memReading{used: n, clients: memoryStat(t, c, "clients.normal")}
			}
		}
		t.Fatalf("INFO memory without used_memory:\n%s", info)
		return memReading{}
	}
	prev := read()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(3 * time.Second)
	for agree := 0; time.Now().Before(deadline); {
		<-tick.C
		last := read()
		if d := last.data() - prev.data(); d > -1024 && d < 1024 {
			agree++
		} else {
			agree = 0
		}
		prev = last
		if agree == 2 {
			return last
		}
	}
	t.Logf("memory still moving after 3 s; using %+v", prev)
	return prev
}

// memoryStat reads one field of MEMORY STATS.
func memoryStat(t *testing.T, c *redis.Client, field string) int64 {
	t.Helper()
	v, err := c.Do(context.Background(), "MEMORY", "STATS").Result()
	if err != nil {
		t.Fatalf("MEMORY STATS: %v", err)
	}
	var got any
	switch v := v.(type) {
	case map[any]any:
		got = v[field]
	case []any:
		for i := 0; i+1 < len(v); i += 2 {
			if v[i] == field {
				got = v[i+1]
			}
		}
	}
	n, ok := got.(int64)
	if !ok {
		t.Fatalf("MEMORY STATS %s: %T %v", field, got, got)
	}
	return n
}

// TestMemoryPerKey measures what one key decided to its limit costs in a
// private Redis, against a bare SET of the same key name to an integer (the
// key's TAT in µs) with the same TTL: the store's 24-byte Value must add at
// most 32 bytes per key — one 48-byte allocation where the bare integer
// lives in the key's object (issue 14 set 24 for the 12-byte value of
// 7833642, 16 B; storing the writer's limit, which invariant 3 needs to
// read a state exactly under another limit, takes the value past the
// allocator's 32-byte class). Memory is
// used_memory less the clients' buffers (clients.normal), which depend on
// how many connections the pool opened, not on the keys; both phases start
// right after a FLUSHALL with the connections already open.
func TestMemoryPerKey(t *testing.T) {
	srv := testenv.StartRedis(t, "--hz", "100")
	c := srv.Client()
	ctx := context.Background()
	s, err := New(c, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	const n = 10_000
	const workers = 16
	// T = 6 s, cost = Burst = 10: every key holds a TAT a minute ahead
	// and a TTL of a minute, longer than the test.
	sch := gcra.Steady(gcra.PerMinute(10, 10))
	decideAll := func(keys []gcra.Key) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < len(keys); i += workers {
					r, err := s.Decide(ctx, keys[i], sch, 10)
					if err == nil && (!r.Allowed || r.Remaining != 0) {
						err = fmt.Errorf("key %d: %+v, want admitted to its limit", i, r)
					}
					if err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	flush := func() {
		t.Helper()
		if err := c.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	keys := make([]gcra.Key, n)
	for i := range keys {
		keys[i] = gcra.Key{Tag: fmt.Sprintf("tenant-%05d", i), Name: "api:/search"}
	}
	// Warm up: the script cache, the pool's connections and the allocator's
	// first pages are not per key.
	decideAll(keys[:2000])
	flush()

	before := readMemory(t, c)
	decideAll(keys)
	after := readMemory(t, c)

	// Read back every key: value and TTL, to replay them as bare SETs.
	names := make([]string, n)
	for i, k := range keys {
		names[i] = s.RedisKey(k)
	}
	gets := make([]*redis.StringCmd, n)
	ttls := make([]*redis.DurationCmd, n)
	if _, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, name := range names {
			gets[i] = p.Get(ctx, name)
			ttls[i] = p.PTTL(ctx, name)
		}
		return nil
	}); err != nil {
		t.Fatalf("read back: %v", err)
	}
	values := make([]int64, n)
	pttl := make([]time.Duration, n)
	for i := range names {
		raw, err := gets[i].Bytes()
		if err != nil {
			t.Fatalf("GET %s: %v", names[i], err)
		}
		st, err := gcra.DecodeValue(raw)
		if err != nil {
			t.Fatalf("GET %s: %v", names[i], err)
		}
		values[i], pttl[i] = st.TAT, ttls[i].Val()
		if pttl[i] <= 0 {
			t.Errorf("key %s has PTTL %v, want a TTL", names[i], pttl[i])
		}
	}
	if dbs := c.DBSize(ctx).Val(); dbs != n {
		t.Errorf("DBSIZE %d after %d decisions on distinct keys", dbs, n)
	}
	storeUsage := c.MemoryUsage(ctx, names[0]).Val()
	storeEnc := c.ObjectEncoding(ctx, names[0]).Val()

	flush()
	bareBefore := readMemory(t, c)
	if _, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, name := range names {
			p.Set(ctx, name, values[i], pttl[i])
		}
		return nil
	}); err != nil {
		t.Fatalf("bare SETs: %v", err)
	}
	bareAfter := readMemory(t, c)
	bareUsage := c.MemoryUsage(ctx, names[0]).Val()
	bareEnc := c.ObjectEncoding(ctx, names[0]).Val()

	storePer := float64(after.data()-before.data()) / n
	barePer := float64(bareAfter.data()-bareBefore.data()) / n
	diff := storePer - barePer
	t.Logf("store:       %.1f B/key (raw used_memory %+.1f B/key); MEMORY USAGE of one key %d B, encoding %s",
		storePer, float64(after.used-before.used)/n, storeUsage, storeEnc)
	t.Logf("bare SET PX: %.1f B/key (raw used_memory %+.1f B/key); MEMORY USAGE of one key %d B, encoding %s",
		barePer, float64(bareAfter.used-bareBefore.used)/n, bareUsage, bareEnc)
	t.Logf("difference %+.1f B/key; key %q is %d bytes; bare value %d", diff, names[0], len(names[0]), values[0])
	if diff > 32 {
		t.Errorf("the store costs %.1f B/key more than a bare integer with a TTL, want ≤ 32", diff)
	}
	if storeEnc != "embstr" {
		t.Errorf("stored value encoding %q, want embstr (the Value in the key's object)", storeEnc)
	}
	if storeUsage > bareUsage+32 {
		t.Errorf("MEMORY USAGE of a store key %d B > %d B of the bare key + 32", storeUsage, bareUsage)
	}
}
