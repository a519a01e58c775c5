package rebalance

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/meridian-quota/meridian/gcra"
)

// The strategy names the configuration chooses by.
var strategyNames = []string{
	"doorman-fair",
	"doorman-proportional",
	"ewma",
	"full",
	"home",
	"maxmin",
	"proportional",
	"quantile",
	"static",
}

// StrategyNames returns the names NewStrategy accepts, sorted.
func StrategyNames() []string { return slices.Clone(strategyNames) }

// ErrUnknownStrategy reports a strategy name NewStrategy does not know.
var ErrUnknownStrategy = errors.New("rebalance: unknown strategy")

// ErrOvercommit reports the full strategy chosen without AllowOvercommit.
var ErrOvercommit = errors.New(`rebalance: strategy "full" gives every region the whole budget and is refused unless allow_overcommit: true`)

// maxWant caps a demand in ppm of the budget (Doorman's wants) so that sums
// of wants stay finite: 10³⁰⁰ ppm is far past any real overload.
const maxWant = 1e300

// NewStrategy returns the strategy called name for regions, configured by
// the fields of p it reads: static (Weights), home (Home), proportional,
// ewma and quantile (AlphaUp, AlphaDown), maxmin (Headroom), doorman-proportional,
// doorman-fair, and full (AllowOvercommit). See the package documentation
// for what each does.
//
// Allocate expects every Input slice indexed like regions. Ties between
// regions are broken by region name, and every sum runs in name order, so
// listing the regions in another order permutes the result and changes
// nothing else.
//
// It reports every problem at once: an unknown name (listing the valid
// ones), no regions, an empty or repeated region name, full without
// AllowOvercommit (ErrOvercommit), a home region not among regions, a
// weight for an unknown region or one that is negative, NaN or infinite,
// weights summing to 0, an alpha outside (0, 1], and a headroom that is
// NaN, infinite or negative. The strategy is immutable and safe for
// concurrent use.
func NewStrategy(name string, regions []string, p Params) (Strategy, error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("rebalance: strategy %q: "+format, append([]any{name}, args...)...))
	}
	if !slices.Contains(strategyNames, name) {
		errs = append(errs, fmt.Errorf("%w %q (valid: %s)", ErrUnknownStrategy, name, strings.Join(strategyNames, ", ")))
	}
	index := make(map[string]int, len(regions))
	if len(regions) == 0 {
		bad("no regions")
	}
	for i, r := range regions {
		switch _, dup := index[r]; {
		case r == "":
			bad("regions[%d]: empty name", i)
		case dup:
			bad("regions[%d] %q: listed twice", i, r)
		default:
			index[r] = i
		}
	}
	b := newStrategyBase(name, regions)
	var s Strategy
	switch name {
	case "static":
		w := make([]float64, len(regions))
		positive := false
		for _, r := range slices.Sorted(maps.Keys(p.Weights)) {
			v := p.Weights[r]
			i, known := index[r]
			switch {
			case !known:
				bad("weights: %q is not one of the regions %q", r, regions)
			case math.IsNaN(v) || math.IsInf(v, 0) || v < 0:
				bad("weights[%q] %v: must be finite and ≥ 0", r, v)
			default:
				w[i] = v
				positive = positive || v > 0
			}
		}
		if len(p.Weights) == 0 {
			for i := range w {
				w[i] = 1
			}
		} else if !positive {
			bad("weights: no region has a positive weight (leave weights out for an equal split)")
		}
		s = &weightedStrategy{strategyBase: b, weights: w}
	case "home":
		i, known := index[p.Home]
		switch {
		case p.Home == "":
			bad("home: no home region set")
		case !known:
			bad("home: %q is not one of the regions %q", p.Home, regions)
		}
		w := make([]float64, len(regions))
		if known {
			w[i] = 1
		}
		s = &weightedStrategy{strategyBase: b, weights: w}
	case "proportional":
		s = &proportionalStrategy{strategyBase: b}
	case "ewma", "quantile":
		if !(p.AlphaUp > 0 && p.AlphaUp <= 1) {
			bad("alpha_up %v: must be in (0, 1]", p.AlphaUp)
		}
		if !(p.AlphaDown > 0 && p.AlphaDown <= 1) {
			bad("alpha_down %v: must be in (0, 1]", p.AlphaDown)
		}
		s = &ewmaStrategy{strategyBase: b, up: p.AlphaUp, down: p.AlphaDown, quantile: name == "quantile"}
	case "maxmin":
		if !(p.Headroom >= 0) || math.IsInf(p.Headroom, 1) {
			bad("headroom %v: must be finite and ≥ 0", p.Headroom)
		}
		s = &maxminStrategy{strategyBase: b, headroom: p.Headroom}
	case "doorman-proportional", "doorman-fair":
		s = &doormanStrategy{strategyBase: b, fair: name == "doorman-fair"}
	case "full":
		if !p.AllowOvercommit {
			errs = append(errs, ErrOvercommit)
		}
		s = &fullStrategy{strategyBase: b}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return s, nil
}

