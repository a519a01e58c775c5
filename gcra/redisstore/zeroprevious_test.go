package redisstore

import (
	"context"
	"strconv"
	"testing"

	"github.com/meridian-quota/meridian/gcra"
)

// TestConvertFromZeroKeepsALaterTAT is gcra's test of the same name on
// Redis's script: a sibling's admission, stored under an epoch older than
// the zero limit this agent ran while its lease had lapsed, still counts
// when the agent's table returns. Fails on 015b20b: the script admitted
// (the explorer's schedule 256 of seed 1, OA_budget > 0 with failure_mode
// closed).
func TestConvertFromZeroKeepsALaterTAT(t *testing.T) {
	s, c := newTestStore(t)
	ctx := context.Background()
	full := gcra.FromInterval(3_015_072, 1)
	sch := gcra.Change(gcra.Version{Epoch: 21, Effective: 54_550_000}, gcra.Version{Limit: full, Epoch: 22, Effective: 61_199_000})
	k := gcra.Key{Tag: "zero", Name: "k"}
	now := int64(66_841_367)
	sibling := stored{st: gcra.State{TAT: 66_826_160 + full.IntervalMicros(), Rested: 66_826_160 + full.IntervalMicros(), Epoch: 20, Exists: true}, rested: 66_826_160 + full.IntervalMicros(), ok: true}
	setState(t, c, s.RedisKey(k), sibling, &sch, now)
	s.testNow = strconv.FormatInt(now, 10)
	r, err := s.Decide(ctx, k, sch, 1)
	if err != nil {
		t.Fatal(err)
	}
	_, _, want, _ := gcra.Decide(sibling.st, now, &sch, 1)
	if r.Allowed || r != want {
		t.Fatalf("Redis: %+v, the core: %+v; want both denied (a sibling admitted %d µs ago)", r, want, now-66_826_160)
	}
}
