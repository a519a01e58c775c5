package region

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/rebalance"
)

// Store is what a Node needs of a GCRA store: one all-or-nothing decision
// over the keys a request touches. gcra/memstore and gcra/redisstore
// satisfy it.
type Store interface {
	DecideAll(ctx context.Context, checks []gcra.Check, out []gcra.Result) (gcra.Result, error)
}

// Entry is one key/value pair of a request descriptor.
type Entry struct {
	Key, Value string
}

// Descriptor is one descriptor of a request: ordered entries, and its own
// cost when HasCost (Envoy's per-descriptor hits_addend); otherwise the
// request's cost applies.
type Descriptor struct {
	Entries []Entry
	Cost    int64
	HasCost bool
	// Override, when not zero, is a limit the caller sets for this
	// descriptor (Envoy's RateLimitDescriptor.limit): it applies in a known
	// domain whatever the policy says, and since the coordinator does not
	// know it, the key runs at the safe share of it.
	Override gcra.Limit
}

// Request is one decision to make: a domain, its descriptors and the cost
// of each descriptor that does not carry its own. Cost 0 peeks: it is
// decided without consuming anything and recorded as a peek, not as demand.
type Request struct {
	Domain      string
	Descriptors []Descriptor
	Cost        int64
}

// Config configures a Node. DefaultConfig documents each default.
type Config struct {
	// Region is this node's region; Agent names this agent within it.
	Region, Agent string
	// Regions names every region (for the default safe share).
	Regions []string
	// Interval is Δ, the report interval; reports cover [i·Δ, (i+1)·Δ).
	Interval time.Duration
	// SafeShare is this region's floor in ppm; 0 means SafeFraction split
	// equally over Regions. It must match the coordinator's.
	SafeShare uint32
	// SafeFraction is the part of every budget set aside as floors when
	// SafeShare is 0.
	SafeFraction float64
	// IdleSafeFraction is the part of every budget a key no table names
	// runs at, split equally over Regions and capped at the safe share
	// (rebalance.Config.IdleSafeFraction, which must agree: the
	// coordinator lowers a region without recent demand for a key to it).
	// 0: the safe share.
	IdleSafeFraction float64
	// Agents is the number of agents configured in this region: the local
	// failure mode divides the region's limit by max(Agents, live agents).
	Agents int
	// MaxKeys caps the keys tracked for demand and local fallback; a key
	// beyond it is still decided, and counted as overflow.
	MaxKeys int
	// MaxSkew bounds the difference between this node's clock and the
	// store's: a table counts as in force (reports acknowledge it) only
	// MaxSkew after its effective time. It must match the coordinator's.
	MaxSkew time.Duration
	// DenyCache answers, without a store call, a request that the TATs
	// the store reported for its limits in an earlier denial still deny,
	// with each limit's result as the store would report it (exact under
	// GCRA with one agent per store; the shell's clock must be monotonic).
	// Counted in Stats.DenyCacheHits.
	DenyCache bool
	// MaxReserveWait is the booking horizon: the longest a reservation
	// may wait for its slot. Reserve cuts every maxWait to it (and to the
	// lease left). A booking acts when its wait ends, perhaps after the
	// share that booked it was cut, so the horizon must not exceed the
	// coordinator's Fence (rebalance.Config.Fence), the least time between
	// a decrease being in force and the increase it pays for; the agent
	// checks that when it joins a cluster. 0 books nothing ahead: a
	// reservation is then admitted only when its slot is now.
	MaxReserveWait time.Duration
	// OneSlot says the store decides a composite only when its keys share
	// one Redis Cluster slot (gcra/redisstore on a Cluster): NewNode then
	// refuses a policy whose domains can combine limits without a hash tag
	// (Policy.CheckOneSlot), and a request whose limits would still not
	// share a tag (two keys of an untagged domain, a limit override without
	// the tag's entry) is ErrBadRequest, never a cross-slot store error.
	// SetPolicy does not check: its caller does (the agent does at reload).
	OneSlot bool
	// Fence makes every decision under this agent's table's shares carry
	// the table's (term, epoch) as the region fence (gcra.Schedule.Fence)
	// — set it when the shell raises the store's fence as it applies each
	// table (gcra.Fencer; package rebalance, invariant 1). A store holding
	// a newer fence, or none, refuses such a decision (gcra.ErrFenced):
	// this agent runs an older table than another of its region put in
	// force. The node then decides it again at min(share in force, safe
	// share), unfenced, for the store's clock at any instant (never the
	// table's share, not even for a store whose clock lags), and counts it
	// in Stats.Fenced; it is not a store failure. Decisions at the safe
	// share, reduced, lapsed or unnamed rows and regional limits are never
	// fenced.
	Fence bool
	// ReportChange is what makes a key's demand worth reporting again
	// once the coordinator reads delta reports (its table's Features has
	// rebalance.FeatureDeltaReports): a key is listed when its offered
	// cost in the interval differs from the cost it was last listed with
	// by more than ReportChange of the larger of the two, when it starts
	// or stops, and once more in the report after (a lost report, a key
	// the coordinator learns from the first); the coordinator keeps the
	// last listed cost of every other key. 0 lists every key with demand
	// in every report, as full reports do. In [0, 1).
	ReportChange float64
	// ReportRefresh is the longest a delta-reporting agent goes without
	// listing a key with demand: each key is listed once per ReportRefresh
	// at the cost it was last listed with (so noise below ReportChange
	// never reaches the coordinator), at its own offset, so the refresh is
	// spread over the period. It is the repair of last resort: an agent
	// sends a full report — every key at its listed cost — after its
	// table's term changes (a new coordinator remembers nothing), while
	// its lease is lapsed (tables stopped reaching it, so its reports
	// likely stopped reaching the coordinator) and when a table asks for
	// one (Table.Resync: the coordinator saw a gap in its reports, did not
	// know it, or a key it listed). Below Interval with ReportChange > 0
	// is refused.
	ReportRefresh time.Duration
}

