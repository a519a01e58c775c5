package protocol

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// Timings of the tests, in µs: TTL 1 s, renew 250 ms, poll 100 ms (jittered
// down to 75 ms), max skew 200 ms.
const (
	tTTL   = int64(1_000_000)
	tRenew = int64(250_000)
	tPoll  = int64(100_000)
	tSkew  = int64(200_000)
	wall0  = int64(1_730_000_000_000_000) // the wall clock at mono 0
	keyL   = "c1.leader"
)

var errLost = errors.New("test: request lost")

func testCfg(id string) ElectionConfig {
	return ElectionConfig{ID: id, TTL: time.Duration(tTTL) * time.Microsecond, Renew: time.Duration(tRenew) * time.Microsecond, Poll: time.Duration(tPoll) * time.Microsecond, MaxSkew: time.Duration(tSkew) * time.Microsecond}
}

func newCand(t testing.TB, id string, seed uint64) *Candidate {
	t.Helper()
	c, err := NewCandidate(testCfg(id), rand.New(rand.NewPCG(seed, 1)))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// at is the reading of a clock pair that agrees with wall0 at mono 0.
func at(mono int64) Clocks { return Clocks{Wall: wall0 + mono, Mono: mono} }

// fakeKV is one bucket in memory: keys with revisions from one counter,
// as JetStream KV numbers them.
type fakeKV struct {
	rev uint64
	m   map[string]fakeEntry
}

type fakeEntry struct {
	val []byte
	rev uint64
}

var _ KV = (*fakeKV)(nil)

func newFakeKV() *fakeKV { return &fakeKV{m: map[string]fakeEntry{}} }

func (k *fakeKV) Get(_ context.Context, key string) ([]byte, uint64, error) {
	e, ok := k.m[key]
	if !ok {
		return nil, 0, ErrNotFound
	}
	return e.val, e.rev, nil
}

func (k *fakeKV) Create(_ context.Context, key string, value []byte) (uint64, error) {
	if _, ok := k.m[key]; ok {
		return 0, ErrConflict
	}
	return k.put(key, value), nil
}

func (k *fakeKV) Update(_ context.Context, key string, value []byte, rev uint64) (uint64, error) {
	if e, ok := k.m[key]; !ok || e.rev != rev {
		return 0, ErrConflict
	}
	return k.put(key, value), nil
}

// put writes unconditionally: an operator or a foreign writer.
func (k *fakeKV) put(key string, value []byte) uint64 {
	k.rev++
	k.m[key] = fakeEntry{val: append([]byte(nil), value...), rev: k.rev}
	return k.rev
}

// perform does op on the election key, as the shell does.
func perform(kv KV, op KVOp) KVResult {
	ctx := context.Background()
	var r KVResult
	switch op.Kind {
	case OpRead:
		r.Value, r.Rev, r.Err = kv.Get(ctx, keyL)
	case OpCreate:
		r.Rev, r.Err = kv.Create(ctx, keyL, op.Value)
	case OpUpdate:
		r.Rev, r.Err = kv.Update(ctx, keyL, op.Value, op.Rev)
	default:
		panic(fmt.Sprintf("perform %v", op.Kind))
	}
	return r
}

// drive steps c at now, performing its ops at once, until it waits.
func drive(c *Candidate, kv KV, now Clocks) (wait KVOp, evs []ElectionEvent) {
	op, e := c.Step(now, KVResult{})
	for {
		evs = append(evs, e...)
		if op.Kind == OpWait {
			return op, evs
		}
		op, e = c.Step(now, perform(kv, op))
	}
}

// kinds lists the events' kinds and terms, e.g. "elected 1, deposed 1 (leader key moved)".
func kinds(evs []ElectionEvent) string {
	var s []string
	for _, e := range evs {
		x := fmt.Sprintf("%v %d", e.Kind, e.Term)
		if e.Kind == BadRecord {
			x = fmt.Sprintf("%v rev %d", e.Kind, e.Rev)
		}
		if e.Why != "" {
			x += " (" + e.Why + ")"
		}
		s = append(s, x)
	}
	return strings.Join(s, ", ")
}

func wantOp(t *testing.T, what string, op KVOp, kind OpKind, until int64) {
	t.Helper()
	if op.Kind != kind || op.Until != until {
		t.Fatalf("%s: op %v until %d, want %v until %d", what, op.Kind, op.Until, kind, until)
	}
}

func wantEvents(t *testing.T, what string, evs []ElectionEvent, want string) {
	t.Helper()
	if got := kinds(evs); got != want {
		t.Fatalf("%s: events %q, want %q", what, got, want)
	}
}

func record(t *testing.T, kv *fakeKV) (LeaderRecord, uint64) {
	t.Helper()
	e, ok := kv.m[keyL]
	if !ok {
		t.Fatal("no leader record")
	}
	r, err := ParseLeaderRecord(e.val)
	if err != nil {
		t.Fatal(err)
	}
	return r, e.rev
}

// TestCandidateElectedAlone: one candidate on an empty bucket creates the
// key with term 1 and renews it every Renew.
func TestCandidateElectedAlone(t *testing.T) {
	kv := newFakeKV()
	c := newCand(t, "eu/a", 1)

	op, evs := c.Step(at(0), KVResult{})
	wantOp(t, "first step", op, OpRead, tTTL)
	wantEvents(t, "first step", evs, "")
	op, evs = c.Step(at(10), perform(kv, op))
	wantOp(t, "after reading nothing", op, OpCreate, tTTL) // the read's deadline covers the take
	wantEvents(t, "after reading nothing", evs, "")
	op, evs = c.Step(at(20), perform(kv, op))
	wantOp(t, "after the create", op, OpWait, 20+tRenew)
	wantEvents(t, "after the create", evs, "elected 1")
	if term, ok := c.Leading(); !ok || term != 1 {
		t.Fatalf("Leading() = %d, %v", term, ok)
	}
	want := fmt.Sprintf(`{"v":1,"term":1,"holder":"eu/a","since_us":%d,"expires_us":%d}`, wall0+10, wall0+10+tTTL)
	if got := string(kv.m[keyL].val); got != want {
		t.Fatalf("record %s, want %s", got, want)
	}

	// Woken early: it waits on.
	op, _ = c.Step(at(100), KVResult{})
	wantOp(t, "early", op, OpWait, 20+tRenew)
	// Renewals push the expiry; the deadline follows the last one sent.
	now, deadline := 20+tRenew, 10+tTTL
	for i := range 20 {
		op, _ = c.Step(at(now), KVResult{})
		wantOp(t, fmt.Sprintf("renewal %d", i), op, OpUpdate, deadline) // gives up at the deadline
		deadline = now + tTTL
		op, evs = c.Step(at(now+5), perform(kv, op))
		wantEvents(t, "renewal", evs, "")
		r, _ := record(t, kv)
		if r.Term != 1 || r.SinceUS != wall0+10 || r.ExpiresUS != wall0+now+tTTL {
			t.Fatalf("renewal %d: record %+v", i, r)
		}
		wantOp(t, "after a renewal", op, OpWait, now+5+tRenew)
		now = op.Until
	}
	if term, ok := c.Leading(); !ok || term != 1 {
		t.Fatalf("Leading() = %d, %v after renewals", term, ok)
	}
}

// TestCandidateHeldUntilExpiryPlusSkew: a record is taken only once its
// expiry plus MaxSkew has passed on the follower's wall clock.
func TestCandidateHeldUntilExpiryPlusSkew(t *testing.T) {
	const expires = wall0 + 5*tTTL
	tests := []struct {
		name     string
		giveWall int64
		wantTake bool
	}{
		{name: "before expiry", giveWall: expires - 1},
		{name: "at expiry", giveWall: expires},
		{name: "inside the skew margin", giveWall: expires + tSkew - 1},
		{name: "exactly at expiry + skew", giveWall: expires + tSkew},
		{name: "1µs after expiry + skew", giveWall: expires + tSkew + 1, wantTake: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kv := newFakeKV()
			rev := kv.put(keyL, LeaderRecord{Term: 4, Holder: "us/b", SinceUS: wall0, ExpiresUS: expires}.Encode())
			c := newCand(t, "eu/a", 1)
			now := Clocks{Wall: tt.giveWall, Mono: 0}
			op, _ := c.Step(now, KVResult{})
			op, evs := c.Step(now, perform(kv, op))
			if !tt.wantTake {
				if op.Kind != OpWait || len(evs) != 0 {
					t.Fatalf("held key: op %v, events %q; want a wait", op.Kind, kinds(evs))
				}
				if op.Until < tPoll*3/4 || op.Until > tPoll {
					t.Fatalf("poll wait until %d: not in [Poll·3/4, Poll]", op.Until)
				}
				return
			}
			if op.Kind != OpUpdate || op.Rev != rev {
				t.Fatalf("lapsed key: op %v rev %d, want update at %d", op.Kind, op.Rev, rev)
			}
			_, evs = c.Step(now, perform(kv, op))
			wantEvents(t, "take", evs, "elected 5")
			if r, _ := record(t, kv); r.Holder != "eu/a" || r.Term != 5 || r.SinceUS != tt.giveWall || r.ExpiresUS != tt.giveWall+tTTL {
				t.Fatalf("record %+v", r)
			}
		})
	}
}

