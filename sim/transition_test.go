package sim

import (
	"container/heap"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gcra/memstore"
	"github.com/meridian-quota/meridian/rebalance"
	"github.com/meridian-quota/meridian/region"
)

// The transition world runs the real coordinator and real region.Nodes in
// a deterministic discrete-event world, in the style of etcd/raft's network
// tests and FoundationDB's simulation: one goroutine, a virtual clock in
// µs, an event queue, every source of randomness derived from one printed
// seed. Each region has one memstore, shared by its agents, whose clock is
// the region's virtual clock (true time plus the region's offset); each
// agent's time is its host's wall clock (the region's clock plus the
// agent's own offset, which may step back and forth) through a
// region.Clock, as the agent shell computes it. Agents and coordinators
// follow the shells' call order (region/agent's loop, gossip's coordinate):
// an agent applies each table it receives, ticks every AgentTick
// (reporting when an interval closed, its lease lapsing), and acknowledges
// InForce when it changes; a coordinator learns membership before
// StartTerm and ticks, publishing what Ready returns. Tables, reports and
// acknowledgements travel with delays, are lost, arrive late and out of
// order, and stop at partitions; coordinators fail over, the new one
// starting from the latest stored table.
//
// After every event the world checks invariant 1 and the burst bound: for
// every key, Σ over regions of the share each region's store would enforce
// for the next decision — the largest over its agents of the limit the
// agent's schedule for the key (Node.Schedule) selects at the store's
// clock, as a share ceil(T·10⁶/T_r) — is at most PPM, and Σ over regions of
// those limits' bursts is at most the key's burst. What is in force
// changes only at events and at the instants a schedule switches on a
// store's clock; the world puts a check event at each of those, so the
// checks see every state the regions run.

var (
	worldSeed  = flag.Uint64("seed", 0, "run TestTransitionRandom with only this seed and print its trace (0: the fixed seeds)")
	worldSeeds = flag.Int("seeds", 0, "how many fixed seeds TestTransitionRandom runs per case (0: 120, or 20 under the race detector)")
)

const ms = int64(1000) // µs

// worldStart is the virtual time a world starts at (µs): the stores'
// clocks, offset by up to MaxSkew, stay positive.
const worldStart = int64(1_000_000_000)

// worldConfig is the coordinator configuration the world runs with: Δ =
// 100 ms of virtual time so that a run of dozens of intervals is cheap.
func worldConfig(regions ...string) rebalance.Config {
	cfg := rebalance.DefaultConfig(regions...)
	cfg.Interval = 100 * time.Millisecond
	cfg.Lease = 500 * time.Millisecond
	cfg.MaxSkew = 20 * time.Millisecond
	cfg.Fence = 40 * time.Millisecond // 2·MaxSkew
	cfg.Hysteresis = 2_000
	cfg.StaleAfter = 3
	return cfg
}

// netOpts are the network's knobs; ranges are [min, max] µs.
type netOpts struct {
	tableDelay, reportDelay, ackDelay [2]int64
	lateDelay                         [2]int64 // an extra, late copy of a table this long after the first
	dropP, lateP                      float64
	tick                              [2]int64 // the coordinator ticks every tick µs
	agentTick                         int64    // each agent's loop ticks its node this often
	memberDelay                       int64    // membership notices a partition this late; < 0: no membership
	skew                              bool     // region and agent clocks are offset within ±MaxSkew/2 each
	steps                             bool     // agents' wall clocks step back and forth within that bound
	noise                             bool     // each report's counts vary by ±20 %
}

// cut is a partition: agent (or every agent of region when agent is "")
// neither receives tables nor sends reports or acks in [from, to).
type cut struct {
	region, agent string
	from, to      int64
}

// wregion is one region: its store and its agents.
type wregion struct {
	name   string
	ri     int
	off    int64 // the store's clock reads t+off at t
	store  *memstore.Store
	agents []*wagent
}

// wagent is one agent: a real node and its shell's state.
type wagent struct {
	rg    *wregion
	name  string
	node  *region.Node
	clock region.Clock
	off   int64 // its wall clock reads the region's clock plus off
	acked [2]uint64
	// hold keeps tables sent to the agent in inbox instead of the network
	// (scripted tests deliver them later, in an order of their choosing).
	hold  bool
	inbox []*rebalance.Table
}

// wevent is one event of the world: fn runs at at; ties run in the order
// they were scheduled.
type wevent struct {
	at  int64
	seq uint64
	fn  func()
}

type weventQueue []*wevent

