package agent

import (
	"context"
	"time"

	"github.com/meridian-quota/meridian/rebalance"
)

// Control links the agent to its cluster's coordinator; package gossip
// provides one over NATS. Without one (SetControl not called) the agent
// runs standalone: every key at its region's safe share, which a
// standalone configuration makes the whole budget (Config.NodeConfig).
//
// The agent's loop goroutine — the only one that calls the node's Tick
// and Apply — calls Report, InForce and Applied, and receives from Tables;
// none of them may block. Status is called from HTTP handlers.
type Control interface {
	// Report hands over one closed interval's demand report.
	Report(rep *rebalance.Report)
	// InForce acknowledges the table now in force (its effective time
	// passed on this agent's clock); called when it changes.
	InForce(term, epoch uint64)
	// Tables delivers tables to apply, signature verified, in order.
	Tables() <-chan *rebalance.Table
	// Applied reports what the node made of a table from Tables: nil, or
	// why it refused it (region.ErrStaleTable, region.ErrBadTable).
	Applied(t *rebalance.Table, err error)
	// Flush sends what Report and InForce queued, waiting at most until
	// ctx ends. The agent calls it once, draining.
	Flush(ctx context.Context) error
	// Status is shown in GET /v1/table.
	Status() ControlStatus
}

// ControlStatus is the agent's view of its cluster, shown in GET /v1/table.
type ControlStatus struct {
	Cluster   string `json:"cluster"`
	Connected bool   `json:"connected"` // to NATS
	// Coordinator is the coordinator's id (region/agent) and term as the
	// election key shows them; "" when none holds it.
	Coordinator     string `json:"coordinator"`
	CoordinatorTerm uint64 `json:"coordinator_term"`
	// Leader is set while this agent is the coordinator.
	Leader bool `json:"leader"`
	// TableAgeMs is how long ago the newest table received was issued
	// (by this agent's clock against the coordinator's); absent before any.
	TableAgeMs float64 `json:"table_age_ms,omitempty"`
	// Members is the live agents membership sees, by region.
	Members map[string]int `json:"members,omitempty"`
	// ClockSkewMs is, per region, how far its store's clock was from the
	// coordinator's when its last report arrived (positive: ahead); only
	// on the coordinator.
	ClockSkewMs map[string]float64 `json:"clock_skew_ms,omitempty"`
}

// SetControl connects the agent to a coordinator; call it before Run.
func (a *Agent) SetControl(c Control) { a.ctrl = c }

// drainReport closes the interval in progress when the agent stops, so the
// demand it saw last is not lost: it waits (at most one interval, or until
// ctx ends) for the interval to close, ticks the node and flushes the
// report to the coordinator.
func (a *Agent) drainReport(ctx context.Context) {
	if a.ctrl == nil {
		return
	}
	dt := a.node.Interval()
	now := a.now()
	step := dt.Microseconds()
	if wait := time.Duration((now/step+1)*step-now) * time.Microsecond; wait > 0 {
		t := time.NewTimer(wait + time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	if rep := a.node.Tick(a.now()); rep != nil {
		a.ctrl.Report(rep)
	}
	_ = a.ctrl.Flush(ctx)
}
