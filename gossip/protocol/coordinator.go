package protocol

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/rebalance"
	"github.com/meridian-quota/meridian/region"
)

// CoordinatorConfig configures the coordinator's terms. Its fields mirror
// gossip.LoopConfig's, which documents their defaults.
type CoordinatorConfig struct {
	// Coordinator configures the rebalance core each term runs.
	Coordinator rebalance.Config
	// MaxKeys bounds the keys a term keeps (budgeted or not); a reported
	// key beyond it is not budgeted — it runs at its safe share — and is
	// counted (EventOverflow).
	MaxKeys int
	// KeyIdle: a key that no report named, and for which no agent still
	// reporting had demand held by the core, for longer than this leaves
	// the budgets. (A steady key is named only by its agents' full and
	// refresh reports: delta reports list what moves, and the core keeps
	// the rest.)
	KeyIdle time.Duration
	// Queue bounds the reports waiting for the next Tick at Queue × the
	// number of regions; Report refuses any beyond it.
	Queue int
}

// The term defaults, which gossip.DefaultLoopConfig and the simulator
// both use, so production and the simulator cannot drift apart.
const (
	DefaultMaxKeys = 1_000_000   // the wire format's bound; memory is per key
	DefaultKeyIdle = time.Minute // twelve 5 s intervals: a paused tenant keeps its shares a while
	DefaultQueue   = 64          // a few intervals of reports; older ones are stale anyway
)

// Validate reports every problem with c.
func (c *CoordinatorConfig) Validate() error {
	var errs []error
	if err := c.Coordinator.Validate(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.TermProblems("protocol")...)
	return errors.Join(errs...)
}

// TermProblems lists what is wrong with the term's own fields (MaxKeys,
// KeyIdle against Coordinator.Interval, Queue), each prefixed with pkg:
// Validate's checks without the rebalance core's, for a caller that
// validates the core itself (gossip.LoopConfig).
func (c *CoordinatorConfig) TermProblems(pkg string) []error {
	var errs []error
	if c.MaxKeys < 1 {
		errs = append(errs, fmt.Errorf("%s: max keys %d: want at least 1", pkg, c.MaxKeys))
	}
	if c.KeyIdle < c.Coordinator.Interval {
		errs = append(errs, fmt.Errorf("%s: key idle %v: want at least one interval (%v)", pkg, c.KeyIdle, c.Coordinator.Interval))
	}
	if c.Queue < 1 {
		errs = append(errs, fmt.Errorf("%s: queue %d: want at least 1", pkg, c.Queue))
	}
	return errs
}

// ErrDeposed ends a term: the stored table's term is not below it
// (NewTerm), or the store fenced one of its writes (Stored) — another
// coordinator has written. The shell resigns and campaigns again.
var ErrDeposed = errors.New("gossip: deposed: the table head moved under this coordinator")

// EventKind says what an Event reports.
type EventKind int

// The events a Term reports for the shell to log or count; the input that
// caused each is ignored (or, for EventOverflow, its keys not budgeted).
const (
	// EventMembers: the core refused the live members (an unknown region,
	// an unnamed agent) and keeps the previous ones.
	EventMembers EventKind = iota + 1
	// EventPolicyBudgets: the core refused the budgets a reloaded policy
	// gives; it keeps the previous ones until the key set next changes.
	EventPolicyBudgets
	// EventBudgets: the core refused the budgets after keys entered or
	// left; it keeps the previous ones.
	EventBudgets
	// EventReportRefused: the core refused a report for a reason other
	// than rebalance.ErrBadReport (an unknown region): a message no agent
	// of this cluster should send. Reports refused with ErrBadReport (a
	// repeated interval, keys not budgeted) are routine and not reported.
	EventReportRefused
	// EventOverflow: N reported keys found no room under MaxKeys in one
	// Tick (a key counts once per report naming it).
	EventOverflow
)

