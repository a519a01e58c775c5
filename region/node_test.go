package region

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gcra/memstore"
	"github.com/meridian-quota/meridian/gcra/redisstore"
	"github.com/meridian-quota/meridian/internal/testenv"
	"github.com/meridian-quota/meridian/rebalance"
)

// testPolicy has an hourly tenant limit with a narrower route limit below
// it, a regional limit and a shadow limit. Hourly limits make the tests
// independent of real time: on Redis (which decides on its own clock) the
// milliseconds a test takes refill nothing (a token takes ≥ 36 s).
const testPolicy = `
domains:
  - domain: api
    hash_tag: tenant
    descriptors:
      - key: tenant
        rate_limit: {unit: hour, requests_per_unit: 100, burst: 10, name: tenant}
        descriptors:
          - key: route
            value: /search
            rate_limit: {unit: hour, requests_per_unit: 50, burst: 4, failure_mode: closed}
          - key: route
            value: /open
            rate_limit: {unit: hour, requests_per_unit: 50, burst: 4, failure_mode: open}
          - key: route
            value: /shadow
            shadow_mode: true
            rate_limit: {unit: hour, requests_per_unit: 10, burst: 2}
          - key: region
            rate_limit: {unit: hour, requests_per_unit: 10, burst: 3, scope: regional}
`

var regions = []string{"eu", "us"}

func mustPolicy(t testing.TB, src string) *Policy {
	t.Helper()
	p, err := ParsePolicy([]byte(src))
	if err != nil {
		t.Fatalf("ParsePolicy: %v", err)
	}
	return p
}

// env is a store with a clock the test reads: a memstore on a fixed
// virtual instant, or real Redis (deciding on its TIME).
type env struct {
	name  string
	store Store
	now   func() int64
}

func envs(t *testing.T) []env {
	t.Helper()
	var clock atomic.Int64
	clock.Store(1_700_000_000_000_000)
	cfg := memstore.DefaultConfig()
	cfg.Clock = clock.Load
	ms, err := memstore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	out := []env{{name: "memstore", store: ms, now: clock.Load}}
	if testing.Short() {
		return out
	}
	c := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	t.Cleanup(func() { testenv.Cleanup(t, c, prefix) })
	rcfg := redisstore.DefaultConfig()
	rcfg.Prefix = prefix
	rs, err := redisstore.New(c, rcfg)
	if err != nil {
		t.Fatal(err)
	}
	redisNow := func() int64 {
		tm, err := c.Time(context.Background()).Result()
		if err != nil {
			t.Fatalf("TIME: %v", err)
		}
		return tm.UnixMicro()
	}
	return append(out, env{name: "redis", store: rs, now: redisNow})
}

// forEachStore runs f once per store, each with a fresh node.
func forEachStore(t *testing.T, f func(t *testing.T, e env, n *Node)) {
	for _, e := range envs(t) {
		t.Run(e.name, func(t *testing.T) {
			n, err := NewNode(DefaultConfig("eu", "eu-1", regions...), mustPolicy(t, testPolicy), e.store)
			if err != nil {
				t.Fatal(err)
			}
			f(t, e, n)
		})
	}
}

func tenant(name string, extra ...Entry) Descriptor {
	return Descriptor{Entries: append([]Entry{{"tenant", name}}, extra...)}
}

func req(cost int64, ds ...Descriptor) *Request {
	return &Request{Domain: "api", Descriptors: ds, Cost: cost}
}

// decideN sends the request k times at now and returns how many were
// admitted.
func decideN(t *testing.T, n *Node, now int64, r *Request, k int) int {
	t.Helper()
	var d Decision
	admitted := 0
	for range k {
		if err := n.Decide(context.Background(), now, r, &d); err != nil {
			t.Fatalf("Decide: %v", err)
		}
		if d.Fallback {
			t.Fatalf("unexpected fallback")
		}
		if d.Allowed {
			admitted++
		}
	}
	return admitted
}

// table builds a table naming eu and us with the given eu share for each
// key (us gets the rest), keys at the given version.
func table(term, epoch uint64, issued, effective int64, version uint64, euShare uint32, keys ...string) *rebalance.Table {
	pol := map[string]gcra.Limit{
		KeyName("api", []Entry{{"tenant", "acme"}}):                       gcra.PerHour(100, 10),
		KeyName("api", []Entry{{"tenant", "acme"}, {"route", "/search"}}): gcra.PerHour(50, 4),
	}
	t := &rebalance.Table{Term: term, Epoch: epoch, Issued: issued, Effective: effective,
		Regions: regions, Leases: []int64{issued + 30e6, issued + 30e6}, Agents: [][]string{{"eu-1"}, {"us-1"}}}
	for _, k := range keys {
		t.Keys = append(t.Keys, rebalance.KeyShares{Key: k, Budget: pol[k], Shares: []uint32{euShare, rebalance.PPM - euShare}, Version: version})
	}
	return t
}

