package region

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/rebalance"
)

// TableState is what the node runs on, for admin views and metrics.
type TableState struct {
	HasTable    bool
	Term, Epoch uint64
	// Issued is when the coordinator issued the table (µs on its clock);
	// 0 without a table.
	Issued int64
	// LeaseExpiry is when the table's lease for this region ends (µs on the
	// coordinator's clock, which the lease is measured on); 0 without a
	// table.
	LeaseExpiry int64
	// Lapsed is set once the lease passed with no newer table: every key
	// runs at min(last share, safe share).
	Lapsed bool
	// Named says whether the table names this agent in its region
	// (Table.Agents); an agent it does not name runs every key at
	// min(last share, safe share), as after a lapse. False without a table.
	Named bool
	Keys  int
}

// Table returns the state of the table in force. Call it on the
// Tick/Apply goroutine.
func (n *Node) Table() TableState {
	s := n.snap.Load()
	return TableState{HasTable: s.hasTable, Term: s.term, Epoch: s.epoch, Issued: s.issued, LeaseExpiry: n.leaseExpiry.Load(),
		Lapsed: s.lapsed, Named: s.named, Keys: len(s.rows.rows)}
}

// Apply puts table t in force from now (µs): tables older than the one in
// force (by term, then epoch) are refused with ErrStaleTable, malformed
// ones with ErrBadTable; both change nothing. Each key's new regional limit
// takes effect at t.Effective on the store's clock (the store applies
// "limit changes keep tokens"), so decreases and increases happen when the
// coordinator scheduled them. The lease for this region runs until
// t.Leases[r] (an instant on the coordinator's clock); Tick reduces every
// key to min(last share, safe share) once it passes. A table that does not
// name this agent in its region (t.Agents[r]) is applied reduced: every key
// runs at min(last share, safe share) — a key the table gives a new version
// from its effective time, in the version's reduced epoch slot, never at
// the table's share; a key whose version is unchanged from the earlier of
// now and the effective time — and a later table that names the agent
// restores the table's shares from max(its effective time, now), as after
// a lapse. The coordinator waits for no acknowledgement from an agent its
// tables do not name, so this is what makes that safe. A table whose
// lease has passed when it arrives (a late copy) is applied lapsed in the
// same way: its shares never run. Apply runs on the Tick goroutine.
func (n *Node) Apply(t *rebalance.Table, now int64) error {
	if t == nil {
		return fmt.Errorf("%w: nil", ErrBadTable)
	}
	n.pubMu.Lock()
	defer n.pubMu.Unlock()
	if t.Shadow {
		return fmt.Errorf("%w: a shadow table is for display only", ErrBadTable)
	}
	old := n.snap.Load()
	if old.hasTable && !t.Newer(old.term, old.epoch) {
		return fmt.Errorf("%w: term %d epoch %d, in force term %d epoch %d", ErrStaleTable, t.Term, t.Epoch, old.term, old.epoch)
	}
	r := slices.Index(t.Regions, n.cfg.Region)
	if err := n.checkTable(t, r, now); err != nil {
		return err
	}
	named := r < len(t.Agents) && slices.Contains(t.Agents[r], n.cfg.Agent)
	// A table that does not name this agent, or whose lease has passed
	// already (a late copy), is applied reduced: its shares never run, not
	// even for the instants a store behind the node's clock still sees.
	reduced, from := !named || now >= t.Leases[r], min(now, t.Effective)
	if now >= t.Leases[r] {
		from = min(from, t.Leases[r])
	}
	var rs rowSet
	var limits []gcra.Limit
	next := func(ks *rebalance.KeyShares, o *row) *row {
		same := o != nil && ks.Version == o.version && ks.Budget == o.budget
		if !reduced {
			if same && (o.sub%2 == 0 || o.sub == 3) {
				return o // unchanged: shared, and no limits to derive
			}
			limits = ks.Limits(limits)
			return n.transition(o, ks, limits[r], t.Effective, now)
		}
		if same && o.sub%2 == 1 {
			return o // already reduced
		}
		limits = ks.Limits(limits)
		return n.reducedRow(o, ks, limits[r], t.Effective, from, now)
	}
	if same := len(t.Keys) == len(old.rows.names); same && func() bool {
		for i := range t.Keys {
			if t.Keys[i].Key != old.rows.names[i] {
				return false
			}
		}
		return true
	}() {
		// The same keys as the table in force (the common case): share the
		// index and names.
		rs = rowSet{index: old.rows.index, names: old.rows.names, rows: make([]*row, len(t.Keys)), sorted: old.rows.sorted}
		for i := range t.Keys {
			rs.rows[i] = next(&t.Keys[i], old.rows.rows[i])
		}
	} else {
		rs = rowSet{index: make(map[string]int, len(t.Keys)), names: make([]string, 0, len(t.Keys)), rows: make([]*row, 0, len(t.Keys)), sorted: len(t.Keys)}
		// The table's keys and the old rows' sorted names, merged: a key's
		// old row is found by walking, not by a map lookup (at 100,000
		// keys a map lookup per key was a third of Apply). Old keys the
		// table dropped are collected on the way; the old rows past the
		// sorted names (kept reduced) are few and looked up.
		sorted, tail := old.rows.names[:old.rows.sorted], len(old.rows.names) > old.rows.sorted
		var dropped []int
		j := 0
		for i := range t.Keys {
			ks := &t.Keys[i]
			for j < len(sorted) && sorted[j] < ks.Key {
				dropped = append(dropped, j)
				j++
			}
			var o *row
			if j < len(sorted) && sorted[j] == ks.Key {
				o = old.rows.rows[j]
				j++
			} else if tail {
				o = old.rows.get(ks.Key)
			}
			rs.index[ks.Key] = len(rs.rows)
			rs.names = append(rs.names, ks.Key)
			rs.rows = append(rs.rows, next(ks, o))
		}
		for ; j < len(sorted); j++ {
			dropped = append(dropped, j)
		}
		for i := len(sorted); i < len(old.rows.names); i++ {
			if _, ok := rs.index[old.rows.names[i]]; !ok {
				dropped = append(dropped, i)
			}
		}
		// A key the table no longer names runs reduced, for as long as
		// state written under its last limit may live; then it is a key
		// with no row (the safe share).
		for _, i := range dropped {
			k := old.rows.names[i]
			nr := n.reduce(old.rows.rows[i], now)
			if last := inForceAt(&nr.sched, now); now < nr.sched.Current.Effective+windowMicros(last.Limit)+windowMicros(nr.sched.Previous.Limit) {
				rs.index[k] = len(rs.rows)
				rs.names = append(rs.names, k)
				rs.rows = append(rs.rows, &nr)
			}
		}
	}
	n.leaseExpiry.Store(t.Leases[r])
	// Until t is surely in force, InForce names what is surely in force
	// now, and the superseded table once it is: it runs on the store from
	// its effective time until t's, unless t takes effect first.
	s := &snapshot{policy: old.policy, hasTable: true, term: t.Term, epoch: t.Epoch,
		issued: t.Issued, effective: t.Effective, named: named, features: t.Features, rows: rs,
		resync: r < len(t.Resync) && slices.Contains(t.Resync[r], n.cfg.Agent)}
	s.prevTerm, s.prevEpoch = n.inForce(old, now)
	if old.hasTable && (s.prevTerm != old.term || s.prevEpoch != old.epoch) && old.effective <= t.Effective {
		s.hasMid, s.midTerm, s.midEpoch, s.midEffective = true, old.term, old.epoch, old.effective
	}
	n.publish(s)
	if now >= n.leaseExpiry.Load() {
		n.lapse(now)
	}
	return nil
}

