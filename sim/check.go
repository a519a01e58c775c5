package sim

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/rebalance"
)

// The checks the explorer runs (Violation.Check).
const (
	// CheckShare: for a key, Σ over regions of the share in force exceeds
	// 10⁶ ppm (ARCHITECTURE.md, safety invariant 1).
	CheckShare = "safety/share"
	// CheckBurst: for a key, Σ over regions of the burst in force exceeds
	// the budget's burst.
	CheckBurst = "safety/burst"
	// CheckOABudget: OA_budget > 0 at the end of a run whose schedule chose
	// no over-admitting mode (invariant 6).
	CheckOABudget = "safety/oa-budget"
	// CheckLiveness: lease + 3Δ after the last fault healed (partitions,
	// region loss, Redis outages, coordinator failovers), some agent of a
	// region that is up holds no table, a lapsed one or one that does not
	// name it — the coordinator's tables no longer reach it. Checked only
	// on lossless links (a run of lost tables may lapse a lease by chance)
	// and when that instant falls inside the run.
	CheckLiveness = "liveness/table"
)

// Violation is a check that failed in one run: which, when (virtual time)
// and at which event, for which key, with what the regions ran.
type Violation struct {
	Check string `json:"check"`
	// At is the virtual time of the event after which the check failed
	// (the run's duration for CheckOABudget, checked at the end).
	At Duration `json:"at"`
	// Event names the event's kind (eventName).
	Event  string `json:"event"`
	Key    string `json:"key,omitempty"`
	Detail string `json:"detail"`
}

func (v *Violation) Error() string {
	return fmt.Sprintf("%s violated at %s after %s: %s", v.Check, v.At.D(), v.Event, v.Detail)
}

// eventName names an event kind for a violation's report.
func eventName(kind uint8) string {
	names := [...]string{evArrival: "arrival", evRetry: "retry", evAgentTick: "agent-tick", evCoordTick: "coordinator-tick",
		evReport: "report", evAck: "ack", evTable: "table", evSync: "sync", evFailoverDown: "coordinator-down",
		evFailoverUp: "coordinator-up", evSwitch: "on-off", evTrace: "trace", evSample: "sample",
		evSyncDeliver: "sync-deliver", evServed: "served"}
	if int(kind) < len(names) {
		return names[kind]
	}
	return fmt.Sprintf("kind-%d", kind)
}

// checker holds the safety checks on one run: after every event, per key,
// Σ over the regions that are up of the share (and burst) in force — the
// largest over the region's agents of the limit its store would enforce
// for that agent's next decision, computed as transition_test.go does:
// the version of Node.Schedule the store's clock selects, as
// ceil(T·10⁶/T_r) ppm. A region that is lost decides nothing, so it
// counts only once it returns. What a node runs changes only when it
// applies a table, ticks (a lease lapse) or a store clock passes a pending
// change's effective time, so each agent's column is recomputed only
// then; the sums are taken after every event that changed one.
type checker struct {
	r      *Run
	keys   int
	ppm    [][]int64 // [agent][key]: share in force, ppm
	burst  [][]int64 // [agent][key]: burst in force
	next   []int64   // [agent]: true time its next pending change takes effect (MaxInt64: none)
	down   []bool    // [region]: lost at the last check
	dirty  bool
	checks int64
	// maxSum is the largest Σ shares in force seen (ppm).
	maxSum int64
	// bug, when set, runs after each event before the checks (a planted
	// bug, explore_test.go).
	bug func(*Run, *event)
	// live is when CheckLiveness runs (true time, µs; MaxInt64: never);
	// lived says it ran.
	live  int64
	lived bool
}

func newChecker(r *Run) *checker {
	c := &checker{r: r, keys: len(r.keys), down: make([]bool, len(r.regions)), dirty: true, live: livenessAt(r)}
	for range r.agents {
		c.ppm = append(c.ppm, make([]int64, len(r.keys)))
		c.burst = append(c.burst, make([]int64, len(r.keys)))
		c.next = append(c.next, math.MinInt64) // computed at the first check
	}
	return c
}

