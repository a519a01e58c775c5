package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gcra/memstore"
	"pgregory.net/rapid"
)

const ms = int64(time.Millisecond / time.Microsecond)

// clock is a settable virtual clock (µs).
type clock struct{ now atomic.Int64 }

func (c *clock) Now() int64 { return c.now.Load() }

func newStore(t testing.TB, edit func(*memstore.Config)) (*memstore.Store, *clock) {
	t.Helper()
	c := &clock{}
	cfg := memstore.DefaultConfig()
	cfg.Clock = c.Now
	if edit != nil {
		edit(&cfg)
	}
	s, err := memstore.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s, c
}

func intern(t testing.TB, s *memstore.Store, name string) memstore.Handle {
	t.Helper()
	h, err := s.Intern(gcra.Key{Name: name})
	if err != nil {
		t.Fatalf("Intern(%q): %v", name, err)
	}
	return h
}

func TestDecideAtTimeline(t *testing.T) {
	s, _ := newStore(t, nil)
	k := gcra.Key{Tag: "acme", Name: "api/tenant=acme"}
	h, err := s.Intern(k)
	if err != nil {
		t.Fatal(err)
	}
	sch := gcra.Steady(gcra.PerSecond(5, 3)) // T = 200ms, Burst 3
	tests := []struct {
		name          string
		now           int64
		wantAllowed   bool
		wantRemaining int64
		wantRetry     time.Duration
		wantReset     time.Duration
		wantTAT       int64
	}{
		{"t0", 0, true, 2, 0, 200 * time.Millisecond, 200 * ms},
		{"t1", 0, true, 1, 0, 400 * time.Millisecond, 400 * ms},
		{"t2", 0, true, 0, 0, 600 * time.Millisecond, 600 * ms},
		{"t3", 0, false, 0, 200 * time.Millisecond, 600 * time.Millisecond, 600 * ms},
		{"t4", 250 * ms, true, 0, 0, 550 * time.Millisecond, 800 * ms},
		{"t5", 250 * ms, false, 0, 150 * time.Millisecond, 550 * time.Millisecond, 800 * ms},
	}
	for _, tt := range tests {
		r, err := s.DecideAt(h, tt.now, &sch, 1)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if r.Allowed != tt.wantAllowed || r.Remaining != tt.wantRemaining ||
			r.RetryAfter != tt.wantRetry || r.ResetAfter != tt.wantReset || r.TooLarge {
			t.Errorf("%s: got allowed=%v remaining=%d retry=%v reset=%v tooLarge=%v; want %v %d %v %v false",
				tt.name, r.Allowed, r.Remaining, r.RetryAfter, r.ResetAfter, r.TooLarge,
				tt.wantAllowed, tt.wantRemaining, tt.wantRetry, tt.wantReset)
		}
		if st, ok := s.Get(k); !ok || st.TAT != tt.wantTAT {
			t.Errorf("%s: Get = %+v, %v; want TAT %d", tt.name, st, ok, tt.wantTAT)
		}
	}
}

func TestReserveAtTimeline(t *testing.T) {
	s, _ := newStore(t, nil)
	h := intern(t, s, "reserve")
	sch := gcra.Steady(gcra.PerSecond(5, 3))
	maxWait := 300 * ms
	tests := []struct {
		name         string
		now, cost    int64
		wantAllowed  bool
		wantTooLarge bool
		wantWait     time.Duration
		wantRetry    time.Duration
	}{
		{"t0", 0, 3, true, false, 0, 0},
		{"t1", 0, 1, true, false, 200 * time.Millisecond, 0},        // booked: act at 200ms
		{"t2", 0, 1, false, false, 0, 400 * time.Millisecond},       // would wait 400ms > 300ms
		{"t3", 100 * ms, 1, true, false, 300 * time.Millisecond, 0}, // exactly maxWait
		{"t4", 100 * ms, 4, false, true, 0, gcra.Never},             // cost > Burst
		{"t5", 100 * ms, 0, true, false, 300 * time.Millisecond, 0}, // peek: books nothing
	}
	for _, tt := range tests {
		r, err := s.ReserveAt(h, tt.now, &sch, tt.cost, maxWait)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if r.Allowed != tt.wantAllowed || r.TooLarge != tt.wantTooLarge || r.Wait != tt.wantWait || r.RetryAfter != tt.wantRetry {
			t.Errorf("%s: got allowed=%v tooLarge=%v wait=%v retry=%v; want %v %v %v %v",
				tt.name, r.Allowed, r.TooLarge, r.Wait, r.RetryAfter, tt.wantAllowed, tt.wantTooLarge, tt.wantWait, tt.wantRetry)
		}
	}
	// t0 600ms, t1 800ms, t3 1000ms; the denial, the too-large and the peek wrote nothing.
	if st, _ := s.Get(h.Key()); st.TAT != 1000*ms {
		t.Errorf("TAT = %d, want %d", st.TAT, 1000*ms)
	}
}

