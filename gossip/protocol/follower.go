package protocol

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gossip/wire"
	"github.com/meridian-quota/meridian/rebalance"
	"github.com/meridian-quota/meridian/region"
)

// The agent side of the protocol: reading a stored table from its head
// and chunks, choosing which verified tables reach the agent, classifying
// what is refused, and queueing what the agent sends. Nothing here
// fetches, publishes or reads a clock; the shell (gossip.Loop, or the
// simulator) does the I/O and feeds the results in.

// TableReader reads tables from their head (chunk 0, the value under the
// store's head key) and the chunks stored beside it: it decodes each
// message against the cluster and the trusted coordinator keys and joins
// the chunks with a wire.Assembler. It does no I/O: Head says which chunks
// to fetch and Chunks takes them once fetched (ReadTable does both through
// a ChunkFetcher).
//
// A reader keeps the partial tables of up to two heads whose chunks never
// all arrived (a fetch that failed), the older dropped first; reading the
// same head again then meets its own chunk 0 and is refused as a duplicate
// until that partial is dropped. A fresh reader per read (the coordinator
// reading the stored head as its term starts) keeps nothing between reads.
//
// A reader keeps the last whole table it returned as its base. A delta
// head (wire.EncodeTableFrom) built on that base is patched onto it
// (wire.Patch, which checks the head's digest of the whole table) and
// returned from the head alone, with no chunks to fetch; a delta head on
// any other base — the reader missed a table, or is new — is read from its
// chunks like any other. Resume seeds the base (an agent restarting with
// the table it held).
//
// It also keeps the rows of the last table whose chunks hold every row
// (its head holds none: wire.EncodeTableBase). A head whose rows are its
// base's (wire.EncodeTableOn) is patched onto that, or onto the base
// table if it is the one named; otherwise Head asks for the named base's
// chunks, and Chunks patches the head onto the rows they hold.
//
// A TableReader is not safe for concurrent use.
type TableReader struct {
	cluster string
	limits  wire.Limits
	keys    []ed25519.PublicKey
	asm     *wire.Assembler
	msgs    int64
	bytes   int64
	base    *rebalance.Table
	stored  *rebalance.Table // the rows of the last table whose chunks hold them all
	pending *wire.TableChunk // the in-base head whose base's chunks Head asked for
	rowFree bool             // the head being assembled holds no rows
	patched int64
	missed  int64
	decode  func([]byte) (wire.Message, error)
}

// ChunkRequest names the chunks a head needs before its table is whole:
// chunks 1 … Count-1 of table (Term, Epoch), as TableStore.FetchChunks
// takes them.
type ChunkRequest struct {
	Term, Epoch uint64
	Count       int
	base        bool // the chunks of the base of r.pending
}

// NewTableReader returns a reader of cluster's tables bounded by limits,
// accepting those signed by one of keys (none: every table is refused
// with wire.ErrSignature).
func NewTableReader(cluster string, limits wire.Limits, keys []ed25519.PublicKey) *TableReader {
	r := &TableReader{cluster: cluster, limits: limits, keys: keys, asm: wire.NewAssembler(limits, 2)}
	r.decode = func(b []byte) (wire.Message, error) { return wire.Decode(r.cluster, b, r.limits, r.keys) }
	return r
}

// SetDecoder replaces the reader's wire.Decode(cluster, b, limits, keys)
// with d, which must return what that would: the simulator's, which
// decodes and verifies each distinct message once for all its readers.
func (r *TableReader) SetDecoder(d func(b []byte) (wire.Message, error)) { r.decode = d }

// Head decodes and verifies head, which must be the first chunk of a
// table. It returns the table when head is all of it; otherwise need names
// the chunks to fetch and hand to Chunks. An error (every one wraps
// wire.ErrInvalid; Classify names its class) means head is no table this
// cluster trusts, or contradicts what the reader holds.
func (r *TableReader) Head(head []byte) (t *rebalance.Table, need *ChunkRequest, err error) {
	m, err := r.decode(head)
	if err != nil {
		return nil, nil, err
	}
	if m.Kind != wire.KindTable || m.Table.Index != 0 {
		return nil, nil, fmt.Errorf("%w: the table head is not a table's first chunk", wire.ErrInvalid)
	}
	r.accept(head)
	if d := m.Table.Delta; d != nil && d.InBase {
		return r.inBase(m.Table)
	}
	if m.Table.Delta != nil {
		if t, err := wire.Patch(r.base, m.Table, r.limits); err == nil {
			r.patched++
			r.base, r.stored = t, t // a delta head holds no rows: its chunks hold them all
			return t, nil, nil
		} else if !errors.Is(err, wire.ErrBase) {
			return nil, nil, err
		}
		r.missed++
	}
	t, done, err := r.asm.AddTable(m.Table)
	if err != nil || done {
		r.keep(t)
		return t, nil, err
	}
	r.rowFree = len(m.Table.Keys) == 0
	return nil, &ChunkRequest{Term: m.Table.Term, Epoch: m.Table.Epoch, Count: m.Table.Count}, nil
}

