package rebalance

import (
	"testing"

	"pgregory.net/rapid"

	"github.com/meridian-quota/meridian/gcra"
)

// TestPropertyRegionalBurst holds the coordinator's burst-only split to
// the limits agents derive: regionalBurst is RegionalLimit's burst for any
// limit, share and burst, the edges of MaxWindow and MaxBurst included.
func TestPropertyRegionalBurst(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		tMicros := rapid.OneOf(
			rapid.Int64Range(1, 1_000_000),
			rapid.Int64Range(1, gcra.MaxWindowMicros),
			rapid.SampledFrom([]int64{1, 1 << 43, 9_223_372_036_854, gcra.MaxWindowMicros / 1_000_000, gcra.MaxWindowMicros}),
		).Draw(t, "T")
		global := gcra.FromInterval(tMicros, 1)
		share := rapid.OneOf(rapid.Uint32Range(0, PPM), rapid.SampledFrom([]uint32{0, 1, 2, PPM - 1, PPM, PPM + 1})).Draw(t, "share")
		// The bursts around the clamp: the largest whose window b·T_r fits
		// MaxWindow, and its neighbours.
		edge := int64(1)
		if tr := RegionalLimit(global, share, 1).IntervalMicros(); tr > 0 {
			edge = gcra.MaxWindowMicros / tr
		}
		burst := rapid.OneOf(
			rapid.Int64Range(-1, 1000),
			rapid.Int64Range(0, gcra.MaxBurst+10),
			rapid.SampledFrom([]int64{gcra.MaxBurst, gcra.MaxBurst + 1, gcra.MaxWindowMicros, edge - 1, edge, edge + 1}),
		).Draw(t, "burst")
		if got, want := regionalBurst(global, share, burst), RegionalLimit(global, share, burst).Burst(); got != want {
			t.Fatalf("regionalBurst(T=%d, %d ppm, burst %d) = %d, RegionalLimit's burst %d", tMicros, share, burst, got, want)
		}
	})
}