// hour in µs: a first table takes effect an hour back, so its keys have
// refilled from the safe share's burst (all a key with no state holds at a
// change) to the table's.
const hour = int64(3600e6)

var (
	acme       = KeyName("api", []Entry{{"tenant", "acme"}})
	acmeSearch = KeyName("api", []Entry{{"tenant", "acme"}, {"route", "/search"}})
)

func TestNodeColdStartRunsAtSafeShare(t *testing.T) {
	forEachStore(t, func(t *testing.T, e env, n *Node) {
		// 5 % of burst 10 rounds to 0; with a unit per region it is 1.
		if got := decideN(t, n, e.now(), req(1, tenant("acme")), 5); got != 1 {
			t.Errorf("admitted %d at the safe share, want 1", got)
		}
	})
}

func TestNodeCompositeAllOrNothing(t *testing.T) {
	// envoyproxy/ratelimit#1060: the broad tenant limit must not be charged
	// when the narrow route limit denies.
	forEachStore(t, func(t *testing.T, e env, n *Node) {
		now := e.now()
		if err := n.Apply(table(1, 1, now, now-hour, 1, 500_000, acme, acmeSearch), now); err != nil {
			t.Fatal(err)
		}
		// eu: tenant burst 5, route burst 2.
		both := req(1, tenant("acme"), tenant("acme", Entry{"route", "/search"}))
		if got := decideN(t, n, e.now(), both, 6); got != 2 {
			t.Fatalf("composite admitted %d, want 2 (the route's burst)", got)
		}
		if got := decideN(t, n, e.now(), req(1, tenant("acme")), 10); got != 3 {
			t.Errorf("tenant alone admitted %d after the composite, want 3 (5 − 2: denied composites charged nothing)", got)
		}
	})
}

func TestNodeShareChangesKeepTokens(t *testing.T) {
	tests := []struct {
		name         string
		from, to     uint32 // eu share, ppm
		spend        int    // admitted before the change
		wantAfter    int    // admitted after it
		wantBurstEnd int64  // eu burst after the change
	}{
		// 30 % of burst 10 is 3, all spent: the increase to 70 % (burst 7)
		// adds capacity and rate, never tokens.
		{name: "increase/no windfall", from: 300_000, to: 700_000, spend: 3, wantAfter: 0, wantBurstEnd: 7},
		// 70 %: 7 tokens, 2 spent, 5 left; the cut to 30 % clamps to 3.
		{name: "decrease/no lockout", from: 700_000, to: 300_000, spend: 2, wantAfter: 3, wantBurstEnd: 3},
		// Half spent before a small increase keeps exactly the rest.
		{name: "increase/keeps rest", from: 500_000, to: 600_000, spend: 2, wantAfter: 3, wantBurstEnd: 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			forEachStore(t, func(t *testing.T, e env, n *Node) {
				now := e.now()
				if err := n.Apply(table(1, 1, now, now-hour, 1, tt.from, acme), now); err != nil {
					t.Fatal(err)
				}
				r := req(1, tenant("acme"))
				if got := decideN(t, n, e.now(), r, tt.spend); got != tt.spend {
					t.Fatalf("spent %d, want %d", got, tt.spend)
				}
				now = e.now()
				if err := n.Apply(table(1, 2, now, now, 2, tt.to, acme), now); err != nil {
					t.Fatal(err)
				}
				var d Decision
				if err := n.Resolve(r, &d); err != nil {
					t.Fatal(err)
				}
				if b := d.Matches[0].Schedule.Current.Limit.Burst(); b != tt.wantBurstEnd {
					t.Fatalf("burst after the change %d, want %d", b, tt.wantBurstEnd)
				}
				if got := decideN(t, n, e.now(), r, 10); got != tt.wantAfter {
					t.Errorf("admitted %d after the change, want %d", got, tt.wantAfter)
				}
			})
		})
	}
}

func TestNodeLapsedLeaseRunsAtMinLastSafe(t *testing.T) {
	forEachStore(t, func(t *testing.T, e env, n *Node) {
		now := e.now()
		tb := table(1, 1, now-20e6, now-hour, 1, 700_000, acme)
		tb.Leases = []int64{now - 10e6, now - 10e6} // lapsed 10 s ago
		if err := n.Apply(tb, now-20e6); err != nil {
			t.Fatal(err)
		}
		if n.Table().Lapsed {
			t.Fatal("lapsed before its lease ended")
		}
		n.Tick(now - 19e6)
		n.Tick(now)
		if !n.Table().Lapsed {
			t.Fatal("lease passed, table not lapsed")
		}
		// min(70 %, safe 5 %): the safe limit, burst 1; the key held the
		// full burst of 7, clamped to 1.
		if got := decideN(t, n, e.now(), req(1, tenant("acme")), 5); got != 1 {
			t.Errorf("admitted %d after the lapse, want 1", got)
		}
		// A fresh table restores the share, keeping tokens (none left).
		now = e.now()
		if err := n.Apply(table(1, 2, now, now, 1, 700_000, acme), now); err != nil {
			t.Fatal(err)
		}
		if n.Table().Lapsed {
			t.Fatal("still lapsed after a new table")
		}
		if got := decideN(t, n, e.now(), req(1, tenant("acme")), 5); got != 0 {
			t.Errorf("admitted %d right after the restore, want 0 (no windfall)", got)
		}
	})
}

