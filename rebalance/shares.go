package rebalance

import (
	"errors"
	"fmt"
	"math"
	"math/bits"

	"github.com/meridian-quota/meridian/gcra"
)

// PPM is a whole budget in parts per million: the shares of a key across
// regions sum to at most PPM.
const PPM = 1_000_000

// Split divides total integer units among len(weights) parts in proportion
// to weights by largest remainder: each part gets floor(total·w/Σw), and
// the units left over go one each to the largest fractional remainders,
// ties to the lower index. The parts sum to exactly total when some weight
// is positive; with none every part is 0, as it is when total ≤ 0. A
// weight that is negative, NaN or infinite counts as 0. out must have
// len(weights) elements. It allocates nothing.
//
// The arithmetic is exact: each weight is first scaled by a power of two
// (exactly) so the largest lies in [2^(t−1), 2^t) with t = 64 − bits.Len(n)
// for n weights, and its fraction dropped; quotients and remainders are then
// integers (128-bit products), so no floating-point rounding can give a unit
// twice, lose one, or order two remainders wrongly. Weights that are
// integers below 2^53 (shares, ppm) are therefore split exactly; a weight
// below 2^-(t) of the largest counts as 0. Raising one weight never lowers
// that part (for up to 31 parts; a quota that rises while every other falls
// cannot lose its unit).
func Split(total int64, weights []float64, out []int64) {
	splitRanked(total, weights, nil, out)
}

// splitRanked is Split with ties between equal remainders going to the
// lower rank[i] instead of the lower index (rank nil: the index). The
// strategies rank regions by name, so their results do not depend on the
// order the regions are listed in.
func splitRanked(total int64, weights []float64, rank []int, out []int64) {
	n := len(weights)
	for i := range out {
		out[i] = 0
	}
	if total <= 0 || n == 0 {
		return
	}
	top := 0.0
	for _, w := range weights {
		if w > top && !math.IsInf(w, 1) {
			top = w
		}
	}
	if top == 0 {
		return
	}
	_, e := math.Frexp(top) // top = f·2^e, f in [0.5, 1)
	shift := 64 - bits.Len(uint(n)) - e
	units := func(w float64) uint64 {
		if !(w > 0) || math.IsInf(w, 1) {
			return 0
		}
		return uint64(math.Ldexp(w, shift)) // < 2^(64−bits.Len(n)): exact, truncated
	}
	// Each weight's units and quotient are computed once (scratch on the
	// stack for up to 16 regions).
	var ua, qa [16]uint64
	us, qs := ua[:0], qa[:0]
	if n <= len(ua) {
		us, qs = ua[:n], qa[:n]
	} else {
		us, qs = make([]uint64, n), make([]uint64, n)
	}
	sum := uint64(0) // < n·2^(64−bits.Len(n)) ≤ 2^64
	for i, w := range weights {
		us[i] = units(w)
		sum += us[i]
	}
	key := func(i int) int {
		if rank == nil {
			return i
		}
		return rank[i]
	}
	// First pass: out holds each remainder (total·u mod sum, as bits).
	given := int64(0)
	for i := range weights {
		hi, lo := bits.Mul64(uint64(total), us[i])
		q, r := bits.Div64(hi, lo, sum) // hi < sum: total < 2^64 and u ≤ sum
		given += int64(q)
		qs[i] = q
		out[i] = int64(r)
	}
	// left < n units go to the largest remainders (ties to the lower key):
	// order the regions by (remainder descending, key ascending) with an
	// insertion sort — n is small — and give the first left one unit each.
	left := int(total - given)
	var oa [16]int
	ord := oa[:0]
	if n > len(oa) {
		ord = make([]int, 0, n)
	}
	before := func(a, b int) bool { // a ranks before b
		ra, rb := uint64(out[a]), uint64(out[b])
		return ra > rb || (ra == rb && key(a) < key(b))
	}
	if left > 0 {
		for i := range n {
			ord = append(ord, i)
			for j := len(ord) - 1; j > 0 && before(ord[j], ord[j-1]); j-- {
				ord[j], ord[j-1] = ord[j-1], ord[j]
			}
		}
	}
	for i := range weights {
		out[i] = int64(qs[i])
	}
	for _, i := range ord[:min(left, len(ord))] {
		out[i]++
	}
}

