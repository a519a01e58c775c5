package rebalance

import (
	"container/heap"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/gcra"
)

// The transition tests run the real Coordinator in a deterministic
// discrete-event world, in the style of etcd/raft's network tests: one
// goroutine, a virtual clock in µs, an event queue, and every source of
// randomness derived from one printed seed. Agents hold the newest table
// they accepted and run its shares from its Effective on, or their floor
// once their clock passes its lease; tables, reports and acknowledgements
// travel with delays, are lost, arrive late and out of order, and stop at
// partitions. After every event the world checks invariant 1: for every
// key, Σ over regions of the largest share any of the region's agents has
// in force is at most PPM.

var (
	transitionSeed  = flag.Uint64("transition.seed", 0, "run TestTransitionRandom with only this seed (0: the fixed seeds)")
	transitionSeeds = flag.Int("transition.seeds", 120, "how many seeds TestTransitionRandom runs")
)

const ms = int64(1000) // µs

// worldConfig is the configuration the world tests run with: Δ = 100 ms
// of virtual time so that a run of dozens of intervals is cheap.
func worldConfig(regions ...string) Config {
	cfg := DefaultConfig(regions...)
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
	reportJitter                      int64    // a report of interval i leaves at (i+1)Δ + [0, jitter]
	memberDelay                       int64    // membership notices a partition this late; < 0: no membership
	skew                              bool     // agents' clocks are offset within ±MaxSkew/2
	noise                             bool     // each report's counts vary by ±20 %
}

// cut is a partition: agent (or every agent of region when agent is "")
// neither receives tables nor sends reports or acks in [from, to).
type cut struct {
	region, agent string
	from, to      int64
}

type wagent struct {
	region string
	ri     int
	name   string
	off    int64    // clock offset, µs: the agent's clock reads t+off at t
	held   []*Table // accepted tables, oldest first; held[0] is in force or nothing is yet
	acked  [2]uint64
	// hold keeps tables sent to the agent in inbox instead of the network
	// (scripted tests deliver them later, in an order of their choosing).
	hold  bool
	inbox []*Table
}

// offer is the agent's acceptance rule: a table is accepted only when it
// is ordered after the newest table the agent holds.
func (a *wagent) offer(tb *Table) bool {
	if n := len(a.held); n > 0 && !tb.Newer(a.held[n-1].Term, a.held[n-1].Epoch) {
		return false
	}
	a.held = append(a.held, tb)
	return true
}

// inForce returns the newest held table whose Effective has passed on the
// agent's clock at t (nil: none yet), dropping the older ones for good.
func (a *wagent) inForce(t int64) *Table {
	clock := t + a.off
	for i := len(a.held) - 1; i >= 0; i-- {
		if a.held[i].Effective <= clock {
			a.held = a.held[i:]
			return a.held[0]
		}
	}
	return nil
}

// share is what the agent runs for key index k at t: the in-force table's
// share, or min(share, floor) once its clock passes the table's lease for
// its region or when that table does not name it (ARCHITECTURE.md: "an
// agent no table names runs at min(last share, safe_r)"); the floor when it
// has no table in force yet (a cold start).
func (a *wagent) share(t int64, k int, floor uint32) uint32 {
	tb := a.inForce(t)
	if tb == nil {
		return floor
	}
	s := tb.Keys[k].Shares[a.ri]
	if t+a.off >= tb.Leases[a.ri] || !slices.Contains(tb.Agents[a.ri], a.name) {
		s = min(s, floor)
	}
	return s
}

// burst is the burst the agent runs for key index k at t, as the region
// core does: the in-force table's (its row's Bursts, or split from its
// shares), min(that, the floor's burst) past the lease or unnamed; the
// floor's burst cold. The floor's burst is region.SafeLimit's: the
// budget's burst times the floor, rounded down, at least 1 when the burst
// has a unit per region.
func (a *wagent) burst(t int64, k int, floor uint32, budget gcra.Limit, regions int) int64 {
	fb := budget.Burst() * int64(floor) / PPM
	if fb == 0 && budget.Burst() >= int64(regions) {
		fb = 1
	}
	tb := a.inForce(t)
	if tb == nil {
		return fb
	}
	ks := &tb.Keys[k]
	var la [16]gcra.Limit
	b := ks.Limits(la[:0])[a.ri].Burst()
	if t+a.off >= tb.Leases[a.ri] || !slices.Contains(tb.Agents[a.ri], a.name) {
		b = min(b, fb)
	}
	return b
}

