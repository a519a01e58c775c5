package memnet

import (
	"cmp"
	"container/heap"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/meridian-quota/meridian/gossip/protocol"
)

// Errors of a faulty network, wrapped with the operation's context.
var (
	// ErrDisconnected: the agent is not connected to the bus (NATS's
	// "connection closed" or "reconnecting"); nothing was sent.
	ErrDisconnected = errors.New("memnet: disconnected")
	// ErrUnavailable: the KV bucket cannot be reached (outage, partition
	// from its home region, agent disconnected).
	ErrUnavailable = errors.New("memnet: KV unavailable")
)

// Addr names an agent (Region and Agent) or, with Agent empty, every agent
// of Region, in the fault knobs.
type Addr struct {
	Region, Agent string
}

func (a Addr) String() string {
	if a.Agent == "" {
		return a.Region
	}
	return a.Region + "/" + a.Agent
}

func (a Addr) region() Addr { return Addr{Region: a.Region} }

func compareAddr(a, b Addr) int {
	return cmp.Or(cmp.Compare(a.Region, b.Region), cmp.Compare(a.Agent, b.Agent))
}

// Link is how messages travel from one agent to another: each message
// takes Latency plus a jitter drawn uniformly from [0, Jitter], is lost
// with probability Loss and delivered twice with probability Duplicate
// (the copy with its own jitter). The zero Link delivers every message
// once, at once.
type Link struct {
	Latency   time.Duration
	Jitter    time.Duration
	Loss      float64 // in [0, 1]
	Duplicate float64 // in [0, 1]
}

func (l Link) validate(field string) []error {
	var errs []error
	if l.Latency < 0 || l.Jitter < 0 {
		errs = append(errs, fmt.Errorf("%s: latency %v, jitter %v: must not be negative", field, l.Latency, l.Jitter))
	}
	if !(l.Loss >= 0 && l.Loss <= 1) || !(l.Duplicate >= 0 && l.Duplicate <= 1) {
		errs = append(errs, fmt.Errorf("%s: loss %v, duplicate %v: want probabilities in [0, 1]", field, l.Loss, l.Duplicate))
	}
	return errs
}

// Config is a Network's behaviour without faults. [DefaultConfig]
// documents each default.
type Config struct {
	// Link is every link's behaviour unless SetLink says otherwise.
	Link Link
	// KVLatency is how long each KV operation (and a watch's push) takes
	// for every agent unless SetKVLatency says otherwise.
	KVLatency time.Duration
	// DetectDelay is how long after an agent dies or is cut off the others
	// report it dead; JoinDelay how long after it returns they report it
	// alive again.
	DetectDelay time.Duration
	JoinDelay   time.Duration
	// WatchResync is how often a table watch rereads the head while its
	// watch is up; WatchRetryMin and WatchRetryMax bound the backoff of
	// re-creating a dropped watch (as gossip.Transport's).
	WatchResync   time.Duration
	WatchRetryMin time.Duration
	WatchRetryMax time.Duration
}

// DefaultConfig is a fault-free network with gossip.Transport's watch
// timing.
func DefaultConfig() Config {
	return Config{
		Link:          Link{},                                 // tests state the latency they study
		KVLatency:     0,                                      // likewise; zero keeps KV calls synchronous under a VirtualClock
		DetectDelay:   5 * time.Second,                        // memberlist's LAN profile declares a silent member dead within a few seconds
		JoinDelay:     200 * time.Millisecond,                 // a returning member is gossiped alive within a few rounds
		WatchResync:   protocol.DefaultWatchConfig().Resync,   // gossip.Transport's, from one place
		WatchRetryMin: protocol.DefaultWatchConfig().RetryMin, // likewise
		WatchRetryMax: protocol.DefaultWatchConfig().RetryMax, // likewise
	}
}

// Validate reports every problem of c at once.
func (c Config) Validate() error {
	errs := c.Link.validate("link")
	if c.KVLatency < 0 || c.DetectDelay < 0 || c.JoinDelay < 0 {
		errs = append(errs, fmt.Errorf("kv_latency %v, detect_delay %v, join_delay %v: must not be negative", c.KVLatency, c.DetectDelay, c.JoinDelay))
	}
	if c.WatchResync <= 0 {
		errs = append(errs, fmt.Errorf("watch_resync %v: must be positive", c.WatchResync))
	}
	if c.WatchRetryMin <= 0 || c.WatchRetryMax < c.WatchRetryMin {
		errs = append(errs, fmt.Errorf("watch_retry_min %v, watch_retry_max %v: want 0 < min ≤ max", c.WatchRetryMin, c.WatchRetryMax))
	}
	return errors.Join(errs...)
}

