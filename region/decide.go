package region

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meridian-quota/meridian/gcra"
)

// Match is one limit a request touches.
type Match struct {
	// Descriptor is the index of the first request descriptor that formed
	// this key (two descriptors naming the same key are one check with the
	// costs summed); Descriptors has bit i set for every descriptor i that
	// formed it (MaxDescriptors is 64).
	Descriptor  int
	Descriptors uint64
	Rule        *Rule
	Key         gcra.Key
	Schedule    gcra.Schedule
	Cost        int64
	// Result is this limit's outcome once decided.
	Result gcra.Result

	entry   *entry
	decided bool
	closed  bool // denied by failure_mode closed while the store failed
}

// Denied reports whether this limit itself denied the request: its own
// result was a denial (not merely uncharged because another limit of a
// composite denied), or the store failed and its failure mode closed it.
func (m *Match) Denied() bool {
	r := &m.Result
	return m.closed || (!r.Allowed && (r.TooLarge || r.RetryAfter > 0 || r.Limit.IsZero()))
}

// Decision is the workspace and outcome of one request. Reuse one per
// goroutine (or from a sync.Pool) and the hot path allocates nothing; it is
// not safe for concurrent use.
type Decision struct {
	// Matches lists the limits the request touches, enforced ones first,
	// then shadow ones; nil when nothing matched.
	Matches []Match
	// Allowed is the answer to give: the enforced limits all admitted (or a
	// fallback admitted), or no limit matched.
	Allowed bool
	// Result combines the enforced limits' results (gcra.Combine); the zero
	// Result with Allowed when nothing is enforced.
	Result gcra.Result
	// Fallback is set when the store failed and the failure modes decided;
	// FallbackMode is the one that did (closed wins over error, error over
	// local, local over open) and StoreErr the store's error. With
	// FailError the request is not decided here: Allowed is false and the
	// shell answers with an error (the agent: gRPC Unavailable, HTTP 503),
	// so the caller's own failure policy decides (Envoy's
	// failure_mode_deny).
	Fallback     bool
	FallbackMode FailureMode
	StoreErr     error
	// ShadowDenied is set when a shadow-mode limit would have denied.
	ShadowDenied bool

	enforced int            // Matches[:enforced] are enforced, the rest shadow
	binds    []gcra.Binding // a prepared request's bound keys, per match (nil: none)
	buf      []byte
	checks   []gcra.Check
	results  []gcra.Result
	states   []gcra.State
	next     []gcra.State
}

// Reset clears d for reuse, keeping its buffers.
func (d *Decision) Reset() {
	clear(d.Matches)
	d.Matches = d.Matches[:0]
	d.Allowed, d.Result, d.Fallback, d.FallbackMode, d.StoreErr, d.ShadowDenied = false, gcra.Result{}, false, 0, nil, false
	d.enforced = 0
	d.binds = d.binds[:0]
}

// MatchOf returns the match request descriptor i formed, or nil when it
// touches no limit (no match, unlimited, or replaced).
func (d *Decision) MatchOf(i int) *Match {
	for j := range d.Matches {
		if d.Matches[j].Descriptors&(1<<uint(i)) != 0 {
			return &d.Matches[j]
		}
	}
	return nil
}

// Enforced returns the enforced matches; Shadow the shadow-mode ones.
func (d *Decision) Enforced() []Match { return d.Matches[:d.enforced] }

// Shadow returns the shadow-mode matches.
func (d *Decision) Shadow() []Match { return d.Matches[d.enforced:] }

func badRequest(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadRequest, fmt.Sprintf(format, args...))
}

