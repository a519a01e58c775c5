package agent

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/gcra"
)

// gateStore holds each DecideAll until the test replies: it sends the
// call's reply channel on entered and returns what it receives on it.
type gateStore struct{ entered chan chan error }

func newGateStore() *gateStore { return &gateStore{entered: make(chan chan error)} }

func (s *gateStore) DecideAll(context.Context, []gcra.Check, []gcra.Result) (gcra.Result, error) {
	reply := make(chan error)
	s.entered <- reply
	return gcra.Result{}, <-reply
}

// gatedCall is one DecideAll through a Breaker in front of a gateStore:
// either in the store (reply set) or refused at once (refused set).
type gatedCall struct {
	reply   chan error
	refused error
	result  chan error
}

// begin starts a call and returns once it is in the store or refused.
func begin(b *Breaker, s *gateStore) gatedCall {
	res := make(chan error, 1)
	go func() {
		_, err := b.DecideAll(context.Background(), nil, nil)
		res <- err
	}()
	select {
	case r := <-s.entered: // in the store, blocked on r: res cannot come first
		return gatedCall{reply: r, result: res}
	case err := <-res:
		return gatedCall{refused: err}
	}
}

// finish makes the store answer the call with err and returns what the
// Breaker returned.
func (c gatedCall) finish(t *testing.T, err error) error {
	t.Helper()
	if c.reply == nil {
		t.Fatalf("the call was refused (%v), not let through", c.refused)
	}
	c.reply <- err
	return <-c.result
}

var errDown = errors.New("redis: connection refused")

// healthyErr is a store error that says nothing about the store's health.
type healthyErr struct{}

func (healthyErr) Error() string      { return "malformed state" }
func (healthyErr) StoreHealthy() bool { return true }

// newGatedBreaker returns a Breaker in front of a gateStore on a clock the
// test moves (µs).
func newGatedBreaker(t *testing.T, failures int, cooldown time.Duration) (*Breaker, *gateStore, *atomic.Int64) {
	t.Helper()
	s := newGateStore()
	b, err := NewBreaker(BreakerConfig{Failures: failures, Cooldown: Duration(cooldown)}, s)
	if err != nil {
		t.Fatal(err)
	}
	var clock atomic.Int64
	b.now = clock.Load
	return b, s, &clock
}

// Regressions of the rule's move into region.BreakerPolicy, through the
// shell with calls in flight. Each fails on 4f80dd1.
func TestBreakerCallsInFlight(t *testing.T) {
	const hour = int64(time.Hour / time.Microsecond)

	// A call let through while closed and succeeding after the breaker
	// opened closed it again at once, cutting the cooldown short.
	t.Run("a late success does not close an open breaker", func(t *testing.T) {
		b, s, _ := newGatedBreaker(t, 2, time.Hour)
		late := begin(b, s)
		for range 2 {
			if err := begin(b, s).finish(t, errDown); !errors.Is(err, errDown) {
				t.Fatalf("failing call returned %v", err)
			}
		}
		if !b.Open() {
			t.Fatal("two failures left the breaker closed")
		}
		if err := late.finish(t, nil); err != nil {
			t.Fatal(err)
		}
		if !b.Open() {
			t.Error("a call let through before the breaker opened closed it by succeeding after")
		}
		if c := begin(b, s); !errors.Is(c.refused, ErrBreakerOpen) {
			t.Errorf("a call in the cooldown: %v, want ErrBreakerOpen", c.refused)
			c.finish(t, nil)
		}
	})

	// A probe whose store call hung held the breaker open for ever.
	t.Run("a hung probe does not hold the breaker open", func(t *testing.T) {
		b, s, clock := newGatedBreaker(t, 1, time.Hour)
		begin(b, s).finish(t, errDown)
		clock.Store(hour)
		hung := begin(b, s) // the probe
		if c := begin(b, s); c.refused == nil {
			t.Fatal("a second call went through beside the probe")
		}
		clock.Store(2 * hour)
		next := begin(b, s)
		if next.reply == nil {
			t.Fatalf("a cooldown after the probe started, with no report: %v, want a new probe", next.refused)
		}
		if err := next.finish(t, nil); err != nil || b.Open() {
			t.Errorf("the new probe's success: %v, open %v; want it closed", err, b.Open())
		}
		hung.finish(t, nil)
	})

	// A call let through while closed and ending, after the breaker opened,
	// with an error that says nothing about the store cleared the
	// outstanding probe: a second call probed beside the first.
	t.Run("a late ignored error does not let a second probe through", func(t *testing.T) {
		b, s, clock := newGatedBreaker(t, 2, time.Hour)
		late := begin(b, s)
		begin(b, s).finish(t, errDown)
		begin(b, s).finish(t, errDown)
		clock.Store(hour)
		probe := begin(b, s)
		if err := late.finish(t, fmt.Errorf("decide: %w", healthyErr{})); err == nil {
			t.Fatal("the late call returned no error")
		}
		if c := begin(b, s); c.refused == nil {
			t.Error("a second probe went through beside the first")
			c.finish(t, nil)
		}
		if err := probe.finish(t, nil); err != nil || b.Open() {
			t.Errorf("the probe's success: %v, open %v; want it closed", err, b.Open())
		}
	})
}

// storeFunc is a region.Store answering every DecideAll with f.
type storeFunc func() (gcra.Result, error)

func (f storeFunc) DecideAll(context.Context, []gcra.Check, []gcra.Result) (gcra.Result, error) {
	return f()
}

// A store call that panics says nothing about the store's health. It was
// counted as a success: a probe that panicked closed the breaker, and a
// panic broke a run of failures. Fails on 4f80dd1.
func TestBreakerStorePanic(t *testing.T) {
	var panics atomic.Bool
	b, err := NewBreaker(BreakerConfig{Failures: 1, Cooldown: Duration(time.Hour)}, storeFunc(func() (gcra.Result, error) {
		if panics.Load() {
			panic("store bug")
		}
		return gcra.Result{}, errDown
	}))
	if err != nil {
		t.Fatal(err)
	}
	var clock atomic.Int64
	b.now = clock.Load
	call := func() (err error, panicked bool) {
		defer func() { panicked = recover() != nil }()
		_, err = b.DecideAll(context.Background(), nil, nil)
		return err, false
	}
	if err, _ := call(); !errors.Is(err, errDown) || !b.Open() {
		t.Fatalf("first call: %v, open %v; want errDown and open", err, b.Open())
	}
	clock.Store(int64(time.Hour / time.Microsecond))
	panics.Store(true)
	if _, panicked := call(); !panicked {
		t.Fatal("the probe did not reach the store")
	}
	if !b.Open() {
		t.Error("a probe that panicked closed the breaker")
	}
	panics.Store(false)
	if err, _ := call(); !errors.Is(err, errDown) {
		t.Errorf("after the panicking probe: %v, want the next call to probe at once", err)
	}
}
