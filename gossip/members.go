package gossip

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/meridian-quota/meridian/rebalance"
)

// Meta is what a member tells the others about itself. Region and Agent
// form its node name (Region "/" Agent, unique in the cluster); Role (e.g.
// "agent", "coordinator-candidate") and Version travel as memberlist node
// metadata. Each field is at most 128 bytes (Meta.Validate).
type Meta struct {
	Region  string
	Agent   string
	Role    string
	Version string
}

// Member states in MemberInfo.State.
//
// memberlist v0.7.0 tells its EventDelegate about joins, updates and
// deaths but not about suspicion, so a suspect member is reported as
// MemberAlive until it is declared dead — which is also how memberlist
// itself counts it (Memberlist.Members lists suspects).
const (
	MemberAlive = "alive"
	// MemberDead is a member declared dead by failure detection, or one
	// that left without its leave intent reaching this member first.
	MemberDead = "dead"
	// MemberLeft is a member that announced Leave (it is gone, or going
	// within the Leave timeout).
	MemberLeft = "left"
)

// MemberInfo is one member as this member knows it.
type MemberInfo struct {
	Meta
	Addr  string // host:port it gossips at
	State string // MemberAlive, MemberDead or MemberLeft
}

// Members is this agent's view of the memberlist cluster that spans the
// regions: which agents and regions are alive, for the coordinator
// (rebalance.Member lists) and for each region's node (live agents per
// region).
//
// All methods are safe for concurrent use. A Members runs until Leave;
// the context given to StartMembers bounds only the background joining.
//
// # Key rotation
//
// memberlist keeps a keyring per member and, unlike Serf, has no
// cluster-wide key commands; the key files are the source of truth and
// ReloadKeys makes this member's keyring equal to its file. To rotate
// from key OLD to key NEW without partitioning the cluster, apply each
// step to every member before starting the next:
//
//  1. Install: key file "OLD\nNEW", ReloadKeys. Everyone still encrypts
//     with OLD and can now decrypt NEW.
//  2. Switch: key file "NEW\nOLD", ReloadKeys. Members encrypt with NEW;
//     those not yet switched still decrypt it (step 1), and everyone
//     still decrypts OLD from those not yet switched.
//  3. Remove: key file "NEW", ReloadKeys. Nobody sends OLD any more.
//
// After step 3 a member that knows only OLD can no longer join. Skipping
// a step, or starting one before the previous one reached every member,
// cuts off the members that lag behind until they catch up.
type Members struct {
	ml      *memberlist.Memberlist
	keyring *memberlist.Keyring // nil: gossip is plaintext
	cfg     MemberConfig        // validated copy: ReloadKeys re-reads its key source
	log     *slog.Logger
	name    string // this member's node name
	addr    string // the address others reach it at

	self      Meta
	leaving   atomic.Bool   // Leave has begun: NodeMeta carries the flag
	stopping  atomic.Bool   // shutdown has begun: memberlist's complaints are expected
	deadAfter time.Duration // dead and left entries are forgotten after this (memberlist's GossipToTheDeadTime)
	// announceStep bounds each wait for the leave announcement: a few
	// gossip rounds, enough to send it on a healthy network.
	announceStep time.Duration

	mu    sync.Mutex
	nodes map[string]*memberEntry // by node name

	changed      chan struct{}
	joined       atomic.Bool
	joinAttempts atomic.Int64 // Join calls before the first success (tests)
	rejoins      atomic.Int64 // successful re-joins of missing seeds (tests)

	keysMu sync.Mutex // serializes ReloadKeys

	stopJoin  context.CancelFunc // ends joinLoop
	stopDials context.CancelFunc // aborts every TCP dial in flight (memberTransport)
	joinDone  chan struct{}      // closed when joinLoop has returned
	stopOnce  sync.Once
	stopErr   error
}

// memberEntry is one node in Members' view.
type memberEntry struct {
	info  MemberInfo
	ok    bool      // a Meridian member (its name has a region)
	since time.Time // when it entered its state
}

