package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gcra/memstore"
	"github.com/meridian-quota/meridian/gossip"
	"github.com/meridian-quota/meridian/gossip/wire"
	"github.com/meridian-quota/meridian/internal/natstest"
	"github.com/meridian-quota/meridian/rebalance"
	"github.com/meridian-quota/meridian/region"
	"github.com/meridian-quota/meridian/region/agent"
)

// The cluster tests run whole agents as `meridian agent` wires them —
// agent.Agent, region.Node on an in-memory store, gossip.Loop over a real
// embedded NATS server (JetStream) and real memberlist on loopback — three
// regions, one agent each, every agent a coordinator candidate.

const (
	tΔ       = 500 * time.Millisecond
	tLease   = 3 * time.Second
	tSkew    = 50 * time.Millisecond
	tFence   = 200 * time.Millisecond
	tTick    = 100 * time.Millisecond // the agent's and the coordinator's loop period
	tTTL     = time.Second
	tRegions = 3
)

var tNames = []string{"ap", "eu", "us"} // sorted, as tables list them

const tPolicy = `
domains:
  - domain: api
    descriptors:
      - key: tenant
        rate_limit: {unit: second, requests_per_unit: 1000, burst: 100}
`

// shareChange is one entry of the merged log: from At (µs, wall clock) on,
// Region runs Key at Share ppm.
type shareChange struct {
	At     int64
	Region string
	Key    string
	Share  uint32
}

// shareLog collects every agent's share changes.
type shareLog struct {
	mu      sync.Mutex
	changes []shareChange
}

func (l *shareLog) add(c shareChange) {
	l.mu.Lock()
	l.changes = append(l.changes, c)
	l.mu.Unlock()
}

// check replays the merged log in time order (decreases first at equal
// times: they take effect no later) and fails if any key's shares in force
// ever sum above 10⁶.
func (l *shareLog) check(t testing.TB) int {
	l.mu.Lock()
	log := slices.Clone(l.changes)
	l.mu.Unlock()
	sort.SliceStable(log, func(i, j int) bool { return log[i].At < log[j].At })
	cur := map[string]map[string]uint32{}
	for _, c := range log {
		m := cur[c.Key]
		if m == nil {
			m = map[string]uint32{}
			cur[c.Key] = m
		}
		m[c.Region] = c.Share
		var sum uint64
		for _, s := range m {
			sum += uint64(s)
		}
		if sum > 1_000_000 {
			t.Errorf("key %s: shares in force sum to %d ppm at %d (after %s → %d): %v", c.Key, sum, c.At, c.Region, c.Share, m)
		}
	}
	return len(log)
}

// recorder wraps an agent's Control to log the shares each applied table
// puts in force: from max(effective, applied) on, since the agent runs the
// previous share until then. A key the table leaves out runs at
// min(last, safe).
type recorder struct {
	agent.Control
	region string
	log    *shareLog
	safe   uint32
	mu     sync.Mutex
	last   map[string]uint32
	table  *rebalance.Table            // the last applied
	firsts map[uint64]*rebalance.Table // per term, the first table applied
	// applied counts the tables applied: the tests bound convergence in
	// coordinator rounds rather than wall-clock time, which a loaded CI
	// machine stretches.
	applied int
}

// SetFence passes the region fence on to the link (agent.FenceSink), as
// the agent's control does without a recorder.
func (r *recorder) SetFence(held gcra.Fence, store uint64) {
	if fs, ok := r.Control.(agent.FenceSink); ok {
		fs.SetFence(held, store)
	}
}

func (r *recorder) Applied(t *rebalance.Table, err error) {
	r.Control.Applied(t, err)
	if err != nil {
		return
	}
	at := max(t.Effective, time.Now().UnixMicro())
	ri := slices.Index(t.Regions, r.region)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.table = t
	r.applied++
	if r.firsts == nil {
		r.firsts = map[uint64]*rebalance.Table{}
	}
	if r.firsts[t.Term] == nil {
		r.firsts[t.Term] = t
	}
	seen := map[string]bool{}
	for _, ks := range t.Keys {
		seen[ks.Key] = true
		s := ks.Shares[ri]
		r.last[ks.Key] = s
		r.log.add(shareChange{At: at, Region: r.region, Key: ks.Key, Share: s})
	}
	for k, s := range r.last {
		if !seen[k] {
			s = min(s, r.safe)
			r.last[k] = s
			r.log.add(shareChange{At: at, Region: r.region, Key: k, Share: s})
		}
	}
}

// tAgent is one running agent.
type tAgent struct {
	name   string
	cfg    *agent.Config
	node   *region.Node
	agent  *agent.Agent
	reg    *prometheus.Registry
	cl     *cluster
	rec    *recorder
	cancel context.CancelFunc
	done   chan struct{}
}

func (a *tAgent) loop() *gossip.Loop { return a.cl.loop }

// stop kills the agent (its servers, its loop, its memberlist membership).
// For the merged log it counts as running its last shares until its lease
// ends and min(last, safe) after — what it would do cut off but alive, and
// all the others may assume of it.
func (a *tAgent) stop() { a.halt(false) }

// crash kills the agent without a goodbye: its NATS connections drop
// first, so it cannot release the election key or leave memberlist
// gracefully.
func (a *tAgent) crash() { a.halt(true) }

func (a *tAgent) halt(crash bool) {
	if a.cancel == nil {
		return
	}
	a.agent.EndDrain() // stopped at once, whatever drain_delay says
	if crash {
		a.cl.tr.Close()
	}
	a.cancel()
	<-a.done
	a.cancel = nil
	lease := a.node.Table().LeaseExpiry
	a.rec.mu.Lock()
	defer a.rec.mu.Unlock()
	for k, s := range a.rec.last {
		a.rec.log.add(shareChange{At: lease, Region: a.name, Key: k, Share: min(s, a.rec.safe)})
	}
}

type tCluster struct {
	t        testing.TB
	dir      string
	name     string
	nats     *natstest.Server
	urls     map[string]string // per region: the NATS URL its agent dials (a proxy when set)
	log      *shareLog
	agents   map[string]*tAgent
	seed     string
	sign     ed25519.PrivateKey
	interval time.Duration // Δ (tΔ unless a test sets it before starting agents)
	// natsUser, when set, gives each region's agent its own NATS user and
	// password file; candidates, when set, names the coordinator
	// candidates (otherwise every agent is one).
	natsUser   map[string][2]string
	candidates map[string]bool
	// drain is every agent's drain_delay (0 unless a test sets it; stop
	// and crash skip it).
	drain time.Duration
	// stores: per region, the one store its agents decide on (a region's
	// Redis), kept across an agent's restart.
	stores map[string]*memstore.Store
	// shipped runs the coordinator settings an operator gets by default
	// (lease, skew, fence, strategy, hysteresis, election TTL) instead of
	// the tests' short ones; set it, and interval, before starting agents.
	shipped bool
	// policy is the agents' policy (tPolicy unless a test sets it, and
	// writes it to policy.yaml, before starting agents).
	policy string
}