// TestCandidateNoFavour: a record naming this candidate's own ID (an
// earlier run of it) is waited for like any other.
func TestCandidateNoFavour(t *testing.T) {
	kv := newFakeKV()
	kv.put(keyL, LeaderRecord{Term: 2, Holder: "eu/a", SinceUS: wall0, ExpiresUS: wall0 + tTTL}.Encode())
	if _, evs := drive(newCand(t, "eu/a", 1), kv, at(tTTL+tSkew)); len(evs) != 0 {
		t.Fatalf("events %q at expiry + skew", kinds(evs))
	}
	if _, evs := drive(newCand(t, "eu/a", 2), kv, at(tTTL+tSkew+1)); kinds(evs) != "elected 3" {
		t.Fatalf("events %q after expiry + skew", kinds(evs))
	}
}

// TestCandidatesRace: two candidates read the same free key and both
// write; the compare-and-set lets exactly one win each term.
func TestCandidatesRace(t *testing.T) {
	kv := newFakeKV()
	cs := []*Candidate{newCand(t, "eu/a", 1), newCand(t, "us/b", 2)}
	now := int64(0)
	for term := uint64(1); term <= 6; term++ {
		var writes [2]KVOp
		for i, c := range cs {
			op, _ := c.Step(at(now), KVResult{})
			if op.Kind != OpRead {
				t.Fatalf("term %d: candidate %d: %v, want a read", term, i, op.Kind)
			}
			res := perform(kv, op)
			if writes[i], _ = c.Step(at(now), res); writes[i].Kind != OpCreate && writes[i].Kind != OpUpdate {
				t.Fatalf("term %d: candidate %d: %v after reading a free key", term, i, writes[i].Kind)
			}
		}
		first := int(term % 2) // alternate who writes first
		var elected []string
		var winner *Candidate
		for _, i := range []int{first, 1 - first} {
			_, evs := cs[i].Step(at(now), perform(kv, writes[i]))
			for _, e := range evs {
				if e.Kind == Elected {
					elected = append(elected, fmt.Sprintf("%d:%d", i, e.Term))
					winner = cs[i]
				}
			}
			if i != first && kinds(evs) != fmt.Sprintf("lost race %d", term) {
				t.Fatalf("term %d: the second writer's events %q", term, kinds(evs))
			}
		}
		if want := fmt.Sprintf("%d:%d", first, term); len(elected) != 1 || elected[0] != want {
			t.Fatalf("term %d: elected %v, want [%s]", term, elected, want)
		}
		// The winner stops cleanly, releasing the key for the next round.
		op, evs := winner.Stop(at(now), WhyStopped)
		wantEvents(t, "stop", evs, fmt.Sprintf("deposed %d (stopped)", term))
		perform(kv, op)
		now += tPoll + 1 // past both candidates' next poll
	}
}

