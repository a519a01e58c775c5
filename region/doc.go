// Package region is a region's decision core: the policy model, key
// resolution, regional limits, demand accounting, table application, and
// the failure and shadow decisions. It reads no clock and does I/O only
// through the Store it is given, so the simulator (virtual clock, memstore)
// and the agent (Redis) run exactly the same decisions.
//
// # Policy
//
// ParsePolicy reads a YAML policy: envoyproxy/ratelimit's files as they are
// (one domain: and its descriptors: at the top of a file), or Meridian's
// shape, a top-level domains list:
//
//	domains:
//	  - domain: api
//	    hash_tag: tenant          # the descriptor whose value forms the Redis Cluster hash tag
//	    failure_mode: local       # default for the domain's limits: open | closed | local | error
//	    descriptors:
//	      - key: tenant
//	        rate_limit: {unit: second, requests_per_unit: 1000, burst: 200}
//	        descriptors:
//	          - key: route
//	            value: /search    # exact; "/api/*" is a prefix wildcard; no value matches any
//	            rate_limit: {unit: minute, requests_per_unit: 600, failure_mode: closed}
//	      - key: tenant
//	        value: internal
//	        rate_limit: {unlimited: true}
//
// LoadPolicy reads a file of either shape, or a directory of upstream's
// files as its runtime loads RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config/,
// merging a domain's files with LoadOptions.MergeDomains (upstream's
// MERGE_DOMAIN_CONFIG). Meridian's fields (burst, period, failure_mode,
// scope, strategy, lease, hash_tag) work in both shapes; a limit of a file
// of upstream's shape without failure_mode fails as upstream does
// (FailError), one of Meridian's shape falls back to local.
//
// rate_limit takes Envoy's unit (second, minute, hour, day, week, month of
// 30 days, year of 365), requests_per_unit (0 denies every request),
// unlimited, name and replaces ([{name: x}]), plus burst (default:
// requests_per_unit, so that an unchanged upstream config admits what its
// fixed window admits; see DefaultBurst), period (a duration, instead of
// unit), failure_mode, scope (global, the default, shares one budget
// across regions; regional enforces the full limit in each region and is
// never shared) and strategy (a rebalance strategy for the limit's keys),
// and lease ({units, ttl}: local leasing). A descriptor may set
// shadow_mode; one with neither rate_limit nor descriptors matches and
// limits nothing (upstream's allow-list idiom). detailed_metric,
// value_to_metric and metadata are accepted and change nothing here (they
// name upstream's statistics and its dynamic metadata); share_threshold:
// true makes every value its wildcard matches share one key (its pattern
// in place of the value); quota_mode: true is refused, the error saying
// why. Unknown
// fields are errors; every problem is reported at once, each a PolicyError
// with its file, path and line. Matching follows Envoy's reference server:
// at each depth the exact value, then a wildcard, then the bare key; a
// limit applies when found at the request descriptor's last entry. A
// request's descriptors that match limits form one composite,
// all-or-nothing decision (a broad limit is never charged when a narrow
// one denies); replaces drops the named limits when both match. The Policy's Version is a content hash.
//
// Each matched descriptor is a key named KeyName(domain, entries)
// ("api/tenant=acme/route=%2Fsearch"); in Redis the domain's hash_tag value
// is its Cluster hash tag, so a tenant's limits share a slot. Every limit of
// a domain with a hash_tag must have that descriptor on its path (a load
// error otherwise), and descriptors of one request naming different tag
// values are a request error. A single Redis (or Sentinel) decides a
// composite whatever its keys, so a domain needs no hash_tag there. On a
// Redis Cluster one store call runs on one node: with Config.OneSlot,
// NewNode refuses a policy in which one request can combine limits of a
// domain without hash_tag (Policy.CheckOneSlot names them), and a request
// whose keys still could not share a slot (two keys of one untagged limit,
// a limit override without the tag's entry) is a request error — never a
// cross-slot store error.
//
// # Node life cycle
//
// NewNode(cfg, policy, store) starts with no table: every global key runs
// at the idle floor, Config.IdleSafeFraction split over the regions (the
// safe share when it is 0; the whole budget with StandaloneConfig; see
// Standalone). Then, from many goroutines:
//
//	var d region.Decision                    // reuse one per goroutine: no allocation per request
//	err := node.Decide(ctx, nowMicros, req, &d) // Resolve → store.DecideAll → failure/shadow → Record
//	// err is a request error (nothing consumed); d.Allowed, d.Result, d.Matches[i].Result answer
//
// and from one goroutine (the shell's loop, or the simulator's):
//
//	now := clock.Now(wallMicros)                              // region.Clock: the wall clock, never going back
//	if rep := node.Tick(now); rep != nil { send(rep) }        // often (the agent: every 100 ms): the report of a closed Δ, the lease lapse
//	if t, e := node.InForce(now); changed { ack(t, e) }       // the table surely in force on the store
//	err := node.Apply(table, now)                             // each share table from the coordinator
//
// The time a shell passes is the host's wall clock through a Clock (leases
// are instants on the coordinator's wall clock, so no start-up error may be
// kept; a step back stands still). A lease lapses at the first Tick past
// it (the reduction is dated at the lease's expiry), so the shell must tick
// at least once every MaxSkew: the coordinator reassigns a lapsed region's
// share no sooner than its lease plus MaxSkew, and the increase takes
// effect Fence (at least 2·MaxSkew) after that. (The agent ticks every
// 100 ms against a default MaxSkew of 250 ms; the simulator's transition
// world ticks every Δ/50 with MaxSkew at least that.)
//
// Once the table in force says its coordinator reads them
// (rebalance.FeatureDeltaReports), Tick's reports are deltas: only the keys
// whose offered cost moved by more than Config.ReportChange since they were
// last listed (or that started or stopped), each listed in two consecutive
// reports and again at least every Config.ReportRefresh, with a full
// report — every key at the cost it was last listed with — after a new
// term, while the lease is lapsed and when a table asks
// (rebalance.Table.Resync). The package rebalance's doc states what the
// coordinator keeps. Once it says its coordinator reads a key's offered
// cost alone (rebalance.FeatureCostDemand), each listed key carries only
// that: the request count, admitted and denied stay in the agent's
// metrics.
//
// # Shares, epochs and leases
//
// A global key runs at its region's share of the key's budget
// (rebalance.KeyShares.Limits) from the table's effective time on the
// store's clock; the store keeps tokens across the change. Store epochs are
// derived from the key's version in the table, the same in every agent of a
// region: 4v+4 for version v, +1 when the region runs it reduced, +2
// restored, +3 reduced again; 1 for a key no table names. When the
// region's lease (the table's Leases[r], an instant) passes without a newer table, Tick
// reduces every key to min(last share, safe share); a key missing from the
// table runs at the idle floor (the coordinator lowers a region without
// recent demand for a key to it: rebalance's Idle floors, which also say
// why a lapse keeps the safe share); a key whose budget in the table
// differs from the policy (a rollout in progress) runs at min(table share,
// safe share). A decision the store refuses for its region fence
// (Config.Fence: a sibling agent has a newer table) runs at min(share in
// force, idle floor). Reports carry rebalance.AgentIdleFloors when the idle
// floor is below the safe share, so the coordinator knows this agent runs
// both so.
// A table that does not name this agent (Agents[r] lacks Config.Agent)
// is applied reduced, exactly as after a lapse: every key runs at min(last
// share, safe share) — a key the table gives a new version v runs it from
// its effective time in slot 4v+5, never at the table's share — until a
// later table names the agent and restores the shares (the coordinator
// waits for no acknowledgement from an agent its tables do not name). A
// table whose lease for the region has passed when it arrives (a late
// copy) is applied reduced in the same way, never restoring its shares. A
// change never takes effect before the version it replaces (a table can
// arrive after a lapse or restore it predates): every schedule is one the
// store accepts. Node.Schedule shows the schedule a key would be decided
// under. The
// agents of a region share the store, and a region's agents may then run
// one version in different slots (4v+4 named, 4v+5 unnamed); every slot
// means one limit in every agent (the table's, or min(last, safe)), and a
// state written in one slot is read in another either as stored (written
// under a newer slot: never converted back) or as older than the reader's
// previous change (empty at that change). The region's rate stays within
// the largest rate its agents run; a burst that mixes both slots on one
// stored state can exceed the table's burst, by less than the safe burst,
// only when the safe limit's window (burst × interval) is the longer one.
// The safe share's limit is SafeLimit: T_r from the safe share and the safe
// burst rebalance.SafeBurst, which sums to at most the global burst over
// all regions whatever their floors; every table gives each region at
// least its safe burst, so a region running its safe share never holds
// more burst than the table gives it.
//
// Two rules keep Σ of the shares in force within the budget through
// changes the coordinator cannot order (issue 17; the explorer found both
// under policy reloads). A budget that shrinks — the policy reloaded, or a
// table computed for the smaller budget — takes every limit the key runs,
// the one still in force before a pending change included, down at once to
// the same part of the new budget (interval scaled up, burst down, never
// above the limit it was): the coordinator counts shares in ppm of the
// budget, so the old budget's regional limit would be more than the
// region's part of the new one. And a table's pending change lowers at once
// whatever it lowers (a burst that falls while the rate rises is fenced with
// the increases, at one effective time, where a region whose store clock
// runs ahead could raise its burst first): until its effective time the key
// runs the lower, in each of rate and burst, of what was in force and the
// change. Both only ever lower a limit under the epoch it already has, so
// no token is created.
//
// InForce (what reports and acknowledgements name) is the newest table
// surely in force on the store: one whose effective time plus MaxSkew has
// passed on the node's clock. Until the newest table qualifies, it is the
// table that one superseded once that qualifies (it runs until the newer
// one takes effect), else the one that qualified when the newest arrived;
// never a table before its effective time plus MaxSkew.
//
// # Standalone
//
// A region alone, with no coordinator (the agent without a cluster
// section), holds 100 % of every budget: StandaloneConfig is
// DefaultConfig for that one region with SafeFraction 1, so its safe
// share is 10⁶ ppm and SafeLimit is the global limit's T and burst. The
// node then runs exactly as a clustered one before its first table — no
// table, every global key at the safe share, epoch 1 — and the safe share
// is simply the whole budget. That is the design rather than a table the
// shell would make up giving the region 10⁶ ppm: a table carries a lease
// that lapses (Tick would reduce every key to the safe share when nobody
// renews it), a term and epoch no coordinator issued (shown in /v1/table
// and the metrics as if one had), and per-key versions that move stored
// state into epoch slots meant for a coordinator's changes; and it would
// name only the keys it was made with. The floor is what a node runs with
// no table, for every key, forever — the one knob that already means "what
// this region may admit on its own". A smaller SafeFraction runs each key
// at that part of its budget (independent deployments splitting one
// budget by hand). Several regions without a coordinator would each need
// their floors to sum to at most the budget, so the agent refuses to load
// several regions without a cluster section.
//
// # Booked future
//
// Node.Reserve books a request's slot when its wait is at most maxWait; the
// caller acts when the wait ends, so what it books is admitted then, perhaps
// under a later table. Reserve therefore cuts maxWait to the booking
// horizon, Config.MaxReserveWait (default: the coordinator's default Fence,
// 1 s), and with a table to the time left on its lease. The coordinator puts
// at least its Fence, on every store's clock, between a decrease being in
// force (acknowledged, which an agent does only after applying it) and the
// increase it pays for (Fence + MaxSkew on its own clock), so
// with MaxReserveWait ≤ Fence every booking made under a share acts before
// another region's increase bought with that share takes effect:
// ARCHITECTURE.md invariant 4 ("reservations never book past the current
// lease, and the fence before an increase is at least max(reservation
// max-wait, local lease TTL)"). The node enforces its half (the horizon and
// the lease); that the horizon and every limit's lease.ttl are within the
// Fence is checked where both are known, by the agent's configuration. A
// local lease (rate_limit.lease) is served only while its limit and epoch
// are the ones in force here, so it ends when this node applies any change
// of the key's share; its TTL bound is a second line of defence.
//
// # Deny cache
//
// With Config.DenyCache a node remembers, per key, the TAT the store
// reported for it in the last denied request that touched it (every limit's
// result carries it), and forgets it when this node's admission, lease take
// or booking moves it. A request that those TATs deny is answered without a
// store call, reporting for every limit what the store would at that
// instant: the denying limit's retry-after, reset and remaining, the other
// limits of a composite their own untouched state. Only admissions move a
// TAT, so a cached one is a lower bound: the cache never denies what the
// store would admit. With several agents per region the retry-after or
// reset it reports may be shorter, and a remaining larger, than the store's
// (others admitted meanwhile). A request with a limit the node holds no TAT
// for goes to the store. The cache allocates only once per key (its first
// denial): it is a sequence lock over atomic fields, and a writer that
// finds another at work leaves the entry to it — any entry is a lower bound
// while its limit holds — and a reader that meets one goes to the store. So
// under concurrent callers too a reported retry-after may be shorter than
// the store's.
//
// # Failure and shadow
//
// When the store fails, the enforced limits' failure modes decide: any
// closed limit denies the request; otherwise any error limit leaves it
// undecided (Decision.FallbackMode FailError, Allowed false, counted in
// Stats.FallbackError) for the shell to answer with an error, as
// envoyproxy/ratelimit does when its Redis fails, so that the caller's own
// policy decides (Envoy's failure_mode_deny); otherwise the local limits
// decide together in memory at the region's limit divided by
// max(Config.Agents, live agents), and open limits admit. closed wins over
// error because it alone promises a denial; error over local and open
// because an answer from here would take the caller's choice away.
// Decision.StoreErr is the store's error. A region's agents share its
// store, but the local mode decides in each agent's memory: with several
// agents and no membership to count them (standalone), Config.Agents must
// say how many, or an outage admits that many times the region's limit. Shadow-mode limits are decided in a
// second store call after the enforced ones; a denial is counted
// (Stats.ShadowDenied) and never changes the answer.
//
// # Breaker
//
// A store that is down is not waited on call after call: BreakerPolicy is
// the circuit breaker's rule, fed each call's outcome and the instant (µs).
// Failures store failures in a row open it; open, it refuses every call
// (the failure modes decide at once) for Cooldown, then lets one call
// probe: success closes it, failure reopens it for another Cooldown. Only
// the store failing counts (BreakerFailed); a call whose caller gave up,
// or whose input the store refused, is BreakerIgnored, and so is each
// further decision of a store round trip already counted (region/agent
// counts a failed batch of decisions once). While open only the
// probe's outcome counts, and a probe unreported for a Cooldown is given
// up on, so the next call probes. The rule is here, not in region/agent
// (which wraps the store in a Breaker holding the lock, the monotonic
// clock, metrics and the classification of errors), so that the simulator,
// which imports region and never region/agent, can run the same breaker on
// its virtual clock.
//
// # Bounds
//
// A request has a non-empty domain of at most MaxDomainLen bytes, 1 to
// MaxDescriptors descriptors of 1 to MaxEntries entries each (keys 1 to
// MaxEntryKeyLen bytes, values at most MaxValueLen), a cost in [0, MaxCost]
// and at most gcra.MaxChecks matched limits; a key name may not exceed
// gcra.MaxKeyLen bytes. Anything else is ErrBadRequest and consumes
// nothing. Cost 0 peeks (nothing consumed, not demand); a cost above the
// burst is Result.TooLarge. Demand is tracked for at most Config.MaxKeys
// keys; beyond them keys are decided, not reported, and counted
// (Stats.Overflow).
package region
