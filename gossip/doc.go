// Package gossip is the network shell around the pure cores: it carries
// demand reports, acknowledgements and share tables between the agents of
// a cluster over NATS, keeps membership with hashicorp/memberlist, elects
// one coordinator through a JetStream key-value bucket, and runs the
// rebalance core on the elected agent. Decisions stay in region.Node,
// rebalance.Coordinator and gossip/protocol; this package only moves their
// inputs and outputs.
//
// # Pieces
//
//   - The ports (gossip/protocol's Bus, TableStore, KV, Membership): what
//     the protocol needs from the network. Transport provides Bus and
//     TableStore, its bucket the election's KV (kv.go), Members
//     Membership; gossip/memnet provides all four in memory for the
//     simulator and tests. Ports bundles them for a Loop (NewPorts wires
//     a Transport and Members); crosstransport_test.go runs one cluster
//     through the same Loop on NATS and on memnet and finds the same
//     tables.
//   - Transport (nats.go): one cluster's subjects and KV keys on NATS.
//     Reports and acks are core NATS publishes on
//     meridian.<cluster>.report.<region>.<agent> and .ack.…; the latest
//     table lives in the KV bucket as chunks under <cluster>.table.…, its
//     first chunk at <cluster>.table.head. StoreTable writes the other
//     chunks, then compare-and-sets the head on the revision the
//     coordinator last wrote: that write is the publication, and a deposed
//     coordinator's write fails (ErrFenced) once its successor has written.
//     A fenced coordinator reads the head: only a verified table of a later
//     term deposes it (protocol.Term.Fenced); one no coordinator wrote — a
//     forgery, garbage, a replayed older table — is stored over.
//     Tables and the election use a connection with no reconnect buffer, so
//     nothing about them is replayed after an outage.
//   - Election (election.go): one key of a protocol.KV (<cluster>.leader
//     in the NATS bucket) holds the term, the holder and an expiry;
//     candidates take it when it lapses, with term + 1. Campaign is the
//     shell of a protocol.Candidate, which makes every decision. The
//     election keeps contention rare; the head's compare-and-set is the
//     real fence.
//   - Members (members.go): memberlist with WAN, LAN and local profiles,
//     an encrypted keyring read from a file or the environment (rotated by
//     ReloadKeys), node metadata (region, agent, role, version), join with
//     retry and graceful leave. Its live members are the coordinator's
//     Member list and each node's live-agent count.
//   - Loop (loop.go): one agent's link, on Ports: a shell over
//     protocol's Outbox, TableReader and Follower (agent side), Candidate
//     (election) and Term (coordinator). It sends the node's reports and
//     acks, watches the table head, verifies each table's Ed25519
//     signature against the configured coordinator keys and hands newer
//     tables to the agent, and — on a candidate — campaigns and, while
//     elected, runs one protocol.Term per term: the coordinator's
//     decisions (which keys are budgeted, the term's start from the stored
//     table, which table to store next, when the term is deposed), with
//     rebalance.Coordinator inside it doing the share math. Loop.coordinate
//     is the Term's shell: it reads and verifies the stored head, decodes
//     reports and acks and hands them over, every TickEvery passes the
//     node's policy, the live members and the time, signs the table Tick
//     returns and compare-and-sets it, tells the Term the store's answer
//     (a fence: the head that fenced it, which ends the term only if another
//     coordinator wrote it), and logs and counts the Term's events. The
//     simulator drives the same Term in virtual time.
//
// Every inbound message is decoded and validated by gossip/wire; one that
// fails (bad signature, other cluster, malformed, a replayed head older
// than one already seen) is counted in
// meridian_cluster_invalid_messages_total, and one not newer than the table
// in force in meridian_cluster_tables_total{result="stale"}; neither is
// applied.
//
// # Deployment and failure
//
// In a multi-region deployment the regions' NATS clusters form a
// supercluster joined by gateways; the KV bucket's stream is placed in one
// of them (NATSConfig.PlacementCluster, with Replicas servers there) and the
// other regions reach it over the gateways. Losing that cluster stops
// elections and table changes: agents keep their last table until its
// lease ends, then run every key at min(last share, safe share), and pick
// up new tables without a restart once it returns. The server must be
// NATS 2.9 or later (KV compare-and-set, direct get, watches); no per-key
// TTLs are used.
//
// What an idle cluster asks of JetStream, bounded by cmd/meridian's
// TestClusterIdleJetStreamAPI: at most one API request (nats-server's
// own count, /jsz api.total) per agent per Δ. In practice about one per Δ
// in all: after each store the coordinator lists the stored table chunks
// (STREAM.INFO) and purges superseded ones. An agent's head watch is one
// ordered consumer, created once per connection and kept until the
// connection drops; its reread every 5 s and the election's polls
// (every ElectionConfig.Poll) are direct gets, which the server does not
// count as API requests — at most Δ/Poll + Δ/5 s + 1 per agent per Δ.
//
// # Concurrency
//
// Transport, Members and an Election are safe for concurrent use. A Loop's Control
// methods (Report, InForce, Tables, Applied, Flush, Status) are safe for
// concurrent use and never block; Run owns its goroutines and returns when
// its context ends.
package gossip
