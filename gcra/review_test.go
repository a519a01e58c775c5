package gcra_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/meridian-quota/meridian/gcra"
)

// TestScheduleEpochOrder: the current epoch's tag must be ahead of the
// previous one's, or a state tagged with the previous epoch would be kept
// "newer" and re-converted on every write (unbounded admission).
func TestScheduleEpochOrder(t *testing.T) {
	l := gcra.PerSecond(100, 10)
	tests := []struct {
		prev, cur uint64
		ok        bool
	}{
		{1, 2, true},
		{65535, 65536, true},       // 16 bits wrap; 40 do not
		{100, 40100, true},         // the old 16-bit reviewer's case: fine with 40 bits
		{1<<40 - 1, 1 << 40, true}, // wraps: tag 2^40−1 → 0
		{100, 100 + 1<<39 - 1, true},
		{100, 100 + 1<<39, false},     // half-way round: ambiguous
		{100, 100 + 1<<39 + 5, false}, // previous looks newer
		{5, 5, false},
		{6, 5, false},
		{7, 7 + 1<<40, false}, // equal tags
	}
	for _, tt := range tests {
		sch := gcra.Change(gcra.Version{Limit: l, Epoch: tt.prev}, gcra.Version{Limit: l, Epoch: tt.cur, Effective: 10})
		err := sch.Validate()
		if (err == nil) != tt.ok || sch.Valid() != tt.ok {
			t.Errorf("epochs %d → %d: Validate = %v, Valid = %v, want ok=%v", tt.prev, tt.cur, err, sch.Valid(), tt.ok)
		}
		if err != nil && (!errors.Is(err, gcra.ErrInvalidLimit) || !strings.Contains(err.Error(), "tag")) {
			t.Errorf("epochs %d → %d: error %q should wrap ErrInvalidLimit and explain the tags", tt.prev, tt.cur, err)
		}
	}
}

// TestTimeRange: now and effective times outside [0, 2^52) µs are errors
// (no overflow into admission).
func TestTimeRange(t *testing.T) {
	sch := gcra.Steady(gcra.PerSecond(10, 2))
	for _, now := range []int64{-1, gcra.MaxTime, math.MaxInt64 - 10, math.MinInt64} {
		if _, w, _, err := gcra.Decide(gcra.State{}, now, &sch, 1); !errors.Is(err, gcra.ErrBadTime) || w {
			t.Errorf("Decide at %d: write=%v err=%v, want ErrBadTime", now, w, err)
		}
		if _, w, _, err := gcra.Reserve(gcra.State{}, now, &sch, 1, 0); !errors.Is(err, gcra.ErrBadTime) || w {
			t.Errorf("Reserve at %d: write=%v err=%v, want ErrBadTime", now, w, err)
		}
		checks := []gcra.Check{{Key: gcra.Key{Name: "a"}, Schedule: sch, Cost: 1}}
		if _, w, err := gcra.DecideAll(now, checks, make([]gcra.State, 1), make([]gcra.State, 1), make([]gcra.Result, 1)); !errors.Is(err, gcra.ErrBadTime) || w {
			t.Errorf("DecideAll at %d: write=%v err=%v, want ErrBadTime", now, w, err)
		}
	}
	for _, eff := range []int64{-1, gcra.MaxTime, 1_800_000_000_000_000_000} { // the last: nanoseconds by mistake
		s := gcra.Schedule{Current: gcra.Version{Limit: gcra.PerSecond(10, 2), Effective: eff}}
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "effective time") || s.Valid() {
			t.Errorf("effective %d: Validate = %v, Valid = %v; want an error naming the effective time", eff, err, s.Valid())
		}
	}
}

// TestUnpackV1LongAfterChange: a packed state written under the previous
// limit of a change lives until its converted TAT, maybe days after its own
// TAT. Read below its expiry it comes back exactly however long after the
// change and whatever the schedule by then; the older release's reference
// time (ReadRefV1) lost it once the schedule moved on.
func TestUnpackV1LongAfterChange(t *testing.T) {
	const eff = int64(1_800_000_000_000_000)
	sch := gcra.Change(gcra.Version{Limit: gcra.FromInterval(1_000_000, 1), Epoch: 1},
		gcra.Version{Limit: gcra.FromInterval(3*3600*1_000_000, 1), Epoch: 2, Effective: eff})
	next := gcra.Change(sch.Current, gcra.Version{Limit: gcra.FromInterval(2*3600*1_000_000, 1), Epoch: 3, Effective: eff + 60e6})
	st := gcra.State{TAT: eff + 500_000, Epoch: 1, Exists: true}
	rested := eff + 3*3600*1_000_000 // the converted TAT: the key's expiry
	for _, gap := range []int64{0, 73 * 60 * 1_000_000, 2 * 3600 * 1_000_000} {
		now := st.TAT + gap
		for _, s := range []*gcra.Schedule{&sch, &next} {
			got := gcra.UnpackV1(gcra.PackV1(st), rested+gcra.V1ExpirySlack, s)
			if got != st {
				t.Errorf("read %dµs after its TAT under epoch %d: got %+v, want %+v", gap, s.Current.Epoch, got, st)
			}
		}
		old := gcra.UnpackV1(gcra.PackV1(st), gcra.ReadRefV1(&next, 1, now)-gcra.V1ReadBehind+1<<37-1, &next)
		if gap > gcra.V1ReadBehind && old.TAT == st.TAT {
			t.Errorf("the older release's read %dµs after the TAT found it: the regression this replaces is gone?", gap)
		}
	}
}