func TestStoreInterfaceUsesClock(t *testing.T) {
	s, c := newStore(t, nil)
	ctx := context.Background()
	k := gcra.Key{Name: "clocked"}
	sch := gcra.Steady(gcra.PerSecond(5, 3))
	c.now.Store(1_000_000)
	for i := range 3 {
		if r, err := s.Decide(ctx, k, sch, 1); err != nil || !r.Allowed {
			t.Fatalf("decide %d: %+v, %v", i, r, err)
		}
	}
	r, err := s.Decide(ctx, k, sch, 1)
	if err != nil || r.Allowed || r.RetryAfter != 200*time.Millisecond {
		t.Fatalf("4th: %+v, %v; want denied, retry 200ms", r, err)
	}
	c.now.Add(250 * ms)
	r, err = s.Reserve(ctx, k, sch, 1, time.Second)
	if err != nil || !r.Allowed || r.Wait != 0 {
		t.Fatalf("reserve: %+v, %v; want allowed now", r, err)
	}
	r, err = s.Reserve(ctx, k, sch, 1, time.Second)
	if err != nil || !r.Allowed || r.Wait != 150*time.Millisecond {
		t.Fatalf("reserve: %+v, %v; want booked, wait 150ms", r, err)
	}
	if st, ok := s.Get(k); !ok || st.TAT != 1_000_000+1000*ms {
		t.Fatalf("Get = %+v, %v", st, ok)
	}
}

func TestLimitChangeKeepsTokens(t *testing.T) {
	s, _ := newStore(t, nil)
	h := intern(t, s, "change")
	prev := gcra.Version{Limit: gcra.PerSecond(10, 10), Epoch: 7}
	cur := gcra.Version{Limit: gcra.PerSecond(20, 20), Epoch: 8, Effective: 1000 * ms}
	sch := gcra.Change(prev, cur)
	// Before the change: 10 back to back under prev.
	for i := range 10 {
		if r, err := s.DecideAt(h, 0, &sch, 1); err != nil || !r.Allowed {
			t.Fatalf("%d: %+v %v", i, r, err)
		}
	}
	if st, _ := s.Get(h.Key()); st.Epoch != 7 {
		t.Fatalf("epoch %d, want 7", st.Epoch)
	}
	// At the change the key had refilled all 10 tokens under prev; the
	// increase adds capacity and rate, never tokens.
	r, err := s.DecideAt(h, 1000*ms, &sch, 0)
	if err != nil || r.Remaining != 10 {
		t.Fatalf("peek after change: %+v %v; want Remaining 10", r, err)
	}
	if r, err = s.DecideAt(h, 1000*ms, &sch, 1); err != nil || !r.Allowed || r.Remaining != 9 {
		t.Fatalf("after change: %+v %v", r, err)
	}
	if st, _ := s.Get(h.Key()); st.Epoch != 8 {
		t.Fatalf("epoch %d, want 8", st.Epoch)
	}
}

