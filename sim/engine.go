package sim

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gcra/memstore"
	"github.com/meridian-quota/meridian/gossip/protocol"
	"github.com/meridian-quota/meridian/gossip/wire"
	"github.com/meridian-quota/meridian/rebalance"
	"github.com/meridian-quota/meridian/region"
)

// Event kinds.
const (
	evArrival = iota
	evRetry
	evAgentTick
	evCoordTick
	evReport
	evAck
	evTable
	evSync
	evFailoverDown
	evFailoverUp
	evSwitch      // on/off spell boundary of a key
	evTrace       // the next line of a replayed trace
	evSample      // per-second sample of the top keys' shares
	evSyncDeliver // a replicated-counter sync batch arrives
	evServed      // a reservation's wait ends: c = cost<<1 | oracle
	evElect       // candidate a (generation b) steps: its wait ended or its KV call returned
	evKV          // candidate a's (generation b) KV call reaches the bucket
	evRegionDown  // region a's loss begins: its agents' processes die
	evRegionUp    // region a is back: its agents restart
	evFault       // a cluster fault's edge: a = faultNATSDown … , b = its index
	evWatchRetry  // agent b of region a retries its failed watch
	evResync      // agent b of region a rereads the head
	evCoordRetry  // candidate a (generation b) starts term c again, its first start having failed
	evCampaign    // candidate a (generation b) stands again after its term was fenced
)

// evFault's edges.
const (
	faultNATSDown = iota
	faultNATSUp
	faultKVLost
	faultKVBack
	faultAgentCut
	faultAgentBack
	faultHeadWrite
	faultClockStep
	faultAgentCrash
	faultAgentRestart
	faultPolicyFile    // b: reload j: the file changes (the ideal limiter's budgets)
	faultPolicyAgent   // b: reload j·agents + agent g: agent g reads the file
	faultPolicySettled // b: reload j: every agent has read it
)

// event is one thing that happens at t.
type event struct {
	t    int64
	kind uint8
	a, b int32 // kind-specific: key, region, agent
	c    int64 // kind-specific: cost, attempt
	msg  any   // report, ack or table
}

// item is an event in the heap, packed into 32 bytes: seq<<8 | kind
// breaks ties between equal times in the order events were scheduled, so
// runs are deterministic; a message is kept aside and c indexes it.
type item struct {
	t    int64
	sk   uint64
	a, b int32
	c    int64
}

func (e *item) before(o *item) bool { return e.t < o.t || (e.t == o.t && e.sk < o.sk) }

// eventHeap is a 4-ary min-heap on (t, seq), typed to avoid interface
// calls on the hot path.
type eventHeap []item

func (h *eventHeap) push(e item) {
	*h = append(*h, e)
	q := *h
	i := len(q) - 1
	for i > 0 {
		p := (i - 1) / 4
		if !q[i].before(&q[p]) {
			break
		}
		q[i], q[p] = q[p], q[i]
		i = p
	}
}

func (h *eventHeap) pop() item {
	q := *h
	top := q[0]
	n := len(q) - 1
	q[0] = q[n]
	q = q[:n]
	i := 0
	for {
		c := 4*i + 1
		if c >= n {
			break
		}
		m := c
		for j := c + 1; j < c+4 && j < n; j++ {
			if q[j].before(&q[m]) {
				m = j
			}
		}
		if !q[m].before(&q[i]) {
			break
		}
		q[i], q[m] = q[m], q[i]
		i = m
	}
	*h = q
	return top
}

// key is one simulated key.
type key struct {
	name   string     // region.KeyName
	value  string     // the descriptor value
	rule   int        // its rule's index in every policy version's Rules()
	budget gcra.Limit // the ideal limiter's budget now (a policy reload changes it at its At)
	// reqs, period, burst: the budget of each policy version
	// (Run.policies), as the policy file writes it.
	reqs    []int64
	period  time.Duration
	burst   []int64
	rate    float64   // offered requests/s in total
	mix     []float64 // per region: part of the key's traffic (sums to 1)
	home    int       // the region its home traffic is offered in (mix's home)
	moves   []homeMove
	lmax    float64 // thinning bound on the key's rate multiplier
	on      bool
	req     region.Request
	prep    []*region.Prepared // per agent (regionState.first + agent), made on first use
	rank    int                // popularity rank (0 = most popular)
	oracle  int64
	rcTAT   []int64 // replicated-counter: per region local TAT
	rcOut   []int64 // replicated-counter: [s·R+r] cost admitted in s not yet delivered to r
	pending bool
}

// regionState is one simulated region: its store (one Redis), its agents.
type regionState struct {
	name   string
	skew   int64
	clock  int64 // the store's clock reading: set before every call
	store  *memstore.Store
	fail   failStore
	nodes  []*region.Node
	clocks []region.Clock      // per agent: its time, from its host's wall clock (nodeNow)
	acked  [][2]uint64         // per agent: the (term, epoch) last acknowledged
	fence  []fenceRead         // per agent: the region fence its store held when it last raised it
	follow []protocol.Follower // per agent: which tables reach it, as gossip.Loop decides
	watch  []agentWatch        // per agent: its watch of the table head
	ncfg   []region.Config     // per agent: its node's configuration
	busOut []int64             // per agent: messages it published (reports' chunks, acks)
	kvOps  []int64             // per agent: its calls to the bucket (election, head reads)
	dead   []bool              // per agent: its process crashed (agent_crash) and is not back
	rr     int
	weight float64
	first  int // index of this region's first agent among all agents
	// fetched is the (term, epoch) whose chunks the region's agents last
	// fetched: a region pays a table's chunks once (writeHead's model).
	fetched [2]uint64
}

// pick is the agent the region's next request goes to: round robin over
// the agents whose process runs (allDead says whether there is one).
func (rg *regionState) pick() int {
	for range len(rg.nodes) {
		a := rg.rr % len(rg.nodes)
		rg.rr++
		if !rg.dead[a] {
			return a
		}
	}
	return 0
}

// allDead reports whether every agent of the region has crashed.
func (rg *regionState) allDead() bool { return !slices.Contains(rg.dead, false) }

// nodeNow is agent a's time at t: its host's wall clock (the region's
// skewed clock, which its store reads too) through its region.Clock, as
// the agent shell computes it.
func (rg *regionState) nodeNow(a int, t int64) int64 { return rg.clocks[a].Now(t + rg.skew) }

// fenceRead is what an agent's raise of the region fence read back: the
// fence the store held and its identity (gossip.Loop.SetFence).
type fenceRead struct {
	held  gcra.Fence
	store uint64
}

// ackMsg is an acknowledgement on its way to the coordinator.
type ackMsg struct {
	term, epoch uint64
	fence       fenceRead
}

// failStore is the region's store as the Node sees it: the memstore, or
// an error while the region's Redis is out.
type failStore struct {
	s    *memstore.Store
	down bool
}

var errRedisDown = errors.New("sim: redis outage")

// Reserve implements region.Reserver.
func (f *failStore) Reserve(ctx context.Context, k gcra.Key, s gcra.Schedule, cost int64, maxWait time.Duration) (gcra.Result, error) {
	if f.down {
		return gcra.Result{}, errRedisDown
	}
	return f.s.Reserve(ctx, k, s, cost, maxWait)
}

func (f *failStore) DecideAll(ctx context.Context, c []gcra.Check, out []gcra.Result) (gcra.Result, error) {
	if f.down {
		return gcra.Result{}, errRedisDown
	}
	return f.s.DecideAll(ctx, c, out)
}

// Bind implements gcra.Binder: the memstore's binding, failing while the
// region's Redis is out.
func (f *failStore) Bind(k gcra.Key) (gcra.Binding, error) {
	b, err := f.s.Bind(k)
	if err != nil {
		return nil, err
	}
	return &failBinding{f: f, b: b}, nil
}

type failBinding struct {
	f *failStore
	b gcra.Binding
}

func (fb *failBinding) Decide(ctx context.Context, s *gcra.Schedule, cost int64) (gcra.Result, error) {
	if fb.f.down {
		return gcra.Result{}, errRedisDown
	}
	return fb.b.Decide(ctx, s, cost)
}