func newTCluster(t testing.TB) *tCluster {
	return newTClusterOn(t, fmt.Sprintf("t%d", time.Now().UnixNano()%1e9))
}

// newTClusterOn is newTCluster with the cluster's name and the NATS
// server's options given.
func newTClusterOn(t testing.TB, name string, opts ...natstest.Option) *tCluster {
	t.Helper()
	c := &tCluster{t: t, dir: t.TempDir(), name: name,
		nats: natstest.Start(t, opts...), log: &shareLog{}, agents: map[string]*tAgent{}, urls: map[string]string{}, interval: tΔ,
		stores: map[string]*memstore.Store{}, policy: tPolicy}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	c.sign = priv
	mk := make([]byte, 32)
	_, _ = rand.Read(mk)
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(c.dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("sign.key", gossip.EncodeKey(priv.Seed())+"\n")
	write("verify.keys", gossip.EncodeKey(pub)+"\n")
	write("gossip.key", gossip.EncodeKey(mk)+"\n")
	write("policy.yaml", tPolicy)
	return c
}

func (c *tCluster) config(regionName string) *agent.Config {
	cfg := agent.DefaultConfig()
	cfg.Region, cfg.Agent, cfg.Regions = regionName, regionName+"-1", tNames
	cfg.Policy, cfg.GRPC, cfg.HTTP, cfg.ReloadEvery = filepath.Join(c.dir, "policy.yaml"), "127.0.0.1:0", "", 0 // listeners: none are opened (Run gets nil)
	cfg.Interval = agent.Duration(c.interval)
	cfg.DrainDelay = agent.Duration(c.drain)
	url := c.nats.URL()
	if u, ok := c.urls[regionName]; ok {
		url = u
	}
	cfg.Cluster = agent.ClusterConfig{Name: c.name,
		NATS: agent.ClusterNATSConfig{URLs: []string{url}, Bucket: "meridian-" + c.name, Replicas: 1},
		Members: agent.ClusterMembersConfig{Profile: "local", Bind: "127.0.0.1:0",
			KeyFile: filepath.Join(c.dir, "gossip.key")},
		Coordinator: agent.ClusterCoordinatorConfig{Candidate: true,
			SignKeyFile: filepath.Join(c.dir, "sign.key"), VerifyKeysFile: filepath.Join(c.dir, "verify.keys"),
			Lease: agent.Duration(tLease), MaxSkew: agent.Duration(tSkew), Fence: agent.Duration(tFence),
			Strategy: "proportional", Hysteresis: 1000, ElectionTTL: agent.Duration(tTTL)},
	}
	cfg.ReserveMaxWait = agent.Duration(tFence) // a booking must act within the fence
	if c.shipped {
		def := agent.DefaultConfig().Cluster.Coordinator
		cfg.Cluster.Coordinator.Lease, cfg.Cluster.Coordinator.MaxSkew, cfg.Cluster.Coordinator.Fence = def.Lease, def.MaxSkew, def.Fence
		cfg.Cluster.Coordinator.Strategy, cfg.Cluster.Coordinator.Hysteresis, cfg.Cluster.Coordinator.ElectionTTL = def.Strategy, def.Hysteresis, def.ElectionTTL
		cfg.ReserveMaxWait = agent.DefaultConfig().ReserveMaxWait
	}
	if u, ok := c.natsUser[regionName]; ok {
		cfg.Cluster.NATS.User, cfg.Cluster.NATS.PasswordFile = u[0], u[1]
	}
	if c.candidates != nil && !c.candidates[regionName] {
		cfg.Cluster.Coordinator.Candidate, cfg.Cluster.Coordinator.SignKeyFile = false, ""
	}
	if c.seed != "" {
		cfg.Cluster.Members.Join = []string{c.seed}
	}
	if err := cfg.Validate(); err != nil {
		c.t.Fatal(err)
	}
	return &cfg
}

// start runs region's agent (again, after stop).
func (c *tCluster) start(regionName string) *tAgent {
	c.t.Helper()
	ta := c.startAs(regionName, nil, c.log)
	c.agents[regionName] = ta
	return ta
}

// startAs runs an agent of region with its config changed by tweak (nil:
// none), recording the shares it applies in log; the caller keeps it.
func (c *tCluster) startAs(regionName string, tweak func(*agent.Config), log *shareLog) *tAgent {
	t := c.t
	t.Helper()
	cfg := c.config(regionName)
	if tweak != nil {
		tweak(cfg)
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
	}
	policy, err := region.ParsePolicy([]byte(c.policy))
	if err != nil {
		t.Fatal(err)
	}
	store := c.stores[regionName]
	if store == nil {
		var err error
		if store, err = memstore.New(memstore.DefaultConfig()); err != nil {
			t.Fatal(err)
		}
		c.stores[regionName] = store
	}
	ncfg := nodeConfig(cfg)
	ncfg.Fence = regionFenced(cfg)
	node, err := region.NewNode(ncfg, policy, store)
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("agent", regionName)
	}
	a, err := agent.New(*cfg, node, logger)
	if err != nil {
		t.Fatal(err)
	}
	if ncfg.Fence {
		a.SetFencer(store)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cl, err := joinCluster(ctx, cfg, node, a.Registry(), nil, "test", logger)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if c.seed == "" {
		c.seed = cl.mem.Addr()
	}
	rec := &recorder{Control: control{cl.loop}, region: regionName, log: log,
		safe: 33_333, last: map[string]uint32{}}
	cl.ctrl = rec
	ta := &tAgent{name: regionName, cfg: cfg, node: node, agent: a, reg: a.Registry(), cl: cl, rec: rec,
		cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(ta.done)
		_ = serveWithCluster(ctx, a, cl, func(ctx context.Context) error { return a.Run(ctx, nil, nil) })
	}()
	t.Cleanup(ta.stop)
	return ta
}

func (c *tCluster) startAll() {
	for _, r := range tNames {
		c.start(r)
	}
}

// leader waits for a coordinator and returns it.
func (c *tCluster) leader(within time.Duration, not string) *tAgent {
	c.t.Helper()
	var got *tAgent
	waitFor(c.t, within, "a coordinator", func() bool {
		for _, a := range c.agents {
			if a.cancel != nil && a.name != not && a.loop().Status().Leader {
				got = a
				return true
			}
		}
		return false
	})
	return got
}

func waitFor(t testing.TB, within time.Duration, what string, ok func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < within {
		if ok() {
			return time.Since(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no %s within %v", what, within)
	return 0
}

// load offers tenant traffic in a region at rate requests/s until stop.
type load struct {
	stop    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
	offers  atomic.Int64
	allowed atomic.Int64 // answered OK
	failed  atomic.Int64 // answered with an error
}

// window counts what l offered and had allowed over d.
func (l *load) window(d time.Duration) (offered, allowed int64) {
	o, a := l.offers.Load(), l.allowed.Load()
	time.Sleep(d)
	return l.offers.Load() - o, l.allowed.Load() - a
}

func (c *tCluster) offer(regionName, tenant string, rate float64) *load {
	return offerTo(c.agents[regionName], tenant, rate)
}

// offerTo offers tenant traffic to agent a at rate requests/s until stop.
func offerTo(a *tAgent, tenant string, rate float64) *load {
	l := &load{stop: make(chan struct{})}
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{{
		Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: tenant}}}}}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		every := time.Duration(float64(time.Second) / rate)
		tk := time.NewTicker(every)
		defer tk.Stop()
		for {
			select {
			case <-l.stop:
				return
			case <-tk.C:
				resp, err := a.agent.ShouldRateLimit(context.Background(), req)
				switch {
				case err != nil:
					l.failed.Add(1)
				case resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
					l.allowed.Add(1)
				}
				l.offers.Add(1)
			}
		}
	}()
	return l
}

