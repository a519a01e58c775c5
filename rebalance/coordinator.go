package rebalance

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/meridian-quota/meridian/gcra"
)

// Coordinator is the pure coordinator core, in the style of etcd/raft's
// RawNode: the shell feeds it reports, acknowledgements and membership,
// calls Tick with the time, takes the tables Ready returns, writes each with
// compare-and-set on the previous one, publishes it, and calls Advance. It
// reads no clock and does no I/O; the simulator drives the same code.
//
// A Coordinator is not safe for concurrent use: one goroutine owns it.
type Coordinator struct {
	cfg     Config
	regions []string
	ridx    map[string]int
	safe    []uint32
	idle    []uint32 // per region: the floor of a region with no recent demand for a key (Config.IdleSafeFraction)
	strats  map[string]Strategy
	nR      int
	dt      int64 // Δ, µs

	// keys, indexed densely; per key × region arrays are key*nR + region
	budgets []Budget
	// kidx gives each key a slot; at is each slot's index (slot: per key
	// index, its slot; freeSlots: slots to reuse). Keys coming and going
	// shift the indexes of the keys after them, and at is cheaper to
	// rewrite than the map (index). A key keeps its slot until most slots
	// are free and apply renumbers them all.
	kidx      map[string]int32
	slot      []int32
	at        []int32
	freeSlots []int32
	kstrat    []Strategy
	pinned    [][]uint32
	cur       []uint32    // shares the latest table gives (in force once applied)
	curB      []int64     // per key × region: the bursts the latest table gives
	pub       []uint32    // shares of the latest table, to find what changed
	pubB      []int64     // bursts of the latest table
	targetB   []int64     // during a transition: the bursts the increase will give
	rows      []KeyShares // per key: the latest table's row (immutable once published)
	stamp     []uint64    // per key: the report that last counted it (Observe)
	seq       uint64      // reports observed
	demand    []float64   // per key × region: demand at the last rebalance
	target    []uint32    // during a transition: the shares the increase will give
	version   []uint64    // per key: how many times its shares changed
	state     []float64
	// idleFor: per key × region, the rebalances since the last that
	// counted demand there (saturating at 255; a new key starts there).
	idleFor []uint8
	// coldPub: per key, left out of the tables while the term learns — a
	// key new to the term, which an earlier term's table may give any
	// region no more than its idle floor (see omitCold).
	coldPub []bool

	agents map[agentKey]*agentState
	// members: the live agents MemberChange gave; nil until it is first
	// called (a shell with no membership), while the agents with a fresh
	// report stand in for them.
	members map[agentKey]bool
	// perRegion: per region, the agents kept that are not members (at
	// most MaxAgentsPerRegion).
	perRegion []int

	term, epoch uint64
	latest      *Table
	leases      []int64 // per region: lease expiry of the latest table

	learning     bool
	learnUntil   int64
	blind        bool      // a later term with no stored table: learning lasts until learnUntil
	blindUntil   int64     // µs: until then older terms' tables this term never read may be in force (Table.BlindUntil)
	restore      bool      // the next table gives every key a new version
	vbase        uint64    // the version a key new to this term starts from
	rebase       bool      // the next table's new row versions start at vbase (a term's first)
	above        [2]uint64 // the newest (term, epoch) an agent named that this coordinator never made
	learnEpoch   uint64    // the first republished table: acks at or after it end learning
	learnWaitFor map[agentKey]bool
	firstTerm    bool // a first term with no stored table (see everyRegionAcked)

	transition bool // a decrease is out; the increase waits
	// lowered: the shares and bursts the decrease took below a region's
	// safe share (or safe burst), each with what the region ran before,
	// capped at its safe share: what an agent of the region that never
	// applied the decrease runs once its lease passes. The increase keeps
	// them unless every agent of the region had the decrease (see Tick).
	lowered   []lowering
	decEpoch  uint64
	waitUntil int64
	// waitFor: per agent that may run a decreasing region's old share, the
	// instant until which the increase waits for its acknowledgement (the
	// lease of its region in the last table naming it, plus skew).
	waitFor    map[agentKey]int64
	witnessed  bool               // the table before the decrease named an agent of a decreasing region
	quietUntil int64              // a decreasing region no known agent runs: not before its stored lease plus skew
	decreased  int64              // when the decrease went out
	fence      int64              // the last increase's effective time: no later table takes effect before it
	namedUntil map[agentKey]int64 // agents a table named, until its lease plus skew
	// exposed: every agent a table named, until the lease of its region in
	// the last table naming it plus skew — how long it may run that
	// table's shares. Seeded from the stored table by StartTerm.
	exposed map[agentKey]int64
	// unknown: per region, for a term started from a stored table that
	// names no agent there, that table's lease plus skew: agents it no
	// longer names may still run an older table until then.
	unknown []int64

	spare [2][]uint32 // freed shares buffers, reused by rebalance

	policyVersion string
	// retiredFloor: one above the highest version of a key removed, the
	// least version a key added later starts from.
	retiredFloor uint64

	next int64 // next rebalance, µs
	// reported: the least interval every agent counted at the last
	// rebalance had reported (reportedBy); a rebalance comes early once
	// each has reported a later one.
	reported int64
	ready    []*Table
	now      int64

	scratch scratch
}

type agentKey struct{ region, agent string }

// lowering is one share and burst a decrease took below the safe share:
// per key × region index j, what the region held before, capped at the
// safe share and burst.
type lowering struct {
	j     int
	held  uint32
	heldB int64
}

// agentState is what the coordinator keeps of one agent: its latest
// report, sparse (the keys it named and their demand), and the newest
// table it acknowledged.
type agentState struct {
	interval int64
	at       int64     // when the report arrived (µs)
	heard    int64     // when a report or acknowledgement last arrived (µs)
	keys     []int32   // key indexes of the latest report
	vals     []float64 // per entry of keys: offered cost in the interval
	order    []int32   // per entry of its last full report: the key's index (-1: unknown), Observe's first guess
	// resync: a delta report came after a missed report or named an
	// unknown key; tables ask the agent for a full report (Table.Resync).
	resync bool
	// unnamed: a table named it and a later one did not, so it ran every
	// row reduced meanwhile; the table that names it again gives every row
	// a new version (see publish).
	unnamed bool
	// features: its latest report's (Report.Features); AgentIdleFloors
	// says it runs a key no table names at its idle floor.
	features uint32
	term     uint64
	epoch    uint64 // acknowledged in force
	// fence and store: the region fence its latest acknowledgement read
	// back from its store, and the store's identity (0: it keeps no fence).
	fence gcra.Fence
	store uint64
}

