package sim

import (
	"bytes"
	"cmp"
	"embed"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/meridian-quota/meridian/rebalance"
	"github.com/meridian-quota/meridian/region"
)

// Duration is a time.Duration written in YAML as a Go duration string.
type Duration = region.Duration

// us is d in µs.
func us(d Duration) int64 { return int64(time.Duration(d) / time.Microsecond) }

// Scenario is one simulation set-up: regions and links, keys and budgets,
// workload, faults, and what to sweep (strategies × intervals × seeds).
// Every knob is here, so a scenario file and its seeds reproduce a report
// byte for byte.
type Scenario struct {
	Name        string   `yaml:"name"`
	Description string   `yaml:"description"`
	Duration    Duration `yaml:"duration"`
	// Warmup is excluded from every metric.
	Warmup Duration `yaml:"warmup"`
	// Seeds lists the seeds to run (each a full run per strategy and
	// interval).
	Seeds []uint64 `yaml:"seeds"`

	Regions []RegionSpec `yaml:"regions"`
	// Latency is the default one-way link between two regions; Links
	// overrides pairs (both directions).
	Latency     LinkSpec   `yaml:"latency"`
	Links       []LinkSpec `yaml:"links"`
	Coordinator CoordSpec  `yaml:"coordinator"`

	Keys     KeysSpec     `yaml:"keys"`
	Workload WorkloadSpec `yaml:"workload"`
	Faults   FaultsSpec   `yaml:"faults"`
	// Membership times the coordinator's view of which agents are live.
	Membership MembershipSpec `yaml:"membership,omitempty"`

	// Strategies lists the Meridian strategies and baselines to compare
	// (rebalance.StrategyNames plus "replicated-counter").
	Strategies []string `yaml:"strategies"`
	// Intervals lists the rebalance intervals Δ to compare.
	Intervals []Duration `yaml:"intervals"`
	// FailureMode is every limit's failure_mode (open, closed, local,
	// error).
	FailureMode string `yaml:"failure_mode"`
	// OnError is what the caller does with a request failure_mode error
	// leaves undecided while the store fails (the agent answers RLS
	// Unavailable, HTTP 503): admit, as Envoy does by default
	// (failure_mode_deny: false), or deny (failure_mode_deny: true). Set
	// only with failure_mode error; the run counts such requests in
	// Result.Errored and scores the caller's answer against the oracle.
	OnError string `yaml:"on_error"`
	// Sync is the replicated-counter baseline's synchronisation interval.
	Sync Duration `yaml:"sync"`
	// Lease, MaxSkew and Fence configure the coordinator (0: its defaults).
	Lease   Duration `yaml:"lease"`
	MaxSkew Duration `yaml:"max_skew"`
	Fence   Duration `yaml:"fence"`
	// SafeFraction is the part of every budget set aside as the regions'
	// floors (rebalance.Config.SafeFraction, split equally; unset: its
	// default, 10 %). Every region's agents run a key at their floor before
	// its first table and after a lapse, so a smaller one admits less then
	// and leaves more to the regions with demand.
	SafeFraction *float64 `yaml:"safe_fraction,omitempty"`
	// IdleSafeFraction is the part of every budget the floors of regions
	// without recent demand for a key share, and the floors a key no table
	// names runs at (rebalance.Config.IdleSafeFraction; unset: its
	// default). FloorWindow is how long a region keeps its full floor after
	// its last demand (rebalance.Config.FloorWindow; 0: its default).
	IdleSafeFraction *float64 `yaml:"idle_safe_fraction,omitempty"`
	FloorWindow      Duration `yaml:"floor_window"`
	// Shift is the time of the scripted shift convergence is measured from
	// (0: none).
	Shift Duration `yaml:"shift"`
}

// RegionSpec is one region.
type RegionSpec struct {
	Name string `yaml:"name"`
	// Agents is the number of agents in the region (each its own Node on
	// the region's store).
	Agents int `yaml:"agents"`
	// ClockSkew is this region's clock offset from true time.
	ClockSkew Duration `yaml:"clock_skew"`
	// Weight is the region's part of the traffic that is not a key's home
	// traffic, and its chance to be a key's home (relative; default 1).
	Weight float64 `yaml:"weight"`
	// DecideFraction, when set, replaces workload.retry.decide_fraction for
	// the requests arriving in this region (its gateways' clients): 1 makes
	// every one of them decide though the scenario's clients reserve.
	DecideFraction *float64 `yaml:"decide_fraction"`
}

// LinkSpec is a one-way link: mean latency, uniform jitter (±), loss.
type LinkSpec struct {
	From   string   `yaml:"from"`
	To     string   `yaml:"to"`
	Mean   Duration `yaml:"mean"`
	Jitter Duration `yaml:"jitter"`
	Loss   float64  `yaml:"loss"`
	// Duplicate is the probability that a message arrives twice, the copy
	// up to Jitter later.
	Duplicate float64 `yaml:"duplicate,omitempty"`
}