// TestDecideAtConcurrent runs 32 goroutines on 8 shared keys in phases;
// every decision of a phase uses that phase's now, so the admitted count is
// independent of the interleaving and must equal a sequential replay.
func TestDecideAtConcurrent(t *testing.T) {
	const (
		goroutines = 32
		nKeys      = 8
		phases     = 40
		perPhase   = 3 // decisions per goroutine per key per phase
		step       = 1500
	)
	sch := gcra.Steady(gcra.FromInterval(1000, 20))
	s, _ := newStore(t, func(c *memstore.Config) { c.Shards = 4 })
	var hs [nKeys]memstore.Handle
	for k := range hs {
		hs[k] = intern(t, s, "shared-"+strconv.Itoa(k))
	}
	var admitted [nKeys]atomic.Int64
	for p := range phases {
		now := int64(p) * step
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Go(func() {
				for range perPhase {
					for k := range nKeys {
						k := (k + g) % nKeys
						r, err := s.DecideAt(hs[k], now, &sch, 1)
						if err != nil {
							t.Error(err)
							return
						}
						if r.Allowed {
							admitted[k].Add(1)
						}
					}
				}
			})
		}
		wg.Wait()
	}

	// Sequential replay of one key.
	replay, _ := newStore(t, nil)
	h := intern(t, replay, "replay")
	var want int64
	for p := range phases {
		for range goroutines * perPhase {
			r, err := replay.DecideAt(h, int64(p)*step, &sch, 1)
			if err != nil {
				t.Fatal(err)
			}
			if r.Allowed {
				want++
			}
		}
	}
	bound := sch.Current.Limit.Burst() + (phases-1)*step/sch.Current.Limit.IntervalMicros()
	if want != bound {
		t.Fatalf("replay admitted %d, want Burst + elapsed/T = %d", want, bound)
	}
	for k := range admitted {
		if got := admitted[k].Load(); got != want {
			t.Errorf("key %d: admitted %d concurrently, sequential replay admits %d", k, got, want)
		}
	}
}

// TestCompositeConcurrent decides overlapping pairs in both orders from
// many goroutines, alongside single decisions on the store's clock and
// explicit sweeps. Each pair's keys see the same decisions in the same
// order, so their states must stay identical.
func TestCompositeConcurrent(t *testing.T) {
	const (
		goroutines = 16
		nKeys      = 6
		phases     = 30
		step       = 700
	)
	s, c := newStore(t, func(c *memstore.Config) { c.Shards = 8 })
	lim := gcra.Steady(gcra.FromInterval(1000, 5))
	var hs [nKeys]memstore.Handle
	for k := range hs {
		hs[k] = intern(t, s, "pair-"+strconv.Itoa(k))
	}
	// Pairs (0,1), (2,3), (4,5); key i's partner is i^1.
	var admitted [nKeys / 2]atomic.Int64
	ctx := context.Background()
	for p := range phases {
		now := int64(p) * step
		c.now.Store(now)
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Go(func() {
				var out [2]gcra.Result
				checks := []gcra.Check{{Schedule: lim, Cost: 1}, {Schedule: lim, Cost: 1}}
				for i := range 4 * nKeys {
					a := (i + g) % nKeys
					pair := []memstore.Handle{hs[a], hs[a^1]}
					var r gcra.Result
					var err error
					switch i % 3 {
					case 0:
						r, err = s.DecideAllAt(now, pair, checks, out[:])
					case 1:
						ck := []gcra.Check{{Key: hs[a].Key(), Schedule: lim, Cost: 1}, {Key: hs[a^1].Key(), Schedule: lim, Cost: 1}}
						r, err = s.DecideAll(ctx, ck, out[:])
					default:
						s.Sweep(now)
						continue
					}
					if err != nil {
						t.Error(err)
						return
					}
					if r.Allowed {
						admitted[a/2].Add(1)
					}
				}
			})
		}
		wg.Wait()
		// A rested key and a swept one are the same.
		state := func(h memstore.Handle) gcra.State {
			st, ok := s.Get(h.Key())
			if !ok || st.TAT <= now {
				return gcra.State{}
			}
			return st
		}
		for k := 0; k < nKeys; k += 2 {
			if a, b := state(hs[k]), state(hs[k+1]); a != b {
				t.Fatalf("phase %d: pair %d diverged: %+v vs %+v", p, k/2, a, b)
			}
		}
	}
	want := lim.Current.Limit.Burst() + (phases-1)*step/lim.Current.Limit.IntervalMicros()
	for i := range admitted {
		if got := admitted[i].Load(); got != want {
			t.Errorf("pair %d admitted %d, want %d", i, got, want)
		}
	}
}