func windowMicros(l gcra.Limit) int64 { return l.Burst() * l.IntervalMicros() }

func (n *Node) checkTable(t *rebalance.Table, r int, now int64) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadTable, fmt.Sprintf(format, args...))
	}
	switch {
	case r < 0:
		return bad("regions %q do not include %q", t.Regions, n.cfg.Region)
	case len(t.Leases) != len(t.Regions):
		return bad("%d leases for %d regions", len(t.Leases), len(t.Regions))
	case t.Effective < 0 || t.Effective >= gcra.MaxTime || t.Issued < 0 || t.Issued >= gcra.MaxTime:
		return bad("issued %dµs or effective %dµs outside [0, 2^52)", t.Issued, t.Effective)
	case now < 0 || now >= gcra.MaxTime:
		return bad("now %dµs outside [0, 2^52)", now)
	case t.Leases[r] < 0 || t.Leases[r] >= gcra.MaxTime:
		return bad("lease %dµs outside [0, 2^52)", t.Leases[r])
	}
	for i := range t.Keys {
		ks := &t.Keys[i]
		if len(ks.Shares) != len(t.Regions) {
			return bad("keys[%d] %q: %d shares for %d regions", i, ks.Key, len(ks.Shares), len(t.Regions))
		}
		if err := ks.Budget.Validate(); err != nil {
			return bad("keys[%d] %q: budget: %v", i, ks.Key, err)
		}
		if ks.Key == "" || len(ks.Key) > gcra.MaxKeyLen {
			return bad("keys[%d]: key of %d bytes outside [1, %d]", i, len(ks.Key), gcra.MaxKeyLen)
		}
		if i > 0 && t.Keys[i-1].Key >= ks.Key {
			return bad("keys[%d] %q: keys not sorted and distinct", i, ks.Key)
		}
		if ks.Version > 1<<60 {
			return bad("keys[%d] %q: version %d too large", i, ks.Key, ks.Version)
		}
	}
	return nil
}