type scratch struct {
	keys    []int     // Observe: key indexes of one report
	delta   []float64 // merge: per key, a delta report's new cost (0 between reports)
	demand  []float64
	in      Input
	out     []uint32
	weights []float64
	bursts  []int64
	has     []bool
	fixed   []int64
	floor   []uint32 // rebalance: one key's floors
	rekey   rekey
}

// Errors from Observe and friends. The input is ignored.
var (
	ErrUnknownRegion = errors.New("rebalance: unknown region")
	ErrBadReport     = errors.New("rebalance: bad report")
	// ErrTooManyAgents: a report or acknowledgement from an agent that
	// membership does not list, in a region that already keeps
	// MaxAgentsPerRegion such agents.
	ErrTooManyAgents = errors.New("rebalance: too many agents")
)

// NewCoordinator returns a coordinator for cfg and budgets, at term 0 with
// no table yet. Call StartTerm before Tick.
func NewCoordinator(cfg Config, budgets []Budget) (*Coordinator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	regions := slices.Sorted(slices.Values(cfg.Regions))
	c := &Coordinator{
		cfg:       cfg,
		regions:   regions,
		ridx:      map[string]int{},
		safe:      cfg.safe(regions),
		strats:    map[string]Strategy{},
		nR:        len(regions),
		dt:        int64(cfg.Interval / time.Microsecond),
		agents:    map[agentKey]*agentState{},
		reported:  math.MinInt64,
		leases:    make([]int64, len(regions)),
		unknown:   make([]int64, len(regions)),
		perRegion: make([]int, len(regions)),
		// Per-key state SetBudgets rekeys in place; pub and target stay
		// nil until a table and a transition need them.
		budgets: []Budget{}, kidx: map[string]int32{}, slot: []int32{}, kstrat: []Strategy{}, pinned: [][]uint32{},
		cur: []uint32{}, curB: []int64{}, rows: []KeyShares{}, stamp: []uint64{},
		version: []uint64{}, state: []float64{}, idleFor: []uint8{}, coldPub: []bool{},
	}
	c.idle = cfg.idle(regions, c.safe)
	for i, r := range regions {
		c.ridx[r] = i
	}
	if err := c.SetBudgets(budgets); err != nil {
		return nil, err
	}
	n := c.nR
	c.scratch = scratch{
		demand: make([]float64, n), out: make([]uint32, n), weights: make([]float64, n),
		bursts: make([]int64, n), has: make([]bool, n), fixed: make([]int64, n),
	}
	return c, nil
}

// strategy returns the named strategy, made once.
func (c *Coordinator) strategy(name string) (Strategy, error) {
	if name == "" {
		name = c.cfg.Strategy
	}
	if s, ok := c.strats[name]; ok {
		return s, nil
	}
	s, err := NewStrategy(name, c.regions, c.cfg.Params)
	if err != nil {
		return nil, err
	}
	c.strats[name] = s
	return s, nil
}

// SetBudgets replaces the budgets. Keys that stay keep their shares and
// strategy memory; new keys start at the floors (what regions run for a key
// no table names); removed keys leave the next table. Every problem is
// reported and nothing changes. The per-key state is rekeyed in place
// (UpdateKeys, for a few keys at a time, costs no more than the keys it
// names plus one pass over the key indexes).
func (c *Coordinator) SetBudgets(budgets []Budget) error {
	budgets = sortBudgets(budgets)
	if err := c.checkBudgets(budgets, "budget", nil); err != nil {
		return err
	}
	c.apply(c.plan(budgets, nil, true))
	return nil
}

// UpdateKeys adds the budgets in add (or replaces the budgets of keys it
// names that the coordinator has) and removes the keys in remove, as
// SetBudgets would with the whole list: a key that stays keeps its shares
// and strategy memory, a new one starts at the floors, a removed one leaves
// the next table. A key in remove that the coordinator does not have is
// ignored; a key in both lists, or listed twice in add, is an error. Every
// problem is reported and nothing changes. It allocates for the keys it
// names only: the per-key state is rekeyed in place.
func (c *Coordinator) UpdateKeys(add []Budget, remove []string) error {
	add = sortBudgets(add)
	gone := make(map[string]bool, len(remove))
	for _, k := range remove {
		gone[k] = true
	}
	if err := c.checkBudgets(add, "added budget", gone); err != nil {
		return err
	}
	c.apply(c.plan(add, gone, false))
	return nil
}

// checkBudgets reports every problem with sorted budgets: a key listed
// twice, one also in gone, and what validBudget finds.
func (c *Coordinator) checkBudgets(budgets []Budget, what string, gone map[string]bool) error {
	var errs []error
	for i, b := range budgets {
		if i > 0 && budgets[i-1].Key == b.Key {
			errs = append(errs, fmt.Errorf("rebalance: %s %d (key %q): key listed twice", what, i, b.Key))
		}
		if gone[b.Key] {
			errs = append(errs, fmt.Errorf("rebalance: %s %d (key %q): key also removed", what, i, b.Key))
		}
		if _, _, e := c.validBudget(b, i); len(e) > 0 {
			errs = append(errs, e...)
		}
	}
	return errors.Join(errs...)
}

