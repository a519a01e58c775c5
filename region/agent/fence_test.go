package agent

import (
	"context"
	"errors"
	"testing"

	"github.com/meridian-quota/meridian/gcra/memstore"
	"github.com/meridian-quota/meridian/region"
)

// A node that carries the region fence with nobody raising it would run
// every key at its safe share (the store holds no fence, so it refuses
// every fenced decision); a fencer for a node that does not fence would
// have its acknowledgements claim a fence its decisions ignore. Run
// refuses both at once, before serving anything.
func TestRunRefusesAFenceWithoutAFencer(t *testing.T) {
	ms, err := memstore.New(memstore.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		fence, fencer bool
	}{{true, false}, {false, true}} {
		pol, err := region.ParsePolicy([]byte(testPolicy))
		if err != nil {
			t.Fatal(err)
		}
		ncfg := region.DefaultConfig("eu", "eu-1", "eu")
		ncfg.Fence = tc.fence
		node, err := region.NewNode(ncfg, pol, ms)
		if err != nil {
			t.Fatal(err)
		}
		cfg := DefaultConfig()
		cfg.Region, cfg.Agent, cfg.Regions, cfg.Policy = "eu", "eu-1", []string{"eu"}, "(test)"
		a, err := New(cfg, node, nil)
		if err != nil {
			t.Fatal(err)
		}
		if tc.fencer {
			a.SetFencer(ms)
		}
		if err := a.Run(context.Background(), nil, nil); !errors.Is(err, ErrConfig) {
			t.Errorf("fence %v, fencer %v: Run = %v, want ErrConfig", tc.fence, tc.fencer, err)
		}
	}
}
