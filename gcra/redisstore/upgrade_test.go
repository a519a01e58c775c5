package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/meridian-quota/meridian/gcra"
)

// legacySource is gcra.lua as the release before the exact Value shipped it
// (commit 2023668), byte for byte: the script its agents run. Its batch and
// reply layout are the ones this release sends, with 16-bit epoch tags.
//
//go:embed testdata/gcra-v1.lua
var legacySource string

// legacyStore is an agent of the older release on the same Redis and
// prefix as s: its script, and schedules its Validate accepted (windows up
// to 36 h, epochs below 2^16 within 2^15 of each other).
func legacyStore(t *testing.T, s *Store) *Store {
	t.Helper()
	old, err := New(s.c.(redis.UniversalClient), s.cfg)
	if err != nil {
		t.Fatal(err)
	}
	old.script = redis.NewScript(legacySource)
	old.format = ""
	return old
}

// TestRollingUpgrade runs agents of the older release (its script, which
// reads and writes only the packed integer) and of this one on one Redis,
// deciding the same keys in random turns over a virtual timeline in which
// the keys' limits change and keys sit idle for hours. Phase 1 is the
// upgrade: this release writes FormatPacked. In phase 2 the older agents
// are gone and this release writes FormatValue, reading the packed keys
// they left. Every admission is held to a meter — the pure core on the
// exact state of everything admitted so far —: neither release may ever
// admit what the meter denies, but for two readings the older release
// keeps: a key with no state holds the previous limit's full burst at a
// change (this release: empty at the previous limit's own change), and a
// conversion through a zero limit forgets booked slots (this release keeps
// them; both issue 18), so what an older agent admits and writes there is
// counted apart and taken as given. The older release misreads a packed state
// that outlives its schedule (it denies, and may write a later TAT than the
// meter's); this release must decide exactly as the pure core does on the
// bytes actually stored, whoever wrote them. The keys' expiries follow the
// virtual clock. Finally: an older agent meets a Value as malformed state
// (and falls back to its failure mode), which is why the packed write
// format exists; the test checks it, so the upgrade note stays true.
func TestRollingUpgrade(t *testing.T) {
	s, c := newFormatStore(t, FormatPacked)
	old := legacyStore(t, s)
	ctx := context.Background()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 13))
	// Limits of every length: this release's regional limits of a day's
	// or a month's budget may run windows past 36 h, where the older
	// release's made the zero limit.
	g := vecGen{r: r, window: gcra.MaxWindowMicros}
	type key struct {
		k       gcra.Key
		sch     gcra.Schedule
		version uint64
		meter   gcra.State // everything admitted, decided exactly
		expiry  int64      // the stored key's expiry on the virtual clock
		// byOld: an older agent wrote what is stored, with its release's
		// expiry — no later than the TAT, where this release keeps a state
		// written under the previous limit of a pending change until its
		// converted TAT has rested too.
		byOld bool
	}
	now := wallMicros()
	keys := make([]*key, 6)
	for i := range keys {
		keys[i] = &key{k: gcra.Key{Tag: "up", Name: strconv.Itoa(i)},
			sch: gcra.Schedule{Current: gcra.Version{Limit: g.share(), Epoch: 4, Effective: now - 1}}}
	}
	steps := 5000
	if testing.Short() {
		steps = 600
	}
	var oldAdmits, newAdmits, oldUnder, newUnder, overAdmits, packedReads, oldNoState, oldExpired int
	phase2 := steps / 2
	for step := range steps {
		if step == phase2 {
			s.cfg.WriteFormat, s.format = FormatValue, ""
		}
		switch r.IntN(10) {
		case 0:
			now += r.Int64N(6 * 3600 * 1_000_000) // idle for hours: past the older release's 71-minute read-behind
		case 1, 2:
			now += r.Int64N(600_000_000)
		default:
			now += r.Int64N(5_000_000)
		}
		kk := keys[r.IntN(len(keys))]
		if r.IntN(4) == 0 {
			kk.version++
			kk.sch = nextVersion(kk.sch, g.share(), kk.version, now, now+r.Int64N(30_000_000))
		}
		name := s.RedisKey(kk.k)
		if kk.meter.Exists && kk.meter.Rested <= now {
			kk.meter = gcra.State{} // a store may drop a rested key
		}
		if kk.expiry != 0 && !expireAt(t, c, name, kk.expiry, now) {
			kk.expiry = 0
			if kk.byOld && kk.meter.Exists {
				// Dropped by the expiry an older agent set, before the
				// meter's state has rested: what the key holds from here
				// on is that release's doing, taken as given (seed
				// 1796651875566008022 once failed here at step 890: an
				// older agent's write expired at its TAT, 26 s before the
				// meter's converted one, and this release then read a
				// key with no state).
				kk.meter = gcra.State{}
				oldExpired++
			}
		}
		sch := kk.sch
		if step < phase2 {
			one := []gcra.Check{{Schedule: sch}}
			packedLimits(one) // the older release's bound, kept by this one while packed
			sch = one[0].Schedule
		}
		cost := r.Int64N(max(sch.Current.Limit.Burst(), 1)/3 + 2)
		next, write, want, err := gcra.Decide(kk.meter, now, &sch, cost)
		if err != nil {
			t.Fatal(err)
		}
		// What is stored, read as the pure core reads it.
		readStored := func() ([]byte, gcra.State) {
			var stored gcra.State
			raw, pttl := rawState(t, c, name)
			switch {
			// A Value's first byte is below 0x20, as the script tells
			// them apart: a packed integer of twelve digits is twelve
			// bytes too (this test, reading by length alone, once took
			// one for a Value when the wall clock made the packed TAT
			// that long).
			case len(raw) == gcra.ValueLen && raw[0] < 0x20:
				if stored, err = gcra.DecodeValue(raw); err != nil {
					t.Fatal(err)
				}
			case raw != nil:
				v, err := strconv.ParseInt(string(raw), 10, 64)
				if err != nil {
					t.Fatalf("step %d: stored %q", step, raw)
				}
				stored = gcra.UnpackV1(v, now+pttl.Microseconds()+gcra.V1ExpirySlack, &kk.sch)
			}
			if raw != nil {
				stored.Rested = now + pttl.Microseconds()
			}
			return raw, stored
		}
		raw, stored := readStored()
		if raw != nil && !(len(raw) == gcra.ValueLen && raw[0] < 0x20) {
			packedReads++
		}
		agent, legacy, asked := s, step < phase2 && r.IntN(2) == 0, kk.sch
		oldReading := raw == nil || (sch.HasPrevious && sch.Previous.Limit.IsZero())
		if legacy {
			agent, asked = old, sch // the older release never made a limit past 36 h
		}
		agent.testNow = strconv.FormatInt(now, 10)
		got, err := agent.Decide(ctx, kk.k, asked, cost)
		if err != nil {
			t.Fatalf("step %d (legacy %v): %v", step, legacy, err)
		}
		if !legacy {
			if _, _, exact, _ := gcra.Decide(stored, now, &sch, cost); got != exact {
				t.Fatalf("step %d key %s at now %d (rested %d, expiry %d): this release decided %+v; the pure core on the stored %q (%+v) decides %+v\nschedule %+v", step, kk.k.Name, now, stored.Rested, kk.expiry,
					got, raw, stored, exact, sch)
			}
		}
		switch {
		case got.Allowed && cost > 0 && !want.Allowed && legacy && oldReading:
			// Two readings the older release keeps until its agents are
			// replaced (this release's are issue 18's): a key with no state
			// holds the previous limit's full burst at the change, however
			// recently that limit replaced a smaller one (this release:
			// empty at the previous change); and a state converted through
			// a zero previous limit loses the slots booked past the change
			// (this release keeps their times).
			oldNoState++
		case got.Allowed && cost > 0 && !want.Allowed:
			overAdmits++
			t.Errorf("step %d key %s (legacy agent %v): admitted cost %d the meter denies\nschedule %+v\nmeter %+v\ngot  %+v\nwant %+v",
				step, kk.k.Name, legacy, cost, sch, kk.meter, got, want)
		case want.Allowed && !got.Allowed && legacy:
			oldUnder++ // the older release's misread: the key looked blocked
		case want.Allowed && !got.Allowed:
			newUnder++ // a later TAT an older agent wrote
		case got.Allowed && write:
			// The meter holds what the store can: the packed integer of
			// phase 1 keeps no writer's limit, so a later reading of it
			// cannot convert from that limit either.
			kk.meter = readBack(next, s.cfg.WriteFormat)
			if legacy {
				oldAdmits++
			} else {
				newAdmits++
			}
		}
		if write && !want.Allowed && !legacy {
			// A denial that re-stores a converted state (gcra.Rebase):
			// what an admission of cost 0 would write, the meter's too
			// (an older agent's script re-stores nothing).
			kk.meter = readBack(next, s.cfg.WriteFormat)
		}
		if legacy && oldReading && got.Allowed && cost > 0 {
			// What an older agent wrote after such a reading is its own,
			// not the meter's: the meter takes it as given from here on
			// (else the key, expiring by the older agent's TAT, would look
			// like this release's over-admission later).
			_, kk.meter = readStored()
		}
		if after, pttl := rawState(t, c, name); string(after) != string(raw) {
			kk.expiry, kk.byOld = now+pttl.Microseconds(), legacy
		}
	}
	t.Logf("%d admissions by older agents, %d by this release (%d decisions on packed state); %d over-admissions; "+
		"older agents denied %d requests the meter admits (their misread), this release %d (what they wrote); "+
		"older agents admitted %d on a key with no state or through a zero limit that this release reads as empty or booked; "+
		"%d keys dropped by an older agent's expiry before the meter's state rested",
		oldAdmits, newAdmits, packedReads, overAdmits, oldUnder, newUnder, oldNoState, oldExpired)
	if oldAdmits < steps/40 || newAdmits < steps/40 || packedReads < steps/30 {
		t.Errorf("too few admissions or packed reads to trust: %d older, %d this release, %d packed", oldAdmits, newAdmits, packedReads)
	}

	// Writing Values while an older agent shares the Redis: the older agent
	// meets malformed state (and its failure mode decides).
	olderRefusesValue(t, s, old, now+1_000_000)
}