// transition is a key's row after a table gives it limit lim (version
// ks.Version) from eff on, given its row o under the previous table. An
// unchanged row is shared (rows are immutable).
func (n *Node) transition(o *row, ks *rebalance.KeyShares, lim gcra.Limit, eff, now int64) *row {
	v := ks.Version
	switch {
	case o != nil && v < o.version:
		n.regressions.Add(1)
		return o
	case o != nil && v == o.version && (o.sub%2 == 0 || o.sub == 3) && o.budget == ks.Budget:
		// Unchanged (or reduced twice: it stays until the version moves).
		return o
	}
	nr := &row{version: v, budget: ks.Budget}
	switch {
	case o == nil:
		prev := gcra.Version{Limit: SafeLimit(ks.Budget, n.idle, len(n.cfg.Regions)), Epoch: coldEpoch}
		nr.sched = change(prev, gcra.Version{Limit: lim, Epoch: epochOf(v, 0), Effective: eff})
	case v == o.version && (o.sub%2 == 0 || o.sub == 3):
		// The budget changed under the same version: keep the limits, or
		// the same parts of a smaller budget.
		nr.sub, nr.sched = o.sub, shrunkSchedule(o.sched, o.budget, ks.Budget)
	case v == o.version:
		// Restore after a lapse: a new epoch slot within the version.
		nr.sub = o.sub + 1
		at := max(eff, now)
		nr.sched = change(shrunkVersion(inForceAt(&o.sched, at), o.budget, ks.Budget), gcra.Version{Limit: lim, Epoch: epochOf(v, nr.sub), Effective: at})
	default:
		prev := shrunkVersion(inForceAt(&o.sched, eff), o.budget, ks.Budget)
		if eff > now {
			// A pending change lowers now whatever it lowers — the burst
			// of a row whose rate rises while its burst falls, which the
			// coordinator fences with the increases, at the one
			// effective time of every region, where a region whose clock
			// runs ahead by up to MaxSkew could raise its burst first
			// (explorer schedule 32 of seed 1: Σ bursts in force 95 of
			// 94) — and keeps what it raises until eff. The version it
			// replaces, if that was itself still pending, is no higher
			// than it either.
			prev.Limit = minLimit(minLimit(prev.Limit, lim), shrunk(inForceAt(&o.sched, now).Limit, o.budget, ks.Budget))
		}
		nr.sched = change(prev, gcra.Version{Limit: lim, Epoch: epochOf(v, 0), Effective: eff})
	}
	return nr
}