// Resolve fills d with the limits req touches under the policy and table in
// force, each with its key and the schedule (regional limit now, previous
// limit, change time) the store applies. A request error (ErrBadRequest)
// consumes nothing. Unknown domains and descriptors that match no limit (or
// an unlimited one) are not errors: they touch no limit, as in Envoy's
// reference server.
func (n *Node) Resolve(req *Request, d *Decision) error {
	d.Reset()
	s := n.snap.Load()
	switch {
	case req.Domain == "":
		return badRequest("empty domain")
	case len(req.Domain) > MaxDomainLen:
		return badRequest("domain of %d bytes, above the maximum %d", len(req.Domain), MaxDomainLen)
	case len(req.Descriptors) == 0:
		return badRequest("no descriptors")
	case len(req.Descriptors) > MaxDescriptors:
		return badRequest("%d descriptors, above the maximum %d", len(req.Descriptors), MaxDescriptors)
	case req.Cost < 0 || req.Cost > MaxCost:
		return badRequest("cost %d outside [0, %d]", req.Cost, int64(MaxCost))
	}
	for i := range req.Descriptors {
		if err := checkDescriptor(i, &req.Descriptors[i]); err != nil {
			return err
		}
	}
	dom := s.policy.domains[req.Domain]
	if dom == nil {
		d.Allowed = true
		return nil
	}
	tag, tagSet := "", false
	for i := range req.Descriptors {
		desc := &req.Descriptors[i]
		rule := dom.match(desc.Entries)
		if !desc.Override.IsZero() {
			rule = n.overrideRule(dom, rule, desc.Override)
		}
		if rule == nil || rule.Unlimited {
			continue
		}
		cost := req.Cost
		if desc.HasCost {
			cost = desc.Cost
		}
		t := ""
		if dom.hashTag != "" {
			for j, e := range desc.Entries {
				if e.Key == dom.hashTag {
					t = rule.keyValue(j, e)
					break
				}
			}
			if tagSet && t != tag {
				return badRequest("descriptors[%d]: hash tag %q=%q differs from %q in an earlier descriptor: one request's limits must share a slot",
					i, dom.hashTag, t, tag)
			}
			tag, tagSet = t, true
		}
		d.buf = rule.appendKey(d.buf[:0], req.Domain, desc.Entries)
		if len(d.buf)+len(t) > gcra.MaxKeyLen {
			return badRequest("descriptors[%d]: key of %d bytes, above the maximum %d", i, len(d.buf)+len(t), gcra.MaxKeyLen)
		}
		if merged := d.merge(i, cost); merged {
			continue
		}
		if len(d.Matches) == gcra.MaxChecks {
			return badRequest("more than %d limits in one request", gcra.MaxChecks)
		}
		m := Match{Descriptor: i, Descriptors: 1 << uint(i), Rule: rule, Cost: cost}
		m.entry = n.keys.get(d.buf, t, dom.hashTag != "", rule.Scope == Global)
		if m.entry != nil {
			m.Key = m.entry.key
		} else {
			n.overflow.Add(1)
			m.Key = gcra.Key{Name: string(d.buf)}
			if dom.hashTag != "" {
				m.Key.Tag = t
			}
		}
		m.Schedule = n.schedule(s, rule, m.Key.Name)
		d.Matches = append(d.Matches, m)
	}
	d.applyReplaces()
	d.partition()
	if d.enforced == 0 {
		d.Allowed = true
	}
	if n.cfg.OneSlot {
		if err := oneSlot(d.Matches[:d.enforced], dom.hashTag); err != nil {
			return err
		}
		if err := oneSlot(d.Matches[d.enforced:], dom.hashTag); err != nil {
			return err
		}
	}
	return nil
}

// oneSlot checks that the keys of one store call share a Redis Cluster slot
// (Config.OneSlot): one key, or one non-empty tag on every key.
func oneSlot(ms []Match, hashTag string) error {
	if len(ms) < 2 {
		return nil
	}
	for i := range ms {
		if ms[i].Key.Tag != "" && ms[i].Key.Tag == ms[0].Key.Tag {
			continue
		}
		why := "the domain has no hash_tag"
		if hashTag != "" {
			why = fmt.Sprintf("a descriptor has no %q entry", hashTag)
		}
		j := 0 // another match than i
		if i == 0 {
			j = 1
		}
		return badRequest("descriptors[%d] and [%d]: keys %q and %q cannot share a Redis Cluster slot (%s), so they cannot be decided together",
			ms[j].Descriptor, ms[i].Descriptor, ms[j].Key.Name, ms[i].Key.Name, why)
	}
	return nil
}

func checkDescriptor(i int, desc *Descriptor) error {
	switch {
	case len(desc.Entries) == 0:
		return badRequest("descriptors[%d]: no entries", i)
	case len(desc.Entries) > MaxEntries:
		return badRequest("descriptors[%d]: %d entries, above the maximum %d", i, len(desc.Entries), MaxEntries)
	case desc.HasCost && (desc.Cost < 0 || desc.Cost > MaxCost):
		return badRequest("descriptors[%d]: cost %d outside [0, %d]", i, desc.Cost, int64(MaxCost))
	}
	for j, e := range desc.Entries {
		switch {
		case e.Key == "":
			return badRequest("descriptors[%d].entries[%d]: empty key", i, j)
		case len(e.Key) > MaxEntryKeyLen:
			return badRequest("descriptors[%d].entries[%d]: key of %d bytes, above the maximum %d", i, j, len(e.Key), MaxEntryKeyLen)
		case len(e.Value) > MaxValueLen:
			return badRequest("descriptors[%d].entries[%d]: value of %d bytes, above the maximum %d", i, j, len(e.Value), MaxValueLen)
		}
	}
	return nil
}

// merge adds cost to an earlier match of the same key (d.buf), reporting
// whether there was one.
func (d *Decision) merge(desc int, cost int64) bool {
	for j := range d.Matches {
		if d.Matches[j].Key.Name == string(d.buf) {
			d.Matches[j].Cost = min(d.Matches[j].Cost+cost, MaxCost+MaxCost)
			d.Matches[j].Descriptors |= 1 << uint(desc)
			return true
		}
	}
	return false
}

// applyReplaces drops every match whose rule another match replaces
// (rate_limit.replaces, as in envoyproxy/ratelimit).
func (d *Decision) applyReplaces() {
	some := false
	for i := range d.Matches {
		if len(d.Matches[i].Rule.Replaces) > 0 {
			some = true
			break
		}
	}
	if !some {
		return
	}
	keep := d.Matches[:0]
	for i := range d.Matches {
		if !d.replaced(d.Matches[i].Rule) {
			keep = append(keep, d.Matches[i])
		}
	}
	clear(d.Matches[len(keep):])
	d.Matches = keep
}