func TestNodeRefusesOlderTables(t *testing.T) {
	forEachStore(t, func(t *testing.T, e env, n *Node) {
		now := e.now()
		if err := n.Apply(table(2, 5, now, now-hour, 1, 500_000, acme), now); err != nil {
			t.Fatal(err)
		}
		for _, tb := range []*rebalance.Table{
			table(1, 9, now, now, 3, 900_000, acme), // older term
			table(2, 4, now, now, 3, 900_000, acme), // older epoch
			table(2, 5, now, now, 3, 900_000, acme), // the same
		} {
			if err := n.Apply(tb, now); !errors.Is(err, ErrStaleTable) {
				t.Errorf("Apply(term %d epoch %d) = %v, want ErrStaleTable", tb.Term, tb.Epoch, err)
			}
		}
		if st := n.Table(); st.Term != 2 || st.Epoch != 5 {
			t.Errorf("in force term %d epoch %d, want 2/5", st.Term, st.Epoch)
		}
		if got := decideN(t, n, e.now(), req(1, tenant("acme")), 9); got != 5 {
			t.Errorf("admitted %d, want 5 (the 50 %% share of term 2)", got)
		}
		// Malformed tables change nothing either.
		bad := table(3, 1, now, now, 2, 500_000, acme)
		bad.Keys[0].Shares = []uint32{1}
		if err := n.Apply(bad, now); !errors.Is(err, ErrBadTable) {
			t.Errorf("Apply(short shares) = %v, want ErrBadTable", err)
		}
		other := table(3, 1, now, now, 2, 500_000, acme)
		other.Regions = []string{"ap", "us"}
		if err := n.Apply(other, now); !errors.Is(err, ErrBadTable) {
			t.Errorf("Apply(without our region) = %v, want ErrBadTable", err)
		}
		if st := n.Table(); st.Term != 2 {
			t.Errorf("a bad table changed the term to %d", st.Term)
		}
	})
}

func TestNodeRegionalAndShadow(t *testing.T) {
	forEachStore(t, func(t *testing.T, e env, n *Node) {
		// Regional scope: the full limit here, whatever the table.
		reg := req(1, tenant("acme", Entry{"region", "eu"}))
		if got := decideN(t, n, e.now(), reg, 6); got != 3 {
			t.Errorf("regional limit admitted %d, want its full burst 3", got)
		}
		// Shadow: decides (burst of the safe share: 1), counts would-deny,
		// admits everything.
		sh := req(1, tenant("shadowy", Entry{"route", "/shadow"}))
		if got := decideN(t, n, e.now(), sh, 4); got != 4 {
			t.Errorf("shadow mode admitted %d, want all 4", got)
		}
		if got := n.Stats().ShadowDenied; got != 3 {
			t.Errorf("ShadowDenied = %d, want 3", got)
		}
	})
}

func TestNodeReportsSumToDecisions(t *testing.T) {
	forEachStore(t, func(t *testing.T, e env, n *Node) {
		now := e.now()
		if err := n.Apply(table(1, 1, now, now-hour, 1, 500_000, acme, acmeSearch), now); err != nil {
			t.Fatal(err)
		}
		tick := now // the node's clock: the store's, as in production
		n.Tick(tick)
		rng := rand.New(rand.NewPCG(1, 2))
		type sums struct{ offered, cost, admitted, denied int64 }
		want := map[string]*sums{}
		var d Decision
		for range 300 {
			ten := fmt.Sprintf("t%d", rng.IntN(5))
			ds := []Descriptor{tenant(ten)}
			if rng.IntN(2) == 0 {
				ds = append(ds, tenant(ten, Entry{"route", "/search"}))
			}
			cost := int64(rng.IntN(3)) // 0 peeks
			if err := n.Decide(context.Background(), tick, req(cost, ds...), &d); err != nil {
				t.Fatal(err)
			}
			if cost == 0 {
				continue
			}
			for _, m := range d.Matches {
				s := want[m.Key.Name]
				if s == nil {
					s = &sums{}
					want[m.Key.Name] = s
				}
				s.offered++
				s.cost += cost
				if d.Allowed {
					s.admitted += cost
				} else {
					s.denied += cost
				}
			}
		}
		rep := n.Tick(tick + n.cfg.Interval.Microseconds())
		if rep == nil {
			t.Fatal("no report after the interval closed")
		}
		if rep.Region != "eu" || rep.Agent != "eu-1" || rep.Term != 1 || rep.Epoch != 1 || rep.PolicyVersion != n.Policy().Version() {
			t.Errorf("report header %+v", rep)
		}
		if rep.Interval != tick/n.cfg.Interval.Microseconds() {
			t.Errorf("report interval %d, want %d", rep.Interval, tick/n.cfg.Interval.Microseconds())
		}
		if len(rep.Keys) != len(want) {
			t.Errorf("report has %d keys, want %d", len(rep.Keys), len(want))
		}
		for i, k := range rep.Keys {
			if i > 0 && rep.Keys[i-1].Key >= k.Key {
				t.Errorf("report keys not sorted: %q before %q", rep.Keys[i-1].Key, k.Key)
			}
			w := want[k.Key]
			if w == nil {
				t.Errorf("unexpected key %q", k.Key)
				continue
			}
			got := sums{k.Offered, k.OfferedCost, k.Admitted, k.Denied}
			if got != *w {
				t.Errorf("%s: report %+v, want %+v", k.Key, got, *w)
			}
		}
		if rep := n.Tick(tick + 2*n.cfg.Interval.Microseconds()); rep == nil || len(rep.Keys) != 0 {
			t.Errorf("second report %+v, want one with no keys", rep)
		}
	})
}

