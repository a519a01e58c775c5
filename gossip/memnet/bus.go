package memnet

import (
	"context"
	"fmt"
	"regexp"
	"sync"

	"github.com/meridian-quota/meridian/gossip/protocol"
)

// The two kinds of bus messages.
const (
	kindReport = "report"
	kindAck    = "ack"
)

var nameRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// checkNames applies gossip.Transport's rule for names in subjects.
func checkNames(region, agent string) error {
	if !nameRe.MatchString(region) {
		return fmt.Errorf("memnet: region %q: want 1 to 64 letters, digits, '-' or '_'", region)
	}
	if !nameRe.MatchString(agent) {
		return fmt.Errorf("memnet: agent %q: want 1 to 64 letters, digits, '-' or '_'", agent)
	}
	return nil
}

type subscription struct {
	a    *Agent
	kind string

	mu      sync.Mutex // held while fn runs; stop waits for it
	fn      func(protocol.Sender, []byte)
	stopped bool
}

// PublishReport sends each chunk of a report as one message to every
// subscription of the cluster, each over its link from this agent. region
// and agent name the report (they are checked as gossip.Transport checks
// subject tokens); the link is always this endpoint's. It fails with
// ErrDisconnected while the agent is disconnected or dead.
func (a *Agent) PublishReport(region, agent string, msgs [][]byte) error {
	if err := checkNames(region, agent); err != nil {
		return err
	}
	for i, m := range msgs {
		if err := a.publish(kindReport, protocol.Sender{Region: region, Agent: agent}, m); err != nil {
			return fmt.Errorf("memnet: publish report chunk %d of %d: %w", i+1, len(msgs), err)
		}
	}
	return nil
}

// PublishAck sends one acknowledgement, as PublishReport.
func (a *Agent) PublishAck(region, agent string, msg []byte) error {
	if err := checkNames(region, agent); err != nil {
		return err
	}
	if err := a.publish(kindAck, protocol.Sender{Region: region, Agent: agent}, msg); err != nil {
		return fmt.Errorf("memnet: publish ack: %w", err)
	}
	return nil
}

// SubscribeReports calls fn with every report message any agent sends
// while this agent is connected, in delivery order, one call at a time
// (in the network's event context: see the package doc). Each call gets
// its own copy. stop ends delivery and waits for a running fn; it is
// idempotent and must not be called from fn.
func (a *Agent) SubscribeReports(fn func(from protocol.Sender, msg []byte)) (stop func(), err error) {
	return a.subscribe(kindReport, fn), nil
}

// SubscribeAcks is SubscribeReports for acknowledgements.
func (a *Agent) SubscribeAcks(fn func(from protocol.Sender, msg []byte)) (stop func(), err error) {
	return a.subscribe(kindAck, fn), nil
}

func (a *Agent) subscribe(kind string, fn func(protocol.Sender, []byte)) func() {
	s := &subscription{a: a, kind: kind, fn: fn}
	n := a.n
	n.mu.Lock()
	n.subs = append(n.subs, s)
	n.mu.Unlock()
	return func() {
		s.mu.Lock()
		s.stopped = true
		s.mu.Unlock()
		n.mu.Lock()
		if i := indexOf(n.subs, s); i >= 0 {
			n.subs = append(n.subs[:i:i], n.subs[i+1:]...)
		}
		n.mu.Unlock()
	}
}

func indexOf[T comparable](s []T, v T) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// Flush returns nil once everything published before it has left, which
// in memory is at once; ErrDisconnected while disconnected.
func (a *Agent) Flush(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !a.Connected() {
		return fmt.Errorf("memnet: flush: %w", ErrDisconnected)
	}
	return nil
}

// Connected reports whether the agent is connected to the bus.
func (a *Agent) Connected() bool {
	a.n.mu.Lock()
	defer a.n.mu.Unlock()
	return a.upLocked()
}

func (a *Agent) upLocked() bool { return !a.disconnected && !a.dead }

// publish routes one message to every subscription of its kind, in the
// order they were made, drawing loss, duplication and jitter per
// destination; from is the sender it names (as a NATS subject would).
func (a *Agent) publish(kind string, from protocol.Sender, msg []byte) error {
	n := a.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if !a.upLocked() {
		return ErrDisconnected
	}
	a.count.Published++
	for _, s := range n.subs {
		if s.kind != kind || !s.a.upLocked() || n.cutLocked(a.addr, s.a.addr) {
			continue
		}
		l := n.linkLocked(a.addr, s.a.addr)
		if n.chanceLocked(l.Loss) {
			continue
		}
		copies := 1
		if n.chanceLocked(l.Duplicate) {
			copies = 2
		}
		for range copies {
			b := append([]byte(nil), msg...)
			n.afterLocked(l.Latency+n.jitterLocked(l.Jitter), func() { n.deliver(a, s, from, b) })
		}
	}
	return nil
}

// deliver hands b to s unless the subscription stopped, the receiver went
// down or the link was cut while b was in flight.
func (n *Network) deliver(from *Agent, s *subscription, sender protocol.Sender, b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	n.mu.Lock()
	ok := s.a.upLocked() && !n.cutLocked(from.addr, s.a.addr)
	if ok {
		s.a.count.Delivered++
	}
	n.mu.Unlock()
	if ok {
		s.fn(sender, b)
	}
}
