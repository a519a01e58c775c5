package gossip

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gossip/protocol"
	"github.com/meridian-quota/meridian/gossip/wire"
	"github.com/meridian-quota/meridian/rebalance"
	"github.com/meridian-quota/meridian/region"
)

// LoopConfig configures one agent's link to its cluster. DefaultLoopConfig
// documents each default.
type LoopConfig struct {
	// Cluster namespaces subjects, KV keys and wire messages: agents of
	// different clusters on one NATS never mix.
	Cluster string
	// Region and Agent name this agent (the node's).
	Region, Agent string
	// Candidate makes this agent stand for coordinator.
	Candidate bool
	// Coordinator configures the rebalance core this agent runs while it
	// is the coordinator (Regions, Interval, Lease, MaxSkew, strategy…).
	Coordinator rebalance.Config
	// Election times the coordinator election (ID is set from Region and
	// Agent).
	Election ElectionConfig
	// SignKey signs the tables this agent publishes as coordinator
	// (required when Candidate). VerifyKeys are the coordinator keys whose
	// tables are applied (several during a key rotation).
	SignKey    ed25519.PrivateKey
	VerifyKeys []ed25519.PublicKey
	// Limits bound what decoding accepts; MaxMessage is the largest message
	// sent (chunks above it).
	Limits     wire.Limits
	MaxMessage int
	// TickEvery is how often the coordinator ticks its core and publishes.
	TickEvery time.Duration
	// MaxKeys bounds the keys the coordinator budgets; keys beyond it run
	// at their safe share (counted). KeyIdle: a key no report named for
	// this long leaves the budgets (it runs at its safe share, like any
	// key a table does not name, until it is reported again).
	MaxKeys int
	KeyIdle time.Duration
	// Queue bounds the reports and acks waiting to be sent, and the
	// reports waiting to be observed by the coordinator; beyond it they are
	// dropped and counted.
	Queue int
}

// DefaultLoopConfig returns a configuration with every default.
func DefaultLoopConfig(cluster, regionName, agentName string, regions ...string) LoopConfig {
	return LoopConfig{
		Cluster:     cluster,
		Region:      regionName,
		Agent:       agentName,
		Coordinator: rebalance.DefaultConfig(regions...),
		Election:    ElectionConfig{TTL: 3 * time.Second}, // failover within a few seconds
		Limits:      wire.DefaultLimits(),
		MaxMessage:  wire.DefaultMaxMessage, // below NATS's default 1 MiB max_payload
		TickEvery:   100 * time.Millisecond, // acks and increases go out within a tenth of a second
		MaxKeys:     protocol.DefaultMaxKeys,
		KeyIdle:     protocol.DefaultKeyIdle,
		Queue:       protocol.DefaultQueue,
	}
}

// Validate reports every problem with c.
func (c *LoopConfig) Validate() error {
	var errs []error
	for _, f := range []struct{ name, v string }{{"cluster", c.Cluster}, {"region", c.Region}, {"agent", c.Agent}} {
		if err := checkName(f.v); err != nil {
			errs = append(errs, fmt.Errorf("gossip: %s: %w", f.name, err))
		}
	}
	if err := c.Coordinator.Validate(); err != nil {
		errs = append(errs, err)
	} else if !slices.Contains(c.Coordinator.Regions, c.Region) {
		errs = append(errs, fmt.Errorf("gossip: region %q is not one of the coordinator's regions %v", c.Region, c.Coordinator.Regions))
	}
	if c.Candidate && len(c.SignKey) != ed25519.PrivateKeySize {
		errs = append(errs, errors.New("gossip: a coordinator candidate needs an Ed25519 signing key"))
	}
	if len(c.VerifyKeys) == 0 {
		errs = append(errs, errors.New("gossip: no coordinator verify keys: every table would be refused"))
	}
	for i, k := range c.VerifyKeys {
		if len(k) != ed25519.PublicKeySize {
			errs = append(errs, fmt.Errorf("gossip: verify key %d: %d bytes, want %d", i, len(k), ed25519.PublicKeySize))
		}
	}
	if c.Candidate && len(c.SignKey) == ed25519.PrivateKeySize && len(c.VerifyKeys) > 0 {
		pub, _ := c.SignKey.Public().(ed25519.PublicKey)
		if !slices.ContainsFunc(c.VerifyKeys, func(k ed25519.PublicKey) bool { return k.Equal(pub) }) {
			errs = append(errs, errors.New("gossip: the signing key's public key is not among the verify keys: this agent's own tables would be refused"))
		}
	}
	if err := c.Limits.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.MaxMessage < 1024 || c.MaxMessage > c.Limits.MaxMessage {
		errs = append(errs, fmt.Errorf("gossip: max message %d: want 1024..%d (the decoders' limit)", c.MaxMessage, c.Limits.MaxMessage))
	}
	if c.TickEvery <= 0 || c.TickEvery > c.Coordinator.Interval {
		errs = append(errs, fmt.Errorf("gossip: tick %v: want (0, interval %v]", c.TickEvery, c.Coordinator.Interval))
	}
	term := protocol.CoordinatorConfig{Coordinator: c.Coordinator, MaxKeys: c.MaxKeys, KeyIdle: c.KeyIdle, Queue: c.Queue}
	errs = append(errs, term.TermProblems("gossip")...)
	return errors.Join(errs...)
}

