package sim

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gossip/protocol"
	"github.com/meridian-quota/meridian/rebalance"
	"github.com/meridian-quota/meridian/region"
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
	// CheckLiveness: from lease + 3Δ after the last fault healed (every
	// fault faultSpells lists) to the end of the run, some agent of a
	// region that is up holds no table, a lapsed one or one that does not
	// name it — the coordinator's tables no longer reach it. Checked at
	// that instant and every second after it, only on lossless links (a
	// run of lost tables may lapse a lease by chance) and when that
	// instant falls inside the run.
	CheckLiveness = "liveness/table"
	// CheckConverge: at the same instants, an agent whose table is in force
	// runs a key more than 5 points of its budget (50,000 ppm) from what
	// a node that holds only that table runs — its own history (lapses,
	// row versions, terms) holds it away from its coordinator's target.
	CheckConverge = "liveness/converge"
	// CheckResume: election TTL + 2Δ after a coordinator crash with every
	// other agent reachable (no other fault in that window, lossless
	// links), no new term runs out of learning mode — or, when the crash
	// took its region's only agent (a silent region waits for its lease),
	// election TTL + 2Δ + lease + MaxSkew after it.
	CheckResume = "liveness/resume"
	// CheckForgedDepose: a coordinator's store was fenced by a head no
	// coordinator wrote (forged, replayed or undecodable bytes), ending a
	// verified term.
	CheckForgedDepose = "liveness/forged-depose"
	// CheckResources: an agent made more bus messages or bucket calls than
	// resourceBound allows, or the coordinator's term held more entries
	// than its caps.
	CheckResources = "resources"
)

// convergeTolerance is CheckConverge's margin: 5 % of the budget.
const convergeTolerance = 50_000

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
		evSyncDeliver: "sync-deliver", evServed: "served", evElect: "election", evKV: "kv",
		evRegionDown: "region-down", evRegionUp: "region-up", evFault: "cluster-fault", evWatchRetry: "watch-retry",
		evResync: "resync", evCoordRetry: "coordinator-retry", evCampaign: "campaign"}
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
	ppm    [][]int64      // [agent][key]: share in force, ppm
	burst  [][]int64      // [agent][key]: burst in force
	lim    [][]gcra.Limit // [agent][key]: the limit in force (for shares of another budget mid-reload)
	next   []int64        // [agent]: true time its next pending change takes effect (MaxInt64: none)
	down   []bool         // [region]: lost at the last check
	dirty  bool
	checks int64
	// maxSum is the largest Σ shares in force seen (ppm).
	maxSum int64
	// bug, when set, runs after each event before the checks (a planted
	// bug, explore_test.go).
	bug func(*Run, *event)
	// live is when the liveness checks start (true time, µs; MaxInt64:
	// never); lived says they ran.
	live    int64
	lived   bool
	resumed bool // a CheckResume ran
	// fresh is, per agent, converge's node holding only the table the
	// agent applied last (of).
	fresh []struct {
		of *rebalance.Table
		n  *region.Node
	}
	// resume lists the instants CheckResume runs at, with the crash each
	// follows.
	resume []resumeCheck
}

type resumeCheck struct {
	at, crash int64
	// crashIdx is the agent_crash fault (-1: a failover); silentAt, when
	// above 0, is the later bound for a crash that silenced the agent's
	// whole region (it was its region's only agent), if no other fault
	// overlaps until then.
	crashIdx int
	silentAt int64
}