// reducedRow is a key's row after a table applied reduced (it does not
// name this agent, or its lease had passed when it came) gives it limit lim
// (version ks.Version) from eff on, given its row o (nil: none yet): the
// key runs reduced, never at lim. A new version goes straight into its
// first reduced epoch slot, 4v+5, at eff, with min(the limit in force
// before it, the safe limit, lim); the agents of the region that run the
// table run the same version in slot 4v+4, so a state one of them writes
// is read by the other as newer than its own slot (kept as stored) or as
// older than its previous change (empty at that change). An unchanged
// version (or a version that went backwards, kept as transition keeps it)
// is reduced in its next slot from from (no earlier than its own change),
// as a lapse reduces it.
func (n *Node) reducedRow(o *row, ks *rebalance.KeyShares, lim gcra.Limit, eff, from, now int64) *row {
	v := ks.Version
	safe := SafeLimit(ks.Budget, n.safe, len(n.cfg.Regions))
	if o != nil && v <= o.version {
		if v < o.version {
			n.regressions.Add(1)
			ks = nil // keep o's budget
		}
		nr := *o
		if o.sub%2 == 0 {
			nr = n.reduce(o, max(o.sched.Current.Effective, from))
		}
		if ks != nil {
			nr.sched = shrunkSchedule(nr.sched, o.budget, ks.Budget)
			nr.budget = ks.Budget
		}
		return &nr
	}
	prev := gcra.Version{Limit: SafeLimit(ks.Budget, n.idle, len(n.cfg.Regions)), Epoch: coldEpoch}
	if o != nil {
		// What runs until eff: never a change still pending now, nor more
		// than its part of a smaller budget.
		prev = shrunkVersion(inForceAt(&o.sched, min(now, eff)), o.budget, ks.Budget)
		if o.sched.Current.Effective > now {
			lim = minLimit(lim, o.sched.Current.Limit)
		}
	}
	red := minLimit(minLimit(prev.Limit, safe), lim)
	return &row{version: v, sub: 1, budget: ks.Budget,
		sched: change(prev, gcra.Version{Limit: red, Epoch: epochOf(v, 1), Effective: eff})}
}

// change is the schedule switching from prev to cur, never before prev
// took effect: a table can arrive after a change it predates (a lease
// lapsed, or shares were restored, after the table's effective time), and
// a schedule whose current version takes effect before its previous one is
// one no store accepts. The store keeps running prev until then, as the
// node's earlier schedule had it do.
func change(prev, cur gcra.Version) gcra.Schedule {
	cur.Effective = max(cur.Effective, prev.Effective)
	return gcra.Change(prev, cur)
}

// reduce is o run at min(last limit, safe limit) from now on, in the next
// epoch slot of its version (o itself when it already runs reduced).
func (n *Node) reduce(o *row, now int64) row {
	if o.sub%2 == 1 {
		return *o
	}
	nr := *o
	nr.sub = o.sub + 1
	last := inForceAt(&o.sched, now)
	lim := minLimit(last.Limit, SafeLimit(o.budget, n.safe, len(n.cfg.Regions)))
	if o.sched.Current.Effective > now {
		// A pending change: never more than it grants either.
		lim = minLimit(lim, o.sched.Current.Limit)
	}
	// Until now the store runs what o runs just before now: at a pending
	// change's own effective time (a lapse or a policy mismatch reduces
	// from there) that is the version it replaces, not the change — which
	// as the schedule's previous version would run before its fence
	// (TestNodeBudgetShrinkTakesLimitsDown, "policy reloaded": 90 % in
	// force an hour early).
	nr.sched = change(inForceAt(&o.sched, now-1), gcra.Version{Limit: lim, Epoch: epochOf(o.version, nr.sub), Effective: now})
	return nr
}

// lapseIfDue lapses the table once now (µs, the node's clock) has reached
// its lease, and says whether it did. Tick calls it, and so does every
// decision before it reads the snapshot: a node that was frozen past its
// lease (a stopped process, a paused VM) must not serve one request at the
// old share before its next Tick — the coordinator has given that share
// to the other regions by then (the explorer found Σ in force at 1.04·10⁶
// ppm in that window). Outside the window it is two atomic loads.
func (n *Node) lapseIfDue(now int64) bool {
	if s := n.snap.Load(); !s.hasTable || s.lapsed || now < n.leaseExpiry.Load() {
		return false
	}
	n.pubMu.Lock()
	defer n.pubMu.Unlock()
	if s := n.snap.Load(); !s.hasTable || s.lapsed || now < n.leaseExpiry.Load() {
		return false // another goroutine lapsed it, or a table came
	}
	n.lapse(now)
	return true
}