// Run is one simulation: one scenario, strategy, interval and seed.
type Run struct {
	onArrival func(Arrival) // OnArrival
	// timing: TimeTables was called; tableTimes the wall time of each
	// table the coordinator made (see Result.TableTimes).
	timing     bool
	tableTimes []time.Duration
	sc         *Scenario
	strategy   string
	interval   int64 // µs
	seed       uint64
	rng        *rand.Rand

	now     int64
	seq     uint64
	events  eventHeap
	msgs    []any   // messages of scheduled events
	free    []int32 // free slots of msgs
	keys    []key
	regions []*regionState
	policy  *region.Policy // the policy the run starts with (policies[0])
	// policies are the policy file's versions: the first, then one per
	// policy reload in time order (reloads).
	policies []*region.Policy
	reloads  []ReloadSpec
	rcfg     rebalance.Config

	coord    *protocol.Term // the coordinator's term, as gossip.Loop runs it; nil while down
	coordIdx int            // the region of the coordinator (the last one while none leads)
	term     uint64
	stored   *rebalance.Table       // the latest table a coordinator stored
	cenc     *protocol.TableEncoder // the running term's, as coordinate keeps it
	crev     uint64                 // the head revision the running term last wrote or read

	// The KV bucket and NATS (cluster.go).
	tkv          tableStore
	bucketSeq    uint64 // the bucket's revision sequence (head and election key)
	signKey      ed25519.PrivateKey
	forgeKey     ed25519.PrivateKey
	verifyKeys   []ed25519.PublicKey
	decoded      map[*byte]decoded // each distinct message's wire.Decode (newReader)
	decodedBytes int64             // the encoded bytes of the messages in decoded
	// krng draws the links of the agents' own head reads (resyncs, watch
	// re-creations) and of duplicates: a stream of its own, so that runs
	// without faults draw their workload exactly as before the bucket was
	// simulated.
	krng *rand.Rand
	// forgedDepose lists when a term was fenced by a head no coordinator
	// wrote (the explorer's check; kept only when checking).
	forgedDepose []int64
	// reportChunks is the most chunks one report took (the resource
	// bound's report size).
	reportChunks int
	// crashed is, per agent_crash, the agent it crashed (region, agent;
	// -1 until it happens, or when it crashed nobody).
	crashed [][2]int

	// The coordinator election, as gossip.Election.Campaign runs it: every
	// agent a protocol.Candidate on the bucket's election key.
	cands     []candidate
	leader    int // index in cands of the candidate whose term runs; -1 while none
	elect     electKV
	erng      *rand.Rand // the candidates' poll jitter: its own stream, so the workload's draws do not move
	failedAt  []int      // per coordinator failover: the candidate it crashed (-1: none led)
	terms     []TermStart
	end       int64
	warmup    int64
	tickEvery int64

	trace    *Trace
	tr       *traceReader
	traceLn  traceLine
	traceErr error

	m      *metrics
	rd     region.Decision // reservations' workspace
	ctx    context.Context
	dec    decisions
	agents int // agents across regions

	// check, when set, runs after each handled event (the explorer's
	// checkers, explore.go); an error it returns ends the run with it.
	check func(*Run, *event) error
}

// decisions counts what the run decided.
type decisions struct {
	Requests, Admitted, Retries, Dropped int64
	Reports, Tables, Acks, Lost          int64
	ReportBytes, TableBytes, AckBytes    int64
	Fallbacks, Errored                   int64
	// What production's protocol code refused or counted: reports the
	// coordinator's queue dropped, reported keys beyond MaxKeys (per
	// report naming them), tables an agent's Follower found stale.
	QueueDropped, Overflow, StaleTables int64
	// The bucket: heads agents refused (no verified table), head reads
	// (resyncs, watch re-creations), stores fenced and failed.
	InvalidHeads, HeadReads, Fenced, StoreErrors int64
}

// NewRun prepares a run of sc under one strategy, interval and seed,
// replaying trace instead of the scenario's workload when it is not nil.
func NewRun(sc *Scenario, strategy string, interval time.Duration, seed uint64, trace *Trace) (*Run, error) {
	r := &Run{sc: sc, strategy: strategy, interval: interval.Microseconds(), seed: seed, trace: trace,
		rng: rand.New(rand.NewPCG(seed, 0x6d6572696469616e)), ctx: context.Background(),
		erng: rand.New(rand.NewPCG(seed, 0x656c656374696f6e)), krng: rand.New(rand.NewPCG(seed, 0x6275636b6574)), leader: -1}
	r.end = us(sc.Duration)
	r.clusterKeys()
	if trace != nil {
		r.end = (trace.end + 999_999) / 1_000_000 * 1_000_000
	}
	r.warmup = us(sc.Warmup)
	// Agents and the coordinator run their loops every 100 ms (at most
	// Δ/10), as the shells do: acknowledgements and the increases that wait
	// for them go out promptly, not a whole Δ later.
	r.tickEvery = min(r.interval/10, 100_000)
	if err := r.buildKeys(); err != nil {
		return nil, err
	}
	if err := r.buildRegions(); err != nil {
		return nil, err
	}
	y := yardstick{names: make([]string, len(r.keys)), budgets: make([]gcra.Limit, len(r.keys)),
		regions: len(r.regions), warmup: r.warmup, shift: us(sc.Shift), end: r.end}
	for i := range r.keys {
		y.names[i], y.budgets[i] = r.keys[i].name, r.keys[i].budget
	}
	r.m = newMetrics(y)
	return r, nil
}

// budgetFor turns a rate in requests/s into a budget with the scenario's
// burst, in whole requests per minute or hour (so T keeps the rate within
// the 1 % rounding rule).
func budgetFor(rate, burstSeconds float64) (requests int64, period time.Duration, burst int64) {
	period = time.Minute
	requests = int64(math.Round(rate * 60))
	if requests < 100 {
		period = time.Hour
		requests = max(1, int64(math.Round(rate*3600)))
	}
	burst = max(1, int64(math.Round(rate*burstSeconds)))
	return validRate(requests, period, burst), period, burst
}

// validRate is q requests per period, or — when gcra would refuse that for
// losing more than 1 % to its whole-µs emission interval (a rate above
// about 10,000/s) — the nearest exact rate (exactRate). Rates gcra takes
// stay as they are, so every scenario that ran before runs the same.
func validRate(q int64, period time.Duration, burst int64) int64 {
	if gcra.New(q, period, burst).Validate() == nil {
		return q
	}
	return exactRate(q, period)
}