// StartMembers creates this agent's memberlist (node name Region "/"
// Agent), starts joining cfg.Join in the background (retrying with
// jittered backoff from the profile's ProbeInterval up to ten times it,
// until a seed answers or ctx ends; then re-joining missing seeds every
// RejoinInterval until ctx ends or Leave) and returns at once. log may be
// nil (discard). Call Leave to stop it.
func StartMembers(ctx context.Context, cfg MemberConfig, meta Meta, log *slog.Logger) (*Members, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := errors.Join(cfg.Validate(), meta.Validate()); err != nil {
		return nil, fmt.Errorf("gossip: members: %w", err)
	}
	cfg.Join = slices.Clone(cfg.Join)
	keys, err := cfg.loadKeys()
	if err != nil { // the file changed since Validate
		return nil, fmt.Errorf("gossip: members: %w", err)
	}

	mc := profileConfig(cfg.Profile)
	cfg.applyTimings(mc)
	name := nodeName(meta)
	log = log.With("node", name)
	m := &Members{
		cfg:          cfg,
		log:          log,
		name:         name,
		self:         meta,
		deadAfter:    mc.GossipToTheDeadTime,
		announceStep: max(5*mc.GossipInterval, 10*time.Millisecond),
		nodes:        make(map[string]*memberEntry),
		changed:      make(chan struct{}, 1),
		joinDone:     make(chan struct{}),
	}
	mc.Name = m.name
	mc.Logger = newMemberlistLogger(log, &m.stopping)
	mc.Delegate = memberDelegate{m}
	mc.Events = memberEvents{m}
	mc.Conflict = memberEvents{m}
	if len(keys) > 0 {
		kr, err := memberlist.NewKeyring(keys, keys[0])
		if err != nil {
			return nil, fmt.Errorf("gossip: members: keyring: %w", err)
		}
		m.keyring = kr
		mc.Keyring = kr
	} else {
		log.Warn("gossip: membership is not encrypted (members.allow_plaintext)")
	}

	bindIP, bindPort, _ := parseBind(cfg.Bind) // validated
	mc.BindAddr, mc.BindPort = bindIP, bindPort
	if cfg.Advertise != "" {
		mc.AdvertiseAddr, mc.AdvertisePort, _ = parseAdvertise(cfg.Advertise) // validated
	}
	dialCtx, stopDials := context.WithCancel(context.Background())
	tr, err := newMemberTransport(dialCtx, bindIP, bindPort, mc.Logger)
	if err != nil {
		stopDials()
		return nil, fmt.Errorf("gossip: members: bind %s: %w", cfg.Bind, err)
	}
	mc.Transport = tr
	if mc.AdvertiseAddr == "" {
		mc.BindPort = tr.GetAutoBindPort()
		mc.AdvertisePort = mc.BindPort
	}
	m.stopDials = stopDials

	ml, err := memberlist.Create(mc)
	if err != nil {
		_ = tr.Shutdown() // idempotent if Create already shut it down
		stopDials()
		return nil, fmt.Errorf("gossip: members: %w", err)
	}
	m.ml = ml
	m.addr = ml.LocalNode().Address()

	joinCtx, stopJoin := context.WithCancel(ctx)
	m.stopJoin = stopJoin
	if len(cfg.Join) == 0 {
		m.joined.Store(true)
		close(m.joinDone)
	} else {
		rejoin := cfg.RejoinInterval
		if rejoin == 0 {
			rejoin = mc.PushPullInterval
		}
		go m.joinLoop(joinCtx, mc.ProbeInterval, rejoin)
	}
	log.Info("gossip: membership started", "addr", m.addr,
		"profile", cfg.Profile, "encrypted", m.keyring != nil, "seeds", len(cfg.Join))
	return m, nil
}

// newMemberlistLogger adapts log for memberlist's *log.Logger; once
// stopping is set, its lines are logged at Debug (memberlist's goroutines
// report the closed sockets of a shutdown as errors).
func newMemberlistLogger(l *slog.Logger, stopping *atomic.Bool) *log.Logger {
	return log.New(memberLogWriter{log: l, stopping: stopping}, "", 0)
}

// joinLoop joins the seeds, retrying with jittered exponential backoff
// from probe up to 10·probe until one answers, then re-joins every rejoin
// interval the seeds that are not live members (healing a partition whose
// sides declared each other dead). It returns when ctx ends.
func (m *Members) joinLoop(ctx context.Context, probe, rejoin time.Duration) {
	defer close(m.joinDone)
	seeds := m.cfg.Join
	delay := probe
	for {
		n := m.joinAttempts.Add(1)
		ok, err := m.ml.Join(seeds)
		if ok > 0 {
			m.joined.Store(true)
			m.log.Info("gossip: joined the cluster", "seeds_answered", ok, "attempts", n)
			break
		}
		wait := memberJitter(delay)
		m.log.Warn("gossip: no seed answered; retrying", "seeds", seeds, "attempt", n,
			"retry_in", wait.Round(time.Millisecond), "err", flatError(err))
		if !memberSleep(ctx, wait) {
			return
		}
		delay = min(2*delay, 10*probe)
	}
	if rejoin < 0 {
		return
	}
	for memberSleep(ctx, memberJitter(rejoin)) {
		missing := m.missingSeeds(ctx, seeds)
		if len(missing) == 0 {
			continue
		}
		if ok, err := m.ml.Join(missing); ok > 0 {
			m.rejoins.Add(1)
			m.log.Info("gossip: re-joined seeds", "seeds", missing, "answered", ok)
		} else {
			m.log.Debug("gossip: re-join found no seed", "seeds", missing, "err", flatError(err))
		}
	}
}