func newChecker(r *Run) *checker {
	c := &checker{r: r, keys: len(r.keys), down: make([]bool, len(r.regions)), dirty: true, live: livenessAt(r), resume: resumeAt(r)}
	c.fresh = make([]struct {
		of *rebalance.Table
		n  *region.Node
	}, r.agents)
	for range r.agents {
		c.ppm = append(c.ppm, make([]int64, len(r.keys)))
		c.burst = append(c.burst, make([]int64, len(r.keys)))
		c.lim = append(c.lim, make([]gcra.Limit, len(r.keys)))
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
	// Each agent's share is of the budget its own policy gives the key
	// (after, mid-reload: of the largest budget a live agent's policy
	// gives it).
	rules := n.Policy().Rules()
	for k := range r.keys {
		rule := rules[r.keys[k].rule]
		s := n.ScheduleAt(rule, r.keys[k].name, local)
		if !s.Fence.IsZero() {
			if held, ok := rg.store.Fence(); !ok || s.Fence.Less(held) {
				// The region's store refuses this table (its fence is
				// newer, or gone): the node decides at min(share, safe).
				s = n.Unfenced(rule, s, local)
			}
		}
		l := s.Current.Limit
		if s.HasPrevious && storeNow < s.Current.Effective {
			l = s.Previous.Limit
			next = min(next, s.Current.Effective-rg.skew)
		}
		c.ppm[g][k] = shareOfLimit(rule.Limit, l)
		c.burst[g][k], c.lim[g][k] = l.Burst(), l
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
	at := us(lastHealed(sc)) + r.rcfg.Lease.Microseconds() + 3*r.interval
	if at >= r.end {
		return math.MaxInt64
	}
	return at
}

// lastHealed is when sc's last fault ends (an instant fault — a head
// write, a clock step — ends when it happens); 0 without faults.
func lastHealed(sc *Scenario) Duration {
	var healed Duration
	for _, f := range faultSpells(sc) {
		healed = max(healed, f.At+f.For)
	}
	return healed
}

// spellRef is one fault of a scenario as a window (instant ones as
// [At, At]), with its list and index there.
type spellRef struct {
	FaultSpell
	list string
	i    int
}

// faultSpells lists every fault of sc; traffic moves and flash crowds are
// demand, not faults.
func faultSpells(sc *Scenario) []spellRef {
	var out []spellRef
	add := func(list string, i int, f FaultSpell) { out = append(out, spellRef{f, list, i}) }
	f := &sc.Faults
	for i, p := range f.Partitions {
		add("partitions", i, p.FaultSpell)
	}
	for i, s := range f.RegionLoss {
		add("region_loss", i, s.FaultSpell)
	}
	for i, s := range f.RedisOutage {
		add("redis_outage", i, s.FaultSpell)
	}
	for i, s := range sc.Coordinator.Failovers {
		add("failovers", i, s)
	}
	for i, s := range f.NATSOutage {
		add("nats_outage", i, s)
	}
	for i, s := range f.KVLoss {
		add("kv_loss", i, s)
	}
	for i, s := range f.AgentPartition {
		add("agent_partition", i, s.FaultSpell)
	}
	for i, s := range f.Suspicions {
		add("suspicions", i, s.FaultSpell)
	}
	for i, s := range f.AgentCrash {
		add("agent_crash", i, s.FaultSpell)
	}
	for i, h := range f.Heads {
		add("heads", i, FaultSpell{At: h.At})
	}
	for i, c := range f.ClockSteps {
		add("clock_steps", i, FaultSpell{At: c.At})
	}
	for i, c := range f.KeyChurn {
		add("key_churn", i, c.FaultSpell)
	}
	for i, c := range f.PolicyReloads {
		add("policy_reloads", i, FaultSpell{At: c.At, For: c.Spread})
	}
	return out
}

// resumeAt lists CheckResume's instants: TTL + 2Δ after each coordinator
// crash (a failover, or an agent_crash of the coordinator's agent) that
// no other fault overlaps from a lease before it to then, on lossless
// links, inside the run. A crash of the only agent of its region silences
// the region, which waits for its lease (issue 17, defect 5): it is
// checked at TTL + 2Δ + lease + MaxSkew instead, if no other fault
// overlaps until then.
func resumeAt(r *Run) []resumeCheck {
	sc := r.sc
	if sc.Latency.Loss > 0 || slices.ContainsFunc(sc.Links, func(l LinkSpec) bool { return l.Loss > 0 }) {
		return nil
	}
	var out []resumeCheck
	all := faultSpells(sc)
	for _, f := range all {
		if f.list != "failovers" && (f.list != "agent_crash" || !sc.Faults.AgentCrash[f.i].Coordinator) {
			continue
		}
		at := us(f.At) + ElectionTTL.Microseconds() + 2*r.interval
		// A crash that silences its region — the coordinator's agent was
		// its region's only one — waits for that region's lease: nobody
		// there can acknowledge a table or raise its fence.
		silent := at + r.rcfg.Lease.Microseconds() + r.rcfg.MaxSkew.Microseconds()
		from := us(f.At) - r.rcfg.Lease.Microseconds()
		quiet := func(until int64) bool {
			if until >= r.end {
				return false
			}
			for _, o := range all {
				if (o.list != f.list || o.i != f.i) && us(o.At) <= until && us(o.At+o.For) >= from {
					return false
				}
			}
			return true
		}
		if quiet(at) {
			rc := resumeCheck{at: at, crash: us(f.At), crashIdx: -1}
			if f.list == "agent_crash" {
				rc.crashIdx = f.i
				if quiet(silent) {
					rc.silentAt = silent
				}
			}
			out = append(out, rc)
		}
	}
	slices.SortFunc(out, func(a, b resumeCheck) int { return cmp.Compare(a.at, b.at) })
	return out
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
			if rg.dead[a] || (st.HasTable && !st.Lapsed && st.Named) {
				continue
			}
			return &Violation{Check: CheckLiveness, At: Duration(time.Duration(e.t) * time.Microsecond), Event: eventName(e.kind),
				Detail: fmt.Sprintf("%s, lease + 3Δ after the last fault healed: table %d/%d (has %v) lease %s lapsed %v named %v",
					agentName(rg.name, a), st.Term, st.Epoch, st.HasTable, time.Duration(st.LeaseExpiry)*time.Microsecond, st.Lapsed, st.Named)}
		}
	}
	return nil
}

