package memstore

import (
	"context"
	"reflect"
	"strconv"
	"testing"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/internal/testenv"
)

func testStore(t *testing.T, shards, maxKeys int) *Store {
	t.Helper()
	s, err := New(Config{Clock: func() int64 { return 0 }, Shards: shards, MaxKeys: maxKeys})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// twoShards interns keys until two land in different shards, returned in
// descending shard order so that locking must reorder them.
func twoShards(t *testing.T, s *Store) (Handle, Handle) {
	t.Helper()
	a, err := s.Intern(gcra.Key{Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		b, err := s.Intern(gcra.Key{Name: "b" + strconv.Itoa(i)})
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case b.e.sh.index > a.e.sh.index:
			return b, a
		case b.e.sh.index < a.e.sh.index:
			return a, b
		}
	}
}

func TestCompositeAtomicAcrossShards(t *testing.T) {
	s := testStore(t, 16, 1<<10)
	ha, hb := twoShards(t, s)
	ka, kb := ha.Key(), hb.Key()
	checks := []gcra.Check{
		{Schedule: gcra.Steady(gcra.PerSecond(10, 5)), Cost: 1}, // T = 100ms
		{Schedule: gcra.Steady(gcra.PerSecond(1, 1)), Cost: 1},  // T = 1s
	}
	hs := []Handle{ha, hb}
	out := make([]gcra.Result, 2)

	// Allowed: both written.
	r, err := s.DecideAllAt(0, hs, checks, out)
	if err != nil || !r.Allowed {
		t.Fatalf("first: %+v, %v", r, err)
	}
	a1, okA := s.Get(ka)
	b1, okB := s.Get(kb)
	if !okA || !okB || a1.TAT != 100_000 || b1.TAT != 1_000_000 {
		t.Fatalf("after allowed composite: a %+v %v, b %+v %v", a1, okA, b1, okB)
	}

	// Denied by b: nothing written, a reports its untouched state.
	r, err = s.DecideAllAt(10_000, hs, checks, out)
	if err != nil || r.Allowed || r.RetryAfter != 990_000_000 || r.Limit != checks[1].Schedule.Current.Limit {
		t.Fatalf("second: %+v, %v", r, err)
	}
	if out[0].Allowed || out[0].Remaining != 4 || out[1].Allowed {
		t.Fatalf("per-limit results %+v", out)
	}
	if a2, _ := s.Get(ka); a2 != a1 {
		t.Fatalf("denied composite wrote a: %+v → %+v", a1, a2)
	}
	if b2, _ := s.Get(kb); b2 != b1 {
		t.Fatalf("denied composite wrote b: %+v → %+v", b1, b2)
	}

	// The same through gcra.Store, with a key that does not exist yet: a
	// denial creates no state for it.
	kc := gcra.Key{Name: "fresh"}
	ck := []gcra.Check{{Key: kc, Schedule: checks[0].Schedule, Cost: 1}, {Key: kb, Schedule: checks[1].Schedule, Cost: 1}}
	if r, err := s.DecideAll(context.Background(), ck, out); err != nil || r.Allowed {
		t.Fatalf("ctx composite: %+v, %v", r, err)
	}
	if _, ok := s.Get(kc); ok {
		t.Fatal("denied composite created state")
	}
}

func TestCompositePinsAgainstSweep(t *testing.T) {
	// One shard of two keys: creating the second key of a composite sweeps
	// the shard, which must not drop the first (a stateless new entry).
	s := testStore(t, 1, 2)
	sch := gcra.Steady(gcra.PerSecond(1, 1))
	if _, err := s.Intern(gcra.Key{Name: "old"}); err != nil { // stateless: sweepable
		t.Fatal(err)
	}
	out := make([]gcra.Result, 2)
	ck := []gcra.Check{{Key: gcra.Key{Name: "x"}, Schedule: sch, Cost: 1}, {Key: gcra.Key{Name: "y"}, Schedule: sch, Cost: 1}}
	r, err := s.DecideAll(context.Background(), ck, out)
	if err != nil || !r.Allowed {
		t.Fatalf("%+v, %v", r, err)
	}
	for _, c := range ck {
		if st, ok := s.Get(c.Key); !ok || st.TAT != 1_000_000 {
			t.Fatalf("%s: %+v, %v", c.Key.Name, st, ok)
		}
	}
	if s.Len() != 2 {
		t.Fatalf("Len %d", s.Len())
	}
	for _, e := range s.shards[0].m {
		if e.pinned {
			t.Fatalf("%s left pinned", e.key.Name)
		}
	}
}

func TestSweepRebuildsMap(t *testing.T) {
	s := testStore(t, 1, 1<<20)
	sch := gcra.Steady(gcra.FromInterval(10, 1))
	const n = 20_000
	for i := range n {
		h, err := s.Intern(gcra.Key{Name: strconv.Itoa(i)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.DecideAt(h, 0, &sch, 1); err != nil { // TAT 10: live until 10
			t.Fatal(err)
		}
	}
	sh := &s.shards[0]
	if len(sh.m) != n {
		t.Fatalf("len %d: live keys were swept", len(sh.m))
	}
	keep, err := s.Intern(gcra.Key{Name: "keep"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.DecideAt(keep, 5, &sch, 1); err != nil { // TAT 15
		t.Fatal(err)
	}
	old := reflect.ValueOf(sh.m).UnsafePointer()
	if got := s.Sweep(10); got != n {
		t.Fatalf("swept %d, want %d", got, n)
	}
	if reflect.ValueOf(sh.m).UnsafePointer() == old || len(sh.m) != 1 || sh.sweepAt != minSweep {
		t.Fatalf("map not rebuilt: len %d, sweepAt %d", len(sh.m), sh.sweepAt)
	}
	// The bound: nothing rests before 15, so a sweep at 12 skips the scan.
	if sh.restBound != 15 || s.Sweep(12) != 0 {
		t.Fatalf("restBound %d", sh.restBound)
	}
	if s.Sweep(15) != 1 || s.Len() != 0 {
		t.Fatalf("Len %d", s.Len())
	}
}

func TestHandleRevival(t *testing.T) {
	s := testStore(t, 4, 1<<10)
	sch := gcra.Steady(gcra.FromInterval(100, 2))
	h, _ := s.Intern(gcra.Key{Name: "k"})
	if _, err := s.DecideAt(h, 0, &sch, 1); err != nil {
		t.Fatal(err)
	}
	s.Sweep(100)
	if !h.e.dead {
		t.Fatal("entry not marked dead")
	}
	// Re-created through another path: the old handle finds the new entry.
	h2, _ := s.Intern(gcra.Key{Name: "k"})
	if h2.e == h.e {
		t.Fatal("Intern revived the dead entry")
	}
	if r, err := s.DecideAt(h, 150, &sch, 1); err != nil || !r.Allowed {
		t.Fatal(r, err)
	}
	if st, _ := s.Get(gcra.Key{Name: "k"}); st.TAT != 250 || h2.e.state().TAT != 250 {
		t.Fatalf("write went to %+v", st)
	}
	// Evicted again with no other entry: the handle revives its own.
	s.Sweep(1000)
	if r, err := s.DecideAt(h, 1000, &sch, 1); err != nil || !r.Allowed || r.Remaining != 1 {
		t.Fatal(r, err)
	}
	if h.e.dead || s.shards[h.e.sh.index].m[gcra.Key{Name: "k"}] != h.e {
		t.Fatal("handle's entry not revived")
	}
}

func TestHotPathAllocs(t *testing.T) {
	testenv.SkipShort(t, "alloc counts")
	s := testStore(t, 8, 1<<10)
	ha, hb := twoShards(t, s)
	sch := gcra.Steady(gcra.PerSecond(1000, 10))
	checks := []gcra.Check{{Schedule: sch, Cost: 1}, {Schedule: gcra.Steady(gcra.PerMinute(6000, 50)), Cost: 1}}
	hs := []Handle{ha, hb}
	out := make([]gcra.Result, 2)
	var now int64
	tests := []struct {
		name string
		fn   func()
	}{
		{"DecideAt", func() { now += 300; _, _ = s.DecideAt(ha, now, &sch, 1) }},
		{"ReserveAt", func() { now += 300; _, _ = s.ReserveAt(ha, now, &sch, 1, 5000) }},
		{"DecideAllAt", func() { now += 300; _, _ = s.DecideAllAt(now, hs, checks, out) }},
		{"Decide", func() { _, _ = s.Decide(context.Background(), ha.Key(), sch, 1) }},
		{"DecideAll", func() {
			ck := [2]gcra.Check{{Key: ha.Key(), Schedule: sch, Cost: 1}, {Key: hb.Key(), Schedule: sch, Cost: 1}}
			_, _ = s.DecideAll(context.Background(), ck[:], out)
		}},
	}
	for _, tt := range tests {
		if a := testing.AllocsPerRun(1000, tt.fn); a != 0 {
			t.Errorf("%s: %v allocs per call", tt.name, a)
		}
	}
}