func (q weventQueue) Len() int { return len(q) }
func (q weventQueue) Less(i, j int) bool {
	return q[i].at < q[j].at || (q[i].at == q[j].at && q[i].seq < q[j].seq)
}
func (q weventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *weventQueue) Push(x any)   { *q = append(*q, x.(*wevent)) }
func (q *weventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

type world struct {
	tb      testing.TB
	seed    uint64
	rng     *rand.Rand
	cfg     rebalance.Config
	policy  *region.Policy
	keys    []string       // key names, in the order of budgets
	rules   []*region.Rule // the policy rule of each key
	budgets []rebalance.Budget
	regions []*wregion
	names   []string
	agents  []*wagent
	dt      int64
	coord   *rebalance.Coordinator
	q       weventQueue
	seq     uint64
	now     int64
	net     netOpts
	cuts    []cut
	demand  [][]float64 // [region][key]: offered cost per second
	lastObs map[*wagent]int64
	tables  []*rebalance.Table // every table any coordinator published, in order
	failed  bool
	trace   []string
	refused int // stale tables the nodes refused
	onTable func(*rebalance.Table)
	maxSum  int64 // the largest Σ shares in force seen, ppm
	maxBSum []int64
	checks  int
	scratch [2][]int64
	// dirty is set when what the regions run may have changed: a node
	// applied a table or lapsed, or a schedule switches on a store's clock
	// now. Otherwise a check would see what the last one saw.
	dirty bool
}

// worldKey is one key of the world's policy: a budget of 1000/s with the
// given burst and strategy.
type worldKey struct {
	burst    int64
	strategy string
}

// newWorld builds a world with agents[r] agents in region r (regions in
// cfg's order, sorted), one key per entry of keys.
func newWorld(tb testing.TB, seed uint64, cfg rebalance.Config, agents []int, keys []worldKey, net netOpts) *world {
	tb.Helper()
	w := &world{
		tb: tb, seed: seed, rng: rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)),
		cfg: cfg, net: net, lastObs: map[*wagent]int64{},
		dt: cfg.Interval.Microseconds(), now: worldStart, dirty: true,
	}
	w.names = slices.Sorted(slices.Values(cfg.Regions))
	var src strings.Builder
	src.WriteString("domains:\n  - domain: w\n    descriptors:\n")
	for i, k := range keys {
		fmt.Fprintf(&src, "      - {key: k, value: k%d, rate_limit: {unit: second, requests_per_unit: 1000, burst: %d, strategy: %s}}\n", i, k.burst, k.strategy)
	}
	pol, err := region.ParsePolicy([]byte(src.String()))
	if err != nil {
		tb.Fatalf("seed %d: policy: %v", seed, err)
	}
	w.policy = pol
	for i := range keys {
		name := region.KeyName("w", []region.Entry{{Key: "k", Value: fmt.Sprintf("k%d", i)}})
		rule, _ := pol.RuleForKey(name)
		b, ok := rule.Budget(name)
		if !ok {
			tb.Fatalf("seed %d: key %s has no budget", seed, name)
		}
		w.keys = append(w.keys, name)
		w.rules = append(w.rules, rule)
		w.budgets = append(w.budgets, b)
	}
	skew := cfg.MaxSkew.Microseconds()
	offset := func() int64 {
		if !net.skew || skew == 0 {
			return 0
		}
		return w.rng.Int64N(skew+1) - skew/2
	}
	for ri, name := range w.names {
		rg := &wregion{name: name, ri: ri, off: offset()}
		mcfg := memstore.DefaultConfig()
		mcfg.Shards = 1
		mcfg.Clock = func() int64 { return w.now + rg.off }
		st, err := memstore.New(mcfg)
		if err != nil {
			tb.Fatal(err)
		}
		rg.store = st
		for j := range agents[ri] {
			ncfg := region.DefaultConfig(name, fmt.Sprintf("%s-%d", name, j), w.names...)
			ncfg.Interval, ncfg.MaxSkew, ncfg.SafeFraction = cfg.Interval, cfg.MaxSkew, cfg.SafeFraction
			ncfg.IdleSafeFraction = cfg.IdleSafeFraction
			ncfg.SafeShare = cfg.SafeShare[name]
			ncfg.Agents = agents[ri]
			n, err := region.NewNode(ncfg, pol, st)
			if err != nil {
				tb.Fatalf("seed %d: NewNode: %v", seed, err)
			}
			a := &wagent{rg: rg, name: ncfg.Agent, node: n, off: offset()}
			rg.agents = append(rg.agents, a)
			w.agents = append(w.agents, a)
		}
		w.regions = append(w.regions, rg)
		w.demand = append(w.demand, make([]float64, len(keys)))
	}
	w.maxBSum = make([]int64, len(keys))
	w.scratch = [2][]int64{make([]int64, len(w.regions)), make([]int64, len(w.regions))}
	c, err := rebalance.NewCoordinator(cfg, w.budgets)
	if err != nil {
		tb.Fatalf("seed %d: NewCoordinator: %v", seed, err)
	}
	c.SetPolicyVersion(pol.Version())
	w.coord = c
	w.updateMembers()
	if err := c.StartTerm(1, nil, w.now); err != nil {
		tb.Fatalf("seed %d: StartTerm: %v", seed, err)
	}
	w.drain()
	w.at(w.now+net.tick[0], w.tick)
	for i, a := range w.agents {
		// Agents' loops start a little apart.
		w.at(w.now+int64(i)*net.agentTick/int64(len(w.agents)), func() { w.agentTick(a) })
	}
	if net.steps && skew > 0 {
		for _, a := range w.agents {
			w.at(w.now+w.dt+w.rng.Int64N(30*w.dt), func() { w.step(a) })
		}
	}
	return w
}

func (w *world) at(t int64, fn func()) {
	w.seq++
	heap.Push(&w.q, &wevent{at: max(t, w.now), seq: w.seq, fn: fn})
}

func (w *world) between(r [2]int64) int64 {
	if r[1] <= r[0] {
		return r[0]
	}
	return r[0] + w.rng.Int64N(r[1]-r[0]+1)
}

// storeNow is region rg's store clock now.
func (w *world) storeNow(rg *wregion) int64 { return w.now + rg.off }

// agentNow is a's time now: its wall clock through its region.Clock.
func (w *world) agentNow(a *wagent) int64 { return a.clock.Now(w.now + a.rg.off + a.off) }

func (w *world) logf(format string, args ...any) {
	const keep = 60
	if len(w.trace) >= keep {
		w.trace = w.trace[1:]
	}
	w.trace = append(w.trace, fmt.Sprintf("%9dµs ", w.now)+fmt.Sprintf(format, args...))
}