// RegionalLimit derives a region's limit from the global one and its share
// s (ppm): T_r = ceil(T·10⁶/s), so the regions' rates never sum above the
// global rate, with the given burst. A zero share or zero burst is the zero
// limit (deny everything).
func RegionalLimit(global gcra.Limit, share uint32, burst int64) gcra.Limit {
	t := global.IntervalMicros()
	if share == 0 || burst <= 0 || t <= 0 {
		return gcra.Limit{}
	}
	hi, lo := bits.Mul64(uint64(t), PPM)
	if hi >= uint64(share) {
		return gcra.Limit{} // T_r ≥ 2^64 µs
	}
	q, r := bits.Div64(hi, lo, uint64(share))
	if r != 0 {
		q++
	}
	if q > uint64(gcra.MaxWindowMicros) {
		// A share this small of a slow limit cannot be expressed within the
		// window; the region gets nothing rather than more than its share
		// (see MinShare).
		return gcra.Limit{}
	}
	tr := int64(q)
	b := min(burst, gcra.MaxBurst)
	if hi, lo := bits.Mul64(uint64(b), uint64(tr)); hi != 0 || lo > uint64(gcra.MaxWindowMicros) {
		b = gcra.MaxWindowMicros / tr // the region's window may not exceed MaxWindow
	}
	return gcra.FromInterval(tr, b)
}

// regionalBurst is RegionalLimit(global, share, burst).Burst() without
// the division that T_r needs: the burst is burst (capped at MaxBurst)
// unless the region's window would pass MaxWindow, and 0 where the limit
// is zero. T_r = ceil(x) for x = T·10⁶/s < x + 1, so when
// b·(T·10⁶ + s) ≤ MaxWindow·s, b·T_r ≤ MaxWindow holds and T_r ≤
// MaxWindow with it: the common case, decided by multiplications alone.
// The coordinator splits a burst for every key and region each rebalance
// and needs only this.
func regionalBurst(global gcra.Limit, share uint32, burst int64) int64 {
	t := global.IntervalMicros()
	if share == 0 || burst <= 0 || t <= 0 {
		return 0
	}
	b := min(burst, gcra.MaxBurst)
	// b·(T·10⁶ + s) against MaxWindow·s in 128 bits, when T·10⁶ < 2^63
	// (T below about 100 days) so that T·10⁶ + s fits in 64.
	if hi, lo := bits.Mul64(uint64(t), PPM); hi == 0 && lo < 1<<63 {
		x := lo + uint64(share)
		lh, ll := bits.Mul64(uint64(b), x)
		rh, rl := bits.Mul64(uint64(gcra.MaxWindowMicros), uint64(share))
		if lh < rh || (lh == rh && ll <= rl) {
			return b
		}
	}
	return RegionalLimit(global, share, burst).Burst()
}

// EqualFloor is each of regions' part (ppm, rounded down) of fraction of
// a budget split equally: the safe share of SafeFraction, the idle floor
// of IdleSafeFraction. The coordinator's floors and the agents' must be
// the same numbers, so every side computes them here.
func EqualFloor(fraction float64, regions int) uint32 {
	return uint32(math.Floor(fraction * PPM / float64(regions)))
}

// MinShare is the smallest non-zero share (ppm) of global that a region
// can run: below it T_r = ceil(T·10⁶/s) exceeds gcra.MaxWindow and
// RegionalLimit gives the zero limit. It is 1 for every limit of at least
// one event per 37.5 minutes; 39 for one per day, 14,005 (1.4 %) for one
// per year. A zero limit or one whose T exceeds MaxWindow returns PPM + 1
// (no share will do).
func MinShare(global gcra.Limit) uint32 {
	t := global.IntervalMicros()
	if t <= 0 || t > gcra.MaxWindowMicros {
		return PPM + 1
	}
	hi, lo := bits.Mul64(uint64(t), PPM)
	q, r := bits.Div64(hi, lo, uint64(gcra.MaxWindowMicros))
	if r != 0 {
		q++
	}
	return uint32(max(q, 1))
}

