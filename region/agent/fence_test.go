package agent

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/internal/regiontest"
)

// clusterBase is a config that joins a cluster, short of its coordinator
// settings.
const clusterBase = "region: eu\nagent: eu-1\nregions: [eu, us]\npolicy: p.yaml\n" +
	"cluster: {name: c, nats: {urls: [nats://x]}, members: {bind: 127.0.0.1:7946, allow_plaintext: true}, coordinator: {verify_keys_env: K%s}}\n"

// TestReserveWaitWithinFence: booked future must not outlive the fence the
// coordinator puts before an increase (ARCHITECTURE.md invariant 4): the
// agent refuses a reservation horizon or a local lease TTL longer than its
// cluster's fence, and its HTTP API books no further ahead than the horizon.
//
// fails on 2023668: there was no reserve_max_wait (the node booked up to
// the lease left, 30 s), a lease.ttl of 1s was accepted under a fence of
// 500ms, and POST /v1/reserve took max_wait_ms up to 3,600,000.
func TestReserveWaitWithinFence(t *testing.T) {
	tests := []struct {
		name, give string
		want       []string // none: accepted
	}{
		{"default horizon within the default fence", clusterBase, nil},
		{"horizon above the default fence", "reserve_max_wait: 5s\n" + clusterBase,
			[]string{"reserve_max_wait: 5s", "cluster.coordinator.fence (2s)"}},
		{"horizon within a longer fence", "reserve_max_wait: 5s\n" + strings.Replace(clusterBase, "%s", ", fence: 5s, lease: 60s", 1), nil},
		{"horizon above a shorter fence", strings.Replace(clusterBase, "%s", ", fence: 1s", 1),
			[]string{"reserve_max_wait: 2s", "cluster.coordinator.fence (1s)"}},
		{"standalone: no fence to keep", "reserve_max_wait: 1m\nregion: eu\nagent: eu-1\nregions: [eu]\npolicy: p.yaml\n", nil},
		{"negative horizon", "reserve_max_wait: -1s\nregion: eu\nagent: eu-1\nregions: [eu]\npolicy: p.yaml\n", []string{"reserve_max_wait: -1s: must be in [0s, 1h0m0s]"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			give := strings.Replace(tt.give, "%s", "", 1)
			_, err := ParseConfig([]byte(give))
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			for _, w := range tt.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("err = %v, want it to contain %q", err, w)
				}
			}
		})
	}

	t.Run("lease.ttl above the fence", func(t *testing.T) {
		const pol = `
domains:
  - domain: api
    descriptors:
      - key: tenant
        rate_limit: {unit: second, requests_per_unit: 1000, burst: 100, lease: {units: 10, ttl: 1s}}
`
		dir := t.TempDir()
		cfg, err := ParseConfig([]byte(strings.Replace(clusterBase, "%s", ", fence: 500ms, max_skew: 100ms", 1) + "reserve_max_wait: 500ms\n"))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Policy = filepath.Join(dir, "policy.yaml")
		if err := os.WriteFile(cfg.Policy, []byte(pol), 0o644); err != nil {
			t.Fatal(err)
		}
		node := regiontest.Node(t, pol, regiontest.RedisStore(t))
		_, err = New(*cfg, node, nil)
		for _, w := range []string{"domains[0].descriptors[0]", "lease.ttl 1s", "cluster.coordinator.fence (500ms)"} {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("New: err = %v, want it to contain %q", err, w)
			}
		}
		// The same policy arriving by reload is rejected; the old one stays.
		cfg.Cluster.Coordinator.Fence = Duration(time.Second)
		a, err := New(*cfg, regiontest.Node(t, testPolicy, regiontest.RedisStore(t)), nil)
		if err != nil {
			t.Fatal(err)
		}
		a.cfg.Cluster.Coordinator.Fence = Duration(500 * time.Millisecond)
		old := a.node.Policy().Version()
		if err := a.Reload(); err == nil || !strings.Contains(err.Error(), "lease.ttl 1s") || a.node.Policy().Version() != old {
			t.Errorf("reload: err = %v, policy changed %v", err, a.node.Policy().Version() != old)
		}
	})

	t.Run("HTTP max_wait_ms follows reserve_max_wait", func(t *testing.T) {
		_, _, url := start(t)
		post := func(ms string) (int, string) {
			body := `{"domain": "api", "descriptors": [{"entries": [{"key": "tenant", "value": "acme"}]}], "max_wait_ms": ` + ms + `}`
			resp, err := http.Post(url+"/v1/reserve", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		if code, body := post("2000"); code != http.StatusOK {
			t.Errorf("max_wait_ms 2000 (the default horizon): %d %s", code, body)
		}
		if code, body := post("3000"); code != http.StatusBadRequest || !strings.Contains(body, "[0, 2000]") || !strings.Contains(body, "reserve_max_wait") {
			t.Errorf("max_wait_ms 3000: %d %q, want 400 naming the bound [0, 2000] and reserve_max_wait", code, body)
		}
	})
}