type event struct {
	at  int64
	seq uint64
	fn  func()
}

type eventQueue []*event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	return q[i].at < q[j].at || (q[i].at == q[j].at && q[i].seq < q[j].seq)
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

type world struct {
	tb       testing.TB
	seed     uint64
	rng      *rand.Rand
	cfg      Config
	budgets  []Budget
	regions  []string
	floors   []uint32
	dt       int64
	agents   []*wagent
	byRegion [][]*wagent
	coord    *Coordinator
	q        eventQueue
	seq      uint64
	now      int64
	net      netOpts
	cuts     []cut
	demand   [][]float64 // [region][key]: offered cost per second
	lastObs  map[*wagent]int64
	tables   []*Table // every table any coordinator published, in order
	failed   bool
	trace    []string
	refused  int // stale tables the agents refused
	onTable  func(*Table)
	maxSum   uint32 // the largest Σ in force seen
}

// newWorld builds a world with agents[r] agents in region r, every key a
// budget of 1000/s with burst 100 and the given strategies.
func newWorld(tb testing.TB, seed uint64, cfg Config, agents []int, strategies []string, net netOpts) *world {
	tb.Helper()
	w := &world{
		tb: tb, seed: seed, rng: rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)),
		cfg: cfg, net: net, lastObs: map[*wagent]int64{},
		dt: int64(cfg.Interval / time.Microsecond),
	}
	w.regions = slices.Sorted(slices.Values(cfg.Regions))
	w.floors = cfg.safe(w.regions)
	for i, s := range strategies {
		w.budgets = append(w.budgets, Budget{Key: fmt.Sprintf("k%d", i), Limit: gcra.PerSecond(1000, 100), Strategy: s})
	}
	skew := int64(cfg.MaxSkew / time.Microsecond)
	w.byRegion = make([][]*wagent, len(w.regions))
	for ri, r := range w.regions {
		for j := range agents[ri] {
			a := &wagent{region: r, ri: ri, name: fmt.Sprintf("%s-%d", r, j)}
			if net.skew && skew > 0 {
				a.off = w.rng.Int64N(skew+1) - skew/2
			}
			w.agents = append(w.agents, a)
			w.byRegion[ri] = append(w.byRegion[ri], a)
		}
		w.demand = append(w.demand, make([]float64, len(strategies)))
	}
	c, err := NewCoordinator(cfg, w.budgets)
	if err != nil {
		tb.Fatalf("seed %d: NewCoordinator: %v", seed, err)
	}
	w.coord = c
	w.updateMembers()
	if err := c.StartTerm(1, nil, 0); err != nil {
		tb.Fatalf("seed %d: StartTerm: %v", seed, err)
	}
	w.drain()
	w.at(net.tick[0], w.tick)
	w.at(w.dt, w.reportRound)
	return w
}

func (w *world) at(t int64, fn func()) {
	w.seq++
	heap.Push(&w.q, &event{at: max(t, w.now), seq: w.seq, fn: fn})
}

func (w *world) between(r [2]int64) int64 {
	if r[1] <= r[0] {
		return r[0]
	}
	return r[0] + w.rng.Int64N(r[1]-r[0]+1)
}

func (w *world) logf(format string, args ...any) {
	if len(w.trace) >= 40 {
		w.trace = w.trace[1:]
	}
	w.trace = append(w.trace, fmt.Sprintf("%9dµs ", w.now)+fmt.Sprintf(format, args...))
}

func (w *world) fail(format string, args ...any) {
	if w.failed {
		return
	}
	w.failed = true
	w.tb.Errorf("seed %d (rerun with -run %s -transition.seed %d) at t=%dµs: %s\nlast events:\n%s",
		w.seed, w.tb.Name(), w.seed, w.now, fmt.Sprintf(format, args...), strings.Join(w.trace, "\n"))
}

// run processes events until t (or the first failure).
func (w *world) run(until int64) {
	for len(w.q) > 0 && !w.failed {
		if w.q[0].at > until {
			break
		}
		e := heap.Pop(&w.q).(*event)
		w.now = e.at
		e.fn()
		w.checkSafety()
	}
	w.now = max(w.now, until)
}