func (w *world) fail(format string, args ...any) {
	if w.failed {
		return
	}
	w.failed = true
	w.tb.Errorf("seed %d (replay with -run '%s' -seed %d) at t=%dµs: %s\nlast events:\n%s",
		w.seed, w.tb.Name(), w.seed, w.now, fmt.Sprintf(format, args...), strings.Join(w.trace, "\n"))
}

// run processes events until t (or the first failure), checking the
// invariants after each.
func (w *world) run(until int64) {
	for len(w.q) > 0 && !w.failed {
		if w.q[0].at > until {
			break
		}
		e := heap.Pop(&w.q).(*wevent)
		w.now = e.at
		e.fn()
		w.checkSafety()
	}
	w.now = max(w.now, until)
}

func (w *world) isCut(a *wagent, t int64) bool {
	for _, c := range w.cuts {
		if c.region == a.rg.name && (c.agent == "" || c.agent == a.name) && c.from <= t && t < c.to {
			return true
		}
	}
	return false
}

// addCut partitions a region (agent "") or one agent in [from, to), and
// tells membership about it memberDelay later.
func (w *world) addCut(regionName, agent string, from, to int64) {
	w.cuts = append(w.cuts, cut{regionName, agent, from, to})
	if w.net.memberDelay >= 0 {
		w.at(from+w.net.memberDelay, w.updateMembers)
		w.at(to+w.net.memberDelay, w.updateMembers)
	}
}

// members is who membership sees now, memberDelay behind the truth.
func (w *world) members() []rebalance.Member {
	live := []rebalance.Member{}
	for _, a := range w.agents {
		if !w.isCut(a, w.now-w.net.memberDelay) {
			live = append(live, rebalance.Member{Region: a.rg.name, Agent: a.name})
		}
	}
	return live
}

// updateMembers tells the coordinator who membership sees.
func (w *world) updateMembers() {
	if w.net.memberDelay < 0 {
		return
	}
	if err := w.coord.MemberChange(w.members()); err != nil {
		w.fail("MemberChange: %v", err)
	}
}

func (w *world) tick() {
	w.coord.Tick(w.now)
	w.drain()
	w.at(w.now+w.between(w.net.tick), w.tick)
}

// drain takes the coordinator's tables, checks each and sends it to every
// agent.
func (w *world) drain() {
	for _, tb := range w.coord.Ready() {
		w.checkTable(tb)
		w.tables = append(w.tables, tb)
		w.logf("publish %s", tableString(tb))
		if w.onTable != nil {
			w.onTable(tb)
		}
		for _, a := range w.agents {
			w.send(a, tb)
		}
	}
	w.coord.Advance()
}

func tableString(tb *rebalance.Table) string {
	var b strings.Builder
	fmt.Fprintf(&b, "(%d,%d) issued %d eff %d leases %v agents %v", tb.Term, tb.Epoch, tb.Issued, tb.Effective, tb.Leases, tb.Agents)
	for _, k := range tb.Keys {
		fmt.Fprintf(&b, " %s%v%v", strings.TrimPrefix(k.Key, "w/k="), k.Shares, k.Bursts)
	}
	return b.String()
}

// checkTable holds one table to the rules every table keeps.
func (w *world) checkTable(tb *rebalance.Table) {
	if n := len(w.tables); n > 0 && !tb.Newer(w.tables[n-1].Term, w.tables[n-1].Epoch) {
		w.fail("table (%d,%d) is not ordered after the previous (%d,%d)", tb.Term, tb.Epoch, w.tables[n-1].Term, w.tables[n-1].Epoch)
	}
	if tb.Effective < tb.Issued {
		w.fail("table (%d,%d) effective %d before issued %d", tb.Term, tb.Epoch, tb.Effective, tb.Issued)
	}
	// A learning term's tables leave the keys new to it out (rebalance's
	// omitCold): the rows are the budgets' keys, in order, some missing.
	if !slices.Equal(tb.Regions, w.names) || len(tb.Leases) != len(w.names) || len(tb.Agents) != len(w.names) || len(tb.Keys) > len(w.budgets) {
		w.fail("table (%d,%d) malformed: %s", tb.Term, tb.Epoch, tableString(tb))
		return
	}
	// Every row gives each region at least its idle floor (a region with
	// recent demand keeps its safe share, which the safety checks hold).
	floor := make([]uint32, len(w.names))
	idle := w.cfg.IdleSafeFraction
	for ri := range w.names {
		floor[ri] = w.regions[ri].agents[0].node.SafeShare()
		if idle > 0 {
			floor[ri] = min(floor[ri], uint32(idle*rebalance.PPM/float64(len(w.names))))
		}
	}
	next := 0
	for _, ks := range tb.Keys {
		for next < len(w.budgets) && w.budgets[next].Key != ks.Key {
			next++
		}
		if next == len(w.budgets) {
			w.fail("table (%d,%d) key %q: not a budget's, or out of order", tb.Term, tb.Epoch, ks.Key)
			return
		}
		next++
		if err := rebalance.CheckShares(ks.Shares, floor, false); err != nil {
			w.fail("table (%d,%d) key %s: %v", tb.Term, tb.Epoch, ks.Key, err)
		}
	}
}

// send puts tb on the network to a: lost, delayed, and sometimes delivered
// a second time late (after newer tables, so it must be refused).
func (w *world) send(a *wagent, tb *rebalance.Table) {
	if a.hold {
		a.inbox = append(a.inbox, tb)
		return
	}
	if w.rng.Float64() < w.net.dropP {
		return
	}
	d := w.between(w.net.tableDelay)
	w.at(w.now+d, func() { w.deliver(a, tb) })
	if w.rng.Float64() < w.net.lateP {
		w.at(w.now+d+w.between(w.net.lateDelay), func() { w.deliver(a, tb) })
	}
}

