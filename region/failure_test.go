package region

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gcra/memstore"
	"github.com/meridian-quota/meridian/gcra/redisstore"
)

// breakable is a real memstore that fails while broken is set, as a store
// behind an open circuit breaker does.
type breakable struct {
	*memstore.Store
	broken atomic.Bool
}

var errDown = errors.New("store down")

func (b *breakable) DecideAll(ctx context.Context, c []gcra.Check, out []gcra.Result) (gcra.Result, error) {
	if b.broken.Load() {
		return gcra.Result{}, errDown
	}
	return b.Store.DecideAll(ctx, c, out)
}

func TestNodeFailureModes(t *testing.T) {
	const t0 = int64(1_700_000_000_000_000)
	ms, err := memstore.New(memstore.Config{Clock: func() int64 { return t0 }, Shards: 4, MaxKeys: 1000})
	if err != nil {
		t.Fatal(err)
	}
	st := &breakable{Store: ms}
	cfg := DefaultConfig("eu", "eu-1", regions...)
	cfg.Agents = 2
	n, err := NewNode(cfg, mustPolicy(t, testPolicy), st)
	if err != nil {
		t.Fatal(err)
	}
	// A lease past the test's last instant (t0 + 144 s): a decision after
	// the lease lapses the table, and this test is about failure modes.
	tb := table(1, 1, t0, t0-hour, 1, 500_000, acme, acmeSearch)
	tb.Leases = []int64{t0 + hour, t0 + hour}
	if err := n.Apply(tb, t0); err != nil {
		t.Fatal(err)
	}
	st.broken.Store(true)
	ctx := context.Background()
	var d Decision
	decide := func(now int64, r *Request) {
		t.Helper()
		if err := n.Decide(ctx, now, r, &d); err != nil {
			t.Fatal(err)
		}
		if !d.Fallback {
			t.Fatal("store down but no fallback")
		}
	}

	// closed: the route limit denies, and the tenant limit (local) in the
	// same request is not charged.
	decide(t0, req(1, tenant("acme"), tenant("acme", Entry{"route", "/search"})))
	if d.Allowed || d.FallbackMode != FailClosed {
		t.Errorf("closed: allowed %v mode %v, want denied by closed", d.Allowed, d.FallbackMode)
	}
	// open: admits.
	decide(t0, req(1, tenant("zed", Entry{"route", "/open"})))
	if !d.Allowed || d.FallbackMode != FailOpen {
		t.Errorf("open: allowed %v mode %v, want admitted by open", d.Allowed, d.FallbackMode)
	}
	// local: the region's limit (50 %: 50/h, burst 5) over 2 agents: burst
	// 2, one token every 2·72 s.
	admitted := 0
	for range 5 {
		decide(t0, req(1, tenant("acme")))
		if d.FallbackMode != FailLocal {
			t.Fatalf("mode %v, want local", d.FallbackMode)
		}
		if d.Allowed {
			admitted++
		}
	}
	if admitted != 2 {
		t.Errorf("local admitted %d, want 2 (burst 5 / 2 agents; the closed denial charged nothing)", admitted)
	}
	if d.Result.RetryAfter != 144*time.Second {
		t.Errorf("local retry-after %v, want 144s", d.Result.RetryAfter)
	}
	decide(t0+144e6, req(1, tenant("acme")))
	if !d.Allowed {
		t.Error("local: denied after the retry-after passed")
	}
	// More live agents than configured divide further.
	n.SetLiveAgents(5)
	decide(t0, req(1, tenant("fresh")))
	if lim := d.Matches[0].Result.Limit; lim.Burst() != 1 || lim.IntervalMicros() != 5*n.cfgLimit(t, "fresh").IntervalMicros() {
		t.Errorf("local limit with 5 live agents %v", lim)
	}
	s := n.Stats()
	if s.FallbackClosed != 1 || s.FallbackOpen != 1 || s.FallbackLocal != 7 || s.StoreErrors != 9 {
		t.Errorf("stats %+v, want closed 1, open 1, local 7, store errors 9", s)
	}

	// Back up: the store decides again, and the local fallback consumed
	// nothing in it (the tenant still has its 5).
	st.broken.Store(false)
	if got := decideN(t, n, t0, req(1, tenant("acme")), 9); got != 5 {
		t.Errorf("after recovery admitted %d, want 5", got)
	}
}

// cfgLimit is the regional limit the node resolves for a tenant key.
func (n *Node) cfgLimit(t *testing.T, name string) gcra.Limit {
	t.Helper()
	var d Decision
	if err := n.Resolve(req(1, tenant(name)), &d); err != nil || len(d.Matches) != 1 {
		t.Fatalf("resolve %s: %v", name, err)
	}
	return d.Matches[0].Schedule.Current.Limit
}

// TestNodeRedisTimeout points a real redisstore at a server that accepts
// connections and never answers: every decision times out and the limit's
// failure mode decides.
func TestNodeRedisTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { // read and never reply
				buf := make([]byte, 4096)
				for {
					if _, err := c.Read(buf); err != nil {
						c.Close()
						return
					}
				}
			}()
		}
	}()
	c := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer c.Close()
	rcfg := redisstore.DefaultConfig()
	rcfg.Prefix = "mtest:timeout:"
	rcfg.Timeout = 20 * time.Millisecond
	rs, err := redisstore.New(c, rcfg)
	if err != nil {
		t.Fatal(err)
	}
	n, err := NewNode(DefaultConfig("eu", "eu-1", regions...), mustPolicy(t, testPolicy), rs)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMicro()
	var d Decision
	for _, tt := range []struct {
		r    *Request
		mode FailureMode
		want bool
	}{
		{req(1, tenant("a", Entry{"route", "/search"})), FailClosed, false},
		{req(1, tenant("a", Entry{"route", "/open"})), FailOpen, true},
		{req(1, tenant("a")), FailLocal, true}, // the safe share's burst of 1
		{req(1, tenant("a")), FailLocal, false},
	} {
		if err := n.Decide(context.Background(), now, tt.r, &d); err != nil {
			t.Fatal(err)
		}
		if !d.Fallback || d.FallbackMode != tt.mode || d.Allowed != tt.want {
			t.Errorf("%v: fallback %v mode %v allowed %v, want mode %v allowed %v",
				tt.r.Descriptors[0].Entries, d.Fallback, d.FallbackMode, d.Allowed, tt.mode, tt.want)
		}
	}
	if s := n.Stats(); s.StoreErrors != 4 {
		t.Errorf("StoreErrors = %d, want 4", s.StoreErrors)
	}
}