// inBase reads a head whose rows are its base's: patched onto the table
// or the rows the reader holds, else the base's chunks are asked for.
func (r *TableReader) inBase(h *wire.TableChunk) (*rebalance.Table, *ChunkRequest, error) {
	for _, b := range []*rebalance.Table{r.base, r.stored} {
		if b == nil {
			continue
		}
		t, err := wire.Patch(b, h, r.limits)
		if err == nil {
			r.patched++
			r.base = t
			return t, nil, nil
		}
		if !errors.Is(err, wire.ErrBase) {
			return nil, nil, err
		}
	}
	r.missed++
	r.pending = h
	return nil, &ChunkRequest{Term: h.Delta.BaseTerm, Epoch: h.Delta.BaseEpoch, Count: h.Count, base: true}, nil
}

// Header decodes and verifies head, which must be a table's first chunk,
// and returns its header: the table without its rows. That is enough to
// order it against another by (term, epoch) — Term.Fenced needs no more —
// without fetching chunks a replayed or deposing head may no longer have.
// Errors are Head's.
func (r *TableReader) Header(head []byte) (*rebalance.Table, error) {
	m, err := r.decode(head)
	if err != nil {
		return nil, err
	}
	if m.Kind != wire.KindTable || m.Table.Index != 0 {
		return nil, fmt.Errorf("%w: the table head is not a table's first chunk", wire.ErrInvalid)
	}
	r.accept(head)
	h := *m.Table.Header
	h.Keys = nil
	return &h, nil
}

// keep makes t, a whole table just read, the base for the next delta head.
func (r *TableReader) keep(t *rebalance.Table) {
	if t != nil {
		r.base = t
	}
}

// Resume makes t the base the next delta head is patched onto, as if the
// reader had just read it: an agent restarted with the table it held. A
// base that is not the delta's is harmless (the head is read from its
// chunks); t is not modified, and must not be afterwards.
func (r *TableReader) Resume(t *rebalance.Table) { r.base = t }

// Deltas returns how many delta heads the reader patched onto its base,
// and how many it could not (another base) and read from their chunks.
func (r *TableReader) Deltas() (patched, missed int64) { return r.patched, r.missed }

// Chunks adds the chunks fetched for req (chunks 1 … req.Count-1, in any
// order) and returns the whole table. It stops at the first chunk refused:
// one that does not decode or verify, or that belongs to another table
// than req's; and fails when the chunks given leave the table incomplete.
// Every error wraps wire.ErrInvalid.
func (r *TableReader) Chunks(req *ChunkRequest, chunks [][]byte) (*rebalance.Table, error) {
	if req == nil {
		return nil, fmt.Errorf("%w: chunks without a head", wire.ErrInvalid)
	}
	if req.base {
		return r.baseChunks(req, chunks)
	}
	for _, b := range chunks {
		c, err := r.decode(b)
		if err != nil {
			return nil, err
		}
		if c.Kind != wire.KindTable || c.Table.Term != req.Term || c.Table.Epoch != req.Epoch {
			return nil, fmt.Errorf("%w: chunk of another table under term %d epoch %d", wire.ErrInvalid, req.Term, req.Epoch)
		}
		r.accept(b)
		t, done, err := r.asm.AddTable(c.Table)
		if err != nil || done {
			r.keep(t)
			if t != nil && r.rowFree {
				r.stored = t
			}
			return t, err
		}
	}
	return nil, fmt.Errorf("%w: table term %d epoch %d incomplete after %d chunks", wire.ErrInvalid, req.Term, req.Epoch, req.Count)
}

// baseChunks patches the pending in-base head onto the rows of its base's
// chunks, and keeps those rows.
func (r *TableReader) baseChunks(req *ChunkRequest, chunks [][]byte) (*rebalance.Table, error) {
	h := r.pending
	if h == nil || h.Delta.BaseTerm != req.Term || h.Delta.BaseEpoch != req.Epoch || h.Count != req.Count {
		return nil, fmt.Errorf("%w: chunks of base table %d.%d, which no head read last names", wire.ErrInvalid, req.Term, req.Epoch)
	}
	cs := make([]*wire.TableChunk, 0, len(chunks))
	for _, b := range chunks {
		c, err := r.decode(b)
		if err != nil {
			return nil, err
		}
		if c.Kind != wire.KindTable {
			return nil, fmt.Errorf("%w: chunk of base table %d.%d is no table", wire.ErrInvalid, req.Term, req.Epoch)
		}
		r.accept(b)
		cs = append(cs, c.Table)
	}
	base, err := wire.BaseRows(req.Term, req.Epoch, req.Count, h.Header.Regions, cs, r.limits)
	if err != nil {
		return nil, err
	}
	t, err := wire.Patch(base, h, r.limits)
	if err != nil {
		return nil, err
	}
	r.pending, r.stored, r.base = nil, base, t
	return t, nil
}