// DefaultConfig returns a Config for one agent of region among regions.
func DefaultConfig(region, agent string, regions ...string) Config {
	return Config{
		Region:       region,
		Agent:        agent,
		Regions:      regions,
		Interval:     5 * time.Second,                             // the coordinator's default Δ
		SafeFraction: 0.1,                                         // ARCHITECTURE.md: 10 % of the budget split equally
		Agents:       1,                                           // one agent per region unless told
		MaxKeys:      1 << 20,                                     // ~200 B each: about 200 MiB at the cap
		DenyCache:    true,                                        // exact, and spares Redis the hottest denied keys
		MaxSkew:      rebalance.DefaultConfig(regions...).MaxSkew, // the coordinator's default
		// The coordinator's default Fence: booked future never outlives it.
		MaxReserveWait: rebalance.DefaultConfig(regions...).Fence,
		// ±10 % noise around a stationary demand lists no key (two draws
		// differ by less than 20 % of the larger): BenchmarkControlCost's
		// steady cluster costs 3 bytes per key·region·s instead of 91, and
		// the simulator's UA moved by at most 0.2 point in every built-in
		// scenario (0.1 would list a quarter of such keys every interval).
		ReportChange: 0.2,
		// The repair of last resort, for 1/24 of a full report per 5 s
		// interval: a gap the coordinator sees is repaired within 2Δ.
		ReportRefresh: 2 * time.Minute,
	}
}

// StandaloneConfig returns a Config for agent, one of the agents of region,
// with no cluster: DefaultConfig for one region, except for the floor.
// No coordinator will ever hand the region a share, and no other region
// spends the budget, so its safe share — what a node runs every key at
// without a table — is the whole budget (SafeFraction 1 of one region: 10⁶
// ppm, the global limit's T and burst). The agents of the region share its
// store, so the budget stays whole however many there are; only the local
// failure mode, deciding in memory, divides it by Agents.
func StandaloneConfig(region, agent string) Config {
	c := DefaultConfig(region, agent, region)
	c.SafeFraction = 1 // the one region holds 100 % (ARCHITECTURE.md, "safe share")
	return c
}