// Counters are one agent's operations since it was created.
type Counters struct {
	Published int64 // messages (report chunks, acks) it published
	Delivered int64 // messages delivered to its subscriptions
	KVGets    int64 // KV reads: Get, LatestTable, each chunk fetched, each watch resync
	KVPuts    int64 // KV writes: Create, Update, each chunk and head of StoreTable
	KVWatches int64 // table watches created (the first and every re-creation)
	KVErrors  int64 // KV operations that failed for unavailability
}

// Network is one simulated cluster (see the package doc). Create it with
// [New]; its methods are safe for concurrent use.
type Network struct {
	clock Clock
	cfg   Config

	runMu sync.Mutex // held while events run: one at a time, in order

	mu        sync.Mutex
	rng       *rand.Rand
	seq       uint64
	events    eventQueue
	agents    map[Addr]*Agent
	order     []*Agent // by creation
	links     map[[2]Addr]Link
	cuts      map[[2]Addr]bool
	suspected map[Addr]int64 // agent → until (µs)
	kvLatency map[Addr]time.Duration
	kvHome    string
	subs      []*subscription // by creation
	bucket    bucket
	watches   []*watch
}

// New returns an empty network on clock, drawing every random choice from
// rng, or an error when cfg is invalid.
func New(clock Clock, rng *rand.Rand, cfg Config) (*Network, error) {
	if clock == nil || rng == nil {
		return nil, errors.New("memnet: a clock and a *rand.Rand are required")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("memnet: config: %w", err)
	}
	return &Network{
		clock:     clock,
		cfg:       cfg,
		rng:       rng,
		agents:    map[Addr]*Agent{},
		links:     map[[2]Addr]Link{},
		cuts:      map[[2]Addr]bool{},
		suspected: map[Addr]int64{},
		kvLatency: map[Addr]time.Duration{},
		bucket:    bucket{keys: map[string]entry{}},
	}, nil
}

// Now is the network's clock reading (µs).
func (n *Network) Now() int64 { return n.clock.Now() }

// Agent returns the endpoint of agent in region, creating it on first use:
// alive, connected, and a member every agent it can reach sees at once
// (one cut off from it never does until the cut heals).
func (n *Network) Agent(region, agent string) *Agent {
	addr := Addr{region, agent}
	n.mu.Lock()
	defer n.mu.Unlock()
	if a, ok := n.agents[addr]; ok {
		return a
	}
	a := &Agent{
		n:       n,
		addr:    addr,
		view:    map[Addr]*peer{},
		changed: make(chan struct{}, 1),
	}
	for _, o := range n.order {
		in, _ := n.reachableLocked(o, a)
		out, _ := n.reachableLocked(a, o)
		o.view[addr] = &peer{live: in, want: in}
		a.view[o.addr] = &peer{live: out, want: out}
		if in {
			o.signal()
		}
	}
	a.view[addr] = &peer{live: true, want: true}
	n.agents[addr] = a
	n.order = append(n.order, a)
	return a
}

// Counters returns agent's counters (zero for an unknown agent).
func (n *Network) Counters(a Addr) Counters {
	n.mu.Lock()
	defer n.mu.Unlock()
	if ag, ok := n.agents[a]; ok {
		return ag.count
	}
	return Counters{}
}

// Agents lists the agents, sorted.
func (n *Network) Agents() []Addr {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]Addr, 0, len(n.order))
	for _, a := range n.order {
		out = append(out, a.addr)
	}
	slices.SortFunc(out, compareAddr)
	return out
}