// Status is the loop's view of its cluster.
type Status struct {
	Cluster         string
	Connected       bool
	Coordinator     string // holder of the election key, "" if none
	CoordinatorTerm uint64
	Leader          bool
	Members         map[string]int     // live agents by region (nil without membership)
	TableIssued     int64              // µs, coordinator's clock: when the newest table received was issued (0: none)
	ClockSkew       map[string]float64 // ms, by region; leader only
}

// Ports are what a Loop runs on: the protocol's ports and the election.
// In production [NewPorts] builds them from a dialled Transport (NATS and
// its JetStream bucket) and Members (memberlist); tests and the simulator
// give gossip/memnet's endpoints. The Loop's decisions are the same on
// either: they are gossip/protocol's.
type Ports struct {
	// Bus carries reports and acks.
	Bus protocol.Bus
	// Tables holds the latest table (head compare-and-set, chunks).
	Tables protocol.TableStore
	// Election is the coordinator election (a candidate campaigns on it;
	// every agent reads its holder for Status).
	Election Election
	// Members is the live membership; nil for none (the node counts its
	// configured agents, the coordinator learns agents from their reports).
	Members protocol.Membership
}

// NewPorts returns the ports of a dialled transport and, unless mem is nil,
// of its membership.
func NewPorts(tr *Transport, mem *Members) Ports {
	p := Ports{Bus: tr, Tables: tr, Election: tr.Election()}
	if mem != nil {
		p.Members = mem // a nil *Members would be a non-nil interface
	}
	return p
}

// Loop is one agent's link to its cluster: it sends the node's demand
// reports and acknowledgements on the bus, applies the tables the
// coordinator stores in the table store (signature verified) through the
// agent's loop, feeds membership to the node, and — when Candidate and
// elected — runs the coordinator: the rebalance core fed with every
// agent's reports, acks and the live members, its tables signed and
// compare-and-set into the store.
//
// Report, InForce, Tables, Applied, Flush and Status form region/agent's
// Control interface; they are safe for concurrent use and never block.
type Loop struct {
	fence atomic.Pointer[fenceHeld] // SetFence's
	cfg   LoopConfig
	bus   protocol.Bus
	store protocol.TableStore
	elect Election
	mem   protocol.Membership // nil: no membership
	node  *region.Node
	log   *slog.Logger
	m     *loopMetrics
	now   func() int64 // µs, wall clock (leases are on the coordinator's clock)

	outMu  sync.Mutex
	outbox *protocol.Outbox // reports and acks to send
	outc   chan struct{}    // signalled (cap 1) while outbox holds something
	flushc chan chan struct{}
	tables chan *rebalance.Table

	mu     sync.Mutex
	issued int64     // the newest delivered table's Issued
	seen   [2]uint64 // its (term, epoch)
	led    uint64    // the newest term coordinated, or found stored as one began
	leader bool
	skew   map[string]float64
	holder Leadership

	storeClock func(ctx context.Context) (int64, error) // stamps reports and acks

	// Which tables reach the agent (watchTables only).
	follower protocol.Follower
}