// lapse runs every key at min(last share, safe share) from now on. The
// caller holds pubMu.
//
// The reduction takes effect at the lease's expiry, the same instant for
// every agent of the region (they share the key's state and its epoch), or
// at a pending change's effective time if that is later.
func (n *Node) lapse(now int64) {
	old := n.snap.Load()
	at := n.leaseExpiry.Load()
	rs := rowSet{index: old.rows.index, names: old.rows.names, rows: make([]*row, len(old.rows.rows)), sorted: old.rows.sorted}
	for i, o := range old.rows.rows {
		nr := n.lapsedRow(o, at)
		rs.rows[i] = &nr
	}
	s := *old
	s.rows, s.lapsed = rs, true
	n.publish(&s)
}

// Schedule returns the schedule the node would pass its store for key (a
// key name, KeyName) under rule (the policy rule that governs it:
// Policy.RuleForKey) in its next decision, under the table in force: the
// regional limit, the one it replaces and when (the store picks by its own
// clock, Previous before Current.Effective). A key whose table budget
// differs from the rule's limit counts in Stats.Reduced, as in a decision.
// For views and checkers; safe for many goroutines.
func (n *Node) Schedule(rule *Rule, key string) gcra.Schedule {
	return n.schedule(n.snap.Load(), rule, key)
}

// ScheduleAt is Schedule as the node's next decision at now (µs on the
// node's clock) runs it: once the lease has passed, the table lapsed (see
// lapseIfDue), whether or not a Tick or a decision has lapsed it yet. For
// checkers that ask what a region enforces between its events; safe for
// many goroutines.
func (n *Node) ScheduleAt(rule *Rule, key string, now int64) gcra.Schedule {
	s := n.snap.Load()
	at := n.leaseExpiry.Load()
	if !s.hasTable || s.lapsed || now < at || rule.Scope == Regional {
		return n.schedule(s, rule, key)
	}
	r := s.rows.get(key)
	if r == nil {
		return n.scheduleRow(rule, nil)
	}
	nr := n.lapsedRow(r, at)
	// As the lapse's snapshot runs it: with the table's fence (withFence).
	return n.withFence(s, rule, &nr, n.scheduleRow(rule, &nr))
}

// lapsedRow is o once the lease that ended at at has lapsed: reduced to
// min(last share, safe share) from at, or from a pending change's effective
// time if that is later. lapse publishes it; ScheduleAt shows it before.
func (n *Node) lapsedRow(o *row, at int64) row {
	return n.reduce(o, max(at, o.sched.Current.Effective))
}

// InForce returns the newest table surely in force on the store at now
// (µs on the node's clock): one whose effective time plus MaxSkew has
// passed, since the store switches on its own clock (Redis TIME), which may
// lag the node's by MaxSkew. That is the newest applied table once its
// effective time plus MaxSkew has passed; before then the table it
// superseded, once that one's effective time plus MaxSkew has passed (it
// runs on the store until the newer one takes effect); else the table
// surely in force when the newest was applied (0, 0 for none). So an
// acknowledgement never names a table before its effective time plus
// MaxSkew. Reports carry it, and an agent acknowledges it to the
// coordinator. Call it on the Tick/Apply goroutine.
func (n *Node) InForce(now int64) (term, epoch uint64) {
	return n.inForce(n.snap.Load(), now)
}

func (n *Node) inForce(s *snapshot, now int64) (term, epoch uint64) {
	skew := n.cfg.MaxSkew.Microseconds()
	switch {
	case now >= s.effective+skew:
		return s.term, s.epoch
	case s.hasMid && now >= s.midEffective+skew:
		return s.midTerm, s.midEpoch
	}
	return s.prevTerm, s.prevEpoch
}