// olderRefusesValue: at now, s (writing the default Value) decides a key
// and old, an agent of an older release on the same Redis, then fails on it
// as malformed state — so its limit's failure mode decides, which is why
// the upgrade's first roll writes the older form (the upgrade notes say
// so).
func olderRefusesValue(t *testing.T, s, old *Store, now int64) {
	t.Helper()
	ctx := context.Background()
	k := gcra.Key{Tag: "upgrade", Name: "value"}
	s.cfg.WriteFormat, s.format = FormatValue, ""
	s.testNow, old.testNow = strconv.FormatInt(now, 10), strconv.FormatInt(now, 10)
	steady := gcra.Steady(gcra.PerSecond(10, 5))
	if _, err := s.Decide(ctx, k, steady, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := old.Decide(ctx, k, steady, 1); !errors.Is(err, ErrMalformedState) {
		t.Errorf("an older agent deciding a key this release wrote as a %d-byte Value: %v, want ErrMalformedState", gcra.ValueLen, err)
	}
}

// previousSource is gcra.lua as the release before the writer's limit was
// stored (commit 7833642), byte for byte: it reads and writes the 12-byte
// value (TAT and epoch tag) and refuses a longer one.
//
//go:embed testdata/gcra-v2.lua
var previousSource string

// TestRollingUpgradeFromValue12 runs agents of the previous release (its
// script) and of this one on one Redis over a virtual timeline in which
// the keys' limits change. Phase 1 is the upgrade: this release writes
// FormatValue12, and every decision by either release must be exactly the
// pure core's on the bytes stored — a 12-byte value has no writer's limit,
// and this release reads such a state as the previous one did. In phase 2
// the previous agents are gone and this release writes the 24-byte Value,
// reading the 12-byte keys they left. Finally a previous agent meets a
// 24-byte Value as malformed state (its failure mode decides), which is
// why FormatValue12 exists; the test checks it, so the upgrade note stays
// true.
func TestRollingUpgradeFromValue12(t *testing.T) {
	s, c := newFormatStore(t, FormatValue12)
	prev, err := New(s.c.(redis.UniversalClient), s.cfg)
	if err != nil {
		t.Fatal(err)
	}
	prev.script, prev.format = redis.NewScript(previousSource), ""
	ctx := context.Background()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 17))
	g := vecGen{r: r, window: gcra.MaxWindowMicros}
	type key struct {
		k       gcra.Key
		sch     gcra.Schedule
		version uint64
		expiry  int64
	}
	now := wallMicros()
	keys := make([]*key, 6)
	for i := range keys {
		keys[i] = &key{k: gcra.Key{Tag: "up2", Name: strconv.Itoa(i)},
			sch: gcra.Schedule{Current: gcra.Version{Limit: g.share(), Epoch: 4, Effective: now - 1}}}
	}
	steps := 3000
	if testing.Short() {
		steps = 400
	}
	phase2 := steps / 2
	var byPrev, byThis, v12Reads, v24Reads int
	for step := range steps {
		if step == phase2 {
			s.cfg.WriteFormat, s.format = FormatValue, ""
		}
		switch r.IntN(10) {
		case 0:
			now += r.Int64N(3600 * 1_000_000)
		case 1, 2:
			now += r.Int64N(60_000_000)
		default:
			now += r.Int64N(2_000_000)
		}
		kk := keys[r.IntN(len(keys))]
		if r.IntN(4) == 0 {
			kk.version++
			kk.sch = nextVersion(kk.sch, g.share(), kk.version, now, now+r.Int64N(5_000_000))
		}
		name := s.RedisKey(kk.k)
		if kk.expiry != 0 && !expireAt(t, c, name, kk.expiry, now) {
			kk.expiry = 0
		}
		raw, pttl := rawState(t, c, name)
		var stored gcra.State
		if raw != nil {
			if stored, err = gcra.DecodeValue(raw); err != nil {
				t.Fatalf("step %d: stored %q: %v", step, raw, err)
			}
			stored.Rested = now + pttl.Microseconds()
			if len(raw) == gcra.ValueV2Len {
				v12Reads++
			} else {
				v24Reads++
			}
		}
		agent, legacy := s, step < phase2 && r.IntN(2) == 0
		if legacy {
			agent = prev
			byPrev++
		} else {
			byThis++
		}
		cost := r.Int64N(max(kk.sch.Current.Limit.Burst(), 1)/3 + 2)
		agent.testNow = strconv.FormatInt(now, 10)
		got, err := agent.Decide(ctx, kk.k, kk.sch, cost)
		if err != nil {
			t.Fatalf("step %d (previous release %v): %v", step, legacy, err)
		}
		if _, _, want, _ := gcra.Decide(stored, now, &kk.sch, cost); got != want {
			t.Fatalf("step %d key %s at now %d (previous release %v): decided %+v; the pure core on the stored %x (%+v) decides %+v\nschedule %+v",
				step, kk.k.Name, now, legacy, got, raw, stored, want, kk.sch)
		}
		after, apttl := rawState(t, c, name)
		if string(after) != string(raw) {
			kk.expiry = now + apttl.Microseconds()
			if want := gcra.ValueLen; !legacy && step >= phase2 && len(after) != want {
				t.Fatalf("step %d: this release wrote %d bytes after the upgrade, want %d", step, len(after), want)
			}
			if step < phase2 && len(after) != gcra.ValueV2Len {
				t.Fatalf("step %d (previous release %v): wrote %d bytes during the upgrade, want %d", step, legacy, len(after), gcra.ValueV2Len)
			}
		}
	}
	t.Logf("%d decisions by the previous release, %d by this one; %d on 12-byte state, %d on 24-byte state", byPrev, byThis, v12Reads, v24Reads)
	if byPrev < steps/8 || v12Reads < steps/4 || v24Reads < steps/10 {
		t.Errorf("too thin to trust: %d previous-release decisions, %d 12-byte reads, %d 24-byte reads", byPrev, v12Reads, v24Reads)
	}

	olderRefusesValue(t, s, prev, now+1_000_000)
}