var (
	_ Strategy = (*weightedStrategy)(nil)
	_ Strategy = (*proportionalStrategy)(nil)
	_ Strategy = (*ewmaStrategy)(nil)
	_ Strategy = (*maxminStrategy)(nil)
	_ Strategy = (*doormanStrategy)(nil)
	_ Strategy = (*fullStrategy)(nil)
)

// strategyBase holds what every strategy knows of its regions.
type strategyBase struct {
	name  string
	n     int
	order []int // region indexes in name order
	rank  []int // rank[i]: the position of region i in name order
}

func newStrategyBase(name string, regions []string) strategyBase {
	b := strategyBase{name: name, n: len(regions), order: make([]int, len(regions)), rank: make([]int, len(regions))}
	for i := range b.order {
		b.order[i] = i
	}
	slices.SortStableFunc(b.order, func(x, y int) int { return strings.Compare(regions[x], regions[y]) })
	for pos, i := range b.order {
		b.rank[i] = pos
	}
	return b
}

func (b *strategyBase) Name() string     { return b.name }
func (b *strategyBase) Overcommit() bool { return false }

// allocBuf is one Allocate call's scratch space. Strategies take it from
// allocBufs and put it back, so a call allocates nothing once the pool is
// warm and strategies stay safe for concurrent use.
type allocBuf struct {
	w     []float64 // weights
	f     []float64 // Doorman's wants; quantile's demand in ppm
	g     []float64 // quantile's σ
	parts []int64   // Split's output
	caps  []int64   // maxmin's capped demand, ppm
}

var allocBufs = sync.Pool{New: func() any { return new(allocBuf) }}

// begin checks the lengths of in and out, writes the floors into out and
// returns the distributable D = PPM − ΣSafe with a buffer for n regions.
// When the floors sum above PPM (Input.Validate reports it) no table can
// keep them all: out then holds the floors scaled down to sum to PPM, which
// keeps Σ ≤ PPM, and ok is false.
func (b *strategyBase) begin(in *Input, out []uint32) (buf *allocBuf, d int64, ok bool) {
	n := len(in.Demand)
	if n != b.n || len(out) != n || (in.Safe != nil && len(in.Safe) != n) ||
		(in.Last != nil && len(in.Last) != n) || (in.State != nil && len(in.State) != n) {
		panic(fmt.Sprintf("rebalance: strategy %q has %d regions; got Demand %d, Safe %d, Last %d, State %d, out %d",
			b.name, b.n, n, len(in.Safe), len(in.Last), len(in.State), len(out)))
	}
	buf = allocBufs.Get().(*allocBuf)
	if cap(buf.w) < n {
		*buf = allocBuf{w: make([]float64, n), f: make([]float64, n), g: make([]float64, n), parts: make([]int64, n), caps: make([]int64, n)}
	}
	buf.w, buf.f, buf.g, buf.parts, buf.caps = buf.w[:n], buf.f[:n], buf.g[:n], buf.parts[:n], buf.caps[:n]
	sum := int64(0)
	for i := range out {
		out[i] = safeAt(in, i)
		sum += int64(out[i])
	}
	if sum <= PPM {
		return buf, PPM - sum, true
	}
	for i := range out {
		buf.w[i] = float64(out[i])
	}
	splitRanked(PPM, buf.w, b.rank, buf.parts)
	for i := range out {
		out[i] = uint32(buf.parts[i])
	}
	return buf, 0, false
}