// deliver hands tb to a's node, as the agent's loop does (Apply at its
// clock), unless a is cut off.
func (w *world) deliver(a *wagent, tb *rebalance.Table) {
	if w.isCut(a, w.now) {
		return
	}
	term, epoch := a.node.Table().Term, a.node.Table().Epoch
	err := a.node.Apply(tb, w.agentNow(a))
	switch {
	case errors.Is(err, region.ErrStaleTable):
		w.refused++
		if !a.node.Table().HasTable || tb.Newer(term, epoch) {
			w.fail("%s refused (%d,%d), newer than the (%d,%d) it holds", a.name, tb.Term, tb.Epoch, term, epoch)
		}
		return
	case err != nil:
		w.fail("%s: Apply (%d,%d): %v", a.name, tb.Term, tb.Epoch, err)
		return
	}
	w.logf("%s applies (%d,%d) at %d, named %v", a.name, tb.Term, tb.Epoch, w.agentNow(a), a.node.Table().Named)
	w.dirty = true
	w.watchSwitches(a)
}

// watchSwitches puts a check event at every instant one of a's schedules
// switches on its store's clock.
func (w *world) watchSwitches(a *wagent) {
	for k, name := range w.keys {
		if s := a.node.Schedule(w.rules[k], name); s.HasPrevious {
			if at := s.Current.Effective - a.rg.off; at > w.now {
				w.at(at, func() { w.dirty = true })
			}
		}
	}
}

// agentTick is one turn of a's loop, in the shell's order: Tick (the
// report of a closed interval, the lease lapse), then the acknowledgement
// of InForce when it changed. It also decides one request on a random key,
// so the store runs every schedule the node makes.
func (w *world) agentTick(a *wagent) {
	defer w.at(w.now+w.net.agentTick, func() { w.agentTick(a) })
	now := w.agentNow(a)
	lapsed := a.node.Table().Lapsed
	rep := a.node.Tick(now)
	if l := a.node.Table().Lapsed; l != lapsed {
		w.logf("%s lapses at %d (lease %d)", a.name, now, a.node.Table().LeaseExpiry)
		w.dirty = true
		w.watchSwitches(a)
	}
	var d region.Decision
	k := w.rng.IntN(len(w.keys))
	r := &region.Request{Domain: "w", Descriptors: []region.Descriptor{{Entries: []region.Entry{{Key: "k", Value: fmt.Sprintf("k%d", k)}}}}, Cost: 1}
	if err := a.node.Decide(context.Background(), now, r, &d); err != nil {
		w.fail("%s: Decide: %v", a.name, err)
	}
	if d.Fallback {
		w.fail("%s: the store refused a decision on %s: %+v", a.name, w.keys[k], d.Matches)
	}
	if w.isCut(a, w.now) {
		return
	}
	if rep != nil {
		w.sendReport(a, rep)
	}
	term, epoch := a.node.InForce(now)
	if tv := [2]uint64{term, epoch}; tv != a.acked && term > 0 {
		a.acked = tv
		w.at(w.now+w.between(w.net.ackDelay), func() {
			if w.isCut(a, w.now) {
				return
			}
			w.logf("%s acks (%d,%d)", a.name, term, epoch)
			if err := w.coord.Ack(a.rg.name, a.name, term, epoch); err != nil {
				w.fail("Ack: %v", err)
			}
		})
	}
}

// step moves a's wall clock to another offset within the bound (a step
// back is clamped by its region.Clock), and schedules the next step.
func (w *world) step(a *wagent) {
	skew := w.cfg.MaxSkew.Microseconds()
	old := a.off
	a.off = w.rng.Int64N(skew+1) - skew/2
	w.logf("%s wall clock steps %+dµs", a.name, a.off-old)
	w.at(w.now+w.dt+w.rng.Int64N(10*w.dt), func() { w.step(a) })
}

// sendReport sends the node's report with the world's demand for a's
// region (its part of it) in place of the requests the node recorded.
func (w *world) sendReport(a *wagent, rep *rebalance.Report) {
	n := float64(len(a.rg.agents))
	rep.Keys = rep.Keys[:0]
	for k, b := range w.budgets {
		d := w.demand[a.rg.ri][k] * w.cfg.Interval.Seconds() / n
		if w.net.noise {
			d *= 0.8 + 0.4*w.rng.Float64()
		}
		if c := int64(d); c > 0 {
			rep.Keys = append(rep.Keys, rebalance.KeyDemand{Key: b.Key, Demand: rebalance.Demand{Offered: c, OfferedCost: c, Admitted: c}})
		}
	}
	slices.SortFunc(rep.Keys, func(x, y rebalance.KeyDemand) int { return strings.Compare(x.Key, y.Key) })
	w.at(w.now+w.between(w.net.reportDelay), func() { w.observe(a, rep) })
}

func (w *world) observe(a *wagent, r *rebalance.Report) {
	if w.isCut(a, w.now) {
		return
	}
	err := w.coord.Observe(r, w.now)
	last, seen := w.lastObs[a]
	switch {
	case seen && r.Interval <= last:
		if !errors.Is(err, rebalance.ErrBadReport) {
			w.fail("Observe of %s interval %d after %d: got %v, want ErrBadReport", a.name, r.Interval, last, err)
		}
	case err != nil:
		w.fail("Observe of %s interval %d: %v", a.name, r.Interval, err)
	default:
		w.lastObs[a] = r.Interval
	}
}

