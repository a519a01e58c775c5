package gossip

import (
	"context"
	"crypto/ed25519"
	crand "crypto/rand"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-quota/meridian/gcra/memstore"
	"github.com/meridian-quota/meridian/gossip/memnet"
	"github.com/meridian-quota/meridian/internal/natstest"
	"github.com/meridian-quota/meridian/rebalance"
	"github.com/meridian-quota/meridian/region"
)

// The cross-transport test: one small cluster — three regions, one agent
// each, real region.Nodes on memstore, one candidate so the coordinator is
// deterministic, the proportional strategy — run twice through the same
// NewLoop, once on real NATS (embedded server) and once on gossip/memnet
// (real-time clock, no faults). Each agent's node is driven with the same
// decisions per report interval, in two phases of demand. In each phase
// the test waits until every node runs a table whose shares are the
// strategy's answer for that demand, and records the converged table's
// content (term, regions, per key its budget, shares and bursts, agents,
// policy version — not epochs, versions or times, which depend on
// timing). The two runs' records must be identical: if memnet lost a head
// compare-and-set, delivered a table NATS would not, or the Loop took
// another path on one of them, a table would differ or never converge.
// Waits poll with natsDeadline, which only guards against hangs.

// xtRegions are the cluster's regions, sorted as tables list them.
var xtRegions = []string{"ap", "eu", "us"}

const (
	xtΔ      = 300 * time.Millisecond
	xtPolicy = `
domains:
  - domain: api
    descriptors:
      - key: tenant
        rate_limit: {unit: second, requests_per_unit: 1000, burst: 100}
`
)

// xtPhase is one phase's decisions per report interval: by tenant, by
// region (in xtRegions order).
type xtPhase map[string][3]int

var xtPhases = []xtPhase{
	{"acme": {10, 60, 30}, "solo": {0, 20, 0}},
	{"acme": {50, 10, 40}, "solo": {0, 20, 0}},
}

// xtKey is tenant's key name.
func xtKey(tenant string) string {
	return region.KeyName("api", []region.Entry{{Key: "tenant", Value: tenant}})
}

// xtTarget is the proportional strategy's shares for phase p's demand,
// with the default floors (10 % split over three regions), by key.
func xtTarget(t *testing.T, p xtPhase) map[string][]uint32 {
	s, err := rebalance.NewStrategy("proportional", xtRegions, rebalance.Params{})
	if err != nil {
		t.Fatal(err)
	}
	safe := make([]uint32, len(xtRegions))
	for i := range safe {
		safe[i] = rebalance.PPM / 10 / uint32(len(xtRegions))
	}
	out := map[string][]uint32{}
	for tenant, n := range p {
		d := make([]float64, len(xtRegions))
		for i, c := range n {
			d[i] = float64(c) / xtΔ.Seconds()
		}
		shares := make([]uint32, len(xtRegions))
		s.Allocate(&rebalance.Input{Demand: d, Safe: safe}, shares)
		out[xtKey(tenant)] = shares
	}
	return out
}

// xtPorts are one agent's ports on one transport.
type xtNet func(t *testing.T, regionName string) Ports

// xtAgent is one agent of a run: its node, its loop and what it applied.
type xtAgent struct {
	idx  int
	node *region.Node
	loop *Loop

	mu      sync.Mutex
	applied []*rebalance.Table // every table the node accepted, in order
}

// xtContent is a table's content without what depends on timing.
func xtContent(tb *rebalance.Table) string {
	if tb == nil {
		return "none"
	}
	s := fmt.Sprintf("term %d regions %v agents %v policy %q", tb.Term, tb.Regions, tb.Agents, tb.PolicyVersion)
	for _, k := range tb.Keys {
		s += fmt.Sprintf("\n  %s budget %v shares %v bursts %v", k.Key, k.Budget, k.Shares, k.Bursts)
	}
	return s
}

// converged returns the content of the table a's node runs when it is the
// target's and the node applied it twice in a row (a renewal: the
// coordinator is no longer moving shares), "" otherwise.
func (a *xtAgent) converged(target map[string][]uint32) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := len(a.applied)
	if n < 2 {
		return ""
	}
	last, prev := a.applied[n-1], a.applied[n-2]
	if len(last.Keys) != len(target) || xtContent(last) != xtContent(prev) {
		return ""
	}
	for _, k := range last.Keys {
		if want, ok := target[k.Key]; !ok || !slices.Equal(k.Shares, want) {
			return ""
		}
	}
	if term, epoch := a.node.InForce(time.Now().UnixMicro()); term != last.Term || epoch != last.Epoch {
		return ""
	}
	return xtContent(last)
}