// column recomputes what agent a of region ri runs for every key.
func (c *checker) column(ri, a int) {
	r := c.r
	rg := r.regions[ri]
	g := rg.first + a
	n := rg.nodes[a]
	storeNow := r.now + rg.skew
	next := int64(math.MaxInt64)
	// What the node's next decision runs, a lapsed lease included (a
	// decision lapses it, not only a Tick); the column changes again when
	// the lease passes.
	local := rg.nodeNow(a, r.now)
	if ts := n.Table(); ts.HasTable && !ts.Lapsed && ts.LeaseExpiry > local {
		next = min(next, r.now+(ts.LeaseExpiry-local))
	}
	rules := r.policy.Rules()
	for k := range r.keys {
		s := n.ScheduleAt(rules[k], r.keys[k].name, local)
		l := s.Current.Limit
		if s.HasPrevious && storeNow < s.Current.Effective {
			l = s.Previous.Limit
			next = min(next, s.Current.Effective-rg.skew)
		}
		c.ppm[g][k] = shareOfLimit(r.keys[k].budget, l)
		c.burst[g][k] = l.Burst()
	}
	c.next[g] = next
	c.dirty = true
}

// livenessAt is when r's liveness check runs: lease + 3Δ after the last
// fault heals, if the links lose nothing and that is inside the run
// (MaxInt64: never).
func livenessAt(r *Run) int64 {
	sc := r.sc
	if sc.Latency.Loss > 0 || slices.ContainsFunc(sc.Links, func(l LinkSpec) bool { return l.Loss > 0 }) {
		return math.MaxInt64
	}
	var healed Duration
	for _, p := range sc.Faults.Partitions {
		healed = max(healed, p.At+p.For)
	}
	for _, f := range slices.Concat(sc.Faults.RegionLoss, sc.Faults.RedisOutage) {
		healed = max(healed, f.At+f.For)
	}
	for _, f := range sc.Coordinator.Failovers {
		healed = max(healed, f.At+f.For)
	}
	at := us(healed) + r.rcfg.Lease.Microseconds() + 3*r.interval
	if at >= r.end {
		return math.MaxInt64
	}
	return at
}

// liveness checks that every agent of every region holds a table that
// names it, with its lease running.
func (c *checker) liveness(e *event) *Violation {
	r := c.r
	for ri, rg := range r.regions {
		if r.regionDown(ri, r.now) {
			continue
		}
		for a, n := range rg.nodes {
			st := n.Table()
			if st.HasTable && !st.Lapsed && st.Named {
				continue
			}
			return &Violation{Check: CheckLiveness, At: Duration(time.Duration(e.t) * time.Microsecond), Event: eventName(e.kind),
				Detail: fmt.Sprintf("%s, lease + 3Δ after the last fault healed: table %d/%d (has %v) lease %s lapsed %v named %v",
					agentName(rg.name, a), st.Term, st.Epoch, st.HasTable, time.Duration(st.LeaseExpiry)*time.Microsecond, st.Lapsed, st.Named)}
		}
	}
	return nil
}

// shareOfLimit is l as a share of budget in ppm: the smallest share whose
// regional limit (T_r = ceil(T·10⁶/s)) has l's interval or a longer one.
// Shares summing to at most PPM mean the rates do (Σ 1/T_r ≤ 1/T).
func shareOfLimit(budget, l gcra.Limit) int64 {
	if l.IsZero() {
		return 0
	}
	num := budget.IntervalMicros() * rebalance.PPM
	return (num + l.IntervalMicros() - 1) / l.IntervalMicros()
}

// after is the run's check hook.
func (c *checker) after(r *Run, e *event) error {
	if c.bug != nil {
		c.bug(r, e)
	}
	if r.baseline() || r.strategy == "full" {
		return nil // full over-commits by the operator's choice (allow_overcommit)
	}
	switch e.kind {
	case evTable:
		for a := range r.regions[e.a].nodes {
			c.column(int(e.a), a)
		}
	case evAgentTick:
		c.column(int(e.a), int(e.b))
	}
	for ri, rg := range r.regions {
		for a := range rg.nodes {
			if c.next[rg.first+a] <= r.now {
				c.column(ri, a)
			}
		}
		if d := r.regionDown(ri, r.now); d != c.down[ri] {
			c.down[ri], c.dirty = d, true
		}
	}
	if r.now >= c.live {
		c.live, c.lived = math.MaxInt64, true
		if v := c.liveness(e); v != nil {
			return v
		}
	}
	if !c.dirty {
		return nil
	}
	c.dirty = false
	c.checks++
	for k := range r.keys {
		var sum, bsum int64
		for ri, rg := range r.regions {
			if c.down[ri] {
				continue
			}
			var p, b int64
			for a := range rg.nodes {
				p = max(p, c.ppm[rg.first+a][k])
				b = max(b, c.burst[rg.first+a][k])
			}
			sum += p
			bsum += b
		}
		c.maxSum = max(c.maxSum, sum)
		switch {
		case sum > rebalance.PPM:
			return c.violation(CheckShare, e, k, fmt.Sprintf("key %s: Σ shares in force %d ppm > %d", r.keys[k].name, sum, rebalance.PPM))
		case bsum > r.keys[k].budget.Burst():
			return c.violation(CheckBurst, e, k, fmt.Sprintf("key %s: Σ bursts in force %d > the budget's %d", r.keys[k].name, bsum, r.keys[k].budget.Burst()))
		}
	}
	return nil
}

