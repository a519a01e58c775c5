package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/region"
)

// maxReserveWait caps reserve_max_wait (gcra's window cap is far beyond
// any sensible wait).
const maxReserveWait = time.Hour

func (a *Agent) handleReserve(rw http.ResponseWriter, r *http.Request) {
	var in ReserveRequest
	if !a.decodeBody(rw, r, "reserve", &in) {
		return
	}
	wait := time.Duration(in.MaxWaitMs * float64(time.Millisecond))
	if bound := a.cfg.ReserveMaxWait.D(); !(in.MaxWaitMs >= 0) || wait > bound {
		a.badHTTP(rw, fmt.Sprintf("reserve: max_wait_ms must be in [0, %d] (the agent's reserve_max_wait)", bound.Milliseconds()))
		return
	}
	w := a.pool.Get().(*work)
	defer a.pool.Put(w)
	if err := a.fromRLS(rlsOf(&in.DecideRequest), w); err != nil {
		a.badHTTP(rw, "reserve: "+err.Error())
		return
	}
	err := a.node.Reserve(r.Context(), a.now(), &w.req, wait, &w.d)
	switch {
	case errors.Is(err, region.ErrNoReserve):
		http.Error(rw, "reserve: "+err.Error(), http.StatusUnprocessableEntity)
		return
	case err != nil:
		a.badHTTP(rw, "reserve: "+err.Error())
		return
	}
	if err := storeFailed(&w.d); err != nil {
		writeError(rw, http.StatusServiceUnavailable, "reserve: "+err.Error())
		return
	}
	out := ReserveResponse{Booked: w.d.Allowed, WaitMs: ms(w.d.Result.Wait)}
	if !w.d.Allowed && w.d.Result.RetryAfter != gcra.Never {
		out.RetryAfterMs = ms(w.d.Result.RetryAfter)
	}
	a.count("http", w.d.Allowed)
	writeJSON(rw, out)
}

func (a *Agent) badHTTP(rw http.ResponseWriter, msg string) {
	a.errors.Inc()
	http.Error(rw, msg, http.StatusBadRequest)
}

// writeError answers code with an ErrorResponse.
func writeError(rw http.ResponseWriter, code int, msg string) {
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(code)
	_ = json.NewEncoder(rw).Encode(ErrorResponse{Error: msg})
}

func writeJSON(rw http.ResponseWriter, v any) {
	rw.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(rw).Encode(v)
}

// TableView is GET /v1/table: the table in force.
type TableView struct {
	HasTable      bool    `json:"has_table"`
	Term          uint64  `json:"term"`
	Epoch         uint64  `json:"epoch"`
	InForceTerm   uint64  `json:"in_force_term"`
	InForceEpoch  uint64  `json:"in_force_epoch"`
	LeaseExpiryUs int64   `json:"lease_expiry_us"`
	LeaseLeftMs   float64 `json:"lease_left_ms"`
	Lapsed        bool    `json:"lapsed"`
	// Named says whether the table names this agent; an agent it does not
	// name runs every key at min(share, safe share).
	Named         bool   `json:"named"`
	Keys          int    `json:"keys"`
	PolicyVersion string `json:"policy_version"`
	NowUs         int64  `json:"now_us"`
	// Cluster is the coordinator link's view; absent when standalone.
	Cluster *ControlStatus `json:"cluster,omitempty"`
}

func (a *Agent) handleTable(rw http.ResponseWriter, r *http.Request) {
	now := a.now()
	st := a.node.Table()
	v := TableView{HasTable: st.HasTable, Term: st.Term, Epoch: st.Epoch, LeaseExpiryUs: st.LeaseExpiry,
		Lapsed: st.Lapsed, Named: st.Named, Keys: st.Keys, PolicyVersion: a.node.Policy().Version(), NowUs: now}
	v.InForceTerm, v.InForceEpoch = a.node.InForce(now)
	if st.HasTable {
		v.LeaseLeftMs = float64(st.LeaseExpiry-now) / 1000
	}
	if a.ctrl != nil {
		cs := a.ctrl.Status()
		v.Cluster = &cs
	}
	writeJSON(rw, v)
}

// KeyView is GET /v1/keys/{key}: one key's state as this region runs it,
// read with a peek (nothing consumed).
type KeyView struct {
	Key string `json:"key"`
	// Limit is the global limit sold; Regional the limit this region runs
	// the key at now, and Share its part of the global rate.
	Limit    string  `json:"limit"`
	Regional string  `json:"regional"`
	Share    float64 `json:"share"`
	NowUs    int64   `json:"now_us"`
	// TATUs is the key's theoretical arrival time (now when rested);
	// Remaining and NextAdmissionMs what a cost-1 request meets now.
	TATUs           int64   `json:"tat_us"`
	Remaining       int64   `json:"remaining"`
	NextAdmissionMs float64 `json:"next_admission_ms"`
}

func (a *Agent) handleKey(rw http.ResponseWriter, r *http.Request) {
	name := strings.TrimPrefix(r.URL.Path, "/v1/keys/")
	domain, entries, err := region.ParseKeyName(name)
	if err != nil {
		a.badHTTP(rw, err.Error())
		return
	}
	w := a.pool.Get().(*work)
	defer a.pool.Put(w)
	w.desc = append(w.desc[:0], region.Descriptor{Entries: entries})
	w.req = region.Request{Domain: domain, Descriptors: w.desc, Cost: 0}
	now := a.now()
	if err := a.node.Decide(r.Context(), now, &w.req, &w.d); err != nil {
		a.badHTTP(rw, err.Error())
		return
	}
	m := w.d.MatchOf(0)
	if m == nil {
		http.Error(rw, "no limit applies to "+name, http.StatusNotFound)
		return
	}
	res := &m.Result
	reg := res.Limit
	v := KeyView{Key: name, Limit: m.Rule.Limit.String(), Regional: reg.String(), NowUs: now,
		TATUs: now + res.ResetAfter.Microseconds(), Remaining: res.Remaining}
	if t := reg.IntervalMicros(); t > 0 {
		v.Share = float64(m.Rule.Limit.IntervalMicros()) / float64(t)
		// A cost-1 request fits once TAT + T − now ≤ Burst·T.
		v.NextAdmissionMs = float64(max(0, res.ResetAfter.Microseconds()+t-reg.Burst()*t)) / 1000
	}
	writeJSON(rw, v)
}
