// Package rebalance decides how each key's global budget is split across
// regions: pure share strategies, the helpers that turn shares into regional
// limits, and the coordinator core that publishes share tables. It imports
// only the standard library and gcra, reads no clock and uses no randomness;
// the simulator and production run the same code.
//
// # Model
//
// A key's budget is one gcra.Limit (emission interval T in µs, Burst). Each
// region r holds a share s_r in integer parts per million (PPM): a table
// never gives a region less than its floor of the key — its safe share
// safe_r, or its idle floor idle_r for a key it has shown no demand for
// (see Idle floors) — and the shares of a key sum to at most PPM (only the full strategy, which the configuration
// must allow, goes above). A region's limit follows from the global limit's
// rounded T, never from the configured rate: T_r = ceil(T·10⁶/s_r), so
// Σ 1/T_r ≤ 1/T (RegionalLimit). The global burst is split in proportion to
// the shares by largest remainder, so the bursts never sum above it; then,
// as shares never fall below the safe shares, no region's burst falls below
// its safe burst — what it runs at its safe share, cold, lapsed, unnamed by
// its table or for a key no table names (SafeLimit, SafeBurst: 1 +
// floor((B − n)·safe_r/10⁶) of a burst B with a unit for each of n regions,
// else floor(B·safe_r/10⁶), so the safe bursts alone never sum above B
// whatever the floors); and a region with demand and a share keeps a burst
// of at least 1 unless the global burst is smaller than the number of such
// regions, in which case the regions with the largest shares get one unit
// each and the others 0 (they deny until the burst or their share grows)
// (SplitBurst, Derive). So Σ over regions of the burst each may run — the
// table's, or its safe burst where it runs its safe share — never exceeds
// the global burst.
//
// # Idle floors
//
// The safe share is what a partitioned, lapsed or fenced-out region may
// still admit, and every table used to leave it to every region: a tenant
// whose traffic is all in one of three regions could hold at most 93.3 %
// of its budget there at the default 10 %. So a region's floor of a key is
// its safe share only while it has counted demand for the key within
// FloorWindow (10 s); after that the coordinator lowers it to the idle
// floor, Config.IdleSafeFraction split equally (1 %: 3,333 ppm of three
// regions), and the region with demand gets the rest — 99.3 %. Agents run a
// key no table names at the idle floor (region.Config.IdleSafeFraction). A
// region that shows demand again gets its safe share back at the next
// rebalance, as an increase like any other. In the simulator at Δ = 2 s
// with quantile this took UA on migrating tenants from 13.0 to 8.3 % and
// in mixed-reserve from 6.8 to 4.2, and no scenario lost more than 0.1
// point (issue 18). The rules that keep invariants 1 and 2:
//
//   - Lowering a floor is a decrease, acknowledged like any other, and only
//     for a region the coordinator hears (a fresh report), whose every
//     agent the latest table names has that table in force, and whose
//     agents all keep one store's region fence: an agent of it that missed
//     the decrease, or one the coordinator has forgotten, is refused by the
//     store once a sibling has the decrease and then decides at its idle
//     floor (region.Node's unfenced path), not its safe share.
//   - An agent whose lease lapses still runs min(last share, safe share):
//     a partitioned region keeps what the operator chose. So when the wait
//     for a decrease that took a region below its safe share ends by a
//     lease rather than by every agent's acknowledgement or the fence, the
//     increase of that key is given up and the region keeps what it held,
//     up to its safe share and burst (Σ stays at most what it was before);
//     the next rebalance moves the key again.
//   - A silent region keeps its share until its lease plus MaxSkew; when
//     it holds more than the live regions' floors leave, they keep what
//     they hold meanwhile instead of rising to their safe shares.
//   - A key new to the coordinator is taken to run at the safe shares in
//     every region, not the idle floors: an agent may still run it under
//     an earlier term's table, or one from before the key left the table.
//   - Only while every agent the coordinator knows, and every member,
//     reports AgentIdleFloors: an agent of an earlier release runs keys no
//     table names, and fenced-out decisions, at its safe share.
//
// # Strategies
//
// A Strategy turns one key's Input — the budget, each region's offered
// demand in the last interval (cost per second), the last shares, the
// floors, and the strategy's own per-key State — into shares. Every
// strategy but full follows one rule: floors first (region r gets safe_r),
// then the distributable D = PPM − Σ safe_r is split by largest remainder
// (Split) in proportion to the strategy's weights, so the shares sum to
// exactly PPM (with no demand anywhere every strategy that follows demand
// may instead keep the last table, which sums to at most PPM). The strategies differ only in their weights. A demand in
// ppm of the budget is demand·T: demand divided by the budget's rate of
// 10⁶/T per second, times PPM.
//
//   - static: weights configured per region (a region left out weighs 0),
//     or an equal split when none are. Predictable and immune to noisy
//     reports, but blind to where traffic is: a region whose users moved
//     away keeps their budget. Reference: the fixed-share option of seed
//     003 (multi-region budgets).
//   - home: the home region gets all of D, the others only their floors.
//     For a key whose traffic lives in one region, with the floors as
//     insurance for the rest; wrong for a key that moves. Reference: the
//     per-tenant home region of seed 003.
//   - proportional: weights are the demand of the last interval; with no
//     demand anywhere it keeps the last shares (if they still fit the
//     floors and PPM), else splits equally. Follows demand within one
//     interval, and with it every burst and lull of the reports: shares
//     flap when demand is noisy. Reference: the periodic rebalancing of
//     seed 003.
//   - ewma: proportional on demand smoothed per region in State,
//     s ← s + α(d − s), with α = alpha_up when demand rises above the
//     smoothed value and alpha_down when it falls (by default both 0.5:
//     alpha_down 0.1, slow give-back, cost follow-the-sun 2.7 points of UA
//     and migrating tenants 5.5 at Δ = 2 s for 0.2 under steady skew) —
//     unless the key's demand moved rather than fell: a region whose
//     demand fell while the other regions' demand alone is at least the
//     smoothed sum of all of them gives back at once (α = 1: its smoothed
//     demand becomes its demand), and a region whose own demand is at
//     least that sum takes it at once too (the other side of a move, or a
//     key new to it). A partial move is followed in part: when the other
//     regions' demand moved from what they remember by at least a quarter
//     of what the key remembers (shiftFraction), a region takes at once as
//     much of its rise as they lost, or gives back at once as much of its
//     fall as they gained, and smooths only the rest. (An interval that
//     holds a move reports it in both regions; smoothing it gave the new
//     region half of proportional's share for that interval: migrating
//     tenants lost 13.9 % instead of 13.0 with quantile at Δ = 2 s and a
//     fence of 500 ms.) Its
//     own demand is left out of these tests, and only raises it into the
//     second, so raising it never lowers its share. (Giving back at the
//     larger alpha instead cost migrating tenants 1.3 points of UA and
//     mixed-reserve 1.0 at Δ = 2 s.)
//     A region whose traffic grows gets share within an interval or two,
//     and a lull of the whole key does not strip any region; with a slower
//     alpha_down the price is budget held for a while by a region whose
//     demand has gone while the key's total falls. With no demand and all
//     State zero it keeps the last shares as proportional does; without
//     State (nil) it cannot remember and behaves like proportional.
//     Reference: exponential smoothing as in TCP's SRTT (RFC 6298), with
//     two gains.
//   - quantile: ewma's smoothed demand, split so that every region with
//     demand holds the same quantile of its demand: share_r = max(safe_r,
//     m_r + z·σ_r), m_r the smoothed demand in ppm, σ_r ∝ √m_r (the
//     noise of Poisson arrivals: a region seeing a tenth of a key's
//     requests is short far more often than its proportional share says),
//     and z the one value at which the shares fill PPM. Under its budget a
//     key gives its slack to the noisiest regions; over it, the steady
//     regions take the noisy ones' excess, where it is used rather than
//     left in an idle bucket. Demand above 1.5 times the budget is scaled
//     away in proportion first, so a heavily oversubscribed key keeps
//     every region with demand above its floor (a key ten times over with
//     80/20 demand splits 86.7/13.3; proportional 80/20). Against ewma at
//     Δ = 2 s it lost 1.1 % where ewma lost 1.8 under steady skew, 1.5
//     against 2.0 in a flash crowd and 1.6 against 2.0 in a retry storm,
//     and it was better or equal in every built-in scenario at Δ = 1, 2
//     and 5 s (README, Choosing a strategy). Raising
//     one region's demand never lowers its share (at a fixed z its target
//     grows, and z falls only as far as the sum needs). Reference: the
//     square-root staffing rule of queueing (Halfin and Whitt), applied to
//     splitting a rate.
//   - maxmin: water-filling with floors and headroom (max-min fairness):
//     each region's demand counts as c_r = demand·T·(1+h) ppm (to the
//     nearest ppm, at most PPM); region r gets max(safe_r, min(c_r, L)) with the common
//     level L raised until the PPM is used up (the last few ppm, fewer than
//     the regions still rising, go one each in name order). When every
//     c_r is met the rest goes in proportion to c_r. With no demand
//     anywhere it keeps the last shares as proportional does (a key
//     between two bursts keeps its budget where it was used), else splits
//     equally. Small regions get all they ask for and the large ones
//     split what remains evenly, so one hot region cannot starve the
//     others; but a region's share above its demand·(1+h) goes to others,
//     so a sudden rise waits an interval (h is the margin for it).
//     Reference: Bertsekas and Gallager, Data Networks, ch. 6 (max-min
//     flow control).
//   - doorman-proportional: Doorman's PROPORTIONAL_SHARE on D
//     (DoormanProportional): wants are demand in ppm, every region counts
//     as a client (one without demand leaves its equal share D/n to the
//     others); in overload each region is sure of min(want, D/n) and the
//     capacity left by the small ones goes in proportion to the excess
//     wants. It gives the largest region more than maxmin does and the
//     middle ones less (Doorman's example: 69.69, 40.31, 10 against 60, 50,
//     10).
//   - doorman-fair: Doorman's FAIR_SHARE on D (DoormanFair): the capacity
//     left below the equal share is shared equally in two rounds, then it
//     stops, so a region may get a little more than it wants while a larger
//     one gets less than maxmin would give it. For comparison with Doorman
//     deployments; prefer maxmin otherwise.
//   - full: every region gets the whole budget (PPM each). The naive
//     baseline: no coordination at all, and up to n times the budget
//     admitted. Refused unless the configuration says allow_overcommit:
//     true, and counted as over-admission. Reference: the full-budget
//     option of seed 003.
//
// For both Doorman strategies the grants are computed for all regions at
// once (Doorman grants one request at a time) and each is capped, in
// region-name order, at D minus the grants before it; capacity they leave
// ungranted goes in proportion to the grants, so the shares still sum to
// PPM; with no demand anywhere they keep the last shares as proportional
// does, else split equally. Reference: github.com/youtube/doorman,
// go/server/doorman/algorithm.go.
//
// A share too small for a slow limit is worth nothing: below
// MinShare(budget) a region's T_r = ceil(T·10⁶/s) exceeds gcra.MaxWindow and
// its limit is the zero limit. So the coordinator never publishes a
// non-zero share below it (FitMinShare): such shares — floors included,
// for a limit slower than one event per 2.4 years over three regions with
// the default floors — become 0, and their ppm go to the key's largest
// share: that region's table row is the only one that admits. MinShare is 1 ppm
// for every limit of at least one event per 37.5 minutes, so this touches
// only very slow limits.
//
// Rounding is exact integer largest remainder, with ties going to the
// region whose name sorts first. Every sum runs in region-name order, so a
// strategy's result depends on the regions' names, never on the order they
// are listed in or on map order. For proportional, ewma, quantile and maxmin, raising
// only one region's demand never lowers its share; doorman-proportional
// holds it up to floating-point rounding of Doorman's formulas.
//
// Bad input: a NaN, infinite or negative demand counts as 0 (the
// coordinator rejects it first; see Input.Validate). A zero budget still
// gets shares (its derived limits are zero and deny everything); maxmin
// and the Doorman strategies, which measure demand against the budget's
// rate, then see no demand and keep the last shares or split D equally. Floors summing above PPM
// cannot all be kept: Input.Validate and the coordinator's configuration
// reject them, and a strategy given them anyway writes the floors scaled
// down to sum to PPM, so no table ever sums above PPM. NewStrategy rejects
// bad parameters with every problem listed.
//
// Strategies are immutable after NewStrategy and safe for concurrent use on
// different Inputs; Allocate allocates nothing (its scratch space comes from
// a sync.Pool). Allocate's out must not share memory with the Input, and
// the Input's slices must be indexed like the regions given to NewStrategy
// (Allocate panics on a length mismatch: a programming error).
//
// # Coordinator
//
// Coordinator is a pure state machine in etcd/raft's style: the shell (or
// the simulator) feeds it demand reports (Observe), acknowledgements of
// tables in force (Ack) and the live agents (MemberChange), calls Tick with
// the time, takes the tables Ready returns, writes each with compare-and-set
// on the previous one before publishing it, and calls Advance. It reads no
// clock, does no I/O and uses no randomness.
//
// A report is full or a delta (Report.Delta). A full report is the
// agent's demand for the interval: every key with demand, an absent key
// having none. A delta lists only the keys whose demand changed
// materially since the agent last listed them (region.Config.ReportChange:
// by more than 20 % by default, or starting or stopping), a key whose
// demand ended with zero counts; Observe keeps the agent's last listed
// demand for every other key, so a steady cluster's reports are nearly
// empty. An agent sends deltas only to a coordinator whose tables
// advertise reading them (Table.Features has FeatureDeltaReports), and a
// full report after its table's term changes, while its lease is lapsed,
// and when a table asks for one: a delta after a gap in the agent's
// intervals (a lost report), from an agent the coordinator did not know
// or naming a key it did not know sets the agent in the next tables'
// Resync until its full report arrives. A lost delta thus costs about 2Δ
// of stale demand for the keys it listed — the agent lists each change
// twice, in consecutive reports, so one lost report costs nothing — and
// each key is listed again at least every ReportRefresh (2 min by
// default), which bounds what anything else can cost. Demand only moves
// shares: a stale one never breaks an invariant, it only places the
// budget worse. Of a listed key's demand the coordinator reads the offered
// cost alone, and its tables say so (FeatureCostDemand), so agents send
// nothing else.
//
// Reports are per closed interval of the agent's clock, which may run
// MaxSkew ahead of the coordinator's: Observe takes a report once its
// interval has closed on a clock MaxSkew ahead. Every Δ — or sooner, as
// soon as every live agent has reported an interval the last rebalance
// did not see (at most once per interval; issue 18: a rebalance at a fixed
// phase waited up to Δ after the reports it needed) — it sums each
// region's agents' latest reports (a missing agent
// counts as last known, never as zero; a region with an agent silent for
// StaleAfter·Δ keeps its last share while membership lists that agent or a
// table still names it),
// runs each key's strategy, keeps a silent region's share until
// its lease plus MaxSkew has passed and then only its floor, and skips
// changes below the hysteresis: a key's shares are published when some
// region's moves by Hysteresis (10 % of the budget by default), or by
// HysteresisNeed (2 %) for a region that gains while its demand fills
// NeedFill (90 %) of the share it holds — one short of its share now. (A
// single 0.5 % threshold republished most keys every interval for moves
// nobody was short of: at Δ = 2 s the split at 5 % cut ewma's control
// bytes by 7–40 % in the built-in scenarios, for UA within 0.1 point or
// better; it waited, as ewma's faster give-back did, for the epoch-slot
// class to be fixed, which rarer, larger transitions exposed more often.
// 10 % cut quantile's bytes by up to 15 % more, UA within 0.05 point.) Shares
// change break before make: a table
// with every share that falls (and none that rises) goes out at once; the
// table with the rises follows only when every agent that may run a
// region's old share has acknowledged the decrease in force, or one
// fenced acknowledgement proves the region runs it (Region fences, below),
// or that region's lease plus MaxSkew has passed, and it takes effect at least
// Fence + MaxSkew after the decrease is in force — Fence on every store's
// clock: the store that increases may run MaxSkew ahead of the coordinator,
// and the decreasing agent acknowledges by its own clock when its store,
// up to MaxSkew behind it, has only just switched (a booking made there
// under the old share acts up to a max-wait later; issue 18 found the
// increase MaxSkew early on the increasing store). The agents that may run a region's old share
// are those the previous table named and those an earlier table named, each
// until the lease of its region in the last table naming it plus MaxSkew
// (it may hold that table, and a table naming it lets it run the table's
// shares until that lease). A table names the live members and every agent
// an earlier table named while that agent was a member, until the lease
// then plus MaxSkew; a report alone names no one (issue 17, defect 7: an
// agent memberlist refused still reached NATS, was named and got shares),
// and a region is live only while it has a named agent with a fresh report
// — a coordinator never given membership (MemberChange) names the agents
// with a fresh report instead. An agent no table names runs
// at min(last share, safe share) (region.Node applies such a table
// reduced), so it needs no wait. A decrease with no agent to hear from in
// any region that loses share (a fresh cluster's regions before any agent
// is named) is in force once its effective time plus MaxSkew has passed.
// So at any instant, whatever mix of tables
// the regions run, no key's shares in force sum above PPM. With agents that
// acknowledge a table as soon as it is in force (MaxSkew after its
// effective time, by their clocks), a shift of demand is reflected within
// 2Δ + 4 one-way latencies + Fence + 2·MaxSkew: up to Δ until the next
// rebalance sees the new demand (reports are per closed interval, so up to
// another Δ), a latency each for the report, the decrease, its
// acknowledgement and the increase, the acknowledgement's MaxSkew and the
// fence with its MaxSkew. A shift inside an interval is reported by that interval as
// demand in both places, so a strategy that follows demand gives the new
// region the whole share one Δ later still (sim.TestMovedKeyFollows
// measures 80 % of a moved key's budget against 3Δ + 2·(Fence + 2·MaxSkew)
// + 4 latencies). A rebalance never runs before the previous increase is in force on
// every store (its effective time plus MaxSkew): superseding a change at the
// instant it takes effect would leave keys' state written under the limit
// before it, which stores read as debt; so a shift that lands just after an
// increase may wait up to another Fence + 2·MaxSkew. An agent that never
// acknowledges delays the increase to its region's previous lease plus
// MaxSkew. Lease must exceed Δ + Fence + 2·MaxSkew, or leases would lapse
// between a healthy coordinator's tables, and Fence must be at least
// 2·MaxSkew: then, on the stores' own clocks, an increase starts after the
// decrease it pays for even when the store that increases runs MaxSkew
// ahead of the coordinator and the one that decreases MaxSkew behind
// (Config.Validate refuses both).
//
// # Region fences: one acknowledgement per region (invariant 1, new form)
//
// Issue 17, defect 5: a decrease used to wait for every agent that may run
// the region's old share — including one whose process had crashed with
// the old coordinator, for a whole lease. Agents of a region decide on the
// region's one store, so the store can enforce the break itself: each
// agent, as it applies a table that names it, raises the store's region
// fence to the table's (term, epoch) (gcra.Fencer: it only rises), and
// every decision made under a table's share carries that table as its
// fence (gcra.Schedule.Fence); the store refuses a decision whose fence is
// below the one it holds (gcra.ErrFenced). A region is then proven to run
// a table (term, epoch) or a later one (fencedFor) once a member of it
// acknowledges that table in force with a fence at least (term, epoch),
// read back from store S (AckFenced), and every agent of the region this
// coordinator keeps — members and agents a table named — acknowledged on
// S. Such a region's agents need no more waiting, in learning mode or for
// a decrease: an agent still on an older table, crashed or partitioned
// from NATS, has every such decision refused. Invariant 1 then reads: an
// increase waits until each decreasing region has every agent that may
// run its old share acknowledge the decrease in force, or one fenced
// acknowledgement proving it, or its previous lease plus MaxSkew has
// passed; it still takes effect Fence + MaxSkew after. A silent region — no member
// to acknowledge or raise its fence — still waits for its lease. This
// holds only because all of these hold, and each is where it is kept:
//
//   - A fence refusal is not a store failure: the node decides the key again
//     at min(share in force, idle floor), unfenced and at every instant of
//     the store's clock — never by a failure mode, never at the table's
//     share (region.Config.Fence; the error says StoreHealthy, so no
//     breaker counts it).
//   - Tokens prefetched into a local lease live at most the rule's lease
//     TTL and a reservation acts at most its max-wait after booking; both
//     are at most Fence (the agent checks), which the increase waits after
//     the proof; a take or booking the fence refuses is made at the reduced
//     limit and keeps no lease.
//   - The acknowledgement carries the fence as read back and the store's
//     identity — a hash of the server's run_id and the key prefix, so a
//     restart or failover changes it — and counts only if every agent the
//     region has acknowledged from decides on that store. An agent this
//     coordinator never heard from (the crashed coordinator's own) is taken
//     to decide on the region's one store: a region whose agents use two
//     stores admits each share twice whatever the tables say.
//   - A Redis Cluster has no one key every slot's script reads, so a
//     Cluster store keeps no fence: its agents acknowledge with identity 0,
//     prove nothing, and their regions wait for leases as before.
//   - A missing fence (a restart, a failover to a replica without it, an
//     eviction) refuses every fenced decision: the region runs safe shares
//     until an agent applies its next table and raises the fence again.
//   - The fence write is confirmed on every connected replica (WAIT) before
//     the acknowledgement that carries it; unconfirmed, the agent reports
//     no new fence.
//   - An acknowledgement from an agent membership does not list proves
//     nothing; the increase still waits Fence + MaxSkew after the decrease
//     is in force.
//
// One gap remains: a fence the store lost after a proof (a restart or
// failover, an eviction) comes back from the next raise, and the agent
// raising it may be a slow sibling applying an older table than the one
// proven — an agent still on that older table and cut from NATS, not from
// the store, then decides under it again. It needs the store to lose the
// key between the proof and a sibling's late delivery of an older table,
// and a third agent on exactly that table; it is not closed yet.
//
// A coordinator acts under a term, the fencing number its election gives.
// StartTerm hands it the newest stored table: it republishes those shares
// under the new term (learning mode) until every agent that table named has
// acknowledged (or its region is proven by a fenced acknowledgement), or
// one lease plus MaxSkew has passed, and only then
// rebalances — a failover never resets shares. A region whose lease in the
// stored table has passed is the exception: its agents may have lapsed, and
// a table the term cannot see (stored after that one and then overwritten,
// as a replayed head overwrites) may have handed the rest of its share to
// others, so the term inherits it at min(stored, safe) share and burst. The new term starts from
// the stored table's agents and leases: it names the agents the stored table
// named until their region's stored lease plus MaxSkew and waits for them as
// for agents it named itself, and a decrease of a region the stored table
// names no agent in waits for that region's stored lease plus MaxSkew (an
// agent an older table named may still run it). The shell tells it the
// live members (MemberChange) before StartTerm, so that the term's first
// table names them too. What the new term cannot know is an agent that an
// older table named but the stored one no longer does, in a region the
// stored table names other agents in: it may still run that older table
// until its lease, which is at most the stored one. Tables are ordered by
// (Term, Epoch); an agent refuses anything older than what it holds, so a
// report or acknowledgement naming a table above the coordinator's own
// (term, epoch) acknowledges nothing: that agent runs a table this
// coordinator never made, and Outranked reports it (the shell ends the
// term and stands again above it).
//
// The first term with no stored table learns too, until every member has
// acknowledged its first table — or, when some region has no member it
// can hear (a partition may hide agents on older tables there), until one
// lease plus MaxSkew has passed: it
// is a new cluster's (whose agents acknowledge at once) or a candidate's
// restarted cold while the bucket was lost, whose election in the
// recreated bucket restarts at term 1 below the tables the other agents
// run — they refuse its tables and never acknowledge them. It also waits
// until every region has a member with a fresh report (within the same
// bound; a live agent reports within about Δ): a first rebalance without a
// region's demand would give that region only its floor and hand its share
// back one transition later.
//
// A term after the first with no stored table to start from — the bucket
// was lost, its head could not be verified, or it was a replay of a table
// older than one the candidate's agent had (the shell passes nil) — cannot
// know what the agents run: each may hold an earlier term's table until
// its lease, at most one lease from now. Such a blind term publishes the
// floors, each with only its part of the burst (a unit owed to a region
// with a share is not given: with a burst below the number of regions it
// may be the one an old table still holds), and stays in learning mode
// for one lease plus MaxSkew, acknowledgements or not; then every agent
// runs its tables or has lapsed to its safe share. Its tables carry that
// instant (Table.BlindUntil), and a term that starts from one of them
// before it waits for it too, as well as for the agents the table names:
// the older tables are as unknown to it as to the blind term, and the
// blind rows leave them their part of the burst. A key new to any term
// still in learning mode gets the same: its floors with only their part of
// the burst (the stored table may lack a key an older one has — a blind
// term's tables start with none). Row versions never go
// back across terms: a term's first table gives every row — adopted from
// the stored table or new — a version from (term−1)·2³², above any an
// earlier term can have given it (fewer than 2³² changes per key per
// term), because an agent keeps a row whose version went backwards and the
// stored head may be older than a table an agent holds (a replayed head,
// a lost write); the limits do not change, so the stores convert exactly.
// (Tag arithmetic compares store epochs within 2³⁹, about 32 terms: a
// state left unrested across 32 failovers may be read as newer.) And a
// row an agent reduced twice under one version (two lapses) is restored
// only by a new version: after an agent was silent for a lease less Δ,
// when a term starts from a table whose lease has passed, or when a table
// names again an agent a table before it stopped naming (membership
// dropped it while it kept reporting: a false suspicion), the next table
// gives every row a new version.
//
// A key whose budget changes (SetBudgets, or a term that starts from a
// table stored under another budget) gets a new version and keeps its
// shares; each region's burst becomes what its agents make of the one in
// force when they reload the policy: floor(b·new/old) when the budget's
// burst falls, b when it rises (ShrunkBurst; the region package shrinks
// limits in force by the same rule). Those sum within the new burst
// whatever mix of tables the regions run, and they lower or keep every
// region's burst — a split afresh could raise one region's while it
// lowered another's at one effective time, and a store whose clock runs
// ahead would raise first (explorer schedule 1822 of seed 10 at max_skew
// 250 ms: Σ bursts 9 of 8). The next rebalance splits the new burst,
// break before make, like any move. An increase waiting when the budget
// changes is given up (its bursts, split from other shares, need not stay
// above the ones in force); the next rebalance moves the key again.
//
// # Memory
//
// A coordinator holds, per key, its budget, the shares and bursts of the
// shares in force, of the latest table and of a waiting increase, strategy
// memory and one table row: at most 400 + 100·n bytes per key over n
// regions (measured: 690 B at 3 regions, 1,332 B at 10, names of 15 bytes
// included; TestCoordinatorMemoryPerKey). Per agent it keeps ~200 bytes
// and 12 bytes per key its demand names (its last full report with every
// delta since) plus 4 per key its last full report listed (their order,
// Observe's first guess), and once any delta arrived 8 bytes per key of
// scratch for merging them; a region keeps at most
// MaxAgentsPerRegion agents that membership does not list (members always
// count), and an agent no table names is forgotten once its reports went
// stale, or, if it only acknowledged, a lease plus MaxSkew after it was
// last heard — so names nobody vouches for cannot grow it. A removed key
// leaves nothing behind: one number, above every removed key's version,
// is where a key added later starts (so versions still never go back).
// Keys come and go in place (UpdateKeys, SetBudgets): the per-key state is
// rekeyed without a second copy, and UpdateKeys allocates only for the
// keys it names.
package rebalance