func (r *Run) buildKeys() error {
	sc := r.sc
	n := sc.Keys.Count
	if r.trace != nil {
		n = len(r.trace.keys)
	}
	// Popularity: Zipf weights over ranks, the aggregate rate split by them.
	w := make([]float64, n)
	sum := 0.0
	for i := range w {
		w[i] = 1 / math.Pow(float64(i+1), sc.Keys.Zipf)
		sum += w[i]
	}
	// Key-level randomness comes from its own stream so that the same
	// scenario and seed give the same keys whatever the strategy.
	krng := rand.New(rand.NewPCG(r.seed, 1))
	mu := 0.0
	if sc.Keys.Ratio == 0 {
		mu = -sc.Keys.Sigma * normQuantile(1-sc.Keys.OverFraction)
	}
	regW := 0.0
	for _, rg := range sc.Regions {
		regW += rg.Weight
	}
	r.keys = make([]key, n)
	classOf := map[sharedBudget]int{} // SharedRules: each distinct budget's rule
	var classes []sharedBudget
	for i := range r.keys {
		k := &r.keys[i]
		k.rank = i
		k.rate = sc.Workload.Rate * w[i] / sum
		k.value = fmt.Sprintf("key-%06d", i)
		if r.trace != nil {
			k.rate = float64(r.trace.offered[i]) / (float64(r.end) / 1e6)
			k.value = r.trace.keys[i]
		}
		ratio := sc.Keys.Ratio
		if ratio == 0 {
			ratio = math.Exp(mu + sc.Keys.Sigma*krng.NormFloat64())
		}
		budgetRate := max(k.rate/ratio, 1.0/3600)
		if sc.Keys.SharedRules {
			budgetRate = math.Exp2(math.Floor(math.Log2(budgetRate)*sharedSteps) / sharedSteps)
		}
		reqs, period, burst := budgetFor(budgetRate, sc.Keys.Burst)
		k.reqs, k.period, k.burst = []int64{reqs}, period, []int64{burst}
		entries := []region.Entry{{Key: "k", Value: k.value}}
		k.rule = i
		if sc.Keys.SharedRules {
			b := sharedBudget{reqs, period, burst}
			c, ok := classOf[b]
			if !ok {
				c = len(classes)
				classOf[b] = c
				classes = append(classes, b)
			}
			k.rule = c
			entries = []region.Entry{{Key: "c", Value: strconv.Itoa(c)}, {Key: "k", Value: k.value}}
		}
		k.name = region.KeyName("sim", entries)
		// Region mix: home share plus the rest by weight.
		home := pickWeighted(krng, sc.Regions)
		k.mix = make([]float64, len(sc.Regions))
		for j, rg := range sc.Regions {
			k.mix[j] = (1 - sc.Keys.HomeFraction) * rg.Weight / regW
		}
		k.mix[home] += sc.Keys.HomeFraction
		k.home = home
		k.on = true
		k.req = region.Request{Domain: "sim", Cost: 1, Descriptors: []region.Descriptor{{Entries: entries}}}
	}
	if m := sc.Keys.Migrations; m != nil {
		r.drawMigrations(m)
	}
	// The policy reloads, in time order: version v+1 scales the Keys most
	// popular keys' budgets of version v.
	r.reloads = slices.Clone(sc.Faults.PolicyReloads)
	slices.SortStableFunc(r.reloads, func(a, b ReloadSpec) int { return cmp.Compare(a.At, b.At) })
	for j, rl := range r.reloads {
		if rl.Keys > n {
			return fmt.Errorf("sim: faults.policy_reloads[%d].keys: %d, but the run has %d keys", j, rl.Keys, n)
		}
		for i := range r.keys {
			k := &r.keys[i]
			q, b := k.reqs[j], k.burst[j]
			if i < rl.Keys {
				q, b = max(1, int64(math.Round(float64(q)*rl.Scale))), max(1, int64(math.Round(float64(b)*rl.Scale)))
				q = validRate(q, k.period, b)
			}
			k.reqs, k.burst = append(k.reqs, q), append(k.burst, b)
		}
	}
	// One rule per key (descriptor value = the key's id), or with
	// SharedRules one wildcard rule per distinct budget (and no reloads:
	// Validate): the policy the nodes resolve requests with is the one the
	// coordinator's term budgets reported keys by (RuleForKey on the key's
	// name).
	for v := range len(r.reloads) + 1 {
		var pol strings.Builder
		pol.WriteString("domains:\n  - domain: sim\n    descriptors:\n")
		if sc.Keys.SharedRules {
			for c, b := range classes {
				fmt.Fprintf(&pol, "      - {key: c, value: \"%d\", descriptors: [{key: k, rate_limit: {period: %s, requests_per_unit: %d, burst: %d, failure_mode: %s}}]}\n",
					c, b.period, b.reqs, b.burst, sc.FailureMode)
			}
		} else {
			for i := range r.keys {
				k := &r.keys[i]
				fmt.Fprintf(&pol, "      - {key: k, value: %q, rate_limit: {period: %s, requests_per_unit: %d, burst: %d, failure_mode: %s}}\n",
					k.value, k.period, k.reqs[v], k.burst[v], sc.FailureMode)
			}
		}
		p, err := region.ParsePolicy([]byte(pol.String()))
		if err != nil {
			return fmt.Errorf("sim: build the policy: %w", err)
		}
		r.policies = append(r.policies, p)
	}
	r.policy = r.policies[0]
	rules := r.policy.Rules()
	for i := range r.keys {
		r.keys[i].budget = rules[r.keys[i].rule].Limit
	}
	return nil
}

// sharedSteps is SharedRules' grid: budget rates are rounded down to
// 2^(j/sharedSteps) requests/s.
const sharedSteps = 16

// sharedBudget is one rule's budget under SharedRules.
type sharedBudget struct {
	reqs   int64
	period time.Duration
	burst  int64
}

// exactRate is q requests per period moved to the nearest rate whose
// emission interval is a whole number of µs, so that gcra does not refuse
// it for losing more than 1 % to rounding (a budget scaled up past about
// 10,000/s: 688,904 per minute rounds T up from 87.1 to 88 µs). The
// smallest q' ≥ period/T for T = ceil(period/q) has interval T exactly.
func exactRate(q int64, period time.Duration) int64 {
	p := period.Microseconds()
	t := (p + q - 1) / q
	return max(1, (p+t-1)/t)
}

// filePolicy is the policy file as it reads now: the version of the last
// policy reload at or before now.
func (r *Run) filePolicy() *region.Policy {
	v := 0
	for v < len(r.reloads) && us(r.reloads[v].At) <= r.now {
		v++
	}
	return r.policies[v]
}

func pickWeighted(rng *rand.Rand, regions []RegionSpec) int {
	total := 0.0
	for _, r := range regions {
		total += r.Weight
	}
	x := rng.Float64() * total
	for i, r := range regions {
		if x < r.Weight {
			return i
		}
		x -= r.Weight
	}
	return len(regions) - 1
}

// normQuantile is Φ⁻¹(p) (Acklam's rational approximation, |error| < 1.2e-9).
func normQuantile(p float64) float64 {
	a := [6]float64{-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02, 1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00}
	b := [5]float64{-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02, 6.680131188771972e+01, -1.328068155288572e+01}
	c := [6]float64{-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00, -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00}
	d := [4]float64{7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00}
	const lo = 0.02425
	switch {
	case p < lo:
		q := math.Sqrt(-2 * math.Log(p))
		return (((((c[0]*q+c[1])*q+c[2])*q+c[3])*q+c[4])*q + c[5]) / ((((d[0]*q+d[1])*q+d[2])*q+d[3])*q + 1)
	case p > 1-lo:
		q := math.Sqrt(-2 * math.Log(1-p))
		return -(((((c[0]*q+c[1])*q+c[2])*q+c[3])*q+c[4])*q + c[5]) / ((((d[0]*q+d[1])*q+d[2])*q+d[3])*q + 1)
	}
	q := p - 0.5
	t := q * q
	return (((((a[0]*t+a[1])*t+a[2])*t+a[3])*t+a[4])*t + a[5]) * q / (((((b[0]*t+b[1])*t+b[2])*t+b[3])*t+b[4])*t + 1)
}

func (r *Run) regionNames() []string {
	out := make([]string, len(r.sc.Regions))
	for i, rg := range r.sc.Regions {
		out[i] = rg.Name
	}
	return out
}

