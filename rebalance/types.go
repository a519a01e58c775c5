package rebalance

import (
	"slices"

	"github.com/meridian-quota/meridian/gcra"
)

// Demand is what one agent saw of one key in one report interval. Offered
// (admitted + denied) drives allocation: admitted alone is censored by the
// share the region already had.
type Demand struct {
	Offered     int64 // requests
	OfferedCost int64 // cost units
	Admitted    int64 // cost units admitted
	Denied      int64 // cost units denied
}

// KeyDemand is one key's demand in a report.
type KeyDemand struct {
	Key string
	Demand
}

// Report is one agent's demand report for one closed interval of length Δ
// (interval index i covers [i·Δ, (i+1)·Δ)), with the table it had in force
// and its policy version. Keys lists only keys with demand.
type Report struct {
	Region        string
	Agent         string
	Interval      int64
	Term, Epoch   uint64 // the table in force at the agent at the end of the interval
	PolicyVersion string
	Keys          []KeyDemand
	// Features are the control-plane features the agent's reader handles
	// (gossip/wire's Feature bits); the coordinator uses one only once
	// every agent its table names has reported it. The core reads only
	// AgentIdleFloors.
	Features uint32
	// Delta marks a report that lists only the keys whose demand changed
	// materially since the agent last listed them, a key whose demand
	// ended listed with zero counts: the coordinator keeps the agent's
	// last demand for every key it does not list (Coordinator.Observe). A
	// full report (Delta false) replaces all of it. An agent sends delta
	// reports only to a coordinator whose tables advertise reading them
	// (Table.Features).
	Delta bool
}

// Member is one live agent as membership sees it.
type Member struct {
	Region string
	Agent  string
}

// KeyShares is one key's row of a share table: per region (in the table's
// region order) the share in ppm and the burst. The regional limits are
// derived from them and the budget (Limits, Limit) — the same for every
// reader.
type KeyShares struct {
	Key    string
	Budget gcra.Limit
	Shares []uint32
	// Bursts is each region's burst (events). The coordinator splits the
	// budget's burst by the shares (SplitBurst) and moves bursts break
	// before make like shares: a table that lowers one region's burst
	// while raising another's would let both run at once. A row without
	// Bursts (len ≠ len(Shares)) derives them from the shares.
	Bursts []int64
	// Version counts the changes to this key's shares, one per table that
	// changed them: the epoch a region passes to its store for this key
	// (gcra.Version.Epoch), so the key's state is converted only when its
	// limit really changed and consecutive limits have consecutive tags.
	Version uint64
}

// Table is the coordinator's assignment. Tables are ordered by (Term,
// Epoch). A region applies a table's shares from Effective on; Leases[r] is
// the instant (µs on the coordinator's clock, like Issued) until which
// region r may run on it without hearing from the coordinator: an absolute
// time, not a duration.
// Agents lists, per region, the agents the table names (those whose
// acknowledgements an increase waits for).
type Table struct {
	Term          uint64
	Epoch         uint64
	Issued        int64 // µs
	Effective     int64 // µs
	PolicyVersion string
	Regions       []string
	Leases        []int64    // µs, per region: lease expiry instants
	Agents        [][]string // per region, sorted
	Keys          []KeyShares
	// Shadow marks a table computed by a shadow coordinator: for display,
	// never to be published or applied.
	Shadow bool
	// Resync is per region (empty, or in Regions order) the agents whose
	// next report should be full, sorted: the coordinator read a delta
	// report from each after missing one of its reports, or naming a key
	// it did not know yet, so the demand it holds may be stale. In the
	// header, like Features.
	Resync [][]string
	// Features are what the coordinator that issued the table reads beyond
	// the base format (FeatureDeltaReports): an agent uses one only while
	// the table it last applied has it. It is in the table's header, not
	// its rows (it is not part of their digest). The coordinator sets it.
	Features uint32
	// BlindUntil (µs, on the coordinator's clock; 0: none) is set while
	// the issuing term is blind: it began with no stored table to start
	// from, so until this instant agents may still run an earlier term's
	// tables that it never read — shares and bursts its rows do not count.
	// A later term that starts from this table inherits the wait
	// (Coordinator.StartTerm). In the header, like Features.
	BlindUntil int64
}

// AgentIdleFloors is a bit of Report.Features: the agent runs a key no
// table names at its idle floor (region.Config.IdleSafeFraction), not its
// safe share. The coordinator lowers a region's floor of a key to the idle
// floor (Config.IdleSafeFraction) only while every agent it knows and every
// member says so: an agent of an earlier release runs such a key at its
// safe share, which a key's idle floors would not leave it. gossip/wire's
// reader feature bits stay below it.
const AgentIdleFloors uint32 = 1 << 16