func (d *Decision) replaced(r *Rule) bool {
	if r.Name == "" {
		return false
	}
	for i := range d.Matches {
		for _, name := range d.Matches[i].Rule.Replaces {
			if name == r.Name && d.Matches[i].Rule != r {
				return true
			}
		}
	}
	return false
}

// partition moves shadow matches behind enforced ones, keeping order.
func (d *Decision) partition() {
	ms := d.Matches
	e := 0
	for i := range ms {
		if !ms[i].Rule.Shadow {
			m := ms[i]
			copy(ms[e+1:i+1], ms[e:i])
			ms[e] = m
			e++
		}
	}
	d.enforced = e
}

// schedule is the schedule a key runs on under snapshot s.
func (n *Node) schedule(s *snapshot, rule *Rule, name string) gcra.Schedule {
	if rule.Scope == Regional {
		return gcra.Steady(rule.Limit)
	}
	r := s.rows.get(name)
	return n.withFence(s, rule, r, n.scheduleRow(rule, r))
}

// withFence is sch, a schedule of row r under snapshot s, carrying s's
// table as the region fence (Config.Fence) — also when the row runs
// reduced (a lapse, a table that does not name this agent, a budget being
// rolled out): min(last share, safe share) is more than the idle floor a
// sibling's newer table may have lowered the region to (rebalance's idle
// floors), so once the store holds a newer fence this agent decides at
// the idle floor (unfenced). A region cut off whole raises no newer fence
// and keeps its safe shares. (Explorer schedule 1474 of seed 53: us-2,
// cut off from NATS, lapsed to its safe share of a key, unfenced, while
// us-1 ran term 3's idle floor of it and the rest was given away — Σ in
// force 1,029,949 ppm.)
func (n *Node) withFence(s *snapshot, rule *Rule, r *row, sch gcra.Schedule) gcra.Schedule {
	if n.cfg.Fence && r != nil && s.hasTable {
		sch.Fence = gcra.Fence{Term: s.term, Epoch: s.epoch}
	}
	return sch
}

// unfenced is what a fenced schedule the store refused runs at instead
// (Config.Fence): min(the limit in force at now, the idle floor's limit, a
// pending change's), in the reduced epoch slot of its version, in force at
// every instant of the store's clock — the table's share never runs again
// under it, whatever the store's clock says. The idle floor, not the safe
// share: a sibling agent of the region applied a newer table, which may
// have lowered the region's floor of the key (rebalance's idle floors), and
// the coordinator counts this agent's decrease in force once the fence
// says so.
func (n *Node) unfenced(rule *Rule, sch *gcra.Schedule, now int64) gcra.Schedule {
	lim := minLimit(inForceAt(sch, now).Limit, SafeLimit(rule.Limit, n.idle, len(n.cfg.Regions)))
	if sch.Current.Effective > now {
		lim = minLimit(lim, sch.Current.Limit)
	}
	return gcra.Schedule{Current: gcra.Version{Limit: lim, Epoch: sch.Current.Epoch | 1}}
}

// Unfenced is what a decision at now (µs on the node's clock) under sch —
// a schedule this node gave rule (ScheduleAt) — runs at when the region's
// store refuses sch's fence (Config.Fence): min(share in force, idle
// floor), unfenced. For checkers that compare what each agent enforces with the
// store's fence; safe for many goroutines.
func (n *Node) Unfenced(rule *Rule, sch gcra.Schedule, now int64) gcra.Schedule {
	if sch.Fence.IsZero() {
		return sch
	}
	return n.unfenced(rule, &sch, now)
}

// refence rewrites ms's fenced schedules unfenced after the store refused
// them (gcra.ErrFenced), and reports whether it did.
func (n *Node) refence(ms []Match, now int64, err error) bool {
	if !errors.Is(err, gcra.ErrFenced) {
		return false
	}
	n.fenced.Add(1)
	for i := range ms {
		if !ms[i].Schedule.Fence.IsZero() {
			ms[i].Schedule = n.unfenced(ms[i].Rule, &ms[i].Schedule, now)
		}
	}
	return true
}

// scheduleRow is the schedule of a global key whose table row is r (nil:
// the table does not name it), capped at the safe share after a store
// state loss (StateLost).
func (n *Node) scheduleRow(rule *Rule, r *row) gcra.Schedule {
	return n.capLost(rule, n.rowSchedule(rule, r))
}

// rowSchedule is scheduleRow before the state-loss cap.
func (n *Node) rowSchedule(rule *Rule, r *row) gcra.Schedule {
	if r == nil {
		return gcra.Schedule{Current: gcra.Version{Limit: SafeLimit(rule.Limit, n.idle, len(n.cfg.Regions)), Epoch: coldEpoch}}
	}
	if r.budget != rule.Limit {
		// The table was computed for another limit (a policy rollout in
		// progress): run at the safe share until they agree.
		n.reduced.Add(1)
		sch := shrunkSchedule(n.reduce(r, r.sched.Current.Effective).sched, r.budget, rule.Limit)
		sch.Current.Limit = minLimit(sch.Current.Limit, SafeLimit(rule.Limit, n.safe, len(n.cfg.Regions)))
		return sch
	}
	return r.sched
}

