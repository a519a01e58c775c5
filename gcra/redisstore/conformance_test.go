package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/internal/testenv"
)

// newTestStore returns a store on the shared Redis with a unique prefix.
func newTestStore(t testing.TB) (*Store, *redis.Client) {
	t.Helper()
	c := testenv.Redis(t)
	cfg := DefaultConfig()
	cfg.Prefix = testenv.Prefix(t)
	testenv.Cleanup(t, c, cfg.Prefix)
	s, err := New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

// vecGen draws random conformance vectors: limits from 1 µs to the maximum
// window, epochs around the 16-bit wrap, effective times around now, stored
// states anywhere a live TAT can be (including packed values near 2^53).
type vecGen struct{ r *rand.Rand }

func (g vecGen) limit() gcra.Limit {
	switch g.r.IntN(10) {
	case 0:
		return gcra.Limit{}
	case 1: // extremes: T near the maximum window, burst 1
		return gcra.FromInterval(gcra.MaxWindowMicros-g.r.Int64N(1000), 1)
	case 2: // T of 1 µs with a large burst
		return gcra.FromInterval(1, 1+g.r.Int64N(1_000_000))
	}
	t := int64(1) << g.r.IntN(31)
	t += g.r.Int64N(t)
	maxB := min(gcra.MaxWindowMicros/t, 2000)
	return gcra.FromInterval(t, 1+g.r.Int64N(maxB))
}

func (g vecGen) epoch() uint64 {
	e := []uint64{0, 1, 65535, 65536, 32767, 32768, 1 << 20}[g.r.IntN(7)]
	return e + uint64(g.r.IntN(3))
}

func (g vecGen) schedule(now int64) gcra.Schedule {
	cur := gcra.Version{Limit: g.limit(), Epoch: g.epoch(), Effective: max(0, now-g.r.Int64N(3*gcra.MaxWindowMicros)+gcra.MaxWindowMicros/2)}
	if g.r.IntN(3) == 0 {
		return gcra.Schedule{Current: cur}
	}
	prev := gcra.Version{Limit: g.limit(), Epoch: cur.Epoch - 1 - uint64(g.r.IntN(3)), Effective: max(0, cur.Effective-g.r.Int64N(gcra.MaxWindowMicros))}
	return gcra.Change(prev, cur)
}

func (g vecGen) state(now int64, s gcra.Schedule) (gcra.State, bool) {
	if g.r.IntN(5) == 0 {
		return gcra.State{}, false
	}
	var tat int64
	switch g.r.IntN(4) {
	case 0:
		tat = now + g.r.Int64N(gcra.MaxWindowMicros)
	case 1:
		tat = now + g.r.Int64N(10_000_000)
	case 2: // the far ends of what can be read back
		tat = now + gcra.MaxWindowMicros - g.r.Int64N(1000)
	default:
		tat = now + 1 + g.r.Int64N(1000)
	}
	tag := []uint16{gcra.EpochTag(s.Current.Epoch), gcra.EpochTag(s.Previous.Epoch), uint16(g.r.Uint32()),
		gcra.EpochTag(s.Current.Epoch) + 1, gcra.EpochTag(s.Current.Epoch) - 40000}[g.r.IntN(5)]
	if s.HasPrevious && s.Current.Effective < now && g.r.IntN(3) == 0 {
		// Written under the previous limit before a change long past, and
		// kept alive by its converted TAT: it is read relative to the
		// change's effective time, maybe days after its TAT.
		tag = gcra.EpochTag(s.Previous.Epoch)
		tat = s.Current.Effective + 1 + g.r.Int64N(gcra.MaxWindowMicros)
	}
	return gcra.State{TAT: tat, Epoch: tag, Exists: true}, true
}

func (g vecGen) now() int64 {
	if g.r.IntN(4) == 0 {
		return g.r.Int64N(1 << 30) // virtual clocks start near zero
	}
	return 1<<50 + g.r.Int64N(1<<52-1<<50) // up to 2^52 µs: packed values span [0, 2^53)
}

// setState stores st for key as the script would have written it.
func setState(t *testing.T, c *redis.Client, key string, st gcra.State, ok bool) {
	t.Helper()
	ctx := context.Background()
	if !ok {
		if err := c.Del(ctx, key).Err(); err != nil {
			t.Fatal(err)
		}
		return
	}
	if err := c.Set(ctx, key, gcra.Pack(st), time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
}

// getState reads key back at now under sch.
func getState(t *testing.T, c *redis.Client, key string, sch *gcra.Schedule, now int64) (gcra.State, int64) {
	t.Helper()
	v, err := c.Get(context.Background(), key).Int64()
	if err == redis.Nil {
		return gcra.State{}, -1
	}
	if err != nil {
		t.Fatal(err)
	}
	return gcra.Unpack(v, gcra.ReadRef(sch, uint16(v&0xffff), now)), v
}

func sameResult(a, b gcra.Result) bool { return a == b }

// TestConformance runs thousands of random vectors through the pure Go core
// and through the Lua script with the same explicit now and stored state,
// and requires identical decisions, remaining, retry-after, reset-after,
// wait, limit and written state.
func TestConformance(t *testing.T) {
	s, c := newTestStore(t)
	ctx := context.Background()
	n := 4000
	if testing.Short() {
		n = 500
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	g := vecGen{rand.New(rand.NewPCG(seed, 7))}
	var allowed, denied, tooLarge, written int
	defer func() {
		t.Logf("%d vectors: %d allowed, %d denied, %d too large, %d writes", n, allowed, denied, tooLarge, written)
		if !t.Failed() && (allowed < n/10 || denied < n/10 || tooLarge < n/50 || written < n/10) {
			t.Errorf("vector mix too thin to trust")
		}
	}()
	for i := range n {
		now := g.now()
		s.testNow = strconv.FormatInt(now, 10)
		kind := g.r.IntN(3)
		nk := 1
		if kind == 2 {
			nk = 2 + g.r.IntN(3)
		}
		checks := make([]gcra.Check, nk)
		states := make([]gcra.State, nk)
		present := make([]bool, nk)
		for j := range checks {
			sch := g.schedule(now)
			checks[j] = gcra.Check{Key: gcra.Key{Tag: "conf", Name: fmt.Sprintf("k%d", j)}, Schedule: sch}
			burst := max(sch.Current.Limit.Burst(), sch.Previous.Limit.Burst())
			checks[j].Cost = g.r.Int64N(burst + 3)
			if g.r.IntN(10) == 0 {
				checks[j].Cost = 0
			}
			st, ok := g.state(now, sch)
			setState(t, c, s.RedisKey(checks[j].Key), st, ok)
			if ok {
				st = gcra.Unpack(gcra.Pack(st), gcra.ReadRef(&sch, st.Epoch, now))
			}
			states[j], present[j] = st, ok
		}

		var want, got []gcra.Result
		var wantNext []gcra.State
		var writes bool
		var goErr, luaErr error
		switch kind {
		case 0:
			nx, w, r, err := gcra.Decide(states[0], now, &checks[0].Schedule, checks[0].Cost)
			want, wantNext, writes, goErr = []gcra.Result{r}, []gcra.State{nx}, w, err
			var lr gcra.Result
			lr, luaErr = s.Decide(ctx, checks[0].Key, checks[0].Schedule, checks[0].Cost)
			got = []gcra.Result{lr}
		case 1:
			sch := &checks[0].Schedule
			wmax := max(sch.Current.Limit.Window(), sch.Previous.Limit.Window())
			maxWait := g.r.Int64N(int64(gcra.MaxWindow-wmax)/1000+1) * 1000
			if g.r.IntN(2) == 0 {
				maxWait = g.r.Int64N(min(int64(gcra.MaxWindow-wmax), 5_000_000_000) + 1)
			}
			maxWait -= maxWait % 1000 // whole µs as Duration/1000
			nx, w, r, err := gcra.Reserve(states[0], now, sch, checks[0].Cost, maxWait/1000)
			want, wantNext, writes, goErr = []gcra.Result{r}, []gcra.State{nx}, w, err
			var lr gcra.Result
			lr, luaErr = s.Reserve(ctx, checks[0].Key, checks[0].Schedule, checks[0].Cost, time.Duration(maxWait))
			got = []gcra.Result{lr}
			if goErr == gcra.ErrWaitTooLong {
				// The store checks maxWait against both limits up front.
				if luaErr != gcra.ErrWaitTooLong {
					t.Fatalf("vector %d: go %v, store %v", i, goErr, luaErr)
				}
				continue
			}
		case 2:
			want = make([]gcra.Result, nk)
			wantNext = make([]gcra.State, nk)
			_, w, err := gcra.DecideAll(now, checks, states, wantNext, want)
			writes, goErr = w, err
			got = make([]gcra.Result, nk)
			_, luaErr = s.DecideAll(ctx, checks, got)
		}
		if (goErr == nil) != (luaErr == nil) {
			t.Fatalf("vector %d: go error %v, store error %v", i, goErr, luaErr)
		}
		if goErr != nil {
			continue
		}
		if writes {
			written++
		}
		for j := range want {
			switch {
			case want[j].Allowed:
				allowed++
			case want[j].TooLarge:
				tooLarge++
			default:
				denied++
			}
			if !sameResult(want[j], got[j]) {
				t.Fatalf("vector %d (kind %d) check %d at now=%d\nschedule %+v\nstate %+v (present %v) cost %d\ngo:  %+v\nlua: %+v",
					i, kind, j, now, checks[j].Schedule, states[j], present[j], checks[j].Cost, want[j], got[j])
			}
			st, raw := getState(t, c, s.RedisKey(checks[j].Key), &checks[j].Schedule, now)
			switch {
			case writes && checks[j].Cost > 0:
				w := wantNext[j]
				if raw < 0 && w.Rested-now < 100_000 {
					break // written with a TTL of a few ms, already expired
				}
				if raw < 0 || st.TAT != w.TAT || st.Epoch != w.Epoch {
					t.Fatalf("vector %d check %d: lua wrote %+v (raw %d), go wants %+v", i, j, st, raw, w)
				}
				// The expiry carries Rested: PX = ceil((Rested − now)/1 ms).
				pttl, err := c.PTTL(ctx, s.RedisKey(checks[j].Key)).Result()
				if err != nil {
					t.Fatal(err)
				}
				wantMS := (w.Rested - now + 999) / 1000
				if got := pttl.Milliseconds(); got > wantMS || got < wantMS-1000 {
					t.Fatalf("vector %d check %d: PTTL %dms, want ceil((Rested−now)/1ms) = %dms (state %+v, now %d)", i, j, got, wantMS, w, now)
				}
			case present[j]:
				if raw != gcra.Pack(states[j]) {
					t.Fatalf("vector %d check %d: state changed from %d to %d without a write", i, j, gcra.Pack(states[j]), raw)
				}
			default:
				if raw >= 0 {
					t.Fatalf("vector %d check %d: lua wrote %d, go writes nothing", i, j, raw)
				}
			}
		}
	}
}