// Validate reports every problem with c.
func (c *Config) Validate() error {
	var errs []error
	if c.Region == "" {
		errs = append(errs, errors.New("region: Region: empty"))
	}
	if c.Agent == "" {
		errs = append(errs, errors.New("region: Agent: empty"))
	}
	if !slices.Contains(c.Regions, c.Region) {
		errs = append(errs, fmt.Errorf("region: Regions %q: does not list Region %q", c.Regions, c.Region))
	}
	if c.Interval < time.Millisecond {
		errs = append(errs, fmt.Errorf("region: Interval %s: must be at least 1ms", c.Interval))
	}
	if c.SafeShare > rebalance.PPM {
		errs = append(errs, fmt.Errorf("region: SafeShare %d: above %d ppm", c.SafeShare, rebalance.PPM))
	}
	if f := c.IdleSafeFraction; math.IsNaN(f) || f < 0 || f > 1 {
		errs = append(errs, fmt.Errorf("region: IdleSafeFraction %v: must be in [0, 1]", f))
	}
	if c.SafeShare == 0 && !(c.SafeFraction > 0 && c.SafeFraction <= 1) {
		errs = append(errs, fmt.Errorf("region: SafeFraction %v: must be in (0, 1] when SafeShare is 0", c.SafeFraction))
	}
	if c.Agents < 1 {
		errs = append(errs, fmt.Errorf("region: Agents %d: must be at least 1", c.Agents))
	}
	if c.MaxSkew < 0 {
		errs = append(errs, fmt.Errorf("region: MaxSkew %s: must not be negative", c.MaxSkew))
	}
	if c.MaxKeys < 1 {
		errs = append(errs, fmt.Errorf("region: MaxKeys %d: must be at least 1", c.MaxKeys))
	}
	if !(c.ReportChange >= 0 && c.ReportChange < 1) {
		errs = append(errs, fmt.Errorf("region: ReportChange %v: must be in [0, 1)", c.ReportChange))
	}
	if c.ReportChange > 0 && c.ReportRefresh < c.Interval {
		errs = append(errs, fmt.Errorf("region: ReportRefresh %s: must be at least Interval %s with ReportChange %v", c.ReportRefresh, c.Interval, c.ReportChange))
	}
	if c.MaxReserveWait < 0 || c.MaxReserveWait > gcra.MaxWindow {
		errs = append(errs, fmt.Errorf("region: MaxReserveWait %s: must be in [0, %s]", c.MaxReserveWait, gcra.MaxWindow))
	}
	return errors.Join(errs...)
}

func (c *Config) idlePPM() uint32 {
	s := c.safePPM()
	if c.IdleSafeFraction <= 0 {
		return s
	}
	return min(s, rebalance.EqualFloor(c.IdleSafeFraction, len(c.Regions)))
}

func (c *Config) safePPM() uint32 {
	if c.SafeShare > 0 {
		return c.SafeShare
	}
	return rebalance.EqualFloor(c.SafeFraction, len(c.Regions))
}

// Errors for bad requests and tables. A bad request consumes nothing.
var (
	ErrBadRequest = errors.New("region: bad request")
	ErrStaleTable = errors.New("region: table older than the one in force")
	ErrBadTable   = errors.New("region: bad table")
)