// failover replaces the coordinator as gossip's coordinate does: a new one
// with the same config and budgets learns membership, then starts the next
// term from the latest table the old one stored; the old one is never
// ticked again (its tables in flight still arrive).
func (w *world) failover() {
	old := w.coord
	c, err := rebalance.NewCoordinator(w.cfg, w.budgets)
	if err != nil {
		w.fail("NewCoordinator: %v", err)
		return
	}
	c.SetPolicyVersion(w.policy.Version())
	w.coord = c
	w.lastObs = map[*wagent]int64{}
	w.updateMembers()
	latest := old.Latest()
	w.logf("failover to term %d from %s", old.Term()+1, tableString(latest))
	if err := c.StartTerm(old.Term()+1, latest, w.now); err != nil {
		w.fail("StartTerm: %v", err)
		return
	}
	w.drain()
}

// inForce is the limit a's store enforces for key index k on a's next
// decision: the version of a's schedule for it that the store's clock
// selects.
func (w *world) inForce(a *wagent, k int) gcra.Limit {
	s := a.node.Schedule(w.rules[k], w.keys[k])
	if s.HasPrevious && w.storeNow(a.rg) < s.Current.Effective {
		return s.Previous.Limit
	}
	return s.Current.Limit
}

// shareOf is limit l of budget as a share in ppm: the smallest share whose
// regional limit (T_r = ceil(T·10⁶/s)) has l's interval or a longer one,
// ceil(T·10⁶/T_r). Shares in force summing to at most PPM mean the rates
// do (Σ 1/T_r ≤ 1/T).
func shareOf(budget, l gcra.Limit) int64 {
	if l.IsZero() {
		return 0
	}
	num := budget.IntervalMicros() * rebalance.PPM
	return (num + l.IntervalMicros() - 1) / l.IntervalMicros()
}

// sumInForce returns, for key index k, Σ over regions of the largest share
// any of the region's agents runs, and the same for bursts; per and bper
// (len(regions) each) receive the regions' parts.
func (w *world) sumInForce(k int, per, bper []int64) (sum, bsum int64) {
	for ri, rg := range w.regions {
		per[ri], bper[ri] = 0, 0
		for _, a := range rg.agents {
			l := w.inForce(a, k)
			per[ri] = max(per[ri], shareOf(w.budgets[k].Limit, l))
			bper[ri] = max(bper[ri], l.Burst())
		}
		sum += per[ri]
		bsum += bper[ri]
	}
	return sum, bsum
}

func (w *world) checkSafety() {
	if w.failed || !w.dirty {
		return
	}
	w.dirty = false
	w.checks++
	per, bper := w.scratch[0][:len(w.regions)], w.scratch[1][:len(w.regions)]
	for k := range w.budgets {
		sum, bsum := w.sumInForce(k, per, bper)
		w.maxSum = max(w.maxSum, sum)
		w.maxBSum[k] = max(w.maxBSum[k], bsum)
		if b := w.budgets[k].Limit.Burst(); bsum > b {
			w.fail("key %s: Σ bursts in force %d > the budget's %d (per region %v)\n%s", w.keys[k], bsum, b, bper, w.detail(k))
			return
		}
		if sum > rebalance.PPM {
			w.fail("key %s: Σ in force %d > %d ppm (per region %v)\n%s", w.keys[k], sum, rebalance.PPM, per, w.detail(k))
			return
		}
	}
}

// detail describes what every agent runs for key index k.
func (w *world) detail(k int) string {
	var out []string
	for _, a := range w.agents {
		st := a.node.Table()
		s := a.node.Schedule(w.rules[k], w.keys[k])
		out = append(out, fmt.Sprintf("%s clock %d store %d table (%d,%d) named %v lapsed %v lease %d: %v in force, schedule %+v",
			a.name, w.agentNow(a), w.storeNow(a.rg), st.Term, st.Epoch, st.Named, st.Lapsed, st.LeaseExpiry, w.inForce(a, k), s))
	}
	return strings.Join(out, "\n")
}