func (r *TableReader) accept(b []byte) {
	r.msgs++
	r.bytes += int64(len(b))
}

// Accepted returns how many messages (and their bytes) the reader has
// taken in as verified chunks of the table they were read for — counted
// before assembling them, which may still refuse them. The shell's
// inbound table traffic, and the simulator's control cost.
func (r *TableReader) Accepted() (msgs, bytes int64) { return r.msgs, r.bytes }

// ChunkFetcher is what ReadTable needs of the store (TableStore has it).
type ChunkFetcher interface {
	FetchChunks(ctx context.Context, term, epoch uint64, count int) ([][]byte, error)
}

// ReadTable reads one table from head with r, fetching its other chunks
// from store when it has any. A failed fetch is returned wrapped but not as
// wire.ErrInvalid (Classify: "unavailable"); every other error is r's.
func ReadTable(ctx context.Context, store ChunkFetcher, r *TableReader, head []byte) (*rebalance.Table, error) {
	t, need, err := r.Head(head)
	if err != nil || need == nil {
		return t, err
	}
	rest, err := store.FetchChunks(ctx, need.Term, need.Epoch, need.Count)
	if err != nil {
		return nil, fmt.Errorf("fetch table term %d epoch %d: %w", need.Term, need.Epoch, err)
	}
	return r.Chunks(need, rest)
}

// Refusal classes: the reason label of a refused inbound message.
const (
	RefusedSignature   = "signature"   // a table no trusted key signed
	RefusedCluster     = "cluster"     // a message of another cluster
	RefusedSender      = "sender"      // a report or ack claiming another agent than the one that sent it
	RefusedReplayed    = "replayed"    // a genuine table head older than one already seen, written again
	RefusedTooMany     = "too_many"    // a report or ack from a non-member in a region at MaxAgentsPerRegion
	RefusedMalformed   = "malformed"   // anything else the codec or the protocol refuses
	RefusedUnavailable = "unavailable" // not the message's fault: the store or the bus failed
)

// Classify maps why an inbound message was refused to its class: the
// wire's signature and cluster errors, any other wire.ErrInvalid as
// malformed, and an error that is no verdict on the message (a failed
// fetch) as unavailable. Classify(nil) is "".
// ErrSender is a report or acknowledgement whose claimed region and agent
// differ from the sender its transport names (Bus): an agent speaking for
// another, which per-agent NATS credentials otherwise prevent.
var ErrSender = errors.New("protocol: message claims another sender")

// ErrReplayed is a verified table head older, by (term, epoch), than one
// already seen: no coordinator writes one (a deposed coordinator's write is
// fenced), so something with write access to the bucket wrote an old head
// again. It is refused like a forgery and counted as one.
var ErrReplayed = errors.New("protocol: replayed table head")

func Classify(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, wire.ErrSignature):
		return RefusedSignature
	case errors.Is(err, wire.ErrCluster):
		return RefusedCluster
	case errors.Is(err, ErrSender):
		return RefusedSender
	case errors.Is(err, ErrReplayed):
		return RefusedReplayed
	case errors.Is(err, rebalance.ErrTooManyAgents):
		return RefusedTooMany
	case !errors.Is(err, wire.ErrInvalid):
		return RefusedUnavailable
	}
	return RefusedMalformed
}

// Table outcomes: the result label of a table the agent was offered or
// applied.
const (
	TableApplied = "applied" // the node applied it
	TableStale   = "stale"   // the last one delivered again, or not newer than the one in force
	TableOlder   = "older"   // older than the last one delivered: a replay (ErrReplayed)
	TableRefused = "refused" // the node refused it (region.ErrBadTable and the like)
)

// Follower decides which verified tables reach the agent: each strictly
// newer by (term, epoch) than the last one delivered (rebalance.Table.Newer),
// so the agent sees a strictly increasing sequence whatever order, repeats
// or replays the store and the watch produce — a table of a newer term wins
// whatever its epoch. The zero value has delivered nothing and takes any
// table but (0, 0).
//
// A Follower is not safe for concurrent use.
type Follower struct {
	term, epoch uint64
}