// apply rekeys the per-key state to p's key set (see rekey). Kept keys
// keep everything; a new key starts at the floors in the shares in force,
// the pending increase and the last published table, with the bursts its
// floors give; a key whose limit changed gets bursts split afresh from its
// shares in force and a new version, and gives up a waiting increase.
func (c *Coordinator) apply(p *rekey) {
	n := c.nR
	// Versions never go back: a removed key's version floors every key
	// added later, so a key added again continues above it (its region
	// state may outlive it; gcra epoch tags must move forward) — one
	// number, where a map of removed keys grew with every key that left.
	p.limit, p.was = p.limit[:0], p.was[:0]
	for i, o := range p.from {
		changed := o >= 0 && p.repl[i] && c.budgets[o].Limit != p.with[i].Limit
		p.limit = append(p.limit, changed)
		was := gcra.Limit{}
		if changed {
			was = c.budgets[o].Limit
		}
		p.was = append(p.was, was)
	}
	for o, ni := range p.to {
		if ni < 0 {
			c.retiredFloor = max(c.retiredFloor, c.version[o]+1)
			delete(c.kidx, c.budgets[o].Key)
			c.freeSlots = append(c.freeSlots, c.slot[o])
		}
	}
	c.slot = move(c.slot, p, 1)
	c.budgets, c.kstrat, c.pinned = move(c.budgets, p, 1), move(c.kstrat, p, 1), move(c.pinned, p, 1)
	c.version, c.stamp, c.rows = move(c.version, p, 1), move(c.stamp, p, 1), move(c.rows, p, 1)
	c.cur, c.pub, c.target = move(c.cur, p, n), move(c.pub, p, n), move(c.target, p, n)
	c.curB, c.pubB, c.targetB = move(c.curB, p, n), move(c.pubB, p, n), move(c.targetB, p, n)
	c.state = move(c.state, p, n)
	c.idleFor = move(c.idleFor, p, n)
	c.coldPub = move(c.coldPub, p, 1)
	c.demand = c.demand[:0]
	pairs := [3]struct {
		s []uint32
		b []int64
	}{{c.cur, c.curB}, {c.pub, c.pubB}, {c.target, c.targetB}}
	for i, o := range p.from {
		if !p.repl[i] {
			continue
		}
		b := p.with[i]
		if o < 0 { // a key new to the coordinator: a slot of its own
			sl := int32(len(c.at))
			if k := len(c.freeSlots); k > 0 {
				sl, c.freeSlots = c.freeSlots[k-1], c.freeSlots[:k-1]
			} else {
				c.at = append(c.at, 0)
			}
			c.slot[i] = sl
			c.kidx[b.Key] = sl
		}
		c.budgets[i] = b
		c.kstrat[i], c.pinned[i], _ = c.validBudget(b, i)
		lo, hi := i*n, (i+1)*n
		switch {
		case o < 0:
			for _, pr := range pairs {
				if pr.s == nil {
					continue
				}
				// At the safe shares, not the idle floors agents run a
				// key no table names at: a key new to the coordinator may
				// be one an agent still runs under an earlier table (an
				// earlier term's, or this one's from before the key left),
				// at min(last share, safe share) once that table's lease
				// passes (explorer schedule 33 of seed 10: a term took a
				// key it learned from reports to run at its idle floors and
				// gave the rest away while a lapsed region ran its safe
				// share). Its first rebalance lowers the floors of the
				// regions without demand, acknowledged like any decrease.
				copy(pr.s[lo:hi], c.safe)
				if pr.b == nil {
					continue
				}
				if c.learning {
					// A key new to a term still learning may be one an
					// earlier term's agents still run — one the stored
					// table lacks but an older table has (a blind term's
					// stored table has no keys): its floors get only
					// their part of the burst (explorer schedule 36171 of
					// seed 1: a term begun from a blind term's empty table
					// split a key's whole burst over the floors while an
					// agent ran its older share, Σ bursts 643 of 549).
					splitHeld(b.Limit, pr.s[lo:hi], c.safe, pr.b[lo:hi])
				} else {
					splitRow(b.Limit, pr.s[lo:hi], c.safe, pr.b[lo:hi])
				}
			}
			clear(c.state[lo:hi])
			for j := lo; j < hi; j++ {
				c.idleFor[j] = math.MaxUint8
			}
			c.coldPub[i] = c.learning
			c.version[i] = max(c.retiredFloor, c.vbase)
			c.rows[i], c.stamp[i] = KeyShares{}, 0
		case p.limit[i]:
			// Each region's burst is what its agents make of the one in
			// force under the new budget (ShrunkBurst: a smaller budget
			// takes every burst down with it, a larger one raises none),
			// not a split afresh: the split may raise one region's burst
			// while it lowers another's, a move only the next rebalance
			// may make, break before make (explorer schedule 1822 of seed
			// 10 at max_skew 250 ms, fence 500 ms: a budget cut from 33 to
			// 8 left eu 6, us 1 and ap 0 in force; the split, 5, 2 and 1,
			// raised us and ap at once while eu's store, 120 ms behind,
			// still ran 6 — Σ bursts 9 of 8).
			for _, pr := range pairs {
				if pr.s != nil && pr.b != nil {
					for j := lo; j < hi; j++ {
						pr.b[j] = ShrunkBurst(pr.b[j], p.was[i].Burst(), b.Limit.Burst())
					}
				}
			}
			// A key whose budget changes while its increase waits gives
			// the increase up: its shares in force (the decrease) sum
			// below PPM, and the bursts split from them under the new
			// budget need not stay below the ones split from the target,
			// so the increase could lower one region's burst while it
			// raises another's — a decrease nobody waited for (explorer
			// schedule 1956 of seed 1: Σ bursts 30 of 29). The next
			// rebalance moves it again, break before make.
			if c.target != nil {
				copy(c.target[lo:hi], c.cur[lo:hi])
				copy(c.targetB[lo:hi], c.curB[lo:hi])
			}
			c.version[i]++
			c.rows[i] = KeyShares{}
		}
		// Otherwise only the strategy, pinning or freezing changed: the
		// shares, bursts, version and row stay.
	}
	// Each slot's index, now that the keys moved. Free slots are reused by
	// the next new keys; once most are free they are given back.
	if len(c.freeSlots) > 64 && len(c.freeSlots) > 3*len(c.slot) {
		for i := range c.slot {
			c.slot[i] = int32(i)
			c.kidx[c.budgets[i].Key] = int32(i)
		}
		c.at, c.freeSlots = make([]int32, len(c.slot)), nil
	}
	for i, sl := range c.slot {
		c.at[sl] = int32(i)
	}
	// Agents' demand is kept by key index; follow the keys.
	for _, a := range c.agents {
		w := 0
		for j, k := range a.keys {
			if ni := p.to[k]; ni >= 0 {
				a.keys[w], a.vals[w] = ni, a.vals[j]
				w++
			}
		}
		a.keys, a.vals = a.keys[:w], a.vals[:w]
	}
	// The plan's scratch keeps its room, not the budgets it carried.
	clear(p.with)
	// A transition under way keeps its wait; its target follows the new
	// key order (a new key's target is its floors).
}

// SetPolicyVersion stamps every later table with the policy version (the
// content hash of the policy the budgets come from). Agents run a key whose
// policy version disagrees with the table's at its safe share.
func (c *Coordinator) SetPolicyVersion(v string) { c.policyVersion = v }

// Regions returns the regions in table order.
func (c *Coordinator) Regions() []string { return slices.Clone(c.regions) }

// Term returns the coordinator's term.
func (c *Coordinator) Term() uint64 { return c.term }

// everyRegionAcked reports whether every region has a member that has
// this term's tables in force. A first term with no stored table learns
// until then (or one lease plus MaxSkew): a region with no member it can
// hear may hold agents on an older term's tables that it cannot see —
// a partition hides them — and only their acknowledgement or the lease
// proves them gone (explorer schedule 81950 of seed 1: a cold candidate
// alone on its side of a partition heard only itself and took 93 % of a
// key while the other side ran term 2's tables). A new cluster's regions
// are covered as soon as memberlist lists an agent in each and it
// acknowledges.
func (c *Coordinator) everyRegionAcked() bool {
	return c.everyRegion(func(k agentKey) bool { return c.acked(k, c.term, c.learnEpoch) })
}