func (r *Run) buildRegions() error {
	names := r.regionNames()
	cfg := rebalance.DefaultConfig(names...)
	cfg.Interval = time.Duration(r.interval) * time.Microsecond
	if r.sc.Lease > 0 {
		cfg.Lease = r.sc.Lease.D()
	}
	if r.sc.MaxSkew > 0 {
		cfg.MaxSkew = r.sc.MaxSkew.D()
	}
	if r.sc.Fence > 0 {
		cfg.Fence = r.sc.Fence.D()
	}
	if f := r.sc.SafeFraction; f != nil {
		cfg.SafeFraction = *f
	}
	if f := r.sc.IdleSafeFraction; f != nil {
		cfg.IdleSafeFraction = *f
	}
	if r.sc.FloorWindow > 0 {
		cfg.FloorWindow = r.sc.FloorWindow.D()
	}
	cfg.Strategy = r.strategy
	if r.baseline() {
		cfg.Strategy = "static" // unused: the baselines have no coordinator
	}
	cfg.Params.AllowOvercommit = r.strategy == "full"
	if err := cfg.Validate(); err != nil {
		return err
	}
	r.rcfg = cfg
	for i, rg := range r.sc.Regions {
		st := &regionState{name: rg.Name, skew: us(rg.ClockSkew), weight: rg.Weight}
		mcfg := memstore.DefaultConfig()
		mcfg.Shards = 16
		mcfg.Clock = func() int64 { return st.clock }
		// The region's Redis: the same identity in every run, as wide as a
		// real one's hash (acknowledgements carry it).
		mcfg.ID = (uint64(i)+1)*0x9e3779b97f4a7c15 | 1<<63
		ms, err := memstore.New(mcfg)
		if err != nil {
			return err
		}
		st.store = ms
		st.fail.s = ms
		st.first = r.agents
		r.agents += rg.Agents
		for a := range rg.Agents {
			ncfg := region.DefaultConfig(rg.Name, fmt.Sprintf("%s-%d", rg.Name, a+1), names...)
			ncfg.Interval = cfg.Interval
			ncfg.Agents = rg.Agents
			ncfg.SafeFraction = cfg.SafeFraction
			ncfg.IdleSafeFraction = cfg.IdleSafeFraction
			ncfg.MaxSkew = cfg.MaxSkew
			ncfg.MaxReserveWait = cfg.Fence // the horizon the agent allows: the fence
			ncfg.Fence = true               // as the agent on one Redis: deliverHead raises the region fence
			st.ncfg = append(st.ncfg, ncfg)
			n, err := region.NewNode(ncfg, r.policy, &st.fail)
			if err != nil {
				return err
			}
			st.nodes = append(st.nodes, n)
			st.clocks = append(st.clocks, region.Clock{})
			st.acked = append(st.acked, [2]uint64{})
			st.fence = append(st.fence, fenceRead{})
			st.follow = append(st.follow, protocol.Follower{})
			st.watch = append(st.watch, agentWatch{})
			st.busOut = append(st.busOut, 0)
			st.kvOps = append(st.kvOps, 0)
			st.dead = append(st.dead, false)
		}
		r.regions = append(r.regions, st)
		if rg.Name == r.sc.Coordinator.Region {
			r.coordIdx = i
		}
	}
	switch r.strategy {
	case ReplicatedCounter:
		for i := range r.keys {
			r.keys[i].rcTAT = make([]int64, len(r.regions))
			r.keys[i].rcOut = make([]int64, len(r.regions)*len(r.regions))
		}
		return nil
	case Oracle:
		return nil
	}
	return r.buildCandidates()
}

// termConfig is the configuration each coordinator term runs on.
func (r *Run) termConfig() protocol.CoordinatorConfig {
	return protocol.CoordinatorConfig{
		Coordinator: r.rcfg,
		// Production's defaults (gossip.DefaultLoopConfig uses the same);
		// a scenario has no knob for them yet.
		MaxKeys: protocol.DefaultMaxKeys,
		// At least one interval, as an operator must configure it for a
		// longer Δ (Validate refuses less).
		KeyIdle: max(protocol.DefaultKeyIdle, r.rcfg.Interval),
		Queue:   protocol.DefaultQueue,
	}
}

// startCoordinator starts term on candidate ci at now as gossip.Loop's
// coordinate does: it reads the head (a failed read: coordinate returns,
// and campaignOnce starts it again a second later), starts a
// protocol.Term from the table the head holds (none, or one it cannot
// verify: the floors) with the live members (given to the core before its
// StartTerm), and stores and publishes its first table at once. A
// NewTerm refusal (the stored table's term is not below this one) deposes
// it as a fenced store does. The term learns its keys from the reports
// that name them, budgeted by the nodes' policy, and keeps the stored
// table's.
func (r *Run) startCoordinator(ci int, term uint64, now int64) error {
	c := &r.cands[ci]
	if !r.kvReachable(c.ri, c.a) {
		r.schedule(event{t: r.now + 1_000_000, kind: evCoordRetry, a: int32(ci), b: int32(c.gen), c: int64(term)})
		return nil
	}
	var latest *rebalance.Table
	r.crev = r.tkv.rev
	if r.tkv.head != nil {
		t, err := r.readHead(r.tkv.head)
		if err != nil {
			r.dec.InvalidHeads++
		} else {
			latest = t
		}
	}
	if lt, le := r.regions[c.ri].follow[c.a].Last(); protocol.Replayed(latest, lt, le) {
		r.dec.InvalidHeads++
		latest = nil
	}
	r.cenc = protocol.NewTableEncoder(wireCluster, r.signKey, wire.DefaultMaxMessage, latest)
	c.led = max(c.led, term)
	if latest != nil {
		c.led = max(c.led, latest.Term)
	}
	tm, err := protocol.NewTerm(r.termConfig(), term, latest, r.live(), r.regions[c.ri].nodes[c.a].Policy(), now)
	if errors.Is(err, protocol.ErrDeposed) {
		r.deposeCandidate(ci)
		return nil
	}
	if err != nil {
		return fmt.Errorf("sim: start coordinator term %d: %w", term, err)
	}
	r.term, r.coord = term, tm
	if err := r.termEvents(); err != nil {
		return err
	}
	return r.publish(tm.Unstored())
}

// live lists the agents the coordinator can see, sorted as
// protocol.Membership.Live lists them: those of the regions that were up
// and not partitioned from it, and whose process ran, the scenario's
// failure-detection delay ago (membership.detect: memberlist notices a
// change that long after it), less the agents it falsely suspects now.
// Never nil: the sim always has membership.
func (r *Run) live() []rebalance.Member {
	members := []rebalance.Member{}
	t := r.now - us(r.sc.Membership.Detect)
	for ri, rg := range r.regions {
		if r.regionDown(ri, t) || r.partitionedAt(ri, r.coordIdx, t) {
			continue
		}
		for a := range rg.nodes {
			if r.suspected(ri, a) || r.crashedAt(ri, a, t) {
				continue
			}
			members = append(members, rebalance.Member{Region: rg.name, Agent: agentName(rg.name, a)})
		}
	}
	slices.SortFunc(members, func(a, b rebalance.Member) int {
		return cmp.Or(strings.Compare(a.Region, b.Region), strings.Compare(a.Agent, b.Agent))
	})
	return members
}

// agentName is the name of region rg's agent a (0-based).
func agentName(rg string, a int) string { return fmt.Sprintf("%s-%d", rg, a+1) }

// termEvents drains what the term refused or counted. A refused
// membership list or budgets would mean the simulator built a cluster its
// coordinator cannot run — a bug, so it fails the run; overflowing keys
// are counted, and a refused report (from an unknown region: none is
// sent) fails too.
func (r *Run) termEvents() error {
	for _, e := range r.coord.Events() {
		switch e.Kind {
		case protocol.EventOverflow:
			r.dec.Overflow += int64(e.N)
		default:
			return fmt.Errorf("sim: coordinator term %d: %v: %w", r.term, e.Kind, e.Err)
		}
	}
	return nil
}

// partitioned reports whether a partition separates regions a and b now.
func (r *Run) partitioned(a, b int) bool { return r.partitionedAt(a, b, r.now) }

// partitionedAt reports whether a partition separates regions a and b at t.
func (r *Run) partitionedAt(a, b int, t int64) bool {
	for _, p := range r.sc.Faults.Partitions {
		if inSpell(t, p.At, p.For) && slices.Contains(p.Side, r.regions[a].name) != slices.Contains(p.Side, r.regions[b].name) {
			return true
		}
	}
	return false
}

// baseline reports whether the run models a system other than Meridian
// (no coordinator, no nodes deciding).
func (r *Run) baseline() bool { return r.strategy == ReplicatedCounter || r.strategy == Oracle }

func (r *Run) schedule(e event) {
	r.seq++
	it := item{t: e.t, sk: r.seq<<8 | uint64(e.kind), a: e.a, b: e.b, c: e.c}
	if e.msg != nil {
		if n := len(r.free); n > 0 {
			it.c = int64(r.free[n-1])
			r.free = r.free[:n-1]
			r.msgs[it.c] = e.msg
		} else {
			it.c = int64(len(r.msgs))
			r.msgs = append(r.msgs, e.msg)
		}
	}
	r.events.push(it)
}

