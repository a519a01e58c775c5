package protocol

import (
	"errors"
	"fmt"
	"time"
)

// The watch of the table head: which heads a watcher delivers, when it
// retries a failed watch and when it rereads the head. The adapters
// (gossip.Transport.WatchTables on JetStream KV, memnet's WatchHeads) do
// the watching, reading and waiting; the decisions are here, so both
// follow one rule.

// WatchConfig times a head watch.
type WatchConfig struct {
	// Resync is how often the head is reread while the watch is up,
	// whatever the watch says, in case it stalled without failing.
	Resync time.Duration
	// RetryMin is the wait after the first failure to create the watch;
	// each further failure doubles it, up to RetryMax.
	RetryMin time.Duration
	RetryMax time.Duration
}

// DefaultWatchConfig returns the timings gossip.Transport and memnet use.
func DefaultWatchConfig() WatchConfig {
	return WatchConfig{
		Resync:   5 * time.Second,        // a stalled watch costs at most 5 s of tables; one read per 5 s per agent
		RetryMin: 100 * time.Millisecond, // a dropped watch over a live connection comes back within a round trip or two
		RetryMax: 2 * time.Second,        // an outage costs at most one read per agent per 2 s, and ends noticed within 2 s
	}
}

// Validate reports every field out of range.
func (c WatchConfig) Validate() error {
	var errs []error
	if c.Resync <= 0 {
		errs = append(errs, fmt.Errorf("resync %v: must be positive", c.Resync))
	}
	if c.RetryMin <= 0 || c.RetryMax < c.RetryMin {
		errs = append(errs, fmt.Errorf("retry_min %v, retry_max %v: want 0 < min ≤ max", c.RetryMin, c.RetryMax))
	}
	return errors.Join(errs...)
}

// HeadOrder decides which heads a watcher delivers: a head whose revision
// is above every one delivered since the watch was last created, and the
// first head a re-created watch reads whatever its revision unless it is
// the last one delivered. So within one watch its consumer sees strictly
// increasing revisions — never an older head after a newer one, never the
// same twice — however the heads reach the watcher: the watch's initial
// value and updates, a resync's read. A re-created watch reads the store's
// current head, and its revision may be below the last one delivered
// because the bucket was deleted and recreated and its sequence restarted
// at 1: it is delivered, and the Follower orders it by (term, epoch) as it
// orders everything (see the package doc, # Watch).
//
// The zero value is ready: it delivers the first head it sees. A
// HeadOrder is not safe for concurrent use.
type HeadOrder struct {
	last    uint64 // the revision last delivered; 0: none
	rewatch bool   // Rewatch: the next head may have any revision
}

// Seen reports whether the head at rev, just read from the store, is to be
// delivered; if so it becomes the last.
func (o *HeadOrder) Seen(rev uint64) (deliver bool) {
	if o.rewatch && rev != o.last {
		o.rewatch, o.last = false, rev
		return true
	}
	if rev <= o.last {
		return false
	}
	o.rewatch, o.last = false, rev
	return true
}

// Rewatch says the watch was (re)created: its first head is the store's
// current one, delivered whatever its revision.
func (o *HeadOrder) Rewatch() { o.rewatch = true }

// Last returns the revision last delivered (0: none).
func (o *HeadOrder) Last() uint64 { return o.last }

// WatchTimer decides when a watcher retries a watch it failed to create
// and when it rereads the head while the watch is up. Instants are µs on
// the shell's clock (any clock: only differences matter).
//
// Failures back off exponentially without jitter: RetryMin after the
// first, doubled after each further one, capped at RetryMax — 100 ms,
// 200 ms, 400 ms, 800 ms, 1.6 s, 2 s, 2 s … by default (the unjittered
// form of gossip's backoff(first, max)). The watch coming up (Up) or the
// store becoming reachable again (Reset) starts over at RetryMin.
//
// The zero value uses DefaultWatchConfig. A WatchTimer is not safe for
// concurrent use.
type WatchTimer struct {
	cfg      WatchConfig
	wait     time.Duration // the next failure's wait; 0: RetryMin
	failures int           // consecutive failures since the watch was last up
}

// NewWatchTimer returns a timer with cfg, which should be valid
// (WatchConfig.Validate).
func NewWatchTimer(cfg WatchConfig) WatchTimer { return WatchTimer{cfg: cfg} }

func (t *WatchTimer) config() WatchConfig {
	if t.cfg == (WatchConfig{}) {
		return DefaultWatchConfig()
	}
	return t.cfg
}

// Failed records that creating the watch failed at now and returns when
// to try again.
func (t *WatchTimer) Failed(now int64) (retryAt int64) {
	cfg := t.config()
	if t.wait == 0 {
		t.wait = cfg.RetryMin
	}
	retryAt = now + micros(t.wait)
	t.wait = min(2*t.wait, cfg.RetryMax)
	t.failures++
	return retryAt
}

// Failures returns the failures since the watch was last up (Up).
func (t *WatchTimer) Failures() int { return t.failures }

// Reset starts the backoff over at RetryMin without the watch being up:
// the shell knows the store is reachable again and retries at once.
func (t *WatchTimer) Reset() { t.wait = 0 }

// Up records that the watch was created at now: the backoff starts over
// and the failures are forgotten. It returns when to reread the head
// first.
func (t *WatchTimer) Up(now int64) (resyncAt int64) {
	t.wait, t.failures = 0, 0
	return t.NextResync(now)
}

// NextResync returns when to reread the head after a resync due (or a
// watch created) at now: one Resync later, whether or not the read at now
// succeeded.
func (t *WatchTimer) NextResync(now int64) int64 { return now + micros(t.config().Resync) }

// HeadWatch is the whole rule of one watcher of the table head, for a
// shell that runs it on one goroutine (gossip.Transport.WatchTables):
// HeadOrder's Seen, and WatchTimer's Failed, Up, Reset and NextResync. A
// shell that delivers heads and schedules retries under different locks
// (memnet) holds the two parts apart; they share no state.
//
// The zero value is ready, timed by DefaultWatchConfig. A HeadWatch is
// not safe for concurrent use.
type HeadWatch struct {
	HeadOrder
	WatchTimer
}

// NewHeadWatch returns a watch that has delivered nothing, timed by cfg
// (which should be valid).
func NewHeadWatch(cfg WatchConfig) *HeadWatch {
	return &HeadWatch{WatchTimer: NewWatchTimer(cfg)}
}

// Up is WatchTimer's Up, and HeadOrder's Rewatch: the watch came up (was
// created or re-created), so its first head is the store's current one.
func (w *HeadWatch) Up(now int64) (resyncAt int64) {
	w.Rewatch()
	return w.WatchTimer.Up(now)
}

// micros converts d to whole µs, rounding up (never early).
func micros(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}