// everyRegionReported reports whether every region has a member with a
// fresh report. A first term waits for it too (bounded, like the
// acknowledgements, by its lease plus MaxSkew): its first rebalance would
// otherwise give a region whose first report is still on the way nothing
// but its floor — and take it back one transition later (issue 18: a
// fresh cluster's home region ran a hot key at its floor for the first
// 7 s, its neighbours at half the key each). A live agent reports within
// Δ of acknowledging, so this adds at most about Δ.
func (c *Coordinator) everyRegionReported(now int64) bool {
	return c.everyRegion(func(k agentKey) bool { a := c.agents[k]; return a != nil && c.fresh(a, now) })
}

// everyRegion reports whether every region has a member for which ok
// holds.
func (c *Coordinator) everyRegion(ok func(agentKey) bool) bool {
	covered := make([]bool, c.nR)
	for k := range c.members {
		if ok(k) {
			covered[c.ridx[k.region]] = true
		}
	}
	return !slices.Contains(covered, false)
}

// Outranked returns the newest table (term, epoch) a report or an
// acknowledgement named that is above everything this coordinator made
// (term 0: none). An agent on it refuses this coordinator's tables as
// older: another coordinator holds a later term, or this one is a
// candidate's restarted cold after the bucket was lost, under a term the
// cluster already passed. The shell ends the term and stands again above
// it.
func (c *Coordinator) Outranked() (term, epoch uint64) { return c.above[0], c.above[1] }

// Learning reports whether the coordinator is still republishing the
// table it inherited.
func (c *Coordinator) Learning() bool { return c.learning }

// StartTerm makes the coordinator act under term from now on. latest is
// the newest table stored (nil for a fresh cluster): its shares become the
// shares in force, and the coordinator republishes them — learning mode —
// until every agent that table names acknowledges the republished table,
// or one lease plus the maximum skew has passed. Failover never resets
// shares. The term must be above every term seen.
func (c *Coordinator) StartTerm(term uint64, latest *Table, now int64) error {
	if term <= c.term || (latest != nil && term <= latest.Term) {
		return fmt.Errorf("rebalance: term %d is not above the current term %d", term, max(c.term, termOf(latest)))
	}
	c.term, c.now = term, now
	c.transition, c.target, c.targetB = false, nil, nil
	// Keys this term budgets first get versions above any an earlier term
	// gave (each gives fewer than 2³² per key): agents keep a row whose
	// version went backwards, so a term that cannot see the stored table
	// must not restart them at 1 (issue 17, defect 3).
	c.vbase = (term - 1) << 32
	for k := range c.version {
		c.version[k] = max(c.version[k], c.vbase)
	}
	for k := range c.coldPub {
		c.coldPub[k] = true // until adopt finds it in the stored table
	}
	if latest != nil {
		c.epoch = max(c.epoch, latest.Epoch)
		c.adopt(latest)
	}
	c.latest = latest
	if latest != nil && term > 1 {
		// The term's first table gives every row a new version from the
		// term's base, above any version an earlier term gave: the stored
		// head may be older than tables the agents hold (a replayed
		// genuine head, a write the bucket lost), whose row versions are
		// higher than the stored ones — an agent keeps a row whose
		// version went backwards, so it would keep that table's share
		// under this term's tables (explorer schedule 35053 of seed 1:
		// us-1 held v31's 820,834 ppm under the term's v29 rows, Σ in
		// force 1,083,150 ppm).
		c.restore, c.rebase = true, true
	}
	if latest != nil {
		n := c.nR
		for i, l := range latest.Leases {
			if now < l {
				continue
			}
			c.restore = true // a region's agents may have lapsed: see Observe
			if i >= len(latest.Regions) {
				continue
			}
			ri, ok := c.ridx[latest.Regions[i]]
			if !ok {
				continue
			}
			// Its agents run at most min(stored, safe) now, and a table
			// the term cannot see — one stored after this one and then
			// overwritten, by a replay of this one or a lost write — may
			// have handed the rest of its share to others once that
			// lease had passed: the term inherits the region at its
			// lapsed shares and bursts, so that giving it more is an
			// increase like any other (explorer schedule 35053 of seed
			// 1: a term begun from a replayed head raised a lapsed region
			// back to its stored share while another region ran the
			// share a later, overwritten table had given it — Σ in force
			// 1,117,515 ppm).
			for k := range c.budgets {
				j := k*n + ri
				c.cur[j] = min(c.cur[j], c.safe[ri])
				c.curB[j] = min(c.curB[j], SafeBurst(c.budgets[k].Limit.Burst(), c.safe[ri], n))
			}
		}
	}
	// A later term with no stored table to start from (the bucket was
	// lost, or its head could not be verified) cannot know what the
	// agents run: their earlier tables hold until their leases, at most
	// one lease from now. It publishes the floors and waits that lease
	// plus MaxSkew before it rebalances, as learning mode waits for agents
	// it cannot hear from.
	c.blind = latest == nil && term > 1
	// A first term with no stored table is a new cluster's — or that of a
	// candidate restarted cold while the bucket was lost, whose election
	// in the recreated bucket restarts at term 1 below the tables every
	// other agent runs (they refuse its tables as older). It learns like
	// a failover: no rebalance until every member has acknowledged its
	// first table, or one lease plus MaxSkew has passed, so that it never
	// raises a share while older tables may be in force (explorer
	// schedules 60901 and 50306 of seed 1: Σ shares 1,117,971 ppm, Σ
	// bursts 581 of 447). A new cluster's agents acknowledge at once.
	fresh := latest == nil && term == 1 && len(c.members) > 0
	c.learning = (latest != nil || c.blind || fresh) && !c.cfg.Shadow
	if c.blind {
		// Floors with only their part of each burst (splitHeld): the
		// whole burst split over the floors would add to what agents
		// still on an earlier term's table run (explorer schedule 200 of
		// seed 1: Σ bursts 295 of 266).
		n := c.nR
		for k := range c.budgets {
			splitHeld(c.budgets[k].Limit, c.cur[k*n:(k+1)*n], c.safe, c.curB[k*n:(k+1)*n])
		}
	}
	c.learnUntil = now + int64(c.cfg.Lease/time.Microsecond) + int64(c.cfg.MaxSkew/time.Microsecond)
	c.blindUntil = 0
	if c.blind {
		c.blindUntil = c.learnUntil
	}
	if latest != nil && latest.BlindUntil > now {
		// The stored table is a blind term's, from before its wait ended:
		// agents may still run tables older than it that neither term
		// read — and its rows, floors with only their part of the burst,
		// leave the rest to them. Its wait is this term's too, however
		// soon its named agents acknowledge (explorer schedule 1635 of
		// seed 10 at max_skew 250 ms, fence 500 ms: a term begun from a
		// blind term's first table gave ap the burst us still ran under
		// the partitioned coordinator's last table, Σ bursts in force
		// 1021 of 786).
		c.blindUntil = latest.BlindUntil
	}
	c.learnWaitFor = map[agentKey]bool{}
	c.firstTerm = fresh
	if fresh {
		for k := range c.members {
			c.learnWaitFor[k] = true
		}
	}
	if latest != nil {
		// The stored table's agents may run its shares until its leases
		// plus skew: the new term names them until then and waits for
		// them, whatever membership says yet.
		skew := int64(c.cfg.MaxSkew / time.Microsecond)
		if c.namedUntil == nil {
			c.namedUntil = map[agentKey]int64{}
		}
		if c.exposed == nil {
			c.exposed = map[agentKey]int64{}
		}
		for i, r := range latest.Regions {
			ri, ok := c.ridx[r]
			if !ok || i >= len(latest.Leases) {
				continue
			}
			c.leases[ri] = max(c.leases[ri], latest.Leases[i])
			var agents []string
			if i < len(latest.Agents) {
				agents = latest.Agents[i]
			}
			until := latest.Leases[i] + skew
			if len(agents) == 0 {
				c.unknown[ri] = max(c.unknown[ri], until)
			}
			for _, a := range agents {
				k := agentKey{r, a}
				c.learnWaitFor[k] = true
				c.namedUntil[k] = max(c.namedUntil[k], until)
				c.exposed[k] = max(c.exposed[k], until)
			}
		}
	}
	eff := now
	if latest != nil {
		eff = max(now, latest.Effective) // a pending increase keeps its fence
	}
	c.fence = max(c.fence, eff)
	c.publish(now, now, c.cur, c.curB)
	c.learnEpoch = c.epoch
	c.next = now + c.dt
	return nil
}