func putAllocBuf(buf *allocBuf) { allocBufs.Put(buf) }

// spreadOrKeep spreads d by the weights in buf.w when some region has
// weight; with none, it keeps the last shares if they are usable, else
// splits d equally (the proportional family's rule for a key with no
// demand anywhere).
func (b *strategyBase) spreadOrKeep(in *Input, d int64, some bool, out []uint32, buf *allocBuf) {
	if some || !keepLast(in, out) {
		if !some {
			setEqualWeights(buf.w)
		}
		b.spread(d, buf.w, out, buf)
	}
}

// spread adds d ppm split by largest remainder in proportion to weights
// (ties by region name) onto out.
func (b *strategyBase) spread(d int64, weights []float64, out []uint32, buf *allocBuf) {
	splitRanked(d, weights, b.rank, buf.parts)
	for i := range out {
		out[i] += uint32(buf.parts[i])
	}
}

// setEqualWeights sets every weight to 1: the fallback when nothing else weighs.
func setEqualWeights(w []float64) {
	for i := range w {
		w[i] = 1
	}
}

func safeAt(in *Input, i int) uint32 {
	if in.Safe == nil {
		return 0
	}
	return in.Safe[i]
}

// demandAt is region i's demand, with NaN, infinite and negative demand
// counted as 0 (the coordinator rejects them before they get here).
func demandAt(in *Input, i int) float64 {
	return finitePositive(in.Demand[i])
}

// finitePositive is v if v is finite and > 0, else 0.
func finitePositive(v float64) float64 {
	if v > 0 && !math.IsInf(v, 1) {
		return v
	}
	return 0
}

// keepLast copies in.Last to out when it is a valid table for in (each
// share at least its floor, the sum at most PPM) and reports whether it did.
func keepLast(in *Input, out []uint32) bool {
	if in.Last == nil {
		return false
	}
	sum := int64(0)
	for i, s := range in.Last {
		if s < safeAt(in, i) {
			return false
		}
		sum += int64(s)
	}
	if sum > PPM {
		return false
	}
	copy(out, in.Last)
	return true
}

// weightedStrategy is static and home: fixed weights in region order.
type weightedStrategy struct {
	strategyBase
	weights []float64
}

func (s *weightedStrategy) Allocate(in *Input, out []uint32) {
	buf, d, ok := s.begin(in, out)
	if ok {
		s.spread(d, s.weights, out, buf)
	}
	putAllocBuf(buf)
}

type proportionalStrategy struct{ strategyBase }

func (s *proportionalStrategy) Allocate(in *Input, out []uint32) {
	buf, d, ok := s.begin(in, out)
	if ok {
		some := false
		for i := range buf.w {
			buf.w[i] = demandAt(in, i)
			some = some || buf.w[i] > 0
		}
		s.spreadOrKeep(in, d, some, out, buf)
	}
	putAllocBuf(buf)
}

// shiftFraction is how far the other regions' demand must move from what
// they remember, as a part of what the key remembers, for ewma to take
// the move for one: a region then takes at once (or gives back at once)
// as much of its own rise (fall) as the others lost (gained), and smooths
// only the rest. An interval that holds a move reports it in both regions;
// smoothing it gave the new region half of what proportional gives it for
// that interval. At 0.25 the simulator's migrating tenants lost 13.0 %
// instead of 13.9 and mixed-reserve 6.8 instead of 7.9 (quantile,
// Δ = 2 s, fence 500 ms and max_skew 250 ms); every other built-in scenario moved by at most 0.1 point. A
// threshold of 0.1 cost steady skew and follow-the-sun 0.1 point and 5 %
// more bytes: Poisson noise read as moves.
const shiftFraction = 0.25

// ewmaStrategy is ewma, and quantile: ewma's smoothed demand split so
// that every region with demand holds the same quantile of it
// (equalRisk).
type ewmaStrategy struct {
	strategyBase
	up, down float64
	quantile bool
}

