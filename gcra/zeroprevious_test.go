package gcra

import "testing"

// TestConvertFromZeroKeepsALaterTAT is the explorer's finding (schedule
// 256 of seed 1, issue 16): an agent cut from NATS for longer than its
// lease runs a key at its safe share — here the zero limit, under a new
// epoch — while its siblings on the same store keep the table's version.
// When its table returns, its schedule is {Previous: zero, Current: the
// table's limit}, and the state its siblings write under their (older)
// epoch is "older than the previous change". That state's TAT, a request
// a sibling admitted a moment ago, must still count: converting from the
// zero limit returned the change's empty TAT and forgot it, so the agent
// admitted a second request inside one emission interval (OA_budget > 0
// with failure_mode closed). Fails on 015b20b: admitted.
func TestConvertFromZeroKeepsALaterTAT(t *testing.T) {
	const s = int64(1_000_000)
	full := FromInterval(3_015_072, 1) // one request per 3 s, burst 1
	sch := Change(Version{Epoch: 21, Effective: 54_550_000}, Version{Limit: full, Epoch: 22, Effective: 61_199_000})
	if err := sch.Validate(); err != nil {
		t.Fatal(err)
	}
	// A sibling (epoch 20) admitted at 66.826 s.
	sibling := State{TAT: 66_826_160 + full.IntervalMicros(), Epoch: 20, Exists: true}
	now := 66_841_367
	_, _, r, err := Decide(sibling, int64(now), &sch, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r.Allowed {
		t.Fatalf("a request %d µs after a sibling's admission under a 3 s interval with burst 1 was admitted", now-66_826_160)
	}
	// Once the sibling's TAT has passed, the key admits again.
	if _, _, r, _ := Decide(sibling, sibling.TAT+s/10, &sch, 1); !r.Allowed {
		t.Errorf("after the sibling's TAT: denied, want admitted")
	}
	// No state, or state older than the zero limit's change and long
	// past: empty at the change, as before.
	for _, st := range []State{{}, {TAT: 1, Epoch: 20, Exists: true}} {
		if _, _, r, _ := Decide(st, 61_199_000+full.IntervalMicros()/2, &sch, 1); r.Allowed {
			t.Errorf("state %+v half an interval after the change: admitted, want empty at the change", st)
		}
	}
}
