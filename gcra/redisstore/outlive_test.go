package redisstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/rebalance"
)

// TestStateOutlivesItsSchedule replays issue 14's first reproduction on
// real Redis with an explicit now, beside the pure core fed the exact
// state: a region's share of 10,000/day burst 10,000 raised from 50 % to
// 90 %; one request 1 s before the increase; then 73 minutes idle while
// the key runs under its next version. The state was written under a limit
// two versions back and is read far past its TAT.
//
// Fails on 2023668: the pure core admits (remaining 4,999 at the next
// version's limit) while Redis read the packed TAT relative to now, took
// it for one 2^37 µs later and denied with a retry-after of ~13 h.
func TestStateOutlivesItsSchedule(t *testing.T) {
	s, _ := newTestStore(t)
	ctx := context.Background()
	global := gcra.New(10_000, 24*time.Hour, 10_000)
	region := func(ppm uint32) gcra.Limit {
		return rebalance.RegionalLimit(global, ppm, global.Burst()*int64(ppm)/rebalance.PPM)
	}
	base := wallMicros()
	inc := base + 10*int64(time.Minute/time.Microsecond) // the increase's effective time
	v1 := gcra.Version{Limit: region(500_000), Epoch: 8, Effective: base - 3600e6}
	v2 := gcra.Version{Limit: region(900_000), Epoch: 12, Effective: inc}
	v3 := gcra.Version{Limit: region(800_000), Epoch: 16, Effective: inc + 30*60e6}
	k := gcra.Key{Tag: "t", Name: "daily"}

	var st gcra.State // the exact state, kept by the test
	step := func(now int64, sch gcra.Schedule, cost int64) {
		t.Helper()
		next, write, want, err := gcra.Decide(st, now, &sch, cost)
		if err != nil {
			t.Fatal(err)
		}
		if write {
			st = next
		}
		s.testNow = strconv.FormatInt(now, 10)
		got, err := s.Decide(ctx, k, sch, cost)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("at now%+ds: redis %+v, pure core %+v", (now-inc)/1e6, got, want)
		}
	}
	step(inc-1e6, gcra.Change(v1, v2), 1)
	step(inc+73*60e6, gcra.Change(v2, v3), 1)
}
