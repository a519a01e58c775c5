package protocol

import (
	"crypto/ed25519"

	"github.com/meridian-quota/meridian/gossip/wire"
	"github.com/meridian-quota/meridian/rebalance"
)

// TableEncoder encodes the tables one term stores, choosing how each goes
// on the bus: while every agent the table names reads in-base heads
// (wire.FeatureInBase), as one head on the last base it stored
// (wire.EncodeTableOn) — the changes since that base and nothing else, no
// chunks put — and otherwise, or once that head would cost more than a
// new base, as a new base (wire.EncodeTableBase: every row in its chunks,
// and a head that is a delta on the table stored before, which an agent
// holding that table patches). The cost is the bytes the bus carries with
// one reader per region, each holding the table stored before: an in-base
// head is put once and read once per region; a base's messages are put
// once, its head read once per region, and its chunks too unless its head
// is a delta on that table. The shell (gossip.Loop, the simulator)
// stores what Encode returns, then says Stored or Failed.
//
// An in-base head carries every change since its base, so heads grow as
// changes pile up: stopping only once one head costs more than a base let
// a cluster whose rows keep moving pay up to twice what it needs. So the
// encoder also rents: once the heads stored on a base have cost the bus as
// much as a new base would, the next table is a base (ski rental: within
// twice the bytes of the best choice made knowing the future).
//
// The base's chunks stay in the store while the heads built on it are
// written: the store purges only tables older than the last one before
// the newest it wrote chunks for (gossip.Transport.StoreTable), and in-base
// heads write none.
//
// A TableEncoder is not safe for concurrent use.
type TableEncoder struct {
	cluster    string
	key        ed25519.PrivateKey
	maxMessage int

	prev  *rebalance.Table // the last table stored: agents holding it patch the next head
	base  *rebalance.Table // the last base stored (its chunks hold every row), nil for none
	count int              // its messages

	rent int // bus bytes of the in-base heads stored on base

	next      *rebalance.Table // Encode's table
	nextCount int              // its messages if it went as a base, else 0
	nextCost  int              // its bus bytes if it went as an in-base head
	bases     uint64
	heads     uint64
}

// NewTableEncoder returns the encoder of a term that starts with latest
// (nil: none) in the store. The term's first table is a base: the encoder
// knows no base whose chunks it saw stored.
func NewTableEncoder(cluster string, key ed25519.PrivateKey, maxMessage int, latest *rebalance.Table) *TableEncoder {
	return &TableEncoder{cluster: cluster, key: key, maxMessage: maxMessage, prev: latest}
}

// Encode returns the messages that store t; reads is the feature bits
// every agent t names has reported (Term.ReadBy): in-base heads
// (wire.FeatureInBase) and row patches in the deltas
// (wire.FeatureRowPatches) only where all of them read them.
func (e *TableEncoder) Encode(t *rebalance.Table, reads uint32) ([][]byte, error) {
	var head []byte
	if reads&wire.FeatureInBase != 0 && e.base != nil {
		h, ok, err := wire.EncodeTableOn(e.cluster, t, e.base, e.count, e.key, e.maxMessage, reads)
		if err != nil {
			return nil, err
		}
		if ok {
			head = h
		}
	}
	chunks, err := wire.EncodeTableBase(e.cluster, t, e.prev, e.key, e.maxMessage, reads)
	if err != nil {
		return nil, err
	}
	e.next, e.nextCount, e.nextCost = t, 0, 0
	if cost := BusBytes([][]byte{head}, len(t.Regions), true); head != nil && e.rent+cost < BusBytes(chunks, len(t.Regions), false) {
		e.nextCost = cost
		return [][]byte{head}, nil
	}
	if len(chunks) > 1 {
		e.nextCount = len(chunks)
	}
	return chunks, nil
}

// BusBytes is what storing a table's messages costs the bus as
// TableEncoder weighs it, with readers regions each holding the table
// stored before: an in-base head (inBase, one message) is put once and
// read once per region; a base's messages are put once and its head read
// once per region, and its chunks too unless its head is a delta.
func BusBytes(chunks [][]byte, readers int, inBase bool) int {
	if inBase {
		return (readers + 1) * len(chunks[0])
	}
	rest := 0
	for _, c := range chunks[1:] {
		rest += len(c)
	}
	n := len(chunks[0])*(readers+1) + rest
	if !wire.IsDeltaHead(chunks[0]) {
		n += readers * rest
	}
	return n
}

// Stored records that t, just encoded, is stored: agents are expected to
// hold it next, and if it went as a base the heads that follow are built
// on it.
func (e *TableEncoder) Stored(t *rebalance.Table) {
	if t == nil || t != e.next {
		return
	}
	e.prev = t
	switch {
	case e.nextCount > 0:
		e.base, e.count, e.rent = t, e.nextCount, 0
		e.bases++
	case e.base != nil:
		e.heads++
		e.rent += e.nextCost
	}
	e.next = nil
}

// Failed records that storing the last table encoded failed, or was
// fenced: the store's state is unknown (the bucket may even be new), so the
// next table is a new base.
func (e *TableEncoder) Failed() { e.base, e.count, e.next, e.rent = nil, 0, nil, 0 }

// Counts returns how many bases and in-base heads the term has stored.
func (e *TableEncoder) Counts() (bases, heads uint64) { return e.bases, e.heads }