// CoordSpec places the first coordinator and its failovers. Every agent
// is a candidate of the coordinator election (production's protocol.Candidate
// on the KV bucket's election key, timed as production's: ElectionTTL); the
// first coordinator is Region's first agent. A failover crashes whoever
// coordinates at At and brings its process back as a candidate after For;
// meanwhile another candidate takes the key once the crashed one's record
// lapses (within ElectionTTL plus the maximum skew and a poll). A region
// loss crashes its agents, the coordinator among them, the same way.
type CoordSpec struct {
	Region    string       `yaml:"region"`
	Failovers []FaultSpell `yaml:"failovers"`
}

// KeysSpec describes the keys and their budgets.
type KeysSpec struct {
	Count int `yaml:"count"`
	// Zipf is the exponent s of key popularity (0: uniform).
	Zipf float64 `yaml:"zipf"`
	// DemandRatio: each key's offered rate ÷ budget rate is lognormal with
	// Sigma, placed so that OverFraction of the keys are over budget.
	// Ratio, when set, fixes the ratio for every key instead.
	Sigma        float64 `yaml:"sigma"`
	OverFraction float64 `yaml:"over_fraction"`
	Ratio        float64 `yaml:"ratio"`
	// Burst is each budget's burst in seconds of its rate (at least 1).
	Burst float64 `yaml:"burst_seconds"`
	// HomeFraction of a key's traffic comes from its home region; the rest
	// is spread over the regions by weight.
	HomeFraction float64 `yaml:"home_fraction"`
	// Migrations move each key's home: between Min and Max times (drawn
	// uniformly per key), at instants uniform over the measured part of
	// the run, each time to another region drawn by weight. Everything
	// offered in the key's first home — its home share and that region's
	// part of the spread — arrives in its current home from then on (drawn
	// with the first home's multipliers: follow_the_sun's phase and flash
	// crowds stay where they were); what is spread over the other regions
	// stays there. A trace gives each request's region, so it cannot be
	// combined with migrations.
	Migrations *MigrationSpec `yaml:"migrations,omitempty"`
	// SharedRules writes the policy with one rule per distinct budget
	// instead of one per key: each budget's rate is rounded down to a grid
	// of 16 steps per doubling (at most 4.3 % lower) before it is rounded
	// to whole requests per minute or hour, as every simulated budget is
	// (a budget of a few requests an hour may lose one more), and its keys
	// share a wildcard rule under a class descriptor, so the policy stays a
	// few hundred rules at millions of keys (a rule per key is refused past
	// about 100,000: the policy file's node limit). Each key keeps its own
	// budget, state and shares, as a tenant=* rule gives every tenant.
	// It cannot be combined with policy reloads, which change budgets per
	// key.
	SharedRules bool `yaml:"shared_rules,omitempty"`
}

// MigrationSpec bounds how many times each key's home moves.
type MigrationSpec struct {
	Min int `yaml:"min"`
	Max int `yaml:"max"`
}

// WorkloadSpec describes the offered traffic.
type WorkloadSpec struct {
	// Rate is the aggregate offered requests/s across keys and regions.
	Rate float64 `yaml:"rate"`
	// Cost: 1 unless CostPareto (shape α > 1) gives heavy-tailed costs,
	// capped at CostMax.
	CostPareto float64 `yaml:"cost_pareto"`
	CostMax    int64   `yaml:"cost_max"`
	// FollowTheSun modulates each region's traffic with a sinusoid.
	FollowTheSun *SunSpec `yaml:"follow_the_sun"`
	// Flash multiplies some keys' traffic in one region for a while.
	Flash []FlashSpec `yaml:"flash"`
	// Moves send one region's traffic to another from a time on.
	Moves []MoveSpec `yaml:"moves"`
	// OnOff makes each key's traffic alternate between on and off spells
	// with Pareto-distributed lengths.
	OnOff *OnOffSpec `yaml:"on_off"`
	// Retry makes denied clients retry after the returned retry-after.
	Retry *RetrySpec `yaml:"retry"`
}

// SunSpec: region r's traffic is multiplied by 1 + Amplitude·sin(2π·t/Period + 2π·r/n).
type SunSpec struct {
	Period    Duration `yaml:"period"`
	Amplitude float64  `yaml:"amplitude"`
}

// FlashSpec: the Keys most popular keys get Factor× traffic in Region
// during [At, At+For).
type FlashSpec struct {
	Region string   `yaml:"region"`
	At     Duration `yaml:"at"`
	For    Duration `yaml:"for"`
	Keys   int      `yaml:"keys"`
	Factor float64  `yaml:"factor"`
}

