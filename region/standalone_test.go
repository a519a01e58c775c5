package region

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gcra/memstore"
)

const standalonePolicy = `
domains:
  - domain: api
    descriptors:
      - key: tenant
        rate_limit: {unit: second, requests_per_unit: 1000, burst: 200}
      - key: user
        rate_limit: {unit: second, requests_per_unit: 5, burst: 3}
`

// TestStandaloneHoldsTheWholeBudget: a node made with StandaloneConfig and
// no table runs every key at the global limit, on a virtual clock that
// stands still, so no verdict depends on the machine's speed.
//
// Fails on 4804b9e: StandaloneConfig did not exist, and DefaultConfig for
// one region (what a standalone agent ran) held 10 % of every budget:
// 5/s burst 3 admitted 1 and asked to retry after 2 s; 1000/s burst 200
// admitted 20, then T = 10 ms.
func TestStandaloneHoldsTheWholeBudget(t *testing.T) {
	const t0 = int64(1_700_000_000_000_000)
	ms, err := memstore.New(memstore.Config{Clock: func() int64 { return t0 }, Shards: 4, MaxKeys: 1000})
	if err != nil {
		t.Fatal(err)
	}
	n, err := NewNode(StandaloneConfig("eu", "eu-1"), mustPolicy(t, standalonePolicy), ms)
	if err != nil {
		t.Fatal(err)
	}
	if got := n.SafeShare(); got != 1_000_000 {
		t.Errorf("SafeShare = %d ppm, want 1000000", got)
	}
	tests := []struct {
		key            string
		wantAdmitted   int64
		wantRetryAfter time.Duration // of the first denial
		wantLimit      gcra.Limit
	}{
		{"tenant", 200, time.Millisecond, gcra.PerSecond(1000, 200)},
		{"user", 3, 200 * time.Millisecond, gcra.PerSecond(5, 3)},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			r := &Request{Domain: "api", Descriptors: []Descriptor{{Entries: []Entry{{tt.key, "acme"}}}}, Cost: 1}
			var d Decision
			for i := range tt.wantAdmitted + 1 {
				if err := n.Decide(context.Background(), t0, r, &d); err != nil {
					t.Fatal(err)
				}
				m := d.MatchOf(0)
				if got, want := m.Result.Limit, tt.wantLimit; got.IntervalMicros() != want.IntervalMicros() || got.Burst() != want.Burst() {
					t.Fatalf("request %d enforced %v, want the global %v", i+1, got, want)
				}
				if i < tt.wantAdmitted {
					if !d.Allowed || m.Result.Remaining != tt.wantAdmitted-1-i {
						t.Fatalf("request %d: allowed %v remaining %d, want admitted with %d left", i+1, d.Allowed, m.Result.Remaining, tt.wantAdmitted-1-i)
					}
					continue
				}
				if d.Allowed || d.Result.RetryAfter != tt.wantRetryAfter {
					t.Errorf("request %d: allowed %v retry after %v, want denied, retry after %v", i+1, d.Allowed, d.Result.RetryAfter, tt.wantRetryAfter)
				}
			}
		})
	}
}

const errorModePolicy = `
domains:
  - domain: f
    descriptors:
      - key: error
        rate_limit: {unit: hour, requests_per_unit: 100, burst: 10, failure_mode: error}
      - key: closed
        rate_limit: {unit: hour, requests_per_unit: 100, burst: 10, failure_mode: closed}
      - key: open
        rate_limit: {unit: hour, requests_per_unit: 100, burst: 10, failure_mode: open}
      - key: local
        rate_limit: {unit: hour, requests_per_unit: 100, burst: 10, failure_mode: local}
`

// TestFailErrorLeavesTheDecisionToTheCaller: with the store down, a request
// with a failure_mode error limit is not decided (the shell answers an
// error) unless a closed limit of the same composite denies it; error wins
// over local and open. Counted in Stats.FallbackError.
//
// Fails on 4804b9e: FailError was parsed but decided as open (admitted).
func TestFailErrorLeavesTheDecisionToTheCaller(t *testing.T) {
	const t0 = int64(1_700_000_000_000_000)
	ms, err := memstore.New(memstore.Config{Clock: func() int64 { return t0 }, Shards: 4, MaxKeys: 1000})
	if err != nil {
		t.Fatal(err)
	}
	st := &breakable{Store: ms}
	n, err := NewNode(StandaloneConfig("eu", "eu-1"), mustPolicy(t, errorModePolicy), st)
	if err != nil {
		t.Fatal(err)
	}
	st.broken.Store(true)
	d1 := func(keys ...string) *Request {
		r := &Request{Domain: "f", Cost: 1}
		for _, k := range keys {
			r.Descriptors = append(r.Descriptors, Descriptor{Entries: []Entry{{k, "x"}}})
		}
		return r
	}
	tests := []struct {
		name        string
		give        *Request
		wantMode    FailureMode
		wantAllowed bool
	}{
		{"error alone", d1("error"), FailError, false},
		{"error with local", d1("local", "error"), FailError, false},
		{"error with open", d1("open", "error"), FailError, false},
		{"closed wins over error", d1("error", "closed"), FailClosed, false},
		{"local alone still decides", d1("local"), FailLocal, true},
		{"open alone still admits", d1("open"), FailOpen, true},
	}
	var d Decision
	errors0 := n.Stats().FallbackError
	wantErrors := int64(0)
	for _, tt := range tests {
		if err := n.Decide(context.Background(), t0, tt.give, &d); err != nil {
			t.Fatalf("%s: a store failure is not a request error: %v", tt.name, err)
		}
		if !d.Fallback || d.FallbackMode != tt.wantMode || d.Allowed != tt.wantAllowed || !errors.Is(d.StoreErr, errDown) {
			t.Errorf("%s: fallback %v mode %v allowed %v err %v, want mode %v allowed %v err %v",
				tt.name, d.Fallback, d.FallbackMode, d.Allowed, d.StoreErr, tt.wantMode, tt.wantAllowed, errDown)
		}
		if tt.wantMode == FailError {
			wantErrors++
		}
	}
	if got := n.Stats().FallbackError - errors0; got != wantErrors {
		t.Errorf("Stats.FallbackError = %d, want %d", got, wantErrors)
	}
	// The store back: decided as usual, nothing left over from the outage.
	st.broken.Store(false)
	if err := n.Decide(context.Background(), t0, d1("error"), &d); err != nil || d.Fallback || d.StoreErr != nil || !d.Allowed {
		t.Errorf("store back: err %v fallback %v store err %v allowed %v, want decided and admitted", err, d.Fallback, d.StoreErr, d.Allowed)
	}
}
