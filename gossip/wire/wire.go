package wire

import (
	"errors"
	"fmt"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/rebalance"
)

// Version is the major version of the format this package writes and
// reads. A message of any other version is refused.
const Version = 1

// DefaultMaxMessage is the default bound on one encoded message (a chunk),
// in bytes: NATS's default max_payload is 1 MiB; half of it leaves room for
// headers and for servers configured below the default.
const DefaultMaxMessage = 512 << 10

// MinMessage is the smallest maxMessage the encoders accept, in bytes: a
// chunk must hold its header and at least one key of ordinary size.
const MinMessage = 1024

// SignatureSize is the bytes of an Ed25519 signature.
const SignatureSize = 64

// Kind is what an envelope carries.
type Kind uint8

// The kinds of message, numbered as in wire.proto.
const (
	KindReport Kind = 1 // a chunk of one agent's demand report
	KindAck    Kind = 2 // an agent's acknowledgement of the table in force
	KindTable  Kind = 3 // a chunk of a signed share table
)

// String returns "report", "ack", "table" or "kind N".
func (k Kind) String() string {
	switch k {
	case KindReport:
		return "report"
	case KindAck:
		return "ack"
	case KindTable:
		return "table"
	default:
		return fmt.Sprintf("kind %d", uint8(k))
	}
}

// Limits bounds what Decode and the Assembler accept, so that a message
// from the network can never make a receiver allocate more than a small
// multiple of its own size, nor assemble more than MaxKeys keys. A zero
// field is invalid; start from DefaultLimits.
type Limits struct {
	MaxMessage int // bytes of one encoded message (a chunk)
	MaxKeys    int // keys in one assembled report or table
	MaxKeyLen  int // bytes of a key name; at most gcra.MaxKeyLen
	MaxRegions int // regions of a table (entries of a row)
	MaxAgents  int // agents named per region in a table
	MaxChunks  int // chunks of one report or table
	MaxName    int // bytes of a region, agent, cluster name or policy version
	// AllowOvercommit accepts table rows whose shares sum above 10⁶ ppm:
	// the full strategy, which the coordinator runs only with
	// allow_overcommit: true. Every share stays at most 10⁶.
	AllowOvercommit bool
}

// DefaultLimits returns the limits a production receiver uses.
func DefaultLimits() Limits {
	return Limits{
		// What the encoders split at by default: half of NATS's 1 MiB.
		MaxMessage: DefaultMaxMessage,
		// Ten times the 100,000 keys a large deployment tracks.
		MaxKeys: 1 << 20,
		// The longest key a store accepts: a table naming a longer one
		// could never be applied.
		MaxKeyLen: gcra.MaxKeyLen,
		// Regions are failure domains (a handful); a row holds one share
		// and one burst per region.
		MaxRegions: 64,
		// Agents sit beside gateways; a thousand per region is a very large
		// fleet.
		MaxAgents: 1024,
		// A table of 1,048,576 keys of 64-byte names across 8 regions
		// (about 120 bytes a row) takes about 250 chunks of 512 KiB; four
		// times that leaves room for longer names.
		MaxChunks: 1024,
		// Names are short identifiers and a policy version is a content
		// hash (64 hex digits).
		MaxName: 256,
		// Σ shares ≤ 10⁶ is the first safety invariant; a deployment that
		// chose the full strategy says so here too.
		AllowOvercommit: false,
	}
}

// Validate reports every problem with l at once.
func (l Limits) Validate() error {
	var errs []error
	check := func(name string, v, lo, hi int) {
		if v < lo || v > hi {
			errs = append(errs, fmt.Errorf("wire: Limits.%s %d: must be in [%d, %d]", name, v, lo, hi))
		}
	}
	check("MaxMessage", l.MaxMessage, MinMessage, 1<<30)
	check("MaxKeys", l.MaxKeys, 1, 1<<30)
	check("MaxKeyLen", l.MaxKeyLen, 1, gcra.MaxKeyLen)
	check("MaxRegions", l.MaxRegions, 1, 1<<16)
	check("MaxAgents", l.MaxAgents, 1, 1<<20)
	check("MaxChunks", l.MaxChunks, 1, 1<<20)
	check("MaxName", l.MaxName, 1, 1<<16)
	return errors.Join(errs...)
}

