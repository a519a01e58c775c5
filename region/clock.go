package region

import "sync/atomic"

// Clock turns wall-clock readings into the node's time: µs that never go
// back. Leases and effective times are instants on the coordinator's wall
// clock, so a shell must give the node its host's wall clock — an error
// the host had when the process started (booted before NTP synced, a VM
// resumed) must go away when the host's clock is corrected, not stay for
// the life of the process as "start wall time + monotonic time since" would
// keep it. A wall clock can also step back; the deny cache and the report
// intervals need time that never does, so Now clamps a reading below the
// largest one before to that one (as golang.org/x/time/rate treats time
// going backwards): after a step back the node's time stands still until
// the wall clock catches up. If every reading is within MaxSkew of true
// time, so is every clamped one.
//
// Clock reads no clock itself: the shell passes each reading in. The zero
// value is ready to use (no reading yet); it is safe for concurrent use.
type Clock struct{ last atomic.Int64 }

// Now returns the node's time for the wall-clock reading wall (µs since
// the Unix epoch): the largest reading passed so far, wall included.
func (c *Clock) Now(wall int64) int64 {
	for {
		last := c.last.Load()
		if wall <= last {
			return last
		}
		if c.last.CompareAndSwap(last, wall) {
			return wall
		}
	}
}