// FitMinShare makes every share of one key either 0 or at least ms (its
// MinShare): a smaller share runs the zero limit, so the ppm it holds would
// be lost. Those ppm go to the largest share (ties to the lower index), or,
// when every share is below ms, the largest takes them all. Σ shares is
// unchanged. It allocates nothing.
func FitMinShare(shares []uint32, ms uint32) {
	if ms <= 1 || len(shares) == 0 {
		return
	}
	var small uint32
	top := 0
	for i, s := range shares {
		if s > shares[top] {
			top = i
		}
		if s > 0 && s < ms {
			small += s
		}
	}
	if small == 0 {
		return
	}
	for i, s := range shares {
		if s > 0 && s < ms && i != top {
			shares[i] = 0
		}
	}
	if shares[top] < ms {
		shares[top] = small // top was one of them
	} else {
		shares[top] += small
	}
}

// SafeLimit is the limit a region whose safe share is ppm runs the global
// limit at when it runs the safe share — cold, lapsed, unnamed by its
// table, or for a key no table names: T_r from the share (RegionalLimit),
// and the safe burst SafeBurst. region.SafeLimit is this function.
func SafeLimit(global gcra.Limit, ppm uint32, regions int) gcra.Limit {
	return RegionalLimit(global, ppm, SafeBurst(global.Burst(), ppm, regions))
}

// SafeBurst is the burst of a region whose safe share is ppm, one of
// regions regions, when it runs its safe share: with a unit of the global
// burst for every region, 1 + floor((burst − regions)·ppm/10⁶) — at least
// 1, so that a cold region can admit — and otherwise floor(burst·ppm/10⁶).
// Either way the safe bursts of regions whose safe shares sum to at most
// 10⁶ sum to at most burst, whatever the floors are, so a region can
// compute its own from its own floor, and the table's burst split can keep
// every region's as a floor (SplitBurst). The limit's burst (SafeLimit) is
// this, capped as RegionalLimit caps every burst.
func SafeBurst(burst int64, ppm uint32, regions int) int64 {
	if burst <= 0 {
		return 0
	}
	ppm = min(ppm, PPM)
	if regions >= 1 && burst >= int64(regions) {
		return 1 + mulDivPPM(burst-int64(regions), ppm)
	}
	return mulDivPPM(burst, ppm)
}

// ShrunkBurst is a regional burst b under a global burst from, taken to a
// global burst to: floor(b·to/from) when to is smaller, b otherwise — the
// part of the new budget a region whose burst was that part of the old one
// runs until a table splits the new one. Bursts that summed to at most
// from sum to at most to. Agents shrink their limits in force by it on a
// policy reload; the coordinator counts them so.
func ShrunkBurst(b, from, to int64) int64 {
	if b <= 0 || from <= 0 || to >= from {
		return b
	}
	to = max(to, 0)
	hi, lo := bits.Mul64(uint64(b), uint64(to))
	q, _ := bits.Div64(hi, lo, uint64(from)) // b·to/from < b: no overflow
	return int64(q)
}

// mulDivPPM is floor(x·ppm/10⁶) for 0 ≤ x and ppm ≤ 10⁶, without
// overflow.
func mulDivPPM(x int64, ppm uint32) int64 {
	hi, lo := bits.Mul64(uint64(x), uint64(ppm))
	q, _ := bits.Div64(hi, lo, PPM) // hi < PPM: x < 2^63 and ppm ≤ 10⁶
	return int64(q)
}

