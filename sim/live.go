package sim

import (
	"slices"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/region"
)

// Arrival is one request a run's workload offers: at T (µs from the start
// of the run), for key Key (an index into KeyNames) in region Region (an
// index into the scenario's regions), of Cost.
type Arrival struct {
	T           int64
	Key, Region int
	Cost        int64
}

// OnArrival makes the run call f with every request its workload offers,
// retries included, in time order, before the request is decided — also
// those a region that is down drops. Set it before Simulate. `meridian
// demo` replays them through a live cluster, so the live score and the
// simulated one are for the same requests.
func (r *Run) OnArrival(f func(Arrival)) { r.onArrival = f }

// Policy is the policy the run's nodes decide with: one limit per key.
func (r *Run) Policy() *region.Policy { return r.policy }

// KeyNames are the run's keys (canonical key names), most popular first.
func (r *Run) KeyNames() []string {
	out := make([]string, len(r.keys))
	for i := range r.keys {
		out[i] = r.keys[i].name
	}
	return out
}

// Budgets are the keys' global limits, in KeyNames order.
func (r *Run) Budgets() []gcra.Limit {
	out := make([]gcra.Limit, len(r.keys))
	for i := range r.keys {
		out[i] = r.keys[i].budget
	}
	return out
}

// Request is the request the run offers for key i (cost 1), a copy the
// caller may change.
func (r *Run) Request(i int) region.Request {
	q := r.keys[i].req
	q.Cost = 1
	q.Descriptors = slices.Clone(q.Descriptors)
	for j := range q.Descriptors {
		q.Descriptors[j].Entries = slices.Clone(q.Descriptors[j].Entries)
	}
	return q
}