func (s *ewmaStrategy) Allocate(in *Input, out []uint32) {
	buf, d, ok := s.begin(in, out)
	if ok {
		// The key's demand against what its regions remember: when the
		// other regions' demand alone is at least what all of them
		// remember, or has risen above what they remember by a
		// shiftFraction of it, a region whose demand fell lost it to them
		// (a move), not to a lull, and gives its smoothed demand back at
		// once (its own demand, alpha 1); and a region whose demand alone
		// is at least that much took the key's traffic (the other side of
		// a move, or a key new to it), or rose by a shiftFraction of it
		// while the key's whole demand held, and takes its demand at once
		// too. Its own demand is left out of the first test, and only
		// raises it into the second, so raising one region's demand never
		// lowers its share.
		mem, total := 0.0, 0.0
		for _, i := range s.order {
			if in.State != nil {
				mem += finitePositive(in.State[i])
			}
			total += demandAt(in, i)
		}
		// shift is how far the other regions' demand moved from what
		// they remember (up: positive), when that is at least a
		// shiftFraction of what the key remembers, else 0. It leaves the
		// region's own demand out.
		shift := func(dem, st float64) float64 {
			if d := (total - dem) - (mem - st); math.Abs(d) >= shiftFraction*mem && mem > 0 {
				return d
			}
			return 0
		}
		some := false
		for i := range buf.w {
			dem, st := demandAt(in, i), 0.0
			if in.State != nil {
				st = finitePositive(in.State[i])
			}
			a := s.down
			switch {
			case dem > st && dem >= mem:
				a = 1
			case dem > st:
				// What the others lost, up to this region's rise, moved
				// here: taken at once; the rest of the rise at alpha_up.
				st += min(dem-st, max(0, -shift(dem, st)))
				a = s.up
			case total-dem > 0 && total-dem >= mem:
				a = 1
			default:
				// What the others gained, up to this region's fall, moved
				// there: given back at once; the rest at alpha_down.
				st -= min(st-dem, max(0, shift(dem, st)))
			}
			st += a * (dem - st)
			if in.State != nil {
				in.State[i] = st
			}
			buf.w[i] = st
			some = some || st > 0
		}
		if s.quantile && some {
			s.equalRisk(in, d, buf)
		}
		s.spreadOrKeep(in, d, some, out, buf)
	}
	putAllocBuf(buf)
}

// maxRiskPPM caps a region's demand in equalRisk: 10⁹ budgets.
const maxRiskPPM = 1e15

// riskSpan is how far over its budget a key's demand is split by
// equalRisk's rule as it is; more is scaled down to it first. At 1.5 the
// simulator's UA is that of no scaling at all (steady-skew 1.1 %, flash
// crowd 1.5 % at Δ = 2 s, fence 500 ms), where scaling down to the budget itself cost
// 0.3 and 0.2 points.
const riskSpan = 1.5