var eventNames = [...]string{"", "members", "policy-budgets", "budgets", "report-refused", "overflow"}

func (k EventKind) String() string {
	if k > 0 && int(k) < len(eventNames) {
		return eventNames[k]
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Event is something a Term refused or counted. Err is set for the
// refusals, N for EventOverflow.
type Event struct {
	Kind EventKind
	Err  error
	N    int
}

// Arrival is what Report made of one report.
type Arrival struct {
	// Queued is false when the queue was full: the report is dropped
	// (the shell counts it).
	Queued bool
	// Skew (µs) is the sender's store clock minus the coordinator's
	// clock when the report arrived — transit included, so an upper bound
	// on how far behind that store is. SkewKnown is false when the report
	// carried no send time.
	Skew      int64
	SkewKnown bool
}

// TermStats is a Term's size and counters, for the shell's metrics.
type TermStats struct {
	Term     uint64
	Keys     int    // keys heard of, budgeted or not (≤ MaxKeys, plus the stored table's)
	Budgeted int    // keys with a budget in the core
	Pending  int    // reports waiting for the next Tick
	Overflow uint64 // reported keys refused for want of room, this term
	Dropped  uint64 // reports Report refused (queue full), this term
	Learning bool   // the core still republishes the stored table
	Unstored bool   // a table waits to be stored
	// Overwritten counts the heads found in the store that no coordinator
	// wrote (Fenced), this term: forgeries and replays.
	Overwritten uint64
}

// Term is one term of the coordinator: which keys are budgeted and under
// which rule, the order of membership and the term's start, the reports
// waiting for a tick, and which table the store must take next. It wraps
// a rebalance.Coordinator, which does the share math, and reads no clock
// and does no I/O: every instant (µs, the coordinator's clock) is an
// argument, and the shell — gossip.Loop over NATS and the KV bucket, the
// simulator over gossip/memnet — encodes, signs, stores and logs.
//
// The shell's loop: NewTerm with the stored head; store Unstored; then, as
// inputs arrive, Report and Ack; every tick Policy (the policy in force),
// Members (the live agents), Tick, store what Tick returns, report the
// outcome with Stored (when it says the head moved, read the head and ask
// Fenced), and drain Events. A term is over once NewTerm or Fenced returns
// ErrDeposed.
//
// A Term is not safe for concurrent use: one goroutine owns it.
type Term struct {
	cfg    CoordinatorConfig
	term   uint64
	c      *rebalance.Coordinator
	policy *region.Policy

	keys     map[string]*keyState
	heldScan int64 // when learnKeys last marked the keys the core holds demand for
	// idleScan is when learnKeys last looked for idle keys, and idleDue
	// the instant after which the first of them may be idle: the least
	// lastSeen then plus KeyIdle, lowered by keys that came since.
	idleScan, idleDue int64
	budgeted          int // keys with has set

	members []rebalance.Member
	synced  bool // members were given to the core

	pending     []*rebalance.Report
	unstored    *rebalance.Table
	deposed     bool
	outranked   error  // why a report or ack deposed the term (Deposed)
	overwritten uint64 // heads no coordinator wrote (Fenced)

	overflow, dropped uint64
	events            []Event

	// features: each agent's Features, from its latest report observed
	// this term (Reads); pruned to the agents a table names.
	features map[rebalance.Member]uint32
}

// keyState is one key the coordinator has heard of.
type keyState struct {
	budget   rebalance.Budget
	has      bool // budgeted: its rule shares a budget, or the stored table gave it one
	lastSeen int64
}

// setRule budgets the key by its rule in policy (none: not budgeted).
func (t *Term) setRule(ks *keyState, key string) {
	r, _ := t.policy.RuleForKey(key)
	had := ks.has
	ks.budget, ks.has = r.Budget(key)
	t.count(had, ks.has)
}

// count keeps budgeted in step with one key's has going from had to has.
func (t *Term) count(had, has bool) {
	switch {
	case has && !had:
		t.budgeted++
	case had && !has:
		t.budgeted--
	}
}

// NewTerm starts term at now (µs) from the stored table (nil: none was
// stored, or its head could not be verified — the term starts from the
// floors), with the live members (nil: no membership; the core learns
// agents from their reports) and the policy in force.
//
// The stored table's keys are the term's first keys, each budgeted by its
// rule in policy; a key the stored table budgets but policy has no rule
// for keeps the stored budget (another agent's policy may be ahead of this
// one's). Membership reaches the core before the term starts, so that its
// first table names the live agents as well as the stored table's, and the
// first decrease waits for them. That first table is Unstored.
//
// A stored table whose term is not below term means another coordinator
// has written under this term or a later one: the error wraps ErrDeposed.
func NewTerm(cfg CoordinatorConfig, term uint64, stored *rebalance.Table, members []rebalance.Member, policy *region.Policy, now int64) (*Term, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if policy == nil {
		return nil, errors.New("protocol: NewTerm needs a policy")
	}
	if stored != nil && stored.Term >= term {
		return nil, fmt.Errorf("%w: stored table has term %d, this term is %d", ErrDeposed, stored.Term, term)
	}
	t := &Term{cfg: cfg, term: term, policy: policy, keys: map[string]*keyState{}}
	if stored != nil {
		for i := range stored.Keys {
			row := &stored.Keys[i]
			if old, ok := t.keys[row.Key]; ok {
				t.count(old.has, false) // a row listed twice: the last one counts
			}
			ks := &keyState{lastSeen: now}
			t.setRule(ks, row.Key)
			if !ks.has && !row.Budget.IsZero() {
				// No rule here for a key the stored table budgets: another
				// agent's policy may be ahead of this one's; keep its budget.
				ks.budget, ks.has = rebalance.Budget{Key: row.Key, Limit: row.Budget}, true
				t.count(false, true)
			}
			t.keys[row.Key] = ks
		}
	}
	c, err := rebalance.NewCoordinator(cfg.Coordinator, t.budgets())
	if err != nil {
		return nil, err
	}
	t.c = c
	c.SetPolicyVersion(policy.Version())
	if members != nil {
		t.Members(members)
	}
	if err := c.StartTerm(term, stored, now); err != nil {
		return nil, err
	}
	t.collect()
	return t, nil
}

// Replayed reports whether stored, the verified head a new term would
// start from, is older by (term, epoch) than the table the candidate's own
// agent last had delivered: a genuine old table written again as the head
// (no coordinator writes an older one). The shell then starts the term
// from no table — NewTerm(…, nil, …), which waits a lease before it
// rebalances — and counts the head as replayed, rather than take its
// shares for those in force (explorer schedule 4738 of seed 7: Σ shares
// in force 1,163,858 ppm).
func Replayed(stored *rebalance.Table, lastTerm, lastEpoch uint64) bool {
	return stored != nil && (lastTerm > stored.Term || (lastTerm == stored.Term && lastEpoch > stored.Epoch))
}

// Report queues a complete report for the next Tick, which observes it. sent
// is when the agent sent it (µs on its region's store clock; 0: unknown),
// now when it arrived (µs, the coordinator's clock); they give the skew
// estimate only — the report is observed at the Tick's instant.
func (t *Term) Report(rep *rebalance.Report, sent, now int64) Arrival {
	var a Arrival
	if sent != 0 {
		a.Skew, a.SkewKnown = sent-now, true
	}
	if len(t.pending) < t.cfg.Queue*len(t.cfg.Coordinator.Regions) {
		t.pending = append(t.pending, rep)
		a.Queued = true
	} else {
		t.dropped++
	}
	return a
}

// Ack records that region/agent has table (term, epoch) in force. An error
// means the ack was ignored (an unknown region, no agent name).
func (t *Term) Ack(region, agent string, term, epoch uint64) error {
	return t.c.Ack(region, agent, term, epoch)
}

// AckFenced is Ack carrying the region fence the agent's store held and the
// store's identity (rebalance.Coordinator.AckFenced).
func (t *Term) AckFenced(region, agent string, term, epoch uint64, fence gcra.Fence, store uint64) error {
	return t.c.AckFenced(region, agent, term, epoch, fence, store)
}

// Members tells the core the live agents (sorted, as Membership.Live lists
// them) when they differ from the last ones given. A list the core refuses
// is reported (EventMembers) and not offered again until it changes.
func (t *Term) Members(live []rebalance.Member) {
	if t.synced && slices.Equal(live, t.members) {
		return
	}
	t.members, t.synced = slices.Clone(live), true
	if err := t.c.MemberChange(live); err != nil {
		t.event(Event{Kind: EventMembers, Err: err})
	}
}

// Policy makes p the policy in force. A policy other than the current one
// (by identity: the shell hands over the node's snapshot) re-rules every
// key, stamps later tables with its version and gives the core the new
// budgets; the same policy again does nothing.
func (t *Term) Policy(p *region.Policy) {
	if p == nil || p == t.policy {
		return
	}
	t.policy = p
	for k, ks := range t.keys {
		t.setRule(ks, k)
	}
	t.c.SetPolicyVersion(p.Version())
	if err := t.c.SetBudgets(t.budgets()); err != nil {
		t.event(Event{Kind: EventPolicyBudgets, Err: err})
	}
}

// Tick advances the term to now (µs): the keys the queued reports name
// enter (within MaxKeys), keys idle for longer than KeyIdle leave, the
// reports are observed, and the core ticks. It returns the table to store
// now: the newest table the core produced, or — while the store has not
// taken it (Stored) — the last one again; nil when there is none, or once
// the term is over.
func (t *Term) Tick(now int64) *rebalance.Table {
	if t.deposed {
		return nil
	}
	if add, remove := t.learnKeys(now); len(add) > 0 || len(remove) > 0 {
		// Only the keys that came and went: the core rekeys in place.
		if err := t.c.UpdateKeys(add, remove); err != nil {
			t.event(Event{Kind: EventBudgets, Err: err})
		}
	}
	for _, rep := range t.pending {
		err := t.c.Observe(rep, now)
		if err != nil && !errors.Is(err, rebalance.ErrBadReport) {
			t.event(Event{Kind: EventReportRefused, Err: err})
		}
		if err == nil {
			if t.features == nil {
				t.features = map[rebalance.Member]uint32{}
			}
			t.features[rebalance.Member{Region: rep.Region, Agent: rep.Agent}] = rep.Features
		}
	}
	clear(t.pending)
	t.pending = t.pending[:0]
	if term, epoch := t.c.Outranked(); term != 0 {
		// An agent runs a table above everything this term made: it
		// refuses this term's tables, so the term is over (Deposed).
		t.deposed = true
		t.outranked = fmt.Errorf("%w: an agent runs table %d/%d, above this term's (term %d, newest epoch %d)", ErrDeposed, term, epoch, t.term, t.c.Latest().Epoch)
		return nil
	}
	t.c.Tick(now)
	t.collect()
	return t.unstored
}

// Reads reports whether every agent tb names has reported, in its latest
// report this term, every feature bit of f (false for a table that names
// no agent): the agents tb goes to can read it however f lets the
// coordinator encode it. An agent tb does not name yet reads tables it
// may not understand until its report is in; a table it cannot read
// leaves it on the floors, never on wrong shares. The agents tb does not
// name are forgotten.
func (t *Term) Reads(tb *rebalance.Table, f uint32) bool {
	common, named := t.readBy(tb)
	return named > 0 && common&f == f
}

// ReadBy returns the feature bits every agent tb names has reported in its
// latest report this term (0 for a table that names no agent): what
// TableEncoder.Encode may use for tb. The agents tb does not name are
// forgotten.
func (t *Term) ReadBy(tb *rebalance.Table) uint32 {
	common, named := t.readBy(tb)
	if named == 0 {
		return 0
	}
	return common
}

// readBy returns the features common to the agents tb names, and how
// many it names, forgetting the agents it does not name.
func (t *Term) readBy(tb *rebalance.Table) (common uint32, named int) {
	if tb == nil {
		return 0, 0
	}
	common = ^uint32(0)
	for ri, agents := range tb.Agents {
		for _, a := range agents {
			named++
			common &= t.features[rebalance.Member{Region: tb.Regions[ri], Agent: a}]
		}
	}
	if len(t.features) > named {
		for m := range t.features {
			ri := slices.Index(tb.Regions, m.Region)
			if ri < 0 || ri >= len(tb.Agents) || !slices.Contains(tb.Agents[ri], m.Agent) {
				delete(t.features, m)
			}
		}
	}
	return common, named
}

// Deposed returns the error (wrapping ErrDeposed) that ended the term
// because an agent's report or acknowledgement named a table above any
// this term made, and nil otherwise; Outranked is that table's term. The
// shell ends the term as after a fenced write, and stands again with the
// term floor at least Outranked, so that its next term is above the
// table the agents run.
func (t *Term) Deposed() error { return t.outranked }

// Outranked returns the term of the newest table an agent named above this
// term's own (0: none).
func (t *Term) Outranked() uint64 {
	term, _ := t.c.Outranked()
	return term
}

// Unstored returns the table the store has not taken yet (nil: none):
// after NewTerm, the term's first table.
func (t *Term) Unstored() *rebalance.Table { return t.unstored }

// Stored reports the store's answer to writing tb. nil: tb is stored and
// no longer returned. Any error leaves tb unstored, so the next Tick
// returns it again (or a newer table). Stored returns nil, except for an
// error wrapping ErrFenced (the head moved since the revision the shell
// wrote on): it returns that error, and the shell reads the head now
// stored and asks Fenced who wrote it.
func (t *Term) Stored(tb *rebalance.Table, err error) error {
	switch {
	case err == nil:
		if tb == t.unstored {
			t.unstored = nil
		}
		return nil
	case errors.Is(err, ErrFenced):
		return err
	default:
		return nil
	}
}

// Fenced decides what a fenced write means, from the head the store now
// holds: head is its table as the shell read and verified it, nil when
// there is none or it could not be verified (forged, garbage, signed by a
// key this cluster does not trust). Only another coordinator deposes the
// term: a verified table of a later term, or of this term with an epoch it
// never made (two coordinators under one term: an election fault), and
// then Fenced returns ErrDeposed and the term is over. A verified table of
// this term is its own (a write whose answer was lost, or a replay).
// Anything else no coordinator wrote — a bucket writer's forgery or a
// replay of an older term's table — and it neither ends the term nor
// resets shares: Fenced returns nil and
// counts it (Stats.Overwritten), and the shell stores the term's table
// on the head's revision, over it (issue 17, defect 4: each forged or
// replayed head deposed the coordinator and started a term from the
// floors). Tables are ordered by (term, epoch), so an agent that saw the
// bad head refuses it, or the older table, whatever the order.
func (t *Term) Fenced(head *rebalance.Table) error {
	made := uint64(0)
	if l := t.c.Latest(); l != nil {
		made = l.Epoch
	}
	if head != nil && (head.Term > t.term || (head.Term == t.term && head.Epoch > made)) {
		t.deposed = true
		return fmt.Errorf("%w: the head holds table %d/%d (this term is %d, its newest epoch %d)", ErrDeposed, head.Term, head.Epoch, t.term, made)
	}
	t.overwritten++
	return nil
}

// Events returns what the term refused or counted since the last call,
// oldest first.
func (t *Term) Events() []Event {
	ev := t.events
	t.events = nil
	return ev
}

// Budget returns the budget the term gives key (false: not budgeted).
func (t *Term) Budget(key string) (rebalance.Budget, bool) {
	if ks, ok := t.keys[key]; ok && ks.has {
		return ks.budget, true
	}
	return rebalance.Budget{}, false
}

// Stats returns the term's size and counters.
func (t *Term) Stats() TermStats {
	return TermStats{
		Term: t.term, Keys: len(t.keys), Budgeted: t.budgeted, Pending: len(t.pending),
		Overflow: t.overflow, Dropped: t.dropped, Learning: t.c.Learning(), Unstored: t.unstored != nil,
		Overwritten: t.overwritten,
	}
}

// collect takes the core's ready tables: the newest replaces any table not
// stored yet (it supersedes it).
func (t *Term) collect() {
	for _, tb := range t.c.Ready() {
		t.unstored = tb
	}
	t.c.Advance()
}

func (t *Term) event(e Event) { t.events = append(t.events, e) }

// learnKeys adds the keys the pending reports name that the term does not
// know yet and drops those idle for longer than KeyIdle; it returns the
// budgets that entered and the budgeted keys that left.
func (t *Term) learnKeys(now int64) (add []rebalance.Budget, remove []string) {
	overflow := 0
	for _, rep := range t.pending {
		for _, kd := range rep.Keys {
			if ks, ok := t.keys[kd.Key]; ok {
				ks.lastSeen = now
				continue
			}
			if len(t.keys) >= t.cfg.MaxKeys {
				overflow++
				continue
			}
			ks := &keyState{lastSeen: now}
			t.setRule(ks, kd.Key)
			t.keys[kd.Key] = ks
			t.idleDue = min(t.idleDue, now+t.cfg.KeyIdle.Microseconds())
			if ks.has {
				add = append(add, ks.budget)
			}
		}
	}
	if overflow > 0 {
		t.overflow += uint64(overflow)
		t.event(Event{Kind: EventOverflow, N: overflow})
	}
	idle := t.cfg.KeyIdle.Microseconds()
	if now-t.heldScan > idle/2 {
		// Keys whose demand the core holds are in use, named or not.
		t.heldScan = now
		t.c.EachHeld(now, func(key string) {
			if ks, ok := t.keys[key]; ok {
				ks.lastSeen = now
			}
		})
	}
	// A key leaves once no report has named it for KeyIdle. lastSeen only
	// grows (while time does), so none can before the least lastSeen plus
	// KeyIdle: the keys are scanned only then, or when time went back, and
	// not at every tick — a pass over every key each tick cost the
	// simulator's many-keys run 6 % of its time, and a coordinator of a
	// million keys would pay it at every loop tick.
	if now > t.idleDue || now < t.idleScan {
		least := int64(math.MaxInt64)
		for k, ks := range t.keys {
			if now-ks.lastSeen > idle {
				delete(t.keys, k)
				t.count(ks.has, false)
				if ks.has {
					remove = append(remove, k)
				}
				continue
			}
			least = min(least, ks.lastSeen)
		}
		t.idleScan, t.idleDue = now, math.MaxInt64
		if least != math.MaxInt64 {
			t.idleDue = least + idle
		}
	}
	return add, remove
}

// budgets lists the budgets of the budgeted keys.
func (t *Term) budgets() []rebalance.Budget {
	out := make([]rebalance.Budget, 0, t.budgeted)
	for _, ks := range t.keys {
		if ks.has {
			out = append(out, ks.budget)
		}
	}
	return out
}

// MaxShareSum is the largest Σ shares (ppm) over a table's keys: never
// above 10⁶ unless the strategy overcommits (an alert watches it).
func MaxShareSum(t *rebalance.Table) uint64 {
	var most uint64
	for i := range t.Keys {
		var s uint64
		for _, v := range t.Keys[i].Shares {
			s += uint64(v)
		}
		most = max(most, s)
	}
	return most
}
