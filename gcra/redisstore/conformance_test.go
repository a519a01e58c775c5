package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/internal/testenv"
	"github.com/meridian-quota/meridian/rebalance"
)

// newTestStore returns a store on the shared Redis with a unique prefix.
func newTestStore(t testing.TB) (*Store, *redis.Client) {
	return newFormatStore(t, FormatValue)
}

// newFormatStore is newTestStore writing in format f.
func newFormatStore(t testing.TB, f Format) (*Store, *redis.Client) {
	t.Helper()
	c := testenv.Redis(t)
	cfg := DefaultConfig()
	cfg.Prefix = testenv.Prefix(t)
	cfg.WriteFormat = f
	testenv.Cleanup(t, c, cfg.Prefix)
	s, err := New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

// Periods of the limits the vectors draw, envoyproxy/ratelimit's units
// (a month of 30 days, a year of 365).
var vecPeriods = []time.Duration{time.Second, time.Minute, time.Hour, 24 * time.Hour,
	7 * 24 * time.Hour, 30 * 24 * time.Hour, 365 * 24 * time.Hour}

// vecGen draws random conformance vectors: limits from 1 µs to the maximum
// window — among them regions' shares (1 % to 100 %) of limits with periods
// up to a year —, epochs around the 16- and 40-bit wraps, effective times
// around now, and stored states anywhere a live state can be: TATs ahead of
// now by up to the window, behind now by up to the key's time to live,
// written under the previous limit of a change long past or under a limit
// two versions back, in the exact Value (with its writer's limit: the
// limit its epoch names for the reader, or another) or the forms of older
// releases (the 12-byte value, the packed integer).
type vecGen struct {
	r      *rand.Rand
	window int64 // the longest window drawn: gcra.MaxWindowMicros, or V1MaxWindow for the packed format
}

func (g vecGen) limit() gcra.Limit {
	switch g.r.IntN(10) {
	case 0:
		return gcra.Limit{}
	case 1: // extremes: T near the maximum window, burst 1
		return gcra.FromInterval(g.window-g.r.Int64N(1000), 1)
	case 2: // T of 1 µs with a large burst
		return gcra.FromInterval(1, 1+g.r.Int64N(1_000_000))
	case 3, 4, 5: // a region's share of a policy limit
		return g.share()
	}
	t := int64(1) << g.r.IntN(40)
	t += g.r.Int64N(t)
	maxB := min(g.window/t, 2000)
	if maxB < 1 {
		return gcra.FromInterval(g.window, 1)
	}
	return gcra.FromInterval(t, 1+g.r.Int64N(maxB))
}

// share is RegionalLimit of a share in [1 %, 100 %] of rate per period with
// a burst of 1, the rate, or anything between.
func (g vecGen) share() gcra.Limit {
	period := vecPeriods[g.r.IntN(len(vecPeriods))]
	rate := []int64{1, 7, 100, 1000, 10_000}[g.r.IntN(5)]
	burst := []int64{1, rate, 1 + g.r.Int64N(rate)}[g.r.IntN(3)]
	global := gcra.New(rate, period, burst)
	if global.Validate() != nil {
		global = gcra.FromInterval(int64(period/time.Microsecond)/rate, burst)
	}
	ppm := uint32(10_000 + g.r.IntN(990_001))
	l := rebalance.RegionalLimit(global, ppm, max(1, burst*int64(ppm)/rebalance.PPM))
	if l.Burst()*l.IntervalMicros() > g.window {
		return gcra.FromInterval(g.window/l.Burst(), l.Burst())
	}
	return l
}

func (g vecGen) epoch() uint64 {
	e := []uint64{0, 1, 65535, 65536, 32767, 32768, 1 << 20, 1<<39 - 1, 1 << 39, 1<<40 - 1, 1 << 40, 1 << 45}[g.r.IntN(12)]
	return e + uint64(g.r.IntN(3))
}

// span is the scale of the time offsets drawn around now.
func (g vecGen) span() int64 { return min(g.window, 40*24*3600*1_000_000) }

func (g vecGen) schedule(now int64) gcra.Schedule {
	sp := g.span()
	clamp := func(t int64) int64 { return min(max(0, t), gcra.MaxTime-1) }
	cur := gcra.Version{Limit: g.limit(), Epoch: g.epoch(), Effective: clamp(now - g.r.Int64N(3*sp) + sp/2)}
	if g.r.IntN(3) == 0 {
		return gcra.Schedule{Current: cur}
	}
	prev := gcra.Version{Limit: g.limit(), Epoch: cur.Epoch - 1 - uint64(g.r.IntN(3)), Effective: clamp(cur.Effective - g.r.Int64N(sp))}
	return gcra.Change(prev, cur)
}

// stored is one key's state as a vector stores it.
type stored struct {
	st     gcra.State
	rested int64 // the key's expiry
	packed bool  // written in gcra.PackV1's format
	v12    bool  // written in gcra.EncodeValueV2's format (no writer's limit)
	ok     bool  // the key exists
}

func (g vecGen) state(now int64, s gcra.Schedule) stored {
	if g.r.IntN(5) == 0 {
		return stored{}
	}
	var tat int64
	w := max(s.Current.Limit.Window(), s.Previous.Limit.Window(), time.Millisecond)
	window := int64(w / time.Microsecond)
	switch g.r.IntN(5) {
	case 0:
		tat = now + g.r.Int64N(window)
	case 1:
		tat = now + g.r.Int64N(10_000_000)
	case 2: // the far end of what can be written
		tat = now + g.window - g.r.Int64N(1000)
	case 3: // behind now, kept alive by its expiry (below)
		tat = now - g.r.Int64N(1<<37-1<<28)
	default:
		tat = now + 1 + g.r.Int64N(1000)
	}
	cur := gcra.EpochTag(s.Current.Epoch)
	tag := []uint64{cur, gcra.EpochTag(s.Previous.Epoch), gcra.EpochTag(g.r.Uint64()),
		gcra.EpochTag(cur + 1), gcra.EpochTag(cur - 40000), gcra.EpochTag(cur - 8)}[g.r.IntN(6)]
	if s.HasPrevious && s.Current.Effective < now && g.r.IntN(3) == 0 {
		// Written under the previous limit before a change long past, and
		// kept alive by its converted TAT: read maybe days after its TAT.
		tag = gcra.EpochTag(s.Previous.Epoch)
		tat = s.Current.Effective + 1 + g.r.Int64N(min(window, now-s.Current.Effective+1))
	}
	tat = min(max(tat, 0), gcra.MaxTAT)
	v := stored{st: gcra.State{TAT: tat, Epoch: tag, Exists: true}, ok: true, packed: g.r.IntN(3) == 0}
	if !v.packed {
		v.v12 = g.r.IntN(3) == 0
	}
	if !v.packed && !v.v12 {
		// The writer's limit: the one the tag names for this reader, or
		// another (a sibling's epoch slot, a skipped version).
		w := []gcra.Limit{s.Current.Limit, s.Previous.Limit, g.limit()}[g.r.IntN(3)]
		if w.Validate() == nil && !w.IsZero() {
			v.st.T, v.st.Burst = w.IntervalMicros(), w.Burst()
		}
	}
	// The expiry is never before the TAT, and lies within 2^37 µs of it
	// (less a margin) for a packed state, which is read below it. It is at
	// least 2 s away, so the key outlives the vector on the server's clock.
	lo := max(tat, now+2_000_000)
	hi := lo + g.r.Int64N(3_600_000_000)
	if v.packed {
		hi = min(hi, tat+1<<37-1<<28)
		if hi < lo {
			v.st.TAT = now - g.r.Int64N(1<<30) // too far behind for its format: bring it closer
			lo, hi = now+2_000_000, now+2_000_000+g.r.Int64N(3_600_000_000)
		}
	}
	v.rested = lo + g.r.Int64N(hi-lo+1)
	return v
}

func (g vecGen) now() int64 {
	if g.r.IntN(4) == 0 {
		return g.r.Int64N(1 << 30) // virtual clocks start near zero
	}
	return 1<<50 + g.r.Int64N(1<<52-1<<50) // up to 2^52 µs
}

// nextVersion is sch after the region's share of the key changes to l (a
// new table row version), effective at eff, as a node's schedule does: the
// limit in force at now becomes the previous one.
func nextVersion(sch gcra.Schedule, l gcra.Limit, version uint64, now, eff int64) gcra.Schedule {
	prev := sch.Current
	if sch.HasPrevious && now < sch.Current.Effective {
		prev = sch.Previous
	}
	return gcra.Change(prev, gcra.Version{Limit: l, Epoch: 4*version + 4, Effective: eff})
}

// expireAt keeps a key's expiry on a test's virtual clock: at now, the key
// expiring at expiry (µs) is deleted if that has passed, and given the PX
// left otherwise. It reports whether the key lives on.
func expireAt(t *testing.T, c *redis.Client, key string, expiry, now int64) bool {
	t.Helper()
	ctx := context.Background()
	if expiry <= now {
		if err := c.Del(ctx, key).Err(); err != nil {
			t.Fatal(err)
		}
		return false
	}
	if err := c.PExpire(ctx, key, pxOf(expiry, now)).Err(); err != nil {
		t.Fatal(err)
	}
	return true
}

// pxOf is the PX the script sets for a state rested at rested, written at
// now: ceil((rested − now)/1 ms).
func pxOf(rested, now int64) time.Duration {
	return time.Duration((rested-now+999)/1000) * time.Millisecond
}

// setState stores v for key as a store would have written it at now, and
// returns the state the pure core is to read: the Value as is, a packed
// state as gcra.UnpackV1 reads it below its expiry.
func setState(t *testing.T, c *redis.Client, key string, v stored, sch *gcra.Schedule, now int64) gcra.State {
	t.Helper()
	ctx := context.Background()
	if !v.ok {
		if err := c.Del(ctx, key).Err(); err != nil {
			t.Fatal(err)
		}
		return gcra.State{}
	}
	px := pxOf(v.rested, now)
	if v.packed {
		if err := c.Set(ctx, key, gcra.PackV1(v.st), px).Err(); err != nil {
			t.Fatal(err)
		}
		return gcra.UnpackV1(gcra.PackV1(v.st), now+px.Microseconds()+gcra.V1ExpirySlack, sch)
	}
	if v.v12 {
		val := gcra.EncodeValueV2(v.st)
		if err := c.Set(ctx, key, val[:], px).Err(); err != nil {
			t.Fatal(err)
		}
		st := v.st
		st.T, st.Burst = 0, 0
		return st
	}
	val := gcra.EncodeValue(v.st)
	if err := c.Set(ctx, key, val[:], px).Err(); err != nil {
		t.Fatal(err)
	}
	return v.st
}

// rawState returns key's stored bytes and PTTL; nil when it does not
// exist.
func rawState(t *testing.T, c *redis.Client, key string) ([]byte, time.Duration) {
	t.Helper()
	ctx := context.Background()
	raw, err := c.Get(ctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, 0
	}
	if err != nil {
		t.Fatal(err)
	}
	pttl, err := c.PTTL(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return raw, pttl
}

// encoded is the bytes a store writing in format f stores for st.
func encoded(st gcra.State, f Format) []byte {
	switch f {
	case FormatPacked:
		return []byte(strconv.FormatInt(gcra.PackV1(st), 10))
	case FormatValue12:
		v := gcra.EncodeValueV2(st)
		return v[:]
	}
	v := gcra.EncodeValue(st)
	return v[:]
}

// readBack is st as a store writing in format f reads it back: the forms
// of older releases do not keep the writer's limit.
func readBack(st gcra.State, f Format) gcra.State {
	if f != FormatValue {
		st.T, st.Burst = 0, 0
	}
	return st
}

// formats is every write format, the default first.
var formats = []Format{FormatValue, FormatValue12, FormatPacked}

func sameResult(a, b gcra.Result) bool { return a == b }

// TestConformance runs random vectors through the pure Go core and through
// the Lua script with the same explicit now and stored state, in both write
// formats, and requires identical decisions, remaining, retry-after,
// reset-after, wait and limit, and the very bytes and expiry the core's
// state encodes to.
func TestConformance(t *testing.T) {
	for _, f := range formats {
		t.Run(f.String(), func(t *testing.T) { conformance(t, f) })
	}
}

func conformance(t *testing.T, f Format) {
	s, c := newFormatStore(t, f)
	ctx := context.Background()
	n := 10_000
	if f == FormatPacked {
		n = 4_000
	}
	if testing.Short() {
		n = 500
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	g := vecGen{r: rand.New(rand.NewPCG(seed, 7)), window: gcra.MaxWindowMicros}
	if f == FormatPacked {
		g.window = gcra.V1MaxWindow
	}
	var allowed, denied, tooLarge, written, packedRead, behind, foreign int
	defer func() {
		t.Logf("%d vectors: %d allowed, %d denied, %d too large, %d writes; %d states read from the packed format, %d with a TAT behind now, %d written under another limit than their epoch names",
			n, allowed, denied, tooLarge, written, packedRead, behind, foreign)
		if !t.Failed() && (allowed < n/10 || denied < n/10 || tooLarge < n/50 || written < n/10 || packedRead < n/20 || behind < n/20 || foreign < n/20) {
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
		sets := make([]stored, nk)
		for j := range checks {
			sch := g.schedule(now)
			checks[j] = gcra.Check{Key: gcra.Key{Tag: "conf", Name: fmt.Sprintf("k%d", j)}, Schedule: sch}
			burst := max(sch.Current.Limit.Burst(), sch.Previous.Limit.Burst())
			checks[j].Cost = g.r.Int64N(burst + 3)
			if g.r.IntN(10) == 0 {
				checks[j].Cost = 0
			}
			sets[j] = g.state(now, sch)
			states[j] = setState(t, c, s.RedisKey(checks[j].Key), sets[j], &checks[j].Schedule, now)
			if sets[j].ok && states[j].TAT != sets[j].st.TAT {
				t.Fatalf("vector %d check %d: the packed state %+v reads back as %+v", i, j, sets[j].st, states[j])
			}
			if sets[j].ok && sets[j].packed {
				packedRead++
			}
			if sets[j].ok && sets[j].st.TAT < now {
				behind++
			}
			if w := states[j]; w.T != 0 && (w.T != sch.Current.Limit.IntervalMicros() || w.Burst != sch.Current.Limit.Burst()) {
				foreign++
			}
		}
		// What the pure core decides under: the packed format cuts limits
		// above its window.
		goChecks := append([]gcra.Check(nil), checks...)
		if f == FormatPacked {
			packedLimits(goChecks)
		}

		var want, got []gcra.Result
		var wantNext []gcra.State
		var writes bool
		var goErr, luaErr error
		switch kind {
		case 0:
			nx, w, r, err := gcra.Decide(states[0], now, &goChecks[0].Schedule, checks[0].Cost)
			want, wantNext, writes, goErr = []gcra.Result{r}, []gcra.State{nx}, w, err
			var lr gcra.Result
			lr, luaErr = s.Decide(ctx, checks[0].Key, checks[0].Schedule, checks[0].Cost)
			got = []gcra.Result{lr}
		case 1:
			sch := &goChecks[0].Schedule
			wmax := max(sch.Current.Limit.Window(), sch.Previous.Limit.Window())
			room := time.Duration(g.window)*time.Microsecond - wmax
			maxWait := time.Duration(g.r.Int64N(int64(room)/1000+1)) * time.Microsecond
			if g.r.IntN(2) == 0 {
				maxWait = time.Duration(g.r.Int64N(min(int64(room), 5_000_000_000)/1000+1)) * time.Microsecond
			}
			nx, w, r, err := gcra.Reserve(states[0], now, sch, checks[0].Cost, maxWait.Microseconds())
			want, wantNext, writes, goErr = []gcra.Result{r}, []gcra.State{nx}, w, err
			var lr gcra.Result
			lr, luaErr = s.Reserve(ctx, checks[0].Key, checks[0].Schedule, checks[0].Cost, maxWait)
			got = []gcra.Result{lr}
			if errors.Is(goErr, gcra.ErrWaitTooLong) || errors.Is(luaErr, gcra.ErrWaitTooLong) {
				// The store checks maxWait against both limits up front (and,
				// packed, against the original limits' windows).
				if !errors.Is(luaErr, gcra.ErrWaitTooLong) {
					t.Fatalf("vector %d: go %v, store %v", i, goErr, luaErr)
				}
				continue
			}
		case 2:
			want = make([]gcra.Result, nk)
			wantNext = make([]gcra.State, nk)
			_, w, err := gcra.DecideAll(now, goChecks, states, wantNext, want)
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
				t.Fatalf("vector %d (kind %d) check %d at now=%d\nschedule %+v\nstate %+v (%+v) cost %d\ngo:  %+v\nlua: %+v",
					i, kind, j, now, goChecks[j].Schedule, states[j], sets[j], checks[j].Cost, want[j], got[j])
			}
			raw, pttl := rawState(t, c, s.RedisKey(checks[j].Key))
			switch {
			case writes && wantNext[j] != states[j]:
				w := wantNext[j]
				if raw == nil && w.Rested-now < 100_000 {
					break // written with a TTL of a few ms, already expired
				}
				if string(raw) != string(encoded(w, f)) {
					t.Fatalf("vector %d check %d: lua wrote %q, go's state %+v encodes to %q", i, j, raw, w, encoded(w, f))
				}
				// The expiry carries Rested: PX = ceil((Rested − now)/1 ms).
				wantMS := pxOf(w.Rested, now).Milliseconds()
				if got := pttl.Milliseconds(); got > wantMS || got < wantMS-1000 {
					t.Fatalf("vector %d check %d: PTTL %dms, want ceil((Rested−now)/1ms) = %dms (state %+v, now %d)", i, j, got, wantMS, w, now)
				}
			case sets[j].ok:
				var want []byte
				switch {
				case sets[j].packed:
					want = encoded(sets[j].st, FormatPacked)
				case sets[j].v12:
					want = encoded(sets[j].st, FormatValue12)
				default:
					want = encoded(sets[j].st, FormatValue)
				}
				if string(raw) != string(want) {
					t.Fatalf("vector %d check %d: state changed from %q to %q without a write", i, j, want, raw)
				}
			default:
				if raw != nil {
					t.Fatalf("vector %d check %d: lua wrote %q, go writes nothing", i, j, raw)
				}
			}
		}
	}
}

// TestConformanceTimeline decides random keys over a long virtual
// timeline in which their regional limits change again and again — shares
// of limits with periods up to a month, 1 % to 100 % —, the pure core
// keeping each key's exact state from its own writes (never read back from
// Redis), so every state is read under schedules that came after the one
// that wrote it: two or more versions later, after idle gaps of minutes to
// weeks, with TATs far behind now. Every result must be identical and every
// stored value must be the bytes the core's state encodes to. The keys'
// expiries follow the virtual clock (the test re-sets each key's PX to
// its Rested before each step), as they would on the server's TIME.
func TestConformanceTimeline(t *testing.T) {
	for _, f := range formats {
		t.Run(f.String(), func(t *testing.T) { timeline(t, f) })
	}
}

func timeline(t *testing.T, f Format) {
	s, c := newFormatStore(t, f)
	ctx := context.Background()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 11))
	g := vecGen{r: r, window: gcra.MaxWindowMicros}
	maxGap := int64(14 * 24 * 3600 * 1_000_000)
	if f == FormatPacked {
		g.window, maxGap = gcra.V1MaxWindow, 6*3600*1_000_000
	}
	const keys = 6
	steps := 3000
	if testing.Short() {
		steps = 300
	}
	type key struct {
		k       gcra.Key
		sch     gcra.Schedule
		version uint64
		st      gcra.State
	}
	now := wallMicros()
	ks := make([]*key, keys)
	for i := range ks {
		l := g.share()
		ks[i] = &key{k: gcra.Key{Tag: "tl", Name: strconv.Itoa(i)},
			sch: gcra.Schedule{Current: gcra.Version{Limit: l, Epoch: 4, Effective: now - 1}}}
	}
	var decided, changes, oldState int
	for step := range steps {
		// Time moves on: mostly a little, sometimes a long idle gap.
		switch r.IntN(10) {
		case 0:
			now += r.Int64N(maxGap)
		case 1, 2:
			now += r.Int64N(3_600_000_000)
		default:
			now += r.Int64N(10_000_000)
		}
		kk := ks[r.IntN(keys)]
		if r.IntN(3) == 0 {
			kk.version++
			kk.sch = nextVersion(kk.sch, g.share(), kk.version, now, now+r.Int64N(5_000_000))
			changes++
		}
		name := s.RedisKey(kk.k)
		if kk.st.Exists {
			if !expireAt(t, c, name, kk.st.Rested, now) {
				kk.st = gcra.State{}
			}
			if kk.st.Exists && kk.st.Epoch != gcra.EpochTag(kk.sch.Current.Epoch) &&
				(!kk.sch.HasPrevious || kk.st.Epoch != gcra.EpochTag(kk.sch.Previous.Epoch)) {
				oldState++
			}
		}
		sch := kk.sch
		if f == FormatPacked {
			one := []gcra.Check{{Schedule: sch}}
			packedLimits(one)
			sch = one[0].Schedule
		}
		cost := r.Int64N(max(sch.Current.Limit.Burst(), 1)/3 + 2)
		s.testNow = strconv.FormatInt(now, 10)
		next, write, want, err := gcra.Decide(kk.st, now, &sch, cost)
		if err != nil {
			t.Fatal(err)
		}
		got, err := s.Decide(ctx, kk.k, kk.sch, cost)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if got != want {
			t.Fatalf("step %d key %s at now=%d cost %d\nschedule %+v\nstate %+v\ngo:  %+v\nlua: %+v", step, kk.k.Name, now, cost, sch, kk.st, want, got)
		}
		if write {
			kk.st = readBack(next, f)
		}
		raw, _ := rawState(t, c, name)
		if raw == nil && kk.st.Exists && kk.st.Rested-now < 1_000_000 {
			// Written with a TTL of a few ms on the server's real clock and
			// gone already: the virtual clock drops it too.
			kk.st = gcra.State{}
		}
		if kk.st.Exists && string(raw) != string(encoded(kk.st, f)) {
			t.Fatalf("step %d key %s: stored %q, the core's state %+v encodes to %q", step, kk.k.Name, raw, kk.st, encoded(kk.st, f))
		}
		decided++
	}
	t.Logf("%d decisions, %d limit changes, %d decided on state older than the schedule's two versions", decided, changes, oldState)
	if oldState < steps/50 {
		t.Errorf("only %d decisions on state written two or more versions back: too thin to trust", oldState)
	}
}
