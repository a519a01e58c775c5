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
package protocol