func TestNodeBadRequestsConsumeNothing(t *testing.T) {
	long := string(make([]byte, MaxValueLen+1))
	tests := []struct {
		name string
		give *Request
	}{
		{"empty domain", &Request{Descriptors: []Descriptor{tenant("a")}, Cost: 1}},
		{"long domain", &Request{Domain: string(make([]byte, MaxDomainLen+1)), Descriptors: []Descriptor{tenant("a")}, Cost: 1}},
		{"no descriptors", req(1)},
		{"descriptor without entries", req(1, tenant("a"), Descriptor{})},
		{"empty entry key", req(1, tenant("a"), Descriptor{Entries: []Entry{{"", "x"}}})},
		{"long value", req(1, tenant("a"), tenant(long))},
		{"long entry key", req(1, tenant("a"), Descriptor{Entries: []Entry{{string(make([]byte, MaxEntryKeyLen+1)), "x"}}})},
		{"too many entries", req(1, tenant("a"), Descriptor{Entries: make([]Entry, MaxEntries+1)})},
		{"negative cost", req(-1, tenant("a"))},
		{"cost above uint32", req(MaxCost+1, tenant("a"))},
		{"negative descriptor cost", req(1, tenant("a"), Descriptor{Entries: []Entry{{"tenant", "a"}}, Cost: -1, HasCost: true})},
		{"hash tags differ", req(1, tenant("a"), tenant("b", Entry{"route", "/search"}))},
		{"too many descriptors", req(1, make([]Descriptor, MaxDescriptors+1)...)},
	}
	forEachStore(t, func(t *testing.T, e env, n *Node) {
		for _, tt := range tests {
			var d Decision
			err := n.Decide(context.Background(), e.now(), tt.give, &d)
			if !errors.Is(err, ErrBadRequest) {
				t.Errorf("%s: err = %v, want ErrBadRequest", tt.name, err)
			}
		}
		// Nothing was consumed: tenant a (safe burst 1) still admits one.
		if got := decideN(t, n, e.now(), req(1, tenant("a")), 2); got != 1 {
			t.Errorf("after the bad requests tenant a admitted %d, want 1", got)
		}
		if s := n.Stats(); s.Decisions != 2 {
			t.Errorf("Decisions = %d, want 2 (bad requests are not decisions)", s.Decisions)
		}
	})
}

func TestNodeDocumentedEdgeRequests(t *testing.T) {
	forEachStore(t, func(t *testing.T, e env, n *Node) {
		now := e.now()
		if err := n.Apply(table(1, 1, now, now-hour, 1, 500_000, acme), now); err != nil {
			t.Fatal(err)
		}
		var d Decision
		// Cost 0 peeks: allowed while tokens remain, consumes nothing, not demand.
		for range 3 {
			if err := n.Decide(context.Background(), now, req(0, tenant("acme")), &d); err != nil || !d.Allowed {
				t.Fatalf("peek: allowed %v err %v", d.Allowed, err)
			}
		}
		if d.Matches[0].Result.Remaining != 5 {
			t.Errorf("peek Remaining %d, want 5", d.Matches[0].Result.Remaining)
		}
		// Cost 2^32−1: never fits the burst; TooLarge, nothing consumed.
		if err := n.Decide(context.Background(), now, req(MaxCost, tenant("acme")), &d); err != nil {
			t.Fatal(err)
		}
		if d.Allowed || !d.Result.TooLarge || d.Result.RetryAfter != gcra.Never {
			t.Errorf("cost 2^32−1: %+v, want TooLarge with RetryAfter Never", d.Result)
		}
		// Unknown domain and unmatched descriptors: allowed, no limit.
		for _, r := range []*Request{
			{Domain: "nope", Descriptors: []Descriptor{tenant("acme")}, Cost: 1},
			req(1, Descriptor{Entries: []Entry{{"user", "x"}}}),
			req(1, tenant("acme", Entry{"route", "/unknown"})),
		} {
			if err := n.Decide(context.Background(), now, r, &d); err != nil || !d.Allowed || len(d.Matches) != 0 {
				t.Errorf("%+v: allowed %v matches %d err %v, want allowed with no limit", r, d.Allowed, len(d.Matches), err)
			}
		}
		if got := decideN(t, n, e.now(), req(1, tenant("acme")), 9); got != 5 {
			t.Errorf("admitted %d after the edge requests, want 5 (nothing consumed)", got)
		}
	})
}