// unpack turns a heap item back into its event, releasing its message slot.
func (r *Run) unpack(it item) event {
	e := event{t: it.t, kind: uint8(it.sk), a: it.a, b: it.b, c: it.c}
	switch e.kind {
	case evReport, evAck, evTable, evSyncDeliver, evKV:
		e.msg = r.msgs[it.c]
		r.msgs[it.c] = nil
		r.free = append(r.free, int32(it.c))
	}
	return e
}

// TimeTables makes Simulate measure the wall time the coordinator spends
// on each table it makes (Result.TableTimes). Call it before Simulate.
func (r *Run) TimeTables() { r.timing = true }

// Simulate runs to the end and returns the result.
func (r *Run) Simulate() (*Result, error) {
	if r.trace != nil {
		tr, err := r.trace.open()
		if err != nil {
			return nil, err
		}
		defer tr.close()
		r.tr = tr
		r.readTrace()
	}
	r.schedule(event{t: 1_000_000, kind: evSample})
	// Arrivals: one thinned Poisson stream per key.
	for i := range r.keys {
		if r.trace != nil {
			break
		}
		r.keys[i].lmax = r.maxMultiplier(i)
		r.nextArrival(i, 0)
		if o := r.sc.Workload.OnOff; o != nil {
			r.keys[i].on = r.rng.Float64() < float64(o.MeanOn)/float64(o.MeanOn+o.MeanOff)
			r.schedule(event{t: r.spell(r.keys[i].on), kind: evSwitch, a: int32(i)})
		}
	}
	for ri, rg := range r.regions {
		for a := range rg.nodes {
			r.schedule(event{t: 0, kind: evAgentTick, a: int32(ri), b: int32(a)})
		}
	}
	switch r.strategy {
	case ReplicatedCounter:
		r.schedule(event{t: us(r.sc.Sync), kind: evSync})
	case Oracle:
	default:
		// The coordinator's loop runs on its own timer, half a tick out of
		// step with the agents' (in a deployment the phase between them is
		// arbitrary). In lockstep, and ordered before the agents' ticks,
		// every rebalance would run at the instant the agents close an
		// interval, a link latency before that interval's reports arrive,
		// and so decide on demand a whole Δ older than it need be — the
		// first one on no demand at all.
		r.schedule(event{t: r.interval + r.tickEvery/2, kind: evCoordTick})
	}
	if len(r.cands) > 0 {
		// The first candidate won the first election at build time; the
		// others campaign from the start.
		for ci := 1; ci < len(r.cands); ci++ {
			r.schedule(event{t: 0, kind: evElect, a: int32(ci)})
		}
		r.failedAt = make([]int, len(r.sc.Coordinator.Failovers))
		for i, f := range r.sc.Coordinator.Failovers {
			r.schedule(event{t: us(f.At), kind: evFailoverDown, a: int32(i)})
			r.schedule(event{t: us(f.At + f.For), kind: evFailoverUp, a: int32(i)})
		}
		for _, f := range r.sc.Faults.RegionLoss {
			ri := int32(slices.IndexFunc(r.regions, func(g *regionState) bool { return g.name == f.Region }))
			r.schedule(event{t: us(f.At), kind: evRegionDown, a: ri})
			r.schedule(event{t: us(f.At + f.For), kind: evRegionUp, a: ri})
		}
		r.scheduleClusterFaults()
	}
	// One event, reused: handle and check take its address, so one
	// declared in the loop moved to the heap at every event (137 MB of
	// garbage in five steady-skew runs). Neither keeps the pointer.
	var e event
	for len(r.events) > 0 {
		e = r.unpack(r.events.pop())
		if e.t >= r.end {
			break
		}
		r.now = e.t
		r.m.advance(e.t)
		if err := r.handle(&e); err != nil {
			return nil, err
		}
		if r.check != nil {
			if err := r.check(r, &e); err != nil {
				return nil, err
			}
		}
	}
	r.m.advance(r.end)
	if r.tr != nil && r.traceErr != nil {
		return nil, r.traceErr
	}
	return r.result(), nil
}

// readTrace schedules the trace's next line.
func (r *Run) readTrace() {
	ln, ok, err := r.tr.p.next()
	if err != nil {
		r.traceErr = err // the file changed since it was validated
		return
	}
	if ok && ln.ts < r.end {
		r.traceLn = ln
		r.schedule(event{t: ln.ts, kind: evTrace})
	}
}

// spell draws the length of an on (or off) spell: Pareto with the
// configured shape and mean.
func (r *Run) spell(on bool) int64 {
	o := r.sc.Workload.OnOff
	mean := us(o.MeanOff)
	if on {
		mean = us(o.MeanOn)
	}
	xm := float64(mean) * (o.Alpha - 1) / o.Alpha
	u := 1 - r.rng.Float64()
	return r.now + max(1, int64(xm/math.Pow(u, 1/o.Alpha)))
}

// multiplier is key i's traffic multiplier in region ri at t (true time).
func (r *Run) multiplier(i, ri int, t int64) float64 {
	m := 1.0
	w := &r.sc.Workload
	if f := w.FollowTheSun; f != nil {
		phase := 2 * math.Pi * float64(ri) / float64(len(r.regions))
		m *= 1 + f.Amplitude*math.Sin(2*math.Pi*float64(t)/float64(us(f.Period))+phase)
	}
	for _, fl := range w.Flash {
		if r.keys[i].rank < fl.Keys && r.regions[ri].name == fl.Region && t >= us(fl.At) && t < us(fl.At+fl.For) {
			m *= fl.Factor
		}
	}
	return m
}

// maxMultiplier bounds Σ_r mix_r · multiplier_r for thinning.
func (r *Run) maxMultiplier(i int) float64 {
	w := &r.sc.Workload
	m := 1.0
	if f := w.FollowTheSun; f != nil {
		m *= 1 + f.Amplitude
	}
	for _, fl := range w.Flash {
		if r.keys[i].rank < fl.Keys {
			m *= max(1, fl.Factor)
		}
	}
	return m
}

// nextArrival schedules key i's next candidate arrival after t.
func (r *Run) nextArrival(i int, t int64) {
	k := &r.keys[i]
	rate := k.rate * k.lmax / 1e6 // per µs
	gap := r.rng.ExpFloat64() / rate
	if gap > float64(r.end) {
		return
	}
	next := t + max(1, int64(gap))
	if next < r.end {
		r.schedule(event{t: next, kind: evArrival, a: int32(i)})
	}
}