// Stats are a Node's counters since it started. All are cumulative.
type Stats struct {
	Decisions      int64 // requests decided (Decide calls without a request error)
	Peeks          int64 // cost-0 checks (not demand)
	StoreErrors    int64 // store calls that failed
	FallbackOpen   int64 // requests admitted by failure_mode open
	FallbackClosed int64 // requests denied by failure_mode closed
	FallbackLocal  int64 // requests decided by failure_mode local
	FallbackError  int64 // requests left undecided by failure_mode error (the shell answered an error)
	ShadowDenied   int64 // requests a shadow-mode limit would have denied
	Overflow       int64 // checks on keys beyond MaxKeys (decided, not reported)
	Reduced        int64 // checks run at the safe share for a policy mismatch
	Regressions    int64 // table rows whose key version went backwards (kept)
	StateLost      int64 // store state losses reported (StateLost)
	DenyCacheHits  int64 // requests denied from the deny cache, without a store call
	LeaseHits      int64 // requests served from a local lease, without a store call
	LeaseTakes     int64 // leases taken (one store call each)
	LeaseStranded  int64 // leased units never served (expired, or the limit changed)
	Fenced         int64 // store calls the region fence refused (decided again at min(share, safe), unfenced)
}

// Node is a region's decision core. Resolve, Decide and Record are safe for
// many goroutines and allocate nothing per request once warm; Apply, Tick,
// SetPolicy and SetLiveAgents run on one goroutine (the shell's loop).
type Node struct {
	cfg   Config
	store Store
	safe  uint32
	idle  uint32 // the floor of a key no table names (Config.IdleSafeFraction)
	snap  atomic.Pointer[snapshot]
	keys  interner

	overrides sync.Map // overrideKey → *Rule: the rules overrides make, reused
	nOverride atomic.Int64

	localMu sync.Mutex
	// pubMu serializes the snapshot's read-modify-write publications —
	// Apply, SetPolicy, a lease lapse — which may come from the Tick/Apply
	// goroutine, a policy reload and (a lapse) any decision.
	pubMu sync.Mutex
	live  atomic.Int64
	gen   atomic.Uint64

	decisions, peeks, storeErrors, fbOpen, fbClosed, fbLocal, fbError,
	shadowDenied, overflow, reduced, denyHits atomic.Int64
	leaseHits, leaseTakes, leaseStranded atomic.Int64
	fenced                               atomic.Int64

	// Owned by the Tick/Apply goroutine.
	open    int64 // index of the open report interval
	started bool
	// fullTerm is the table term of the last full report sent in delta
	// mode (fullSent: there was one).
	fullTerm    uint64
	fullSent    bool
	fullGen     uint64       // the snapshot whose resync request a full report answered
	leaseExpiry atomic.Int64 // read by Reserve on the hot path
	regressions atomic.Int64
	// lost is the conservative mode after a store state loss (StateLost;
	// nil: none); stateLost counts the losses.
	lost      atomic.Pointer[lostState]
	stateLost atomic.Int64
}

// snapshot is what the hot path reads: immutable once published.
type snapshot struct {
	gen      uint64 // counts snapshots: prepared requests compare it
	policy   *Policy
	hasTable bool
	term     uint64
	epoch    uint64
	issued   int64 // the table's Issued (µs, the coordinator's clock)
	// effective is the table's effective time. Until it plus MaxSkew has
	// passed on the node's clock, InForce names the table before it when
	// that one is surely in force by then (mid: the superseded table,
	// from midEffective plus MaxSkew on), or else the one that was surely
	// in force when this table was applied (prev).
	effective           int64
	prevTerm, prevEpoch uint64
	hasMid              bool
	midTerm, midEpoch   uint64
	midEffective        int64
	lapsed              bool
	named               bool   // the table names this agent in its region
	features            uint32 // the table's Features: what its coordinator reads
	resync              bool   // the table asks this agent for a full report (Table.Resync)
	rows                rowSet
}

// rowSet is the table's keys as this region runs them. The index and
// names are shared by the snapshots of tables with the same keys (a
// coordinator's consecutive tables), so applying a table costs a slice of
// row pointers, not a map.
type rowSet struct {
	index map[string]int
	names []string
	rows  []*row
	// sorted: names[:sorted] are the table's keys, in its order (sorted);
	// the rest are keys it dropped that still run reduced.
	sorted int
}