func TestNodeMissingKeyAndPolicyMismatchRunReduced(t *testing.T) {
	forEachStore(t, func(t *testing.T, e env, n *Node) {
		now := e.now()
		if err := n.Apply(table(1, 1, now, now-hour, 1, 700_000, acme), now); err != nil {
			t.Fatal(err)
		}
		if got := n.cfgLimit(t, "acme").Burst(); got != 7 {
			t.Fatalf("burst under the table %d, want 7", got)
		}
		// The next table no longer names acme: min(70 %, safe 5 %).
		now = e.now()
		if err := n.Apply(table(1, 2, now, now, 2, 700_000), now); err != nil {
			t.Fatal(err)
		}
		safe := SafeLimit(gcra.PerHour(100, 10), n.safe, len(regions))
		if got := n.cfgLimit(t, "acme"); got != safe {
			t.Errorf("missing key runs at %v, want the safe limit %v", got, safe)
		}
		if got := decideN(t, n, e.now(), req(1, tenant("acme")), 5); got != 1 {
			t.Errorf("missing key admitted %d, want 1 (7 tokens clamped to the safe burst)", got)
		}

		// A table computed for another budget (policy rollout): safe share.
		now = e.now()
		tb := table(1, 3, now, now-hour, 1, 700_000, acme)
		tb.Keys[0].Budget = gcra.PerHour(200, 10)
		if err := n.Apply(tb, now); err != nil {
			t.Fatal(err)
		}
		before := n.Stats().Reduced
		if got := n.cfgLimit(t, "acme"); got.IntervalMicros() < safe.IntervalMicros() || got.Burst() > safe.Burst() {
			t.Errorf("mismatched key runs at %v, above the safe limit %v", got, safe)
		}
		if n.Stats().Reduced == before {
			t.Error("mismatch not counted")
		}
	})
}

func TestNodeKeyCapAndEviction(t *testing.T) {
	const t0 = int64(1_700_000_000_000_000)
	ms, err := memstore.New(memstore.Config{Clock: func() int64 { return t0 }, Shards: 1, MaxKeys: 100})
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig("eu", "eu-1", regions...)
	cfg.MaxKeys = 2
	n, err := NewNode(cfg, mustPolicy(t, testPolicy), ms)
	if err != nil {
		t.Fatal(err)
	}
	iv := n.cfg.Interval.Microseconds()
	n.Tick(t0)
	for _, ten := range []string{"a", "b", "c", "d"} {
		decideN(t, n, t0, req(1, tenant(ten)), 1)
	}
	if got := n.Stats().Overflow; got != 2 {
		t.Errorf("Overflow = %d, want 2 (keys c and d beyond MaxKeys 2)", got)
	}
	if got := decideN(t, n, t0, req(1, tenant("c")), 1); got != 0 {
		t.Errorf("an untracked key is still decided by the store: admitted %d, want 0 (its burst of 1 is spent)", got)
	}
	rep := n.Tick(t0 + iv)
	if len(rep.Keys) != 2 {
		t.Fatalf("report has %d keys, want the 2 tracked", len(rep.Keys))
	}
	// Idle for idleReports reports: forgotten, making room for c.
	for i := range idleReports {
		n.Tick(t0 + int64(i+2)*iv)
	}
	if got := n.keys.n.Load(); got != 0 {
		t.Fatalf("%d keys tracked after %d idle reports, want 0", got, idleReports)
	}
	decideN(t, n, t0, req(1, tenant("c")), 2)
	rep = n.Tick(t0 + int64(idleReports+3)*iv)
	if len(rep.Keys) != 1 || rep.Keys[0].Offered != 2 || rep.Keys[0].Denied != 2 {
		t.Errorf("report after eviction %+v, want c offered 2 denied 2", rep.Keys)
	}
}

