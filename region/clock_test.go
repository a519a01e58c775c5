package region

import (
	"slices"
	"sync"
	"testing"
)

// A timeline of wall-clock readings (µs) and the node's time: forward
// steps are taken at once (an NTP correction of a start-up error), a
// backward step stands still until the wall clock catches up.
func TestClockClampsBackwardSteps(t *testing.T) {
	const t0 = int64(1_700_000_000_000_000)
	tests := []struct {
		name       string
		wall, want int64
	}{
		{"t0", t0, t0},
		{"t1: +1 ms", t0 + 1_000, t0 + 1_000},
		{"t2: stepped forward 1 h", t0 + 3_600_000_000, t0 + 3_600_000_000},
		{"t3: stepped back 10 s", t0 + 3_590_000_000, t0 + 3_600_000_000},
		{"t4: still behind", t0 + 3_599_999_999, t0 + 3_600_000_000},
		{"t5: caught up", t0 + 3_600_000_001, t0 + 3_600_000_001},
		{"t6: same reading", t0 + 3_600_000_001, t0 + 3_600_000_001},
	}
	var c Clock
	for _, tt := range tests {
		if got := c.Now(tt.wall); got != tt.want {
			t.Errorf("%s: Now(t0%+d) = t0%+d, want t0%+d", tt.name, tt.wall-t0, got-t0, tt.want-t0)
		}
	}
}

// Many goroutines reading one Clock each see their own readings never go
// back, and the clock ends at the largest reading.
func TestClockConcurrent(t *testing.T) {
	var c Clock
	var wg sync.WaitGroup
	largest := make([]int64, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			last := int64(0)
			for i := range int64(10_000) {
				wall := i*8 + int64(g) - 50*(i%7) // jittering readings
				got := c.Now(wall)
				if got < last || got < wall {
					t.Errorf("goroutine %d: Now(%d) = %d after %d", g, wall, got, last)
					return
				}
				last = got
				largest[g] = max(largest[g], wall)
			}
		}()
	}
	wg.Wait()
	if got, want := c.Now(0), slices.Max(largest); got != want {
		t.Errorf("after all readings Now(0) = %d, want the largest reading %d", got, want)
	}
}