func termOf(t *Table) uint64 {
	if t == nil {
		return 0
	}
	return t.Term
}

// index returns the index of key: its slot's (kidx, at).
func (c *Coordinator) index(key string) (int, bool) {
	sl, ok := c.kidx[key]
	if !ok {
		return 0, false
	}
	return int(c.at[sl]), true
}

// adopt takes a stored table's shares as the shares in force.
func (c *Coordinator) adopt(t *Table) {
	n := c.nR
	for _, ks := range t.Keys {
		k, ok := c.index(ks.Key)
		if !ok || len(ks.Shares) != len(t.Regions) {
			continue
		}
		c.coldPub[k] = false
		row := c.cur[k*n : (k+1)*n]
		copy(row, c.safe)
		for i, r := range t.Regions {
			if ri, ok := c.ridx[r]; ok {
				row[ri] = ks.Shares[i]
			}
		}
		brow := c.curB[k*n : (k+1)*n]
		if len(ks.Bursts) == len(t.Regions) && ks.Budget == c.budgets[k].Limit {
			for i, r := range t.Regions {
				if ri, ok := c.ridx[r]; ok {
					brow[ri] = ks.Bursts[i]
				}
			}
			c.version[k] = ks.Version
		} else {
			// The budget changed since the stored table (a policy
			// reload before the term began): the row gets a new version,
			// as SetBudgets gives it, so that agents apply the new
			// limits as a change rather than keep the stored version's
			// (explorer schedule 7961 of seed 1: a region kept the old
			// burst scaled down, 6 where the table said 5, and Σ bursts
			// reached 9 of 8), and its bursts are the stored ones as the
			// agents shrink them (ShrunkBurst; apply says why not a
			// split afresh).
			if len(ks.Bursts) == len(t.Regions) {
				for i, r := range t.Regions {
					if ri, ok := c.ridx[r]; ok {
						brow[ri] = ShrunkBurst(ks.Bursts[i], ks.Budget.Burst(), c.budgets[k].Limit.Burst())
					}
				}
			} else {
				splitHeld(c.budgets[k].Limit, row, c.safe, brow)
			}
			c.version[k] = ks.Version + 1
		}
	}
	// What the stored table published is what the next table compares
	// with (the term's first table still gives every row a new version
	// from the term's base: StartTerm).
	c.pub = slices.Clone(c.cur)
	c.pubB = slices.Clone(c.curB)
	c.rows = make([]KeyShares, len(c.budgets))
}

// MemberChange replaces the set of live agents. Membership names the agents
// a new table waits for; it never shortens a wait already begun.
func (c *Coordinator) MemberChange(members []Member) error {
	m := make(map[agentKey]bool, len(members))
	for _, mb := range members {
		if _, ok := c.ridx[mb.Region]; !ok {
			return fmt.Errorf("rebalance: member %q in region %q: %w", mb.Agent, mb.Region, ErrUnknownRegion)
		}
		if mb.Agent == "" {
			return fmt.Errorf("rebalance: member in region %q: empty agent name", mb.Region)
		}
		m[agentKey{mb.Region, mb.Agent}] = true
	}
	c.members = m
	c.recount()
	return nil
}

// Ack records that an agent has the table (term, epoch) in force.
func (c *Coordinator) Ack(region, agent string, term, epoch uint64) error {
	return c.AckFenced(region, agent, term, epoch, gcra.Fence{}, 0)
}

// AckFenced is Ack carrying the region fence the agent's store held after
// the agent raised it (read back) and the store's identity (gcra.Fencer; 0:
// it keeps no fence). One such acknowledgement from a member can prove a
// decrease in force for its whole region (see fencedFor).
func (c *Coordinator) AckFenced(region, agent string, term, epoch uint64, fence gcra.Fence, store uint64) error {
	if _, ok := c.ridx[region]; !ok {
		return fmt.Errorf("rebalance: ack from %q in %q: %w", agent, region, ErrUnknownRegion)
	}
	if agent == "" {
		return fmt.Errorf("%w: ack from region %q with no agent name", ErrBadReport, region)
	}
	a, err := c.agent(agentKey{region, agent})
	if err != nil {
		return err
	}
	a.heard = max(a.heard, c.now)
	c.holds(a, term, epoch)
	if store != a.store || a.fence.Less(fence) {
		// Another store (a restart or failover changes its identity) holds
		// only what it read back; the same store's fence never goes down.
		a.fence, a.store = fence, store
	}
	return nil
}

