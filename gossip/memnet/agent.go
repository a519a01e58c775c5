package memnet

import (
	"slices"
	"time"

	"github.com/meridian-quota/meridian/gossip/protocol"
	"github.com/meridian-quota/meridian/rebalance"
)

// Agent is one agent's endpoint on a [Network]: the bus, the table store,
// the election's KV and membership as this agent sees them. Get it from
// [Network.Agent]; its methods are safe for concurrent use.
type Agent struct {
	n    *Network
	addr Addr

	// Guarded by n.mu.
	disconnected bool
	dead         bool
	view         map[Addr]*peer
	count        Counters
	changed      chan struct{}
}

// The endpoint provides every port.
var (
	_ protocol.Bus        = (*Agent)(nil)
	_ protocol.TableStore = (*Agent)(nil)
	_ protocol.KV         = (*Agent)(nil)
	_ protocol.Membership = (*Agent)(nil)
)

// Addr is the agent's address.
func (a *Agent) Addr() Addr { return a.addr }

// peer is one member in an agent's view: live is what Live reports, want
// what it will report once the pending change (gen) lands.
type peer struct {
	live, want bool
	gen        uint64
}

// Live lists the agents this one sees alive (itself included), sorted by
// region then agent.
func (a *Agent) Live() []rebalance.Member {
	a.n.mu.Lock()
	defer a.n.mu.Unlock()
	var out []rebalance.Member
	for addr, p := range a.view {
		if p.live {
			out = append(out, rebalance.Member{Region: addr.Region, Agent: addr.Agent})
		}
	}
	slices.SortFunc(out, func(x, y rebalance.Member) int {
		return compareAddr(Addr{x.Region, x.Agent}, Addr{y.Region, y.Agent})
	})
	return out
}

// LiveInRegion counts the agents of region this one sees alive.
func (a *Agent) LiveInRegion(region string) int {
	a.n.mu.Lock()
	defer a.n.mu.Unlock()
	k := 0
	for addr, p := range a.view {
		if p.live && addr.Region == region {
			k++
		}
	}
	return k
}

// Changed is signalled (never closed) after this agent's view changes.
func (a *Agent) Changed() <-chan struct{} { return a.changed }

func (a *Agent) signal() {
	select {
	case a.changed <- struct{}{}:
	default:
	}
}

// reachableLocked reports whether o and x can gossip, and whether they
// could but for a suspicion of x.
func (n *Network) reachableLocked(o, x *Agent) (ok, suspectedOnly bool) {
	if o.dead || x.dead || n.cutLocked(o.addr, x.addr) || n.cutLocked(x.addr, o.addr) {
		return false, false
	}
	if n.suspected[x.addr] > n.clock.Now() {
		return false, true
	}
	return true, false
}

// refreshMembersLocked schedules the view changes the current faults
// imply: a loss DetectDelay later (at once for a suspicion), a return
// JoinDelay later; a change undone before it lands never lands.
func (n *Network) refreshMembersLocked() {
	for _, o := range n.order {
		for _, x := range n.order {
			if o == x {
				continue
			}
			want, suspicion := n.reachableLocked(o, x)
			p := o.view[x.addr]
			if p.want == want {
				continue
			}
			p.want = want
			p.gen++
			delay := n.cfg.JoinDelay
			if !want {
				delay = n.cfg.DetectDelay
				if suspicion {
					delay = 0
				}
			}
			if delay == 0 {
				if p.live != want {
					p.live = want
					o.signal()
				}
				continue
			}
			g, o := p.gen, o
			n.afterLocked(delay, func() {
				n.mu.Lock()
				defer n.mu.Unlock()
				if p.gen == g && p.live != want {
					p.live = want
					o.signal()
				}
			})
		}
	}
}

// SetKVLatency sets the latency of agent a's KV operations (Agent empty:
// every agent of the region) — each call, and each watch push to it.
func (n *Network) SetKVLatency(a Addr, d time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.kvLatency[a] = max(d, 0)
}

func (n *Network) kvLatencyLocked(a Addr) time.Duration {
	if d, ok := n.kvLatency[a]; ok {
		return d
	}
	if d, ok := n.kvLatency[a.region()]; ok {
		return d
	}
	return n.cfg.KVLatency
}