// converge is CheckConverge: every agent whose table is in force runs
// each key within convergeTolerance of what a node holding only that
// table runs (the same configuration, policy and store, the same clock
// reading). It compares the schedules' current limits — what each node
// moves to, whether or not an increase's fence has passed.
func (c *checker) converge(e *event) *Violation {
	r := c.r
	for ri, rg := range r.regions {
		if r.regionDown(ri, r.now) {
			continue
		}
		for a, n := range rg.nodes {
			rules := n.Policy().Rules()
			w := &rg.watch[a]
			if st := n.Table(); rg.dead[a] || !st.HasTable || st.Lapsed || !st.Named || w.applied == nil {
				continue // CheckLiveness's
			}
			local := rg.nodeNow(a, r.now)
			g := rg.first + a
			var err error
			if c.fresh[g].of != w.applied || c.fresh[g].n.Policy() != n.Policy() {
				// A node holding only this table, made when the table is
				// first checked and kept while it is in force.
				c.fresh[g].of = w.applied
				if c.fresh[g].n, err = region.NewNode(rg.ncfg[a], n.Policy(), &rg.fail); err == nil {
					err = c.fresh[g].n.Apply(w.applied, local)
				}
			}
			fresh := c.fresh[g].n
			if err != nil {
				return &Violation{Check: CheckConverge, At: Duration(time.Duration(e.t) * time.Microsecond), Event: eventName(e.kind),
					Detail: fmt.Sprintf("%s: a fresh node refuses its table %d/%d: %v", agentName(rg.name, a), w.applied.Term, w.applied.Epoch, err)}
			}
			for k := range r.keys {
				rule := rules[r.keys[k].rule]
				got := shareOfLimit(rule.Limit, n.ScheduleAt(rule, r.keys[k].name, local).Current.Limit)
				want := shareOfLimit(rule.Limit, fresh.ScheduleAt(rule, r.keys[k].name, local).Current.Limit)
				if got < want-convergeTolerance || got > want+convergeTolerance {
					return &Violation{Check: CheckConverge, At: Duration(time.Duration(e.t) * time.Microsecond), Event: eventName(e.kind), Key: r.keys[k].name,
						Detail: fmt.Sprintf("%s, lease + 3Δ after the last fault healed: key %s at %d ppm, its table %d/%d says %d ppm",
							agentName(rg.name, a), r.keys[k].name, got, w.applied.Term, w.applied.Epoch, want)}
				}
			}
		}
	}
	return nil
}