// SplitBurst divides the global burst among regions in proportion to their
// shares by largest remainder (Split), so the parts never sum above the
// global burst. Then, when floors is not nil and its parts sum to at most
// the burst, every region r gets at least floors[r] — the burst it runs at
// its safe share (SafeBurst), as a share never falls below the safe share —
// each region below its floor taking units from the regions above theirs,
// most surplus first (ties to the lower index); floors summing above the
// burst cannot all be kept and are ignored. Last, every region with demand
// and a non-zero share gets a burst of at least 1: such regions are served
// largest share first (ties to the lower index), each taking one unit from
// the region holding the most that can spare one (a region keeps its floor,
// and at least 1 when it has demand and a share; any other region may go to
// 0). When the global burst is smaller than the number of such regions that
// cannot be done without exceeding it: the regions with demand and the
// largest shares get one unit each and the others get 0, so they deny until
// the burst or their share grows. weights is scratch space and out receives
// the bursts; both have len(shares) elements, as do demand and floors (when
// not nil). It allocates nothing for up to 16 regions.
func SplitBurst(burst int64, shares []uint32, floors []int64, demand []bool, weights []float64, out []int64) {
	var stack [16]int64
	rem := stack[:0]
	if len(shares) <= len(stack) {
		rem = stack[:len(shares)]
	} else {
		rem = make([]int64, len(shares))
	}
	splitShares(burst, shares, out, rem)
	floor := func(i int) int64 { return 0 }
	if floors != nil {
		sum := int64(0)
		for _, f := range floors {
			sum += max(f, 0)
		}
		if sum <= burst {
			floor = func(i int) int64 { return max(floors[i], 0) }
			for i := range out {
				for out[i] < floor(i) {
					donor := -1
					for j := range out {
						if out[j] > floor(j) && (donor < 0 || out[j]-floor(j) > out[donor]-floor(donor)) {
							donor = j
						}
					}
					if donor < 0 {
						break // unreachable: the floors fit in the burst
					}
					give := min(floor(i)-out[i], out[donor]-floor(donor))
					out[donor] -= give
					out[i] += give
				}
			}
		}
	}
	needs := func(i int) bool { return shares[i] > 0 && demand[i] }
	for {
		taker := -1
		for i := range shares {
			if needs(i) && out[i] == 0 && (taker < 0 || shares[i] > shares[taker]) {
				taker = i
			}
		}
		if taker < 0 {
			return
		}
		donor := -1
		for j := range out {
			keep := floor(j)
			if needs(j) {
				keep = max(keep, 1)
			}
			if out[j] > keep && (donor < 0 || out[j] > out[donor]) {
				donor = j
			}
		}
		if donor < 0 {
			return // fewer units than regions with demand
		}
		out[donor]--
		out[taker]++
	}
}

// ErrBadShares reports shares that break the table's rules.
var ErrBadShares = errors.New("rebalance: invalid shares")

// CheckShares verifies one key's shares: each at least its floor, and the
// sum at most PPM (unless overcommit is allowed, for the full strategy).
func CheckShares(shares, safe []uint32, overcommit bool) error {
	if len(safe) != len(shares) {
		return fmt.Errorf("%w: %d shares for %d floors", ErrBadShares, len(shares), len(safe))
	}
	sum := int64(0)
	for i, s := range shares {
		if s < safe[i] {
			return fmt.Errorf("%w: region %d share %d below its floor %d", ErrBadShares, i, s, safe[i])
		}
		sum += int64(s)
	}
	if sum > PPM && !overcommit {
		return fmt.Errorf("%w: shares sum to %d ppm, above %d", ErrBadShares, sum, PPM)
	}
	return nil
}

// splitShares is Split for integer weights (shares in ppm), in exact
// integer arithmetic: each part gets floor(total·s/Σs), and the units left
// go one each to the largest remainders, ties to the lower index. total·s
// fits in 64 bits: total is a burst (≤ MaxWindow µs < 2^37) and s ≤ 2^32.
// rem is scratch space of len(shares).
func splitShares(total int64, shares []uint32, out []int64, rem []int64) {
	var sum int64
	for _, s := range shares {
		sum += int64(s)
	}
	clear(out)
	if total <= 0 || sum == 0 {
		return
	}
	given := int64(0)
	for i, s := range shares {
		p := total * int64(s)
		out[i], rem[i] = p/sum, p%sum
		given += out[i]
	}
	for ; given < total; given++ {
		best := -1
		for i, s := range shares {
			if s > 0 && rem[i] >= 0 && (best < 0 || rem[i] > rem[best]) {
				best = i
			}
		}
		out[best]++
		rem[best] = -1 // one unit each
	}
}