// drive is the agent's shell, as region/agent's loop: it applies the
// loop's tables, and every step ticks the node (handing its report to the
// loop) and acknowledges the table in force. At the first step of each
// report interval it makes that interval's decisions, after the Tick that
// closed the previous one, so every report counts exactly one phase's
// decisions for the interval.
func (a *xtAgent) drive(ctx context.Context, t *testing.T, phase *atomic.Int32) {
	Δ := xtΔ.Microseconds()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	open := int64(-1)
	var ackTerm, ackEpoch uint64
	var d region.Decision
	for {
		select {
		case <-ctx.Done():
			return
		case tb := <-a.loop.Tables():
			err := a.node.Apply(tb, time.Now().UnixMicro())
			if err == nil {
				a.mu.Lock()
				if n := len(a.applied); n > 0 && !tb.Newer(a.applied[n-1].Term, a.applied[n-1].Epoch) {
					t.Errorf("node %d applied (%d, %d) after (%d, %d)", a.idx, tb.Term, tb.Epoch, a.applied[n-1].Term, a.applied[n-1].Epoch)
				}
				a.applied = append(a.applied, tb)
				a.mu.Unlock()
			}
			a.loop.Applied(tb, err)
		case <-tick.C:
			now := time.Now().UnixMicro()
			if rep := a.node.Tick(now); rep != nil {
				a.loop.Report(rep)
			}
			if term, epoch := a.node.InForce(now); term != ackTerm || epoch != ackEpoch {
				ackTerm, ackEpoch = term, epoch
				a.loop.InForce(term, epoch)
			}
			if iv := now / Δ; iv != open {
				open = iv
				p := xtPhases[phase.Load()]
				for _, tenant := range slices.Sorted(maps.Keys(p)) {
					req := &region.Request{Domain: "api", Descriptors: []region.Descriptor{{Entries: []region.Entry{{Key: "tenant", Value: tenant}}}}, Cost: 1}
					for range p[tenant][a.idx] {
						if err := a.node.Decide(ctx, now, req, &d); err != nil {
							t.Errorf("decide: %v", err)
							return
						}
					}
				}
			}
		}
	}
}

// runCluster runs the cluster on net through both phases and returns the
// converged table's content in each, the tables the coordinator
// published, and the live agents by region the coordinator's loop sees at
// the end (nil without membership).
func runCluster(t *testing.T, net xtNet) (converged []string, published float64, members map[string]int) {
	sign, verify := xtKeyPair()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	// Stopped before the test's cleanups close the transports, so no loop
	// sees its transport closed under it.
	defer wg.Wait()
	defer cancel()
	var phase atomic.Int32
	agents := make([]*xtAgent, len(xtRegions))
	regs := make([]*prometheus.Registry, len(xtRegions))
	for i, r := range xtRegions {
		pol, err := region.ParsePolicy([]byte(xtPolicy))
		if err != nil {
			t.Fatal(err)
		}
		store, err := memstore.New(memstore.DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		ncfg := region.DefaultConfig(r, r+"-1", xtRegions...)
		ncfg.Interval, ncfg.MaxSkew = xtΔ, 50*time.Millisecond
		node, err := region.NewNode(ncfg, pol, store)
		if err != nil {
			t.Fatal(err)
		}
		lc := DefaultLoopConfig("xt", r, r+"-1", xtRegions...)
		lc.Coordinator.Interval = xtΔ
		lc.Coordinator.Lease = 3 * time.Second
		lc.Coordinator.MaxSkew = 50 * time.Millisecond
		lc.Coordinator.Fence = 200 * time.Millisecond
		lc.Coordinator.Strategy = "proportional"
		lc.Coordinator.Hysteresis = 1 // every move is published: no run stops short of the target
		lc.Election.TTL = time.Second
		lc.TickEvery = 50 * time.Millisecond
		lc.VerifyKeys = []ed25519.PublicKey{verify}
		if r == "eu" { // the one candidate: term 1, always eu's
			lc.Candidate, lc.SignKey = true, sign
		}
		regs[i] = prometheus.NewRegistry()
		loop, err := NewLoop(lc, net(t, r), node, regs[i], natsLogger(t, nil).With("agent", r))
		if err != nil {
			t.Fatal(err)
		}
		a := &xtAgent{idx: i, node: node, loop: loop}
		agents[i] = a
		wg.Add(2)
		go func() {
			defer wg.Done()
			if err := loop.Run(ctx); err != nil {
				t.Errorf("%s: Run: %v", r, err)
			}
		}()
		go func() { defer wg.Done(); a.drive(ctx, t, &phase) }()
	}
	for p := range xtPhases {
		phase.Store(int32(p))
		target := xtTarget(t, xtPhases[p])
		var got string
		eventually(t, natsDeadline*2, fmt.Sprintf("phase %d converged on %v", p, target), func() error {
			got = ""
			for _, a := range agents {
				c := a.converged(target)
				if c == "" || (got != "" && c != got) {
					return fmt.Errorf("%s runs %s", xtRegions[a.idx], xtContent(a.last()))
				}
				got = c
			}
			return nil
		})
		converged = append(converged, got)
	}
	return converged, counter(t, regs[1], "meridian_coordinator_tables_published_total"), agents[1].loop.Status().Members
}

// counter reads the counter name from reg.
func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no counter %s", name)
	return 0
}

