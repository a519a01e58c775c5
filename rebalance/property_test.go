package rebalance_test

import (
	"math"
	"math/big"
	"slices"
	"strings"
	"testing"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/rebalance"
	"pgregory.net/rapid"
)

// propCase is one key at one rebalance, drawn at random.
type propCase struct {
	name    string
	regions []string
	params  rebalance.Params
	in      rebalance.Input
}

var regionPool = []string{"af", "ap", "ca", "eu", "me", "sa", "us", "uk", "in", "jp"}

// genDemand draws one region's demand per second: none, small, ordinary,
// huge, the largest float, and the bad values strategies count as 0.
func genDemand() *rapid.Generator[float64] {
	return rapid.OneOf(
		rapid.Just(0.0),
		rapid.Just(0.0),
		rapid.Float64Range(0, 1),
		rapid.Float64Range(0, 1e4),
		rapid.Float64Range(1e4, 1e12),
		rapid.Float64Range(0, 1e300),
		rapid.Just(math.MaxFloat64),
		rapid.Just(math.NaN()),
		rapid.Just(math.Inf(1)),
		rapid.Just(-1.0),
	)
}

// genFloors draws n floors with Σ ≤ PPM: all zero, summing to exactly PPM,
// small each, or a random total split at random.
func genFloors(t *rapid.T, n int) []uint32 {
	safe := make([]uint32, n)
	split := func(total int64) {
		w := rapid.SliceOfN(rapid.Float64Range(0, 100), n, n).Draw(t, "floorWeights")
		parts := make([]int64, n)
		rebalance.Split(total, w, parts)
		for i, p := range parts {
			safe[i] = uint32(p)
		}
	}
	switch rapid.IntRange(0, 3).Draw(t, "floorMode") {
	case 1:
		split(rebalance.PPM)
		if slices.Max(safe) == 0 {
			safe[0] = rebalance.PPM
		}
	case 2:
		for i := range safe {
			safe[i] = rapid.Uint32Range(0, rebalance.PPM/uint32(n)).Draw(t, "floor")
		}
	case 3:
		split(rapid.Int64Range(0, rebalance.PPM).Draw(t, "floorTotal"))
	}
	return safe
}

func genCase(t *rapid.T, name string) propCase {
	n := rapid.IntRange(1, 10).Draw(t, "regions")
	regions := rapid.Permutation(regionPool).Draw(t, "names")[:n]
	c := propCase{name: name, regions: regions}
	c.in.Budget = gcra.FromInterval(rapid.Int64Range(1, 10_000_000).Draw(t, "T"), rapid.Int64Range(1, 10_000).Draw(t, "burst"))
	if rapid.IntRange(0, 20).Draw(t, "zeroBudget") == 0 {
		c.in.Budget = gcra.Limit{}
	}
	if T := c.in.Budget.IntervalMicros(); T > 0 && rapid.Bool().Draw(t, "nearBudget") {
		// Demand around the budget's rate (10⁶/T per second), where the
		// water-filling and Doorman strategies change regime.
		c.in.Demand = make([]float64, n)
		for i := range c.in.Demand {
			c.in.Demand[i] = rapid.OneOf(rapid.Just(0.0), rapid.Float64Range(0, 2/float64(n))).Draw(t, "fraction") * 1e6 / float64(T)
		}
	} else {
		c.in.Demand = rapid.SliceOfN(genDemand(), n, n).Draw(t, "demand")
	}
	c.in.Safe = genFloors(t, n)
	switch rapid.IntRange(0, 2).Draw(t, "lastMode") {
	case 1: // any shares, valid or not
		c.in.Last = rapid.SliceOfN(rapid.Uint32Range(0, rebalance.PPM), n, n).Draw(t, "last")
	case 2: // a valid table: the floors plus a split of the rest
		c.in.Last = slices.Clone(c.in.Safe)
		rest := int64(rebalance.PPM)
		for _, s := range c.in.Safe {
			rest -= int64(s)
		}
		w := rapid.SliceOfN(rapid.Float64Range(0, 10), n, n).Draw(t, "lastWeights")
		parts := make([]int64, n)
		rebalance.Split(rapid.Int64Range(0, rest).Draw(t, "lastTotal"), w, parts)
		for i := range parts {
			c.in.Last[i] += uint32(parts[i])
		}
	}
	switch rapid.IntRange(0, 2).Draw(t, "stateMode") {
	case 1:
		c.in.State = make([]float64, n)
	case 2:
		c.in.State = rapid.SliceOfN(rapid.OneOf(rapid.Just(0.0), rapid.Float64Range(0, 1e6), rapid.Float64Range(0, 1e300)), n, n).Draw(t, "state")
	}
	switch name {
	case "static":
		if rapid.Bool().Draw(t, "weighted") {
			c.params.Weights = map[string]float64{}
			for _, r := range regions {
				if rapid.Bool().Draw(t, "listed") {
					c.params.Weights[r] = rapid.Float64Range(0, 1e6).Draw(t, "weight")
				}
			}
			c.params.Weights[rapid.SampledFrom(regions).Draw(t, "heavy")] = rapid.Float64Range(1e-3, 1e300).Draw(t, "heavyWeight")
		}
	case "home":
		c.params.Home = rapid.SampledFrom(regions).Draw(t, "home")
	case "ewma", "quantile":
		alpha := rapid.OneOf(rapid.Float64Range(1e-6, 1), rapid.Just(1.0))
		c.params.AlphaUp = alpha.Draw(t, "alphaUp")
		c.params.AlphaDown = alpha.Draw(t, "alphaDown")
	case "maxmin":
		c.params.Headroom = rapid.OneOf(rapid.Just(0.0), rapid.Float64Range(0, 2), rapid.Float64Range(0, 1e6)).Draw(t, "headroom")
	}
	return c
}

