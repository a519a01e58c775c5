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
// # Election
//
// One coordinator per cluster is elected through one key of the KV port,
// <cluster>.leader, holding a LeaderRecord (term, holder, since, expiry;
// JSON, version 1). Candidate is one candidate's side of it as a state
// machine: the shell (gossip.Transport.Campaign on JetStream KV, the
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
package protocol