func TestNodeReportNamesTableInForce(t *testing.T) {
	n, err := NewNode(DefaultConfig("eu", "eu-1", regions...), mustPolicy(t, testPolicy), &breakable{})
	if err != nil {
		t.Fatal(err)
	}
	iv := n.cfg.Interval.Microseconds()
	t0 := 1000 * iv
	n.Tick(t0)
	tests := []struct {
		apply            *rebalance.Table
		tick             int64
		wantTerm, wantEp uint64
	}{
		{apply: table(1, 1, t0, t0+iv/2, 1, 500_000, acme), tick: t0 + iv, wantTerm: 1, wantEp: 1},
		// Applied but not yet effective at the tick: the previous one.
		{apply: table(1, 2, t0+iv, t0+5*iv, 2, 600_000, acme), tick: t0 + 2*iv, wantTerm: 1, wantEp: 1},
		// Superseded before it took effect: still the one in force.
		{apply: table(2, 1, t0+2*iv, t0+9*iv, 3, 700_000, acme), tick: t0 + 3*iv, wantTerm: 1, wantEp: 1},
		{tick: t0 + 10*iv, wantTerm: 2, wantEp: 1},
	}
	for i, tt := range tests {
		if tt.apply != nil {
			if err := n.Apply(tt.apply, tt.tick-iv/4); err != nil {
				t.Fatal(err)
			}
		}
		rep := n.Tick(tt.tick)
		if rep == nil || rep.Term != tt.wantTerm || rep.Epoch != tt.wantEp {
			t.Errorf("step %d: report %+v, want term %d epoch %d", i, rep, tt.wantTerm, tt.wantEp)
		}
	}
}

// Both stores satisfy the interface the Node declares.
var (
	_ Store = (*memstore.Store)(nil)
	_ Store = (*redisstore.Store)(nil)
)