func (c *propCase) clone() rebalance.Input {
	in := c.in
	in.Demand = slices.Clone(in.Demand)
	in.Safe = slices.Clone(in.Safe)
	in.Last = slices.Clone(in.Last)
	in.State = slices.Clone(in.State)
	return in
}

// run allocates c once on a copy of its input and returns the shares and
// the State after.
func (c *propCase) run(t *rapid.T) ([]uint32, []float64) {
	s, err := rebalance.NewStrategy(c.name, c.regions, c.params)
	if err != nil {
		t.Fatalf("NewStrategy: %v", err)
	}
	in := c.clone()
	out := make([]uint32, len(c.regions))
	s.Allocate(&in, out)
	return out, in.State
}

// keepsLast reports whether the strategy's rule keeps the last table for c:
// proportional and ewma when no region weighs anything and Last is valid.
func (c *propCase) keepsLast(stateAfter []float64) bool {
	some := false
	for i, d := range c.in.Demand {
		switch {
		case c.name == "proportional":
			some = some || (d > 0 && !math.IsInf(d, 1))
		case (c.name == "ewma" || c.name == "quantile") && stateAfter != nil:
			some = some || stateAfter[i] > 0
		case c.name == "ewma" || c.name == "quantile":
			some = some || (d > 0 && !math.IsInf(d, 1) && c.params.AlphaUp*d > 0)
		case c.name == "maxmin":
			// Demand that rounds to a ppm of the budget or more.
			x := d * float64(c.in.Budget.IntervalMicros()) * (1 + c.params.Headroom)
			some = some || (d > 0 && !math.IsInf(d, 1) && x >= 0.5)
		case strings.HasPrefix(c.name, "doorman"):
			some = some || (d > 0 && !math.IsInf(d, 1) && d*float64(c.in.Budget.IntervalMicros()) > 0)
		default:
			return false
		}
	}
	if some || c.in.Last == nil {
		return false
	}
	return rebalance.CheckShares(c.in.Last, c.in.Safe, false) == nil
}

var propStrategies = []string{"static", "home", "proportional", "ewma", "quantile", "maxmin", "doorman-proportional", "doorman-fair"}

