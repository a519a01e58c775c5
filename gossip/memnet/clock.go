package memnet

import (
	"container/heap"
	"sync"
	"time"
)

// Clock is the network's time source: Now in integer microseconds, and
// AfterFunc, which calls f once, d from now (at once for d ≤ 0), unless
// stop is called first (stop reports whether it prevented the call).
type Clock interface {
	Now() int64
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// micros converts d to whole microseconds, rounding up (never early).
func micros(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

// RealClock is the machine's monotonic clock, counted in microseconds from
// the Unix epoch as of its construction; AfterFunc is time.AfterFunc.
type RealClock struct {
	start time.Time
	base  int64
}

// NewRealClock returns a real-time clock.
func NewRealClock() *RealClock {
	now := time.Now()
	return &RealClock{start: now, base: now.UnixMicro()}
}

// Now returns the time in µs; it never goes backwards.
func (c *RealClock) Now() int64 { return c.base + time.Since(c.start).Microseconds() }

// AfterFunc calls f on its own goroutine after d.
func (c *RealClock) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}

// VirtualClock is simulated time: it stands still until its owner
// advances it, and then runs the callbacks that fell due, in time order,
// ties in the order they were scheduled, each at its own instant (Now
// during a callback is that callback's due time). Callbacks run on the
// goroutine that advances the clock and may schedule more; those due
// within the same advance run in it. The zero value is not usable: see
// [NewVirtualClock]. Methods are safe for concurrent use, but only one
// goroutine should advance it.
type VirtualClock struct {
	mu  sync.Mutex
	now int64
	seq uint64
	q   timerQueue
}

// NewVirtualClock returns a clock reading start µs.
func NewVirtualClock(start int64) *VirtualClock { return &VirtualClock{now: start} }

// Now returns the current virtual time in µs.
func (c *VirtualClock) Now() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc schedules f at Now + d (rounded up to a whole µs).
func (c *VirtualClock) AfterFunc(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &timer{at: c.now + micros(d), seq: c.seq, f: f}
	c.seq++
	heap.Push(&c.q, t)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if t.index < 0 {
			return false
		}
		heap.Remove(&c.q, t.index)
		return true
	}
}

// Advance runs every callback due within d from now and leaves the clock
// at Now + d.
func (c *VirtualClock) Advance(d time.Duration) { c.RunUntil(c.Now() + micros(d)) }

// RunUntil runs every callback due at or before t, in order, and leaves
// the clock at t (or where it was, if that is later: time never goes
// backwards).
func (c *VirtualClock) RunUntil(t int64) {
	for c.step(t, true) {
	}
	c.mu.Lock()
	c.now = max(c.now, t)
	c.mu.Unlock()
}

// Step runs the next callback, whenever it is due, moving the clock to its
// time; false when none is scheduled.
func (c *VirtualClock) Step() bool { return c.step(0, false) }

// Next returns when the next callback is due; false when none is.
func (c *VirtualClock) Next() (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.q) == 0 {
		return 0, false
	}
	return c.q[0].at, true
}

// Pending counts the scheduled callbacks.
func (c *VirtualClock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.q)
}

func (c *VirtualClock) step(limit int64, bounded bool) bool {
	c.mu.Lock()
	if len(c.q) == 0 || bounded && c.q[0].at > limit {
		c.mu.Unlock()
		return false
	}
	t := heap.Pop(&c.q).(*timer)
	c.now = max(c.now, t.at)
	c.mu.Unlock()
	t.f()
	return true
}

type timer struct {
	at    int64
	seq   uint64
	f     func()
	index int
}

// timerQueue is a min-heap by (at, seq).
type timerQueue []*timer

func (q timerQueue) Len() int { return len(q) }
func (q timerQueue) Less(i, j int) bool {
	return q[i].at < q[j].at || q[i].at == q[j].at && q[i].seq < q[j].seq
}
func (q timerQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}
func (q *timerQueue) Push(x any) {
	t := x.(*timer)
	t.index = len(*q)
	*q = append(*q, t)
}
func (q *timerQueue) Pop() any {
	old := *q
	t := old[len(old)-1]
	old[len(old)-1] = nil
	t.index = -1
	*q = old[:len(old)-1]
	return t
}
