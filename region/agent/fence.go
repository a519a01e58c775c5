package agent

import (
	"context"
	"sync"
	"time"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/rebalance"
)

// FenceSink is a Control that carries the region fence in its
// acknowledgements (gossip.Loop is one): SetFence gives it the fence the
// store held after the agent raised it, read back, and the store's
// identity, for every acknowledgement after.
type FenceSink interface {
	SetFence(held gcra.Fence, store uint64)
}

// SetFencer makes the agent raise the region fence on f — the store its
// node decides on, unwrapped (a fence write is not a decision) — to every
// table it applies that names it, and hand what f read back to its Control
// (when it is a FenceSink) before the next acknowledgement. Set it exactly
// when the node runs with region.Config.Fence: a node that fences with no
// one raising the fence runs every key at its safe share, so Run refuses
// that (and a fencer for a node that does not fence). Call it before Run.
func (a *Agent) SetFencer(f gcra.Fencer) { a.fencer = f }

// fenceTimeout bounds one fence raise.
const fenceTimeout = 2 * time.Second

// fenceRaiser raises the fence in the background, the newest table first:
// the agent's loop must not block on the store.
type fenceRaiser struct {
	want chan gcra.Fence // the newest fence to raise (capacity 1)
	done chan struct{}   // a raise succeeded (capacity 1)
	wg   sync.WaitGroup
	mu   sync.Mutex
	held gcra.Fence // what the last successful raise read back
}

// covers reports whether the fence read back last covers table (term,
// epoch): an acknowledgement of it then proves it for the region.
func (fr *fenceRaiser) covers(term, epoch uint64) bool {
	if fr == nil {
		return false
	}
	fr.mu.Lock()
	defer fr.mu.Unlock()
	return !fr.held.Less(gcra.Fence{Term: term, Epoch: epoch})
}

// startFences starts the raiser when the agent has a fencer and a
// Control; nil otherwise. It stops when ctx ends.
func (a *Agent) startFences(ctx context.Context) *fenceRaiser {
	if a.fencer == nil || a.ctrl == nil {
		return nil
	}
	// Without a sink the fence still goes up — the node's decisions need
	// it — but acknowledgements carry none and prove nothing.
	sink, _ := a.ctrl.(FenceSink)
	fr := &fenceRaiser{want: make(chan gcra.Fence, 1), done: make(chan struct{}, 1)}
	fr.wg.Go(func() {
		var lastErr time.Time
		for {
			var f gcra.Fence
			select {
			case <-ctx.Done():
				return
			case f = <-fr.want:
			}
			rctx, cancel := context.WithTimeout(ctx, fenceTimeout)
			held, id, err := a.fencer.RaiseFence(rctx, f)
			cancel()
			if err != nil {
				a.fenceErrors.Add(1)
				if time.Since(lastErr) >= 10*time.Second {
					lastErr = time.Now()
					a.log.Warn("region fence not raised: the coordinator waits for this region's leases instead", "term", f.Term, "epoch", f.Epoch, "err", err)
				}
				continue
			}
			fr.mu.Lock()
			fr.held = held
			fr.mu.Unlock()
			if sink != nil {
				sink.SetFence(held, id)
			}
			select {
			case fr.done <- struct{}{}:
			default:
			}
		}
	})
	return fr
}

// raise asks for the fence of table t, dropping an older request not yet
// taken.
func (fr *fenceRaiser) raise(t *rebalance.Table) {
	if fr == nil {
		return
	}
	f := gcra.Fence{Term: t.Term, Epoch: t.Epoch}
	for {
		select {
		case fr.want <- f:
			return
		default:
		}
		select {
		case <-fr.want:
		default:
		}
	}
}

// doneC is the channel a successful raise signals on (nil without one).
func (fr *fenceRaiser) doneC() <-chan struct{} {
	if fr == nil {
		return nil
	}
	return fr.done
}