// equalRisk turns the smoothed demands in buf.w (cost per second) into
// the weights that split d so that every region with demand gets the
// same number z of standard deviations of its demand above (or below) it:
// share_r = max(safe_r, m_r + z·σ_r), with m_r the demand in ppm of the
// budget, σ_r ∝ √m_r (Poisson arrivals: the relative noise of a region
// seeing λ requests a second is 1/√λ), and z the one value at which the
// shares fill PPM. The weights are share_r − safe_r, which sum to d.
//
// A key under its budget (z > 0) gives its slack to the regions whose
// demand is noisiest — a region with a tenth of the traffic is short far
// more often than its proportional part would say; a key over its budget
// (z < 0) takes the noisy regions' excess to the steady ones, where it is
// used rather than left in a bucket that happens to be idle — up to
// riskSpan times the budget; demand beyond that is scaled away in
// proportion first, so a heavily oversubscribed key keeps every region
// with demand above its floor. Raising one
// region's demand never lowers its share: at a fixed z its target grows,
// and z falls only as far as the sum needs. The scale of σ does not
// matter: z absorbs it.
func (s *ewmaStrategy) equalRisk(in *Input, d int64, buf *allocBuf) {
	t := float64(in.Budget.IntervalMicros())
	m, sd := buf.f, buf.g
	for i := range m {
		// A demand of more than 10⁹ budgets counts as 10⁹ (so the sums
		// below stay finite): the shares of such a key are decided long
		// before that.
		m[i] = min(buf.w[i]*t, maxRiskPPM)
	}
	// Beyond riskSpan times the budget the rule would take a noisy
	// region's whole share (at ten times over, a region with a fifth of
	// the demand would keep only its floor): demand above it is scaled
	// away in proportion first, as proportional would.
	sum := 0.0
	for _, i := range s.order {
		sum += m[i]
	}
	f := max(1, sum/(riskSpan*PPM))
	for i := range m {
		m[i] /= f
		sd[i] = math.Sqrt(m[i])
	}
	// The piecewise-linear Σ max(safe_r, m_r + z·σ_r) = PPM: regions join
	// the sum in the order of the z at which they leave their floor.
	// An insertion sort in name order keeps ties, and so the result,
	// independent of the order regions are listed in.
	idx := buf.parts[:0]
	for _, i := range s.order {
		if sd[i] > 0 {
			idx = append(idx, int64(i))
		}
	}
	leave := func(i int64) float64 { return (float64(safeAt(in, int(i))) - m[i]) / sd[i] }
	for a := 1; a < len(idx); a++ {
		for b := a; b > 0 && leave(idx[b]) < leave(idx[b-1]); b-- {
			idx[b], idx[b-1] = idx[b-1], idx[b]
		}
	}
	// rest: Σ (target − safe) that the active regions must make up.
	rest, sumM, sumSD := float64(d), 0.0, 0.0
	z := 0.0
	for k, i := range idx {
		rest += float64(safeAt(in, int(i)))
		sumM += m[i]
		sumSD += sd[i]
		z = (rest - sumM) / sumSD
		if k+1 == len(idx) || z <= leave(idx[k+1]) {
			break
		}
	}
	sum = 0.0
	for _, i := range s.order {
		w := 0.0
		if sd[i] > 0 {
			w = max(0, m[i]+z*sd[i]-float64(safeAt(in, i)))
		}
		sd[i] = w
		sum += w
	}
	if sum > 0 { // else (d is 0, or a zero budget) ewma's weights stand
		copy(buf.w, sd)
	}
	clear(buf.parts)
}

type maxminStrategy struct {
	strategyBase
	headroom float64
}

// capPPM is demand·T·(1+h) in ppm of the budget, rounded to the nearest
// ppm (so float noise in 1+h adds nothing) and capped at PPM (no region can
// use more than the whole budget).
func capPPM(demand float64, t int64, h float64) int64 {
	x := demand * float64(t) * (1 + h)
	switch {
	case !(x > 0):
		return 0
	case x >= PPM:
		return PPM
	default:
		return int64(math.Round(x))
	}
}

func (s *maxminStrategy) Allocate(in *Input, out []uint32) {
	buf, d, ok := s.begin(in, out)
	if !ok {
		putAllocBuf(buf)
		return
	}
	c := buf.caps
	t := in.Budget.IntervalMicros()
	met, sumC := int64(0), int64(0) // Σ max(safe, cap), Σ cap
	for i := range c {
		c[i] = capPPM(demandAt(in, i), t, s.headroom)
		met += max(int64(out[i]), c[i])
		sumC += c[i]
	}
	if met <= PPM {
		// Every capped demand is met. The X = PPM − met ppm left over go in
		// proportion to the capped demand (equally when there is none), in
		// one exact largest-remainder split of D: region r's part above its
		// floor is (max(s,c)−s) + X·c/Σc = w_r/Σc, Σ w = D·Σc.
		if sumC == 0 {
			// No demand anywhere: keep the last shares (a lull, not a
			// move), as proportional does; equally without them.
			if keepLast(in, out) {
				putAllocBuf(buf)
				return
			}
			setEqualWeights(buf.w)
		} else {
			x := PPM - met
			for i := range c {
				buf.w[i] = float64((max(int64(out[i]), c[i])-int64(out[i]))*sumC + x*c[i])
			}
		}
		s.spread(d, buf.w, out, buf)
		putAllocBuf(buf)
		return
	}
	// Water-fill: the largest level L with F(L) = Σ max(s, min(c, L)) ≤ PPM
	// (F(0) = ΣSafe ≤ PPM < met = F(PPM)); the R = PPM − F(L) units left go
	// one each, in name order, to the regions that would rise at L+1.
	level := func(l int64) int64 {
		f := int64(0)
		for i := range c {
			f += max(int64(out[i]), min(c[i], l))
		}
		return f
	}
	lo, hi := int64(0), int64(PPM)
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if level(mid) <= PPM {
			lo = mid
		} else {
			hi = mid
		}
	}
	r := PPM - level(lo)
	for _, i := range s.order {
		floor := int64(out[i])
		out[i] = uint32(max(floor, min(c[i], lo)))
		if r > 0 && floor <= lo && lo < c[i] {
			out[i]++
			r--
		}
	}
	putAllocBuf(buf)
}

