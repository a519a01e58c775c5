// Package memnet is an in-memory cluster network: the protocol's ports
// (protocol.Bus, protocol.TableStore, protocol.KV, protocol.Membership) as
// one simulated cluster provides them to each of its agents, with the
// faults a real cluster has — for the simulator (virtual time,
// deterministic per seed) and for tests that run gossip's loop in real
// time without NATS or memberlist.
//
// # Model
//
// A [Network] is one cluster: a pub/sub bus (reports and acks), one KV
// bucket (the share table's head and chunks, the election key) and a
// membership service. [Network.Agent] returns the endpoint of one agent;
// an [*Agent] implements every port as that agent sees them. The network
// imports no network client (archtest): only the standard library and the
// protocol's packages.
//
// Time comes from a [Clock]: [RealClock] for real-time tests,
// [VirtualClock] for the simulator, an event queue advanced by its owner
// ([VirtualClock.Advance], [VirtualClock.RunUntil]) that runs due
// callbacks in time order, ties in insertion order. Every random draw
// (loss, duplication, jitter) comes from the *rand.Rand given to [New], in
// an order fixed by the sequence of calls, so one seed and one schedule of
// calls give one run.
//
// The network orders its own events (deliveries, membership changes,
// watch retries, delayed KV operations) by (due time, insertion order)
// and runs them one at a time, under either clock. Callbacks the network
// makes (a subscription's fn, a [Agent.WatchHeads] fn) run in that event
// context: under a VirtualClock on the goroutine that advances it. They
// must not block on the network's future (advance the clock, or wait for
// a delivery), and must not stop their own subscription.
//
// # Faults
//
//   - Links ([Link], [Network.SetLink]): latency, jitter (uniform in
//     [0, Jitter]), loss and duplication probability per (from, to), by
//     agent or by region. Messages are delivered in order of send time +
//     latency + jitter, so jitter reorders.
//   - Partitions ([Network.Cut], [Network.Heal]): one way or both, between
//     agents or regions; they cut pub/sub and membership (and the KV, for
//     agents cut from [Network.SetKVHome]'s region).
//   - Disconnection ([Network.Disconnect]): the agent's bus is down
//     (Connected false, publishing fails with [ErrDisconnected], nothing
//     delivered to it) and so is its KV access; its watches drop and are
//     re-created when it reconnects. Membership is unaffected (memberlist
//     is not NATS). [Network.Kill] takes an agent out of everything.
//   - The bucket: [Network.KVOutage] (every operation fails with
//     [ErrUnavailable], watches drop), [Network.LoseBucket] (every key
//     gone, the revision sequence restarts), per-agent latency
//     ([Network.SetKVLatency]), [Network.DropWatches].
//   - Membership: an agent that dies or is cut off is reported dead only
//     after Config.DetectDelay, back alive after Config.JoinDelay;
//     [Network.Suspect] makes an agent appear dead to every other agent for
//     a while (a false suspicion). Changed is signalled after each change
//     of an agent's view.
//
// [Network.Counters] counts each agent's operations (KV reads, writes,
// watches created, messages published and delivered), so a caller can
// bound them.
//
// # Blocking and asynchronous calls
//
// The ports' KV calls block, as on NATS: without KV latency they complete
// at once on the caller's goroutine; with latency under a VirtualClock a
// call blocks until another goroutine advances the clock past it. A
// simulator that runs everything on the goroutine advancing the clock
// uses the asynchronous forms instead ([Agent.GetAsync], CreateAsync,
// UpdateAsync, StoreTableAsync, LatestTableAsync, FetchChunksAsync, and
// [Agent.WatchHeads] for WatchTables), which complete in event context,
// one KV latency per round trip, exactly as the blocking forms do.
//
// # Differences from gossip.Transport and gossip.Members
//
// ports_conformance_test.go in package gossip runs one script against the
// Transport and against memnet and finds the same transcript (revisions
// included); membership is not in it (memberlist's timing is its own, and
// memnet's is the knobs above). Beyond it:
//
//   - Publishing while disconnected fails at once; the Transport buffers
//     reports and acks while reconnecting (ReconnectBufSize) and fails only
//     past the buffer or once closed. A late replay is harmless to the
//     protocol, a loss is the harder case, so memnet models the loss.
//   - Flush returns at once (nothing is queued on a connection).
//   - Subscriptions' callbacks run in the network's event context, not on a
//     goroutine per subscription: in real time a slow callback holds up
//     every delivery of the network.
//   - A watch delivers every head written while it is up; JetStream's
//     (History 1) may skip a head already superseded. Both only ever
//     deliver newer heads, which is all the port promises.
//   - There is no Close (WatchTables ends only with its ctx) and no Leave:
//     Kill and Revive stand for a crash and a restart.
//   - Keys and subjects carry no cluster prefix: a Network is one cluster.
//
// A Network and its Agents are safe for concurrent use.
package memnet