// Table feature bits (Table.Features).
const (
	// FeatureDeltaReports: the coordinator reads delta reports
	// (Report.Delta) and keeps each agent's last demand for the keys they
	// do not list (Coordinator.Observe).
	FeatureDeltaReports uint32 = 1 << 0

	// FeatureCostDemand: the coordinator reads a listed key's offered cost
	// (Demand.OfferedCost) and nothing else of its demand, so an agent
	// lists each key with its offered cost alone; the request count,
	// admitted and denied stay with the agent (its metrics). They were
	// about a third of a listed key's bytes on the bus.
	FeatureCostDemand uint32 = 1 << 1
)

// Newer reports whether t is ordered after (term, epoch).
func (t *Table) Newer(term, epoch uint64) bool {
	return t.Term > term || (t.Term == term && t.Epoch > epoch)
}

// Limits derives the row's regional limits into dst (resized to
// len(Shares)) and returns it: T_r = ceil(T·10⁶/s_r) from the budget's
// rounded emission interval, with the row's Bursts — or, in a row without
// them, the budget's burst split over the regions by SplitBurst, every
// region with a share counting as one with demand and no floors (a reader
// does not know the other regions' safe shares; the coordinator writes
// Bursts in every row it publishes, split with the floors).
func (ks *KeyShares) Limits(dst []gcra.Limit) []gcra.Limit {
	n := len(ks.Shares)
	dst = slices.Grow(dst[:0], n)[:n]
	if len(ks.Bursts) == n {
		for i, s := range ks.Shares {
			dst[i] = RegionalLimit(ks.Budget, s, ks.Bursts[i])
		}
		return dst
	}
	var wa [16]float64
	var ba [16]int64
	var ha [16]bool
	w, b, has := wa[:0], ba[:0], ha[:0]
	if n <= len(wa) {
		w, b, has = wa[:n], ba[:n], ha[:n]
	} else {
		w, b, has = make([]float64, n), make([]int64, n), make([]bool, n)
	}
	for i, s := range ks.Shares {
		has[i] = s > 0
	}
	Derive(ks.Budget, ks.Shares, nil, has, dst, w, b)
	return dst
}

// Limit returns region r's limit (r indexes the table's Regions).
func (ks *KeyShares) Limit(r int) gcra.Limit {
	var la [16]gcra.Limit
	return ks.Limits(la[:0])[r]
}

// splitRow writes the bursts a row of shares gives under budget (Derive,
// every region with a share counting as one with demand), each region at
// least the burst it runs at its safe share: safe[r] ppm of n regions
// (SafeLimit). Σ bursts over regions, each the table's or — for a region
// that runs its safe share — its safe burst, never exceeds the budget's
// burst.
func splitRow(budget gcra.Limit, shares, safe []uint32, out []int64) {
	split(budget, shares, safe, out, false)
}

// splitHeld is splitRow for shares in force that may sum below PPM while
// an increase waits (a budget changed under them): those shares get that
// part of the burst, not all of it. The ppm no region holds count as one
// more region, which takes its part and keeps none of it beyond what the
// floors need (no region is owed a unit for having a share: with a burst
// smaller than the regions that unit is the one they may still hold),
// because they may still be run by a region that has not yet applied the
// decrease: splitting the whole
// burst over the rest would give it away twice (explorer schedule 7173 of
// seed 1: a budget raised mid-transition split 55 over shares summing to
// 86.7 %, and a region still on the table before the decrease took Σ
// bursts to 58). For shares summing to PPM it is splitRow.
func splitHeld(budget gcra.Limit, shares, safe []uint32, out []int64) {
	split(budget, shares, safe, out, true)
}

func split(budget gcra.Limit, shares, safe []uint32, out []int64, held bool) {
	n := len(shares)
	sum := int64(0)
	for _, s := range shares {
		sum += int64(s)
	}
	m := n
	if held && sum < PPM {
		m = n + 1 // the unheld ppm
	}
	var wa [17]float64
	var fa, ba [17]int64
	var sa [17]uint32
	var ha [17]bool
	w, f, b, sh, has := wa[:0], fa[:0], ba[:0], sa[:0], ha[:0]
	if m <= len(wa) {
		w, f, b, sh, has = wa[:m], fa[:m], ba[:m], sa[:m], ha[:m]
	} else {
		w, f, b, sh, has = make([]float64, m), make([]int64, m), make([]int64, m), make([]uint32, m), make([]bool, m)
	}
	for i, s := range shares {
		sh[i] = s
		has[i] = s > 0 && !held
		if i > 0 && safe[i] == safe[i-1] {
			f[i] = f[i-1] // equal floors (the default split): one derivation
		} else {
			f[i] = SafeLimit(budget, safe[i], n).Burst()
		}
	}
	if m > n {
		sh[n], has[n], f[n] = uint32(PPM-sum), false, 0
	}
	deriveBursts(budget, sh, f, has, w, b)
	copy(out, b[:n])
}