// missingSeeds returns the seeds that are not the address of a live
// member (names resolved; a name that does not resolve counts as
// missing).
func (m *Members) missingSeeds(ctx context.Context, seeds []string) []string {
	live := make(map[string]bool)
	m.mu.Lock()
	for _, e := range m.nodes {
		if e.info.State == MemberAlive {
			live[e.info.Addr] = true
		}
	}
	m.mu.Unlock()
	var missing []string
	for _, s := range seeds {
		host, port, err := net.SplitHostPort(s)
		if err != nil {
			continue // validated
		}
		var ips []string
		if ip := net.ParseIP(host); ip != nil {
			ips = []string{ip.String()}
		} else {
			lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			ips, _ = net.DefaultResolver.LookupHost(lctx, host)
			cancel()
		}
		found := false
		for _, ip := range ips {
			if p := net.ParseIP(ip); p != nil && live[net.JoinHostPort(p.String(), port)] {
				found = true
				break
			}
		}
		if !found {
			missing = append(missing, s)
		}
	}
	return missing
}

// flatError flattens memberlist's multi-line (go-multierror) errors for a
// log attribute.
func flatError(err error) string {
	if err == nil {
		return ""
	}
	return strings.Join(strings.Fields(err.Error()), " ")
}

// memberJitter spreads d by ±20 % so members restarted together do not retry
// in step.
func memberJitter(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	return d*4/5 + rand.N(d*2/5+1)
}

// memberSleep waits d or until ctx ends; it reports whether d passed.
func memberSleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Live returns the live Meridian members — alive or suspect, not leaving —
// sorted by region, then agent; this member included until it leaves.
func (m *Members) Live() []rebalance.Member {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []rebalance.Member
	for _, e := range m.nodes {
		if e.ok && e.info.State == MemberAlive {
			out = append(out, rebalance.Member{Region: e.info.Region, Agent: e.info.Agent})
		}
	}
	slices.SortFunc(out, func(a, b rebalance.Member) int {
		return cmp.Or(cmp.Compare(a.Region, b.Region), cmp.Compare(a.Agent, b.Agent))
	})
	return out
}

// LiveInRegion counts the live members of region (as Live does).
func (m *Members) LiveInRegion(region string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, e := range m.nodes {
		if e.ok && e.info.State == MemberAlive && e.info.Region == region {
			n++
		}
	}
	return n
}

// Infos returns every member this one knows, with its state, sorted by
// region, agent, then address. Dead and left members are listed until
// memberlist forgets them (the profile's GossipToTheDeadTime, 15–60 s).
// Members whose name or metadata are not Meridian's are listed with an
// empty Region (and are never Live).
func (m *Members) Infos() []MemberInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pruneLocked(time.Now())
	out := make([]MemberInfo, 0, len(m.nodes))
	for _, e := range m.nodes {
		out = append(out, e.info)
	}
	slices.SortFunc(out, func(a, b MemberInfo) int {
		return cmp.Or(cmp.Compare(a.Region, b.Region), cmp.Compare(a.Agent, b.Agent), cmp.Compare(a.Addr, b.Addr))
	})
	return out
}

// Changed returns a channel that receives a value whenever a member
// joins, leaves, dies or changes its metadata. It holds at most one
// pending value (changes coalesce) and is never closed: read Live or
// Infos after each receive.
func (m *Members) Changed() <-chan struct{} { return m.changed }

// Addr returns the address (host:port) other members reach this one at.
func (m *Members) Addr() string { return m.addr }

// Joined reports whether this member has joined at least one seed, or had
// none to join.
func (m *Members) Joined() bool { return m.joined.Load() }

