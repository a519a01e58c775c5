package region

import (
	"testing"

	"github.com/meridian-quota/meridian/rebalance"
)

// TestNodeIdleFloor: with idle floors below the safe share, a key no table
// names runs at the idle floor — the coordinator may have given the rest of
// it away, counting this region at that floor — and the node's reports say
// so (rebalance.AgentIdleFloors); with IdleSafeFraction 0 it runs at the
// safe share and says nothing.
func TestNodeIdleFloor(t *testing.T) {
	tests := []struct {
		name         string
		idle         float64
		wantAdmitted int
		wantFeature  bool
	}{
		// Safe 25 % of burst 10 over two regions: 1 + floor(8·0.25) = 3.
		{"safe share", 0, 3, false},
		// Idle 5 %: 1 + floor(8·0.05) = 1.
		{"idle floor", 0.1, 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, e := range envs(t) {
				t.Run(e.name, func(t *testing.T) {
					cfg := DefaultConfig("eu", "eu-1", regions...)
					cfg.SafeFraction = 0.5
					cfg.IdleSafeFraction = tt.idle
					n, err := NewNode(cfg, mustPolicy(t, testPolicy), e.store)
					if err != nil {
						t.Fatal(err)
					}
					if got := decideN(t, n, e.now(), req(1, tenant("acme")), 5); got != tt.wantAdmitted {
						t.Errorf("admitted %d of a key no table names, want %d", got, tt.wantAdmitted)
					}
					n.Tick(e.now())
					rep := n.Tick(e.now() + 2*cfg.Interval.Microseconds())
					if rep == nil {
						t.Fatal("no report after an interval")
					}
					if got := rep.Features&rebalance.AgentIdleFloors != 0; got != tt.wantFeature {
						t.Errorf("report says AgentIdleFloors %v, want %v", got, tt.wantFeature)
					}
				})
			}
		})
	}
}