// TestCandidateDeposedAtDeadline: a leader whose renewals fail stays
// leader until TTL after its last successful write, then deposes itself,
// whether it learns it from its clock or from a late failure.
func TestCandidateDeposedAtDeadline(t *testing.T) {
	setup := func(t *testing.T) (*Candidate, *fakeKV) {
		kv := newFakeKV()
		c := newCand(t, "eu/a", 1)
		if _, evs := drive(c, kv, at(0)); kinds(evs) != "elected 1" {
			t.Fatalf("events %q", kinds(evs))
		}
		return c, kv
	}
	t.Run("by the clock", func(t *testing.T) {
		c, _ := setup(t)
		// Timeline (ms): renewals sent at 250, 510, 770 all fail 10 ms
		// later; the deadline is 1000 (the take at 0 + TTL).
		now := tRenew
		for _, wantUntil := range []int64{2*tRenew + 10, 3*tRenew + 20, tTTL} {
			op, _ := c.Step(at(now), KVResult{})
			wantOp(t, "renewal", op, OpUpdate, tTTL)
			op, evs := c.Step(at(now+10), KVResult{Err: errLost})
			wantEvents(t, "failed renewal", evs, "op failed 1 (renew)")
			wantOp(t, "after a failed renewal", op, OpWait, wantUntil)
			now = op.Until
		}
		if term, ok := c.Leading(); !ok || term != 1 {
			t.Fatal("deposed before its deadline")
		}
		op, evs := c.Step(at(tTTL-1), KVResult{})
		wantOp(t, "1µs before the deadline", op, OpWait, tTTL)
		wantEvents(t, "1µs before the deadline", evs, "")
		op, evs = c.Step(at(tTTL), KVResult{})
		wantEvents(t, "at the deadline", evs, "deposed 1 (not renewed in time)")
		if op.Kind != OpWait || op.Until > tTTL+tPoll {
			t.Fatalf("after deposition: %+v, want a poll wait", op)
		}
		if _, ok := c.Leading(); ok {
			t.Fatal("still leading")
		}
	})
	t.Run("by a late failure", func(t *testing.T) {
		c, _ := setup(t)
		if op, _ := c.Step(at(tRenew), KVResult{}); op.Kind != OpUpdate {
			t.Fatalf("op %v, want a renewal", op.Kind)
		}
		_, evs := c.Step(at(tTTL), KVResult{Err: context.DeadlineExceeded})
		wantEvents(t, "renewal failing at the deadline", evs, "deposed 1 (not renewed in time)")
	})
	t.Run("by a success a whole TTL after it was sent", func(t *testing.T) {
		// Only a shell that answers after the op's deadline delivers
		// this; the record it wrote has lapsed already.
		c, kv := setup(t)
		op, _ := c.Step(at(tRenew), KVResult{})
		_, evs := c.Step(at(tRenew+tTTL), perform(kv, op))
		wantEvents(t, "renewal answered a TTL late", evs, "deposed 1 (not renewed in time)")
	})
	t.Run("a success moves the deadline", func(t *testing.T) {
		c, kv := setup(t)
		op, _ := c.Step(at(tRenew), KVResult{})
		op, _ = c.Step(at(tRenew+900_000), perform(kv, op))        // slow, but in time
		wantOp(t, "after a slow renewal", op, OpWait, tRenew+tTTL) // the deadline (sent + TTL) comes before the next renewal
		op, _ = c.Step(at(op.Until), KVResult{})
		if _, ok := c.Leading(); ok || op.Kind != OpWait {
			t.Fatalf("leading past sent + TTL (op %v)", op.Kind)
		}
	})
}