// end stops the load (again: nothing) and waits for its last request.
func (l *load) end() {
	l.once.Do(func() { close(l.stop) })
	l.wg.Wait()
}

// admitting waits until l is admitted in full (all but 5 %, over a quarter
// of a second) and returns how long that took.
func admitting(t testing.TB, l *load, what string) time.Duration {
	t.Helper()
	return waitFor(t, 15*time.Second, what+" admitted in full", func() bool {
		o, a := l.window(250 * time.Millisecond)
		return o > 0 && a >= o*95/100
	})
}

// hold offers tenant traffic in a region (400 requests/s) until its agent
// holds most of the tenant's budget (above 70 %), and returns the load.
func (c *tCluster) hold(regionName, tenant string) *load {
	c.t.Helper()
	l := c.offer(regionName, tenant, 400)
	key := keyOf(tenant)
	waitFor(c.t, 15*time.Second, regionName+" holding most of "+tenant+"'s budget", func() bool {
		s, _ := c.agents[regionName].share(key)
		return s > 700_000
	})
	return l
}

// takeOver offers tenant traffic in region (400 requests/s) once another
// region has gone, and waits until its agent holds more than above ppm of
// the tenant's budget — after the gone region's lease and skew at the
// earliest — returning the load.
func (c *tCluster) takeOver(regionName, tenant string, above uint32) *load {
	c.t.Helper()
	l := c.offer(regionName, tenant, 400)
	key := keyOf(tenant)
	waitFor(c.t, tLease+15*time.Second, regionName+" given the gone region's share", func() bool {
		s, _ := c.agents[regionName].share(key)
		return s > above
	})
	return l
}

// heldUntil fails if, before until (µs), any region but victim ran more of
// key than the share victim held beyond 70 %: victim's share stayed its own
// until its lease plus skew had passed.
func (l *shareLog) heldUntil(t testing.TB, key, victim string, until int64) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ch := range l.changes {
		if ch.Key == key && ch.Region != victim && ch.Share > 1_000_000-700_000 && ch.At < until {
			t.Errorf("%s got %d ppm at %d, before %s's lease + skew %d", ch.Region, ch.Share, ch.At, victim, until)
		}
	}
}

// besides returns a region whose agent is not a: eu, or us when a is eu's.
func besides(a *tAgent) string {
	if a.name == "eu" {
		return "us"
	}
	return "eu"
}

// dial connects a transport of the test's own to the cluster's bucket (as
// a stale or hostile writer would), closed when the test ends.
func (c *tCluster) dial() *gossip.Transport {
	c.t.Helper()
	nc := gossip.DefaultNATSConfig()
	nc.URLs, nc.Bucket, nc.Replicas = []string{c.nats.URL()}, "meridian-"+c.name, 1
	tr, err := gossip.Dial(context.Background(), c.name, nc, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(tr.Close)
	return tr
}

func keyOf(tenant string) string {
	return region.KeyName("api", []region.Entry{{Key: "tenant", Value: tenant}})
}

// tables is how many tables region's agent has applied so far.
func (a *tAgent) tables() int {
	a.rec.mu.Lock()
	defer a.rec.mu.Unlock()
	return a.rec.applied
}

// share is what region's agent last applied for key (ppm), and whether it has it.
func (a *tAgent) share(key string) (uint32, bool) {
	a.rec.mu.Lock()
	defer a.rec.mu.Unlock()
	s, ok := a.rec.last[key]
	return s, ok
}

func counter(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	v, ok := series(t, reg, name, labels)
	if !ok {
		t.Fatalf("no series %s%v", name, labels)
	}
	return v
}

// counted is counter for a series that may not exist yet (0 until then).
func counted(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	v, _ := series(t, reg, name, labels)
	return v
}

func series(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue next
				}
			}
			return value(m), true
		}
	}
	return 0, false
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	return 0
}

// TestClusterShift: demand for one tenant moves from eu to ap; ap's share
// follows within the rebalance core's bound — 2Δ + 4 one-way latencies +
// Fence, with the loops' tick standing for each latency and MaxSkew for the
// acknowledgement's margin — plus one Δ of slack; and the merged log of
// every agent's share changes never sums above 10⁶.
//
// On real NATS the bound is reported, not asserted: the loops run on the
// wall clock, and under -race beside another job they run late together —
// a bound in seconds failed CI at 1.8 s against 1.65 s, and one in tables
// failed at 6 against 5, while the protocol was right. The bound itself is
// asserted exactly in virtual time by the rebalance core's tests
// (TestSilentRegionLeaseThenFloor and the supersede tests); here the
// deadline only guards against a cluster that never converges.
func TestClusterShift(t *testing.T) {
	c := newTCluster(t)
	c.startAll()
	c.leader(10*time.Second, "")
	key := keyOf("acme")
	c.hold("eu", "acme").end()
	n0 := c.agents["ap"].tables()
	ap := c.offer("ap", "acme", 400)
	defer ap.end()
	// The core's bound (rebalance/doc.go): 2Δ + 4 one-way latencies +
	// Fence, an acknowledgement counting only MaxSkew after the effective
	// time; here a latency is up to one loop tick, so the sum is under 4Δ:
	// four tables.
	const bound = 4
	// proportional gives ap all but the others' floors (2 × 33,333 ppm)
	// once the reports show only ap's demand: within 10 % of that counts.
	took := waitFor(t, 60*tΔ, "ap holding acme's budget", func() bool {
		s, _ := c.agents["ap"].share(key)
		return s >= 840_000
	})
	n := c.agents["ap"].tables() - n0
	// Issue 18's target for a moved tenant: 80 % of its share in the new
	// region within 2Δ + 1 s (reported, not asserted: see above).
	t.Logf("ap took over acme's budget %v and %d tables after the shift (the core's bound: %d tables on an idle machine; issue 18's target 2Δ + 1 s = %v)",
		took, n, bound, 2*tΔ+time.Second)
	if n := c.log.check(t); n == 0 {
		t.Fatal("no share changes logged")
	}
}

