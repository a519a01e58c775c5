package region

import (
	"strings"
	"testing"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/rebalance"
)

// ppmOf is the part of budget that regional limit l's rate is, rounded up.
func ppmOf(budget, l gcra.Limit) int64 {
	if l.IsZero() {
		return 0
	}
	return (budget.IntervalMicros()*rebalance.PPM + l.IntervalMicros() - 1) / l.IntervalMicros()
}

// TestNodeBudgetShrinkTakesLimitsDown: when a key's budget halves — the
// agent's policy is reloaded, or a table computed for the new budget comes
// — every limit the key runs, the previous one still in force included,
// is at once at most the same part of the new budget: the coordinator
// counts each region's share in ppm of the budget, so a region still
// running the old budget's limit runs twice its part. Fails on 02acb44:
// the policy mismatch ran the pending change itself as the previous
// version (90 % from now, not 70 %) and kept the old budget's limits until
// the row's pending effective time, and a table with the new budget under
// the same row
// version kept the old limits outright (explorer schedules 83 and 87 of
// seed 1: Σ shares in force 1.9·10⁶ and 1.03·10⁶ ppm of the new budget).
func TestNodeBudgetShrinkTakesLimitsDown(t *testing.T) {
	half := mustPolicy(t, strings.Replace(testPolicy, "requests_per_unit: 100, burst: 10", "requests_per_unit: 50, burst: 5", 1))
	newBudget := gcra.PerHour(50, 5)
	// check: the version in force now is at most inForce ppm of the new
	// budget, the pending one at most pending.
	check := func(t *testing.T, n *Node, what string, inForce, pending int64) {
		t.Helper()
		rule, err := n.Policy().RuleForKey(acme)
		if err != nil {
			t.Fatal(err)
		}
		s := n.Schedule(rule, acme)
		if !s.HasPrevious {
			t.Fatalf("%s: no previous version: the pending change is gone", what)
		}
		for _, c := range []struct {
			v    gcra.Version
			want int64
		}{{s.Previous, inForce}, {s.Current, pending}} {
			if got := ppmOf(newBudget, c.v.Limit); got > c.want {
				t.Errorf("%s: limit %v is %d ppm of the new budget %v, want at most %d", what, c.v.Limit, got, newBudget, c.want)
			}
			if b := c.v.Limit.Burst(); b > newBudget.Burst()*c.want/rebalance.PPM+1 {
				t.Errorf("%s: limit %v: burst %d of the new budget's %d at %d ppm", what, c.v.Limit, b, newBudget.Burst(), c.want)
			}
		}
	}
	forEachStore(t, func(t *testing.T, e env, n *Node) {
		// 70 % in force, and a pending increase to 90 % an hour away.
		now := e.now()
		if err := n.Apply(table(1, 1, now, now-hour, 1, 700_000, acme), now); err != nil {
			t.Fatal(err)
		}
		now = e.now()
		if err := n.Apply(table(1, 2, now, now+hour, 2, 900_000, acme), now); err != nil {
			t.Fatal(err)
		}
		// The policy halves the budget before any table says so: the
		// table's row is for the old budget (a mismatch): 70 % of the new
		// budget until the pending change, then at most the safe share.
		n.SetPolicy(half)
		check(t, n, "policy reloaded", 700_000, int64(n.safe))
		// The coordinator's next table carries the new budget under the
		// same row version: 70 % of it, then 90 %.
		now = e.now()
		tb := table(1, 3, now, now+hour, 2, 900_000, acme)
		tb.Keys[0].Budget = newBudget
		if err := n.Apply(tb, now); err != nil {
			t.Fatal(err)
		}
		check(t, n, "table with the new budget", 700_000, 900_000)
	})
}

// TestNodePendingChangeLowersAtOnce: a table whose row raises a key's rate
// but lowers its burst, fenced to an effective time an hour away, lowers
// the burst at once and keeps the rate until then. The coordinator fences
// such a row with the increases, at one effective time for every region,
// and a region whose clock runs ahead by up to MaxSkew may raise its own
// burst first. Fails on 49a6518: the old burst ran until the effective
// time (explorer schedule 32 of seed 1: Σ bursts in force 95 of 94).
func TestNodePendingChangeLowersAtOnce(t *testing.T) {
	forEachStore(t, func(t *testing.T, e env, n *Node) {
		now := e.now()
		if err := n.Apply(table(1, 1, now, now-hour, 1, 700_000, acme), now); err != nil {
			t.Fatal(err)
		}
		rule, err := n.Policy().RuleForKey(acme)
		if err != nil {
			t.Fatal(err)
		}
		old := n.Schedule(rule, acme).Current.Limit
		now = e.now()
		tb := table(1, 2, now, now+hour, 2, 800_000, acme)
		tb.Keys[0].Bursts = []int64{old.Burst() - 2, 10 - old.Burst() + 2}
		if err := n.Apply(tb, now); err != nil {
			t.Fatal(err)
		}
		s := n.Schedule(rule, acme)
		if !s.HasPrevious || s.Current.Effective <= now {
			t.Fatalf("schedule %+v: want the change pending", s)
		}
		if got, want := s.Previous.Limit.Burst(), old.Burst()-2; got != want {
			t.Errorf("burst in force until the change %d, want the lowered %d at once", got, want)
		}
		if got := s.Previous.Limit.IntervalMicros(); got != old.IntervalMicros() {
			t.Errorf("interval in force until the change %dµs, want the old %dµs (the rate rises only at the fence)", got, old.IntervalMicros())
		}
		if got := s.Current.Limit.Burst(); got != old.Burst()-2 {
			t.Errorf("burst after the change %d, want %d", got, old.Burst()-2)
		}
	})
}