func (r *Run) handle(e *event) error {
	switch e.kind {
	case evArrival:
		i := int(e.a)
		r.nextArrival(i, e.t)
		k := &r.keys[i]
		if !k.on || r.churnedOut(i) {
			return nil
		}
		// Thinning: accept with Σ mix·mult / lmax, and pick the region.
		var wa [16]float64
		ws := wa[:0]
		total := 0.0
		for ri := range r.regions {
			w := k.mix[ri] * r.multiplier(i, ri, e.t)
			ws = append(ws, w)
			total += w
		}
		if r.rng.Float64()*k.lmax >= total {
			return nil
		}
		x := r.rng.Float64() * total
		ri := len(ws) - 1
		for j, w := range ws {
			if x < w {
				ri = j
				break
			}
			x -= w
		}
		if ri == k.home && len(k.moves) > 0 {
			// Traffic offered in the key's first home (its home share
			// and that region's part of the spread) arrives where the
			// key lives now: with home_fraction 1 a key lives in one
			// region at a time.
			ri = r.homeAt(i, e.t)
		}
		r.arrive(i, r.route(ri, e.t), r.cost(), 0)
	case evTrace:
		ln := r.traceLn
		r.readTrace()
		r.arrive(r.trace.index[ln.key], r.route(ln.region, e.t), ln.cost, 0)
	case evSample:
		r.sample()
		r.schedule(event{t: e.t + 1_000_000, kind: evSample})
	case evRetry:
		r.dec.Retries++
		r.arrive(int(e.a), int(e.b), e.c>>retryCostBits, int(e.c&(1<<retryCostBits-1)))
	case evSwitch:
		k := &r.keys[e.a]
		k.on = !k.on
		r.schedule(event{t: r.spell(k.on), kind: evSwitch, a: e.a})
	case evAgentTick:
		r.agentTick(int(e.a), int(e.b))
		r.schedule(event{t: e.t + r.tickEvery, kind: evAgentTick, a: e.a, b: e.b})
	case evCoordTick:
		// gossip.Loop.coordinate's tick: the policy in force, the live
		// members, the term's Tick; then store and publish what it returns.
		if tm := r.coord; tm != nil {
			c := r.cands[r.leader]
			tm.Policy(r.regions[c.ri].nodes[c.a].Policy()) // its own agent's node's, as gossip.Loop hands it
			tm.Members(r.live())
			var start time.Time
			if r.timing {
				start = time.Now()
			}
			t := tm.Tick(r.coordNow())
			if err := r.termEvents(); err != nil {
				return err
			}
			if tm.Deposed() != nil {
				// As gossip.Loop: an agent runs a table above this
				// term's, so the term ends and the candidate stands
				// again above it.
				r.cands[r.leader].led = max(r.cands[r.leader].led, tm.Outranked())
				r.dec.Fenced++
				r.deposeCandidate(r.leader)
			} else if err := r.publish(t); err != nil {
				return err
			} else if r.timing && t != nil {
				r.tableTimes = append(r.tableTimes, time.Since(start))
			}
		}
		r.schedule(event{t: e.t + r.tickEvery, kind: evCoordTick})
	case evReport:
		if tm := r.coord; tm != nil {
			sr := e.msg.(*sentReport)
			if a := tm.Report(sr.rep, sr.sent, r.coordNow()); !a.Queued {
				r.dec.QueueDropped++
			}
		}
	case evAck:
		if tm := r.coord; tm != nil {
			rg := r.regions[e.a]
			am := e.msg.(*ackMsg)
			_ = tm.AckFenced(rg.name, agentName(rg.name, int(e.b)), am.term, am.epoch, am.fence.held, am.fence.store) // production logs and ignores it
		}
	case evTable:
		// A head reaches region a's watchers (b: only agent b-1).
		rg := r.regions[e.a]
		for a := range rg.nodes {
			if e.b == 0 || int(e.b) == a+1 {
				if err := r.deliverHead(int(e.a), a, e.msg.(*headMsg)); err != nil {
					return err
				}
			}
		}
	case evFault:
		return r.fault(int(e.a), int(e.b))
	case evWatchRetry:
		r.watchRetry(int(e.a), int(e.b))
	case evResync:
		r.resync(int(e.a), int(e.b))
	case evCoordRetry:
		if ci := int(e.a); r.leader == ci && r.coord == nil && uint32(e.b) == r.cands[ci].gen {
			if term, ok := r.cands[ci].c.Leading(); ok && term == uint64(e.c) {
				return r.startCoordinator(ci, term, r.coordNow())
			}
		}
	case evCampaign:
		if ci := int(e.a); uint32(e.b) == r.cands[ci].gen && !r.cands[ci].dead {
			if err := r.newCandidate(ci); err != nil {
				return err
			}
			return r.step(ci, r.cands[ci].gen)
		}
	case evSyncDeliver:
		r.deliver(e.msg.(*syncBatch))
	case evServed:
		r.m.served(int(e.a), int(e.b), e.c>>1, e.c&1 == 1, e.t)
	case evSync:
		r.sync()
		r.schedule(event{t: e.t + us(r.sc.Sync), kind: evSync})
	case evFailoverDown:
		// The coordinator's process crashes: its term ends with it (its
		// reports and acks are lost; the stored table stays) and it does
		// not release the election key, so another candidate takes it
		// once the record lapses. Its region keeps deciding.
		r.failedAt[e.a] = r.leader
		if r.leader >= 0 {
			r.crash(r.leader)
		}
	case evFailoverUp:
		// Back as a follower, unless its region is down or already
		// restarted it.
		if ci := r.failedAt[e.a]; ci >= 0 && r.cands[ci].dead && !r.regionDown(r.cands[ci].ri, r.now) {
			return r.restart(ci)
		}
	case evRegionDown:
		for ci := range r.cands {
			if r.cands[ci].ri == int(e.a) {
				r.crash(ci)
			}
		}
		r.watchesFail(int(e.a), -1)
	case evRegionUp:
		if !r.regionDown(int(e.a), r.now) { // not still down by another spell
			for a := range r.regions[e.a].nodes { // its processes start their watches afresh
				if w := &r.regions[e.a].watch[a]; w.down {
					w.timer.Reset()
					r.schedule(event{t: r.now, kind: evWatchRetry, a: e.a, b: int32(a)})
				}
			}
			for ci := range r.cands {
				if c := &r.cands[ci]; c.ri == int(e.a) && c.dead {
					if err := r.restart(ci); err != nil {
						return err
					}
				}
			}
		}
	case evKV:
		r.kvArrive(int(e.a), uint32(e.b), e.msg.(protocol.KVOp))
	case evElect:
		return r.step(int(e.a), uint32(e.b))
	}
	return nil
}

// churnedOut reports whether key i has no demand now by the scenario's
// key churn: the keys a churn window names (the least popular) are offered
// traffic only inside it — new keys at its start, idle from its end.
func (r *Run) churnedOut(i int) bool {
	out := false
	for _, c := range r.sc.Faults.KeyChurn {
		if i >= len(r.keys)-c.Keys {
			if inSpell(r.now, c.At, c.For) {
				return false
			}
			out = true
		}
	}
	return out
}

// coordNow is the coordinator's clock: its region's, never below the
// clock's zero (a region running behind true time reads 0 until true time
// catches up), as a table's instants must lie in [0, 2^52). Since the
// simulator elects its coordinator, the first one may sit in a region whose
// clock runs behind.
func (r *Run) coordNow() int64 { return max(0, r.now+r.regions[r.coordIdx].skew) }

// homeMove is a key's home moving to region to at t (µs).
type homeMove struct {
	t  int64
	to int
}

// drawMigrations gives each key its home moves, from a stream of its own
// (the keys' budgets and mixes are the same with migrations or without).
func (r *Run) drawMigrations(m *MigrationSpec) {
	rng := rand.New(rand.NewPCG(r.seed, 0x6d6967726174))
	span := r.end - r.warmup
	for i := range r.keys {
		k := &r.keys[i]
		n := m.Min + rng.IntN(m.Max-m.Min+1)
		at := make([]int64, n)
		for j := range at {
			at[j] = r.warmup + rng.Int64N(max(span, 1))
		}
		slices.Sort(at)
		home := k.home
		for _, t := range at {
			// Another region, by weight.
			to := home
			for to == home {
				to = pickWeighted(rng, r.sc.Regions)
			}
			k.moves = append(k.moves, homeMove{t: t, to: to})
			home = to
		}
	}
}

// homeAt is where key i's home traffic is offered at t: its home, or where
// its last move before t took it.
func (r *Run) homeAt(i int, t int64) int {
	k := &r.keys[i]
	home := k.home
	for _, m := range k.moves {
		if m.t > t {
			break
		}
		home = m.to
	}
	return home
}

// route applies traffic moves: traffic offered in region ri at t arrives in
// the region it moved to.
func (r *Run) route(ri int, t int64) int {
	for _, m := range r.sc.Workload.Moves {
		if t >= us(m.At) && r.regions[ri].name == m.From {
			ri = slices.IndexFunc(r.regions, func(g *regionState) bool { return g.name == m.To })
		}
	}
	return ri
}

func (r *Run) cost() int64 {
	a := r.sc.Workload.CostPareto
	if a == 0 {
		return 1
	}
	u := 1 - r.rng.Float64()
	return min(r.sc.Workload.CostMax, int64(math.Pow(u, -1/a)))
}

// inWindow reports whether t is in one of the spells.
func inSpell(t int64, at, dur Duration) bool { return t >= us(at) && t < us(at+dur) }

func (r *Run) regionDown(ri int, t int64) bool {
	for _, f := range r.sc.Faults.RegionLoss {
		if f.Region == r.regions[ri].name && inSpell(t, f.At, f.For) {
			return true
		}
	}
	return false
}