// TestPropertyInvariants checks every strategy but full over random input:
// floors, Σ ≤ PPM (= PPM unless the last table is kept), the derived
// regional rates and bursts within the global ones, a burst for every region
// with demand while the global burst allows, determinism, and independence
// of the order the regions are listed in.
func TestPropertyInvariants(t *testing.T) {
	for _, name := range propStrategies {
		t.Run(name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				c := genCase(t, name)
				n := len(c.regions)
				out, state := c.run(t)

				// Floors and the sum.
				sum := int64(0)
				for i, s := range out {
					if s < c.in.Safe[i] {
						t.Fatalf("region %d share %d below its floor %d (shares %v)", i, s, c.in.Safe[i], out)
					}
					sum += int64(s)
				}
				if sum > rebalance.PPM {
					t.Fatalf("shares %v sum to %d > PPM", out, sum)
				}
				if c.keepsLast(state) {
					if !slices.Equal(out, c.in.Last) {
						t.Fatalf("shares %v, want the last table %v kept", out, c.in.Last)
					}
				} else if sum != rebalance.PPM {
					t.Fatalf("shares %v sum to %d, want exactly PPM", out, sum)
				}

				// Regional limits: Σ 1/T_r ≤ 1/T exactly, Σ bursts ≤ B.
				demand := make([]bool, n)
				withDemand := int64(0)
				for i, d := range c.in.Demand {
					demand[i] = d > 0 && !math.IsInf(d, 1)
					if demand[i] && out[i] > 0 {
						withDemand++
					}
				}
				limits := make([]gcra.Limit, n)
				bursts := make([]int64, n)
				rebalance.Derive(c.in.Budget, out, nil, demand, limits, make([]float64, n), bursts)
				T, B := c.in.Budget.IntervalMicros(), c.in.Budget.Burst()
				rate, sumB, sumLB := new(big.Rat), int64(0), int64(0)
				for i, l := range limits {
					sumB += bursts[i]
					if l.IsZero() {
						continue
					}
					if err := l.Validate(); err != nil {
						t.Fatalf("region %d: %v", i, err)
					}
					rate.Add(rate, big.NewRat(1, l.IntervalMicros()))
					sumLB += l.Burst()
					if l.Burst() < 1 || l.Burst() > bursts[i] {
						t.Fatalf("region %d: limit %v, split burst %d", i, l, bursts[i])
					}
				}
				if c.in.Budget.IsZero() {
					if rate.Sign() != 0 {
						t.Fatalf("a zero budget gave regional limits %v", limits)
					}
				} else if rate.Cmp(big.NewRat(1, T)) > 0 {
					t.Fatalf("Σ 1/T_r = %v > 1/T = 1/%d (limits %v)", rate, T, limits)
				}
				if sumB > B || sumLB > B {
					t.Fatalf("bursts %v sum to %d (limits %d), above the global %d", bursts, sumB, sumLB, B)
				}
				if B >= withDemand {
					for i := range out {
						if demand[i] && out[i] > 0 && bursts[i] < 1 {
							t.Fatalf("region %d has demand and share %d but burst 0 (bursts %v, global %d)", i, out[i], bursts, B)
						}
					}
				}

				// Deterministic: the same input gives the same output.
				out2, state2 := c.run(t)
				if !slices.Equal(out, out2) || !slices.Equal(state, state2) {
					t.Fatalf("second run: %v %v, first %v %v", out2, state2, out, state)
				}

				// Listing the regions in another order permutes the output.
				perm := rapid.Permutation(seq(n)).Draw(t, "perm")
				p := c
				p.regions = permute(c.regions, perm)
				p.in.Demand = permute(c.in.Demand, perm)
				p.in.Safe = permute(c.in.Safe, perm)
				p.in.Last = permute(c.in.Last, perm)
				p.in.State = permute(c.in.State, perm)
				outP, stateP := p.run(t)
				if want := permute(out, perm); !slices.Equal(outP, want) {
					t.Fatalf("regions %v: shares %v, want %v (from %v for %v)", p.regions, outP, want, out, c.regions)
				}
				if want := permute(state, perm); !slices.Equal(stateP, want) {
					t.Fatalf("regions %v: state %v, want %v", p.regions, stateP, want)
				}
			})
		})
	}
}

// TestPropertyOwnDemandMonotone: for the strategies that follow demand,
// raising only region r's demand never lowers r's share.
func TestPropertyOwnDemandMonotone(t *testing.T) {
	for _, name := range []string{"proportional", "ewma", "quantile", "maxmin", "doorman-proportional"} {
		t.Run(name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				c := genCase(t, name)
				r := rapid.IntRange(0, len(c.regions)-1).Draw(t, "r")
				before, _ := c.run(t)
				d := c.in.Demand[r]
				if !(d > 0) || math.IsInf(d, 1) {
					d = 0 // what the strategy counts it as
				}
				raised := rapid.OneOf(
					rapid.Float64Range(d, math.Min(d*1.000001+1e-300, math.MaxFloat64)),
					rapid.Float64Range(d, math.Min(d+1, math.MaxFloat64)),
					rapid.Float64Range(d, math.Min(d*2+1, math.MaxFloat64)),
					rapid.Float64Range(d, math.MaxFloat64),
				).Draw(t, "raised")
				c.in.Demand = slices.Clone(c.in.Demand)
				c.in.Demand[r] = raised
				after, _ := c.run(t)
				if after[r] < before[r] {
					t.Fatalf("region %d demand %v → %v: share %d → %d (shares %v → %v)", r, d, raised, before[r], after[r], before, after)
				}
			})
		})
	}
}