// NewLoop makes a loop on net (see [Ports]; [NewPorts] for a dialled
// Transport and Members). net.Members may be nil (no membership: the node
// counts its configured agents, the coordinator learns agents from their
// reports).
func NewLoop(cfg LoopConfig, net Ports, node *region.Node, reg prometheus.Registerer, log *slog.Logger) (*Loop, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if net.Bus == nil || net.Tables == nil || net.Election.KV == nil || node == nil {
		return nil, errors.New("gossip: NewLoop needs a bus, a table store, an election KV and a node")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg.Election.ID = cfg.Region + "/" + cfg.Agent
	m, err := newLoopMetrics(reg, cfg.Coordinator.Regions)
	if err != nil {
		return nil, err
	}
	l := &Loop{
		cfg: cfg, bus: net.Bus, store: net.Tables, elect: net.Election, mem: net.Members,
		node: node, log: log, m: m,
		now:    func() int64 { return time.Now().UnixMicro() },
		outbox: protocol.NewOutbox(cfg.Queue),
		outc:   make(chan struct{}, 1),
		flushc: make(chan chan struct{}),
		tables: make(chan *rebalance.Table, 4),
		skew:   map[string]float64{},
		storeClock: func(context.Context) (int64, error) {
			return time.Now().UnixMicro(), nil
		},
	}
	l.elect.TermFloor = l.termFloor
	return l, nil
}

// SetStoreClock makes reports and acks carry the region store's clock (µs;
// Redis TIME in production) instead of this host's, so the coordinator's
// skew estimate is the store's — the clock leases and effective times are
// compared with. Call it before Run.
func (l *Loop) SetStoreClock(f func(ctx context.Context) (int64, error)) { l.storeClock = f }

// Report queues one closed interval's report for the coordinator.
func (l *Loop) Report(rep *rebalance.Report) {
	l.enqueue(protocol.KindReport, func(b *protocol.Outbox) bool { return b.Report(rep) })
}

// InForce queues an acknowledgement of the table in force (none for 0, 0),
// carrying the region fence SetFence gave last.
func (l *Loop) InForce(term, epoch uint64) {
	f := l.fence.Load()
	if f == nil {
		f = &fenceHeld{}
	}
	l.enqueue(protocol.KindAck, func(b *protocol.Outbox) bool { return b.AckFenced(term, epoch, f.held, f.store) })
}

// fenceHeld is the region fence the agent's store held, and its identity.
type fenceHeld struct {
	held  gcra.Fence
	store uint64
}

// SetFence records the region fence the agent's store held after the
// agent raised it, read back, and the store's identity (gcra.Fencer): every
// later acknowledgement carries them, so that the coordinator can count one
// acknowledgement for the region (package rebalance, invariant 1).
func (l *Loop) SetFence(held gcra.Fence, store uint64) {
	l.fence.Store(&fenceHeld{held: held, store: store})
}

// enqueue offers a message to the outbox with push, counting it dropped
// when the outbox is full, and wakes send.
func (l *Loop) enqueue(kind string, push func(*protocol.Outbox) bool) {
	l.outMu.Lock()
	ok := push(l.outbox)
	queued := l.outbox.Len() > 0
	l.outMu.Unlock()
	if !ok {
		l.m.dropped.WithLabelValues(kind).Inc()
	}
	if queued {
		l.wakeSend()
	}
}

func (l *Loop) wakeSend() {
	select {
	case l.outc <- struct{}{}:
	default:
	}
}

// nextOut takes the oldest queued message, re-signalling send while more
// wait (one message per turn of its loop, as when the queue was a channel).
func (l *Loop) nextOut() (protocol.Out, bool) {
	l.outMu.Lock()
	o, ok := l.outbox.Next()
	more := l.outbox.Len() > 0
	l.outMu.Unlock()
	if more {
		l.wakeSend()
	}
	return o, ok
}

// Tables delivers verified tables, newest last.
func (l *Loop) Tables() <-chan *rebalance.Table { return l.tables }

// Applied counts what the node made of a table.
func (l *Loop) Applied(t *rebalance.Table, err error) {
	outcome := protocol.Outcome(err)
	l.m.tables.WithLabelValues(outcome).Inc()
	switch outcome {
	case protocol.TableApplied:
		l.m.tableTerm.Set(float64(t.Term))
		l.m.tableEpoch.Set(float64(t.Epoch))
	case protocol.TableRefused:
		l.log.Warn("table refused by the node", "term", t.Term, "epoch", t.Epoch, "err", err)
	}
}

// Flush waits until every queued report and ack has been published and
// the bus has them, or ctx ends.
func (l *Loop) Flush(ctx context.Context) error {
	done := make(chan struct{})
	select {
	case l.flushc <- done:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-done:
		return l.bus.Flush(ctx)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Status returns the loop's view of its cluster.
func (l *Loop) Status() Status {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := Status{Cluster: l.cfg.Cluster, Connected: l.bus.Connected(), Leader: l.leader,
		Coordinator: l.holder.ID, CoordinatorTerm: l.holder.Term, TableIssued: l.issued}
	if l.leader {
		s.ClockSkew = maps.Clone(l.skew)
	}
	if l.mem != nil {
		s.Members = map[string]int{}
		for _, m := range l.mem.Live() {
			s.Members[m.Region]++
		}
	}
	return s
}

// Run runs the loop until ctx ends: sending, watching tables, following
// membership and, for a candidate, campaigning and coordinating.
func (l *Loop) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	spawn := func(f func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(ctx); err != nil && ctx.Err() == nil {
				errc <- err
				cancel()
			}
		}()
	}
	spawn(l.send)
	spawn(l.watchTables)
	spawn(l.watchLeader)
	if l.mem != nil {
		spawn(l.followMembers)
	}
	if l.cfg.Candidate {
		spawn(l.campaign)
	}
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// send publishes queued reports and acks.
func (l *Loop) send(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-l.outc:
			if o, ok := l.nextOut(); ok {
				l.publish(ctx, o)
			}
		case done := <-l.flushc:
			for o, ok := l.nextOut(); ok; o, ok = l.nextOut() {
				l.publish(ctx, o)
			}
			close(done)
		}
	}
}

