// Package sim is the discrete-event simulator operators use to choose a
// share strategy and a rebalance interval. It runs the real code — per
// region region.Nodes on gcra/memstore under a virtual clock, the
// coordinator's term as gossip.Loop runs it (protocol.Term: keys learned
// from the reports that name them and idle ones dropped, the policy's
// budgets, membership before the term starts, the start from the stored
// table, what to store; around the rebalance core's strategies, leases,
// acknowledgements and learning mode), the table's way to the agents as
// gossip.Loop and gossip.Transport run it (cluster.go: signed with
// wire.EncodeTable, compare-and-set on the KV head with the term told the
// outcome, each agent's watch ordered by protocol.HeadOrder and retried by
// protocol.WatchTimer, read by a protocol.TableReader, offered to its
// protocol.Follower), and the coordinator election each agent runs
// (protocol.Candidate on the KV bucket's election key, so a dead
// coordinator's successor is elected once its record lapses and starts
// from the stored head; a fenced term ends and stands again as gossip's
// campaign does; each agent raises its region's store fence as it applies
// a table that names it, and decides under it, as an agent on one Redis
// does: region.Config.Fence) — and simulates only the links and faults: per region
// pair one-way latency with jitter, loss and duplication, partitions,
// region loss, coordinator failover, Redis outages (exercising the failure
// modes), NATS outages, loss of the KV bucket, forged, replayed and
// undecodable heads, one agent's partition from NATS, an agent's crash
// (the coordinator's, or any), membership's detection delay and false
// suspicions, key churn, clock skew and clock steps. Nothing here decides, shares, leases or rebalances on its
// own — but for the caller's answer to failure_mode error, which the
// agent leaves to the caller: the scenario's on_error (admit, Envoy's
// default, or deny) gives it, and Result.Errored counts those requests. A region's skewed clock is its store's clock and its agents' wall
// clock; each agent's time comes from it through a region.Clock, exactly
// as the agent shell's comes from the host's wall clock.
//
// The yardstick is the oracle: one GCRA with each key's full budget seeing
// every request at its arrival time. Metrics follow ARCHITECTURE.md ("The
// simulator's yardstick"): OA and UA over 1 s and 10 s windows, OA_budget
// from a conformance meter, the peak ratio P, fairness relative to the
// oracle, convergence after a scripted shift, control cost and per-request
// disagreement, summarized per strategy × interval across keys
// (demand-weighted mean, p50, p99, max) and across seeds (mean and 95 %
// interval). Convergence is each key's in 1 s windows, or in 10 s windows
// when the oracle admits it under 400/s; its summary is the median over
// keys with the keys that never converged counted, never left out
// (Convergence).
//
// Baselines beside Meridian's strategies: full (Kong's local policy) and
// static (Envoy's local_cluster_rate_limit) and Doorman's two algorithms
// are rebalance strategies; replicated-counter is modelled here (it is not
// a Meridian strategy): each region admits against its own view of one
// global GCRA and sends its admissions to the others every Sync (100 ms by
// default; a message only to a region that has not seen them, none when
// there is nothing new), arriving after the link's latency — gubernator's GLOBAL
// behaviour and Upstash's multi-region limiter. The recommendation is
// chosen among Meridian's strategies only; the baselines are there to
// compare with.
//
// A run is deterministic: one seeded PCG drives arrivals, regions, costs,
// jitter and loss, events tie-break in the order they were scheduled, and
// every sum runs in key order, so the same scenario and seed give
// byte-identical JSON whatever the number of workers. Memory is per key
// and per key-region (streaming window counters), never per request.
//
// The transition world (transition_test.go) is the protocol's safety
// test, in the style of FoundationDB's simulation and TigerBeetle's VOPR:
// the real coordinator and real region.Nodes — one memstore per region,
// shared by its agents, on the region's virtual clock; each agent's time
// its host's wall clock (skewed, stepping back and forth) through a
// region.Clock — driven in the shells' call order (Apply on delivery;
// Tick, then InForce's acknowledgement, every agent tick; MemberChange
// before StartTerm) under random fault schedules from a printed seed:
// delays, loss, late and out-of-order tables, region and agent
// partitions, late joiners, coordinator failover from the latest stored
// table, small bursts and unequal floors. After every event, for every
// key, Σ over regions of the share each region's store would enforce for
// the next decision (the largest over its agents of the limit
// Node.Schedule selects at the store's clock, as ceil(T·10⁶/T_r) ppm) is at
// most 10⁶ and Σ of those bursts at most the key's burst. A failing seed
// prints itself and a trace; go test ./sim -run TestTransitionRandom -seed
// N replays it, -seeds sets how many run (120 per case, 20 under the race
// detector).
//
// The explorer (Explore, explore.go; `meridian sim --explore N --seed S`)
// hunts the whole run for violations in the same style: N fault schedules
// derived from one seed (schedule i draws from PCG(S, i)) over a small
// cluster (ExploreBase: three regions of 1–3 agents, 24 keys, moving
// demand, an 8 s lease, 90 s runs), each drawing a few faults from those
// the scenario language has — partitions of one region (the
// coordinator's too), region loss and return, Redis outages, coordinator
// failovers, traffic moves and flash crowds — and a set-up: strategy and
// interval, static clock skew, link loss and jitter, deciding, retrying
// or reserving clients, and now and then an over-admitting failure_mode
// or the full strategy. A hook in the event loop (Run.check) runs the
// checks of check.go after every event: per key, Σ over the regions that
// are up of the share and of the burst in force, computed as the
// transition world does (a lost region decides nothing, so it counts again
// from its return; full over-commits by choice and is not checked); and at
// the end OA_budget = 0 unless the schedule chose open, local, error or
// full; lease + 3Δ after the last fault heals, every agent holds a table
// in force that names it and runs every key within 5 points of what a node
// holding only that table runs; election TTL + 2Δ after a coordinator
// crash with nothing else wrong, a new term runs out of learning mode; no
// head but a coordinator's ever fences a term; and each agent's messages
// and bucket calls stay within resourceBound, the coordinator's entries
// within the run's keys and agents. A failure is shrunk — faults dropped one at a time, the set-up
// simplified, faults halved and moved earlier, the run cut just after the
// violation — and printed as a scenario file that `meridian sim --scenario
// FILE --check` replays to the same violation. A policy reload
// (ReloadSpec) reaches each agent at its own instant, so mid-reload the
// agents run different budgets: the shares and bursts in force are then
// measured against the largest budget a live agent's policy gives the key
// (a rollout promises no more), and OA_budget's meter keeps a shrinking
// budget's old value until every agent has read the new one and the
// reservations booked before then have been served (the reservation
// horizon later: a booked slot is a promise made under the old budget).
//
// Control cost counts what gossip/wire would put on the wire: each report,
// ack and signed table is sized exactly (ReportSize, AckSize, TableSize,
// cluster name "sim") and every chunk is one message. Only the
// replicated-counter baseline, which is not a Meridian protocol, estimates
// its sync batches (the sender's region name plus 8 bytes per message, the
// key's name plus 8 bytes per key); its results say so
// (BytesEstimated).
package sim