// Tick closes the report interval if now (µs) has left it and returns this
// agent's demand report for it (nil otherwise), naming the table in force
// (the newest applied one whose effective time has passed; 0/0 for none),
// and reduces every key to
// min(last share, safe share) once the lease has passed. Demand recorded
// since the previous report goes into the report of the last closed
// interval. Keys idle for a few reports are forgotten (their counters are
// zero and their local state rested). Tick runs on one goroutine.
func (n *Node) Tick(now int64) *rebalance.Report {
	n.lapseIfDue(now)
	n.tickLost(now)
	s := n.snap.Load()
	idx := now / n.cfg.Interval.Microseconds()
	if !n.started {
		n.open, n.started = idx, true
		return nil
	}
	if idx <= n.open {
		return nil
	}
	n.open = idx
	// The coordinator reads the report's epoch as "in force here".
	term, epoch := n.InForce(now)
	rep := &rebalance.Report{Region: n.cfg.Region, Agent: n.cfg.Agent, Interval: idx - 1,
		Term: term, Epoch: epoch, PolicyVersion: s.policy.Version()}
	if n.idle < n.safe {
		rep.Features = rebalance.AgentIdleFloors
	}
	delta := n.cfg.ReportChange > 0 && s.hasTable && s.features&rebalance.FeatureDeltaReports != 0
	// A lapsed lease means tables stopped reaching this agent, and likely
	// its reports the coordinator: every report is full until a table
	// renews it.
	full := !delta || !n.fullSent || n.fullTerm != s.term || s.lapsed || (s.resync && n.fullGen != s.gen)
	period := max(1, int64(n.cfg.ReportRefresh/n.cfg.Interval))
	refresh := uint32((idx - 1) % period) // keys whose slot falls here are listed
	if delta && full {
		n.fullSent, n.fullTerm, n.fullGen = true, s.term, s.gen
	}
	rep.Delta = delta && !full
	n.localMu.Lock() // e's local state; lock order: localMu, then shards
	defer n.localMu.Unlock()
	for i := range n.keys.shards {
		sh := &n.keys.shards[i]
		sh.mu.Lock()
		for name, e := range sh.m {
			dm := rebalance.Demand{Offered: e.offered.Swap(0), OfferedCost: e.offeredCost.Swap(0),
				Admitted: e.admitted.Swap(0), Denied: e.denied.Swap(0)}
			if delta && e.global {
				ch := n.changed(&e.listed, &dm)
				if ch {
					e.listed = dm
				}
				// A full report lists every key with demand (absent is
				// none); a delta lists the changed ones, zero included.
				list := ch || e.relist || (e.listed.Offered > 0 && e.slot%uint32(period) == refresh)
				if (full && e.listed.Offered > 0) || (!full && list) {
					rep.Keys = append(rep.Keys, rebalance.KeyDemand{Key: name, Demand: sent(e.listed, s.features)})
				}
				e.relist = ch
			} else {
				e.listed, e.relist = dm, false
			}
			if dm.Offered == 0 {
				e.idle++
				if e.idle >= idleReports && e.localTAT() <= now {
					e.dead = true
					delete(sh.m, name)
					n.keys.n.Add(-1)
				}
				continue
			}
			e.idle = 0
			if e.global && !delta {
				rep.Keys = append(rep.Keys, rebalance.KeyDemand{Key: name, Demand: sent(dm, s.features)})
			}
		}
		sh.mu.Unlock()
	}
	slices.SortFunc(rep.Keys, func(a, b rebalance.KeyDemand) int { return cmp.Compare(a.Key, b.Key) })
	return rep
}

// sent is the part of a key's demand a report carries to the coordinator
// of a table with features: its offered cost alone where the coordinator
// reads nothing else (rebalance.FeatureCostDemand), else all of it.
func sent(d rebalance.Demand, features uint32) rebalance.Demand {
	if features&rebalance.FeatureCostDemand != 0 {
		return rebalance.Demand{OfferedCost: d.OfferedCost}
	}
	return d
}

// changed reports whether a key's demand cur in an interval differs enough
// from the demand it was last listed with to list it again
// (Config.ReportChange). A denied key gets no tighter threshold: in
// BenchmarkControlCost a 5 % one for keys denied two intervals running fed
// back — a listing moves shares, the move's limit change denies a request,
// the denial lists the key again — and cost 16 bytes per key·region·s
// instead of 3, while the simulator's UA moved by at most 0.1 point.
func (n *Node) changed(last, cur *rebalance.Demand) bool {
	if (last.Offered == 0) != (cur.Offered == 0) {
		return true
	}
	a, b := float64(last.OfferedCost), float64(cur.OfferedCost)
	return math.Abs(a-b) > n.cfg.ReportChange*max(a, b)
}

// idleReports is how many empty reports a key stays tracked for.
const idleReports = 3