func (r *Run) redisDown(ri int, t int64) bool {
	for _, f := range r.sc.Faults.RedisOutage {
		if f.Region == r.regions[ri].name && inSpell(t, f.At, f.For) {
			return true
		}
	}
	return false
}

// Retries carry the attempt in their low bits, and whether the client
// decides though the scenario's clients reserve (RetrySpec.DecideFraction).
const (
	attemptMask   = 0x7f
	decidesFlag   = 0x80
	retryCostBits = 8
)

// arrive decides one request of key i in region ri, and the oracle with it.
// attempt is the retry's attempt, possibly with decidesFlag.
func (r *Run) arrive(i, ri int, cost int64, attempt int) {
	if r.onArrival != nil {
		r.onArrival(Arrival{T: r.now, Key: i, Region: ri, Cost: cost})
	}
	rg := r.regions[ri]
	if r.regionDown(ri, r.now) || rg.allDead() {
		r.dec.Dropped++
		return
	}
	k := &r.keys[i]
	r.dec.Requests++
	flag := 0
	if rs := r.sc.Workload.Retry; rs != nil && rs.Reserve > 0 && !r.baseline() {
		// The clients reserve; in a mix a client decides instead with
		// probability DecideFraction (its region's, else the workload's),
		// drawn at its first attempt (only in a mix, so other runs draw
		// what they always drew) and carried by its retries.
		f := rs.DecideFraction
		if rf := r.sc.Regions[ri].DecideFraction; rf != nil {
			f = *rf
		}
		decides := attempt&decidesFlag != 0 || (attempt == 0 && f > 0 && (f >= 1 || r.rng.Float64() < f))
		if !decides {
			r.reserve(i, ri, cost, attempt)
			return
		}
		flag = decidesFlag
	}
	attempt &= attemptMask
	// The oracle: one GCRA with the full budget, at true time.
	next, or, _ := gcra.Allow(k.budget, k.oracle, r.now, cost)
	if or.Allowed {
		k.oracle = next
	}
	var allowed bool
	var retryAfter time.Duration
	switch r.strategy {
	case Oracle:
		allowed, retryAfter = or.Allowed, or.RetryAfter
	case ReplicatedCounter:
		allowed, retryAfter = r.rcDecide(k, ri, cost)
	default:
		rg.clock = r.now + rg.skew
		rg.fail.down = r.redisDown(ri, r.now)
		a := rg.pick()
		n := rg.nodes[a]
		if k.prep == nil {
			k.prep = make([]*region.Prepared, r.agents)
		}
		p := k.prep[rg.first+a]
		if p == nil {
			var err error
			if p, err = n.Prepare(&k.req); err != nil {
				panic(fmt.Sprintf("sim: prepare %s: %v", k.name, err)) // the simulator built the request: a bug
			}
			k.prep[rg.first+a] = p
		}
		d, err := n.DecidePrepared(r.ctx, rg.nodeNow(a, r.now), p, cost)
		if err != nil {
			panic(fmt.Sprintf("sim: decide %s: %v", k.name, err))
		}
		allowed, retryAfter = r.callerDecides(d), d.Result.RetryAfter
	}
	if allowed {
		r.dec.Admitted++
	}
	r.m.record(i, ri, cost, allowed, or.Allowed, r.now)
	if rs := r.sc.Workload.Retry; rs != nil && !allowed && attempt < rs.Max && retryAfter != gcra.Never {
		wait := max(retryAfter, time.Millisecond)
		wait += time.Duration(r.rng.Float64() * rs.Jitter * float64(wait))
		r.schedule(event{t: r.now + wait.Microseconds(), kind: evRetry, a: int32(i), b: int32(ri), c: cost<<retryCostBits | int64(flag|(attempt+1))})
	}
}

// reserve books key i's request in region ri as a reserving client does,
// and the oracle books it too; each is served when its wait ends. A
// refused client retries after the retry-after, as in retry mode.
func (r *Run) reserve(i, ri int, cost int64, attempt int) {
	rs := r.sc.Workload.Retry
	k := &r.keys[i]
	rg := r.regions[ri]
	maxWait := rs.Reserve.D()
	sch := gcra.Steady(k.budget)
	st := gcra.State{TAT: k.oracle, Exists: true}
	ost, _, or, err := gcra.Reserve(st, r.now, &sch, cost, maxWait.Microseconds())
	if err == nil && or.Allowed {
		k.oracle = ost.TAT
		r.schedule(event{t: r.now + or.Wait.Microseconds(), kind: evServed, a: int32(i), b: int32(ri), c: cost<<1 | 1})
	}
	rg.clock = r.now + rg.skew
	rg.fail.down = r.redisDown(ri, r.now)
	a := rg.pick()
	n := rg.nodes[a]
	k.req.Cost = cost
	if err := n.Reserve(r.ctx, rg.nodeNow(a, r.now), &k.req, maxWait, &r.rd); err != nil {
		panic(fmt.Sprintf("sim: reserve %s: %v", k.name, err)) // one limit per key: a bug
	}
	d := &r.rd
	allowed := r.callerDecides(d)
	r.m.offer(i, cost, allowed != or.Allowed, r.now)
	if allowed {
		r.dec.Admitted++
		r.schedule(event{t: r.now + d.Result.Wait.Microseconds(), kind: evServed, a: int32(i), b: int32(ri), c: cost << 1})
		return
	}
	if attempt < rs.Max && d.Result.RetryAfter != gcra.Never {
		wait := max(d.Result.RetryAfter, time.Millisecond)
		wait += time.Duration(r.rng.Float64() * rs.Jitter * float64(wait))
		r.schedule(event{t: r.now + wait.Microseconds(), kind: evRetry, a: int32(i), b: int32(ri), c: cost<<retryCostBits | int64(attempt+1)})
	}
}

// callerDecides counts d's fallback and returns whether the request goes
// through: d.Allowed, or — when failure_mode error left it undecided (the
// agent answered an error) — what the caller's own failure policy does
// (Scenario.OnError). Such a request carries no retry-after: a caller that
// denies it retries, as after any refusal, without one.
func (r *Run) callerDecides(d *region.Decision) bool {
	if !d.Fallback {
		return d.Allowed
	}
	r.dec.Fallbacks++
	if d.FallbackMode != region.FailError {
		return d.Allowed
	}
	r.dec.Errored++
	return r.sc.OnError == "admit"
}

// rcDecide is the replicated-counter baseline: each region admits against
// its local view of the global GCRA, which learns the other regions'
// admissions every Sync.
func (r *Run) rcDecide(k *key, ri int, cost int64) (bool, time.Duration) {
	next, res, _ := gcra.Allow(k.budget, k.rcTAT[ri], r.now, cost)
	if res.Allowed {
		k.rcTAT[ri] = next
		R := len(r.regions)
		for o := range R {
			if o != ri {
				k.rcOut[ri*R+o] += cost
			}
		}
		k.pending = true
	}
	return res.Allowed, res.RetryAfter
}

// syncBatch is one region's admissions sent to another at a sync: per key,
// the cost admitted since the last delivery.
type syncBatch struct {
	to    int
	keys  []int32
	costs []int64
}

// sync sends every region's admissions not yet delivered to each other
// region whose link is up; they arrive after the link's latency. What a
// partition holds back goes at the first sync after it heals.
func (r *Run) sync() {
	R := len(r.regions)
	for s := range R {
		for o := range R {
			if s == o {
				continue
			}
			d, lost := r.link(s, o)
			b := &syncBatch{to: o}
			bytes := int64(len(r.regions[s].name) + 8) // header: the sender and a sequence number
			for i := range r.keys {
				k := &r.keys[i]
				if !k.pending {
					continue
				}
				if out := k.rcOut[s*R+o]; out > 0 {
					b.keys = append(b.keys, int32(i))
					b.costs = append(b.costs, out)
					bytes += int64(len(k.name) + 8)
				}
			}
			if len(b.keys) == 0 {
				continue // nothing new for o: no message
			}
			// Sent, so counted, whether it arrives or not (as Meridian's
			// messages are); what a lost one carried goes again at the
			// next sync.
			r.dec.Reports++
			r.dec.ReportBytes += bytes
			if lost {
				r.dec.Lost++
				continue
			}
			for _, i := range b.keys {
				r.keys[i].rcOut[s*R+o] = 0
			}
			r.schedule(event{t: r.now + d, kind: evSyncDeliver, msg: b})
		}
	}
	for i := range r.keys {
		k := &r.keys[i]
		if !k.pending {
			continue
		}
		k.pending = false
		for _, out := range k.rcOut {
			if out > 0 {
				k.pending = true // held back by a partition
				break
			}
		}
	}
}

