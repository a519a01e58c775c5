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
//     FetchChunks. The coordinator reads the stored head with a fresh
//     TableReader as its term starts, so both sides verify alike.
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
package protocol