// TestCandidateConflictOnRenewDeposes: the key moved under the leader
// (another writer took it): its next renewal loses the compare-and-set.
func TestCandidateConflictOnRenewDeposes(t *testing.T) {
	kv := newFakeKV()
	c := newCand(t, "eu/a", 1)
	drive(c, kv, at(0))
	kv.put(keyL, LeaderRecord{Term: 2, Holder: "us/b", SinceUS: wall0 + 1, ExpiresUS: wall0 + 1 + tTTL}.Encode())
	_, evs := drive(c, kv, at(tRenew))
	wantEvents(t, "renewal on a moved key", evs, "deposed 1 (leader key moved)")
	if _, ok := c.Leading(); ok {
		t.Fatal("still leading")
	}
	if r, _ := record(t, kv); r.Holder != "us/b" {
		t.Fatalf("record %+v: overwritten", r)
	}
}

// TestCandidateWonTooLate: a take whose write returned a whole TTL after
// it was sent is not leadership (its record has lapsed already).
func TestCandidateWonTooLate(t *testing.T) {
	tests := []struct {
		giveTook int64
		want     string
	}{
		{giveTook: tTTL - 1, want: "elected 1"},
		{giveTook: tTTL, want: "won too late 1"},
		{giveTook: 3 * tTTL, want: "won too late 1"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.giveTook), func(t *testing.T) {
			kv := newFakeKV()
			c := newCand(t, "eu/a", 1)
			op, _ := c.Step(at(0), KVResult{})
			op, _ = c.Step(at(0), perform(kv, op))
			_, evs := c.Step(at(tt.giveTook), perform(kv, op))
			wantEvents(t, "take", evs, tt.want)
			if _, ok := c.Leading(); ok != (tt.want == "elected 1") {
				t.Fatalf("Leading ok=%v", ok)
			}
		})
	}
}

