package sim

import (
	"testing"
	"time"
)

// TestRunKeepsNoHistory runs two simulated minutes at Δ = 1 s (about
// 280 tables) and checks that what the run keeps of the bucket's past does not
// grow with them: the genuine heads a replay fault may still ask for (the
// newest alone when the schedule has no replay left; those within its age,
// all of them, when it has) and the decode cache, bounded by
// maxDecodedBytes (lowered here to 64 KiB so that it bites). Before, the run kept
// the last 512 heads — each, for a chunked table, with the buffer of every
// chunk it was encoded beside — and cleared the decode cache only when a
// chunked table was stored, which a cluster of delta tables never does:
// many-keys grew to 3.5 GiB in a simulated hour (223 MiB when the README
// measured it). Fails on 66437ab (512 heads kept).
func TestRunKeepsNoHistory(t *testing.T) {
	tests := []struct {
		name               string
		heads              []HeadSpec
		minHeads, maxHeads int // kept at the end of the run
	}{
		{name: "no replay", minHeads: 1, maxHeads: 1},
		// A replay at 1 min 50 s of a head 20 s old: kept are the heads of
		// the 20 s before it (up to two an interval: a decrease and its
		// increase), and the one before them, until it is written.
		{name: "replay ahead", heads: []HeadSpec{{At: Duration(110 * time.Second), Kind: "replayed", Age: Duration(20 * time.Second)}}, minHeads: 1, maxHeads: 1},
		{name: "replay at the end", heads: []HeadSpec{{At: Duration(120 * time.Second), Kind: "replayed", Age: Duration(20 * time.Second)}}, minHeads: 20, maxHeads: 41},
	}
	defer func(b int64) { maxDecodedBytes = b }(maxDecodedBytes)
	maxDecodedBytes = 64 << 10
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sc, err := Builtin("steady-skew")
			if err != nil {
				t.Fatal(err)
			}
			sc.Duration = Duration(2 * time.Minute)
			sc.Workload.Rate = 200
			sc.Faults.Heads = tt.heads
			r, err := NewRun(sc, "quantile", time.Second, 1, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := r.Simulate(); err != nil {
				t.Fatal(err)
			}
			if r.bucketSeq < 100 {
				t.Fatalf("the run stored %d heads; want one a second", r.bucketSeq)
			}
			if n := len(r.tkv.genuine); n < tt.minHeads || n > tt.maxHeads {
				t.Errorf("the run keeps %d genuine heads of %d stored; want %d to %d", n, r.bucketSeq, tt.minHeads, tt.maxHeads)
			}
			// Each stored head is read, so a cache that kept them all would
			// hold one per head.
			if r.decodedBytes > maxDecodedBytes || uint64(len(r.decoded)) >= r.bucketSeq/2 {
				t.Errorf("the decode cache holds %d messages, %d encoded bytes, after %d heads; want at most %d bytes", len(r.decoded), r.decodedBytes, r.bucketSeq, maxDecodedBytes)
			}
		})
	}
}