func (l *Loop) publish(ctx context.Context, o protocol.Out) {
	// Stamped with the region store's clock as it goes out: the
	// coordinator compares it with its own to estimate the region's skew.
	sent, err := l.storeClock(ctx)
	if err != nil {
		sent = 0 // unknown: the coordinator skips the estimate
	}
	kind := o.Kind()
	msgs, err := o.Encode(l.cfg.Cluster, l.cfg.Region, l.cfg.Agent, sent, l.cfg.MaxMessage)
	if err == nil {
		if kind == protocol.KindAck {
			err = l.bus.PublishAck(l.cfg.Region, l.cfg.Agent, msgs[0])
		} else {
			err = l.bus.PublishReport(l.cfg.Region, l.cfg.Agent, msgs)
		}
	}
	n := 0
	for _, m := range msgs {
		n += len(m)
	}
	l.count(kind, "out", err, len(msgs), n)
}

func (l *Loop) count(kind, dir string, err error, msgs, bytes int) {
	if err != nil {
		l.m.errors.WithLabelValues(kind).Inc()
		l.log.Warn("publish failed", "kind", kind, "err", err)
		return
	}
	l.m.msgs.WithLabelValues(kind, dir).Add(float64(msgs))
	l.m.bytes.WithLabelValues(kind, dir).Add(float64(bytes))
}

// watchTables follows the table head in the table store and hands every
// newer, verified table to the agent.
func (l *Loop) watchTables(ctx context.Context) error {
	r := l.tableReader()
	return l.store.WatchTables(ctx, func(head []byte, rev uint64) {
		t, err := l.readTable(ctx, r, head)
		if err != nil {
			if ctx.Err() == nil {
				l.invalid("table", err)
			}
			return
		}
		if ok, reason := l.follower.Offer(t); !ok {
			if reason == protocol.TableOlder {
				last, lastEpoch := l.follower.Last()
				l.invalid("table", fmt.Errorf("%w: table %d/%d on revision %d after %d/%d", protocol.ErrReplayed, t.Term, t.Epoch, rev, last, lastEpoch))
				return
			}
			l.m.tables.WithLabelValues(reason).Inc()
			return
		}
		l.mu.Lock()
		l.issued = t.Issued
		l.seen = [2]uint64{t.Term, t.Epoch}
		l.mu.Unlock()
		select {
		case l.tables <- t:
		case <-ctx.Done():
		}
	})
}

