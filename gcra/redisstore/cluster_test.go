package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/internal/testenv"
)

// TestCluster runs the store on a three-master Redis Cluster started once
// for all its subtests.
func TestCluster(t *testing.T) {
	cl := testenv.StartCluster(t, 3)
	cc := cl.Client()
	ctx := context.Background()
	newStore := func(t *testing.T) *Store {
		t.Helper()
		cfg := DefaultConfig()
		cfg.Prefix = testenv.Prefix(t)
		testenv.Cleanup(t, cc, cfg.Prefix)
		s, err := New(cc, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	// keysByMaster lists the keys under prefix on each master.
	keysByMaster := func(t *testing.T, prefix string) map[string][]string {
		t.Helper()
		var mu sync.Mutex
		out := make(map[string][]string)
		err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			keys := keysUnder(t, m, prefix)
			mu.Lock()
			out[m.Options().Addr] = keys
			mu.Unlock()
			return nil
		})
		if err != nil {
			t.Fatalf("scan masters: %v", err)
		}
		return out
	}
	// owner maps each slot to the address of the master serving it.
	slotsReply, err := cc.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatalf("CLUSTER SLOTS: %v", err)
	}
	owner := func(slot uint16) string {
		for _, r := range slotsReply {
			if int(slot) >= r.Start && int(slot) <= r.End && len(r.Nodes) > 0 {
				return r.Nodes[0].Addr
			}
		}
		t.Fatalf("slot %d served by no node", slot)
		return ""
	}

	// CheckState (issue 17, defect 10): each master holds a marker, and
	// losing one master's data is one loss.
	t.Run("state markers", func(t *testing.T) {
		s := newStore(t)
		keys, err := s.markerKeys(ctx)
		if err != nil || len(keys) != 3 {
			t.Fatalf("marker keys %v, %v; want one per master", keys, err)
		}
		if n, err := s.CheckState(ctx); n != 0 || err != nil {
			t.Fatalf("first check: %d, %v", n, err)
		}
		seen := map[string]bool{}
		for _, k := range keys {
			seen[owner(keySlot(k))] = true
		}
		if len(seen) != 3 {
			t.Fatalf("markers %v on %d masters, want 3", keys, len(seen))
		}
		if err := cc.Del(ctx, keys[0]).Err(); err != nil { // as a flush of its master would
			t.Fatal(err)
		}
		if n, err := s.CheckState(ctx); n != 1 || err != nil {
			t.Errorf("after one master lost its data: %d, %v; want 1", n, err)
		}
		if n, err := s.CheckState(ctx); n != 0 || err != nil {
			t.Errorf("the check after: %d, %v; want 0", n, err)
		}
	})
	t.Run("keySlot agrees with CLUSTER KEYSLOT", func(t *testing.T) {
		s := newStore(t)
		seed := uint64(time.Now().UnixNano())
		t.Logf("seed %d", seed)
		r := rand.New(rand.NewPCG(seed, 3))
		draw := func(alphabet string, n int) string {
			b := make([]byte, n)
			for i := range b {
				if r.IntN(4) == 0 {
					b[i] = byte(r.Uint32())
				} else {
					b[i] = alphabet[r.IntN(len(alphabet))]
				}
			}
			return string(b)
		}
		for i := range 200 {
			var key string
			if i%2 == 0 {
				key = s.RedisKey(gcra.Key{Tag: draw("{}ab", r.IntN(6)), Name: draw("{}ab", 1+r.IntN(6))})
			} else {
				key = draw("{}{}ab", r.IntN(10)) // raw keys: every hash-tag edge case
			}
			want, err := cc.ClusterKeySlot(ctx, key).Result()
			if err != nil {
				t.Fatalf("CLUSTER KEYSLOT %q: %v", key, err)
			}
			if got := keySlot(key); int64(got) != want {
				t.Errorf("keySlot(%q) = %d, CLUSTER KEYSLOT says %d", key, got, want)
			}
		}
	})

	t.Run("decisions spread over the masters", func(t *testing.T) {
		s := newStore(t)
		sch := gcra.Steady(gcra.PerSecond(5, 3))
		want := make(map[string]string) // key → owning master
		for i := range 32 {
			k := gcra.Key{Tag: fmt.Sprintf("tenant-%d", i), Name: "r"}
			rk := s.RedisKey(k)
			slot, err := cc.ClusterKeySlot(ctx, rk).Result()
			if err != nil {
				t.Fatal(err)
			}
			want[rk] = owner(uint16(slot))
			r, err := s.Decide(ctx, k, sch, 1)
			if err != nil {
				t.Fatalf("decide %+v: %v", k, err)
			}
			if !r.Allowed || r.Remaining != 2 {
				t.Errorf("decide %+v: %+v, want allowed with 2 remaining", k, r)
			}
		}
		nodes := make(map[string]int)
		for _, addr := range want {
			nodes[addr]++
		}
		t.Logf("keys per master: %v", nodes)
		if len(nodes) < 2 {
			t.Fatalf("the tags cover %d masters, want at least 2", len(nodes))
		}
		found := 0
		for addr, keys := range keysByMaster(t, s.cfg.Prefix) {
			for _, k := range keys {
				found++
				if want[k] != addr {
					t.Errorf("key %q on %s, but its slot is served by %s", k, addr, want[k])
				}
			}
		}
		if found != len(want) {
			t.Errorf("found %d keys on the masters, want %d", found, len(want))
		}
	})

	t.Run("seed trace", func(t *testing.T) {
		s := newStore(t)
		base := wallMicros()
		sch := gcra.Steady(gcra.PerSecond(5, 3))
		k := gcra.Key{Tag: "seed", Name: "trace"}
		steps := []struct {
			at            time.Duration
			wantAllowed   bool
			wantRemaining int64
			wantRetry     time.Duration
		}{
			{0, true, 2, 0},
			{0, true, 1, 0},
			{0, true, 0, 0},
			{0, false, 0, 200 * time.Millisecond},
			{250 * time.Millisecond, true, 0, 0},
			{250 * time.Millisecond, false, 0, 150 * time.Millisecond},
		}
		for i, st := range steps {
			setNow(s, base+st.at.Microseconds())
			r, err := s.Decide(ctx, k, sch, 1)
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			if r.Allowed != st.wantAllowed || r.Remaining != st.wantRemaining || r.RetryAfter != st.wantRetry {
				t.Errorf("step %d at +%v: %+v, want allowed %v remaining %d retry %v",
					i, st.at, r, st.wantAllowed, st.wantRemaining, st.wantRetry)
			}
		}
	})

	t.Run("composite is all or nothing", func(t *testing.T) {
		s := newStore(t)
		now := wallMicros()
		setNow(s, now)
		limits := []gcra.Limit{gcra.PerSecond(10, 5), gcra.PerSecond(10, 5), gcra.PerSecond(1, 1)}
		checks := make([]gcra.Check, len(limits))
		for i, l := range limits {
			checks[i] = gcra.Check{Key: gcra.Key{Tag: "acct-7", Name: "limit-" + strconv.Itoa(i)}, Schedule: gcra.Steady(l), Cost: 1}
		}
		stored := func() []string {
			out := make([]string, len(checks))
			for i, c := range checks {
				v, err := cc.Get(ctx, s.RedisKey(c.Key)).Result()
				if err != nil && err != redis.Nil {
					t.Fatal(err)
				}
				out[i] = v
			}
			return out
		}
		out := make([]gcra.Result, len(checks))
		r, err := s.DecideAll(ctx, checks, out)
		if err != nil || !r.Allowed {
			t.Fatalf("first composite: %+v, %v; want allowed", r, err)
		}
		first := stored()
		for i, v := range first {
			if v == "" {
				t.Errorf("limit %d not written by an admitted composite", i)
			}
		}
		// The 1/s limit is spent: the composite is denied and the two
		// limits that would have admitted are not charged.
		r, err = s.DecideAll(ctx, checks, out)
		if err != nil {
			t.Fatal(err)
		}
		if r.Allowed || r.RetryAfter != time.Second || r.Limit != limits[2] {
			t.Errorf("second composite: %+v, want denied by %v with retry 1s", r, limits[2])
		}
		for i := range 2 {
			if out[i].Allowed || out[i].Remaining != 4 {
				t.Errorf("limit %d: %+v, want not allowed, 4 remaining (uncharged)", i, out[i])
			}
		}
		if got := stored(); !slices.Equal(got, first) {
			t.Errorf("denied composite changed state: %q → %q", first, got)
		}
		// A denial on a fresh tag writes nothing at all.
		fresh := slices.Clone(checks)
		for i := range fresh {
			fresh[i].Key.Tag = "acct-8"
		}
		fresh[0].Cost = 6 // above its burst of 5
		if r, err := s.DecideAll(ctx, fresh, out); err != nil || r.Allowed || !r.TooLarge {
			t.Errorf("composite with a cost above one burst: %+v, %v", r, err)
		}
		for _, c := range fresh {
			if n := cc.Exists(ctx, s.RedisKey(c.Key)).Val(); n != 0 {
				t.Errorf("key %+v written by a denied composite", c.Key)
			}
		}
	})

	t.Run("composite across slots", func(t *testing.T) {
		s := newStore(t)
		tagA, tagB := "north", "south"
		if keySlot(s.RedisKey(gcra.Key{Tag: tagA, Name: "x"})) == keySlot(s.RedisKey(gcra.Key{Tag: tagB, Name: "x"})) {
			t.Fatalf("test setup: %q and %q share a slot", tagA, tagB)
		}
		sch := gcra.Steady(gcra.PerSecond(5, 3))
		_, err := s.DecideAll(ctx, []gcra.Check{
			{Key: gcra.Key{Tag: tagA, Name: "x"}, Schedule: sch, Cost: 1},
			{Key: gcra.Key{Tag: tagB, Name: "x"}, Schedule: sch, Cost: 1},
		}, make([]gcra.Result, 2))
		if !errors.Is(err, ErrCrossSlot) {
			t.Fatalf("error %v, want ErrCrossSlot", err)
		}
		for _, tag := range []string{tagA, tagB} {
			if !strings.Contains(err.Error(), strconv.Quote(tag)) {
				t.Errorf("error %q does not name tag %q", err, tag)
			}
		}
		// Untagged keys hash by their whole names: the error says so.
		_, err = s.DecideAll(ctx, []gcra.Check{
			{Key: gcra.Key{Name: "tenant-a"}, Schedule: sch, Cost: 1},
			{Key: gcra.Key{Name: "user-7"}, Schedule: sch, Cost: 1},
		}, make([]gcra.Result, 2))
		if !errors.Is(err, ErrCrossSlot) || !strings.Contains(err.Error(), "empty Tag hashes by its whole name") ||
			!strings.Contains(err.Error(), `"tenant-a"`) {
			t.Errorf("err = %v, want ErrCrossSlot explaining untagged keys and naming them", err)
		}
		for addr, keys := range keysByMaster(t, s.cfg.Prefix) {
			if len(keys) > 0 {
				t.Errorf("%s holds %q after a refused composite", addr, keys)
			}
		}
	})

	t.Run("concurrent decisions over 64 tags", func(t *testing.T) {
		s := newStore(t)
		now := wallMicros()
		setNow(s, now) // a fixed now: nothing refills, so counts are exact
		lim := gcra.FromInterval(10_000_000, 30)
		sch := gcra.Steady(lim)
		const workers, opsEach, tags = 16, 200, 64
		type counts struct{ singleOps, singleOK, compOps, compOK int }
		var (
			mu   sync.Mutex
			per  [tags]counts
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
				out := make([]gcra.Result, 2)
				for range opsEach {
					i := r.IntN(tags)
					tag := "t" + strconv.Itoa(i)
					var res gcra.Result
					var err error
					single := r.IntN(4) != 0
					if single {
						res, err = s.Decide(ctx, gcra.Key{Tag: tag, Name: "s"}, sch, 1)
					} else {
						res, err = s.DecideAll(ctx, []gcra.Check{
							{Key: gcra.Key{Tag: tag, Name: "a"}, Schedule: sch, Cost: 1},
							{Key: gcra.Key{Tag: tag, Name: "b"}, Schedule: sch, Cost: 1},
						}, out)
					}
					mu.Lock()
					if err != nil {
						errs = append(errs, err)
					}
					c := &per[i]
					if single {
						c.singleOps++
						if res.Allowed {
							c.singleOK++
						}
					} else {
						c.compOps++
						if res.Allowed {
							c.compOK++
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
		tatOffset := func(k gcra.Key) int64 {
			v, err := cc.Get(ctx, s.RedisKey(k)).Bytes()
			if err == redis.Nil {
				return 0
			}
			if err != nil {
				t.Fatal(err)
			}
			st, err := gcra.DecodeValue(v)
			if err != nil {
				t.Fatal(err)
			}
			return st.TAT - now
		}
		for i, c := range per {
			tag := "t" + strconv.Itoa(i)
			if want := min(c.singleOps, int(lim.Burst())); c.singleOK != want {
				t.Errorf("tag %s: %d of %d single decisions admitted, want %d", tag, c.singleOK, c.singleOps, want)
			}
			if want := min(c.compOps, int(lim.Burst())); c.compOK != want {
				t.Errorf("tag %s: %d of %d composites admitted, want %d", tag, c.compOK, c.compOps, want)
			}
			T := lim.IntervalMicros()
			if got := tatOffset(gcra.Key{Tag: tag, Name: "s"}); got != int64(c.singleOK)*T {
				t.Errorf("tag %s: stored TAT now+%dµs, want %d admitted × T", tag, got, c.singleOK)
			}
			for _, name := range []string{"a", "b"} {
				if got := tatOffset(gcra.Key{Tag: tag, Name: name}); got != int64(c.compOK)*T {
					t.Errorf("tag %s key %s: stored TAT now+%dµs, want %d admitted × T", tag, name, got, c.compOK)
				}
			}
		}
	})
}