// TestClusterShiftShipped is issue 18's must-hold 4: the move of
// TestClusterShift — a 100/s tenant's traffic goes from eu to ap — on a
// cluster running the shipped coordinator settings (Δ 2 s, fence 500 ms,
// max skew 250 ms, lease 30 s, the default strategy and hysteresis). It
// reports the time until ap holds 80 % of the tenant's budget against the
// issue's target of 2Δ + 1 s, polled with a deadline that only guards
// against a cluster that never converges, and checks the merged log of
// every agent's shares never sums above 10⁶.
func TestClusterShiftShipped(t *testing.T) {
	c := newTCluster(t)
	c.shipped, c.interval = true, 2*time.Second
	if err := os.WriteFile(filepath.Join(c.dir, "policy.yaml"), []byte(strings.Replace(tPolicy,
		"requests_per_unit: 1000, burst: 100", "requests_per_unit: 100, burst: 20", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	c.startAll()
	c.leader(30*time.Second, "")
	key := keyOf("acme")
	eu := c.offer("eu", "acme", 200)
	waitFor(t, 60*time.Second, "eu holding most of acme's budget", func() bool {
		s, _ := c.agents["eu"].share(key)
		return s > 700_000
	})
	eu.end()
	ap := c.offer("ap", "acme", 200)
	defer ap.end()
	took := waitFor(t, 60*time.Second, "ap holding 80 % of acme's budget", func() bool {
		s, _ := c.agents["ap"].share(key)
		return s >= 800_000
	})
	t.Logf("shipped settings: ap held 80 %% of the 100/s tenant's budget %v after the move (issue 18's target 2Δ + 1 s = %v)", took, 2*c.interval+time.Second)
	if n := c.log.check(t); n == 0 {
		t.Fatal("no share changes logged")
	}
}

// TestClusterFailover: the coordinator dies; another acts within a few
// seconds, the shares in force do not change through the failover, and the
// old coordinator cannot write over the new term.
func TestClusterFailover(t *testing.T) {
	c := newTCluster(t)
	c.startAll()
	key := keyOf("acme")
	old := c.leader(10*time.Second, "")
	home := besides(old)
	l := c.hold(home, "acme")
	defer l.end()
	before := map[string]uint32{}
	for _, r := range tNames {
		before[r], _ = c.agents[r].share(key)
	}
	_, oldRev, _, err := old.cl.tr.LatestTable(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	oldTerm := counter(t, c.agents[home].reg, "meridian_cluster_table_term", nil)
	killed := time.Now()
	old.crash()
	next := c.leader(tTTL+5*time.Second, old.name)
	t.Logf("%s took over from %s %v after it died", next.name, old.name, time.Since(killed))
	// The new term's first tables republish the shares in force (learning
	// mode): the surviving regions' shares never move while it learns.
	waitFor(t, 5*time.Second, "a table under the new term", func() bool {
		return counter(t, c.agents[home].reg, "meridian_cluster_table_term", nil) > oldTerm
	})
	t.Logf("a table under the new term applied %v after the old coordinator died", time.Since(killed))
	term := uint64(counter(t, c.agents[home].reg, "meridian_cluster_table_term", nil))
	// The new term's first table names the surviving agents, so that its
	// first decrease waits for them (it names the stored table's agents
	// and the live members: the coordinator learns membership before the
	// term starts). On 2023668 it named none: StartTerm came before the
	// first membership sync.
	rec := c.agents[home].rec
	rec.mu.Lock()
	first := rec.firsts[term]
	rec.mu.Unlock()
	if first == nil {
		t.Errorf("%s never applied the first table of term %d", home, term)
	} else {
		for i, r := range first.Regions {
			if r != old.name && !slices.Contains(first.Agents[i], r+"-1") {
				t.Errorf("the first table of term %d names %v in %s, want %s-1", term, first.Agents[i], r, r)
			}
		}
	}
	for _, r := range tNames {
		if r == old.name {
			continue
		}
		if s, _ := c.agents[r].share(key); s != before[r] && time.Since(killed) < tLease {
			t.Errorf("%s: acme's share moved from %d to %d during the failover", r, before[r], s)
		}
	}
	// The deposed coordinator, returning with what it knew, is fenced.
	tr := c.dial()
	stale := &rebalance.Table{Term: term - 1, Epoch: 1 << 40, Regions: tNames, Leases: make([]int64, 3), Agents: make([][]string, 3)}
	chunks, err := wire.EncodeTable(c.name, stale, c.sign, wire.DefaultMaxMessage)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.StoreTable(context.Background(), oldRev, stale.Term, stale.Epoch, chunks); !errors.Is(err, gossip.ErrFenced) {
		t.Errorf("the old coordinator's write over the new term: err = %v, want ErrFenced", err)
	}
	c.log.check(t)
}

// TestClusterRegionLoss: a region dies; the share it held beyond its floor
// goes to the others only after its lease plus the skew; when it returns
// with demand it gets more than its floor within an interval or two.
func TestClusterRegionLoss(t *testing.T) {
	c := newTCluster(t)
	c.startAll()
	key := keyOf("acme")
	victim := besides(c.leader(10*time.Second, ""))
	l := c.hold(victim, "acme")
	lease := c.agents[victim].node.Table().LeaseExpiry
	l.end()
	c.agents[victim].stop()
	lost := time.Now()
	other := "ap"
	o := c.takeOver(other, "acme", 500_000)
	defer o.end()
	t.Logf("%s given the lost region's share %v after the loss (its lease ran %v past it)", other, time.Since(lost).Round(time.Millisecond), (time.Duration(lease-lost.UnixMicro()) * time.Microsecond).Round(time.Millisecond))
	// From the merged log: no other region's share rose above what it had
	// before the loss until the victim's lease plus the skew had passed.
	floor := uint32(33_333) // floor(0.1 · 10⁶ / 3)
	c.log.heldUntil(t, key, victim, lease+tSkew.Microseconds())
	c.log.check(t)
	// Once the table gives the victim its floor, it returns with demand
	// and gets more than its floor.
	waitFor(t, tLease+10*time.Second, victim+" down to its floor in the tables", func() bool {
		a := c.agents[other]
		a.rec.mu.Lock()
		defer a.rec.mu.Unlock()
		if a.rec.table == nil {
			return false
		}
		ri := slices.Index(a.rec.table.Regions, victim)
		for _, ks := range a.rec.table.Keys {
			if ks.Key == key {
				return ks.Shares[ri] <= floor
			}
		}
		return false
	})
	c.start(victim)
	n0 := c.agents[other].tables()
	back := c.offer(victim, "acme", 400)
	defer back.end()
	took := waitFor(t, 60*tΔ, victim+" above its floor again", func() bool {
		s, _ := c.agents[victim].share(key)
		return s > floor
	})
	n := c.agents[other].tables() - n0
	t.Logf("%s back above its floor %v and %d tables after returning", victim, took, n)
	// Its first report closes within Δ of its return; the rebalance that
	// sees it runs within another Δ, and the increase waits for the others'
	// decreases (acks, Fence) as any increase does: under 4Δ, four tables
	// on an idle machine. Reported, not asserted (see TestClusterShift).
	c.log.check(t)
}

// proxy is a TCP proxy that can cut every connection through it.
type proxy struct {
	ln      net.Listener
	target  string
	mu      sync.Mutex
	down    bool
	conns   []net.Conn
	stopped chan struct{}
}

func newProxy(t testing.TB, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, stopped: make(chan struct{})}
	go p.serve()
	t.Cleanup(func() { ln.Close(); <-p.stopped; p.cut() })
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) serve() {
	defer close(p.stopped)
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down := p.down
		p.mu.Unlock()
		if down {
			in.Close()
			continue
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(out, in); out.Close() }()
		go func() { _, _ = io.Copy(in, out); in.Close() }()
	}
}

// cut closes every connection and refuses new ones until restore.
func (p *proxy) cut() {
	p.mu.Lock()
	p.down = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
}

func (p *proxy) restore() {
	p.mu.Lock()
	p.down = false
	p.mu.Unlock()
}

// TestClusterNATSLoss: one agent loses NATS; it keeps its table until the
// lease expires, then runs at min(last, safe); when NATS returns it takes
// tables again without a restart.
func TestClusterNATSLoss(t *testing.T) {
	c := newTCluster(t)
	p := newProxy(t, strings.TrimPrefix(c.nats.URL(), "nats://"))
	c.urls["ap"] = "nats://" + p.addr()
	c.startAll()
	c.leader(10*time.Second, "")
	ap := c.agents["ap"]
	waitFor(t, 10*time.Second, "a table at ap", func() bool { return ap.node.Table().HasTable })
	p.cut()
	cutAt := time.Now().UnixMicro()
	st := ap.node.Table()
	if st.Lapsed {
		t.Fatal("lapsed at once")
	}
	waitFor(t, tLease+5*time.Second, "ap's lease to lapse", func() bool { return ap.node.Table().Lapsed })
	if now := time.Now().UnixMicro(); now < st.LeaseExpiry {
		t.Errorf("lapsed at %d, before the lease %d ended", now, st.LeaseExpiry)
	}
	t.Logf("ap lapsed %.1fs after losing NATS (lease expiry %.1fs after)", float64(time.Now().UnixMicro()-cutAt)/1e6, float64(st.LeaseExpiry-cutAt)/1e6)
	p.restore()
	waitFor(t, 15*time.Second, "ap back on a table after NATS returned", func() bool {
		s := ap.node.Table()
		return !s.Lapsed && s.Epoch > st.Epoch
	})
	c.log.check(t)
}

// TestClusterRefusesForgedAndReplayedTables: a well-formed table with a
// newer term signed by another key is refused and counted; so is an old
// table replayed as the head (as invalid, reason "replayed"). Neither
// deposes the coordinator (issue 17, defect 4): it finds the head that
// fenced its write was written by no coordinator, stores over it and
// counts it, and the term goes on. Fails on 1088a93: the forged head
// deposed the coordinator (a new term started) and the replay was counted
// as stale.
func TestClusterRefusesForgedAndReplayedTables(t *testing.T) {
	c := newTCluster(t)
	c.startAll()
	lead := c.leader(10*time.Second, "")
	eu := c.agents["eu"]
	waitFor(t, 10*time.Second, "a table at eu", func() bool { return eu.node.Table().HasTable })
	tr := c.dial()
	head, rev, _, err := tr.LatestTable(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	in := eu.node.Table()
	_, evil, _ := ed25519.GenerateKey(rand.Reader)
	forged := &rebalance.Table{Term: in.Term + 100, Epoch: 1, Issued: time.Now().UnixMicro(), Effective: time.Now().UnixMicro(),
		Regions: tNames, Leases: []int64{1 << 50, 1 << 50, 1 << 50}, Agents: [][]string{{"ap-1"}, {"eu-1"}, {"us-1"}}}
	chunks, err := wire.EncodeTable(c.name, forged, evil, wire.DefaultMaxMessage)
	if err != nil {
		t.Fatal(err)
	}
	sig := counter(t, eu.reg, "meridian_cluster_invalid_messages_total", map[string]string{"kind": "table", "reason": "signature"})
	if rev, err = tr.StoreTable(context.Background(), rev, forged.Term, forged.Epoch, chunks); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the forged table counted", func() bool {
		return counter(t, eu.reg, "meridian_cluster_invalid_messages_total", map[string]string{"kind": "table", "reason": "signature"}) > sig
	})
	if got := eu.node.Table(); got.Term == forged.Term {
		t.Fatalf("forged table applied: %+v", got)
	}
	overwritten := func() float64 {
		return counter(t, lead.reg, "meridian_coordinator_heads_overwritten_total", nil)
	}
	waitFor(t, 10*time.Second, "the coordinator storing over the forged head", func() bool {
		got := eu.node.Table()
		return overwritten() >= 1 && got.Term == in.Term && got.Epoch > in.Epoch
	})
	// Replay: the old head (a validly signed, older table) stored again.
	_, rev, _, err = tr.LatestTable(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	replayed := counted(t, eu.reg, "meridian_cluster_invalid_messages_total", map[string]string{"kind": "table", "reason": "replayed"})
	if _, err := tr.StoreTable(context.Background(), rev, 0, 0, [][]byte{head}); err != nil && !errors.Is(err, gossip.ErrFenced) {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the replayed table counted as invalid (replayed)", func() bool {
		return counted(t, eu.reg, "meridian_cluster_invalid_messages_total", map[string]string{"kind": "table", "reason": "replayed"}) > replayed
	})
	waitFor(t, 10*time.Second, "the coordinator storing over the replayed head", func() bool { return overwritten() >= 2 })
	if n := counter(t, lead.reg, "meridian_coordinator_fenced_total", nil); n != 0 {
		t.Errorf("the coordinator was deposed %v times by heads no coordinator wrote", n)
	}
	if got := eu.node.Table(); got.Term != in.Term {
		t.Errorf("eu runs term %d after the forged and replayed heads, want term %d still", got.Term, in.Term)
	}
	c.log.check(t)
}

// TestClusterBucketLoss: the KV bucket is deleted and created again empty
// (a JetStream loss, an operator's mistake) under a running cluster. The
// election record goes with it, yet the next term is above every agent's
// table (the candidates' term floor); each agent's watch, re-created on
// the new stream, takes the new term's head though its revision restarted
// at 1; the term starts blind and every agent applies its tables. Fails on
// 1088a93: the election restarted at term 1 and the agents refused its
// tables (and their watches withheld the new bucket's heads) until their
// leases lapsed. Σ shares in force stay within 10⁶ ppm from every
// agent's view throughout (the merged log's check).
func TestClusterBucketLoss(t *testing.T) {
	c := newTCluster(t)
	c.startAll()
	c.leader(10*time.Second, "")
	for _, r := range tNames {
		a := c.agents[r]
		waitFor(t, 10*time.Second, "a table at "+r, func() bool { return a.node.Table().HasTable })
	}
	// Past the bucket's first revisions: a leader whose last write had a
	// revision the new bucket reaches again would renew its record there
	// (NATS compares revisions only) and keep its term, which this test
	// does not look at.
	tr := c.dial()
	waitFor(t, 20*time.Second, "the bucket past revision 30", func() bool {
		_, rev, _, err := tr.LatestTable(context.Background())
		return err == nil && rev > 30
	})
	before := c.agents["eu"].node.Table().Term
	nc, err := nats.Connect(c.nats.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	bucket := "meridian-" + c.name
	if err := js.DeleteKeyValue(ctx, bucket); err != nil {
		t.Fatal(err)
	}
	lost := time.Now()
	// The bucket comes back empty, as an operator (or NATS) recreates it:
	// running agents create it only when they start. Right after the
	// delete the server may refuse to create it again while it removes
	// the old stream's store ("error creating store for stream", code
	// 500, seen twice in CI under -race, once for 30 s of retries by an
	// earlier form of this test that waited for the agents instead): try
	// again until it is back.
	refused := 0
	waitFor(t, 30*time.Second, "the bucket created again", func() bool {
		_, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 1, Replicas: 1, Storage: jetstream.FileStorage})
		if err != nil && !errors.Is(err, jetstream.ErrBucketExists) {
			if refused++; refused == 1 {
				t.Logf("creating the bucket again: %v (retrying)", err)
			}
			return false
		}
		return true
	})
	if refused > 0 {
		t.Logf("the bucket created again after %d refusals", refused)
	}
	for _, r := range tNames {
		a := c.agents[r]
		waitFor(t, 30*time.Second, r+" on a table of a later term", func() bool {
			st := a.node.Table()
			return st.HasTable && !st.Lapsed && st.Term > before
		})
	}
	st := c.agents["eu"].node.Table()
	t.Logf("every agent on a later term's table %s after the bucket was lost (term %d before, %d/%d now; lease %s, election TTL %s)",
		time.Since(lost).Round(10*time.Millisecond), before, st.Term, st.Epoch, tLease, tTTL)
	c.log.check(t)
}