// tableReader returns a reader of this cluster's tables, trusting the
// verify keys. Reading the stored head as a term starts takes a fresh one.
func (l *Loop) tableReader() *protocol.TableReader {
	return protocol.NewTableReader(l.cfg.Cluster, l.cfg.Limits, l.cfg.VerifyKeys)
}

// readTable decodes and verifies a head with r and fetches the rest of
// its table, counting the verified chunks read.
func (l *Loop) readTable(ctx context.Context, r *protocol.TableReader, head []byte) (*rebalance.Table, error) {
	msgs, bytes := r.Accepted()
	patched, missed := r.Deltas()
	t, err := protocol.ReadTable(ctx, l.store, r, head)
	if m, b := r.Accepted(); m > msgs {
		l.m.msgs.WithLabelValues("table", "in").Add(float64(m - msgs))
		l.m.bytes.WithLabelValues("table", "in").Add(float64(b - bytes))
	}
	if p, m := r.Deltas(); p > patched || m > missed {
		l.m.deltas.WithLabelValues("patched").Add(float64(p - patched))
		l.m.deltas.WithLabelValues("missed").Add(float64(m - missed))
	}
	return t, err
}

// invalid counts and logs an inbound message that failed validation,
// under its protocol.Classify class; it is never applied. (Every refusal
// is logged; nothing limits the rate.)
func (l *Loop) invalid(kind string, err error) {
	reason := protocol.Classify(err)
	l.m.invalid.WithLabelValues(kind, reason).Inc()
	l.log.Warn("inbound message refused", "kind", kind, "reason", reason, "err", err)
}

