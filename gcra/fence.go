package gcra

import "context"

// Fence is the (term, epoch) of the share table a decision is made under,
// as a region's store fences it (package rebalance, invariant 1): a store
// that keeps a region fence refuses, with ErrFenced, a decision whose
// Schedule.Fence is below the fence it holds — an agent still running an
// older table than one another agent of the region has put in force — or
// any fenced decision when it holds no fence (it restarted, failed over or
// evicted it), and writes nothing then. The zero Fence is unfenced: the
// decision is not made under a table's share (a safe or reduced share, a
// regional limit, a standalone agent), and no store refuses it.
type Fence struct {
	Term, Epoch uint64
}

// IsZero reports whether f is the zero (unfenced) Fence.
func (f Fence) IsZero() bool { return f == Fence{} }

// Less reports whether f is below g, by term and then epoch.
func (f Fence) Less(g Fence) bool {
	return f.Term < g.Term || (f.Term == g.Term && f.Epoch < g.Epoch)
}

// fencedError is ErrFenced: not a store failure (StoreHealthy), so a
// circuit breaker does not count it.
type fencedError struct{}

func (fencedError) Error() string {
	return "gcra: fenced: the region's store holds a newer table's fence (or none) than the decision was made under"
}

// StoreHealthy reports that a fence refusal is not the store failing.
func (fencedError) StoreHealthy() bool { return true }

// ErrFenced is a store's refusal of a decision made under a table older
// than the region's fence (or of any fenced decision while it holds no
// fence). Nothing is written. It is not a store failure: the caller decides
// again at most the key's safe share, unfenced.
var ErrFenced error = fencedError{}

// Fencer is a Store that keeps a region fence.
type Fencer interface {
	// RaiseFence raises the store's fence to f — never lowers it — and
	// returns the fence the store holds afterwards, read back, and the
	// store's identity: nonzero, different for another store, and changed
	// by a restart or failover that may have lost the fence. Where the
	// store has replicas the write is confirmed on them before it returns.
	// id 0 means the store cannot fence (held is then zero, and fenced
	// decisions are not refused).
	RaiseFence(ctx context.Context, f Fence) (held Fence, id uint64, err error)
}