func TestEvictionBoundsMemory(t *testing.T) {
	const nKeys = 1_000_000
	s, _ := newStore(t, nil)
	shards := memstore.DefaultConfig().Shards
	sch := gcra.Steady(gcra.FromInterval(100, 5)) // rested 100µs after one request
	h0 := intern(t, s, "key-0")
	if r, err := s.DecideAt(h0, 0, &sch, 1); err != nil || !r.Allowed {
		t.Fatal(r, err)
	}
	maxLen := 0
	buf := []byte("key-")
	for i := 1; i < nKeys; i++ {
		buf = strconv.AppendInt(buf[:4], int64(i), 10)
		h, err := s.Intern(gcra.Key{Name: string(buf)})
		if err != nil {
			t.Fatal(err)
		}
		r, err := s.DecideAt(h, int64(i), &sch, 1)
		if err != nil || !r.Allowed {
			t.Fatalf("key %d: %+v, %v", i, r, err)
		}
		if i%4096 == 0 {
			maxLen = max(maxLen, s.Len())
		}
	}
	if limit := 2 * 1024 * shards; maxLen > limit || maxLen > nKeys/10 {
		t.Fatalf("Len peaked at %d with %d distinct keys; want ≤ %d", maxLen, nKeys, limit)
	}
	t.Logf("Len peaked at %d, ends at %d", maxLen, s.Len())

	// key-0 rested long ago and was swept; its handle still works and
	// decides as a rested key does.
	if _, ok := s.Get(h0.Key()); ok {
		t.Fatal("key-0 still held; the test expects it swept")
	}
	now := int64(nKeys + 1000)
	r, err := s.DecideAt(h0, now, &sch, 1)
	if err != nil {
		t.Fatal(err)
	}
	fresh := intern(t, s, "never-seen")
	want, err := s.DecideAt(fresh, now, &sch, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r != want || !r.Allowed || r.Remaining != 4 {
		t.Fatalf("evicted handle decided %+v; a rested key decides %+v", r, want)
	}
	if st, ok := s.Get(h0.Key()); !ok || st.TAT != now+100 {
		t.Fatalf("key-0 after revival: %+v, %v", st, ok)
	}

	// An explicit sweep past every TAT empties the store.
	n := s.Len()
	if got := s.Sweep(now + 1000); got != n || s.Len() != 0 {
		t.Fatalf("Sweep removed %d of %d, Len %d", got, n, s.Len())
	}
}

func TestErrFull(t *testing.T) {
	s, c := newStore(t, func(c *memstore.Config) { c.Shards = 1; c.MaxKeys = 2 })
	ctx := context.Background()
	sch := gcra.Steady(gcra.PerSecond(10, 2)) // T = 100ms
	a := intern(t, s, "a")
	b := intern(t, s, "b")
	if _, err := s.DecideAt(a, 0, &sch, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DecideAt(b, 50*ms, &sch, 1); err != nil {
		t.Fatal(err)
	}
	// Both keys are live (TAT 100ms, 150ms): no room at 60ms.
	c.now.Store(60 * ms)
	if _, err := s.Intern(gcra.Key{Name: "c"}); !errors.Is(err, memstore.ErrFull) {
		t.Fatalf("Intern: %v, want ErrFull", err)
	}
	r, err := s.Decide(ctx, gcra.Key{Name: "c"}, sch, 1)
	if !errors.Is(err, memstore.ErrFull) || r != (gcra.Result{}) {
		t.Fatalf("Decide: %+v, %v; want ErrFull and no decision", r, err)
	}
	out := make([]gcra.Result, 2)
	_, err = s.DecideAll(ctx, []gcra.Check{{Key: gcra.Key{Name: "a"}, Schedule: sch, Cost: 1}, {Key: gcra.Key{Name: "c"}, Schedule: sch, Cost: 1}}, out)
	if !errors.Is(err, memstore.ErrFull) {
		t.Fatalf("DecideAll: %v, want ErrFull", err)
	}
	if st, _ := s.Get(a.Key()); st.TAT != 100*ms || s.Len() != 2 {
		t.Fatalf("a changed to %+v or Len %d", st, s.Len())
	}
	// Once a decision at 120ms shows "a" rested, creating "c" sweeps it.
	if _, err := s.DecideAt(b, 120*ms, &sch, 0); err != nil {
		t.Fatal(err)
	}
	hc, err := s.Intern(gcra.Key{Name: "c"})
	if err != nil {
		t.Fatalf("Intern after rest: %v", err)
	}
	if r, err := s.DecideAt(hc, 120*ms, &sch, 1); err != nil || !r.Allowed {
		t.Fatalf("c: %+v, %v", r, err)
	}
	if _, ok := s.Get(a.Key()); ok {
		t.Fatal("a should have been swept to make room")
	}
	// a's handle now needs a new entry, and there is no room.
	if _, err := s.DecideAt(a, 120*ms, &sch, 1); !errors.Is(err, memstore.ErrFull) {
		t.Fatalf("DecideAt on evicted handle in a full store: %v, want ErrFull", err)
	}
}

func TestBadInput(t *testing.T) {
	s, _ := newStore(t, nil)
	other, _ := newStore(t, nil)
	ctx := context.Background()
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	good := gcra.Steady(gcra.PerSecond(5, 3))
	bad := gcra.Steady(gcra.New(0, time.Second, 3))
	backwards := gcra.Change(gcra.Version{Limit: gcra.PerSecond(5, 3), Effective: 10}, gcra.Version{Limit: gcra.PerSecond(5, 3), Effective: 5})
	k := gcra.Key{Name: "victim"}
	h := intern(t, s, k.Name)
	if _, err := s.DecideAt(h, 0, &good, 2); err != nil {
		t.Fatal(err)
	}
	foreign := intern(t, other, "victim")
	h2 := intern(t, s, "second")
	out := make([]gcra.Result, 2)
	pair := func(a, b gcra.Schedule, ca, cb int64) []gcra.Check {
		return []gcra.Check{{Key: k, Schedule: a, Cost: ca}, {Key: h2.Key(), Schedule: b, Cost: cb}}
	}
	tests := []struct {
		name    string
		call    func() (gcra.Result, error)
		wantErr error // nil: any error
	}{
		{"DecideAt negative cost", func() (gcra.Result, error) { return s.DecideAt(h, 0, &good, -1) }, gcra.ErrNegativeCost},
		{"DecideAt invalid limit", func() (gcra.Result, error) { return s.DecideAt(h, 0, &bad, 1) }, gcra.ErrInvalidLimit},
		{"DecideAt previous after current", func() (gcra.Result, error) { return s.DecideAt(h, 0, &backwards, 1) }, gcra.ErrInvalidLimit},
		{"DecideAt nil schedule", func() (gcra.Result, error) { return s.DecideAt(h, 0, nil, 1) }, nil},
		{"DecideAt zero handle", func() (gcra.Result, error) { return s.DecideAt(memstore.Handle{}, 0, &good, 1) }, nil},
		{"DecideAt foreign handle", func() (gcra.Result, error) { return s.DecideAt(foreign, 0, &good, 1) }, nil},
		{"ReserveAt negative wait", func() (gcra.Result, error) { return s.ReserveAt(h, 0, &good, 1, -1) }, gcra.ErrNegativeWait},
		{"ReserveAt wait too long", func() (gcra.Result, error) { return s.ReserveAt(h, 0, &good, 1, gcra.MaxWindowMicros) }, gcra.ErrWaitTooLong},
		{"ReserveAt negative cost", func() (gcra.Result, error) { return s.ReserveAt(h, 0, &good, -1, 0) }, gcra.ErrNegativeCost},
		{"Decide empty key", func() (gcra.Result, error) { return s.Decide(ctx, gcra.Key{Tag: "t"}, good, 1) }, gcra.ErrEmptyKey},
		{"Decide long key", func() (gcra.Result, error) {
			return s.Decide(ctx, gcra.Key{Name: strings.Repeat("x", gcra.MaxKeyLen+1)}, good, 1)
		}, gcra.ErrKeyTooLong},
		{"Decide canceled", func() (gcra.Result, error) { return s.Decide(canceled, k, good, 1) }, context.Canceled},
		{"Decide invalid limit", func() (gcra.Result, error) { return s.Decide(ctx, k, bad, 1) }, gcra.ErrInvalidLimit},
		{"Reserve negative wait", func() (gcra.Result, error) { return s.Reserve(ctx, k, good, 1, -time.Second) }, gcra.ErrNegativeWait},
		{"Reserve canceled", func() (gcra.Result, error) { return s.Reserve(canceled, k, good, 1, 0) }, context.Canceled},
		{"DecideAll canceled", func() (gcra.Result, error) { return s.DecideAll(canceled, pair(good, good, 1, 1), out) }, context.Canceled},
		{"DecideAll no checks", func() (gcra.Result, error) { return s.DecideAll(ctx, nil, nil) }, gcra.ErrNoChecks},
		{"DecideAll too many", func() (gcra.Result, error) {
			return s.DecideAll(ctx, make([]gcra.Check, gcra.MaxChecks+1), make([]gcra.Result, gcra.MaxChecks+1))
		}, gcra.ErrTooManyChecks},
		{"DecideAll short out", func() (gcra.Result, error) { return s.DecideAll(ctx, pair(good, good, 1, 1), out[:1]) }, nil},
		{"DecideAll negative cost", func() (gcra.Result, error) { return s.DecideAll(ctx, pair(good, good, 1, -1), out) }, gcra.ErrNegativeCost},
		{"DecideAll invalid limit", func() (gcra.Result, error) { return s.DecideAll(ctx, pair(good, bad, 1, 1), out) }, gcra.ErrInvalidLimit},
		{"DecideAll bad key", func() (gcra.Result, error) {
			return s.DecideAll(ctx, []gcra.Check{{Key: k, Schedule: good, Cost: 1}, {Schedule: good, Cost: 1}}, out)
		}, gcra.ErrEmptyKey},
		{"DecideAll duplicate key", func() (gcra.Result, error) {
			return s.DecideAll(ctx, []gcra.Check{{Key: k, Schedule: good, Cost: 1}, {Key: k, Schedule: good, Cost: 1}}, out)
		}, nil},
		{"DecideAllAt handle count", func() (gcra.Result, error) {
			return s.DecideAllAt(0, []memstore.Handle{h}, pair(good, good, 1, 1), out)
		}, nil},
		{"DecideAllAt duplicate handle", func() (gcra.Result, error) {
			return s.DecideAllAt(0, []memstore.Handle{h, h}, pair(good, good, 1, 1), out)
		}, nil},
		{"DecideAllAt zero handle", func() (gcra.Result, error) {
			return s.DecideAllAt(0, []memstore.Handle{h, {}}, pair(good, good, 1, 1), out)
		}, nil},
	}
	before, _ := s.Get(k)
	n := s.Len()
	for _, tt := range tests {
		r, err := tt.call()
		switch {
		case err == nil:
			t.Errorf("%s: no error (result %+v)", tt.name, r)
		case tt.wantErr != nil && !errors.Is(err, tt.wantErr):
			t.Errorf("%s: error %v, want %v", tt.name, err, tt.wantErr)
		case r != gcra.Result{}:
			t.Errorf("%s: result %+v alongside error", tt.name, r)
		}
		if st, _ := s.Get(k); st != before || s.Len() != n {
			t.Errorf("%s: changed the store: %+v → %+v, Len %d → %d", tt.name, before, st, n, s.Len())
		}
	}
	if _, err := s.Intern(gcra.Key{}); !errors.Is(err, gcra.ErrEmptyKey) {
		t.Errorf("Intern empty key: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		give memstore.Config
		want []string // substrings; none means valid
	}{
		{"default", memstore.DefaultConfig(), nil},
		{"one shard", memstore.Config{Clock: memstore.WallClock, Shards: 1, MaxKeys: 1}, nil},
		{"zero", memstore.Config{}, []string{
			"memstore: Clock: must not be nil",
			"memstore: Shards 0: must be a power of two between 1 and 65536",
			"memstore: MaxKeys 0: must be at least 1",
		}},
		{"not a power of two", memstore.Config{Clock: memstore.WallClock, Shards: 3, MaxKeys: -5}, []string{
			"memstore: Shards 3: must be a power of two between 1 and 65536",
			"memstore: MaxKeys -5: must be at least 1",
		}},
		{"too many shards", memstore.Config{Clock: memstore.WallClock, Shards: 1 << 17, MaxKeys: 1 << 20}, []string{
			"memstore: Shards 131072: must be a power of two between 1 and 65536",
		}},
		{"fewer keys than shards", memstore.Config{Clock: memstore.WallClock, Shards: 64, MaxKeys: 10}, []string{
			"memstore: MaxKeys 10: must be at least Shards (64)",
		}},
	}
	for _, tt := range tests {
		err := tt.give.Validate()
		if len(tt.want) == 0 {
			if err != nil {
				t.Errorf("%s: %v", tt.name, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s: no error", tt.name)
			continue
		}
		if got := len(strings.Split(err.Error(), "\n")); got != len(tt.want) {
			t.Errorf("%s: %d problems reported, want %d: %v", tt.name, got, len(tt.want), err)
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q missing from %q", tt.name, w, err)
			}
		}
		if _, nerr := memstore.New(tt.give); nerr == nil || nerr.Error() != err.Error() {
			t.Errorf("%s: New error %v, want %v", tt.name, nerr, err)
		}
	}
}

// TestEvictionBeforeChangeIsExact shows the eviction rule's premise: a key
// rested when its limit changes decides after the change exactly as a
// missing key does.
func TestEvictionBeforeChangeIsExact(t *testing.T) {
	prev := gcra.Version{Limit: gcra.PerSecond(10, 10), Epoch: 1}
	cur := gcra.Version{Limit: gcra.PerSecond(2, 4), Epoch: 2, Effective: 5000 * ms}
	sch := gcra.Change(prev, cur)
	kept, _ := newStore(t, nil)
	dropped, _ := newStore(t, nil)
	hk := intern(t, kept, "k")
	hd := intern(t, dropped, "k")
	for _, s := range []*memstore.Store{kept, dropped} {
		h := hk
		if s == dropped {
			h = hd
		}
		for range 10 {
			if _, err := s.DecideAt(h, 0, &sch, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	// TAT 1s: rested at 2s, before the change at 5s.
	if n := dropped.Sweep(2000 * ms); n != 1 {
		t.Fatalf("swept %d", n)
	}
	for i, now := range []int64{5000 * ms, 5000 * ms, 5100 * ms, 6000 * ms, 6000 * ms, 6000 * ms, 6000 * ms, 6000 * ms} {
		a, err1 := kept.DecideAt(hk, now, &sch, 1)
		b, err2 := dropped.DecideAt(hd, now, &sch, 1)
		if err1 != nil || err2 != nil || a != b {
			t.Fatalf("t%d: kept %+v (%v), dropped %+v (%v)", i, a, err1, b, err2)
		}
	}
}

// TestBadNowKeepsLiveKeys: a now outside gcra's range is refused and does
// not let the shard sweep keys that are still refilling.
func TestBadNowKeepsLiveKeys(t *testing.T) {
	s, _ := newStore(t, nil)
	h := intern(t, s, "k")
	sch := gcra.Steady(gcra.PerSecond(1, 1))
	if r, err := s.DecideAt(h, 1000, &sch, 1); err != nil || !r.Allowed {
		t.Fatalf("first decision: %+v, %v", r, err)
	}
	if _, err := s.DecideAt(h, math.MaxInt64-10, &sch, 1); !errors.Is(err, gcra.ErrBadTime) {
		t.Fatalf("huge now: err %v, want ErrBadTime", err)
	}
	s.Sweep(2000)
	if st, ok := s.Get(h.Key()); !ok || st.TAT != 1_001_000 {
		t.Fatalf("live key lost or changed: %+v, %v", st, ok)
	}
	if r, err := s.DecideAt(h, 2000, &sch, 1); err != nil || r.Allowed {
		t.Fatalf("after the bad now the key must still be spent: %+v, %v", r, err)
	}
}

// DecideAll with one check takes Decide's path: the same results and state
// as the composite path (DecideAllAt), over random sequences.
func TestDecideAllOneCheckMatchesComposite(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		var now int64 = 1_000_000
		clock := func() int64 { return now }
		a, _ := memstore.New(memstore.Config{Clock: clock, Shards: 1, MaxKeys: 10})
		b, _ := memstore.New(memstore.Config{Clock: clock, Shards: 1, MaxKeys: 10})
		lim := gcra.FromInterval(rapid.Int64Range(1, 1000).Draw(rt, "T"), rapid.Int64Range(1, 10).Draw(rt, "burst"))
		k := gcra.Key{Name: "k"}
		h, err := b.Intern(k)
		if err != nil {
			rt.Fatal(err)
		}
		for i := range rapid.IntRange(1, 50).Draw(rt, "n") {
			now += rapid.Int64Range(0, 3000).Draw(rt, fmt.Sprintf("dt%d", i))
			cost := rapid.Int64Range(0, 12).Draw(rt, fmt.Sprintf("cost%d", i))
			checks := []gcra.Check{{Key: k, Schedule: gcra.Steady(lim), Cost: cost}}
			outA, outB := make([]gcra.Result, 1), make([]gcra.Result, 1)
			ra, errA := a.DecideAll(context.Background(), checks, outA)
			rb, errB := b.DecideAllAt(now, []memstore.Handle{h}, checks, outB)
			if (errA == nil) != (errB == nil) || ra != rb || outA[0] != outB[0] {
				rt.Fatalf("step %d: fast path %+v/%+v (%v), composite %+v/%+v (%v)", i, ra, outA[0], errA, rb, outB[0], errB)
			}
		}
	})
}