// resumeCheck is CheckResume for one crash: a term that started after it
// runs, out of learning mode.
func (c *checker) resumeCheck(e *event, rc resumeCheck) *Violation {
	r := c.r
	started := len(r.terms) > 0 && r.terms[len(r.terms)-1].At > rc.crash
	if r.coord != nil && started && !r.coord.Stats().Learning {
		return nil
	}
	if rc.crashIdx >= 0 && r.crashed[rc.crashIdx][0] >= 0 && len(r.regions[r.crashed[rc.crashIdx][0]].nodes) == 1 {
		// The crash silenced its region (issue 17, defect 5: "a silent
		// region still waits for its lease"): check again at that bound,
		// or not at all if another fault comes first.
		if rc.silentAt > rc.at {
			c.resume = append(c.resume, resumeCheck{at: rc.silentAt, crash: rc.crash, crashIdx: -1})
			slices.SortFunc(c.resume, func(a, b resumeCheck) int { return cmp.Compare(a.at, b.at) })
		}
		return nil
	}
	state := "no coordinator runs"
	if r.coord != nil {
		state = fmt.Sprintf("term %d runs (started after the crash: %v, learning: %v)", r.term, started, r.coord.Stats().Learning)
	}
	return &Violation{Check: CheckResume, At: Duration(time.Duration(e.t) * time.Microsecond), Event: eventName(e.kind),
		Detail: fmt.Sprintf("election TTL + 2Δ after the coordinator crashed at %s: %s", time.Duration(rc.crash)*time.Microsecond, state)}
}

// caps is CheckResources' coordinator half: the term's keys at most the
// run's keys, its stored table's rows at most keys and its agents at most
// the run's agents.
func (c *checker) caps(e *event) *Violation {
	r := c.r
	st := r.coord.Stats()
	bad := ""
	switch {
	case st.Keys > len(r.keys):
		bad = fmt.Sprintf("term %d holds %d keys, the run has %d", r.term, st.Keys, len(r.keys))
	case r.stored != nil && len(r.stored.Keys) > len(r.keys):
		bad = fmt.Sprintf("table %d/%d has %d rows, the run has %d keys", r.stored.Term, r.stored.Epoch, len(r.stored.Keys), len(r.keys))
	case r.stored != nil && len(r.stored.Agents) > r.agents:
		bad = fmt.Sprintf("table %d/%d names %d agents, the run has %d", r.stored.Term, r.stored.Epoch, len(r.stored.Agents), r.agents)
	}
	if bad == "" {
		return nil
	}
	return &Violation{Check: CheckResources, At: Duration(time.Duration(e.t) * time.Microsecond), Event: eventName(e.kind), Detail: bad}
}