// watchLeader keeps the election key's holder for Status and metrics.
func (l *Loop) watchLeader(ctx context.Context) error {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		if ld, ok, err := l.elect.Leader(ctx); err == nil {
			l.mu.Lock()
			if ok {
				l.holder = ld
			} else {
				l.holder = Leadership{}
			}
			l.mu.Unlock()
			l.m.coordTerm.Set(float64(ld.Term))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// followMembers tells the node how many agents its region has live.
func (l *Loop) followMembers(ctx context.Context) error {
	for {
		live := l.mem.LiveInRegion(l.cfg.Region)
		l.node.SetLiveAgents(live)
		counts := map[string]int{}
		for _, m := range l.mem.Live() {
			counts[m.Region]++
		}
		for _, r := range l.cfg.Coordinator.Regions {
			l.m.members.WithLabelValues(r).Set(float64(counts[r]))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-l.mem.Changed():
		}
	}
}

// campaign stands for coordinator and coordinates while elected. A term
// whose table write is fenced (someone else wrote the head) resigns — its
// campaign ends, releasing the election key — and campaigns again, so a
// fresh term reads the head anew. A term whose coordinator stops on another
// error (NATS unreachable when it read the latest table, say) is retried
// while the election still says this agent leads.
func (l *Loop) campaign(ctx context.Context) error {
	for ctx.Err() == nil {
		if err := l.campaignOnce(ctx); err != nil && ctx.Err() == nil {
			l.log.Info("campaigning again", "after", err)
			select {
			case <-ctx.Done():
			case <-time.After(l.cfg.Election.TTL / 3):
			}
		}
	}
	return nil
}

// campaignOnce runs one campaign until ctx ends or a term is fenced.
func (l *Loop) campaignOnce(ctx context.Context) error {
	var mu sync.Mutex
	want := uint64(0) // the term the election says this agent holds, 0 for none
	notify := make(chan struct{}, 1)
	set := func(term uint64) {
		mu.Lock()
		want = term
		mu.Unlock()
		select {
		case notify <- struct{}{}:
		default:
		}
	}
	ectx, ecancel := context.WithCancel(ctx)
	cdone := make(chan struct{})
	go func() {
		defer close(cdone)
		err := l.elect.Campaign(ectx, l.cfg.Election, l.cfg.Coordinator.MaxSkew, set, func(uint64) { set(0) })
		if err != nil && ectx.Err() == nil {
			l.log.Warn("campaign stopped", "err", err)
		}
		set(0)
	}()
	type run struct {
		term   uint64
		cancel context.CancelFunc
		done   chan error
	}
	var cur *run
	stop := func() {
		if cur != nil {
			cur.cancel()
			<-cur.done
			cur = nil
			l.setLeader(false)
		}
	}
	defer func() {
		stop()
		ecancel()
		<-cdone
	}()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		var done chan error
		if cur != nil {
			done = cur.done
		}
		select {
		case <-ctx.Done():
			return nil
		case <-cdone:
			return errors.New("the campaign ended")
		case <-notify:
		case <-retry.C:
		case err := <-done:
			term := cur.term
			cur.cancel()
			cur = nil
			l.setLeader(false)
			if errors.Is(err, errDeposed) {
				return fmt.Errorf("term %d: %w", term, err)
			}
			l.log.Warn("coordinator stopped; retrying", "term", term, "err", err)
			retry.Reset(time.Second)
			continue
		}
		mu.Lock()
		term := want
		mu.Unlock()
		if cur != nil && cur.term == term {
			continue
		}
		stop()
		if term == 0 {
			continue
		}
		cctx, cancel := context.WithCancel(ctx)
		cur = &run{term: term, cancel: cancel, done: make(chan error, 1)}
		l.setLeader(true)
		go func(r *run) {
			err := l.coordinate(cctx, r.term)
			if err == nil {
				err = cctx.Err()
			}
			r.done <- err
		}(cur)
	}
}

func (l *Loop) setLeader(on bool) {
	l.mu.Lock()
	l.leader = on
	if !on {
		clear(l.skew)
	}
	l.mu.Unlock()
	if on {
		l.m.leader.Set(1)
	} else {
		l.m.leader.Set(0)
	}
}

// inbound is a report or ack message and the sender its transport names.
type inbound struct {
	from protocol.Sender
	b    []byte
}

// checkSender refuses a message that claims to come from region/agent
// when its transport says another agent sent it (issue 17, defect 7: with
// per-agent NATS credentials an agent can publish only on its own
// subjects, and this makes it unable to speak for another on them).
func checkSender(from protocol.Sender, region, agent string) error {
	if from.Region == region && from.Agent == agent {
		return nil
	}
	return fmt.Errorf("%w: %s/%s claims to be %s/%s", protocol.ErrSender, from.Region, from.Agent, region, agent)
}

// termFloor is the election's term floor: the newest table term this
// agent had delivered or coordinated.
func (l *Loop) termFloor() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return max(l.seen[0], l.led)
}

// errDeposed ends a term whose table write was fenced, or whose stored
// table's term is not below it.
var errDeposed = protocol.ErrDeposed