// TestCandidateBadRecordBlocks: an invalid record is never overwritten —
// the next term cannot be known — and is reported once per revision,
// until an operator fixes it.
func TestCandidateBadRecordBlocks(t *testing.T) {
	for _, bad := range []string{
		`{"v":1,"term":0,"holder":""}`,
		`not json`,
		// Would be taken as term 0: 1 + MaxUint64 wraps (regression:
		// before the extraction it was written, and blocked everyone).
		fmt.Sprintf(`{"v":1,"term":%d,"holder":"x","since_us":1,"expires_us":2}`, uint64(math.MaxUint64)),
	} {
		t.Run(bad, func(t *testing.T) {
			kv := newFakeKV()
			rev1 := kv.put(keyL, []byte(bad))
			c := newCand(t, "eu/a", 1)
			var reported []string
			writes := 0
			step := func(now int64) {
				op, evs := c.Step(at(now), KVResult{})
				for op.Kind != OpWait {
					if op.Kind != OpRead {
						writes++
					}
					var e []ElectionEvent
					op, e = c.Step(at(now), perform(kv, op))
					evs = append(evs, e...)
				}
				for _, e := range evs {
					if e.Kind != BadRecord || e.Err == nil {
						t.Fatalf("event %+v", e)
					}
					reported = append(reported, fmt.Sprint(e.Rev))
				}
			}
			for i := range 10 {
				step(int64(i) * tTTL)
			}
			rev2 := kv.put(keyL, []byte(bad))
			for i := 10; i < 20; i++ {
				step(int64(i) * tTTL)
			}
			if want := []string{fmt.Sprint(rev1), fmt.Sprint(rev2)}; strings.Join(reported, ",") != strings.Join(want, ",") || writes != 0 {
				t.Fatalf("reported revisions %v (want %v), %d writes (want 0)", reported, want, writes)
			}
			// Fixed: a valid lapsed record with a known term.
			rev3 := kv.put(keyL, LeaderRecord{Term: 9, Holder: "op", SinceUS: 1, ExpiresUS: 2}.Encode())
			_, evs := drive(c, kv, at(21*tTTL))
			if kinds(evs) != "elected 10" || evs[0].Rev != rev3+1 {
				t.Fatalf("after the fix: %q", kinds(evs))
			}
		})
	}
}