// A prepared request decides exactly as Decide does, across table changes
// and cost changes.
func TestNodePreparedMatchesDecide(t *testing.T) {
	const t0 = int64(1_700_000_000_000_000)
	mk := func() *Node {
		ms, err := memstore.New(memstore.Config{Clock: func() int64 { return t0 }, Shards: 1, MaxKeys: 100})
		if err != nil {
			t.Fatal(err)
		}
		n, err := NewNode(DefaultConfig("eu", "eu-1", regions...), mustPolicy(t, testPolicy), ms)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	a, b := mk(), mk()
	r := req(1, tenant("acme"), tenant("acme", Entry{"route", "/search"}))
	p, err := b.Prepare(r)
	if err != nil {
		t.Fatal(err)
	}
	var d Decision
	for i := range 40 {
		if i%10 == 5 {
			tb := table(1, uint64(i), t0, t0-hour, uint64(i), uint32(200_000+20_000*i), acme, acmeSearch)
			for _, n := range []*Node{a, b} {
				if err := n.Apply(tb, t0); err != nil {
					t.Fatal(err)
				}
			}
		}
		cost := int64(1 + i%3/2)
		r.Cost = cost
		if err := a.Decide(context.Background(), t0, r, &d); err != nil {
			t.Fatal(err)
		}
		pd, err := b.DecidePrepared(context.Background(), t0, p, cost)
		if err != nil {
			t.Fatal(err)
		}
		if pd.Allowed != d.Allowed || pd.Result != d.Result || len(pd.Matches) != len(d.Matches) {
			t.Fatalf("step %d: prepared %v %+v, decide %v %+v", i, pd.Allowed, pd.Result, d.Allowed, d.Result)
		}
		for j := range d.Matches {
			if pd.Matches[j].Result != d.Matches[j].Result || pd.Matches[j].Schedule != d.Matches[j].Schedule {
				t.Fatalf("step %d match %d differs", i, j)
			}
		}
	}
}

func TestNodeReserveWithinLease(t *testing.T) {
	for _, e := range envs(t) {
		t.Run(e.name, func(t *testing.T) { testNodeReserveWithinLease(t, e) })
	}
}

func testNodeReserveWithinLease(t *testing.T, e env) {
	// Hourly limits: a horizon of minutes, so that the lease is what cuts.
	cfg := DefaultConfig("eu", "eu-1", regions...)
	cfg.MaxReserveWait = 10 * time.Minute
	n, err := NewNode(cfg, mustPolicy(t, testPolicy), e.store)
	if err != nil {
		t.Fatal(err)
	}
	now := e.now()
	tb := table(1, 1, now, now-hour, 1, 500_000, acme, acmeSearch)
	tb.Leases = []int64{now + 100e6, now + 100e6} // 100 s left
	if err := n.Apply(tb, now); err != nil {
		t.Fatal(err)
	}
	// eu: 50/h (one token every 72 s), burst 5; spend the burst.
	if got := decideN(t, n, e.now(), req(1, tenant("acme")), 5); got != 5 {
		t.Fatalf("spent %d, want 5", got)
	}
	var d Decision
	ctx := context.Background()
	// The next slot is 72 s away: within 2 min and the lease, booked.
	if err := n.Reserve(ctx, e.now(), req(1, tenant("acme")), 2*time.Minute, &d); err != nil {
		t.Fatal(err)
	}
	if !d.Allowed || d.Result.Wait < 71*time.Second || d.Result.Wait > 72*time.Second {
		t.Errorf("reserve: allowed %v wait %v, want booked about 72 s ahead", d.Allowed, d.Result.Wait)
	}
	// The one after is 144 s away: past the lease, refused though
	// within maxWait; nothing booked.
	if err := n.Reserve(ctx, e.now(), req(1, tenant("acme")), 5*time.Minute, &d); err != nil {
		t.Fatal(err)
	}
	if d.Allowed {
		t.Errorf("reserve booked %v ahead, past the lease 100 s away", d.Result.Wait)
	}
	// Several enforced limits cannot be booked as one.
	err = n.Reserve(ctx, e.now(), req(1, tenant("acme"), tenant("acme", Entry{"route", "/search"})), time.Minute, &d)
	if !errors.Is(err, ErrNoReserve) {
		t.Errorf("composite reserve: err %v, want ErrNoReserve", err)
	}
	// No limit: admitted at once.
	if err := n.Reserve(ctx, e.now(), req(1, Descriptor{Entries: []Entry{{"user", "x"}}}), time.Minute, &d); err != nil || !d.Allowed {
		t.Errorf("unlimited reserve: allowed %v err %v", d.Allowed, err)
	}
}

// The booking horizon (Config.MaxReserveWait) cuts maxWait, table or not.
func TestNodeReserveWithinHorizon(t *testing.T) {
	forEachStore(t, func(t *testing.T, e env, n *Node) {
		ctx := context.Background()
		var d Decision
		// Cold: eu runs the safe share, burst 1, one token every 12 min.
		if err := n.Reserve(ctx, e.now(), req(1, tenant("acme")), time.Hour, &d); err != nil || !d.Allowed || d.Result.Wait != 0 {
			t.Fatalf("first reserve: %+v %v, want booked at once", d.Result, err)
		}
		// The next slot is 12 min away: within the hour asked, beyond the
		// default 2 s horizon.
		if err := n.Reserve(ctx, e.now(), req(1, tenant("acme")), time.Hour, &d); err != nil {
			t.Fatal(err)
		}
		if d.Allowed || d.Result.RetryAfter < 11*time.Minute {
			t.Errorf("second reserve: allowed %v wait %v retry-after %v, want refused (the slot is past the 2 s horizon)", d.Allowed, d.Result.Wait, d.Result.RetryAfter)
		}
	})
}

func TestKeyNameRoundTrip(t *testing.T) {
	for _, tt := range []struct {
		domain  string
		entries []Entry
	}{
		{"api", []Entry{{"tenant", "acme"}}},
		{"a/b", []Entry{{"k=1", "v/2%"}, {"route", "/search?q=x"}}},
		{"d", []Entry{{"k", ""}, {"c", "\x00\x7f"}}},
	} {
		name := KeyName(tt.domain, tt.entries)
		d, e, err := ParseKeyName(name)
		if err != nil || d != tt.domain || !slices.Equal(e, tt.entries) {
			t.Errorf("%q: got %q %v %v", name, d, e, err)
		}
	}
	for _, bad := range []string{"", "api", "api/tenant", "api/=x", "api/k=%zz", "api/k=%4", "API/k=%61"} {
		if _, _, err := ParseKeyName(bad); err == nil {
			t.Errorf("ParseKeyName(%q) accepted", bad)
		}
	}
}

// The deny cache answers exactly what the store would: two nodes, one with
// the cache, on twin stores, see the same timeline.
func TestNodeDenyCacheIsExact(t *testing.T) {
	with, without, clock := denyTwins(t)
	rng := rand.New(rand.NewPCG(3, 4))
	var d1, d2 Decision
	for i := range 2000 {
		clock.Add(rng.Int64N(20e6)) // the key refills one token every 72 s
		r := req(int64(1+rng.IntN(2)), tenant("acme"))
		if rng.IntN(3) == 0 {
			r = req(1, tenant("acme"), tenant("acme", Entry{"route", "/search"}))
		}
		now := clock.Load()
		if err := with.Decide(context.Background(), now, r, &d1); err != nil {
			t.Fatal(err)
		}
		if err := without.Decide(context.Background(), now, r, &d2); err != nil {
			t.Fatal(err)
		}
		// One agent: the decisions match, and so do their retry-afters.
		if d1.Allowed != d2.Allowed || d1.Result.RetryAfter != d2.Result.RetryAfter {
			t.Fatalf("step %d: cache %v retry %v, store %v retry %v", i, d1.Allowed, d1.Result.RetryAfter, d2.Allowed, d2.Result.RetryAfter)
		}
	}
	if h := with.Stats().DenyCacheHits; h < 100 {
		t.Errorf("only %d deny-cache hits in 2000 mostly denied requests", h)
	}
	if h := without.Stats().DenyCacheHits; h != 0 {
		t.Errorf("%d hits with the cache off", h)
	}
}

// countingStore counts the store calls a node makes.
type countingStore struct {
	Store
	calls atomic.Int64
}

func (c *countingStore) DecideAll(ctx context.Context, ch []gcra.Check, out []gcra.Result) (gcra.Result, error) {
	c.calls.Add(1)
	return c.Store.DecideAll(ctx, ch, out)
}

func TestNodeLeasing(t *testing.T) {
	const src = `
domains:
  - domain: api
    descriptors:
      - key: tenant
        rate_limit: {unit: second, requests_per_unit: 1000, burst: 100, lease: {units: 10, ttl: 100ms}}
      - key: small
        rate_limit: {unit: second, requests_per_unit: 1000, burst: 30, lease: {units: 10, ttl: 100ms}}
`
	var clock atomic.Int64
	clock.Store(1_700_000_000_000_000)
	ms, err := memstore.New(memstore.Config{Clock: clock.Load, Shards: 1, MaxKeys: 100})
	if err != nil {
		t.Fatal(err)
	}
	st := &countingStore{Store: ms}
	n, err := NewNode(DefaultConfig("eu", "eu-1", "eu"), mustPolicy(t, src), st)
	if err != nil {
		t.Fatal(err)
	}
	now := clock.Load()
	pol := n.Policy()
	tb := &rebalance.Table{Term: 1, Epoch: 1, Issued: now, Effective: now - hour, Regions: []string{"eu"}, Leases: []int64{now + 600e6}, Agents: [][]string{{"eu-1"}},
		Keys: []rebalance.KeyShares{
			{Key: KeyName("api", []Entry{{"small", "s"}}), Budget: pol.Rules()[1].Limit, Shares: []uint32{rebalance.PPM}, Version: 1},
			{Key: KeyName("api", []Entry{{"tenant", "t"}}), Budget: pol.Rules()[0].Limit, Shares: []uint32{rebalance.PPM}, Version: 1},
		}}
	if err := n.Apply(tb, now); err != nil {
		t.Fatal(err)
	}
	r := &Request{Domain: "api", Descriptors: []Descriptor{{Entries: []Entry{{"tenant", "t"}}}}, Cost: 1}
	var d Decision
	admitted := 0
	for range 200 { // all at one instant: the burst of 100 is all there is
		if err := n.Decide(context.Background(), now, r, &d); err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
	}
	if admitted > 100 {
		t.Errorf("admitted %d at one instant under burst 100: leasing over-admitted", admitted)
	}
	if admitted < 90 {
		t.Errorf("admitted %d of a burst of 100", admitted)
	}
	s := n.Stats()
	if s.LeaseTakes == 0 || s.LeaseHits < 80 {
		t.Errorf("lease takes %d, hits %d: leasing unused", s.LeaseTakes, s.LeaseHits)
	}
	t.Logf("admitted %d, lease takes %d, hits %d, store calls %d", admitted, s.LeaseTakes, s.LeaseHits, st.calls.Load())
	if calls := st.calls.Load(); calls > 120 {
		t.Errorf("%d store calls for 200 requests: leases should spare most of the admitted ones", calls)
	}
	// Refill one lease's worth, take it, then let it expire unused.
	clock.Add(20_000) // 20 tokens at 1/ms
	if err := n.Decide(context.Background(), clock.Load(), r, &d); err != nil || !d.Allowed {
		t.Fatalf("after refill: %v %v", d.Allowed, err)
	}
	clock.Add(200_000) // past the 100 ms TTL
	if err := n.Decide(context.Background(), clock.Load(), r, &d); err != nil || !d.Allowed {
		t.Fatalf("after expiry: %v %v", d.Allowed, err)
	}
	if got := n.Stats().LeaseStranded; got < 10 {
		t.Errorf("stranded %d, want the expired lease's 10 units counted", got)
	}
	// A low limit (burst 30 < 4 leases) is never leased.
	before := n.Stats().LeaseTakes
	small := &Request{Domain: "api", Descriptors: []Descriptor{{Entries: []Entry{{"small", "s"}}}}, Cost: 1}
	for range 5 {
		_ = n.Decide(context.Background(), clock.Load(), small, &d)
	}
	if n.Stats().LeaseTakes != before {
		t.Error("a low limit was leased")
	}
}

// A reload that gives a domain a hash tag re-interns its live keys with it
// (a stale tag would put this agent's keys in another Redis bucket).
func TestNodeReloadRetagsKeys(t *testing.T) {
	const t0 = int64(1_700_000_000_000_000)
	ms, err := memstore.New(memstore.Config{Clock: func() int64 { return t0 }, Shards: 1, MaxKeys: 100})
	if err != nil {
		t.Fatal(err)
	}
	untagged := strings.Replace(testPolicy, "    hash_tag: tenant\n", "", 1)
	n, err := NewNode(DefaultConfig("eu", "eu-1", regions...), mustPolicy(t, untagged), ms)
	if err != nil {
		t.Fatal(err)
	}
	var d Decision
	if err := n.Decide(context.Background(), t0, req(1, tenant("acme")), &d); err != nil || d.Matches[0].Key.Tag != "" {
		t.Fatalf("untagged: %+v %v", d.Matches, err)
	}
	n.SetPolicy(mustPolicy(t, testPolicy))
	if err := n.Decide(context.Background(), t0, req(1, tenant("acme")), &d); err != nil || d.Matches[0].Key.Tag != "acme" {
		t.Errorf("after the reload the key is %+v (%v), want tag acme", d.Matches[0].Key, err)
	}
}