// MoveSpec: from At on, traffic offered in From arrives in To.
type MoveSpec struct {
	From string   `yaml:"from"`
	To   string   `yaml:"to"`
	At   Duration `yaml:"at"`
}

// OnOffSpec: spells with Pareto lengths of shape Alpha and the given means.
type OnOffSpec struct {
	Alpha   float64  `yaml:"alpha"`
	MeanOn  Duration `yaml:"mean_on"`
	MeanOff Duration `yaml:"mean_off"`
}

// RetrySpec: a denied client retries after retry-after plus uniform jitter
// of up to Jitter×retry-after, at most Max times. With Reserve, clients
// book a reservation instead (seed 000): a request waits up to Reserve for
// its slot (the node books no further than its horizon, the coordinator's
// fence, and the lease left), and one refused retries as above; the oracle
// books too. DecideFraction of the requests (0 by default; a region may set
// its own) come from clients that decide instead, on the same keys: a mix
// where reservations booked under a share act beside the other clients'
// decisions.
type RetrySpec struct {
	Max            int      `yaml:"max"`
	Jitter         float64  `yaml:"jitter"`
	Reserve        Duration `yaml:"reserve"`
	DecideFraction float64  `yaml:"decide_fraction"`
}

// FaultsSpec lists faults in time windows.
type FaultsSpec struct {
	Partitions  []PartitionSpec `yaml:"partitions"`
	RegionLoss  []RegionSpell   `yaml:"region_loss"`
	RedisOutage []RegionSpell   `yaml:"redis_outage"`
	// NATSOutage cuts every agent from NATS: reports, acknowledgements,
	// table heads and the KV bucket (election and table store) are
	// unreachable while it lasts; each agent's watch is re-created when
	// it ends.
	NATSOutage []FaultSpell `yaml:"nats_outage,omitempty"`
	// KVLoss deletes the KV bucket at At — the table head, its chunks and
	// the election key — and recreates it empty at At+For, its revisions
	// restarting at 1; in between every call to it fails.
	KVLoss []FaultSpell `yaml:"kv_loss,omitempty"`
	// Heads are writes to the table head by something other than the
	// coordinator.
	Heads []HeadSpec `yaml:"heads,omitempty"`
	// AgentPartition cuts one agent from NATS (its region's other agents,
	// its store and its membership stay up).
	AgentPartition []AgentSpell `yaml:"agent_partition,omitempty"`
	// Suspicions make the coordinator's membership omit one agent while
	// they last, though it runs and reaches everything (a false
	// suspicion of memberlist's failure detector).
	Suspicions []AgentSpell `yaml:"suspicions,omitempty"`
	// AgentCrash kills one agent's process (Coordinator: whichever agent
	// coordinates at At, if any) and restarts it afresh after For: a new
	// node with no table, a new watch, a candidate again. Its clients'
	// requests go to its region's other agents, or nowhere.
	AgentCrash []CrashSpec `yaml:"agent_crash,omitempty"`
	// KeyChurn offers the Keys least popular keys traffic only inside the
	// window: they appear at At (new to the coordinator) and go idle at
	// At+For (the coordinator drops them after its KeyIdle).
	KeyChurn []ChurnSpec `yaml:"key_churn,omitempty"`
	// ClockSteps step a region's clock (its hosts' and its store's) by
	// Step at At, for the rest of the run.
	ClockSteps []ClockStep `yaml:"clock_steps,omitempty"`
	// PolicyReloads change the policy file: see ReloadSpec.
	PolicyReloads []ReloadSpec `yaml:"policy_reloads,omitempty"`
}

// ReloadSpec changes the policy at At: the Keys most popular keys' budgets
// (requests per period and burst) are multiplied by Scale, rounded, at
// least 1. The ideal limiter runs the new budgets from At. Each agent
// reads the new file at its own instant in [At, At+Spread) — agents poll
// their policy files independently — and the coordinator takes the new
// budgets when its own agent does (gossip.Loop hands its term the node's
// policy); an agent that starts later reads the file as it is then. Until
// every agent has reloaded, regions run different budgets for a key, so
// the checks measure each agent's share against its own policy's budget
// and, while a budget shrinks, OA_budget against the larger one.
type ReloadSpec struct {
	At     Duration `yaml:"at"`
	Keys   int      `yaml:"keys"`
	Scale  float64  `yaml:"scale"`
	Spread Duration `yaml:"spread,omitempty"`
}

// HeadSpec writes the table head at At, as anyone with write access to
// the bucket could: Kind "forged" is a well-formed table signed by a key
// the cluster does not trust (the head's table, or the last stored one,
// with a term 100 higher; nothing before the first table), "replayed"
// the genuine head the coordinator stored Age before At (default 10 s;
// the run's first if none is that old), "garbage" bytes that do not
// decode.
type HeadSpec struct {
	At   Duration `yaml:"at"`
	Kind string   `yaml:"kind"`
	Age  Duration `yaml:"age,omitempty"`
}