func (rs *rowSet) get(name string) *row {
	if i, ok := rs.index[name]; ok {
		return rs.rows[i]
	}
	return nil
}

// row is one key of the table in force, as this region runs it.
type row struct {
	version uint64
	sub     uint64 // epoch slot within the version: even runs the table, odd runs reduced
	budget  gcra.Limit
	sched   gcra.Schedule
}

// NewNode returns a Node deciding with store under policy, with no table:
// every global key runs at the safe share until the first Apply.
func NewNode(cfg Config, policy *Policy, store Store) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if policy == nil || store == nil {
		return nil, errors.New("region: NewNode needs a policy and a store")
	}
	if cfg.OneSlot {
		if err := policy.CheckOneSlot(); err != nil {
			return nil, err
		}
	}
	n := &Node{cfg: cfg, store: store, safe: cfg.safePPM(), idle: cfg.idlePPM()}
	n.keys.init(cfg.MaxKeys)
	n.publish(&snapshot{policy: policy})
	return n, nil
}

// publish makes s the snapshot in force.
func (n *Node) publish(s *snapshot) {
	s.gen = n.gen.Add(1)
	n.snap.Store(s)
}

// Policy returns the policy in force.
func (n *Node) Policy() *Policy { return n.snap.Load().policy }

// SetPolicy swaps the policy atomically; requests already resolved finish
// under the old one. Keys whose limit the table does not carry run at the
// safe share until the coordinator's table agrees.
func (n *Node) SetPolicy(p *Policy) {
	n.pubMu.Lock()
	defer n.pubMu.Unlock()
	s := *n.snap.Load()
	s.policy = p
	n.publish(&s)
}

// Fences reports whether the node's decisions carry the region fence
// (Config.Fence).
func (n *Node) Fences() bool { return n.cfg.Fence }

// SafeShare is this region's floor in ppm: the share every key runs at
// before the first table, and the cap on every key once the lease lapses.
func (n *Node) SafeShare() uint32 { return n.safe }

// Interval is Δ, the report interval Tick closes.
func (n *Node) Interval() time.Duration { return n.cfg.Interval }

// SetLiveAgents tells the node how many agents of its region membership
// sees alive (the local failure mode divides by max(Agents, live)).
func (n *Node) SetLiveAgents(live int) { n.live.Store(int64(live)) }

// Stats returns the node's counters.
func (n *Node) Stats() Stats {
	return Stats{
		Decisions: n.decisions.Load(), Peeks: n.peeks.Load(), StoreErrors: n.storeErrors.Load(),
		FallbackOpen: n.fbOpen.Load(), FallbackClosed: n.fbClosed.Load(), FallbackLocal: n.fbLocal.Load(), FallbackError: n.fbError.Load(),
		ShadowDenied: n.shadowDenied.Load(), Overflow: n.overflow.Load(), Reduced: n.reduced.Load(), StateLost: n.stateLost.Load(),
		Regressions: n.regressions.Load(), DenyCacheHits: n.denyHits.Load(),
		LeaseHits: n.leaseHits.Load(), LeaseTakes: n.leaseTakes.Load(), LeaseStranded: n.leaseStranded.Load(),
		Fenced: n.fenced.Load(),
	}
}

// SafeLimit is the limit a region with safe share ppm, one of regions
// regions, runs a global limit at when it runs its safe share: T_r from the
// share (rebalance.RegionalLimit) and the safe burst, 1 + floor((B −
// regions)·ppm/10⁶) when the burst B has a unit for every region, else
// floor(B·ppm/10⁶) (rebalance.SafeBurst), so that the safe bursts of all
// regions sum to at most B whatever their floors, and the coordinator gives
// every region at least its safe burst in every table.
func SafeLimit(global gcra.Limit, ppm uint32, regions int) gcra.Limit {
	return rebalance.SafeLimit(global, ppm, regions)
}