func (c *checker) violation(check string, e *event, k int, detail string) *Violation {
	return &Violation{Check: check, At: Duration(time.Duration(e.t) * time.Microsecond), Event: eventName(e.kind),
		Key: c.r.keys[k].name, Detail: detail + "; " + c.regionsDetail(k)}
}

// regionsDetail says what each region's agents run for key k.
func (c *checker) regionsDetail(k int) string {
	r := c.r
	var parts []string
	for ri, rg := range r.regions {
		var agents []string
		for a, n := range rg.nodes {
			st := n.Table()
			agents = append(agents, fmt.Sprintf("%s %d ppm burst %d (table %d/%d lease %s lapsed %v named %v)",
				agentName(rg.name, a), c.ppm[rg.first+a][k], c.burst[rg.first+a][k], st.Term, st.Epoch,
				time.Duration(st.LeaseExpiry)*time.Microsecond, st.Lapsed, st.Named))
		}
		state := ""
		if c.down[ri] {
			state = " (lost)"
		}
		parts = append(parts, fmt.Sprintf("%s%s: %s", rg.name, state, strings.Join(agents, ", ")))
	}
	return strings.Join(parts, "; ")
}

// overAdmitting reports whether sc chose a mode in which over-admission
// is the operator's choice (ARCHITECTURE.md, invariant 6): failure_mode
// open, local or error, or the full strategy. The simulator has no
// shadow mode.
func overAdmitting(sc *Scenario, strategy string) bool {
	return sc.FailureMode != "closed" || strategy == "full"
}

// checkEnd is the check at the end of a run: OA_budget = 0 unless the
// schedule chose an over-admitting mode.
func checkEnd(sc *Scenario, strategy string, res *Result) *Violation {
	if overAdmitting(sc, strategy) || res.OABudget.Max <= 0 {
		return nil
	}
	return &Violation{Check: CheckOABudget, At: sc.Duration, Event: "end",
		Detail: fmt.Sprintf("OA_budget max %.3g over %d keys (mean %.3g) with failure_mode %s and strategy %s",
			res.OABudget.Max, res.OABudget.Keys, res.OABudget.Mean, sc.FailureMode, strategy)}
}

// CheckRun runs sc under one strategy, interval and seed with the
// explorer's checks and returns the first violation (nil: none).
func CheckRun(sc *Scenario, strategy string, interval time.Duration, seed uint64) (*Violation, error) {
	v, _, err := checkRun(sc, strategy, interval, seed, nil)
	return v, err
}

// runStats is what a run's checks did.
type runStats struct {
	checks int64
	lived  bool // the liveness check ran
}

// checkRun is CheckRun with a planted bug (nil: none).
func checkRun(sc *Scenario, strategy string, interval time.Duration, seed uint64, bug func(*Run, *event)) (*Violation, runStats, error) {
	r, err := NewRun(sc, strategy, interval, seed, nil)
	if err != nil {
		return nil, runStats{}, err
	}
	c := newChecker(r)
	c.bug = bug
	r.check = c.after
	res, err := r.Simulate()
	st := runStats{checks: c.checks, lived: c.lived}
	if v, ok := err.(*Violation); ok {
		return v, st, nil
	}
	if err != nil {
		return nil, st, err
	}
	return checkEnd(sc, strategy, res), st, nil
}

// CheckScenario runs every strategy × interval × seed of sc with the
// explorer's checkers (a shrunk schedule's replay) and returns the
// violations found, one per failing run, in sweep order.
func CheckScenario(sc *Scenario) ([]Violation, error) {
	var out []Violation
	for _, st := range sc.Strategies {
		if st == ReplicatedCounter || st == Oracle {
			continue
		}
		for _, iv := range sc.Intervals {
			for _, seed := range sc.Seeds {
				v, err := CheckRun(sc, st, iv.D(), seed)
				if err != nil {
					return nil, err
				}
				if v != nil {
					out = append(out, *v)
				}
			}
		}
	}
	return out, nil
}