type doormanStrategy struct {
	strategyBase
	fair bool
}

func (s *doormanStrategy) Allocate(in *Input, out []uint32) {
	buf, d, ok := s.begin(in, out)
	if ok {
		t := float64(in.Budget.IntervalMicros())
		for i := range buf.f {
			buf.f[i] = min(demandAt(in, i)*t, maxWant) // demand/(10⁶/T per s) × 10⁶ ppm
		}
		if s.fair {
			doormanFair(float64(d), buf.f, buf.w, s.order)
		} else {
			doormanProportional(float64(d), buf.f, buf.w, s.order)
		}
		some := false
		for _, g := range buf.w {
			some = some || g > 0
		}
		s.spreadOrKeep(in, d, some, out, buf)
	}
	putAllocBuf(buf)
}

type fullStrategy struct{ strategyBase }

func (s *fullStrategy) Overcommit() bool { return true }

func (s *fullStrategy) Allocate(in *Input, out []uint32) {
	if len(in.Demand) != s.n || len(out) != s.n {
		panic(fmt.Sprintf("rebalance: strategy %q has %d regions; got Demand %d, out %d", s.name, s.n, len(in.Demand), len(out)))
	}
	for i := range out {
		out[i] = PPM
	}
}

// Validate reports every problem with in at once: no regions, a demand that
// is NaN, infinite or negative, Safe, Last or State of another length than
// Demand, floors summing above PPM, a State entry that is not finite and
// ≥ 0, and an invalid Budget. The coordinator calls it before Allocate;
// strategies given such input still never write a table with Σ > PPM (see
// the package documentation).
func (in *Input) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("rebalance: input: "+format, args...))
	}
	n := len(in.Demand)
	if n == 0 {
		bad("no regions")
	}
	for i, d := range in.Demand {
		if math.IsNaN(d) || math.IsInf(d, 0) || d < 0 {
			bad("Demand[%d] %v: must be finite and ≥ 0", i, d)
		}
	}
	if in.Safe != nil && len(in.Safe) != n {
		bad("Safe has %d regions, Demand %d", len(in.Safe), n)
	} else {
		sum := int64(0)
		for _, s := range in.Safe {
			sum += int64(s)
		}
		if sum > PPM {
			bad("safe shares sum to %d ppm, above %d", sum, PPM)
		}
	}
	if in.Last != nil && len(in.Last) != n {
		bad("Last has %d regions, Demand %d", len(in.Last), n)
	}
	if in.State != nil && len(in.State) != n {
		bad("State has %d regions, Demand %d", len(in.State), n)
	}
	for i, v := range in.State {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			bad("State[%d] %v: must be finite and ≥ 0", i, v)
		}
	}
	if err := in.Budget.Validate(); err != nil {
		bad("Budget: %w", err)
	}
	return errors.Join(errs...)
}