// coordinate runs one term: the I/O around a protocol.Term, which decides
// the keys, the term's start and what to store. It subscribes to reports
// and acks, reads the stored head, decodes and verifies what arrives,
// signs and compare-and-sets the tables the term hands out, and counts
// and logs what the term reports.
func (l *Loop) coordinate(ctx context.Context, term uint64) error {
	log := l.log.With("term", term)
	reports := make(chan inbound, l.cfg.Queue*4)
	acks := make(chan inbound, l.cfg.Queue*4)
	push := func(ch chan inbound, kind string) func(protocol.Sender, []byte) {
		return func(from protocol.Sender, b []byte) {
			select {
			case ch <- inbound{from, b}:
			default:
				l.m.dropped.WithLabelValues(kind + "_in").Inc()
			}
		}
	}
	stopR, err := l.bus.SubscribeReports(push(reports, "report"))
	if err != nil {
		return err
	}
	defer stopR()
	stopA, err := l.bus.SubscribeAcks(push(acks, "ack"))
	if err != nil {
		return err
	}
	defer stopA()

	// The shares in force: the latest stored table.
	head, rev, ok, err := l.store.LatestTable(ctx)
	if err != nil {
		return fmt.Errorf("read the latest table: %w", err)
	}
	var latest *rebalance.Table
	if ok {
		if latest, err = l.readTable(ctx, l.tableReader(), head); err != nil {
			// A head nobody can verify is no table: start from the floors.
			l.invalid("table", err)
			latest = nil
		}
	}
	l.mu.Lock()
	seen := l.seen
	l.led = max(l.led, term, termOf(latest))
	l.mu.Unlock()
	if protocol.Replayed(latest, seen[0], seen[1]) {
		l.invalid("table", fmt.Errorf("%w: the stored head holds table %d/%d, this agent had %d/%d", protocol.ErrReplayed, latest.Term, latest.Epoch, seen[0], seen[1]))
		latest = nil
	}
	var live []rebalance.Member // nil without membership
	if l.mem != nil {
		live = l.mem.Live()
	}
	tm, err := protocol.NewTerm(l.termConfig(), term, latest, live, l.node.Policy(), l.now())
	if err != nil {
		return err
	}
	l.termEvents(log, tm)
	log.Info("coordinating", "latest_term", termOf(latest), "keys", tm.Stats().Keys)
	l.mu.Lock()
	l.holder = Leadership{Term: term, ID: l.cfg.Election.ID, Since: time.Now()}
	l.mu.Unlock()
	// enc encodes each table as a head on the last base stored, or as a
	// new base (a delta on the table before it for agents that hold that).
	enc := protocol.NewTableEncoder(l.cfg.Cluster, l.cfg.SignKey, l.cfg.MaxMessage, latest)
	store := func(t *rebalance.Table) error {
		if t == nil {
			return nil
		}
		chunks, err := enc.Encode(t, tm.ReadBy(t))
		if err != nil {
			return fmt.Errorf("encode table: %w", err)
		}
		nrev, serr := l.store.StoreTable(ctx, rev, t.Term, t.Epoch, chunks)
		if serr != nil {
			enc.Failed()
		}
		if tm.Stored(t, serr) != nil {
			// The head moved: only another coordinator's table ends the
			// term; a head no coordinator wrote is written over on its
			// revision at the next tick.
			h, hrev, ok, herr := l.store.LatestTable(ctx)
			if herr != nil {
				l.m.errors.WithLabelValues("table").Inc()
				log.Warn("read the head that fenced a table write (retrying next tick)", "epoch", t.Epoch, "err", herr)
				return nil
			}
			// Its header is enough to say who wrote it, and needs no
			// chunks: a replayed head's are long purged.
			var cur *rebalance.Table
			if ok {
				var verr error
				if cur, verr = l.tableReader().Header(h); verr != nil {
					l.invalid("table", verr)
					cur = nil
				}
			}
			if err := tm.Fenced(cur); err != nil {
				l.m.fenced.Inc()
				return err
			}
			if cur != nil && cur.Term < term { // this term's own table is no replay
				l.invalid("table", fmt.Errorf("%w: table %d/%d under term %d", protocol.ErrReplayed, cur.Term, cur.Epoch, term))
			}
			l.m.overwritten.Inc()
			log.Warn("table head written by no coordinator: storing over it", "revision", hrev, "epoch", t.Epoch)
			rev = hrev
			return nil
		}
		if serr != nil {
			l.m.errors.WithLabelValues("table").Inc()
			log.Warn("store table (retrying next tick)", "epoch", t.Epoch, "err", serr)
			return nil
		}
		rev = nrev
		enc.Stored(t)
		n := 0
		for _, b := range chunks {
			n += len(b)
		}
		l.m.msgs.WithLabelValues("table", "out").Add(float64(len(chunks)))
		l.m.bytes.WithLabelValues("table", "out").Add(float64(n))
		l.m.published.Inc()
		l.m.maxShareSum.Set(float64(protocol.MaxShareSum(t)))
		return nil
	}
	if err := store(tm.Unstored()); err != nil {
		return err
	}
	asm := wire.NewAssembler(l.cfg.Limits, 4*len(l.cfg.Coordinator.Regions)+16)
	tick := time.NewTicker(l.cfg.TickEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case in := <-reports:
			b := in.b
			m, err := wire.Decode(l.cfg.Cluster, b, l.cfg.Limits, nil)
			if err == nil && m.Kind != wire.KindReport {
				err = fmt.Errorf("%w: a %v message on the report subject", wire.ErrInvalid, m.Kind)
			}
			if err == nil {
				err = checkSender(in.from, m.Report.Report.Region, m.Report.Report.Agent)
			}
			if err != nil {
				l.invalid("report", err)
				continue
			}
			l.m.msgs.WithLabelValues("report", "in").Inc()
			l.m.bytes.WithLabelValues("report", "in").Add(float64(len(b)))
			rep, done, err := asm.AddReport(m.Report)
			if err != nil {
				l.invalid("report", err)
				continue
			}
			if done {
				a := tm.Report(rep, m.Report.Sent, l.now())
				if a.SkewKnown {
					l.noteSkew(rep.Region, a.Skew)
				}
				if !a.Queued {
					l.m.dropped.WithLabelValues("report_in").Inc()
				}
			}
		case in := <-acks:
			b := in.b
			m, err := wire.Decode(l.cfg.Cluster, b, l.cfg.Limits, nil)
			if err == nil && m.Kind != wire.KindAck {
				err = fmt.Errorf("%w: a %v message on the ack subject", wire.ErrInvalid, m.Kind)
			}
			if err == nil {
				err = checkSender(in.from, m.Ack.Region, m.Ack.Agent)
			}
			if err != nil {
				l.invalid("ack", err)
				continue
			}
			l.m.msgs.WithLabelValues("ack", "in").Inc()
			l.m.bytes.WithLabelValues("ack", "in").Add(float64(len(b)))
			if err := tm.AckFenced(m.Ack.Region, m.Ack.Agent, m.Ack.Term, m.Ack.Epoch, m.Ack.Fence, m.Ack.Store); err != nil {
				l.invalid("ack", fmt.Errorf("%w: %w", wire.ErrInvalid, err))
			}
		case <-tick.C:
			now := l.now()
			tm.Policy(l.node.Policy())
			if l.mem != nil {
				tm.Members(l.mem.Live())
			}
			t := tm.Tick(now)
			l.termEvents(log, tm)
			if err := tm.Deposed(); err != nil {
				// An agent runs a table above this term's: stand again
				// above it.
				l.mu.Lock()
				l.led = max(l.led, tm.Outranked())
				l.mu.Unlock()
				l.m.fenced.Inc()
				return err
			}
			if err := store(t); err != nil {
				return err
			}
			l.m.keys.Set(float64(tm.Stats().Keys))
		}
	}
}