// Decide resolves req, decides it in the store (enforced limits as one
// all-or-nothing check, then shadow-mode limits), applies the failure modes
// if the store fails, and records the outcome. now (µs on the node's
// clock, in [0, 2^52)) lapses a table whose lease has passed (see Tick)
// and times the local failure mode. The error is
// a request error (nothing consumed); store failures are decided by the
// limits' failure modes and reported in d.
func (n *Node) Decide(ctx context.Context, now int64, req *Request, d *Decision) error {
	n.lapseIfDue(now)
	if err := n.Resolve(req, d); err != nil {
		return err
	}
	n.Execute(ctx, now, d)
	n.Record(d)
	return nil
}

// Execute decides a resolved request in the store; see Decide.
func (n *Node) Execute(ctx context.Context, now int64, d *Decision) {
	n.decisions.Add(1)
	if ms := d.Enforced(); len(ms) > 0 {
		if n.denyCached(now, d, ms) {
			n.denyHits.Add(1)
		} else if len(ms) == 1 && n.leased(ctx, now, d, &ms[0]) {
			// served from a lease, or a lease taken with it
		} else if r, err := n.run(ctx, now, d, ms, 0); err != nil {
			n.storeErrors.Add(1)
			n.fallback(now, d, err)
		} else {
			d.Result, d.Allowed = r, r.Allowed
			n.noteDenials(now, r.Allowed, ms)
		}
	}
	if ms := d.Shadow(); len(ms) > 0 {
		r, err := n.run(ctx, now, d, ms, d.enforced)
		if err != nil {
			n.storeErrors.Add(1) // shadow limits are not decided then
		} else if !r.Allowed {
			d.ShadowDenied = true
			n.shadowDenied.Add(1)
		}
	}
}

// run decides ms (d.Matches[off:off+len(ms)]) all or nothing in the store,
// filling each match's Result.
func (n *Node) run(ctx context.Context, now int64, d *Decision, ms []Match, off int) (gcra.Result, error) {
	r, err := n.run1(ctx, d, ms, off)
	if err != nil && n.refence(ms, now, err) {
		r, err = n.run1(ctx, d, ms, off)
	}
	return r, err
}