// fencedAgent reports whether agent k's region is fenced at (this term,
// epoch) (fencedFor): then what k may still run of an older table is
// refused by the region's store.
func (c *Coordinator) fencedAgent(k agentKey, epoch uint64) bool {
	ri, ok := c.ridx[k.region]
	return ok && c.fencedFor(ri, c.term, epoch)
}

// fencedFor reports whether region ri's store is proven to refuse every
// decision made under a table before (term, epoch) while that table is in
// force in the region (issue 17, defect 5; the doc's invariant 1): a
// trusted agent of ri — a member, or with no membership given one a table
// names — has that table (or a later one) in force and acknowledged a
// region fence at least (term, epoch) on store S, and every agent of ri
// this coordinator keeps that is a member or a table named acknowledged
// on S: one on another store, or of a release that keeps no fence, would
// decide unfenced. An agent of ri it has never heard from (the crashed
// coordinator's own, named by the stored table) is taken to decide on the
// region's one store — a region whose agents use two stores admits each
// share twice whatever the tables say.
func (c *Coordinator) fencedFor(ri int, term, epoch uint64) bool {
	want := gcra.Fence{Term: term, Epoch: epoch}
	var store uint64
	proof := false
	for k, a := range c.agents {
		if c.ridx[k.region] != ri {
			continue
		}
		trusted := c.members[k] || (c.members == nil && c.namedUntil[k] > c.now)
		if !trusted && c.namedUntil[k] <= c.now && c.exposed[k] <= c.now {
			continue
		}
		if a.store == 0 || (store != 0 && a.store != store) {
			return false
		}
		store = a.store
		if trusted && !a.fence.Less(want) && c.acked(k, term, epoch) {
			proof = true
		}
	}
	return proof
}

// holds records that agent a has table (term, epoch) in force — unless
// that is a table this coordinator never made (above its own term and
// epoch: another coordinator's, or an earlier cluster's that a candidate
// restarted cold could not see), which acknowledges nothing of its own: an
// agent on it refuses this coordinator's tables as older.
func (c *Coordinator) holds(a *agentState, term, epoch uint64) {
	if term > c.term || (term == c.term && epoch > c.epoch) {
		if term > c.above[0] || (term == c.above[0] && epoch > c.above[1]) {
			c.above = [2]uint64{term, epoch}
		}
		return
	}
	if term > a.term || (term == a.term && epoch > a.epoch) {
		a.term, a.epoch = term, epoch
	}
}

// agent returns the state of agent k, making it when there is room: a
// region keeps at most MaxAgentsPerRegion agents that membership does not
// list (a member always has room), so names nobody vouches for cannot
// grow the coordinator's memory.
func (c *Coordinator) agent(k agentKey) (*agentState, error) {
	a := c.agents[k]
	if a != nil {
		return a, nil
	}
	if !c.members[k] && c.perRegion[c.ridx[k.region]] >= c.cfg.MaxAgentsPerRegion {
		return nil, fmt.Errorf("%w: %s/%s: region %q already has %d agents that are not members (MaxAgentsPerRegion)",
			ErrTooManyAgents, k.region, k.agent, k.region, c.perRegion[c.ridx[k.region]])
	}
	// An agent the latest table does not name — new, or forgotten once it
	// fell silent and no table named it — may have run rows reduced under
	// their versions meanwhile: the table that names it gives every row a
	// new version (publish), as for one a table stopped naming.
	a = &agentState{interval: math.MinInt64, unnamed: c.latest != nil && !slices.Contains(c.prevAgents(c.ridx[k.region]), k.agent)}
	c.agents[k] = a
	if !c.members[k] {
		c.perRegion[c.ridx[k.region]]++
	}
	return a, nil
}

// recount counts, per region, the agents kept that membership does not
// list.
func (c *Coordinator) recount() {
	clear(c.perRegion)
	for k := range c.agents {
		if !c.members[k] {
			c.perRegion[c.ridx[k.region]]++
		}
	}
}

// Observe takes one agent's demand report, received at now (µs). A report
// must name a known region and an agent, be for a closed interval (not
// later than the one before now + MaxSkew: the agent closes it on its own
// clock, which may run MaxSkew ahead), not repeat or precede that agent's last
// report, list each key once and carry no negative counts; otherwise it is
// refused whole. Unknown keys are reported in the error while the rest of
// the report counts. An agent that membership does not list is accepted
// while its region keeps fewer than MaxAgentsPerRegion such agents
// (ErrTooManyAgents otherwise): its reports count as demand, but no table
// names it (it runs at most its safe share) and it does not keep its
// region live — until membership lists it. A coordinator never given
// membership names every agent with a fresh report. A report also
// acknowledges the table the agent had in force. A full report replaces
// the agent's demand; a delta report (Report.Delta) replaces it for the
// keys it lists only (zero counts: no demand) and keeps the agent's last
// demand for every other key.
func (c *Coordinator) Observe(r *Report, now int64) error {
	if _, ok := c.ridx[r.Region]; !ok {
		return fmt.Errorf("rebalance: report from %q in %q: %w", r.Agent, r.Region, ErrUnknownRegion)
	}
	if r.Agent == "" {
		return fmt.Errorf("%w: region %q: no agent name", ErrBadReport, r.Region)
	}
	// The agent closes its interval on its own clock, up to MaxSkew ahead
	// of ours.
	if closed := (now+int64(c.cfg.MaxSkew/time.Microsecond))/c.dt - 1; r.Interval > closed {
		return fmt.Errorf("%w: %s/%s interval %d is not closed yet (latest closed: %d)", ErrBadReport, r.Region, r.Agent, r.Interval, closed)
	}
	k := agentKey{r.Region, r.Agent}
	a, err := c.agent(k)
	if err != nil {
		return err
	}
	if r.Interval <= a.interval {
		return fmt.Errorf("%w: %s/%s interval %d: already have interval %d", ErrBadReport, r.Region, r.Agent, r.Interval, a.interval)
	}
	for i, kd := range r.Keys {
		if kd.Offered < 0 || kd.OfferedCost < 0 || kd.Admitted < 0 || kd.Denied < 0 {
			return fmt.Errorf("%w: %s/%s key %d (%q): negative count", ErrBadReport, r.Region, r.Agent, i, kd.Key)
		}
	}
	// One lookup per key; a key listed twice refuses the whole report. An
	// agent's full reports list its keys in the same order each interval,
	// so the key at the same place in its last one is tried first: a name
	// comparison instead of a map lookup.
	c.seq++
	idx := c.scratch.keys[:0]
	var unknown []string
	for i, kd := range r.Keys {
		ki, ok := 0, false
		if i < len(a.order) {
			if h := int(a.order[i]); h >= 0 && h < len(c.budgets) && c.budgets[h].Key == kd.Key {
				ki, ok = h, true
			}
		}
		if !ok {
			ki, ok = c.index(kd.Key)
		}
		if !ok {
			unknown = append(unknown, kd.Key)
			ki = -1
		} else if c.stamp[ki] == c.seq {
			return fmt.Errorf("%w: %s/%s: key %q listed twice", ErrBadReport, r.Region, r.Agent, kd.Key)
		} else {
			c.stamp[ki] = c.seq
		}
		idx = append(idx, ki)
	}
	c.scratch.keys = idx
	if !r.Delta {
		a.order = a.order[:0]
		for _, ki := range idx {
			a.order = append(a.order, int32(ki))
		}
	}
	if r.Delta {
		// A gap in the agent's intervals is a lost report; an unknown key
		// a demand this coordinator could not keep.
		a.resync = a.resync || a.interval == math.MinInt64 || r.Interval != a.interval+1 || len(unknown) > 0
		c.merge(a, r, idx)
	} else {
		a.resync = false
		a.keys, a.vals = a.keys[:0], a.vals[:0]
		for i, kd := range r.Keys {
			if ki := idx[i]; ki >= 0 && kd.OfferedCost > 0 {
				a.keys = append(a.keys, int32(ki))
				a.vals = append(a.vals, float64(kd.OfferedCost))
			}
		}
	}
	if a.at > 0 && now-a.at > int64((c.cfg.Lease-c.cfg.Interval)/time.Microsecond) {
		// Silent for about a lease: it has likely lapsed, and an agent
		// that lapses twice under one row version keeps that row at its
		// safe share until the version moves (issue 17, defect 2).
		c.restore = true
	}
	a.interval, a.at, a.heard = r.Interval, now, max(a.heard, now)
	a.features = r.Features
	c.holds(a, r.Term, r.Epoch)
	if len(unknown) > 0 {
		return fmt.Errorf("%w: %s/%s: %d unknown keys (first %q) ignored", ErrBadReport, r.Region, r.Agent, len(unknown), unknown[0])
	}
	return nil
}