// Derive fills limits with each region's limit for one key: the rate from
// its share (RegionalLimit: T_r = ceil(T·10⁶/s_r), so Σ 1/T_r ≤ 1/T) and the
// burst from SplitBurst (the global burst split in proportion to the shares,
// each region at least its floor when floors is not nil, and at least 1 for
// each region with demand and a share while the global burst suffices).
// demand[r] says whether region r had demand; floors[r] is the least burst
// region r gets (SafeBurst of its safe share: the coordinator passes them,
// so that a region running its safe share never holds more burst than the
// table gives it). When the shares sum above PPM (only the full strategy)
// the bursts are not split: each region gets floor(B·s_r/10⁶), at least 1
// for a non-zero share, so full gives every region the whole burst. A zero
// budget gives zero limits. limits, demand, floors (when not nil), scratchW
// and scratchB have len(shares) elements; scratchW and scratchB are
// overwritten (scratchB with the limits' bursts). It allocates nothing.
func Derive(budget gcra.Limit, shares []uint32, floors []int64, demand []bool, limits []gcra.Limit, scratchW []float64, scratchB []int64) {
	splitBursts(budget, shares, floors, demand, scratchW, scratchB)
	for i, s := range shares {
		limits[i] = RegionalLimit(budget, s, scratchB[i])
		scratchB[i] = limits[i].Burst()
	}
}

// deriveBursts is the bursts of Derive's limits, written to scratchB, with
// no limit built: splitting a row (the coordinator, for every key and
// region each rebalance) needs only these.
func deriveBursts(budget gcra.Limit, shares []uint32, floors []int64, demand []bool, scratchW []float64, scratchB []int64) {
	splitBursts(budget, shares, floors, demand, scratchW, scratchB)
	for i, s := range shares {
		scratchB[i] = regionalBurst(budget, s, scratchB[i])
	}
}

// splitBursts writes to scratchB the bursts Derive gives the regions
// before each is held to its limit's window (RegionalLimit, regionalBurst).
func splitBursts(budget gcra.Limit, shares []uint32, floors []int64, demand []bool, scratchW []float64, scratchB []int64) {
	sum := int64(0)
	for _, s := range shares {
		sum += int64(s)
	}
	if sum > PPM {
		for i, s := range shares {
			b := budget.Burst()
			if s < PPM {
				b = b * int64(s) / PPM // B ≤ 2^37, s < 2^20
			}
			if s > 0 {
				b = max(b, 1)
			}
			scratchB[i] = b
		}
		return
	}
	SplitBurst(budget.Burst(), shares, floors, demand, scratchW, scratchB)
}

// DoormanProportional is Doorman's PROPORTIONAL_SHARE computed for all
// clients at once: the grants of capacity to clients wanting wants. If the
// wants sum to at most capacity, or a client wants at most the equal share
// e = capacity/n, it gets what it wants; otherwise it gets
// e + (want−e)·extraCapacity/extraNeed, where extraCapacity is what the
// clients below e leave of their equal shares and extraNeed the sum of
// (want−e) over the others. Each grant is capped at the capacity not yet
// granted, in index order (Doorman grants one request at a time against its
// lease store; the cap binds here only through floating-point rounding).
// Wants that are negative, NaN or infinite count as 0; a capacity that is
// not finite and > 0 grants nothing. Reference: github.com/youtube/doorman,
// go/server/doorman/algorithm.go.
func DoormanProportional(capacity float64, wants []float64) []float64 {
	out := make([]float64, len(wants))
	doormanProportional(capacity, wants, out, nil)
	return out
}

// DoormanFair is Doorman's FAIR_SHARE computed for all clients at once: a
// client wanting at most e = capacity/n gets it; the others split what those
// leave (extra) equally, deservedExtra = extra/#(wanting more than e), and a
// client wanting less than e + deservedExtra gets its want; the rest share,
// in a second and last round, what the clients between e and
// e + deservedExtra leave of it, each getting e + deservedExtra +
// extraExtra/#(wanting at least e + deservedExtra). It stops after two
// rounds, so a client of the second round may get more than it wants while a
// larger one gets less than water-filling (MaxMin) would give it. A client
// wanting exactly e + deservedExtra counts as wanting more (Doorman counts
// only the requesting client so, which depends on who asks first). Grants
// are capped at the capacity not yet granted, in index order. Wants and
// capacity are read as in DoormanProportional.
func DoormanFair(capacity float64, wants []float64) []float64 {
	out := make([]float64, len(wants))
	doormanFair(capacity, wants, out, nil)
	return out
}

