package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-quota/meridian/gossip"
	"github.com/meridian-quota/meridian/rebalance"
	"github.com/meridian-quota/meridian/region"
	"github.com/meridian-quota/meridian/region/agent"
)

// control adapts a gossip.Loop to the agent's Control interface.
type control struct{ *gossip.Loop }

func (c control) Status() agent.ControlStatus {
	s := c.Loop.Status()
	cs := agent.ControlStatus{Cluster: s.Cluster, Connected: s.Connected, Coordinator: s.Coordinator,
		CoordinatorTerm: s.CoordinatorTerm, Leader: s.Leader, Members: s.Members, ClockSkewMs: s.ClockSkew}
	if s.TableIssued > 0 {
		cs.TableAgeMs = float64(time.Now().UnixMicro()-s.TableIssued) / 1000
	}
	return cs
}

// coordinatorConfig is the rebalance core's configuration from the
// agent's: the node and the coordinator must agree on Δ, the floors and
// the skew bound.
func coordinatorConfig(cfg *agent.Config) rebalance.Config {
	rc := rebalance.DefaultConfig(cfg.Regions...)
	cc := cfg.Cluster.Coordinator
	rc.Interval = time.Duration(cfg.Interval)
	if cc.Lease > 0 {
		rc.Lease = time.Duration(cc.Lease)
	}
	if cc.MaxSkew > 0 {
		rc.MaxSkew = time.Duration(cc.MaxSkew)
	}
	if cc.Fence > 0 {
		rc.Fence = time.Duration(cc.Fence)
	}
	if cc.Strategy != "" {
		rc.Strategy = cc.Strategy
	}
	if cc.Hysteresis > 0 {
		rc.Hysteresis = cc.Hysteresis
	}
	if cc.HysteresisNeed > 0 {
		rc.HysteresisNeed = cc.HysteresisNeed
	}
	if cc.MaxAgentsPerRegion > 0 {
		rc.MaxAgentsPerRegion = cc.MaxAgentsPerRegion
	}
	rc.SafeFraction = cfg.ResolvedSafeFraction() // the node's floors are the coordinator's
	rc.IdleSafeFraction = cfg.ResolvedIdleSafeFraction()
	if w := cfg.Cluster.Coordinator.FloorWindow; w > 0 {
		rc.FloorWindow = time.Duration(w)
	}
	return rc
}

// nodeConfig is the region node's configuration from the agent's
// (agent.Config.NodeConfig: standalone, the whole budget).
func nodeConfig(cfg *agent.Config) region.Config { return cfg.NodeConfig() }

// regionFenced reports whether an agent of cfg raises its region's fence
// as it applies each table, its decisions carrying it
// (region.Config.Fence, agent.SetFencer): in a cluster, on one Redis (not
// a Cluster, where no key is read by every slot's script) or an in-memory
// store.
func regionFenced(cfg *agent.Config) bool {
	return cfg.Cluster.Enabled() && cfg.Redis.Kind() != agent.RedisCluster
}

// cluster is an agent's running link to its cluster.
type cluster struct {
	tr   *gossip.Transport
	mem  *gossip.Members
	loop *gossip.Loop
	ctrl agent.Control // what the agent is given: the loop (tests wrap it)
}