func (w *world) isCut(a *wagent, t int64) bool {
	for _, c := range w.cuts {
		if c.region == a.region && (c.agent == "" || c.agent == a.name) && c.from <= t && t < c.to {
			return true
		}
	}
	return false
}

// addCut partitions a region (agent "") or one agent in [from, to), and
// tells membership about it memberDelay later.
func (w *world) addCut(region, agent string, from, to int64) {
	w.cuts = append(w.cuts, cut{region, agent, from, to})
	if w.net.memberDelay >= 0 {
		w.at(from+w.net.memberDelay, w.updateMembers)
		w.at(to+w.net.memberDelay, w.updateMembers)
	}
}

// updateMembers tells the coordinator who membership sees, memberDelay
// behind the truth.
func (w *world) updateMembers() {
	if w.net.memberDelay < 0 {
		return
	}
	var live []Member
	for _, a := range w.agents {
		if !w.isCut(a, w.now-w.net.memberDelay) {
			live = append(live, Member{a.region, a.name})
		}
	}
	if err := w.coord.MemberChange(live); err != nil {
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

func tableString(tb *Table) string {
	var b strings.Builder
	fmt.Fprintf(&b, "(%d,%d) issued %d eff %d leases %v agents %v", tb.Term, tb.Epoch, tb.Issued, tb.Effective, tb.Leases, tb.Agents)
	for _, k := range tb.Keys {
		fmt.Fprintf(&b, " %s%v", k.Key, k.Shares)
	}
	return b.String()
}

// checkTable holds one table to the rules every table keeps.
func (w *world) checkTable(tb *Table) {
	if n := len(w.tables); n > 0 && !tb.Newer(w.tables[n-1].Term, w.tables[n-1].Epoch) {
		w.fail("table (%d,%d) is not ordered after the previous (%d,%d)", tb.Term, tb.Epoch, w.tables[n-1].Term, w.tables[n-1].Epoch)
	}
	if tb.Effective < tb.Issued {
		w.fail("table (%d,%d) effective %d before issued %d", tb.Term, tb.Epoch, tb.Effective, tb.Issued)
	}
	if !slices.Equal(tb.Regions, w.regions) || len(tb.Leases) != len(w.regions) || len(tb.Agents) != len(w.regions) || len(tb.Keys) != len(w.budgets) {
		w.fail("table (%d,%d) malformed: %s", tb.Term, tb.Epoch, tableString(tb))
		return
	}
	for k, ks := range tb.Keys {
		if ks.Key != w.budgets[k].Key {
			w.fail("table (%d,%d) key %d is %q, want %q", tb.Term, tb.Epoch, k, ks.Key, w.budgets[k].Key)
		}
		if err := CheckShares(ks.Shares, w.floors, false); err != nil {
			w.fail("table (%d,%d) key %s: %v", tb.Term, tb.Epoch, ks.Key, err)
		}
	}
}

// send puts tb on the network to a: lost, delayed, and sometimes delivered
// a second time late (after newer tables, so it must be refused).
func (w *world) send(a *wagent, tb *Table) {
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

func (w *world) deliver(a *wagent, tb *Table) {
	if w.isCut(a, w.now) {
		return
	}
	newest := a.held
	if !a.offer(tb) {
		w.refused++
		if n := len(newest); n == 0 || tb.Newer(newest[n-1].Term, newest[n-1].Epoch) {
			w.fail("agent %s refused (%d,%d), newer than what it holds", a.name, tb.Term, tb.Epoch)
		}
		return
	}
	w.logf("%s accepts (%d,%d)", a.name, tb.Term, tb.Epoch)
	// The shares it runs change at the table's Effective and lease on its
	// clock: step there (the safety check runs after every event).
	w.at(tb.Effective-a.off, func() { w.agentStep(a) })
	w.at(tb.Leases[a.ri]-a.off, func() { w.agentStep(a) })
	w.agentStep(a)
}

// agentStep acknowledges the table in force when it is newer than the last
// one acknowledged.
func (w *world) agentStep(a *wagent) {
	tb := a.inForce(w.now)
	if tb == nil || !tb.Newer(a.acked[0], a.acked[1]) || w.isCut(a, w.now) {
		return
	}
	a.acked = [2]uint64{tb.Term, tb.Epoch}
	term, epoch := tb.Term, tb.Epoch
	w.at(w.now+w.between(w.net.ackDelay), func() {
		if w.isCut(a, w.now) {
			return
		}
		w.logf("%s acks (%d,%d)", a.name, term, epoch)
		if err := w.coord.Ack(a.region, a.name, term, epoch); err != nil {
			w.fail("Ack: %v", err)
		}
	})
}

// reportRound makes every agent report the interval that just closed.
func (w *world) reportRound() {
	interval := w.now/w.dt - 1
	for _, a := range w.agents {
		w.at(w.now+w.between([2]int64{0, w.net.reportJitter}), func() { w.sendReport(a, interval) })
	}
	w.at(w.now+w.dt, w.reportRound)
}

func (w *world) sendReport(a *wagent, interval int64) {
	if w.isCut(a, w.now) {
		return
	}
	r := &Report{Region: a.region, Agent: a.name, Interval: interval}
	if tb := a.inForce(w.now); tb != nil {
		r.Term, r.Epoch = tb.Term, tb.Epoch
	}
	n := float64(len(w.byRegion[a.ri]))
	for k, b := range w.budgets {
		d := w.demand[a.ri][k] * w.cfg.Interval.Seconds() / n
		if w.net.noise {
			d *= 0.8 + 0.4*w.rng.Float64()
		}
		if c := int64(d); c > 0 {
			r.Keys = append(r.Keys, KeyDemand{Key: b.Key, Demand: Demand{Offered: c, OfferedCost: c, Admitted: c}})
		}
	}
	w.at(w.now+w.between(w.net.reportDelay), func() { w.observe(a, r) })
}

func (w *world) observe(a *wagent, r *Report) {
	if w.isCut(a, w.now) {
		return
	}
	err := w.coord.Observe(r, w.now)
	last, seen := w.lastObs[a]
	switch {
	case seen && r.Interval <= last:
		if !errors.Is(err, ErrBadReport) {
			w.fail("Observe of %s interval %d after %d: got %v, want ErrBadReport", a.name, r.Interval, last, err)
		}
	case err != nil:
		w.fail("Observe of %s interval %d: %v", a.name, r.Interval, err)
	default:
		w.lastObs[a] = r.Interval
	}
}

// failover replaces the coordinator: a new one with the same config and
// budgets starts the next term from the latest table the old one wrote;
// the old one is never ticked again (its tables in flight still arrive).
func (w *world) failover() {
	old := w.coord
	c, err := NewCoordinator(w.cfg, w.budgets)
	if err != nil {
		w.fail("NewCoordinator: %v", err)
		return
	}
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

// sumInForce is Σ over regions of the largest share any of the region's
// agents has in force for key index k at the current time.
func (w *world) sumInForce(k int) (uint32, []uint32) {
	sum := uint32(0)
	per := make([]uint32, len(w.regions))
	for ri, agents := range w.byRegion {
		m := uint32(0)
		for _, a := range agents {
			m = max(m, a.share(w.now, k, w.floors[ri]))
		}
		per[ri] = m
		sum += m
	}
	return sum, per
}

func (w *world) checkSafety() {
	for k := range w.budgets {
		sum := uint32(0)
		for ri, agents := range w.byRegion {
			m := uint32(0)
			for _, a := range agents {
				m = max(m, a.share(w.now, k, w.floors[ri]))
			}
			sum += m
		}
		w.maxSum = max(w.maxSum, sum)
		bsum := int64(0)
		for ri, agents := range w.byRegion {
			m := int64(0)
			for _, a := range agents {
				m = max(m, a.burst(w.now, k, w.floors[ri], w.budgets[k].Limit, len(w.regions)))
			}
			bsum += m
		}
		if b := w.budgets[k].Limit.Burst(); bsum > b {
			w.fail("key %s: Σ bursts in force %d > the budget's %d", w.budgets[k].Key, bsum, b)
			return
		}
		if sum > PPM {
			_, per := w.sumInForce(k)
			var detail []string
			for _, a := range w.agents {
				tb := a.inForce(w.now)
				desc := "none"
				if tb != nil {
					desc = fmt.Sprintf("(%d,%d) eff %d lease %d", tb.Term, tb.Epoch, tb.Effective, tb.Leases[a.ri])
				}
				detail = append(detail, fmt.Sprintf("%s clock %d share %d from %s", a.name, w.now+a.off, a.share(w.now, k, w.floors[a.ri]), desc))
			}
			w.fail("key %s: Σ in force %d > %d ppm (per region %v)\n%s", w.budgets[k].Key, sum, PPM, per, strings.Join(detail, "\n"))
			return
		}
	}
}

// randomWorld draws a world: 3–5 regions of 1–3 agents, 3–5 keys,
// adversarial delivery, region partitions (some longer than a lease),
// demand shifting between regions, and usually a failover mid-run. With
// agentCuts, single agents are partitioned too.
func randomWorld(tb testing.TB, seed uint64, agentCuts bool) (*world, int64) {
	rng := rand.New(rand.NewPCG(seed, 1))
	names := []string{"af", "ap", "eu", "sa", "us"}
	rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	regions := names[:3+rng.IntN(3)]
	cfg := worldConfig(regions...)
	cfg.Lease = time.Duration(3+rng.IntN(5)) * cfg.Interval
	cfg.MaxSkew = time.Duration(rng.IntN(41)) * time.Millisecond
	cfg.Fence = 2*cfg.MaxSkew + time.Duration(rng.IntN(60))*time.Millisecond
	cfg.StaleAfter = 1 + rng.IntN(4)
	agents := make([]int, len(regions))
	for i := range agents {
		agents[i] = 1 + rng.IntN(3)
	}
	strats := []string{"proportional", "ewma", "maxmin"}
	var keys []string
	for range 3 + rng.IntN(3) {
		keys = append(keys, strats[rng.IntN(len(strats))])
	}
	dt := int64(cfg.Interval / time.Microsecond)
	net := netOpts{
		tableDelay:   [2]int64{0, (1 + rng.Int64N(3)) * dt},
		reportDelay:  [2]int64{0, dt / 2},
		ackDelay:     [2]int64{0, dt / 2},
		lateDelay:    [2]int64{dt, 6 * dt},
		dropP:        0.05 + 0.2*rng.Float64(),
		lateP:        0.2 * rng.Float64(),
		tick:         [2]int64{2 * ms, 8 * ms},
		reportJitter: 5 * ms,
		memberDelay:  rng.Int64N(2 * dt),
		skew:         true,
		noise:        true,
	}
	if rng.IntN(4) == 0 {
		net.memberDelay = -1
	}
	w := newWorld(tb, seed, cfg, agents, keys, net)
	end := 40 * dt
	for range rng.IntN(4) {
		from := dt + rng.Int64N(end-dt)
		w.addCut(w.regions[rng.IntN(len(w.regions))], "", from, from+dt/2+rng.Int64N(12*dt))
	}
	if agentCuts {
		for range 2 + rng.IntN(4) {
			a := w.agents[rng.IntN(len(w.agents))]
			from := dt + rng.Int64N(end-dt)
			w.addCut(a.region, a.name, from, from+dt/2+rng.Int64N(12*dt))
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
	w.at(dt, next)
	if rng.IntN(10) < 7 {
		w.at(end/4+rng.Int64N(end/2), w.failover)
	}
	return w, end
}

// TestTransitionRandom is the headline safety test: tables applied by
// regions in adversarial orders and delays never make Σ shares in force
// exceed 10⁶ at any instant, across partitions (regions cut off while their
// lease lapses, late tables after a reconnect) and coordinator failovers.
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
			seeds := make([]uint64, 0, *transitionSeeds)
			if *transitionSeed != 0 {
				seeds = append(seeds, *transitionSeed)
			} else {
				for i := range *transitionSeeds {
					seeds = append(seeds, uint64(i+1))
				}
			}
			failures, refused, tables := 0, 0, 0
			for _, seed := range seeds {
				w, end := randomWorld(t, seed, tc.agentCuts)
				w.run(end)
				refused += w.refused
				tables += len(w.tables)
				if w.failed {
					failures++
					if failures >= 3 {
						t.Fatalf("stopping after %d failing seeds", failures)
					}
				}
			}
			t.Logf("%d seeds, %d tables, %d stale tables refused", len(seeds), tables, refused)
			if refused == 0 {
				t.Error("no stale table was ever delivered late: the world is not adversarial enough")
			}
		})
	}
}

// quietNet delivers everything at once, in order, with no skew.
func quietNet() netOpts {
	return netOpts{tick: [2]int64{5 * ms, 5 * ms}, memberDelay: 0}
}

// twoRegionWorld is a scripted world of regions a and b, one agent each,
// one proportional key, where a holds most of the budget.
func twoRegionWorld(t *testing.T, net netOpts) *world {
	t.Helper()
	w := newWorld(t, 0, worldConfig("a", "b"), []int{1, 1}, []string{"proportional"}, net)
	w.demand[0][0], w.demand[1][0] = 900, 100
	w.run(10 * w.dt)
	return w
}

func lastTable(w *world) *Table { return w.tables[len(w.tables)-1] }

// A late decrease delivered after a reconnect: region a is cut off just as
// demand moves to b; the coordinator decreases a, waits for a's lease plus
// skew and gives b the rest. When a comes back, the tables it missed arrive
// in an adversarial order — the decrease first, the newest next, and the
// oldest (with a's old, larger share) last, which a must refuse.
func TestTransitionLateDecreaseAfterReconnect(t *testing.T) {
	w := twoRegionWorld(t, quietNet())
	a := w.byRegion[0][0]
	before := lastTable(w)
	if s := before.Keys[0].Shares[0]; s < 800_000 {
		t.Fatalf("setup: a's share %d, want most of the budget", s)
	}
	cutAt, back := w.now, w.now+12*w.dt
	w.addCut("a", "", cutAt, back)
	a.hold = true
	w.demand[0][0], w.demand[1][0] = 100, 900
	w.run(back - 1)
	var dec *Table
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
	if a.share(w.now, 0, w.floors[0]) != w.floors[0] {
		t.Fatalf("a runs %d after its lease lapsed, want its floor %d", a.share(w.now, 0, w.floors[0]), w.floors[0])
	}
	inbox := a.inbox
	a.hold, a.inbox = false, nil
	w.run(back)
	order := []*Table{dec}
	order = append(order, inbox[len(inbox)-1])
	order = append(order, before)
	for i, tb := range order {
		w.at(back+int64(i)*ms, func() { w.deliver(a, tb) })
	}
	refused := w.refused
	w.run(back + 20*w.dt)
	if w.refused <= refused {
		t.Error("a accepted a table older than the one it held")
	}
	if sum, _ := w.sumInForce(0); sum > PPM {
		t.Errorf("Σ in force %d > %d", sum, PPM)
	}
	t.Logf("largest Σ in force %d ppm", w.maxSum)
}

// A region cut off while its lease lapses: it keeps its share in every
// table until its last lease plus the maximum skew, then gets exactly its
// floor and the others share the rest; its agents fall to the floor when
// their own clocks pass the lease; Σ in force never exceeds PPM; and when it
// returns it gets more than its floor again within an interval (plus the
// others' break before make).
func TestTransitionRegionCutWhileLeaseLapses(t *testing.T) {
	net := quietNet()
	net.skew = true
	net.tableDelay = [2]int64{0, 30 * ms}
	cfg := worldConfig("a", "b", "c")
	w := newWorld(t, 7, cfg, []int{2, 1, 1}, []string{"proportional", "ewma", "maxmin"}, net)
	for k := range 3 {
		w.demand[0][k], w.demand[1][k], w.demand[2][k] = 600, 300, 100
	}
	w.run(10 * w.dt)
	held := slices.Clone(lastTable(w).Keys[0].Shares)
	cutAt := w.now
	back := cutAt + 20*w.dt
	w.addCut("a", "", cutAt, back)
	var lastLease int64 // a's lease in the last table that renewed it
	firstFloor := -1
	w.onTable = func(tb *Table) {
		if tb.Leases[0] > lastLease {
			lastLease = tb.Leases[0]
		}
		skew := int64(cfg.MaxSkew / time.Microsecond)
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
			if s[0] != w.floors[0] {
				t.Errorf("table (%d,%d) at %d gives silent a %d, want its floor %d", tb.Term, tb.Epoch, tb.Issued, s[0], w.floors[0])
			}
		}
	}
	w.run(back - 1)
	if firstFloor < 0 {
		t.Fatal("a never fell to its floor while cut off")
	}
	last := lastTable(w)
	for _, ks := range last.Keys {
		if ks.Shares[0] != w.floors[0] || ks.Shares[1]+ks.Shares[2] != PPM-w.floors[0] {
			t.Errorf("key %s while a is away: %v, want a at its floor %d and b+c = %d", ks.Key, ks.Shares, w.floors[0], PPM-w.floors[0])
		}
	}
	for _, ag := range w.byRegion[0] {
		if s := ag.share(w.now, 0, w.floors[0]); s != w.floors[0] {
			t.Errorf("%s runs %d with its lease lapsed, want %d", ag.name, s, w.floors[0])
		}
	}
	w.onTable = nil
	w.run(back + 2*w.dt + 100*ms)
	if s := lastTable(w).Keys[0].Shares[0]; s <= w.floors[0] {
		t.Errorf("a back for two intervals still gets %d, want more than its floor %d", s, w.floors[0])
	}
	t.Logf("largest Σ in force %d ppm", w.maxSum)
}

// A coordinator failover mid-transition: the decrease is out, a's agent is
// cut off so the increase waits; the coordinator fails over; the new one
// republishes the decrease's shares (never reset), learns, and only then
// rebalances. Tables of the old term still in flight arrive afterwards and
// are refused. Σ in force never exceeds PPM.
func TestTransitionFailoverMidTransition(t *testing.T) {
	net := quietNet()
	net.tableDelay = [2]int64{0, 20 * ms}
	net.lateP, net.lateDelay = 1, [2]int64{3 * 100 * ms, 3 * 100 * ms}
	w := newWorld(t, 3, worldConfig("a", "b", "c"), []int{1, 2, 1}, []string{"proportional", "ewma"}, net)
	for k := range 2 {
		w.demand[0][k], w.demand[1][k], w.demand[2][k] = 800, 100, 100
	}
	w.run(10 * w.dt)
	w.addCut("a", "", w.now, w.now+8*w.dt)
	for k := range 2 {
		w.demand[0][k], w.demand[1][k], w.demand[2][k] = 100, 800, 100
	}
	deadline := w.now + 4*w.dt
	for !w.coord.transition && w.now < deadline && !w.failed {
		w.run(w.now + ms)
	}
	if !w.coord.transition {
		t.Fatal("setup: no transition began")
	}
	stored := w.coord.Latest()
	old := w.coord
	w.run(w.now + 20*ms)
	w.failover()
	first := lastTable(w)
	if first.Term != old.Term()+1 || !first.Newer(stored.Term, stored.Epoch) {
		t.Errorf("first table of the new term is (%d,%d), stored (%d,%d)", first.Term, first.Epoch, stored.Term, stored.Epoch)
	}
	for k := range first.Keys {
		if !slices.Equal(first.Keys[k].Shares, old.Latest().Keys[k].Shares) {
			t.Errorf("key %s: new term republished %v, stored %v", first.Keys[k].Key, first.Keys[k].Shares, old.Latest().Keys[k].Shares)
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
// stale, and membership drops it, so the next tables name only its
// sibling; a decrease of the region then waits only for the sibling's ack,
// while the cut-off agent still runs the region's old, larger share under
// a lease that has not lapsed: Σ in force exceeds PPM.
func TestTransitionAgentCutOffStillWaitedFor(t *testing.T) {
	cfg := worldConfig("a", "b")
	cfg.Lease = 2 * time.Second // 20 Δ: far longer than StaleAfter·Δ
	w := newWorld(t, 0, cfg, []int{2, 1}, []string{"proportional"}, quietNet())
	w.demand[0][0], w.demand[1][0] = 900, 0 // a holds all but b's floor, whatever a's demand
	w.run(10 * w.dt)
	a1 := w.byRegion[0][1]
	w.addCut("a", a1.name, w.now, w.now+30*w.dt)
	w.run(w.now + 5*w.dt) // a1 is stale now and named by no table
	if named := lastTable(w).Agents[0]; slices.Contains(named, a1.name) {
		t.Logf("tables still name %s: %v", a1.name, named)
	} else if a1.share(w.now, 0, w.floors[0]) <= w.floors[0] {
		t.Fatalf("setup: %s runs %d, want a's large share", a1.name, a1.share(w.now, 0, w.floors[0]))
	}
	w.demand[0][0], w.demand[1][0] = 100, 900
	w.run(w.now + 5*w.dt)
	if !w.failed {
		t.Logf("largest Σ in force %d ppm", w.maxSum)
	}
}