// run1 is one store call of run.
func (n *Node) run1(ctx context.Context, d *Decision, ms []Match, off int) (gcra.Result, error) {
	if len(ms) == 1 && off < len(d.binds) && d.binds[off] != nil {
		// One bound key (a prepared request): no lookup in the store.
		if ms[0].Cost == 0 {
			n.peeks.Add(1)
		}
		r, err := d.binds[off].Decide(ctx, &ms[0].Schedule, ms[0].Cost)
		if err != nil {
			return r, err
		}
		ms[0].Result, ms[0].decided = r, true
		return r, nil
	}
	d.checks = d.checks[:0]
	peek := true
	for i := range ms {
		d.checks = append(d.checks, gcra.Check{Key: ms[i].Key, Schedule: ms[i].Schedule, Cost: ms[i].Cost})
		peek = peek && ms[i].Cost == 0
	}
	if peek {
		n.peeks.Add(1)
	}
	d.results = grow(d.results, len(ms))
	r, err := n.store.DecideAll(ctx, d.checks, d.results)
	if err != nil {
		return r, err
	}
	for i := range ms {
		ms[i].Result, ms[i].decided = d.results[i], true
	}
	return r, nil
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// fallback decides the enforced matches by their failure modes after the
// store error err: any closed limit denies the request; otherwise any
// error limit leaves it undecided (FailError: the shell answers with an
// error); otherwise the local limits decide together (all or nothing) in
// memory at the region's limit divided by max(configured, live) agents,
// and open limits admit.
//
// The order is by what each mode promises. closed is the only one that
// promises a denial, and an error could let the caller admit (Envoy's
// failure_mode_deny is false by default), so closed wins. error comes
// next: its operator asked for the caller's own policy to decide, and an
// answer from here (a local or open admission) would take that choice
// away. local over open, as before: an admission local does not grant
// is one a limit asked to bound.
func (n *Node) fallback(now int64, d *Decision, err error) {
	ms := d.Enforced()
	d.Fallback, d.StoreErr = true, err
	mode := FailOpen
	for i := range ms {
		if rank(ms[i].Rule.FailureMode) > rank(mode) {
			mode = ms[i].Rule.FailureMode
		}
	}
	d.FallbackMode = mode
	switch mode {
	case FailError:
		n.fbError.Add(1)
		d.Allowed = false
		d.Result = gcra.Result{}
		for i := range ms {
			ms[i].Result = gcra.Result{Limit: ms[i].Schedule.Current.Limit}
		}
		return
	case FailClosed:
		n.fbClosed.Add(1)
		d.Allowed = false
		d.Result = gcra.Result{}
		for i := range ms {
			ms[i].Result = gcra.Result{Limit: ms[i].Schedule.Current.Limit}
			ms[i].closed = ms[i].Rule.FailureMode == FailClosed
		}
		return
	case FailOpen:
		n.fbOpen.Add(1)
		d.Allowed = true
		d.Result = gcra.Result{Allowed: true}
		for i := range ms {
			ms[i].Result = gcra.Result{Allowed: true, Limit: ms[i].Schedule.Current.Limit}
		}
		return
	}
	n.fbLocal.Add(1)
	agents := max(int64(n.cfg.Agents), n.live.Load())
	n.localMu.Lock()
	defer n.localMu.Unlock()
	d.checks = d.checks[:0]
	d.states = d.states[:0]
	for i := range ms {
		if ms[i].Rule.FailureMode != FailLocal {
			continue
		}
		l := localLimit(inForceAt(&ms[i].Schedule, now).Limit, agents)
		var st gcra.State
		if e := ms[i].entry; e != nil {
			if r := e.rare.Load(); r != nil {
				st = r.local
			}
		} else {
			// An untracked key (beyond MaxKeys) has no local state to keep:
			// starting full each time would admit without bound, so it is
			// denied while the store fails.
			l = gcra.Limit{}
		}
		d.checks = append(d.checks, gcra.Check{Key: ms[i].Key, Schedule: gcra.Steady(l), Cost: ms[i].Cost})
		d.states = append(d.states, st)
	}
	d.next = grow(d.next, len(d.checks))
	d.results = grow(d.results, len(d.checks))
	r, write, err := gcra.DecideAll(now, d.checks, d.states, d.next, d.results)
	if err != nil {
		// now outside the store's range: nothing sensible to do but deny.
		d.Allowed, d.Result = false, gcra.Result{}
		return
	}
	j := 0
	for i := range ms {
		if ms[i].Rule.FailureMode != FailLocal {
			ms[i].Result = gcra.Result{Allowed: r.Allowed, Limit: ms[i].Schedule.Current.Limit}
			continue
		}
		ms[i].Result = d.results[j]
		if write && ms[i].entry != nil {
			ms[i].entry.rareOf().local = d.next[j]
		}
		j++
	}
	d.Allowed, d.Result = r.Allowed, r
}

// rank orders failure modes for a composite whose store failed: the
// highest among its enforced limits decides (see fallback).
func rank(m FailureMode) int {
	switch m {
	case FailClosed:
		return 3
	case FailError:
		return 2
	case FailLocal:
		return 1
	}
	return 0
}

// localLimit is a region limit divided among agents: each agent runs
// T·agents with burst/agents (at least 1), so together they never exceed
// the region's rate.
func localLimit(l gcra.Limit, agents int64) gcra.Limit {
	if l.IsZero() || agents < 1 {
		return gcra.Limit{}
	}
	t := l.IntervalMicros() * agents
	b := max(1, l.Burst()/agents)
	if t > gcra.MaxWindowMicros || b > gcra.MaxWindowMicros/t {
		return gcra.Limit{}
	}
	return gcra.FromInterval(t, b)
}

// Record adds d's outcome to the demand counters: per key, one offered
// request of its cost, admitted or denied. Enforced keys count the
// request's answer; shadow keys what they decided. Peeks (cost 0) and
// undecided shadow keys are not demand.
func (n *Node) Record(d *Decision) {
	for i := range d.Matches {
		m := &d.Matches[i]
		if m.Cost == 0 || m.entry == nil {
			continue
		}
		admitted := d.Allowed
		if i >= d.enforced {
			if !m.decided {
				continue
			}
			admitted = m.Result.Allowed
		}
		if e := n.keys.record(m.entry, m.Cost, admitted); e != m.entry {
			if e == nil {
				n.overflow.Add(1)
			} else {
				// Evicted meanwhile: a prepared request keeps the live entry.
				m.entry = e
				m.Key = e.key
			}
		}
	}
}

// Prepared is a request resolved once and decided many times — the
// simulator decides the same keys millions of times. It is re-resolved
// when the policy or table in force changes, or the cost does; otherwise
// its keys and schedules are reused. Not safe for concurrent use.
type Prepared struct {
	req    Request
	d      Decision
	names  []string // the row set's names when resolved: same names, same row indexes
	rowIdx []int    // per match: its row's index (−1: none)
	gen    uint64   // the snapshot it was resolved under (0: none); not a pointer, so old snapshots are not kept alive
	policy *Policy
	cost   int64
}

// Prepare resolves req for repeated decisions. The request's slices are
// retained and must not change.
func (n *Node) Prepare(req *Request) (*Prepared, error) {
	p := &Prepared{req: *req, cost: req.Cost}
	if err := n.resolvePrepared(p); err != nil {
		return nil, err
	}
	return p, nil
}

func (n *Node) resolvePrepared(p *Prepared) error {
	s := n.snap.Load()
	p.gen, p.policy = s.gen, s.policy
	p.req.Cost = p.cost
	if err := n.Resolve(&p.req, &p.d); err != nil {
		p.gen = 0
		return err
	}
	p.names, p.rowIdx = s.rows.names, p.rowIdx[:0]
	for i := range p.d.Matches {
		idx, ok := s.rows.index[p.d.Matches[i].Key.Name]
		if !ok || p.d.Matches[i].Rule.Scope == Regional {
			idx = -1
		}
		p.rowIdx = append(p.rowIdx, idx)
	}
	if b, ok := n.store.(gcra.Binder); ok {
		// Bind each key once; a key the store cannot bind is decided
		// through DecideAll.
		for i := range p.d.Matches {
			bd, err := b.Bind(p.d.Matches[i].Key)
			if err != nil {
				bd = nil
			}
			p.d.binds = append(p.d.binds, bd)
		}
	}
	if n.snap.Load().gen != p.gen {
		p.gen = 0 // resolved across a swap: resolve again next time
	}
	return nil
}

// DecidePrepared decides p at cost, as Decide would decide its request at
// that cost, and returns the decision (valid until p's next use).
func (n *Node) DecidePrepared(ctx context.Context, now int64, p *Prepared, cost int64) (*Decision, error) {
	n.lapseIfDue(now)
	s := n.snap.Load()
	switch {
	case cost != p.cost || s.policy != p.policy || p.gen == 0:
		p.cost = cost
		if err := n.resolvePrepared(p); err != nil {
			return nil, err
		}
	case p.gen != s.gen:
		// Only the table changed: the same keys, new schedules — by row
		// index while the table's keys are the same.
		p.gen = s.gen
		sameRows := len(p.names) == len(s.rows.names) && (len(p.names) == 0 || &p.names[0] == &s.rows.names[0])
		for i := range p.d.Matches {
			m := &p.d.Matches[i]
			switch {
			case m.Rule.Scope == Regional:
			case sameRows && p.rowIdx[i] >= 0:
				r := s.rows.rows[p.rowIdx[i]]
				m.Schedule = n.withFence(s, m.Rule, r, n.scheduleRow(m.Rule, r))
			case sameRows:
				m.Schedule = n.scheduleRow(m.Rule, nil)
			default:
				m.Schedule = n.schedule(s, m.Rule, m.Key.Name)
			}
		}
		if !sameRows {
			p.gen = 0 // re-index at the next decision
		}
		fallthrough
	default:
		d := &p.d
		d.Allowed, d.Result, d.Fallback, d.FallbackMode, d.StoreErr, d.ShadowDenied = d.enforced == 0, gcra.Result{}, false, 0, nil, false
		for i := range d.Matches {
			d.Matches[i].Result, d.Matches[i].decided, d.Matches[i].closed = gcra.Result{}, false, false
		}
	}
	n.Execute(ctx, now, &p.d)
	n.Record(&p.d)
	return &p.d, nil
}

// Reserver is a store that books reservations (gcra/memstore and
// gcra/redisstore are): Node.Reserve needs it.
type Reserver interface {
	Reserve(ctx context.Context, k gcra.Key, s gcra.Schedule, cost int64, maxWait time.Duration) (gcra.Result, error)
}

// ErrNoReserve is returned by Reserve when the request cannot be booked as
// a reservation: its store does not book them, or it touches several
// enforced limits (stores book one key at a time; decide it instead).
var ErrNoReserve = errors.New("region: reservation not possible")

// Reserve books the next slot for req when the wait is at most maxWait
// (seed 000: the caller waits d.Result.Wait, then proceeds). maxWait is cut
// to Config.MaxReserveWait, the booking horizon, and with a table to the
// time left on its lease: a booking acts when its wait ends, and one made
// under a share the coordinator then cuts must have acted before the
// increase that share pays for takes effect, at least the coordinator's
// Fence after the decrease is in force (ARCHITECTURE.md invariant 4). A
// request touching no enforced limit is admitted at once; one touching
// several is ErrNoReserve. Shadow limits are decided as in Decide. On a
// store error the failure mode decides as in Decide, without a wait.
func (n *Node) Reserve(ctx context.Context, now int64, req *Request, maxWait time.Duration, d *Decision) error {
	if maxWait < 0 {
		return badRequest("maxWait %s is negative", maxWait)
	}
	n.lapseIfDue(now)
	if err := n.Resolve(req, d); err != nil {
		return err
	}
	ms := d.Enforced()
	rs, ok := n.store.(Reserver)
	switch {
	case len(ms) > 1:
		return fmt.Errorf("%w: %d enforced limits", ErrNoReserve, len(ms))
	case len(ms) == 1 && !ok:
		return fmt.Errorf("%w: the store does not book reservations", ErrNoReserve)
	}
	n.decisions.Add(1)
	if len(ms) == 1 {
		maxWait = min(maxWait, n.cfg.MaxReserveWait)
		if s := n.snap.Load(); s.hasTable {
			left := time.Duration(max(0, n.leaseExpiry.Load()-now)) * time.Microsecond
			maxWait = min(maxWait, left)
		}
		r, err := rs.Reserve(ctx, ms[0].Key, ms[0].Schedule, ms[0].Cost, maxWait)
		if err != nil && n.refence(ms, now, err) {
			r, err = rs.Reserve(ctx, ms[0].Key, ms[0].Schedule, ms[0].Cost, maxWait)
		}
		if err != nil {
			n.storeErrors.Add(1)
			n.fallback(now, d, err)
		} else {
			ms[0].Result, ms[0].decided = r, true
			d.Result, d.Allowed = r, r.Allowed
			if r.Allowed && ms[0].Cost > 0 {
				ms[0].entry.forget() // the booking moved the TAT on
			}
		}
	}
	if sh := d.Shadow(); len(sh) > 0 {
		if r, err := n.run(ctx, now, d, sh, d.enforced); err != nil {
			n.storeErrors.Add(1)
		} else if !r.Allowed {
			d.ShadowDenied = true
			n.shadowDenied.Add(1)
		}
	}
	n.Record(d)
	return nil
}

// denyInfo is a key's TAT as the store last reported it in a denied
// request, on the node's clock, with the limit it was decided under.
type denyInfo struct {
	tat   int64 // µs, the node's clock
	t, b  int64 // the limit's T (µs) and burst
	epoch uint64
}

// denyCache holds a key's denyInfo without allocating per denial: a
// sequence lock over atomic fields. A writer makes seq odd, stores, and
// makes it even again; a reader that sees seq odd or changed across its
// reads takes it for no entry (the store decides). Writers do not wait: one
// that finds another writing leaves the entry to it, and since every
// entry is a lower bound of the store's TAT while its limit holds
// (noteDenials), whichever lands is safe to deny by.
type denyCache struct {
	seq   atomic.Uint64
	tat   atomic.Int64
	t1, b atomic.Int64 // the limit's T plus one (0: no entry) and burst
	epoch atomic.Uint64
}

// load returns the entry, if there is one and no writer is changing it.
func (c *denyCache) load() (denyInfo, bool) {
	s := c.seq.Load()
	if s&1 == 1 {
		return denyInfo{}, false
	}
	di := denyInfo{tat: c.tat.Load(), t: c.t1.Load() - 1, b: c.b.Load(), epoch: c.epoch.Load()}
	if di.t < 0 || c.seq.Load() != s {
		return denyInfo{}, false
	}
	return di, true
}

// store replaces the entry (ok false: removes it), unless another writer
// is at it.
func (c *denyCache) store(di denyInfo, ok bool) {
	s := c.seq.Load()
	if s&1 == 1 || !c.seq.CompareAndSwap(s, s+1) {
		return
	}
	if ok {
		c.tat.Store(di.tat)
		c.t1.Store(di.t + 1)
		c.b.Store(di.b)
		c.epoch.Store(di.epoch)
	} else {
		c.t1.Store(0)
	}
	c.seq.Store(s + 2)
}

// noteDenials keeps the deny cache: after a denied request, the TAT the
// store reported for each of its limits (each limit's result carries it:
// now + ResetAfter is max(TAT, now), which decides every later instant the
// same); after an admission, nothing for the limits it charged. Only
// admissions move a TAT, this node's clear the entry and other agents' only
// move it later, so while the limit stays the same the cached TAT is a
// lower bound of the store's: a request it denies the store denies too.
func (n *Node) noteDenials(now int64, allowed bool, ms []Match) {
	if !n.cfg.DenyCache {
		return
	}
	for i := range ms {
		m := &ms[i]
		if m.entry == nil {
			continue
		}
		r := &m.Result
		if allowed {
			if m.Cost > 0 {
				m.entry.forget() // this admission moved the TAT on
			}
			continue
		}
		// Only a result the store decided under the current limit: near a
		// switch the store's clock (Redis TIME) may still be on the
		// previous one.
		if !steadyAt(&m.Schedule, now) || r.Limit != m.Schedule.Current.Limit {
			continue
		}
		l := &m.Schedule.Current.Limit
		tat := now + r.ResetAfter.Microseconds()
		di := denyInfo{tat: tat, t: l.IntervalMicros(), b: l.Burst(), epoch: m.Schedule.Current.Epoch}
		dc := &m.entry.rareOf().deny
		if old, ok := dc.load(); ok && old == di {
			continue
		}
		dc.store(di, true)
	}
}

// forget drops e's cached TAT (an admission this node made moved it).
func (e *entry) forget() {
	if e == nil {
		return
	}
	if r := e.rare.Load(); r != nil && r.deny.t1.Load() != 0 {
		r.deny.store(denyInfo{}, false)
	}
}

// steadyAt reports whether s decides under its current limit at now with
// no change pending (a cached TAT is only valid under one limit).
func steadyAt(s *gcra.Schedule, now int64) bool {
	return !s.Current.Limit.IsZero() && (!s.HasPrevious || now >= s.Current.Effective)
}

// denyCached answers the enforced matches from the deny cache when the
// cached TATs deny the request, without a store call, reporting what the
// store would: each limit's own result from its TAT at now — a limit that
// denies its retry-after, reset and remaining (TooLarge when the cost
// exceeds its burst), and the others of a composite their untouched state
// — combined as the store combines them. It needs a cached TAT for every
// enforced limit, so it answers a composite only once the store has denied
// one touching the same limits. With one agent per store the answer is the
// store's exactly; with several, other agents' admissions since may have
// moved a TAT further than this node knows, so a retry-after or reset may
// be shorter and a remaining larger than the store's (never a denial the
// store would not make) — the client learns the rest on its next try.
func (n *Node) denyCached(now int64, d *Decision, ms []Match) bool {
	if !n.cfg.DenyCache {
		return false
	}
	d.results = grow(d.results, len(ms))
	denied, peek := false, true
	for i := range ms {
		m := &ms[i]
		di, ok := m.entry.denyOf(&m.Schedule, now)
		if !ok {
			return false // a limit whose state this node does not know
		}
		l := m.Schedule.Current.Limit
		_, r, err := gcra.Allow(l, di.tat, now, m.Cost)
		if err != nil {
			return false
		}
		if r.Allowed {
			// It would admit: if the request is denied nothing is
			// consumed, and the store reports its untouched state.
			_, r, _ = gcra.Allow(l, di.tat, now, 0)
			r.Allowed = false
		} else {
			denied = true
		}
		d.results[i] = r
		peek = peek && m.Cost == 0
	}
	if !denied || peek {
		return false // the store may admit; a peek is the store's to count
	}
	for i := range ms {
		ms[i].Result, ms[i].decided = d.results[i], true
	}
	d.Result, d.Allowed = gcra.Combine(d.results[:len(ms)]), false
	return true
}

// denyOf is e's cached denial when it holds for schedule s at now.
func (e *entry) denyOf(s *gcra.Schedule, now int64) (denyInfo, bool) {
	if e == nil {
		return denyInfo{}, false
	}
	r := e.rare.Load()
	if r == nil {
		return denyInfo{}, false
	}
	di, ok := r.deny.load()
	l := &s.Current.Limit
	if !ok || di.t != l.IntervalMicros() || di.b != l.Burst() || di.epoch != s.Current.Epoch || !steadyAt(s, now) {
		return denyInfo{}, false
	}
	return di, true
}

// leaseState is a key's local lease (Rule.LeaseUnits): units taken from the
// store and not served yet, valid until expires under one limit.
type leaseState struct {
	mu      sync.Mutex
	units   int64
	expires int64 // µs, the node's clock
	t, b    int64
	epoch   uint64
}

// leased serves a single-limit request from the key's lease, or takes a
// new lease with it (cost + LeaseUnits in one store call). It reports
// whether it decided the request (false: decide it normally). Leasing is
// skipped for low limits — a regional burst under four leases — and while
// a limit change is pending. Units not served before the lease expires (or
// its limit changes) are counted as stranded.
func (n *Node) leased(ctx context.Context, now int64, d *Decision, m *Match) bool {
	units := m.Rule.LeaseUnits
	l := m.Schedule.Current.Limit
	if units == 0 || m.entry == nil || m.Cost == 0 || !steadyAt(&m.Schedule, now) || l.Burst() < 4*units {
		return false
	}
	ls := &m.entry.rareOf().lease
	ls.mu.Lock()
	valid := now < ls.expires && ls.t == l.IntervalMicros() && ls.b == l.Burst() && ls.epoch == m.Schedule.Current.Epoch
	if valid && ls.units >= m.Cost {
		ls.units -= m.Cost
		left := ls.units
		ls.mu.Unlock()
		n.leaseHits.Add(1)
		m.Result, m.decided = gcra.Result{Limit: l, Allowed: true, Remaining: left}, true
		d.Result, d.Allowed = m.Result, true
		return true
	}
	if ls.units > 0 {
		n.leaseStranded.Add(ls.units)
		ls.units = 0
	}
	ls.mu.Unlock()
	cost := m.Cost
	m.Cost = cost + units
	fenced := !m.Schedule.Fence.IsZero()
	r, err := n.run(ctx, now, d, d.Matches[:1], 0)
	m.Cost = cost
	if err != nil {
		n.storeErrors.Add(1)
		n.fallback(now, d, err)
		return true
	}
	if !r.Allowed {
		return false // decide the request alone
	}
	if fenced && m.Schedule.Fence.IsZero() {
		// The region fence refused the table this lease was for: the
		// take ran reduced, and no lease is kept under it.
		n.leaseStranded.Add(units)
		m.entry.forget()
		d.Result, d.Allowed = r, true
		return true
	}
	n.leaseTakes.Add(1)
	m.entry.forget() // the take moved the TAT on
	ls.mu.Lock()
	if ls.units > 0 { // another request took one meanwhile
		n.leaseStranded.Add(ls.units)
	}
	ls.units, ls.expires = units, now+m.Rule.LeaseTTL.Microseconds()
	ls.t, ls.b, ls.epoch = l.IntervalMicros(), l.Burst(), m.Schedule.Current.Epoch
	ls.mu.Unlock()
	d.Result, d.Allowed = r, true
	return true
}

type overrideKey struct {
	base  *Rule
	limit gcra.Limit
	dom   *domain
}

// maxOverrideRules bounds the override rules kept for reuse; beyond it
// each request makes its own (they are equal, only slower).
const maxOverrideRules = 1024

// overrideRule is the rule a descriptor's limit override makes: the limit
// given, otherwise the matched rule's settings (or the defaults when none
// matched). Its keys are not in any table, so they run at the safe share.
func (n *Node) overrideRule(dom *domain, base *Rule, l gcra.Limit) *Rule {
	k := overrideKey{base: base, limit: l, dom: dom}
	if r, ok := n.overrides.Load(k); ok {
		return r.(*Rule)
	}
	r := &Rule{Path: "override", Domain: dom.name, Limit: l, FailureMode: FailLocal}
	if base != nil {
		cp := *base
		cp.Limit, cp.Unlimited, cp.Path, cp.LeaseUnits = l, false, base.Path+"#override", 0
		r = &cp
	}
	if n.nOverride.Load() < maxOverrideRules {
		if actual, loaded := n.overrides.LoadOrStore(k, r); loaded {
			return actual.(*Rule)
		}
		n.nOverride.Add(1)
	}
	return r
}