// joinCluster dials NATS, joins memberlist and builds the loop; nothing
// runs until run is called. storeClock stamps reports with the region
// store's clock.
func joinCluster(ctx context.Context, cfg *agent.Config, node *region.Node, reg prometheus.Registerer,
	storeClock func(context.Context) (int64, error), version string, log *slog.Logger) (*cluster, error) {
	cl := cfg.Cluster
	nc := gossip.DefaultNATSConfig()
	nc.URLs = cl.NATS.URLs
	nc.CredsFile, nc.NKeySeedFile = cl.NATS.CredsFile, cl.NATS.NKeySeedFile
	nc.User, nc.PasswordFile, nc.PasswordEnv = cl.NATS.User, cl.NATS.PasswordFile, cl.NATS.PasswordEnv
	nc.TokenFile, nc.TokenEnv = cl.NATS.TokenFile, cl.NATS.TokenEnv
	nc.TLS.CAFile, nc.TLS.CertFile, nc.TLS.KeyFile = cl.NATS.CAFile, cl.NATS.CertFile, cl.NATS.KeyFile
	if cl.NATS.Bucket != "" {
		nc.Bucket = cl.NATS.Bucket
	}
	if cl.NATS.Replicas > 0 {
		nc.Replicas = cl.NATS.Replicas
	}
	lc := gossip.DefaultLoopConfig(cl.Name, cfg.Region, cfg.Agent, cfg.Regions...)
	lc.Coordinator = coordinatorConfig(cfg)
	lc.Candidate = cl.Coordinator.Candidate
	if cl.Coordinator.ElectionTTL > 0 {
		lc.Election.TTL = time.Duration(cl.Coordinator.ElectionTTL)
	}
	var errs []error
	var err error
	if lc.VerifyKeys, err = gossip.LoadVerifyKeys(cl.Coordinator.VerifyKeysFile, cl.Coordinator.VerifyKeysEnv); err != nil {
		errs = append(errs, fmt.Errorf("cluster.coordinator: %w", err))
	}
	if lc.Candidate {
		if lc.SignKey, err = gossip.LoadSignKey(cl.Coordinator.SignKeyFile, cl.Coordinator.SignKeyEnv); err != nil {
			errs = append(errs, fmt.Errorf("cluster.coordinator: %w", err))
		}
	}
	mc := gossip.DefaultMemberConfig()
	if cl.Members.Profile != "" {
		mc.Profile = cl.Members.Profile
	}
	mc.Bind, mc.Advertise, mc.Join = cl.Members.Bind, cl.Members.Advertise, cl.Members.Join
	mc.KeyFile, mc.KeyEnv, mc.AllowPlaintext = cl.Members.KeyFile, cl.Members.KeyEnv, cl.Members.AllowPlaintext
	for _, v := range []interface{ Validate() error }{&nc, &mc} {
		if err := v.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		if err := lc.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: cluster: %w", agent.ErrConfig, errors.Join(errs...))
	}
	tr, err := gossip.Dial(ctx, cl.Name, nc, log)
	if err != nil {
		return nil, fmt.Errorf("cluster.nats: %w", err)
	}
	role := "agent"
	if lc.Candidate {
		role = "coordinator-candidate"
	}
	mem, err := gossip.StartMembers(ctx, mc, gossip.Meta{Region: cfg.Region, Agent: cfg.Agent, Role: role, Version: version}, log)
	if err != nil {
		tr.Close()
		return nil, fmt.Errorf("cluster.members: %w", err)
	}
	loop, err := gossip.NewLoop(lc, gossip.NewPorts(tr, mem), node, reg, log)
	if err != nil {
		_ = mem.Leave(time.Second)
		tr.Close()
		return nil, err
	}
	if storeClock != nil {
		loop.SetStoreClock(storeClock)
	}
	return &cluster{tr: tr, mem: mem, loop: loop, ctrl: control{loop}}, nil
}

// run runs the loop until ctx ends, then leaves memberlist and closes NATS.
func (c *cluster) run(ctx context.Context) error {
	err := c.loop.Run(ctx)
	_ = c.mem.Leave(2 * time.Second)
	c.tr.Close()
	return err
}

// serveWithCluster runs the agent and, when it has one, its cluster link:
// the link outlives the agent's drain (which flushes the last report
// through it) and stops after.
func serveWithCluster(ctx context.Context, a *agent.Agent, cl *cluster, serve func(context.Context) error) error {
	if cl == nil {
		return serve(ctx)
	}
	a.SetControl(cl.ctrl)
	lctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var lerr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		lerr = cl.run(lctx)
	}()
	err := serve(ctx)
	stop()
	wg.Wait()
	return errors.Join(err, lerr)
}