// randomWorld draws a world: 3–5 regions of 1–3 agents, 3–5 keys (some
// with a burst of 3, below or at the number of regions, and sometimes
// unequal floors), adversarial delivery, region partitions (some longer
// than a lease), demand shifting between regions, skewed and stepping
// clocks, and usually a failover mid-run. With agentCuts, single agents
// are partitioned too.
func randomWorld(tb testing.TB, seed uint64, agentCuts bool) (*world, int64) {
	rng := rand.New(rand.NewPCG(seed, 1))
	names := []string{"af", "ap", "eu", "sa", "us"}
	rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	regions := names[:3+rng.IntN(3)]
	cfg := worldConfig(regions...)
	const agentTick = 2 * ms // Δ/50, as the shell's 100 ms is of the default 5 s
	cfg.Lease = time.Duration(3+rng.IntN(5)) * cfg.Interval
	// The shell ticks its node every 100 ms against a MaxSkew of 500 ms; a
	// lease lapses at the agent's first tick past it, so MaxSkew must
	// cover a tick.
	cfg.MaxSkew = time.Duration(agentTick)*time.Microsecond + time.Duration(rng.IntN(39))*time.Millisecond
	cfg.Fence = 2*cfg.MaxSkew + time.Duration(rng.IntN(60))*time.Millisecond
	cfg.StaleAfter = 1 + rng.IntN(4)
	if rng.IntN(3) == 0 {
		// Unequal floors an operator chose, up to 90 % in all: one region
		// may keep most of every budget.
		cfg.SafeShare = map[string]uint32{}
		left := rng.Int64N(900_001)
		for _, r := range regions {
			s := 1 + rng.Int64N(left+1) // 0 would mean "the default" to a node
			cfg.SafeShare[r] = uint32(s)
			left -= s
		}
	}
	agents := make([]int, len(regions))
	for i := range agents {
		agents[i] = 1 + rng.IntN(3)
	}
	strats := []string{"proportional", "ewma", "maxmin"}
	var keys []worldKey
	for range 3 + rng.IntN(3) {
		burst := int64(100)
		switch rng.IntN(4) {
		case 0:
			burst = 3
		case 1:
			burst = int64(len(regions)) + 1
		}
		keys = append(keys, worldKey{burst: burst, strategy: strats[rng.IntN(len(strats))]})
	}
	dt := cfg.Interval.Microseconds()
	net := netOpts{
		tableDelay:  [2]int64{0, (1 + rng.Int64N(3)) * dt},
		reportDelay: [2]int64{0, dt / 2},
		ackDelay:    [2]int64{0, dt / 2},
		lateDelay:   [2]int64{dt, 6 * dt},
		dropP:       0.05 + 0.2*rng.Float64(),
		lateP:       0.2 * rng.Float64(),
		tick:        [2]int64{2 * ms, 8 * ms},
		agentTick:   agentTick,
		memberDelay: rng.Int64N(2 * dt),
		skew:        true,
		steps:       rng.IntN(2) == 0,
		noise:       true,
	}
	if rng.IntN(4) == 0 {
		net.memberDelay = -1
	}
	w := newWorld(tb, seed, cfg, agents, keys, net)
	end := 40 * dt
	// Agents that join late: cold (no table) and unknown to membership
	// until then, then named by the tables after membership sees them.
	for range rng.IntN(3) {
		a := w.agents[rng.IntN(len(w.agents))]
		w.addCut(a.rg.name, a.name, worldStart, worldStart+dt/2+rng.Int64N(10*dt))
	}
	for range rng.IntN(4) {
		from := worldStart + dt + rng.Int64N(end-dt)
		w.addCut(w.names[rng.IntN(len(w.names))], "", from, from+dt/2+rng.Int64N(12*dt))
	}
	if agentCuts {
		for range 2 + rng.IntN(4) {
			a := w.agents[rng.IntN(len(w.agents))]
			from := worldStart + dt + rng.Int64N(end-dt)
			w.addCut(a.rg.name, a.name, from, from+dt/2+rng.Int64N(12*dt))
		}
	}
	shift := func() {
		for ri := range w.regions {
			for k := range keys {
				switch rng.IntN(4) {
				case 0:
					w.demand[ri][k] = 0
				case 1:
					w.demand[ri][k] = 50 * rng.Float64()
				default:
					w.demand[ri][k] = 2000 * rng.Float64()
				}
			}
		}
	}
	shift()
	var next func()
	next = func() {
		// Move one region's demand for one key, or everything at once.
		if rng.IntN(5) == 0 {
			shift()
		} else {
			w.demand[rng.IntN(len(w.regions))][rng.IntN(len(keys))] = 3000 * rng.Float64()
		}
		w.at(w.now+dt/2+rng.Int64N(3*dt), next)
	}
	w.at(worldStart+dt, next)
	if rng.IntN(10) < 7 {
		w.at(worldStart+end/4+rng.Int64N(end/2), w.failover)
	}
	return w, worldStart + end
}

// TestTransitionRandom is the headline safety test: real nodes applying
// tables in adversarial orders and delays never let Σ shares in force, or Σ
// bursts in force, exceed the budget at any instant, across partitions
// (regions and single agents cut off while their lease lapses, late tables
// after a reconnect), skewed and stepping clocks and coordinator failovers.
func TestTransitionRandom(t *testing.T) {
	for _, tc := range []struct {
		name      string
		agentCuts bool
	}{
		{"region-partitions", false},
		// Single agents cut off while the rest of their region reports.
		{"agent-partitions", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := *worldSeeds
			if n == 0 {
				n = 120
				if raceEnabled() {
					n = 20
				}
			}
			var seeds []uint64
			if *worldSeed != 0 {
				seeds = append(seeds, *worldSeed)
			} else {
				for i := range n {
					seeds = append(seeds, uint64(i+1))
				}
			}
			failures, refused, tables, checks := 0, 0, 0, 0
			maxSum := int64(0)
			for _, seed := range seeds {
				w, end := randomWorld(t, seed, tc.agentCuts)
				w.run(end)
				refused += w.refused
				tables += len(w.tables)
				checks += w.checks
				maxSum = max(maxSum, w.maxSum)
				if *worldSeed != 0 {
					t.Logf("seed %d trace (last %d events):\n%s", seed, len(w.trace), strings.Join(w.trace, "\n"))
				}
				if w.failed {
					failures++
					if failures >= 3 {
						t.Fatalf("stopping after %d failing seeds", failures)
					}
				}
			}
			t.Logf("%d seeds, %d tables, %d stale tables refused, %d checks, largest Σ in force %d ppm", len(seeds), tables, refused, checks, maxSum)
			if refused == 0 && len(seeds) > 10 {
				t.Error("no stale table was ever delivered late: the world is not adversarial enough")
			}
		})
	}
}

// quietNet delivers everything at once, in order, with no skew.
func quietNet() netOpts {
	return netOpts{tick: [2]int64{5 * ms, 5 * ms}, agentTick: 2 * ms, memberDelay: 0}
}

// twoRegionWorld is a scripted world of regions a and b, one agent each,
// one proportional key, where a holds most of the budget.
func twoRegionWorld(t *testing.T, net netOpts) *world {
	t.Helper()
	w := newWorld(t, 0, worldConfig("a", "b"), []int{1, 1}, []worldKey{{100, "proportional"}}, net)
	w.demand[0][0], w.demand[1][0] = 900, 100
	w.run(w.now + 10*w.dt)
	return w
}

func lastTable(w *world) *rebalance.Table { return w.tables[len(w.tables)-1] }

