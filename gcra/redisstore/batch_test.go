package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/internal/testenv"
)

// TestBatchExactCounts: 64 goroutines × 200 decisions (decide, reserve with
// maxWait 0, and cost-0 peeks mixed) on 16 keys at a fixed now. Nothing
// refills, so each key admits exactly min(ops, Burst) and stores
// TAT = now + admitted·T: no op lost, doubled, or half applied.
func TestBatchExactCounts(t *testing.T) {
	s, c := newTestStore(t)
	ctx := context.Background()
	now := wallMicros()
	setNow(s, now)
	const workers, opsEach, keys = 64, 200, 16
	const T = int64(10_000_000) // 10 s
	limits := make([]gcra.Schedule, keys)
	for i := range limits {
		limits[i] = gcra.Steady(gcra.FromInterval(T, int64(100+100*i))) // bursts 100…1600 around ~800 ops per key
	}
	key := func(i int) gcra.Key { return gcra.Key{Tag: "k" + strconv.Itoa(i), Name: "n"} }
	type counts struct{ ops, ok, peeks int }
	var (
		mu   sync.Mutex
		per  [keys]counts
		errs []error
		wg   sync.WaitGroup
	)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(w)))
			for range opsEach {
				i := r.IntN(keys)
				var res gcra.Result
				var err error
				kind := r.IntN(10)
				switch {
				case kind == 0:
					res, err = s.Decide(ctx, key(i), limits[i], 0)
				case kind <= 4:
					res, err = s.Reserve(ctx, key(i), limits[i], 1, 0)
					if err == nil && res.Wait != 0 {
						err = fmt.Errorf("reserve with maxWait 0 booked a wait of %v", res.Wait)
					}
				default:
					res, err = s.Decide(ctx, key(i), limits[i], 1)
				}
				mu.Lock()
				switch {
				case err != nil:
					errs = append(errs, err)
				case kind == 0:
					per[i].peeks++
				default:
					per[i].ops++
					if res.Allowed {
						per[i].ok++
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d errors, first: %v", len(errs), errs[0])
	}
	under, over := 0, 0
	for i, cn := range per {
		b := int(limits[i].Current.Limit.Burst())
		if want := min(cn.ops, b); cn.ok != want {
			t.Errorf("key %d (burst %d): %d of %d admitted, want %d", i, b, cn.ok, cn.ops, want)
		}
		if cn.ops < b {
			under++
		} else {
			over++
		}
		v, err := c.Get(ctx, s.RedisKey(key(i))).Bytes()
		if err != nil {
			t.Fatalf("key %d: %v", i, err)
		}
		st, err := gcra.DecodeValue(v)
		if err != nil {
			t.Fatalf("key %d: %v", i, err)
		}
		if got := st.TAT - now; got != int64(cn.ok)*T {
			t.Errorf("key %d: stored TAT now+%dµs, want %d admitted × T = %dµs", i, got, cn.ok, int64(cn.ok)*T)
		}
	}
	t.Logf("%d keys with fewer ops than their burst, %d with more", under, over)
	if under == 0 || over == 0 {
		t.Errorf("the draw did not exercise both sides of min(ops, Burst)")
	}
}

// TestBatchPerKeyOrder: 16 goroutines, each issuing sequential reservations
// on its own key at a fixed now, while 16 more hammer other keys; each
// caller gets back exactly its own answers: waits 0, T, 2T, … with no gap
// or repeat.
func TestBatchPerKeyOrder(t *testing.T) {
	s, _ := newTestStore(t)
	ctx := context.Background()
	setNow(s, wallMicros())
	lim := gcra.FromInterval(10_000_000, 1) // T = 10 s: TTLs outlast the test
	sch := gcra.Steady(lim)
	const queues, hammers, n = 16, 16, 150
	maxWait := time.Duration(n) * lim.Interval()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errc := make(chan error, queues+hammers)
	for h := range hammers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := gcra.Key{Tag: "noise" + strconv.Itoa(h%4), Name: strconv.Itoa(h)}
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := s.Decide(ctx, k, gcra.Steady(gcra.PerSecond(1000, 10)), 1); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	var qwg sync.WaitGroup
	for q := range queues {
		qwg.Add(1)
		go func() {
			defer qwg.Done()
			k := gcra.Key{Tag: "queue" + strconv.Itoa(q%4), Name: strconv.Itoa(q)}
			for i := range n {
				r, err := s.Reserve(ctx, k, sch, 1, maxWait)
				if err != nil {
					errc <- err
					return
				}
				if want := time.Duration(i) * lim.Interval(); !r.Allowed || r.Wait != want {
					errc <- fmt.Errorf("queue %d reservation %d: %+v, want booked with wait %v", q, i, r, want)
					return
				}
			}
		}()
	}
	qwg.Wait()
	close(stop)
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
}

// pausedStore is a store with one lane on a private Redis whose script
// calls can be held with CLIENT PAUSE WRITE, so ops can be queued behind a
// call in flight at will.
type pausedStore struct {
	*Store
	c *redis.Client
}

func newPausedStore(t *testing.T) pausedStore {
	t.Helper()
	srv := testenv.StartRedis(t)
	cfg := DefaultConfig()
	cfg.Lanes = 1
	cfg.Timeout = 10 * time.Second
	s, err := New(srv.Client(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	return pausedStore{s, srv.Client()}
}

func (p pausedStore) pause(t *testing.T) {
	t.Helper()
	if err := p.c.Do(context.Background(), "CLIENT", "PAUSE", 10000, "WRITE").Err(); err != nil {
		t.Fatalf("CLIENT PAUSE: %v", err)
	}
	t.Cleanup(func() { p.unpause(t) })
}

func (p pausedStore) unpause(t *testing.T) {
	t.Helper()
	if err := p.c.Do(context.Background(), "CLIENT", "UNPAUSE").Err(); err != nil {
		t.Errorf("CLIENT UNPAUSE: %v", err)
	}
}

// lane0 reports the single lane's state.
func (p pausedStore) lane0() (busy bool, pending int) {
	l := &p.lanes.fixed[0]
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.busy, len(l.pending)
}

// scriptCalls counts EVALSHA calls the server has executed.
func (p pausedStore) scriptCalls(t *testing.T) int64 {
	t.Helper()
	info, err := p.c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:calls="); ok {
			n, err := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	return 0
}

type outcome struct {
	r   gcra.Result
	err error
}

// start runs a decision on its own goroutine.
func (p pausedStore) start(ctx context.Context, k gcra.Key) <-chan outcome {
	ch := make(chan outcome, 1)
	go func() {
		r, err := p.Decide(ctx, k, gcra.Steady(gcra.PerSecond(5, 3)), 1)
		ch <- outcome{r, err}
	}()
	return ch
}

// queue starts a decision and waits until it is queued behind the call in
// flight, as the lane's pending op number want.
func (p pausedStore) queue(t *testing.T, ctx context.Context, k gcra.Key, want int) <-chan outcome {
	t.Helper()
	ch := p.start(ctx, k)
	if !waitFor(5*time.Second, func() bool { _, n := p.lane0(); return n == want }) {
		t.Fatalf("op on %+v not queued", k)
	}
	return ch
}

func wait(t *testing.T, ch <-chan outcome, what string) outcome {
	t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no answer within 10 s", what)
		return outcome{}
	}
}

// TestBatchCancelQueued: a caller whose context ends while its op is queued
// gets ctx.Err() at once (while the call ahead of it is still held), its op
// is never sent, and the lane goes on serving the others.
func TestBatchCancelQueued(t *testing.T) {
	p := newPausedStore(t)
	ctx := context.Background()
	key := func(n string) gcra.Key { return gcra.Key{Tag: "t", Name: n} }
	calls0 := p.scriptCalls(t)
	p.pause(t)
	first := p.start(ctx, key("first"))
	if !waitFor(5*time.Second, func() bool { busy, _ := p.lane0(); return busy }) {
		t.Fatal("first op never took the lane")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancelled := p.queue(t, cctx, key("cancelled"), 1)
	dctx, dcancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer dcancel()
	expired := p.queue(t, dctx, key("expired"), 2)
	kept := p.queue(t, ctx, key("kept"), 3)
	cancel()

	// Both answer while the server still holds the call ahead of them.
	if o := wait(t, cancelled, "cancelled op"); !errors.Is(o.err, context.Canceled) {
		t.Errorf("cancelled op: %+v, %v; want context.Canceled", o.r, o.err)
	}
	if o := wait(t, expired, "expired op"); !errors.Is(o.err, context.DeadlineExceeded) {
		t.Errorf("expired op: %+v, %v; want context.DeadlineExceeded", o.r, o.err)
	}
	select {
	case o := <-kept:
		t.Fatalf("op answered while the server was paused: %+v, %v", o.r, o.err)
	case o := <-first:
		t.Fatalf("op answered while the server was paused: %+v, %v", o.r, o.err)
	default:
	}

	p.unpause(t)
	for name, ch := range map[string]<-chan outcome{"first": first, "kept": kept} {
		if o := wait(t, ch, name); o.err != nil || !o.r.Allowed {
			t.Errorf("%s: %+v, %v; want allowed", name, o.r, o.err)
		}
	}
	if !waitFor(5*time.Second, func() bool { busy, n := p.lane0(); return !busy && n == 0 }) {
		busy, n := p.lane0()
		t.Fatalf("lane stuck: busy %v, %d pending", busy, n)
	}
	// The abandoned ops were dropped, the kept one went in one more call.
	if got := p.scriptCalls(t) - calls0; got != 2 {
		t.Errorf("%d script calls, want 2 (the first op, then the kept one)", got)
	}
	for _, n := range []string{"cancelled", "expired"} {
		if p.c.Exists(ctx, p.RedisKey(key(n))).Val() != 0 {
			t.Errorf("abandoned op on %q was applied", n)
		}
	}
	if r, err := p.Decide(ctx, key("after"), gcra.Steady(gcra.PerSecond(5, 3)), 1); err != nil || !r.Allowed {
		t.Errorf("decision after the cancellations: %+v, %v", r, err)
	}
	if n := len(p.sem); n != 0 {
		t.Errorf("%d in-flight slots still held", n)
	}
}

// isTimeout reports an error that says the caller's deadline passed.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// TestBatchSaturatedDeadlines: hundreds of callers with 1 ms deadlines on
// the shared Redis. Each gets an answer or a deadline error; afterwards no
// lane is stuck, no in-flight slot is held and a normal call succeeds, on a
// client that cuts reads short at the deadline and on one that does not.
func TestBatchSaturatedDeadlines(t *testing.T) {
	for _, cut := range []bool{false, true} {
		t.Run("ContextTimeoutEnabled="+strconv.FormatBool(cut), func(t *testing.T) {
			shared := testenv.Redis(t)
			c := redis.NewClient(&redis.Options{Addr: shared.Options().Addr, ContextTimeoutEnabled: cut})
			t.Cleanup(func() { _ = c.Close() })
			cfg := DefaultConfig()
			cfg.Prefix = testenv.Prefix(t)
			cfg.MaxInFlight = 64
			testenv.Cleanup(t, c, cfg.Prefix)
			s, err := New(c, cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			sch := gcra.Steady(gcra.PerSecond(1000, 100))
			const callers, each = 200, 10
			var (
				mu           sync.Mutex
				ok, timeouts int
				others       []error
				wg           sync.WaitGroup
			)
			for g := range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range each {
						cctx, cancel := context.WithTimeout(ctx, time.Millisecond)
						_, err := s.Decide(cctx, gcra.Key{Tag: strconv.Itoa(g % 8), Name: strconv.Itoa(i)}, sch, 1)
						cancel()
						mu.Lock()
						switch {
						case err == nil:
							ok++
						case isTimeout(err):
							timeouts++
						default:
							others = append(others, err)
						}
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			t.Logf("%d answered, %d deadline errors", ok, timeouts)
			for _, err := range others {
				t.Errorf("error that is not the deadline: %v", err)
			}
			if !waitFor(5*time.Second, func() bool { return lanesIdle(s) }) {
				t.Fatal("a lane is still busy or holds ops after every caller returned")
			}
			if n := len(s.sem); n != 0 {
				t.Errorf("%d in-flight slots still held", n)
			}
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if r, err := s.Decide(cctx, gcra.Key{Tag: "after", Name: "x"}, sch, 1); err != nil || !r.Allowed {
				t.Errorf("decision after the storm: %+v, %v", r, err)
			}
		})
	}
}

// lanesIdle reports whether every fixed lane is idle and empty.
func lanesIdle(s *Store) bool {
	for i := range s.lanes.fixed {
		l := &s.lanes.fixed[i]
		l.mu.Lock()
		idle := !l.busy && len(l.pending) == 0
		l.mu.Unlock()
		if !idle {
			return false
		}
	}
	return true
}

// TestBatchIsolation: ops coalesced into one script call succeed or fail on
// their own. A key holding malformed state fails only its own op; the ops
// batched with it are answered and applied normally.
func TestBatchIsolation(t *testing.T) {
	tests := []struct {
		name  string
		plant func(ctx context.Context, c *redis.Client, key string) error
	}{
		{"string that is not a state", func(ctx context.Context, c *redis.Client, key string) error {
			return c.Set(ctx, key, "garbage", 0).Err()
		}},
		{"key of another type", func(ctx context.Context, c *redis.Client, key string) error {
			return c.RPush(ctx, key, "x").Err()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPausedStore(t)
			ctx := context.Background()
			key := func(n string) gcra.Key { return gcra.Key{Tag: "t", Name: n} }
			if err := tt.plant(ctx, p.c, p.RedisKey(key("bad"))); err != nil {
				t.Fatal(err)
			}
			calls0 := p.scriptCalls(t)
			p.pause(t)
			first := p.start(ctx, key("first"))
			if !waitFor(5*time.Second, func() bool { busy, _ := p.lane0(); return busy }) {
				t.Fatal("first op never took the lane")
			}
			before := p.queue(t, ctx, key("before"), 1)
			bad := p.queue(t, ctx, key("bad"), 2)
			after := p.queue(t, ctx, key("after"), 3)
			p.unpause(t)

			for name, ch := range map[string]<-chan outcome{"first": first, "before": before, "after": after} {
				o := wait(t, ch, name)
				if o.err != nil || !o.r.Allowed {
					t.Errorf("%s: %+v, %v; want allowed (batched with a malformed key)", name, o.r, o.err)
				}
				if p.c.Exists(ctx, p.RedisKey(key(name))).Val() != 1 {
					t.Errorf("%s: not written", name)
				}
			}
			if o := wait(t, bad, "bad"); !errors.Is(o.err, ErrMalformedState) {
				t.Errorf("malformed key: %+v, %v; want ErrMalformedState", o.r, o.err)
			}
			if got := p.scriptCalls(t) - calls0; got != 2 {
				t.Errorf("%d script calls, want 2: the first op, then the three queued ops in one batch", got)
			}
		})
	}
}
