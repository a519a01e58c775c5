// Package protocol is the cluster protocol's logic without its I/O: what
// the agents of a cluster send, accept and apply, what the coordinator
// budgets, stores and publishes, and the ports (Bus, TableStore, KV,
// Membership) through which the shell's adapters — NATS, JetStream KV and
// memberlist in package gossip, in-memory transports in gossip/memnet —
// carry it. It imports no network client, so the simulator can run the
// very code `meridian agent` runs, in virtual time (issue 16).
//
// It lives under gossip rather than in rebalance or region because it is
// the cluster's protocol: rebalance decides shares for one coordinator
// and region decides requests for one node; the protocol is what joins
// them across processes (reports, acknowledgements, signed tables,
// terms, the election).
//
// # Agent side
//
// An agent follows the table head its cluster's store holds and sends the
// coordinator what its node produces. The decisions are here; the shell
// (gossip.Loop over NATS and JetStream KV, or the simulator) fetches,
// publishes and times:
//
//   - TableReader reads a table from its head: Head decodes the head
//     against the cluster and the trusted coordinator keys, insists it is
//     a table's first chunk, and either returns the whole table or names
//     the chunks to fetch (a ChunkRequest); Chunks takes them, refusing
//     any that fails to verify or belongs to another table, and joins them
//     with a wire.Assembler. ReadTable does both through the store's
//     FetchChunks. A reader keeps the last table it read as its base and
//     patches a delta head built on it (wire.Patch, digest checked) from
//     the head alone; a delta on another base is read from its chunks.
//     An in-base head (wire.EncodeTableOn: no chunks of its own) is
//     patched onto the base rows the reader keeps, or onto the named
//     base's chunks, fetched. The coordinator reads the stored head with a
//     fresh TableReader as its term starts, so both sides verify alike.
//   - TableEncoder is the coordinator's side: each table goes as a new
//     base or as an in-base head on the last base stored, whichever the
//     bus carries in fewer bytes, in-base heads only while Term.ReadBy says
//     every agent the table names reported wire.FeatureInBase, row patches
//     in its deltas only while they all reported wire.FeatureRowPatches
//     (agents of earlier releases report neither, or only the first), and
//     a base after any failed write.
//   - Follower decides which verified tables reach the agent: only one
//     strictly newer by (term, epoch) than the last delivered, so a
//     replayed, repeated or reordered head never goes back, and a new
//     term's table wins whatever its epoch. The rest are stale.
//   - Classify names why an inbound message was refused (signature,
//     cluster, malformed, or unavailable when the store, not the message,
//     failed); Outcome names what the node made of a table it was handed
//     (applied, stale, refused). They are the shell's metric labels.
//   - Outbox is the bounded queue of what the agent sends: the node's
//     reports and acknowledgements of the table in force, oldest first,
//     dropping what does not fit; (0, 0) is never acknowledged. Out.Encode
//     is the wire form, stamped with the region store's clock.
//
// What is not here, because region.Node decides it on the node's clock:
// which table is in force, hence what a report names and an
// acknowledgement acknowledges (Node.InForce: effective time plus MaxSkew
// passed), and the lease lapse to min(last share, safe share) (Node.Tick).
// region/agent acknowledges when InForce changes. Learning mode is the
// coordinator's (rebalance).
//
// # Election
//
// One coordinator per cluster is elected through one key of the KV port,
// <cluster>.leader, holding a LeaderRecord (term, holder, since, expiry;
// JSON, version 1). Candidate is one candidate's side of it as a state
// machine: the shell (gossip.Election.Campaign on JetStream KV or memnet, the
// simulator on an in-memory bucket) calls Step with two clock readings
// (Clocks: wall and monotonic µs) and the outcome of the op it last
// performed, and performs the KVOp it gets back — wait, read, create,
// update at a revision — bounding each call by the op's Until. Events say
// when the candidate was elected or deposed, and what to log. Stop ends a
// campaign and returns the write that releases the key. The poll jitter
// comes from a *rand.Rand the shell passes, seeded in the simulator.
//
// The rules: a follower takes an absent key with term 1 (Create), or a
// record whose expiry plus MaxSkew has passed on its wall clock with the
// record's term + 1 (Update on the revision read); a take answered a
// whole TTL after it was sent is not leadership. A leader renews every
// Renew (Update on its last revision, expiry now + TTL) and is deposed
// when a renewal loses its compare-and-set or TTL has passed on its
// monotonic clock since it sent its last successful write. An invalid
// record blocks the election until an operator fixes it; a released one
// (expiry 0) is free at once. With wall clocks within MaxSkew of each
// other, a successor is elected only after its predecessor's deadline,
// so no two candidates believe they lead at once — but belief is not
// authority: the table head's compare-and-set (TableStore, ErrFenced) is
// the fence that keeps a deposed coordinator that has not noticed yet
// from publishing.
//
// # Watch
//
// An agent follows the table head through a watch of its key, which the
// adapters (gossip.Transport.WatchTables, memnet's WatchHeads) create,
// re-create after a drop or reconnect, and back up with a reread every
// Resync; HeadWatch decides for both. HeadOrder delivers a head only when
// its revision is above the last delivered, so the follower sees each head
// once, in order, however many paths (initial value, update, re-created
// watch, resync) bring it within one watch. WatchTimer backs a failed
// watch off from RetryMin, doubling to RetryMax, without jitter, and
// schedules the rereads. A revision that went backwards means the bucket
// was deleted and recreated (its sequence restarts at 1); the first head a
// re-created watch reads (HeadOrder.Rewatch) is delivered whatever its
// revision, and the Follower orders it by (term, epoch), as it orders
// everything: a recreated bucket's tables, from a term above every table
// the candidates have seen (Candidate.SetFloor), reach the agents at once.
// (Until issue 17, defect 3, such heads were withheld until the new
// bucket's revisions passed the old one's, which may take as many writes:
// agents kept a table whose lease then lapsed.)
//
// # Coordinator
//
// Term is one term of the coordinator. The shell (gossip.Loop.coordinate
// over NATS and the KV bucket; the simulator over gossip/memnet) owns the
// I/O: it reads the stored table head and verifies it, decodes and
// reassembles reports and acks, signs and encodes tables
// (wire.EncodeTable), compare-and-sets them (TableStore.StoreTable) on the
// revision it last wrote, keeps that revision, runs the ticker, and turns
// the Term's events and stats into logs and metrics. Term decides, on
// explicit instants (µs, the coordinator's clock), with no clock, no I/O
// and no goroutine:
//
//   - The key life cycle. A key enters on the first Tick after a report
//     names it, budgeted by its rule (region.Policy.RuleForKey; a key with
//     no shared rule is kept, unbudgeted, to count against MaxKeys and
//     idleness). It leaves once no report named it for longer than
//     KeyIdle. At MaxKeys, further keys are not kept: they run at their
//     safe share and are counted (EventOverflow, per report naming them).
//     The stored table's keys are the term's first keys; one budgeted
//     there with no rule here keeps the stored budget (another agent's
//     policy may be ahead).
//   - Policy reloads: every key is re-ruled, later tables carry the new
//     version, and the core gets the new budgets.
//   - The term's start. A stored table whose term is not below this one
//     deposes it (ErrDeposed); an unverifiable head, or one older than
//     the table the candidate's own agent had (Replayed), is no table:
//     the shell passes nil and the term starts blind, from the floors,
//     waiting a lease before it rebalances (rebalance's doc). The
//     election takes a term above the newest table the candidate has seen
//     (Candidate.SetFloor), so a lost election record does not restart
//     the terms below the agents' tables. The live
//     members reach the core before rebalance.Coordinator.StartTerm, so
//     the first table names them as well as the stored table's agents, and
//     the first decrease waits for them.
//   - What to store. The newest table the core made is returned by every
//     Tick until Stored says the store took it; a newer table supersedes
//     an unstored one. A store error leaves the table to retry; one
//     wrapping ErrFenced (the head moved) makes the shell read the head and
//     ask Fenced, and only a verified table of a later term (another
//     coordinator) ends the term (ErrDeposed), as does a report or an
//     acknowledgement naming a table above everything the term made
//     (Deposed, Outranked: the shell stands again with its term floor at
//     least that table's term — a candidate restarted cold while the
//     bucket was lost wins term 1 in the recreated bucket, below the
//     tables the others run). A head no coordinator wrote —
//     forged, unverifiable, garbage, a replayed older table — is counted
//     and stored over: it neither deposes the term nor resets shares.
//   - Reports wait for the next Tick in a bounded queue (Queue × regions;
//     Report says when it drops one) and are observed at the Tick's
//     instant; acks go to the core at once. Report also returns the
//     sender's skew estimate for the shell to show.
//
// What the core refuses (a membership list, budgets, a report from an
// unknown region) comes back as Events; the input is ignored, as it was
// before the logic moved here. rebalance.Coordinator still does the share
// math, leases, learning mode and break-before-make; Term adds only what
// happens around it between one term's start and its end.
package protocol