func (a *xtAgent) last() *rebalance.Table {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.applied) == 0 {
		return nil
	}
	return a.applied[len(a.applied)-1]
}

var xtKeyPair = sync.OnceValues(func() (ed25519.PrivateKey, ed25519.PublicKey) {
	pub, priv, err := ed25519.GenerateKey(crand.Reader)
	if err != nil {
		panic(err)
	}
	return priv, pub
})

// TestCrossTransportSameTables runs the cluster on both transports, first
// without membership (the coordinator learns agents from their reports),
// then with it: real memberlist on loopback beside NATS, memnet's
// membership beside memnet. With membership the coordinator's term starts
// from the live members and its tables list them, so a transport whose
// membership reported other agents, or reported them late enough to
// change a table, would converge on other tables.
func TestCrossTransportSameTables(t *testing.T) {
	for _, members := range []bool{false, true} {
		t.Run(map[bool]string{false: "no-membership", true: "membership"}[members], func(t *testing.T) {
			crossTransport(t, members)
		})
	}
}

func crossTransport(t *testing.T, members bool) {
	srv := natstest.Start(t) // a bucket of its own: each run's election starts at term 1
	var seed string          // the first memberlist member's address: the others join it
	onNATS := func(t *testing.T, r string) Ports {
		var mem *Members
		if members {
			cfg := DefaultMemberConfig()
			cfg.Profile, cfg.Bind, cfg.AllowPlaintext = ProfileLocal, "127.0.0.1:0", true
			if seed != "" {
				cfg.Join = []string{seed}
			}
			mem = start(t, cfg, Meta{Region: r, Agent: r + "-1", Role: "agent", Version: "xt"}, natsLogger(t, nil))
			if seed == "" {
				seed = mem.Addr()
			}
		}
		return NewPorts(dialT(t, "xt", natsTestConfig(srv.URL())), mem)
	}
	n, err := memnet.New(memnet.NewRealClock(), rand.New(rand.NewPCG(1, 2)), memnet.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	onMemnet := func(t *testing.T, r string) Ports {
		a := n.Agent(r, r+"-1")
		p := Ports{Bus: a, Tables: a, Election: Election{KV: a, Key: "leader"}}
		if members {
			p.Members = a
		}
		return p
	}

	var natsTables, memTables []string
	var natsPub, memPub float64
	var natsMembers, memMembers map[string]int
	t.Run("nats", func(t *testing.T) { natsTables, natsPub, natsMembers = runCluster(t, onNATS) })
	t.Run("memnet", func(t *testing.T) { memTables, memPub, memMembers = runCluster(t, onMemnet) })
	want := map[string]int{"ap": 1, "eu": 1, "us": 1}
	if !members {
		want = nil
	}
	if !maps.Equal(natsMembers, want) || !maps.Equal(memMembers, want) || (natsMembers == nil) != (want == nil) || (memMembers == nil) != (want == nil) {
		t.Errorf("the coordinator's loop sees members %v on NATS, %v on memnet; want %v", natsMembers, memMembers, want)
	}
	if t.Failed() {
		return
	}
	if natsPub == 0 || memPub == 0 {
		t.Fatalf("tables published by the coordinator: %v on NATS, %v on memnet; want some on both", natsPub, memPub)
	}
	t.Logf("tables published: %v on NATS, %v on memnet", natsPub, memPub)
	for p := range xtPhases {
		if natsTables[p] != memTables[p] {
			t.Errorf("phase %d: converged tables differ\nNATS:   %s\nmemnet: %s", p, natsTables[p], memTables[p])
		} else {
			t.Logf("phase %d, both: %s", p, natsTables[p])
		}
	}
}