// HeadKinds lists HeadSpec's kinds.
func HeadKinds() []string { return []string{"forged", "replayed", "garbage"} }

// AgentSpell is a fault of one agent (Agent counts from 1) in a window.
type AgentSpell struct {
	FaultSpell `yaml:",inline"`
	Region     string `yaml:"region"`
	Agent      int    `yaml:"agent"`
}

// CrashSpec is an agent's crash: Region's agent Agent (from 1), or with
// Coordinator set, the agent coordinating at At.
type CrashSpec struct {
	FaultSpell  `yaml:",inline"`
	Region      string `yaml:"region,omitempty"`
	Agent       int    `yaml:"agent,omitempty"`
	Coordinator bool   `yaml:"coordinator,omitempty"`
}

// ChurnSpec is a window of demand for the Keys least popular keys.
type ChurnSpec struct {
	FaultSpell `yaml:",inline"`
	Keys       int `yaml:"keys"`
}

// MembershipSpec times the simulated failure detection.
type MembershipSpec struct {
	// Detect is how long after a region's loss, a partition from the
	// coordinator or an agent's crash (and after its end) the
	// coordinator's membership reflects it (default 0: at once).
	Detect Duration `yaml:"detect,omitempty"`
}

// ClockStep steps Region's clock by Step (either sign) at At.
type ClockStep struct {
	At     Duration `yaml:"at"`
	Region string   `yaml:"region"`
	Step   Duration `yaml:"step"`
}

// FaultSpell is a window [At, At+For).
type FaultSpell struct {
	At  Duration `yaml:"at"`
	For Duration `yaml:"for"`
}

// PartitionSpec cuts every link between Side and the other regions.
type PartitionSpec struct {
	FaultSpell `yaml:",inline"`
	Side       []string `yaml:"side"`
}

// RegionSpell is a fault of one region in a window.
type RegionSpell struct {
	FaultSpell `yaml:",inline"`
	Region     string `yaml:"region"`
}

// ReplicatedCounter names the baseline that is not a Meridian strategy.
const ReplicatedCounter = "replicated-counter"

// Oracle names the check that decides with the oracle itself: it must
// score exactly 0 on every metric (not in the default list).
const Oracle = "oracle"

// ErrScenario wraps every scenario error.
var ErrScenario = errors.New("sim: invalid scenario")

// ParseScenario reads a YAML scenario, fills defaults and validates it,
// reporting every problem at once. Unknown fields and values of the wrong
// type are errors, reported together with every problem Validate finds in
// the rest of the file, each with its line as go-yaml names it ("line 7:
// regions[1].name: empty").
func ParseScenario(data []byte) (*Scenario, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var s Scenario
	var errs []error
	if err := dec.Decode(&s); err != nil {
		var te *yaml.TypeError
		switch {
		case errors.Is(err, io.EOF):
			return nil, fmt.Errorf("%w: empty file", ErrScenario)
		case !errors.As(err, &te):
			return nil, fmt.Errorf("%w: %v", ErrScenario, err) // a syntax error: nothing was decoded
		}
		// go-yaml decodes every other field before it returns these.
		for _, msg := range te.Errors {
			errs = append(errs, errors.New(msg))
		}
	}
	s.defaults()
	if err := s.Validate(); err != nil {
		var doc yaml.Node
		_ = yaml.Unmarshal(data, &doc) // it decoded above, so it parses
		errs = append(errs, region.FieldLines(&doc, err, ErrScenario)...)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrScenario, errors.Join(errs...))
	}
	return &s, nil
}

func (s *Scenario) defaults() {
	if len(s.Seeds) == 0 {
		s.Seeds = []uint64{1}
	}
	for i := range s.Regions {
		if s.Regions[i].Agents == 0 {
			s.Regions[i].Agents = 1
		}
		if s.Regions[i].Weight == 0 {
			s.Regions[i].Weight = 1
		}
	}
	if s.Coordinator.Region == "" && len(s.Regions) > 0 {
		s.Coordinator.Region = s.Regions[0].Name
	}
	if s.Keys.Burst == 0 {
		s.Keys.Burst = 1
	}
	if len(s.Strategies) == 0 {
		s.Strategies = DefaultStrategies()
	}
	if len(s.Intervals) == 0 {
		s.Intervals = []Duration{Duration(time.Second), Duration(2 * time.Second), Duration(5 * time.Second)}
	}
	if s.FailureMode == "" {
		s.FailureMode = "closed"
	}
	if s.FailureMode == "error" && s.OnError == "" {
		s.OnError = "admit" // Envoy's failure_mode_deny defaults to false
	}
	if s.Sync == 0 {
		s.Sync = Duration(100 * time.Millisecond)
	}
	if s.Workload.CostMax == 0 {
		s.Workload.CostMax = 100
	}
}