// ReloadKeys re-reads MemberConfig.KeyFile (or KeyEnv) and makes this
// member's keyring equal to it: new keys added, the first made primary,
// keys no longer listed removed. See Members for the rotation procedure.
// On error the keyring is unchanged. Encryption cannot be turned on or
// off at runtime: a member started without keys returns an error.
func (m *Members) ReloadKeys() error {
	if m.keyring == nil {
		return errors.New("gossip: reload keys: membership started without encryption; restart with a key to encrypt")
	}
	keys, err := m.cfg.loadKeys()
	if err != nil {
		return fmt.Errorf("gossip: reload keys: %w", err)
	}
	if len(keys) == 0 {
		return errors.New("gossip: reload keys: no keys (encryption cannot be turned off at runtime)")
	}
	m.keysMu.Lock()
	defer m.keysMu.Unlock()
	added, removed := 0, 0
	for _, k := range keys {
		if indexKey(m.keyring.GetKeys(), k) < 0 {
			if err := m.keyring.AddKey(k); err != nil { // validated: cannot fail
				return fmt.Errorf("gossip: reload keys: add key %d: %w", added+1, err)
			}
			added++
		}
	}
	primaryChanged := !bytes.Equal(m.keyring.GetPrimaryKey(), keys[0])
	if err := m.keyring.UseKey(keys[0]); err != nil {
		return fmt.Errorf("gossip: reload keys: use primary: %w", err)
	}
	// Remove from the back: memberlist's RemoveKey shifts the keys after
	// the removed one in place, under the keyring's lock but in a slice
	// that decryption reads without it. Removing the last key shifts
	// nothing, and step 3 of the rotation only ever removes the last.
	installed := slices.Clone(m.keyring.GetKeys())
	for i := len(installed) - 1; i > 0; i-- {
		if indexKey(keys, installed[i]) < 0 {
			if err := m.keyring.RemoveKey(installed[i]); err != nil {
				return fmt.Errorf("gossip: reload keys: remove key: %w", err)
			}
			removed++
		}
	}
	m.log.Info("gossip: keyring reloaded", "keys", len(keys), "added", added,
		"removed", removed, "primary_changed", primaryChanged)
	return nil
}

// Leave announces this member's departure, waits up to timeout for the
// announcement to go out (≤ 0: 5 s), and shuts the member down. Peers see
// it as MemberLeft rather than MemberDead. Idempotent: later calls return
// the first call's result.
func (m *Members) Leave(timeout time.Duration) error {
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	m.stopOnce.Do(func() { m.stopErr = m.stop(true, timeout) })
	return m.stopErr
}

// kill shuts the member down without announcing it, as a crash would
// (tests). Leave afterwards does nothing.
func (m *Members) kill() {
	m.stopOnce.Do(func() { m.stopErr = m.stop(false, 0) })
}

// stop ends the join loop and every dial in flight, announces the leave
// when graceful, and shuts memberlist down.
func (m *Members) stop(graceful bool, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	m.stopJoin()
	m.stopDials() // a Join dialing an unreachable seed returns now
	<-m.joinDone
	var errs []error
	if graceful {
		// The leaving flag first, so peers classify the dead message that
		// memberlist's Leave sends as "left". memberlist's dead message
		// carries the leave (its sender is the node itself), but its
		// EventDelegate does not tell the two apart.
		m.leaving.Store(true)
		// memberlist waits for a broadcast to be sent even when the last
		// peers leave meanwhile (nobody is left to send it to), so wait in
		// doubling steps (each retry restarts the broadcast) within half
		// the timeout, and stop once no peer is alive; a timeout with no
		// peer left is no failure.
		half := time.Now().Add(timeout / 2)
		for step := m.announceStep; ; step *= 2 {
			err := m.ml.UpdateNode(max(min(step, time.Until(half)), time.Millisecond))
			if err == nil || !m.peersAlive() {
				break
			}
			if time.Until(half) <= 0 {
				errs = append(errs, fmt.Errorf("announce leaving: %w", err))
				break
			}
		}
		if err := m.ml.Leave(max(time.Until(deadline), time.Millisecond)); err != nil && m.peersAlive() {
			errs = append(errs, fmt.Errorf("leave: %w", err))
		}
	}
	m.stopping.Store(true)
	if err := m.ml.Shutdown(); err != nil {
		errs = append(errs, fmt.Errorf("shutdown: %w", err))
	}
	if len(errs) > 0 {
		return fmt.Errorf("gossip: members: %w", errors.Join(errs...))
	}
	m.log.Info("gossip: membership stopped", "graceful", graceful)
	return nil
}

// peersAlive reports whether memberlist knows another member that is
// alive or suspect.
func (m *Members) peersAlive() bool {
	for _, n := range m.ml.Members() {
		if n.Name != m.name {
			return true
		}
	}
	return false
}

// notify signals Changed without blocking.
func (m *Members) notify() {
	select {
	case m.changed <- struct{}{}:
	default:
	}
}