// MaxMin is water-filling: every client gets min(want, L), with the level L
// raised until capacity is used up or every want is met (then capacity may
// be left over). Wants and capacity are read as in DoormanProportional.
func MaxMin(capacity float64, wants []float64) []float64 {
	out := make([]float64, len(wants))
	if !(capacity > 0) || math.IsInf(capacity, 1) {
		return out
	}
	active := 0
	for i, w := range wants {
		out[i] = 0
		if cleanWant(w) > 0 {
			out[i] = -1 // not yet met
			active++
		}
	}
	left := capacity
	for active > 0 {
		level := max(left, 0) / float64(active)
		met := false
		for i, w := range wants {
			if w = cleanWant(w); out[i] < 0 && w <= level {
				out[i], left, active, met = w, left-w, active-1, true
			}
		}
		if !met {
			for i := range out {
				if out[i] < 0 {
					out[i] = level
				}
			}
			break
		}
	}
	return out
}

func cleanWant(w float64) float64 { return min(finitePositive(w), maxWant) }

// nthIndex is the k-th index in order (nil: k).
func nthIndex(order []int, k int) int {
	if order == nil {
		return k
	}
	return order[k]
}

// capGrants caps each grant, in order, at the capacity not yet granted.
func capGrants(capacity float64, out []float64, order []int) {
	granted := 0.0
	for k := range out {
		i := nthIndex(order, k)
		out[i] = max(min(out[i], capacity-granted), 0)
		granted += out[i]
	}
}

// doormanProportional writes DoormanProportional's grants into out, summing
// in order (nil: index order).
func doormanProportional(capacity float64, wants, out []float64, order []int) {
	n := len(wants)
	if n == 0 {
		return
	}
	if !(capacity > 0) || math.IsInf(capacity, 1) {
		clear(out)
		return
	}
	e := capacity / float64(n)
	sum := 0.0
	for k := range n {
		sum += cleanWant(wants[nthIndex(order, k)])
	}
	if sum <= capacity {
		for i, w := range wants {
			out[i] = cleanWant(w)
		}
	} else {
		extraCapacity, extraNeed := 0.0, 0.0
		for k := range n {
			if w := cleanWant(wants[nthIndex(order, k)]); w < e {
				extraCapacity += e - w
			} else {
				extraNeed += w - e
			}
		}
		for i, w := range wants {
			w = cleanWant(w)
			switch {
			case w <= e:
				out[i] = w
			case extraNeed > 0:
				out[i] = e + (w-e)*(extraCapacity/extraNeed)
			default:
				out[i] = e
			}
		}
	}
	capGrants(capacity, out, order)
}

// doormanFair writes DoormanFair's grants into out, summing in order (nil:
// index order).
func doormanFair(capacity float64, wants, out []float64, order []int) {
	n := len(wants)
	if n == 0 {
		return
	}
	if !(capacity > 0) || math.IsInf(capacity, 1) {
		clear(out)
		return
	}
	e := capacity / float64(n)
	extra, over := 0.0, 0
	for k := range n {
		if w := cleanWant(wants[nthIndex(order, k)]); w < e {
			extra += e - w
		} else if w > e {
			over++
		}
	}
	deservedExtra := 0.0
	if over > 0 {
		deservedExtra = extra / float64(over)
	}
	level := e + deservedExtra
	extraExtra, still := 0.0, 0
	for k := range n {
		if w := cleanWant(wants[nthIndex(order, k)]); w > e {
			if w < level {
				extraExtra += level - w
			} else {
				still++
			}
		}
	}
	deservedExtraExtra := 0.0
	if still > 0 {
		deservedExtraExtra = extraExtra / float64(still)
	}
	for i, w := range wants {
		if w = cleanWant(w); w < level || w <= e {
			out[i] = w
		} else {
			out[i] = level + deservedExtraExtra
		}
	}
	capGrants(capacity, out, order)
}