// DefaultStrategies is every Meridian strategy but home (one home region
// for all keys is not a per-key model) and the baselines.
func DefaultStrategies() []string {
	return []string{"static", "proportional", "ewma", "quantile", "maxmin", "doorman-proportional", "doorman-fair", "full", ReplicatedCounter}
}

// Validate reports every problem with s, each with its field path.
func (s *Scenario) Validate() error {
	var errs []error
	bad := func(path, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...)))
	}
	if s.Duration <= 0 {
		bad("duration", "%s: must be positive", s.Duration.D())
	}
	if s.Warmup < 0 || s.Warmup >= s.Duration {
		bad("warmup", "%s: must be in [0, duration)", s.Warmup.D())
	}
	if s.Duration.D() > 7*24*time.Hour {
		bad("duration", "%s: above a simulated week", s.Duration.D())
	}
	names := map[string]bool{}
	if len(s.Regions) == 0 {
		bad("regions", "empty: a scenario needs at least one region")
	}
	for i, r := range s.Regions {
		p := fmt.Sprintf("regions[%d]", i)
		switch {
		case r.Name == "":
			bad(p+".name", "empty")
		case names[r.Name]:
			bad(p+".name", "%q given twice", r.Name)
		}
		names[r.Name] = true
		if r.Agents < 1 || r.Agents > 64 {
			bad(p+".agents", "%d: must be in [1, 64]", r.Agents)
		}
		if !(r.Weight > 0) || math.IsInf(r.Weight, 0) {
			bad(p+".weight", "%v: must be positive", r.Weight)
		}
		if d := r.ClockSkew.D(); d < -time.Minute || d > time.Minute {
			bad(p+".clock_skew", "%s: outside ±1m", d)
		}
		if f := r.DecideFraction; f != nil && (!(*f >= 0 && *f <= 1) || s.Workload.Retry == nil || s.Workload.Retry.Reserve == 0) {
			bad(p+".decide_fraction", "%v: must be in [0, 1], and set only with workload.retry.reserve", *f)
		}
	}
	region := func(path, name string) {
		if !names[name] {
			bad(path, "unknown region %q", name)
		}
	}
	checkLink := func(p string, l LinkSpec) {
		if l.Mean < 0 || l.Jitter < 0 {
			bad(p, "negative latency or jitter")
		}
		if l.Jitter > l.Mean {
			bad(p+".jitter", "%s above the mean %s: latencies would go negative", l.Jitter.D(), l.Mean.D())
		}
		if l.Mean.D() > time.Minute {
			bad(p+".mean", "%s: above 1m", l.Mean.D())
		}
		if !(l.Duplicate >= 0 && l.Duplicate < 1) {
			bad(p+".duplicate", "%v: must be in [0, 1)", l.Duplicate)
		}
		if !(l.Loss >= 0 && l.Loss < 1) {
			bad(p+".loss", "%v: must be in [0, 1)", l.Loss)
		}
	}
	checkLink("latency", s.Latency)
	for i, l := range s.Links {
		p := fmt.Sprintf("links[%d]", i)
		region(p+".from", l.From)
		region(p+".to", l.To)
		checkLink(p, l)
	}
	region("coordinator.region", s.Coordinator.Region)
	for i, f := range s.Coordinator.Failovers {
		s.checkSpell(&errs, fmt.Sprintf("coordinator.failovers[%d]", i), f)
	}
	k := &s.Keys
	if k.Count < 1 || k.Count > 1_000_000 {
		bad("keys.count", "%d: must be in [1, 1000000]", k.Count)
	}
	if k.Zipf < 0 || k.Zipf > 5 || math.IsNaN(k.Zipf) {
		bad("keys.zipf", "%v: must be in [0, 5]", k.Zipf)
	}
	if k.Ratio < 0 || math.IsNaN(k.Ratio) || math.IsInf(k.Ratio, 0) {
		bad("keys.ratio", "%v: must be positive (or 0 for the lognormal)", k.Ratio)
	}
	if k.Ratio == 0 {
		if !(k.Sigma > 0 && k.Sigma <= 5) {
			bad("keys.sigma", "%v: must be in (0, 5] (or set keys.ratio)", k.Sigma)
		}
		if !(k.OverFraction > 0 && k.OverFraction < 1) {
			bad("keys.over_fraction", "%v: must be in (0, 1) (or set keys.ratio)", k.OverFraction)
		}
	}
	if !(k.Burst >= 0.001 && k.Burst <= 3600) {
		bad("keys.burst_seconds", "%v: must be in [0.001, 3600]", k.Burst)
	}
	if !(k.HomeFraction >= 0 && k.HomeFraction <= 1) {
		bad("keys.home_fraction", "%v: must be in [0, 1]", k.HomeFraction)
	}
	if m := k.Migrations; m != nil {
		switch {
		case m.Min < 0 || m.Max < m.Min || m.Max > 100:
			bad("keys.migrations", "min %d, max %d: want 0 ≤ min ≤ max ≤ 100", m.Min, m.Max)
		case len(s.Regions) < 2:
			bad("keys.migrations", "a key's home can move only with two regions or more")
		case k.HomeFraction == 0:
			bad("keys.migrations", "home_fraction is 0: a key without a home has nothing to move")
		}
	}
	w := &s.Workload
	if !(w.Rate > 0) || math.IsInf(w.Rate, 0) || w.Rate > 10_000_000 {
		bad("workload.rate", "%v: must be in (0, 1e7] requests/s", w.Rate)
	}
	if w.CostPareto != 0 && !(w.CostPareto > 1 && w.CostPareto < 10) {
		bad("workload.cost_pareto", "%v: shape must be in (1, 10) (or 0 for cost 1)", w.CostPareto)
	}
	if w.CostMax < 1 || w.CostMax > 1<<20 {
		bad("workload.cost_max", "%d: must be in [1, 2^20]", w.CostMax)
	}
	if f := w.FollowTheSun; f != nil {
		if f.Period <= 0 {
			bad("workload.follow_the_sun.period", "%s: must be positive", f.Period.D())
		}
		if !(f.Amplitude >= 0 && f.Amplitude <= 1) {
			bad("workload.follow_the_sun.amplitude", "%v: must be in [0, 1]", f.Amplitude)
		}
	}
	for i, f := range w.Flash {
		p := fmt.Sprintf("workload.flash[%d]", i)
		region(p+".region", f.Region)
		s.checkSpell(&errs, p, FaultSpell{f.At, f.For})
		if f.Keys < 1 || f.Keys > k.Count {
			bad(p+".keys", "%d: must be in [1, keys.count]", f.Keys)
		}
		if !(f.Factor > 0 && f.Factor <= 1000) {
			bad(p+".factor", "%v: must be in (0, 1000]", f.Factor)
		}
	}
	for i, m := range w.Moves {
		p := fmt.Sprintf("workload.moves[%d]", i)
		region(p+".from", m.From)
		region(p+".to", m.To)
		if m.At < 0 || m.At > s.Duration {
			bad(p+".at", "%s: outside the run", m.At.D())
		}
	}
	if o := w.OnOff; o != nil {
		if !(o.Alpha > 1 && o.Alpha < 10) {
			bad("workload.on_off.alpha", "%v: must be in (1, 10)", o.Alpha)
		}
		if o.MeanOn <= 0 || o.MeanOff <= 0 {
			bad("workload.on_off", "mean_on and mean_off must be positive")
		}
	}
	if r := w.Retry; r != nil {
		if r.Max < 0 || r.Max > 100 || (r.Max == 0 && r.Reserve == 0) {
			bad("workload.retry.max", "%d: must be in [1, 100] (or 0 with reserve)", r.Max)
		}
		if r.Reserve < 0 || r.Reserve.D() > time.Hour {
			bad("workload.retry.reserve", "%s: must be in [0, 1h]", r.Reserve.D())
		}
		if !(r.Jitter >= 0 && r.Jitter <= 10) {
			bad("workload.retry.jitter", "%v: must be in [0, 10]", r.Jitter)
		}
		if !(r.DecideFraction >= 0 && r.DecideFraction <= 1) || (r.DecideFraction > 0 && r.Reserve == 0) {
			bad("workload.retry.decide_fraction", "%v: must be in [0, 1], and set only with reserve", r.DecideFraction)
		}
	}
	for i, p := range s.Faults.Partitions {
		path := fmt.Sprintf("faults.partitions[%d]", i)
		s.checkSpell(&errs, path, p.FaultSpell)
		if len(p.Side) == 0 || len(p.Side) >= len(s.Regions) {
			bad(path+".side", "must name some regions, not all")
		}
		for j, r := range p.Side {
			region(fmt.Sprintf("%s.side[%d]", path, j), r)
		}
	}
	for i, r := range s.Faults.RegionLoss {
		p := fmt.Sprintf("faults.region_loss[%d]", i)
		region(p+".region", r.Region)
		s.checkSpell(&errs, p, r.FaultSpell)
	}
	for i, r := range s.Faults.RedisOutage {
		p := fmt.Sprintf("faults.redis_outage[%d]", i)
		region(p+".region", r.Region)
		s.checkSpell(&errs, p, r.FaultSpell)
	}
	for i, f := range s.Faults.NATSOutage {
		s.checkSpell(&errs, fmt.Sprintf("faults.nats_outage[%d]", i), f)
	}
	for i, f := range s.Faults.KVLoss {
		s.checkSpell(&errs, fmt.Sprintf("faults.kv_loss[%d]", i), f)
	}
	for i, h := range s.Faults.Heads {
		p := fmt.Sprintf("faults.heads[%d]", i)
		if !slices.Contains(HeadKinds(), h.Kind) {
			bad(p+".kind", "%q: want one of %s", h.Kind, strings.Join(HeadKinds(), ", "))
		}
		if h.At < 0 || h.At >= s.Duration {
			bad(p+".at", "%s: outside the run (%s)", h.At.D(), s.Duration.D())
		}
		if h.Age < 0 || (h.Age > 0 && h.Kind != "replayed") {
			bad(p+".age", "%s: must be positive, and set only for kind replayed", h.Age.D())
		}
	}
	for i, a := range s.Faults.AgentPartition {
		p := fmt.Sprintf("faults.agent_partition[%d]", i)
		region(p+".region", a.Region)
		s.checkSpell(&errs, p, a.FaultSpell)
		if j := slices.IndexFunc(s.Regions, func(r RegionSpec) bool { return r.Name == a.Region }); j >= 0 && (a.Agent < 1 || a.Agent > max(1, s.Regions[j].Agents)) {
			bad(p+".agent", "%d: region %s has agents 1..%d", a.Agent, a.Region, max(1, s.Regions[j].Agents))
		}
	}
	agentOf := func(p, name string, agent int) {
		region(p+".region", name)
		if j := slices.IndexFunc(s.Regions, func(r RegionSpec) bool { return r.Name == name }); j >= 0 && (agent < 1 || agent > max(1, s.Regions[j].Agents)) {
			bad(p+".agent", "%d: region %s has agents 1..%d", agent, name, max(1, s.Regions[j].Agents))
		}
	}
	for i, a := range s.Faults.Suspicions {
		p := fmt.Sprintf("faults.suspicions[%d]", i)
		agentOf(p, a.Region, a.Agent)
		s.checkSpell(&errs, p, a.FaultSpell)
	}
	for i, c := range s.Faults.AgentCrash {
		p := fmt.Sprintf("faults.agent_crash[%d]", i)
		s.checkSpell(&errs, p, c.FaultSpell)
		switch {
		case c.Coordinator && (c.Region != "" || c.Agent != 0):
			bad(p, "coordinator: true names no region or agent (it crashes whichever agent coordinates at %s)", c.At.D())
		case !c.Coordinator:
			agentOf(p, c.Region, c.Agent)
		}
	}
	for i, c := range s.Faults.KeyChurn {
		p := fmt.Sprintf("faults.key_churn[%d]", i)
		s.checkSpell(&errs, p, c.FaultSpell)
		if c.Keys < 1 || (s.Keys.Count > 0 && c.Keys > s.Keys.Count) {
			bad(p+".keys", "%d: must be in [1, keys.count %d]", c.Keys, s.Keys.Count)
		}
	}
	if d := s.Membership.Detect; d < 0 || d.D() > time.Minute {
		bad("membership.detect", "%s: must be in [0, 1m]", d.D())
	}
	for i, c := range s.Faults.ClockSteps {
		p := fmt.Sprintf("faults.clock_steps[%d]", i)
		region(p+".region", c.Region)
		if c.At < 0 || c.At >= s.Duration {
			bad(p+".at", "%s: outside the run (%s)", c.At.D(), s.Duration.D())
		}
		if c.Step == 0 || c.Step.D() > time.Hour || c.Step.D() < -time.Hour {
			bad(p+".step", "%s: must be nonzero and within ±1h", c.Step.D())
		}
	}
	if s.Keys.SharedRules && len(s.Faults.PolicyReloads) > 0 {
		bad("keys.shared_rules", "true: cannot be combined with faults.policy_reloads (a reload changes the budgets of single keys)")
	}
	for i, c := range s.Faults.PolicyReloads {
		p := fmt.Sprintf("faults.policy_reloads[%d]", i)
		switch {
		case c.At < 0 || c.At >= s.Duration:
			bad(p+".at", "%s: outside the run (%s)", c.At.D(), s.Duration.D())
		case c.Spread < 0 || c.At+c.Spread > s.Duration:
			bad(p+".spread", "%s: must be at least 0 and end inside the run (%s from %s)", c.Spread.D(), s.Duration.D(), c.At.D())
		}
		if c.Keys < 1 || (s.Keys.Count > 0 && c.Keys > s.Keys.Count) {
			bad(p+".keys", "%d: must be in [1, keys.count %d]", c.Keys, s.Keys.Count)
		}
		if !(c.Scale >= 0.01 && c.Scale <= 100) || c.Scale == 1 {
			bad(p+".scale", "%g: must be in [0.01, 100] and not 1 (the factor on each budget's rate and burst)", c.Scale)
		}
	}
	valid := append(rebalance.StrategyNames(), ReplicatedCounter, Oracle)
	seen := map[string]bool{}
	for i, st := range s.Strategies {
		p := fmt.Sprintf("strategies[%d]", i)
		switch {
		case !slices.Contains(valid, st):
			bad(p, "unknown strategy %q (valid: %s)", st, strings.Join(valid, ", "))
		case st == "home":
			bad(p, `"home" needs one home region for every key; the simulator models per-key homes, so compare static or proportional instead`)
		case seen[st]:
			bad(p, "%q given twice", st)
		}
		seen[st] = true
	}
	for i, iv := range s.Intervals {
		if iv.D() < 100*time.Millisecond || iv.D() > 10*time.Minute {
			bad(fmt.Sprintf("intervals[%d]", i), "%s: must be in [100ms, 10m]", iv.D())
		}
	}
	if !slices.Contains([]string{"open", "closed", "local", "error"}, s.FailureMode) {
		bad("failure_mode", "%q: want open, closed, local or error", s.FailureMode)
	}
	switch {
	case s.OnError != "" && s.FailureMode != "error":
		bad("on_error", "%q: only failure_mode error leaves a decision to the caller (failure_mode is %q)", s.OnError, s.FailureMode)
	case s.FailureMode == "error" && !slices.Contains([]string{"admit", "deny"}, s.OnError):
		bad("on_error", "%q: want admit (Envoy's failure_mode_deny: false) or deny (true)", s.OnError)
	}
	if s.Sync.D() < time.Millisecond {
		bad("sync", "%s: must be at least 1ms", s.Sync.D())
	}
	maxSkew := time.Duration(0)
	for _, r := range s.Regions {
		maxSkew = max(maxSkew, r.ClockSkew.D().Abs())
	}
	if s.MaxSkew != 0 && 2*maxSkew > s.MaxSkew.D() {
		bad("max_skew", "%s: below twice the largest region clock skew (%s): the coordinator's safety wait assumes it bounds the skew between any two regions", s.MaxSkew.D(), maxSkew)
	}
	if def := rebalance.DefaultConfig(); s.MaxSkew >= 0 && s.Fence >= 0 {
		fence, skew := cmp.Or(s.Fence.D(), def.Fence), cmp.Or(s.MaxSkew.D(), def.MaxSkew)
		if fence < 2*skew {
			bad("fence", "%s: below twice max_skew (%s), as rebalance.Config.Validate requires", fence, skew)
		}
	}
	if f := s.SafeFraction; f != nil && (math.IsNaN(*f) || *f <= 0 || *f > 1) {
		bad("safe_fraction", "%v: must be in (0, 1] (the part of every budget the regions' floors share; a region needs a floor to run a key before its first table)", *f)
	}
	if f := s.IdleSafeFraction; f != nil && (math.IsNaN(*f) || *f <= 0 || *f > 1) {
		bad("idle_safe_fraction", "%v: must be in (0, 1] (the part of every budget the floors of regions without recent demand share; a region needs a floor to run a key before its first table)", *f)
	}
	if s.FloorWindow < 0 {
		bad("floor_window", "%s: must not be negative", s.FloorWindow.D())
	}
	if s.Lease < 0 || s.MaxSkew < 0 || s.Fence < 0 || s.Shift < 0 || s.Shift > s.Duration {
		bad("lease, max_skew, fence, shift", "must not be negative (and shift within the run)")
	}
	if len(s.Seeds) > 1000 {
		bad("seeds", "%d seeds: at most 1000", len(s.Seeds))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrScenario, errors.Join(errs...))
}