// pruneLocked forgets dead and left members older than deadAfter, as
// memberlist does. m.mu must be held.
func (m *Members) pruneLocked(now time.Time) {
	for name, e := range m.nodes {
		if e.info.State != MemberAlive && now.Sub(e.since) > m.deadAfter {
			delete(m.nodes, name)
		}
	}
}

// observe records a node's state from a memberlist event.
func (m *Members) observe(n *memberlist.Node, dead bool) {
	meta, leaving, err := decodeMeta(n.Name, n.Meta)
	ok := meta.Region != ""
	if err != nil || !ok {
		m.log.Warn("gossip: member without Meridian metadata; not counted as live",
			"node", n.Name, "addr", n.Address())
		ok = false
	}
	state := MemberAlive
	switch {
	case leaving:
		state = MemberLeft
	case dead:
		state = MemberDead
	}
	now := time.Now()
	m.mu.Lock()
	e := m.nodes[n.Name]
	if e == nil || e.info.State != state {
		e = &memberEntry{since: now}
		m.nodes[n.Name] = e
	}
	e.info = MemberInfo{Meta: meta, Addr: n.Address(), State: state}
	e.ok = ok
	m.pruneLocked(now)
	m.mu.Unlock()
	m.notify()
}

// memberEvents receives memberlist's events (EventDelegate) and name
// conflicts (ConflictDelegate).
//
// Threading: memberlist calls these from its own goroutines, one at a
// time (never concurrently, so events arrive in order), while holding
// its node-table lock. They must not block or call back into the
// Memberlist (Members, UpdateNode, Leave, …): that would deadlock. They
// take Members.mu briefly and signal Changed without blocking.
type memberEvents struct{ m *Members }

var (
	_ memberlist.EventDelegate    = memberEvents{}
	_ memberlist.ConflictDelegate = memberEvents{}
)

func (e memberEvents) NotifyJoin(n *memberlist.Node)   { e.m.observe(n, false) }
func (e memberEvents) NotifyUpdate(n *memberlist.Node) { e.m.observe(n, false) }
func (e memberEvents) NotifyLeave(n *memberlist.Node)  { e.m.observe(n, true) }

// NotifyConflict reports two members claiming one node name; memberlist
// keeps the first. Two agents configured with the same region and agent
// name cause this.
func (e memberEvents) NotifyConflict(existing, other *memberlist.Node) {
	e.m.log.Error("gossip: two members claim one name (region/agent must be unique)",
		"node", existing.Name, "addr", existing.Address(), "other_addr", other.Address())
}

// memberDelegate gives memberlist this member's metadata. memberlist
// calls NodeMeta from any goroutine, possibly concurrently; it reads only
// immutable fields and an atomic. The user-message methods are unused
// (reports and tables travel over NATS).
type memberDelegate struct{ m *Members }

var _ memberlist.Delegate = memberDelegate{}

func (d memberDelegate) NodeMeta(limit int) []byte {
	b := encodeMeta(d.m.self, d.m.leaving.Load())
	if len(b) > limit { // Meta.Validate bounds it far below MetaMaxSize
		return nil
	}
	return b
}
func (memberDelegate) NotifyMsg([]byte)                  {}
func (memberDelegate) GetBroadcasts(_, _ int) [][]byte   { return nil }
func (memberDelegate) LocalState(bool) []byte            { return nil }
func (memberDelegate) MergeRemoteState(_ []byte, _ bool) {}

// memberTransport is memberlist's NetTransport with dials that end when
// the member stops, so Leave never waits on a Join or push/pull dialing an
// unreachable seed for the profile's TCPTimeout (up to 30 s).
type memberTransport struct {
	*memberlist.NetTransport
	dials context.Context // owned by Members; cancelled by its stop
}

var _ memberlist.NodeAwareTransport = (*memberTransport)(nil)

// newMemberTransport binds ip:port over TCP and UDP. With port 0 the
// kernel picks the TCP port and the UDP bind on the same port can race
// another process, so it retries a few times, as memberlist does.
func newMemberTransport(dials context.Context, ip string, port int, logger *log.Logger) (*memberTransport, error) {
	tries := 1
	if port == 0 {
		tries = 10
	}
	var err error
	for range tries {
		var nt *memberlist.NetTransport
		nt, err = memberlist.NewNetTransport(&memberlist.NetTransportConfig{
			BindAddrs: []string{ip},
			BindPort:  port,
			Logger:    logger,
		})
		if err == nil {
			return &memberTransport{NetTransport: nt, dials: dials}, nil
		}
	}
	return nil, err
}

func (t *memberTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

func (t *memberTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	return d.DialContext(t.dials, "tcp", a.Addr)
}