// merge applies delta report r, whose keys idx names (-1: unknown, and
// every known one stamped c.seq), to agent a's remembered demand: a listed
// key takes its new cost (and is dropped at zero), the others keep theirs.
// Linear in the agent's keys plus the report's; the order of a.keys does
// not matter (each key appears once per agent, and demand sums per agent).
func (c *Coordinator) merge(a *agentState, r *Report, idx []int) {
	if len(c.scratch.delta) < len(c.stamp) {
		c.scratch.delta = make([]float64, len(c.stamp))
	}
	dv := c.scratch.delta
	for i, kd := range r.Keys {
		if ki := idx[i]; ki >= 0 {
			dv[ki] = float64(kd.OfferedCost)
		}
	}
	w := 0
	for j, ki := range a.keys {
		v := a.vals[j]
		if c.stamp[ki] == c.seq {
			v, dv[ki] = dv[ki], -1 // taken
		}
		if v > 0 {
			a.keys[w], a.vals[w] = ki, v
			w++
		}
	}
	a.keys, a.vals = a.keys[:w], a.vals[:w]
	for _, ki := range idx {
		if ki >= 0 && dv[ki] > 0 {
			a.keys = append(a.keys, int32(ki))
			a.vals = append(a.vals, dv[ki])
		}
		if ki >= 0 {
			dv[ki] = 0
		}
	}
}

// AgentDemand returns the demand the coordinator holds for one agent —
// the offered cost per key of its last full report with every delta since
// applied — or nil for an agent it does not know. For admin views and
// tests; it allocates.
func (c *Coordinator) AgentDemand(region, agent string) map[string]int64 {
	a := c.agents[agentKey{region, agent}]
	if a == nil {
		return nil
	}
	m := make(map[string]int64, len(a.keys))
	for j, ki := range a.keys {
		m[c.budgets[ki].Key] = int64(a.vals[j])
	}
	return m
}

// EachHeld calls fn for every key the held demand of an agent still
// reporting at now (a fresh report) names, once per such agent: the keys
// in use though no recent report named them, which delta reports leave
// unnamed while their demand holds still. A silent agent vouches for
// nothing.
func (c *Coordinator) EachHeld(now int64, fn func(key string)) {
	for _, a := range c.agents {
		if !c.fresh(a, now) {
			continue
		}
		for _, ki := range a.keys {
			fn(c.budgets[ki].Key)
		}
	}
}

// fresh reports whether an agent's report still counts at now.
func (c *Coordinator) fresh(a *agentState, now int64) bool {
	return a.interval != math.MinInt64 && now/c.dt-1-a.interval < int64(c.cfg.StaleAfter)
}

// acked reports whether agent k has a table at least (term, epoch) in force.
func (c *Coordinator) acked(k agentKey, term, epoch uint64) bool {
	a := c.agents[k]
	return a != nil && (a.term > term || (a.term == term && a.epoch >= epoch))
}