// TestCandidateFarFutureExpiry: a record whose expiry is near the top of
// the range stays held (regression: expiry + skew wrapped negative, and
// the key was taken at once).
func TestCandidateFarFutureExpiry(t *testing.T) {
	kv := newFakeKV()
	kv.put(keyL, LeaderRecord{Term: 3, Holder: "x", SinceUS: 1, ExpiresUS: math.MaxInt64 - 1}.Encode())
	c := newCand(t, "eu/a", 1)
	if op, evs := drive(c, kv, at(0)); op.Kind != OpWait || len(evs) != 0 {
		t.Fatalf("events %q: took a record held until the end of time", kinds(evs))
	}
	if r, _ := record(t, kv); r.Term != 3 {
		t.Fatalf("record %+v", r)
	}
}

// TestCandidateRelease: a leader that stops writes its record with
// expiry 0, and a follower takes the key at its next read instead of
// waiting for TTL + skew.
func TestCandidateRelease(t *testing.T) {
	kv := newFakeKV()
	a, b := newCand(t, "eu/a", 1), newCand(t, "us/b", 2)
	drive(a, kv, at(0))
	if _, evs := drive(b, kv, at(50_000)); len(evs) != 0 {
		t.Fatalf("follower: %q", kinds(evs))
	}
	op, evs := a.Stop(at(100_000), WhyStopped)
	wantEvents(t, "stop", evs, "deposed 1 (stopped)")
	if op.Kind != OpUpdate || op.Until != 100_000+tTTL {
		t.Fatalf("release op %+v", op)
	}
	want := fmt.Sprintf(`{"v":1,"term":1,"holder":"eu/a","since_us":%d,"expires_us":0}`, wall0)
	if string(op.Value) != want {
		t.Fatalf("release record %s, want %s", op.Value, want)
	}
	if res := perform(kv, op); res.Err != nil {
		t.Fatal(res.Err)
	}
	if _, evs := drive(b, kv, at(150_000)); kinds(evs) != "elected 2" {
		t.Fatalf("follower after the release: %q", kinds(evs))
	}
	// A follower's Stop does nothing.
	if op, evs := a.Stop(at(200_000), WhyStopped); op.Kind != OpNone || len(evs) != 0 {
		t.Fatalf("follower's Stop: %v, %q", op.Kind, kinds(evs))
	}
}

func TestNewCandidateRefuses(t *testing.T) {
	_, err := NewCandidate(ElectionConfig{Renew: 2 * time.Second, TTL: time.Second, MaxSkew: -1}, nil)
	for _, want := range []string{"id: empty", "renew 2s", "poll 0s", "max skew -1ns", "nil rand"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("NewCandidate: %v, want %q", err, want)
		}
	}
}

func TestLeaderRecordEncoding(t *testing.T) {
	r := LeaderRecord{Term: 7, Holder: "eu/eu-1", SinceUS: 1730000000000000, ExpiresUS: 1730000003000000}
	const want = `{"v":1,"term":7,"holder":"eu/eu-1","since_us":1730000000000000,"expires_us":1730000003000000}`
	if got := string(r.Encode()); got != want {
		t.Fatalf("Encode = %s, want %s", got, want)
	}
	back, err := ParseLeaderRecord([]byte(want))
	if err != nil || back != r {
		t.Fatalf("ParseLeaderRecord = %+v, %v", back, err)
	}
	if !r.HeldAt(r.ExpiresUS-1) || r.HeldAt(r.ExpiresUS) {
		t.Error("HeldAt: want held strictly before the expiry")
	}
	for _, bad := range []string{``, `[]`, `{"v":2,"term":1,"holder":"x","since_us":1,"expires_us":2}`, `{"v":1,"term":1,"holder":"x\u0000","since_us":1,"expires_us":2}`, `{"v":1,"term":1,"holder":"x","since_us":0,"expires_us":2}`, `{"v":1,"term":1,"holder":"x","since_us":1,"expires_us":-1}`} {
		if _, err := ParseLeaderRecord([]byte(bad)); err == nil || !strings.HasPrefix(err.Error(), "gossip: election record: ") {
			t.Errorf("ParseLeaderRecord(%s): %v", bad, err)
		}
	}
}