// termConfig is the part of the loop's configuration a term runs on.
func (l *Loop) termConfig() protocol.CoordinatorConfig {
	return protocol.CoordinatorConfig{
		Coordinator: l.cfg.Coordinator,
		MaxKeys:     l.cfg.MaxKeys,
		KeyIdle:     l.cfg.KeyIdle,
		Queue:       l.cfg.Queue,
	}
}

// termEvents logs and counts what a term refused or counted.
func (l *Loop) termEvents(log *slog.Logger, tm *protocol.Term) {
	for _, e := range tm.Events() {
		switch e.Kind {
		case protocol.EventMembers:
			log.Warn("membership", "err", e.Err)
		case protocol.EventPolicyBudgets:
			log.Warn("budgets after a policy change", "err", e.Err)
		case protocol.EventBudgets:
			log.Warn("budgets", "err", e.Err)
		case protocol.EventReportRefused:
			l.invalid("report", fmt.Errorf("%w: %w", wire.ErrInvalid, e.Err))
		case protocol.EventOverflow:
			l.m.overflow.Add(float64(e.N))
		default:
			log.Warn("coordinator", "event", e.Kind, "err", e.Err)
		}
	}
}

func termOf(t *rebalance.Table) uint64 {
	if t == nil {
		return 0
	}
	return t.Term
}

// noteSkew records how far a region's store clock was from the
// coordinator's when its report arrived (skew µs, from protocol.Term's
// Report: transit time included, an upper bound on how far behind it is).
func (l *Loop) noteSkew(regionName string, skew int64) {
	ms := float64(skew) / 1000
	l.mu.Lock()
	l.skew[regionName] = ms
	l.mu.Unlock()
	if g, err := l.m.skew.GetMetricWithLabelValues(regionName); err == nil {
		g.Set(ms / 1000)
	}
}