// resourceBound is what one agent may send and call in a run of T with
// interval Δ, whatever the faults (no spinning):
//
//   - bus messages ≤ (T/Δ + 2) · (report chunks + 3): a report per
//     interval and at most three acknowledgements (a table per rebalance,
//     and the increases and membership changes between);
//   - bucket calls ≤ T · (2/Poll + 1/Renew + 1/Resync) + Σ over the faults
//     that break its watch of (log2(RetryMax/RetryMin) + 2 + For/RetryMax)
//   - 10: the election's polls (jittered, at most twice as often as
//     Poll) or renewals, the head's resyncs, and a failed watch's retries
//     backing off to RetryMax.
func resourceBound(r *Run, ri, a int) (bus, kv int64) {
	T := float64(r.end) / 1e6
	delta := float64(r.interval) / 1e6
	chunks := float64(r.reportChunks)
	bus = int64((T/delta + 2) * (chunks + 3))
	wc := protocol.DefaultWatchConfig()
	poll, renew := (ElectionTTL / 6).Seconds(), (ElectionTTL / 3).Seconds()
	calls := T*(2/poll+1/renew+1/wc.Resync.Seconds()) + 10
	backoff := math.Log2(float64(wc.RetryMax)/float64(wc.RetryMin)) + 2
	name := r.regions[ri].name
	spells := slices.Concat(r.sc.Faults.NATSOutage, r.sc.Faults.KVLoss)
	for _, f := range r.sc.Faults.RegionLoss {
		if f.Region == name {
			spells = append(spells, f.FaultSpell)
		}
	}
	for _, f := range r.sc.Faults.AgentPartition {
		if f.Region == name && f.Agent == a+1 {
			spells = append(spells, f.FaultSpell)
		}
	}
	for _, f := range spells {
		calls += backoff + f.For.D().Seconds()/wc.RetryMax.Seconds()
	}
	return bus, int64(calls)
}