// ErrInvalid is wrapped by every error Decode and the Assembler return for
// a message: the error says what was wrong and where, e.g.
// "wire: invalid message: table chunk 3 key 17: shares has 2 entries for 3 regions".
var ErrInvalid = errors.New("wire: invalid message")

// ErrSignature is wrapped by the error for a table no trusted key signed.
// errors.Is(err, ErrInvalid) holds for it too.
var ErrSignature error = &kindError{"wire: bad signature"}

// ErrCluster is wrapped by the error for a message of another cluster.
// errors.Is(err, ErrInvalid) holds for it too.
var ErrCluster error = &kindError{"wire: other cluster"}

// kindError is a sentinel that is also an ErrInvalid.
type kindError struct{ msg string }

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return ErrInvalid }

// ReportChunk is part of one agent's demand report: Report.Keys holds this
// chunk's keys only, every other field of Report is the same in every
// chunk. Sent is the agent's store clock (µs) when the report was sent, for
// the coordinator's clock-skew estimates. Index counts from 0 to Count-1.
type ReportChunk struct {
	Report       rebalance.Report
	Sent         int64
	Index, Count int
}

// Ack is an agent's acknowledgement that the table (Term, Epoch) is in
// force there. Sent is the agent's store clock (µs) when sent. Fence is the
// region fence its store held, read back after the agent last raised it
// (gcra.Fencer), and Store that store's identity; both zero when the agent
// keeps no fence (a Redis Cluster, a release before fencing). A fence
// without a store identity is refused.
type Ack struct {
	Region, Agent string
	Term, Epoch   uint64
	Sent          int64
	Fence         gcra.Fence
	Store         uint64
}

// TableChunk is part of one signed share table. Chunk 0 carries Header,
// the table with every field but Keys (Term and Epoch included); the other
// chunks carry a nil Header. Keys are this chunk's rows, in table order.
// Chunk 0 of a delta table carries a Delta on an earlier table and no
// rows (Patch applies it); its other chunks hold every row as usual.
type TableChunk struct {
	Term, Epoch  uint64
	Index, Count int
	Header       *rebalance.Table
	Delta        *Delta
	Keys         []rebalance.KeyShares
}

// Message is one decoded message: Kind says which of Report, Ack and Table
// is set.
type Message struct {
	Kind   Kind
	Report *ReportChunk
	Ack    *Ack
	Table  *TableChunk
}

// Feature bits: what an agent's reader handles beyond the format every
// reader of this major version reads, carried by its reports
// (rebalance.Report.Features, Report field 11). A coordinator uses a
// feature only once every agent its table names has reported it; a
// reader of an earlier minor version reports none.
const (
	// FeatureInBase: the reader reads delta heads whose rows are their
	// base's (Delta.InBase, EncodeTableOn): it patches the base's rows,
	// held or fetched (BaseRows).
	FeatureInBase uint32 = 1 << 0

	// FeatureRowPatches: the reader reads a delta's row patches
	// (Delta.Patched): a changed row named by its place in the base, with
	// only its new version, shares and bursts — about a third of the
	// bytes of the whole row it replaces.
	FeatureRowPatches uint32 = 1 << 1

	// Features is every feature this package's readers handle
	// (protocol.TableReader): what an agent built on it reports.
	Features = FeatureInBase | FeatureRowPatches
)

// Coordinator feature bits: what the coordinator that issued a table reads
// beyond the format every coordinator of this major version reads, carried
// by the table's header (rebalance.Table.Features, TableHeader field 7).
// An agent uses one only while the table it last applied advertises it; a
// coordinator of an earlier minor version advertises none.
const (
	// CoordDeltaReports: the coordinator reads delta reports
	// (rebalance.Report.Delta): it keeps each agent's last demand for the
	// keys a delta report does not list.
	CoordDeltaReports = rebalance.FeatureDeltaReports

	// CoordCostDemand: the coordinator reads only a listed key's offered
	// cost (KeyDemand field 3): an agent leaves fields 2, 4 and 5 out.
	CoordCostDemand = rebalance.FeatureCostDemand

	// CoordFeatures is every feature this package's coordinator side
	// reads (protocol.Term): what a coordinator built on it advertises.
	CoordFeatures = CoordDeltaReports | CoordCostDemand
)
