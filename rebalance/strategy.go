package rebalance

import "github.com/meridian-quota/meridian/gcra"

// Input is what a strategy sees of one key at one rebalance. Every slice is
// indexed by region, in the coordinator's region order, and has the same
// length.
type Input struct {
	// Budget is the key's global limit.
	Budget gcra.Limit
	// Demand is the offered cost per second in the last interval, summed
	// over the region's agents (finite, ≥ 0; the coordinator checks).
	Demand []float64
	// Last holds the shares of the previous table; nil before the first.
	Last []uint32
	// Safe holds the floors every table gives (Σ ≤ PPM).
	Safe []uint32
	// State is the strategy's own per-key memory, kept by the coordinator
	// between rebalances (ewma keeps its smoothed demand here); all zero
	// before the first rebalance of a key.
	State []float64
}

// Strategy turns one key's demand into shares. Implementations are pure
// and deterministic (no map iteration order, no clock, no randomness) and
// safe for concurrent use on different Inputs.
type Strategy interface {
	// Name is the name the configuration chooses the strategy by.
	Name() string
	// Allocate writes the key's shares in ppm into out (len(in.Demand)
	// elements): each at least in.Safe, summing to at most PPM unless
	// Overcommit. It may update in.State.
	Allocate(in *Input, out []uint32)
	// Overcommit reports whether shares may sum above PPM (only the full
	// strategy, which the configuration must allow explicitly).
	Overcommit() bool
}

// Params configures the strategies; each reads only its own fields.
type Params struct {
	// Weights of the static strategy by region; missing regions weigh 0,
	// and no weights at all is an equal split.
	Weights map[string]float64
	// Home is the home strategy's region.
	Home string
	// AlphaUp and AlphaDown are the ewma strategy's smoothing factors in
	// (0, 1] for rising and falling demand.
	AlphaUp, AlphaDown float64
	// Headroom is the maxmin strategy's h: each region's demand counts as
	// demand·(1+h). ≥ 0.
	Headroom float64
	// AllowOvercommit must be true for the full strategy.
	AllowOvercommit bool
}