// SetLink sets the link from → to. Either end may be an agent or a region
// (Agent empty); the most specific setting applies: agent→agent, then
// agent→region, region→agent, region→region, then Config.Link.
func (n *Network) SetLink(from, to Addr, l Link) error {
	if errs := l.validate("link " + from.String() + "→" + to.String()); len(errs) > 0 {
		return errors.Join(errs...)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.links[[2]Addr{from, to}] = l
	return nil
}

func (n *Network) linkLocked(from, to Addr) Link {
	for _, k := range [][2]Addr{{from, to}, {from, to.region()}, {from.region(), to}, {from.region(), to.region()}} {
		if l, ok := n.links[k]; ok {
			return l
		}
	}
	return n.cfg.Link
}

// Cut stops everything from → to (one way; cut both ways with two calls
// or CutBoth). Either end may be an agent or a region. Messages in flight
// on a cut link are lost; membership reacts after its delays.
func (n *Network) Cut(from, to Addr) { n.setCut(from, to, true) }

// CutBoth cuts a → b and b → a.
func (n *Network) CutBoth(a, b Addr) {
	n.setCut(a, b, true)
	n.setCut(b, a, true)
}

// Heal undoes Cut(from, to) (exactly that pair).
func (n *Network) Heal(from, to Addr) { n.setCut(from, to, false) }

// HealAll removes every cut.
func (n *Network) HealAll() {
	n.mu.Lock()
	clear(n.cuts)
	n.afterFaultLocked()
	n.mu.Unlock()
}

func (n *Network) setCut(from, to Addr, cut bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if cut {
		n.cuts[[2]Addr{from, to}] = true
	} else {
		delete(n.cuts, [2]Addr{from, to})
	}
	n.afterFaultLocked()
}

func (n *Network) cutLocked(from, to Addr) bool {
	for _, k := range [][2]Addr{{from, to}, {from, to.region()}, {from.region(), to}, {from.region(), to.region()}} {
		if n.cuts[k] {
			return true
		}
	}
	return false
}

// Disconnect takes agent a (or every agent of a region, Agent empty) off
// the bus and the KV until Reconnect.
func (n *Network) Disconnect(a Addr) { n.setFlag(a, func(ag *Agent) { ag.disconnected = true }) }

// Reconnect undoes Disconnect; dropped watches are re-created at once.
func (n *Network) Reconnect(a Addr) { n.setFlag(a, func(ag *Agent) { ag.disconnected = false }) }

// Kill crashes agent a (or a region's agents): off the bus and the KV, and
// reported dead by the others after Config.DetectDelay.
func (n *Network) Kill(a Addr) { n.setFlag(a, func(ag *Agent) { ag.dead = true }) }

// Revive brings a killed agent back (the caller restarts what ran on it).
func (n *Network) Revive(a Addr) { n.setFlag(a, func(ag *Agent) { ag.dead = false }) }

func (n *Network) setFlag(a Addr, f func(*Agent)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, ag := range n.order {
		if ag.addr == a || a.Agent == "" && ag.addr.Region == a.Region {
			f(ag)
		}
	}
	n.afterFaultLocked()
}

// Suspect makes agent a appear dead to every other agent from now for d
// (memberlist declaring a healthy member dead): their views drop it at
// once and take it back Config.JoinDelay after d.
func (n *Network) Suspect(a Addr, d time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	until := n.clock.Now() + micros(d)
	n.suspected[a] = max(n.suspected[a], until)
	n.afterFaultLocked()
	n.atLocked(until, func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		if n.suspected[a] <= n.clock.Now() {
			delete(n.suspected, a)
		}
		n.afterFaultLocked()
	})
}

// afterFaultLocked brings membership views and watches up to date after a
// fault changed.
func (n *Network) afterFaultLocked() {
	n.refreshMembersLocked()
	n.refreshWatchesLocked()
}

// Scheduling: the network's own queue, ordered by (due, insertion), so
// that events run in one order under any clock.

type event struct {
	at    int64
	seq   uint64
	f     func()
	index int
}

type eventQueue []*event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	return q[i].at < q[j].at || q[i].at == q[j].at && q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return e
}

// atLocked runs f at time t (µs), in the network's event order. f runs
// without n.mu held.
func (n *Network) atLocked(t int64, f func()) {
	heap.Push(&n.events, &event{at: t, seq: n.seq, f: f})
	n.seq++
	n.clock.AfterFunc(time.Duration(t-n.clock.Now())*time.Microsecond, n.pump)
}

func (n *Network) afterLocked(d time.Duration, f func()) { n.atLocked(n.clock.Now()+micros(d), f) }

// pump runs every due event, in order, one at a time.
func (n *Network) pump() {
	n.runMu.Lock()
	defer n.runMu.Unlock()
	for {
		n.mu.Lock()
		if len(n.events) == 0 || n.events[0].at > n.clock.Now() {
			n.mu.Unlock()
			return
		}
		e := heap.Pop(&n.events).(*event)
		n.mu.Unlock()
		e.f()
	}
}

// chance draws an event of probability p (no draw for 0 or 1, so that
// knobs left at their ends do not shift the random stream).
func (n *Network) chanceLocked(p float64) bool {
	switch {
	case p <= 0:
		return false
	case p >= 1:
		return true
	}
	return n.rng.Float64() < p
}

func (n *Network) jitterLocked(j time.Duration) time.Duration {
	if j <= 0 {
		return 0
	}
	return time.Duration(n.rng.Int64N(int64(j) + 1))
}
