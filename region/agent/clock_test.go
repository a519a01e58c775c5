package agent

import (
	"path/filepath"
	"testing"

	"github.com/meridian-quota/meridian/gcra/memstore"
	"github.com/meridian-quota/meridian/internal/regiontest"
)

// The agent's time is the host's wall clock, clamped never to go back.
// Leases are instants on the coordinator's wall clock, so a wall-clock
// error the host had when the agent started (booted before NTP synced)
// must go away once NTP corrects it. Fails on 2023668 (which has no wall
// seam, so this does not compile there): the agent's now was start wall
// time + monotonic time since start, so after the wall clock stepped
// forward 1 h the agent's time stayed 1 h behind it for good (and its
// leases lapsed an hour late).
func TestAgentClockFollowsTheWallClock(t *testing.T) {
	ms, err := memstore.New(memstore.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	node := regiontest.Node(t, testPolicy, ms)
	cfg := DefaultConfig()
	cfg.DrainDelay = 0 // stopped at once
	cfg.Region, cfg.Agent, cfg.Regions = "eu", "eu-1", []string{"eu"}
	cfg.Policy = filepath.Join(t.TempDir(), "policy.yaml")
	a, err := New(cfg, node, nil)
	if err != nil {
		t.Fatal(err)
	}
	const t0 = int64(1_700_000_000_000_000)
	const hour = int64(3_600_000_000)
	wall := t0
	a.wall = func() int64 { return wall }
	tests := []struct {
		name       string
		wall, want int64
	}{
		{"start: the wall clock is an hour slow", t0, t0},
		{"NTP steps it forward 1 h", t0 + hour, t0 + hour},
		{"then back 2 s", t0 + hour - 2_000_000, t0 + hour},
		{"caught up", t0 + hour + 1, t0 + hour + 1},
	}
	for _, tt := range tests {
		wall = tt.wall
		if got := a.now(); got != tt.want {
			t.Errorf("%s: now = t0%+dµs, want t0%+dµs", tt.name, got-t0, tt.want-t0)
		}
	}
}