// Tick advances the coordinator to now (µs): it ends learning mode, sends
// the increase of a transition whose decrease is in force, and rebalances
// every Δ. Tables to publish appear in Ready.
func (c *Coordinator) Tick(now int64) {
	if c.term == 0 {
		return // no term yet: StartTerm first
	}
	c.now = max(c.now, now)
	now = c.now
	if c.learning {
		done := now >= c.learnUntil
		if !done && !c.blind {
			done = true
			for k := range c.learnWaitFor {
				if !c.acked(k, c.term, c.learnEpoch) && !c.fencedAgent(k, c.learnEpoch) {
					done = false
					break
				}
			}
			if done && c.firstTerm {
				done = c.everyRegionAcked() && c.everyRegionReported(now)
			}
		}
		if done && now < c.blindUntil {
			done = false
		}
		if done {
			c.learning = false
			clear(c.coldPub)
		} else {
			if now >= c.next {
				c.publish(now, now, c.cur, c.curB) // renew the leases, shares unchanged
				c.next = now + c.dt
			}
			return
		}
	}
	if c.transition && c.decreaseInForce(now) {
		// The increase takes effect Fence after the decrease is known to be
		// in force (now), not merely after it was issued: an agent books
		// reservations under the old limit until it applies the decrease,
		// and those are served up to a max-wait later. And Fence measured
		// on the stores' clocks, so MaxSkew more on ours: the store that
		// increases may run MaxSkew ahead of us, and an agent acknowledges
		// by its own clock while its store (where its last booking under the
		// old limit was made) may lag it by MaxSkew — the bookings a
		// max-wait of Fence allows would otherwise act up to MaxSkew after
		// the increase they pay for took effect (issue 18).
		fence := int64(c.cfg.Fence/time.Microsecond) + int64(c.cfg.MaxSkew/time.Microsecond)
		c.fence = max(c.fence, now+fence, c.decreased+fence)
		c.keepLowered()
		c.free(c.cur)
		c.cur, c.target = c.target, nil
		c.curB, c.targetB = c.targetB, nil
		c.transition = false
		c.publish(now, now, c.cur, c.curB)
		// The next rebalance waits for the increase to be in force: a
		// table issued before then would supersede it while pending, and
		// with Fence ≥ Δ increases would never land. In force means on
		// every store, whose clock may lag ours by MaxSkew (as an agent's
		// InForce reckons it). A table that supersedes a change at the
		// instant it takes effect leaves a key's state written under the
		// limit before it (stores convert state lazily, on its next
		// admission) older than the change the new table keeps; the
		// store then reads that state as empty at the change *or its
		// stored TAT*, whichever is later — under a small share with a
		// large burst the TAT is seconds ahead, so the key carries that
		// much phantom debt under its new, larger limit.
		c.next = max(c.next, c.fence+int64(c.cfg.MaxSkew/time.Microsecond))
	}
	if now < c.next && !c.reportsIn(now) {
		return
	}
	c.next = now + c.dt
	if c.transition {
		c.publish(now, now, c.cur, c.curB) // renew the leases while the decrease lands
		return
	}
	c.reported = c.reportedBy(now)
	c.rebalance(now)
}

// reportsIn reports whether a rebalance may come before its time: no
// transition is under way, the last increase is in force on every store
// (as a rebalance at its time waits for, see Tick), and every agent the
// rebalance counts has reported an interval later than the last rebalance
// saw (issue 18: the rebalance ran at whatever phase of the report
// interval the term began in, up to Δ after the reports it needed had
// arrived). So it runs as soon as a closed interval's reports are all in,
// at most once per interval (each agent reports an interval once), and
// never later than Δ after the last.
func (c *Coordinator) reportsIn(now int64) bool {
	if c.transition || c.learning || now < c.fence+int64(c.cfg.MaxSkew/time.Microsecond) {
		return false
	}
	level := c.reportedBy(now)
	return level != math.MinInt64 && level > c.reported
}

// reportedBy is the least interval reported by the agents a rebalance at
// now counts as live (a member, or one a table still names, with a fresh
// report; with no membership given, any with a fresh report), or
// math.MinInt64 with none.
func (c *Coordinator) reportedBy(now int64) int64 {
	level := int64(math.MinInt64)
	for k, a := range c.agents {
		if !c.fresh(a, now) || !(c.members == nil || c.members[k] || c.namedUntil[k] > now) {
			continue
		}
		if level == math.MinInt64 || a.interval < level {
			level = a.interval
		}
	}
	return level
}

// decreaseInForce reports whether every agent that may run a decreasing
// region's old share has the decrease (or a later table) in force, or the
// previous lease plus the maximum skew has passed.
//
// Those agents are the ones a table named (the previous table's, and any
// an earlier table named until the lease of its region in the last table
// naming it, plus skew: it may hold that table); an agent no table names
// runs at min(last share, safe share) (region.Node) and needs no wait.
// With no agent to hear from in any decreasing region (a region that never
// had one named, as in a fresh cluster's first table), the decrease is in
// force once every store's clock has passed its effective time: the
// increase supersedes it, and superseding a change sooner leaves state
// written before it to be read as older than it (see Tick). A term started
// from a stored table that names no agent of a decreasing region waits for
// that table's lease plus skew: an agent it dropped may still run an older
// table until then.
func (c *Coordinator) decreaseInForce(now int64) bool {
	if now >= c.waitUntil {
		return true
	}
	if now < c.quietUntil {
		return false
	}
	if !c.witnessed && now < c.decreased+int64(c.cfg.MaxSkew/time.Microsecond) {
		return false
	}
	for k, until := range c.waitFor {
		if now < until && !c.acked(k, c.term, c.decEpoch) && !c.fencedAgent(k, c.decEpoch) {
			return false
		}
	}
	return true
}

// keepLowered gives up the increase of every key whose decrease took a
// region below its safe share where an agent of that region may not have
// it: one the wait gave up on (its lease passed unacknowledged, its store
// not fenced past the decrease), or a region none of whose agents the wait
// could ask. Such an agent runs min(its last share, safe share) once its
// lease passes — the idle floor is the coordinator's, not a lapse's — so
// the region keeps what it held, up to its safe share and burst, and the
// key's other regions stay at the decrease: Σ stays at most what it was
// before. The next rebalance moves the key again.
func (c *Coordinator) keepLowered() {
	if len(c.lowered) == 0 {
		return
	}
	n := c.nR
	confirmed := make([]int8, n) // 0: no agent asked; 1: all had it; -1: one may not
	for k := range c.waitFor {
		r := c.ridx[k.region]
		if c.acked(k, c.term, c.decEpoch) || c.fencedAgent(k, c.decEpoch) {
			if confirmed[r] == 0 {
				confirmed[r] = 1
			}
		} else {
			confirmed[r] = -1
		}
	}
	for _, l := range c.lowered {
		if confirmed[l.j%n] == 1 {
			continue
		}
		k := l.j / n
		lo, hi := k*n, (k+1)*n
		copy(c.target[lo:hi], c.cur[lo:hi])
		copy(c.targetB[lo:hi], c.curB[lo:hi])
	}
	for _, l := range c.lowered {
		if confirmed[l.j%n] != 1 {
			c.target[l.j] = max(c.target[l.j], l.held)
			c.targetB[l.j] = max(c.targetB[l.j], l.heldB)
		}
	}
	c.lowered = c.lowered[:0]
}

// Ready returns the tables produced since the last Advance, oldest first.
// The shell writes each with compare-and-set on the previous one before it
// publishes it; a failed write means another coordinator holds a newer term
// and this one must stop. Shadow tables (Config.Shadow) are for display.
func (c *Coordinator) Ready() []*Table { return c.ready }

// Advance tells the coordinator the tables from Ready were handled.
func (c *Coordinator) Advance() { c.ready = c.ready[:0] }

// Latest returns the newest table produced (nil before the first).
func (c *Coordinator) Latest() *Table { return c.latest }