// deliver applies one region's admissions to another's view.
func (r *Run) deliver(b *syncBatch) {
	for j, i := range b.keys {
		k := &r.keys[i]
		k.rcTAT[b.to] = max(k.rcTAT[b.to], r.now) + b.costs[j]*k.budget.IntervalMicros()
	}
}

// sample records, for each top key, the share of its budget each region
// runs at now (its regional rate in force ÷ the budget's rate).
func (r *Run) sample() {
	for _, i := range r.m.top {
		k := &r.keys[i]
		for ri, rg := range r.regions {
			share := 1.0
			if !r.baseline() {
				var d region.Decision
				if err := rg.nodes[0].Resolve(&k.req, &d); err == nil && len(d.Matches) == 1 {
					sch := &d.Matches[0].Schedule
					l := sch.Current.Limit
					if sch.HasPrevious && r.now+rg.skew < sch.Current.Effective {
						l = sch.Previous.Limit
					}
					share = 0
					if !l.IsZero() {
						share = float64(k.budget.IntervalMicros()) / float64(l.IntervalMicros())
					}
				}
			}
			r.m.share(i, ri, share, r.now)
		}
	}
}

// link returns the one-way delay from region a to b at t, and whether the
// message is lost.
func (r *Run) link(a, b int) (int64, bool) { return r.linkDraw(a, b, r.rng) }

// linkDraw is link drawing loss and jitter from rng.
func (r *Run) linkDraw(a, b int, rng *rand.Rand) (int64, bool) {
	if a == b {
		return 0, false
	}
	l := r.linkSpec(a, b)
	if r.partitioned(a, b) {
		return 0, true
	}
	if r.regionDown(a, r.now) || r.regionDown(b, r.now) {
		return 0, true
	}
	if l.Loss > 0 && rng.Float64() < l.Loss {
		return 0, true
	}
	d := us(l.Mean)
	if j := us(l.Jitter); j > 0 {
		d += rng.Int64N(2*j+1) - j
	}
	return d, false
}

// linkSpec is the link between regions a and b.
func (r *Run) linkSpec(a, b int) LinkSpec {
	l := r.sc.Latency
	for _, o := range r.sc.Links {
		if (o.From == r.regions[a].name && o.To == r.regions[b].name) || (o.From == r.regions[b].name && o.To == r.regions[a].name) {
			l = o
		}
	}
	return l
}

// agentTick runs one agent's loop: report, acknowledge the table in force.
func (r *Run) agentTick(ri, a int) {
	rg := r.regions[ri]
	if r.regionDown(ri, r.now) || rg.dead[a] {
		return
	}
	n := rg.nodes[a]
	local := rg.nodeNow(a, r.now)
	if rep := n.Tick(local); rep != nil && !r.baseline() {
		rep.Features |= wire.Features // as protocol.Out.Encode stamps it
		bytes, msgs := wire.ReportSize(wireCluster, rep, local, wire.DefaultMaxMessage)
		r.reportChunks = max(r.reportChunks, msgs)
		r.send(ri, evReport, int32(ri), int32(a), &sentReport{rep: rep, sent: local}, bytes, msgs)
	}
	if r.baseline() {
		return
	}
	term, epoch := n.InForce(local)
	if tv := [2]uint64{term, epoch}; tv != rg.acked[a] && term > 0 {
		rg.acked[a] = tv
		f := rg.fence[a]
		ack := wire.Ack{Region: rg.name, Agent: agentName(rg.name, a), Term: term, Epoch: epoch, Sent: local, Fence: f.held, Store: f.store}
		r.send(ri, evAck, int32(ri), int32(a), &ackMsg{term: term, epoch: epoch, fence: f}, wire.AckSize(wireCluster, ack), 1)
	}
}

// send delivers a report or ack from region ri to the coordinator: msgs
// messages (chunks) of bytes in all, lost or delivered together.
func (r *Run) send(ri int, kind uint8, a, b int32, msg any, bytes, msgs int) {
	r.regions[ri].busOut[b] += int64(msgs)
	switch kind {
	case evReport:
		r.dec.Reports += int64(msgs)
		r.dec.ReportBytes += int64(bytes)
	case evAck:
		r.dec.Acks += int64(msgs)
		r.dec.AckBytes += int64(bytes)
	}
	d, lost := r.link(ri, r.coordIdx)
	if lost || r.coord == nil || r.agentCut(ri, int(b)) || r.agentCut(r.cands[r.leader].ri, r.cands[r.leader].a) {
		r.dec.Lost += int64(msgs)
		return
	}
	r.schedule(event{t: r.now + d, kind: kind, a: a, b: b, msg: msg})
	if r.duplicate(ri, r.coordIdx) {
		r.schedule(event{t: r.now + d + r.jitter(ri, r.coordIdx), kind: kind, a: a, b: b, msg: msg})
	}
}

// sentReport is a report in flight with the agent's clock when it sent
// it, as wire.EncodeReport stamps it (the term's skew estimate).
type sentReport struct {
	rep  *rebalance.Report
	sent int64
}

// publish stores t (nil: nothing to store) as coordinate's store does:
// signed, compare-and-set on the revision the term last wrote or read,
// the term told the outcome (Stored). Fenced: the head is read and the
// term told who wrote it (Fenced): another coordinator ends the term and
// its candidate stands again (deposeCandidate); a head no coordinator
// wrote is stored over at the next tick. Failed otherwise: the next
// Tick returns t again. Stored: every agent's watch hears of it.
func (r *Run) publish(t *rebalance.Table) error {
	if t == nil || r.coord == nil {
		return nil
	}
	chunks, err := r.cenc.Encode(t, r.coord.ReadBy(t))
	if err != nil {
		return fmt.Errorf("sim: encode table: %w", err)
	}
	rev, serr := r.storeTable(r.leader, r.crev, t, chunks)
	if serr != nil {
		r.cenc.Failed()
	}
	if r.coord.Stored(t, serr) != nil {
		// The head moved: read it, as coordinate does, and let the term
		// say whether another coordinator wrote it.
		c := &r.cands[r.leader]
		if !r.kvReachable(c.ri, c.a) {
			r.dec.StoreErrors++
			return nil
		}
		var cur *rebalance.Table
		if r.tkv.rev != 0 {
			h, err := r.readHeader(r.tkv.head)
			switch {
			case err == nil:
				cur = h
			case protocol.Classify(err) == protocol.RefusedUnavailable:
				r.dec.StoreErrors++
				return nil
			}
		}
		if err := r.coord.Fenced(cur); err != nil {
			r.dec.Fenced++
			if r.tkv.rev != 0 && !r.tkv.byCoord && r.check != nil {
				r.forgedDepose = append(r.forgedDepose, r.now)
			}
			r.deposeCandidate(r.leader)
			return nil
		}
		r.crev = r.tkv.rev // stored over at the next tick
		return nil
	}
	if serr != nil {
		r.dec.StoreErrors++
		return nil
	}
	r.crev, r.stored = rev, t
	r.cenc.Stored(t)
	// The coordinator's puts of chunks 1..n, once per table; each region
	// pays the head (writeHead) and the chunks its readers fetch
	// (chunkFetcher).
	for _, b := range chunks[1:] {
		r.dec.Tables++
		r.dec.TableBytes += int64(len(b))
	}
	r.writeHead(r.tkv.head, rev)
	return nil
}

// wireCluster is the cluster name the simulator's messages carry, for
// their exact sizes in gossip/wire.
const wireCluster = "sim"