// resources is CheckResources' agent half, at the end of the run.
func (c *checker) resources() *Violation {
	r := c.r
	if r.baseline() {
		return nil
	}
	for ri, rg := range r.regions {
		for a := range rg.nodes {
			bus, kv := resourceBound(r, ri, a)
			if rg.busOut[a] > bus || rg.kvOps[a] > kv {
				return &Violation{Check: CheckResources, At: r.sc.Duration, Event: "end",
					Detail: fmt.Sprintf("%s: %d bus messages (bound %d), %d bucket calls (bound %d) in %s at Δ %s",
						agentName(rg.name, a), rg.busOut[a], bus, rg.kvOps[a], kv, r.sc.Duration.D(), time.Duration(r.interval)*time.Microsecond)}
			}
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
	case evFault:
		// A clock step, or an agent's crash or restart (a new node).
		for ri, rg := range r.regions {
			for a := range rg.nodes {
				c.column(ri, a)
			}
		}
	}
	if len(r.forgedDepose) > 0 {
		return &Violation{Check: CheckForgedDepose, At: Duration(time.Duration(e.t) * time.Microsecond), Event: eventName(e.kind),
			Detail: fmt.Sprintf("term %d's store was fenced by a head no coordinator wrote (head revision %d)", r.term, r.tkv.rev)}
	}
	for len(c.resume) > 0 && r.now >= c.resume[0].at {
		rc := c.resume[0]
		c.resume = c.resume[1:]
		c.resumed = true
		if v := c.resumeCheck(e, rc); v != nil {
			return v
		}
	}
	if e.kind == evCoordTick && r.coord != nil {
		if v := c.caps(e); v != nil {
			return v
		}
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
	// The liveness checks hold from a lease + 3Δ after the last fault
	// healed to the end: first at that instant, then at every per-second
	// sample.
	if r.now >= c.live && (!c.lived || e.kind == evSample) {
		c.lived = true
		if v := c.liveness(e); v != nil {
			return v
		}
		if v := c.converge(e); v != nil {
			return v
		}
	}
	if !c.dirty {
		return nil
	}
	c.dirty = false
	c.checks++
	// Mid-reload (ReloadSpec) the live agents run different policies: a
	// rollout promises no more than the largest budget among them, so the
	// shares and bursts in force are measured against that.
	mixed, one := c.policies()
	for k := range r.keys {
		var sum, bsum int64
		budget := r.keys[k].budget
		if one != nil {
			budget = one.Rules()[r.keys[k].rule].Limit
		}
		bcap := budget.Burst()
		if mixed != nil {
			budget, bcap = loosest(mixed, r.keys[k].rule)
		}
		for ri, rg := range r.regions {
			if c.down[ri] {
				continue
			}
			var p, b int64
			for a := range rg.nodes {
				g := rg.first + a
				if rg.dead[a] {
					continue // decides nothing until it restarts
				}
				pp := c.ppm[g][k]
				if mixed != nil {
					pp = shareOfLimit(budget, c.lim[g][k])
				}
				p = max(p, pp)
				b = max(b, c.burst[g][k])
			}
			sum += p
			bsum += b
		}
		c.maxSum = max(c.maxSum, sum)
		switch {
		case sum > rebalance.PPM:
			return c.violation(CheckShare, e, k, fmt.Sprintf("key %s: Σ shares in force %d ppm > %d", r.keys[k].name, sum, rebalance.PPM))
		case bsum > bcap:
			return c.violation(CheckBurst, e, k, fmt.Sprintf("key %s: Σ bursts in force %d > the budget's %d", r.keys[k].name, bsum, bcap))
		}
	}
	return nil
}

// policies returns the policies the live agents run: mixed lists them
// when they are not all the same one, one is that one otherwise (both nil:
// no agent lives).
func (c *checker) policies() (mixed []*region.Policy, one *region.Policy) {
	for ri, rg := range c.r.regions {
		for a, n := range rg.nodes {
			if c.down[ri] || rg.dead[a] {
				continue
			}
			if p := n.Policy(); !slices.Contains(mixed, p) {
				mixed = append(mixed, p)
			}
		}
	}
	if len(mixed) == 1 {
		return nil, mixed[0]
	}
	return mixed, nil
}

// loosest is the largest of the budgets ps give rule k (the shortest
// interval) and the largest burst.
func loosest(ps []*region.Policy, k int) (gcra.Limit, int64) {
	best := ps[0].Rules()[k].Limit
	burst := best.Burst()
	for _, p := range ps[1:] {
		l := p.Rules()[k].Limit
		if l.IntervalMicros() < best.IntervalMicros() {
			best = l
		}
		burst = max(burst, l.Burst())
	}
	return best, burst
}

func (c *checker) violation(check string, e *event, k int, detail string) *Violation {
	return &Violation{Check: check, At: Duration(time.Duration(e.t) * time.Microsecond), Event: eventName(e.kind),
		Key: c.r.keys[k].name, Detail: detail + "; " + c.regionsDetail(k)}
}

// regionsDetail says what each region's agents run for key k.
// scheduleDetail says what a schedule runs: its limits, epochs and when
// the current one takes effect.
func scheduleDetail(s gcra.Schedule) string {
	cur := fmt.Sprintf("%s epoch %d from %s", s.Current.Limit, s.Current.Epoch, time.Duration(s.Current.Effective)*time.Microsecond)
	if !s.HasPrevious {
		return cur
	}
	return fmt.Sprintf("%s epoch %d, then %s", s.Previous.Limit, s.Previous.Epoch, cur)
}

func (c *checker) regionsDetail(k int) string {
	r := c.r
	var parts []string
	for ri, rg := range r.regions {
		var agents []string
		for a, n := range rg.nodes {
			st := n.Table()
			pv := ""
			if v := slices.Index(r.policies, n.Policy()); v > 0 {
				pv = fmt.Sprintf(" policy v%d", v)
			}
			agents = append(agents, fmt.Sprintf("%s %d ppm burst %d (table %d/%d lease %s lapsed %v named %v%s; %s)",
				agentName(rg.name, a), c.ppm[rg.first+a][k], c.burst[rg.first+a][k], st.Term, st.Epoch,
				time.Duration(st.LeaseExpiry)*time.Microsecond, st.Lapsed, st.Named, pv,
				scheduleDetail(n.ScheduleAt(n.Policy().Rules()[r.keys[k].rule], r.keys[k].name, rg.nodeNow(a, r.now)))))
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
	checks  int64
	lived   bool // the liveness check ran
	resumed bool // a CheckResume ran
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
	st := runStats{checks: c.checks, lived: c.lived, resumed: c.resumed}
	if v, ok := err.(*Violation); ok {
		return v, st, nil
	}
	if err != nil {
		return nil, st, err
	}
	if v := c.resources(); v != nil {
		return v, st, nil
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