// Offer reports whether t goes to the agent (deliver), and records it as
// the last delivered if so; otherwise reason is TableStale for the last
// one again (a watch re-created delivers the head it had) and TableOlder
// for an older one (a replayed head: the shell counts it as invalid).
func (f *Follower) Offer(t *rebalance.Table) (deliver bool, reason string) {
	switch {
	case t == nil || (t.Term == f.term && t.Epoch == f.epoch):
		return false, TableStale
	case !t.Newer(f.term, f.epoch):
		return false, TableOlder
	}
	f.term, f.epoch = t.Term, t.Epoch
	return true, ""
}

// Last returns the (term, epoch) of the last table delivered (0, 0 for
// none).
func (f *Follower) Last() (term, epoch uint64) { return f.term, f.epoch }

// Outcome classifies what the node made of a delivered table (the error
// region.Node.Apply returned): nil is TableApplied, region.ErrStaleTable
// TableStale, any other error TableRefused.
func Outcome(err error) string {
	switch {
	case err == nil:
		return TableApplied
	case errors.Is(err, region.ErrStaleTable):
		return TableStale
	}
	return TableRefused
}

// Out is one message the agent sends the coordinator: a demand report, or
// (Report nil) an acknowledgement that table (Term, Epoch) is in force.
type Out struct {
	Report      *rebalance.Report
	Term, Epoch uint64
	// Fence and Store: the region fence the agent's store held and the
	// store's identity, carried by an acknowledgement (wire.Ack).
	Fence gcra.Fence
	Store uint64
}

// Out kinds, as metrics label them.
const (
	KindReport = "report"
	KindAck    = "ack"
)

// Kind is KindReport or KindAck.
func (o Out) Kind() string {
	if o.Report != nil {
		return KindReport
	}
	return KindAck
}

// Encode encodes o as sent by region/agent of cluster, stamped sent (µs on
// the region store's clock, 0 for unknown): a report in chunks of at most
// maxMessage bytes, carrying the features this package's TableReader
// reads (wire.Features), an acknowledgement as one message.
func (o Out) Encode(cluster, regionName, agent string, sent int64, maxMessage int) ([][]byte, error) {
	if o.Report != nil {
		rep := *o.Report
		rep.Features |= wire.Features
		return wire.EncodeReport(cluster, &rep, sent, maxMessage)
	}
	b, err := wire.EncodeAck(cluster, wire.Ack{Region: regionName, Agent: agent, Term: o.Term, Epoch: o.Epoch, Sent: sent, Fence: o.Fence, Store: o.Store})
	if err != nil {
		return nil, err
	}
	return [][]byte{b}, nil
}

// Outbox is the agent's bounded queue of what it sends, oldest first: the
// node's reports as it closes intervals, and acknowledgements of the table
// in force as it changes. When full, what is offered is dropped (the
// caller counts it) and not retried: an old report is stale anyway, and
// the coordinator still learns the table in force from the agent's next
// report, which names it. The zero value holds nothing
// and drops everything; use NewOutbox.
//
// An Outbox is not safe for concurrent use.
type Outbox struct {
	ring    []Out // capacity slots, allocated on first push
	max     int
	head, n int
}

// NewOutbox returns an empty outbox holding up to capacity messages (at
// least 1).
func NewOutbox(capacity int) *Outbox { return &Outbox{max: max(capacity, 1)} }

// Report queues rep; false when the outbox is full and rep was dropped.
func (b *Outbox) Report(rep *rebalance.Report) bool { return b.push(Out{Report: rep}) }

// Ack queues an acknowledgement of (term, epoch) in force; false when the
// outbox is full and it was dropped. (0, 0) — no table in force — is never
// acknowledged: Ack ignores it and returns true.
func (b *Outbox) Ack(term, epoch uint64) bool { return b.AckFenced(term, epoch, gcra.Fence{}, 0) }

// AckFenced is Ack carrying the region fence the agent's store held and
// the store's identity (see wire.Ack).
func (b *Outbox) AckFenced(term, epoch uint64, fence gcra.Fence, store uint64) bool {
	if term == 0 && epoch == 0 {
		return true
	}
	return b.push(Out{Term: term, Epoch: epoch, Fence: fence, Store: store})
}

func (b *Outbox) push(o Out) bool {
	if b.n >= b.max {
		return false
	}
	if b.ring == nil {
		b.ring = make([]Out, b.max)
	}
	b.ring[(b.head+b.n)%b.max] = o
	b.n++
	return true
}

// Next removes and returns the oldest queued message; ok false when empty.
func (b *Outbox) Next() (o Out, ok bool) {
	if b.n == 0 {
		return Out{}, false
	}
	o = b.ring[b.head]
	b.ring[b.head] = Out{} // the report is the shell's once sent
	b.head = (b.head + 1) % b.max
	b.n--
	return o, true
}

// Len returns how many messages are queued.
func (b *Outbox) Len() int { return b.n }
