package protocol

import (
	"context"
	"errors"

	"github.com/meridian-quota/meridian/rebalance"
)

// The ports: what the cluster protocol needs from the network, as the
// shell's adapters (gossip.Transport on NATS and JetStream KV,
// gossip.Members on memberlist) and the in-memory transports (gossip/memnet,
// for the simulator and tests) both provide it. The method sets are those
// gossip.Loop calls; an adapter adds only I/O, retries and decoding.

// Bus carries demand reports and acknowledgements: fire and forget, at
// most once, in no promised order.
type Bus interface {
	// PublishReport sends one report's chunks from region/agent.
	PublishReport(region, agent string, msgs [][]byte) error
	// PublishAck sends one acknowledgement from region/agent.
	PublishAck(region, agent string, msg []byte) error
	// SubscribeReports and SubscribeAcks call fn with every message of
	// their kind any agent of the cluster sends, until stop, with the
	// agent the transport says sent it (NATS: the subject it was
	// published on, which per-agent credentials restrict to that agent).
	// The coordinator refuses a message that claims another sender.
	SubscribeReports(fn func(from Sender, msg []byte)) (stop func(), err error)
	SubscribeAcks(fn func(from Sender, msg []byte)) (stop func(), err error)
	// Flush returns once what was published before it has left (or ctx
	// ends).
	Flush(ctx context.Context) error
	// Connected says whether the bus can send now.
	Connected() bool
}

// Sender is the agent a message came from, as its transport tells it.
type Sender struct{ Region, Agent string }

// TableStore holds the latest table: chunk 0 (the head) under one key
// written by compare-and-set, the other chunks beside it.
type TableStore interface {
	// StoreTable writes chunks 1… and then compare-and-sets the head on
	// revision prev (0: no head yet), returning the head's new revision;
	// ErrFenced when the head moved since prev. Any other error leaves
	// the outcome unknown: read LatestTable before trying again.
	StoreTable(ctx context.Context, prev uint64, term, epoch uint64, chunks [][]byte) (rev uint64, err error)
	// LatestTable returns the head and its revision; ok false when no
	// table was ever stored.
	LatestTable(ctx context.Context) (head []byte, rev uint64, ok bool, err error)
	// FetchChunks returns chunks 1 … count-1 of table (term, epoch).
	FetchChunks(ctx context.Context, term, epoch uint64, count int) ([][]byte, error)
	// WatchTables calls fn with the current head, if any, and then with
	// every newer one (strictly increasing revisions) until ctx ends.
	WatchTables(ctx context.Context, fn func(head []byte, rev uint64)) error
}

// ErrFenced is StoreTable's answer when the head moved since the revision
// the writer last wrote: another coordinator has written.
var ErrFenced = errors.New("gossip: table head moved: another coordinator wrote")

// KV is the election's key-value bucket: one key, read and written by
// revision.
type KV interface {
	// Get returns the value and revision of key; ErrNotFound when absent.
	Get(ctx context.Context, key string) (value []byte, rev uint64, err error)
	// Create writes key only when absent; ErrConflict otherwise.
	Create(ctx context.Context, key string, value []byte) (rev uint64, err error)
	// Update writes key only at revision rev; ErrConflict otherwise.
	Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error)
}

// KV errors.
var (
	ErrNotFound = errors.New("gossip: key not found")
	ErrConflict = errors.New("gossip: revision conflict")
)

// Membership is the live agents of the cluster as failure detection sees
// them.
type Membership interface {
	// Live lists the live agents, sorted by region then agent.
	Live() []rebalance.Member
	// LiveInRegion counts the live agents of region (this one included).
	LiveInRegion(region string) int
	// Changed is signalled (never closed) after the live set changes.
	Changed() <-chan struct{}
}