// safeLimit is what region ri runs key index k at when it runs its safe
// share.
func (w *world) safeLimit(ri, k int) gcra.Limit {
	return region.SafeLimit(w.budgets[k].Limit, w.regions[ri].agents[0].node.SafeShare(), len(w.regions))
}

// floor is region ri's safe share, ppm.
func (w *world) floor(ri int) uint32 { return w.regions[ri].agents[0].node.SafeShare() }

// checkNow fails the test when the invariants do not hold now.
func (w *world) checkNow(t *testing.T) {
	t.Helper()
	w.dirty = true
	w.checkSafety()
	if w.failed {
		t.FailNow()
	}
}

// A late decrease delivered after a reconnect: region a is cut off just as
// demand moves to b; the coordinator decreases a, waits for a's lease plus
// skew and gives b the rest. When a comes back, the tables it missed arrive
// in an adversarial order — the decrease first, the newest next, and the
// oldest (with a's old, larger share) last, which a's node must refuse.
func TestTransitionLateDecreaseAfterReconnect(t *testing.T) {
	w := twoRegionWorld(t, quietNet())
	a := w.regions[0].agents[0]
	before := lastTable(w)
	if s := before.Keys[0].Shares[0]; s < 800_000 {
		t.Fatalf("setup: a's share %d, want most of the budget", s)
	}
	cutAt, back := w.now, w.now+12*w.dt
	w.addCut("a", "", cutAt, back)
	a.hold = true
	w.demand[0][0], w.demand[1][0] = 100, 900
	w.run(back - 1)
	var dec *rebalance.Table
	for _, tb := range a.inbox {
		if dec == nil && tb.Keys[0].Shares[0] < before.Keys[0].Shares[0] {
			dec = tb
		}
	}
	if dec == nil {
		t.Fatal("no decrease of a was published while a was cut off")
	}
	if got := lastTable(w).Keys[0].Shares[1]; got <= before.Keys[0].Shares[1] {
		t.Fatalf("b's share %d never rose above %d while a was away", got, before.Keys[0].Shares[1])
	}
	if got, want := w.inForce(a, 0), w.safeLimit(0, 0); got != want {
		t.Fatalf("a runs %v after its lease lapsed, want its safe limit %v", got, want)
	}
	inbox := a.inbox
	a.hold, a.inbox = false, nil
	w.run(back)
	order := []*rebalance.Table{dec, inbox[len(inbox)-1], before}
	for i, tb := range order {
		w.at(back+int64(i)*ms, func() { w.deliver(a, tb) })
	}
	refused := w.refused
	w.run(back + 20*w.dt)
	if w.refused <= refused {
		t.Error("a accepted a table older than the one it held")
	}
	w.checkNow(t)
	t.Logf("largest Σ in force %d ppm", w.maxSum)
}

// A region cut off while its lease lapses: it keeps its share in every
// table until its last lease plus the maximum skew, then gets exactly its
// floor and the others share the rest; its agents fall to the safe share
// when their own clocks pass the lease; Σ in force never exceeds PPM; and
// when it returns it gets more than its floor again within an interval
// (plus the others' break before make).
func TestTransitionRegionCutWhileLeaseLapses(t *testing.T) {
	net := quietNet()
	net.skew = true
	net.tableDelay = [2]int64{0, 30 * ms}
	cfg := worldConfig("a", "b", "c")
	w := newWorld(t, 7, cfg, []int{2, 1, 1}, []worldKey{{100, "proportional"}, {100, "ewma"}, {3, "maxmin"}}, net)
	for k := range 3 {
		w.demand[0][k], w.demand[1][k], w.demand[2][k] = 600, 300, 100
	}
	w.run(w.now + 10*w.dt)
	held := slices.Clone(lastTable(w).Keys[0].Shares)
	cutAt := w.now
	back := cutAt + 20*w.dt
	w.addCut("a", "", cutAt, back)
	var lastLease int64 // a's lease in the last table that renewed it
	firstFloor := -1
	skew := cfg.MaxSkew.Microseconds()
	w.onTable = func(tb *rebalance.Table) {
		if tb.Leases[0] > lastLease {
			lastLease = tb.Leases[0]
		}
		s := tb.Keys[0].Shares
		switch {
		case tb.Issued < lastLease+skew && tb.Issued < back:
			if s[0] != held[0] {
				t.Errorf("table (%d,%d) at %d gives a %d before a's lease %d + skew, want %d", tb.Term, tb.Epoch, tb.Issued, s[0], lastLease, held[0])
			}
		case tb.Issued < back:
			if firstFloor < 0 {
				firstFloor = len(w.tables)
			}
			if s[0] != w.floor(0) {
				t.Errorf("table (%d,%d) at %d gives silent a %d, want its floor %d", tb.Term, tb.Epoch, tb.Issued, s[0], w.floor(0))
			}
		}
	}
	w.run(back - 1)
	if firstFloor < 0 {
		t.Fatal("a never fell to its floor while cut off")
	}
	for _, ks := range lastTable(w).Keys {
		if ks.Shares[0] != w.floor(0) || ks.Shares[1]+ks.Shares[2] != rebalance.PPM-w.floor(0) {
			t.Errorf("key %s while a is away: %v, want a at its floor %d and b+c = %d", ks.Key, ks.Shares, w.floor(0), rebalance.PPM-w.floor(0))
		}
	}
	for _, ag := range w.regions[0].agents {
		for k := range w.keys {
			if got, want := w.inForce(ag, k), w.safeLimit(0, k); got != want {
				t.Errorf("%s runs %s at %v with its lease lapsed, want %v", ag.name, w.keys[k], got, want)
			}
		}
	}
	w.onTable = nil
	w.run(back + 2*w.dt + 100*ms)
	if s := lastTable(w).Keys[0].Shares[0]; s <= w.floor(0) {
		t.Errorf("a back for two intervals still gets %d, want more than its floor %d", s, w.floor(0))
	}
	t.Logf("largest Σ in force %d ppm, Σ bursts %v", w.maxSum, w.maxBSum)
}