// TestPropertySplit checks Split alone: the parts sum to the total, each is
// within one unit of its exact quota, and raising one weight never lowers
// its part.
func TestPropertySplit(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 12).Draw(t, "n")
		w := rapid.SliceOfN(rapid.OneOf(rapid.Just(0.0), rapid.Float64Range(0, 10), rapid.Float64Range(0, 1e300), rapid.Just(1.0)), n, n).Draw(t, "w")
		total := rapid.OneOf(rapid.Int64Range(0, 20), rapid.Just(int64(rebalance.PPM)), rapid.Int64Range(0, 1<<40)).Draw(t, "total")
		out := make([]int64, n)
		rebalance.Split(total, w, out)
		sum, sumW := int64(0), new(big.Rat)
		for i := range out {
			sum += out[i]
			sumW.Add(sumW, new(big.Rat).SetFloat64(w[i]))
		}
		if sumW.Sign() == 0 {
			if sum != 0 {
				t.Fatalf("Split(%d, %v) = %v, want zeros", total, w, out)
			}
			return
		}
		if sum != total {
			t.Fatalf("Split(%d, %v) = %v sums to %d", total, w, out, sum)
		}
		for i := range out {
			q := new(big.Rat).Mul(big.NewRat(total, 1), new(big.Rat).SetFloat64(w[i]))
			q.Quo(q, sumW)
			lo := new(big.Rat).Sub(q, big.NewRat(1, 1))
			hi := new(big.Rat).Add(q, big.NewRat(1, 1))
			if v := big.NewRat(out[i], 1); v.Cmp(lo) < 0 || v.Cmp(hi) > 0 {
				t.Fatalf("Split(%d, %v)[%d] = %d, quota %v", total, w, i, out[i], q.FloatString(3))
			}
		}
		r := rapid.IntRange(0, n-1).Draw(t, "r")
		w2 := slices.Clone(w)
		w2[r] = rapid.Float64Range(w[r], math.MaxFloat64).Draw(t, "raised")
		out2 := make([]int64, n)
		rebalance.Split(total, w2, out2)
		if out2[r] < out[r] {
			t.Fatalf("weight %d %v → %v: part %d → %d", r, w[r], w2[r], out[r], out2[r])
		}
	})
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// permute returns s reordered so that element k is s[perm[k]] (nil stays
// nil).
func permute[E any](s []E, perm []int) []E {
	if s == nil {
		return nil
	}
	p := make([]E, len(s))
	for k, i := range perm {
		p[k] = s[i]
	}
	return p
}

// TestPropertySafeBursts: whatever the floors (summing to at most PPM),
// the regions' safe bursts sum to at most the global burst, a region whose
// burst has a unit per region gets at least 1, and a table's burst split
// with them as floors gives every region at least its safe burst with the
// bursts summing to at most the global burst — so any mix of regions
// running the table and regions running their safe share stays within it.
func TestPropertySafeBursts(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 8).Draw(t, "n")
		budget := gcra.FromInterval(rapid.Int64Range(1, 1_000_000).Draw(t, "T"), rapid.OneOf(rapid.Int64Range(1, 12), rapid.Int64Range(1, 100_000)).Draw(t, "burst"))
		left := int64(rebalance.PPM)
		safe, shares := make([]uint32, n), make([]uint32, n)
		for i := range n {
			safe[i] = uint32(rapid.Int64Range(0, left).Draw(t, "safe"))
			left -= int64(safe[i])
		}
		rest := left
		for i := range n {
			shares[i] = safe[i]
			if i == n-1 {
				shares[i] += uint32(rest)
			} else {
				add := rapid.Int64Range(0, rest).Draw(t, "add")
				shares[i] += uint32(add)
				rest -= add
			}
		}
		floors := make([]int64, n)
		sumF := int64(0)
		for i := range n {
			floors[i] = rebalance.SafeLimit(budget, safe[i], n).Burst()
			sumF += floors[i]
			if b := rebalance.SafeBurst(budget.Burst(), safe[i], n); budget.Burst() >= int64(n) && b < 1 {
				t.Fatalf("SafeBurst(%d, %d, %d) = %d, want at least 1", budget.Burst(), safe[i], n, b)
			}
		}
		if sumF > budget.Burst() {
			t.Fatalf("safe bursts %v (floors %v) sum to %d, above the burst %d", floors, safe, sumF, budget.Burst())
		}
		demand := make([]bool, n)
		for i := range n {
			demand[i] = shares[i] > 0
		}
		limits, bursts := make([]gcra.Limit, n), make([]int64, n)
		rebalance.Derive(budget, shares, floors, demand, limits, make([]float64, n), bursts)
		sumB := int64(0)
		for i, l := range limits {
			sumB += l.Burst()
			if l.Burst() < floors[i] {
				t.Fatalf("shares %v floors %v: region %d burst %d below its safe burst %d", shares, safe, i, l.Burst(), floors[i])
			}
		}
		if sumB > budget.Burst() {
			t.Fatalf("shares %v: bursts %v sum to %d, above %d", shares, bursts, sumB, budget.Burst())
		}
	})
}
