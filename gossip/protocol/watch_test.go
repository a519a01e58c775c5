package protocol

import (
	"slices"
	"testing"
	"time"
)

func TestHeadOrder(t *testing.T) {
	tests := []struct {
		name string
		give []uint64 // revisions as they reach the watcher
		want []uint64 // those delivered
	}{
		{"first head delivered", []uint64{7}, []uint64{7}},
		{"newer heads delivered in order", []uint64{1, 2, 5}, []uint64{1, 2, 5}},
		{"duplicate skipped (re-created watch, resync)", []uint64{3, 3, 3, 4, 4}, []uint64{3, 4}},
		{"older after newer skipped (reordered)", []uint64{5, 4, 6, 2}, []uint64{5, 6}},
		// The bucket was lost at revision 9 and recreated: its sequence
		// restarts at 1, and nothing is delivered until it passes 9.
		{"bucket loss: withheld until past the last", []uint64{8, 9, 1, 2, 9, 10, 11}, []uint64{8, 9, 10, 11}},
		{"revision 0 is no head", []uint64{0, 1}, []uint64{1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var o HeadOrder // zero value ready
			var got []uint64
			for _, rev := range tt.give {
				if o.Seen(rev) {
					got = append(got, rev)
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("delivered %v, want %v", got, tt.want)
			}
			if want := slices.Max(tt.give); o.Last() != want {
				t.Errorf("Last %d, want %d", o.Last(), want)
			}
		})
	}
}

const ms = int64(time.Millisecond / time.Microsecond)

// A watch that keeps failing backs off 100 ms, 200 ms … 2 s, exactly; the
// watch coming up starts over.
func TestWatchTimerBackoff(t *testing.T) {
	var w HeadWatch // zero value: DefaultWatchConfig
	now := int64(1_000_000)
	var waits []int64
	for range 8 {
		at := w.Failed(now)
		waits = append(waits, (at-now)/ms)
		now = at
	}
	if want := []int64{100, 200, 400, 800, 1600, 2000, 2000, 2000}; !slices.Equal(waits, want) {
		t.Fatalf("waits %v ms, want %v", waits, want)
	}
	if w.Failures() != 8 {
		t.Fatalf("Failures %d, want 8", w.Failures())
	}
	w.Up(now)
	if w.Failures() != 0 {
		t.Fatalf("Failures %d after Up, want 0", w.Failures())
	}
	if got := w.Failed(now) - now; got != 100*ms {
		t.Fatalf("first wait after Up %d µs, want 100 ms", got)
	}
	w.Failed(now)
	w.Reset()
	if got := w.Failed(now) - now; got != 100*ms {
		t.Fatalf("first wait after Reset %d µs, want 100 ms", got)
	}
	if w.Failures() != 3 {
		t.Fatalf("Failures %d, want 3 (Reset keeps the count)", w.Failures())
	}
}

// The backoff is the unjittered form of gossip's backoff(first, max):
// first doubled per attempt after the first, capped at max — for bounds
// that are not a power of two apart too.
func TestWatchTimerBackoffFormula(t *testing.T) {
	tests := []struct{ first, max time.Duration }{
		{100 * time.Millisecond, 2 * time.Second},
		{300 * time.Millisecond, 1 * time.Second},
		{time.Second, time.Second},
		{time.Microsecond, time.Millisecond},
	}
	for _, tt := range tests {
		w := NewHeadWatch(WatchConfig{Resync: time.Second, RetryMin: tt.first, RetryMax: tt.max})
		for attempts := 1; attempts <= 20; attempts++ {
			d := tt.first // gossip's backoff without its jitter
			for i := 1; i < attempts && d < tt.max; i++ {
				d *= 2
			}
			d = min(d, tt.max)
			if got := w.Failed(0); got != d.Microseconds() {
				t.Fatalf("%v…%v attempt %d: wait %d µs, want %v", tt.first, tt.max, attempts, got, d)
			}
		}
	}
}

// A timeline in virtual time: the watch fails twice, comes up, rereads the
// head every Resync, drops, and comes back.
func TestHeadWatchTimeline(t *testing.T) {
	w := NewHeadWatch(WatchConfig{Resync: 5 * time.Second, RetryMin: 100 * time.Millisecond, RetryMax: 2 * time.Second})
	s := int64(time.Second / time.Microsecond)
	var delivered []uint64
	seen := func(rev uint64) {
		if w.Seen(rev) {
			delivered = append(delivered, rev)
		}
	}
	t0 := int64(0)
	t1 := w.Failed(t0) // t0: create fails
	t2 := w.Failed(t1) // t1: create fails again
	if t1 != 100*ms || t2 != 300*ms {
		t.Fatalf("retries at %d, %d µs, want 100 ms, 300 ms", t1, t2)
	}
	r := w.Up(t2) // t2: the watch is up and delivers the current head
	seen(4)
	if r != t2+5*s {
		t.Fatalf("first resync at %d, want %d", r, t2+5*s)
	}
	var resyncs []int64
	for range 3 { // each resync reads the head, unchanged: nothing delivered
		resyncs = append(resyncs, r)
		seen(4)
		r = w.NextResync(r)
	}
	if want := []int64{t2 + 5*s, t2 + 10*s, t2 + 15*s}; !slices.Equal(resyncs, want) {
		t.Fatalf("resyncs at %v, want %v", resyncs, want)
	}
	seen(5) // an update
	// The watch drops at t3; re-created at once, it delivers the current
	// head again, which is not delivered twice.
	t3 := t2 + 16*s
	r = w.Up(t3)
	seen(5)
	seen(6)
	if r != t3+5*s {
		t.Fatalf("resync after re-creation at %d, want %d", r, t3+5*s)
	}
	if want := []uint64{4, 5, 6}; !slices.Equal(delivered, want) {
		t.Fatalf("delivered %v, want %v", delivered, want)
	}
}

func TestWatchConfigValidate(t *testing.T) {
	if err := DefaultWatchConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	if err := (WatchConfig{RetryMin: time.Second, RetryMax: time.Millisecond}).Validate(); err == nil {
		t.Fatal("zero resync and max < min: no error")
	}
}

// TestHeadOrderRewatch: within one watch revisions only rise; the first
// head of a re-created watch is delivered whatever its revision (a
// recreated bucket restarts at 1), unless it is the last one delivered.
// Fails on 1088a93 (no Rewatch: a recreated bucket's heads were withheld
// until its revisions passed the old one's; issue 17, defect 3).
func TestHeadOrderRewatch(t *testing.T) {
	var o HeadOrder
	for i, step := range []struct {
		rewatch bool
		rev     uint64
		want    bool
	}{
		{false, 1, true}, {false, 3, true}, {false, 2, false}, {false, 3, false},
		{true, 3, false}, // reconnected: the same head again
		{false, 4, true},
		{true, 1, true}, // the bucket was recreated
		{false, 1, false}, {false, 2, true}, {false, 1, false},
	} {
		if step.rewatch {
			o.Rewatch()
		}
		if got := o.Seen(step.rev); got != step.want {
			t.Fatalf("step %d: Seen(%d) = %v, want %v (last %d)", i, step.rev, got, step.want, o.Last())
		}
	}
}