// idleAPIPerAgentΔ is the idle bound gossip's package documentation
// states: JetStream API requests (nats-server's own count) per agent per Δ.
// An idle cluster makes about one per Δ in all — the coordinator lists the
// stored table chunks (STREAM.INFO) after each store to purge superseded
// ones — and the agents none: their head watches are ordered consumers
// made once per connection.
const idleAPIPerAgentΔ = 1.0

// TestClusterIdleJetStreamAPI is issue 17's defect 1: an idle cluster must
// not spin its table watches. It reads the embedded server's own count of
// JetStream API requests over a window of idle coordination and divides
// it by the tables the agents applied in that window (one per agent per
// Δ: a count of work done, so a slow machine makes fewer requests, not
// more per table). It bounds the direct gets too (the election's polls
// and the head rereads, which nats-server does not count as API
// requests): per agent per Δ at most Δ/poll + Δ/5 s + 1 (the leader's
// renewal reads). Fails on 75da260: watchHead handed kv.Watch a context
// it cancelled on return, nats.go stopped the watch with it, and each
// agent re-created it in a loop — 696 API requests per agent per Δ.
func TestClusterIdleJetStreamAPI(t *testing.T) {
	c := newTCluster(t)
	c.startAll()
	c.leader(10*time.Second, "")
	applied := func() int {
		n := 0
		for _, a := range c.agents {
			n += a.tables()
		}
		return n
	}
	waitFor(t, 15*time.Second, "every agent on a table", func() bool {
		for _, a := range c.agents {
			if !a.node.Table().HasTable {
				return false
			}
		}
		return true
	})
	time.Sleep(tLease) // past the term's start-up (its head reads, the first consumers)
	nc, err := nats.Connect(c.nats.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var gets atomic.Int64
	sub, err := nc.Subscribe("$JS.API.DIRECT.GET.>", func(*nats.Msg) { gets.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	api0, _ := c.nats.JetStreamAPI()
	t0 := applied()
	start := time.Now()
	waitFor(t, 60*time.Second, "30 more tables applied", func() bool { return applied() >= t0+30 })
	api1, errs := c.nats.JetStreamAPI()
	tables := applied() - t0
	perTable := float64(api1-api0) / float64(tables)
	getsPer := float64(gets.Load()) / float64(tables)
	getsBound := float64(tΔ)/float64(tTTL/6) + float64(tΔ)/float64(5*time.Second) + 1
	t.Logf("idle: %d JetStream API requests (%d errors since start) and %d direct gets for %d tables applied in %s: %.2f and %.2f per agent per Δ",
		api1-api0, errs, gets.Load(), tables, time.Since(start).Round(time.Millisecond), perTable, getsPer)
	if perTable > idleAPIPerAgentΔ {
		t.Errorf("idle cluster: %.2f JetStream API requests per agent per Δ, want at most %v", perTable, idleAPIPerAgentΔ)
	}
	if getsPer > getsBound {
		t.Errorf("idle cluster: %.2f direct gets per agent per Δ, want at most %.2f", getsPer, getsBound)
	}
}

// TestClusterRefusesReportsForAnotherAgent is part of issue 17's defect 7:
// a report or acknowledgement published on one agent's subject that claims
// to come from another is refused by the coordinator and counted
// (meridian_cluster_invalid_messages_total{reason="sender"}). With
// per-agent NATS credentials an agent may publish only on its own
// subjects, so it cannot speak for another. Fails on 201a75b, where the
// subject was dropped and the claim believed.
func TestClusterRefusesReportsForAnotherAgent(t *testing.T) {
	c := newTCluster(t)
	c.startAll()
	lead := c.leader(10*time.Second, "")
	tr := c.dial()
	sender := func(kind string) float64 {
		return counter(t, lead.reg, "meridian_cluster_invalid_messages_total", map[string]string{"kind": kind, "reason": "sender"})
	}
	rep0, ack0 := sender("report"), sender("ack")
	now := time.Now().UnixMicro()
	rep := &rebalance.Report{Region: "ap", Agent: "ap-1", Interval: now / tΔ.Microseconds(),
		Keys: []rebalance.KeyDemand{{Key: keyOf("forged"), Demand: rebalance.Demand{Offered: 1_000_000, OfferedCost: 1_000_000, Admitted: 1_000_000}}}}
	chunks, err := wire.EncodeReport(c.name, rep, now, wire.DefaultMaxMessage)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.PublishReport("us", "us-1", chunks); err != nil { // us-1's subject, ap-1's claim
		t.Fatal(err)
	}
	ack, err := wire.EncodeAck(c.name, wire.Ack{Region: "ap", Agent: "ap-1", Term: 1, Epoch: 1, Sent: now})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.PublishAck("us", "us-1", ack); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the report and the ack refused as another sender's", func() bool {
		return sender("report") > rep0 && sender("ack") > ack0
	})
	c.log.check(t)
}

// TestClusterNamesOnlyMembers is the rest of issue 17's defect 7: an agent
// whose memberlist key is wrong is refused by memberlist but still reaches
// NATS — its reports arrive, and it applies the tables it reads. No table
// may name it, so it runs every key at most at its safe share (its tables
// are applied reduced) and its reports buy its region nothing. Fails on
// 9e76ec6, where the first table after its first report named it.
func TestClusterNamesOnlyMembers(t *testing.T) {
	c := newTCluster(t)
	c.startAll()
	lead := c.leader(10*time.Second, "")
	wrong := make([]byte, 32)
	_, _ = rand.Read(wrong)
	if err := os.WriteFile(filepath.Join(c.dir, "wrong-gossip.key"), []byte(gossip.EncodeKey(wrong)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rogue := c.startAs("eu", func(cfg *agent.Config) {
		cfg.Agent = "eu-rogue"
		cfg.Cluster.Members.KeyFile = filepath.Join(c.dir, "wrong-gossip.key")
		cfg.Cluster.Coordinator.Candidate, cfg.Cluster.Coordinator.SignKeyFile = false, ""
	}, &shareLog{})
	sent := func() float64 {
		return counter(t, rogue.reg, "meridian_cluster_messages_total", map[string]string{"kind": "report", "direction": "out"})
	}
	// Its tenant's traffic makes it report demand on NATS.
	l := offerTo(rogue, "rogue-tenant", 50)
	defer l.end()
	since := time.Now()
	waitFor(t, 10*time.Second, "tables applied by the rogue agent and reports sent", func() bool {
		return rogue.tables() >= 3 && sent() > 0
	})
	// Several Δ later it is still unnamed, and membership never listed it.
	deadline := time.Now().Add(6 * tΔ)
	for time.Now().Before(deadline) {
		if st := rogue.node.Table(); st.HasTable && st.Named {
			t.Fatalf("table (%d, %d) names eu-rogue, whose memberlist key is wrong", st.Term, st.Epoch)
		}
		for _, m := range lead.cl.mem.Live() {
			if m.Agent == "eu-rogue" {
				t.Fatalf("membership lists eu-rogue: %+v", m)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("eu-rogue applied %d tables in %v, named in none", rogue.tables(), time.Since(since).Round(time.Millisecond))
	c.log.check(t)
}

// TestClusterNATSOutage is issue 17's NATS drill: every agent loses NATS
// at once (each dials through its own proxy, and all are cut), for less
// and for more than the lease. Shorter: nobody lapses and a tenant's
// traffic is admitted throughout. Longer: every agent lapses at its lease
// to min(last, safe), and once NATS is back every agent is named on a
// newer table and the tenant is admitted in full again — defect 2 kept 4
// of 5 agents at the safe share for minutes (the new term republished the
// expired leases and the next table's unchanged rows were not restored).
// Σ in force stays within 10⁶ from every agent's view; the times are
// reported, the deadlines only guard against hangs.
func TestClusterNATSOutage(t *testing.T) {
	for _, tc := range []struct {
		name   string
		outage time.Duration
		lapse  bool
	}{
		{"shorter than the lease", tLease / 2, false},
		{"longer than the lease", tLease + 2*time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newTCluster(t)
			proxies := make([]*proxy, 0, len(tNames))
			for _, r := range tNames {
				p := newProxy(t, strings.TrimPrefix(c.nats.URL(), "nats://"))
				c.urls[r] = "nats://" + p.addr()
				proxies = append(proxies, p)
			}
			c.startAll()
			c.leader(10*time.Second, "")
			key := keyOf("acme")
			l := c.hold("ap", "acme") // 400/s against ap's > 70 % of 1,000/s
			defer l.end()
			ap := c.agents["ap"]
			// The table's share takes effect at its effective time, with
			// the tokens the lower share left: wait until it admits.
			t.Logf("ap admitting acme's traffic in full %v after its table said so", admitting(t, l, "acme at ap").Round(time.Millisecond))
			before := map[string]region.TableState{}
			for _, r := range tNames {
				before[r] = c.agents[r].node.Table()
			}
			for _, p := range proxies {
				p.cut()
			}
			cut := time.Now()
			offered, allowed := l.window(tc.outage)
			lapsed := 0
			for _, r := range tNames {
				if st := c.agents[r].node.Table(); st.Lapsed {
					lapsed++
					if time.Now().UnixMicro() < before[r].LeaseExpiry {
						t.Errorf("%s lapsed before its lease ended", r)
					}
				}
			}
			t.Logf("NATS down %v: %d of %d agents lapsed; ap admitted %d of acme's %d requests meanwhile", time.Since(cut).Round(time.Millisecond), lapsed, len(tNames), allowed, offered)
			if !tc.lapse && time.Now().UnixMicro() < before["ap"].LeaseExpiry && allowed < offered*95/100 {
				t.Errorf("ap admitted %d of %d requests within its lease, want all but a few", allowed, offered)
			}
			if tc.lapse {
				waitFor(t, 10*time.Second, "every agent lapsed", func() bool {
					for _, r := range tNames {
						if !c.agents[r].node.Table().Lapsed {
							return false
						}
					}
					return true
				})
			}
			for _, p := range proxies {
				p.restore()
			}
			took := waitFor(t, 30*time.Second, "every agent named on a newer table, ap holding acme's budget", func() bool {
				for _, r := range tNames {
					st, b := c.agents[r].node.Table(), before[r]
					if st.Lapsed || !st.Named || st.Term < b.Term || (st.Term == b.Term && st.Epoch <= b.Epoch) {
						return false
					}
				}
				s, _ := ap.share(key)
				return s > 700_000
			})
			// And the node runs the table's share, not the safe one: once
			// that table is in force (the share that restores ap may be an
			// increase, effective Fence + MaxSkew after its proof: 250 ms
			// of a second measured at once ran the safe share, and the
			// check failed now and then), ap admits all of acme's 400/s
			// over the next second.
			waitFor(t, 5*time.Second, "ap's table in force", func() bool {
				st := ap.node.Table()
				term, epoch := ap.node.InForce(time.Now().UnixMicro())
				return term == st.Term && epoch == st.Epoch
			})
			offered, allowed = l.window(time.Second)
			if allowed < offered*95/100 {
				t.Errorf("after NATS returned ap admits %d of acme's %d requests a second; its table gives it > 70 %% of 1,000/s", allowed, offered)
			}
			t.Logf("NATS back: every agent on a newer table and ap admitting in full %v later (then %d of %d a second admitted)", took.Round(time.Millisecond), allowed, offered)
			if l.failed.Load() > 0 {
				t.Errorf("%d decisions failed", l.failed.Load())
			}
			c.log.check(t)
		})
	}
}

// TestClusterSIGTERMUnderLoad is issue 17's drain drill: the agent serving
// a tenant's traffic gets SIGTERM (main turns it into the end of Run's
// context, as here). Through its drain delay it keeps answering — none of
// the load's decisions fails and readiness is gone at once — then leaves
// memberlist; its share stays its own until its lease plus MaxSkew (the
// others' shares never rise into it earlier, from the merged log), and when
// the traffic moves to another region that region takes the budget over.
// Restarted (a rolling restart), it gets its share back.
func TestClusterSIGTERMUnderLoad(t *testing.T) {
	c := newTCluster(t)
	const drain = 4 * tΔ
	c.drain = drain
	c.startAll()
	victim := besides(c.leader(10*time.Second, ""))
	key := keyOf("acme")
	l := c.hold(victim, "acme")
	a := c.agents[victim]
	t.Logf("%s admitting acme's traffic in full %v after its table said so", victim, admitting(t, l, "acme at "+victim).Round(time.Millisecond))
	lease := a.node.Table().LeaseExpiry
	term := time.Now()
	a.cancel() // SIGTERM
	offered, allowed := l.window(drain / 2)
	rr := httptest.NewRecorder()
	a.agent.Handler().ServeHTTP(rr, httptest.NewRequest("GET", "/readyz", nil))
	if rr.Code != http.StatusServiceUnavailable {
		t.Errorf("/readyz during the drain: %d, want 503", rr.Code)
	}
	<-a.done
	stopped := time.Since(term)
	l.end()
	a.stop()
	if n := l.failed.Load(); n > 0 {
		t.Errorf("%d of the load's decisions failed during the drain", n)
	}
	if allowed < offered*95/100 {
		t.Errorf("during the drain %s admitted %d of %d requests, want all but a few (it holds > 70 %%)", victim, allowed, offered)
	}
	t.Logf("%s drained for %v (drain_delay %v), admitting %d of %d meanwhile", victim, stopped.Round(time.Millisecond), drain, allowed, offered)
	other := "ap"
	o := c.takeOver(other, "acme", 700_000)
	defer o.end()
	t.Logf("%s took acme's budget over %v after %s got SIGTERM (its lease ran %v past it)", other, (time.Since(term)).Round(time.Millisecond), victim, time.Duration(lease-term.UnixMicro())*time.Microsecond)
	c.log.heldUntil(t, key, victim, lease+tSkew.Microseconds())
	o.end()
	c.start(victim)
	back := c.offer(victim, "acme", 400)
	defer back.end()
	took := waitFor(t, 60*tΔ, victim+" holding acme's budget again", func() bool {
		s, _ := c.agents[victim].share(key)
		return s > 700_000
	})
	t.Logf("%s, restarted, holds acme's budget again %v after its first offer", victim, took.Round(time.Millisecond))
	c.log.check(t)
}

// TestClusterCoordinatorCrashResumes is issue 17's defect 5 on the path
// users run: the coordinator's process dies with its own agent, in a
// region that has a second agent on the same store. The new term used to
// wait for the dead agent — in learning mode, then for the first decrease
// of its region — until its lease had passed twice over. With the region
// fence, the second agent's acknowledgement of each table, carrying the
// fence it raised in the region's store, proves that table in force in
// the whole region (the store refuses what the dead agent would decide
// under an older one), so the tenant that moves out of the region right
// after the crash gets its share where it went as soon as the new term has
// two acknowledgements. The time is reported (the deadline only guards
// against a hang); Σ in force stays at most 10⁶ ppm throughout, and the
// second agent runs nothing above its table.
func TestClusterCoordinatorCrashResumes(t *testing.T) {
	c := newTCluster(t)
	c.startAll()
	key := keyOf("acme")
	old := c.leader(10*time.Second, "")
	second := c.startAs(old.name, func(cfg *agent.Config) {
		cfg.Agent = old.name + "-2"
		cfg.Cluster.Coordinator.Candidate, cfg.Cluster.Coordinator.SignKeyFile = false, ""
	}, c.log)
	waitFor(t, 10*time.Second, old.name+"-2 named on a table", func() bool { return second.node.Table().Named })
	l := offerTo(second, "acme", 400)
	waitFor(t, 15*time.Second, old.name+" holding most of acme", func() bool {
		s, _ := second.share(key)
		return s > 700_000
	})
	to := besides(old)
	killed := time.Now()
	old.crash()
	l.end()
	moved := c.offer(to, "acme", 400)
	defer moved.end()
	next := c.leader(tTTL+5*time.Second, old.name)
	elected := time.Since(killed)
	waitFor(t, 4*tLease+15*time.Second, to+" given acme's share", func() bool {
		s, _ := c.agents[to].share(key)
		return s > 500_000
	})
	t.Logf("cluster_test: coordinator crash with a second agent in its region: %s coordinates %v after the crash; %s holds acme's share %v after it (election TTL %v, Δ %v, lease %v)",
		next.name, elected.Round(time.Millisecond), to, time.Since(killed).Round(time.Millisecond), tTTL, tΔ, tLease)
	if n := counter(t, second.reg, "meridian_fence_raise_errors_total", nil); n != 0 {
		t.Errorf("%s-2: %v fence raises failed", old.name, n)
	}
	c.log.check(t)
}