func (s *Scenario) checkSpell(errs *[]error, path string, f FaultSpell) {
	if f.At < 0 || f.For <= 0 || f.At+f.For > s.Duration {
		*errs = append(*errs, fmt.Errorf("%s: window [%s, %s) must be non-empty and inside the run (%s)",
			path, f.At.D(), (f.At+f.For).D(), s.Duration.D()))
	}
}

//go:embed scenarios/*.yaml
var builtinFS embed.FS

// Builtin returns the built-in scenario with the given name.
func Builtin(name string) (*Scenario, error) {
	data, err := builtinFS.ReadFile("scenarios/" + name + ".yaml")
	if err != nil {
		return nil, fmt.Errorf("sim: no built-in scenario %q (have: %s)", name, strings.Join(BuiltinNames(), ", "))
	}
	s, err := ParseScenario(data)
	if err != nil {
		return nil, fmt.Errorf("built-in %s: %w", name, err)
	}
	return s, nil
}

// BuiltinNames lists the built-in scenarios, sorted.
func BuiltinNames() []string {
	ents, _ := builtinFS.ReadDir("scenarios")
	var out []string
	for _, e := range ents {
		out = append(out, strings.TrimSuffix(e.Name(), ".yaml"))
	}
	sort.Strings(out)
	return out
}