// minLimit is the stricter of a and b in both rate and burst.
func minLimit(a, b gcra.Limit) gcra.Limit {
	if a.IsZero() || b.IsZero() {
		return gcra.Limit{}
	}
	t := max(a.IntervalMicros(), b.IntervalMicros())
	burst := min(a.Burst(), b.Burst())
	if a.IntervalMicros() == t && a.Burst() == burst {
		return a
	}
	if b.IntervalMicros() == t && b.Burst() == burst {
		return b
	}
	return gcra.FromInterval(t, burst)
}

// Store epochs. A key's state carries the low 16 bits of the epoch it was
// written under, and every agent of a region must use the same epoch for
// the same limit, so epochs are a function of what every agent knows: the
// key's version in the table (rebalance.KeyShares.Version) and how many
// times the region reduced it to the safe share and restored it within that
// version. Epoch 1 is the steady safe share of a key no table names (and a
// cold start); epochs 4v+4…4v+7 belong to version v: +0 the table's limit,
// +1 reduced, +2 restored, +3 reduced again (a key reduced twice within one
// version stays reduced until its version moves).
const coldEpoch = 1

func epochOf(version, sub uint64) uint64 { return 4*version + 4 + sub }

// inForceAt is the version of s in force at t.
func inForceAt(s *gcra.Schedule, t int64) gcra.Version {
	if s.HasPrevious && t < s.Current.Effective {
		return s.Previous
	}
	return s.Current
}

// shrunk is l, a regional limit derived from budget from, as the same part
// of budget to where to is the smaller in rate or burst: the interval
// scaled up by to's over from's (rounded up) and the burst scaled down
// (rounded down; nothing left is the zero limit). It is never above l, and
// l where to is not smaller. A budget that shrinks — a policy reload, or a
// table computed for the new budget — thus takes every limit in force
// down with it at once: the coordinator counts each region's share in
// parts per million of the budget its tables carry, and a region still
// running the old budget's regional limit runs more than its part of the
// new one (explorer schedules 83 and 87 of seed 1: Σ shares in force
// 1.9·10⁶ and 1.03·10⁶ ppm of a halved budget until each region's new row
// took effect).
func shrunk(l, from, to gcra.Limit) gcra.Limit {
	if l.IsZero() || from.IsZero() || to.IsZero() {
		return l
	}
	t, b := l.IntervalMicros(), l.Burst()
	if ft, tt := from.IntervalMicros(), to.IntervalMicros(); tt > ft {
		hi, lo := bits.Mul64(uint64(t), uint64(tt))
		if hi >= uint64(ft) {
			return gcra.Limit{}
		}
		q, r := bits.Div64(hi, lo, uint64(ft))
		if r != 0 {
			q++
		}
		if q > uint64(gcra.MaxWindowMicros) {
			return gcra.Limit{}
		}
		t = int64(q)
	}
	b = rebalance.ShrunkBurst(b, from.Burst(), to.Burst())
	if b <= 0 {
		return gcra.Limit{}
	}
	if hi, lo := bits.Mul64(uint64(b), uint64(t)); hi != 0 || lo > uint64(gcra.MaxWindowMicros) {
		b = gcra.MaxWindowMicros / t
	}
	return minLimit(l, gcra.FromInterval(t, b))
}

// shrunkSchedule is s with both versions' limits shrunk from budget from
// to budget to (see shrunk).
func shrunkSchedule(s gcra.Schedule, from, to gcra.Limit) gcra.Schedule {
	if from == to {
		return s
	}
	s.Current.Limit = shrunk(s.Current.Limit, from, to)
	if s.HasPrevious {
		s.Previous.Limit = shrunk(s.Previous.Limit, from, to)
	}
	return s
}

// shrunkVersion is v with its limit shrunk from budget from to to.
func shrunkVersion(v gcra.Version, from, to gcra.Limit) gcra.Version {
	v.Limit = shrunk(v.Limit, from, to)
	return v
}