// A coordinator failover mid-transition: the decrease is out, a's agent is
// cut off so the increase waits; the coordinator fails over; the new one
// republishes the decrease's shares (never reset), names the agents the
// stored table named, learns, and only then rebalances. Tables of the old
// term still in flight arrive afterwards and are refused. Σ in force never
// exceeds PPM.
func TestTransitionFailoverMidTransition(t *testing.T) {
	net := quietNet()
	net.tableDelay = [2]int64{0, 20 * ms}
	net.lateP, net.lateDelay = 1, [2]int64{3 * 100 * ms, 3 * 100 * ms}
	w := newWorld(t, 3, worldConfig("a", "b", "c"), []int{1, 2, 1}, []worldKey{{100, "proportional"}, {100, "ewma"}}, net)
	for k := range 2 {
		w.demand[0][k], w.demand[1][k], w.demand[2][k] = 800, 100, 100
	}
	w.run(w.now + 10*w.dt)
	w.addCut("a", "", w.now, w.now+8*w.dt)
	for k := range 2 {
		w.demand[0][k], w.demand[1][k], w.demand[2][k] = 100, 800, 100
	}
	// Wait for the decrease of a: its increase waits for a's agent.
	prev := lastTable(w)
	var dec *rebalance.Table
	w.onTable = func(tb *rebalance.Table) {
		if dec == nil && tb.Keys[0].Shares[0] < prev.Keys[0].Shares[0] {
			dec = tb
		}
	}
	for deadline := w.now + 4*w.dt; dec == nil && w.now < deadline && !w.failed; {
		w.run(w.now + ms)
	}
	w.onTable = nil
	if dec == nil {
		t.Fatal("setup: no decrease began")
	}
	w.run(w.now + 20*ms)
	stored := w.coord.Latest()
	if stored.Keys[0].Shares[1] > prev.Keys[0].Shares[1] {
		t.Fatal("setup: the increase went out before the failover")
	}
	oldTerm := w.coord.Term()
	w.failover()
	first := lastTable(w)
	if first.Term != oldTerm+1 || !first.Newer(stored.Term, stored.Epoch) {
		t.Errorf("first table of the new term is (%d,%d), stored (%d,%d)", first.Term, first.Epoch, stored.Term, stored.Epoch)
	}
	for k := range first.Keys {
		if !slices.Equal(first.Keys[k].Shares, stored.Keys[k].Shares) {
			t.Errorf("key %s: new term republished %v, stored %v", first.Keys[k].Key, first.Keys[k].Shares, stored.Keys[k].Shares)
		}
	}
	for ri := range stored.Agents {
		for _, a := range stored.Agents[ri] {
			if !slices.Contains(first.Agents[ri], a) {
				t.Errorf("the new term's first table names %v in %s, not the stored table's %s", first.Agents[ri], stored.Regions[ri], a)
			}
		}
	}
	if !w.coord.Learning() {
		t.Error("the new coordinator is not learning")
	}
	w.run(w.now + 30*w.dt)
	if w.coord.Learning() {
		t.Error("still learning after a lease plus skew")
	}
	if w.refused == 0 {
		t.Error("no table of the old term arrived late to be refused")
	}
	if s := lastTable(w).Keys[0].Shares[1]; s <= stored.Keys[0].Shares[1] {
		t.Errorf("b's share %d never rose above %d after the failover", s, stored.Keys[0].Shares[1])
	}
	t.Logf("largest Σ in force %d ppm, %d stale tables refused", w.maxSum, w.refused)
}

// One agent of a two-agent region is cut off. It stops reporting and goes
// stale, and membership drops it, while it still runs the region's old,
// larger share under a lease that has not lapsed; the coordinator keeps
// naming it until that lease plus skew, so a decrease of the region waits
// for it too, and Σ in force never exceeds PPM.
func TestTransitionAgentCutOffStillWaitedFor(t *testing.T) {
	cfg := worldConfig("a", "b")
	cfg.Lease = 2 * time.Second // 20 Δ: far longer than StaleAfter·Δ
	w := newWorld(t, 0, cfg, []int{2, 1}, []worldKey{{100, "proportional"}}, quietNet())
	w.demand[0][0], w.demand[1][0] = 900, 0 // a holds all but b's floor, whatever a's demand
	w.run(w.now + 10*w.dt)
	a1 := w.regions[0].agents[1]
	w.addCut("a", a1.name, w.now, w.now+30*w.dt)
	w.run(w.now + 5*w.dt) // a1 is stale now and membership dropped it
	if named := lastTable(w).Agents[0]; !slices.Contains(named, a1.name) {
		t.Errorf("tables name %v in a, not the cut-off %s whose lease runs", named, a1.name)
	}
	if got := shareOf(w.budgets[0].Limit, w.inForce(a1, 0)); got <= int64(w.floor(0)) {
		t.Fatalf("setup: %s runs %d ppm, want a's large share", a1.name, got)
	}
	w.demand[0][0], w.demand[1][0] = 100, 900
	w.run(w.now + 30*w.dt)
	w.checkNow(t)
	if s := lastTable(w).Keys[0].Shares[1]; s <= w.floor(1) {
		t.Errorf("b's share %d never rose once a1's lease had passed", s)
	}
	t.Logf("largest Σ in force %d ppm", w.maxSum)
}
