package agent

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/meridian-quota/meridian/internal/regiontest"
	"github.com/meridian-quota/meridian/internal/testenv"
	"github.com/meridian-quota/meridian/region"
)

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// swapLink points link at target atomically, as upstream's runtime
// deployments (and Kubernetes' ..data) swap a tree: a new link renamed over
// the old one.
func swapLink(t *testing.T, target, link string) {
	t.Helper()
	tmp := link + ".new"
	if err := os.Symlink(target, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, link); err != nil {
		t.Fatal(err)
	}
}

// TestPolicyDigest: the digest follows content, not timestamps — an edit,
// an added or removed file, a swapped link change it; rewriting the same
// bytes does not.
func TestPolicyDigest(t *testing.T) {
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "v1", "config", "a.yaml"), "a: 1\n")
	writeFile(t, filepath.Join(root, "v2", "config", "a.yaml"), "a: 1\n")
	if err := os.Symlink("v1", filepath.Join(root, "current")); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "current", "config")
	d0 := policyDigest(dir)
	steps := []struct {
		name   string
		do     func()
		change bool
	}{
		{"same bytes rewritten", func() { writeFile(t, filepath.Join(root, "v1", "config", "a.yaml"), "a: 1\n") }, false},
		{"mtime moved", func() {
			old := time.Unix(1e9, 0)
			if err := os.Chtimes(filepath.Join(root, "v1", "config", "a.yaml"), old, old); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"edited", func() { writeFile(t, filepath.Join(root, "v1", "config", "a.yaml"), "a: 2\n") }, true},
		{"file added", func() { writeFile(t, filepath.Join(root, "v1", "config", "b.yaml"), "b: 1\n") }, true},
		{"dot file added", func() { writeFile(t, filepath.Join(root, "v1", "config", ".c.yaml"), "c: 1\n") }, true},
		{"nested file added", func() { writeFile(t, filepath.Join(root, "v1", "config", "sub", "d.yaml"), "d: 1\n") }, true},
		{"file removed", func() {
			if err := os.Remove(filepath.Join(root, "v1", "config", "b.yaml")); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"link swapped", func() { swapLink(t, "v2", filepath.Join(root, "current")) }, true},
		{"tree gone", func() {
			if err := os.RemoveAll(filepath.Join(root, "v2")); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"still gone", func() {}, false},
	}
	prev := d0
	for _, tt := range steps {
		tt.do()
		d := policyDigest(dir)
		if changed := d != prev; changed != tt.change {
			t.Errorf("%s: digest changed = %v, want %v", tt.name, changed, tt.change)
		}
		prev = d
	}
	// A link cycle ends.
	cyc := filepath.Join(t.TempDir(), "cyc")
	writeFile(t, filepath.Join(cyc, "a.yaml"), "a: 1\n")
	if err := os.Symlink(cyc, filepath.Join(cyc, "loop")); err != nil {
		t.Fatal(err)
	}
	_ = policyDigest(cyc)
}

// dirPolicy is a stand-in for region.LoadPolicy on a directory (a
// directory holding one Meridian-shape policy.yaml): it tests the watch
// apart from the loader of upstream's files.
func dirPolicy(path string, _ region.LoadOptions) (*region.Policy, error) {
	data, err := os.ReadFile(filepath.Join(path, "policy.yaml"))
	if err != nil {
		return nil, err
	}
	return region.ParsePolicy(data)
}

func ratePolicy(n int) string {
	return fmt.Sprintf("domains:\n  - domain: api\n    descriptors:\n      - key: tenant\n        rate_limit: {unit: hour, requests_per_unit: %d}\n", n)
}

// TestPolicyDirectoryWatch: an agent whose policy is a directory behind a
// link reloads when a file in it changes or the link is swapped, and keeps
// the policy it runs when the new one is broken, saying so (the gauge, the
// counter, the log).
func TestPolicyDirectoryWatch(t *testing.T) {
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "v1", "config", "policy.yaml"), ratePolicy(5))
	writeFile(t, filepath.Join(root, "v2", "config", "policy.yaml"), ratePolicy(9))
	if err := os.Symlink("v1", filepath.Join(root, "current")); err != nil {
		t.Fatal(err)
	}
	node := regiontest.Node(t, ratePolicy(5), regiontest.RedisStore(t))
	cfg := DefaultConfig()
	cfg.DrainDelay = 0 // stopped at once
	cfg.Region, cfg.Agent, cfg.Regions = "eu", "eu-1", []string{"eu"}
	cfg.Policy = filepath.Join(root, "current", "config")
	cfg.ReloadEvery = Duration(5 * time.Millisecond)
	var logs testenv.Buffer
	a, err := New(cfg, node, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	a.loadPolicy = dirPolicy
	cl := serveRLS(t, a)
	limit := func() uint32 {
		resp, err := cl.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{desc(nil, "tenant", "acme")}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Statuses[0].CurrentLimit.GetRequestsPerUnit()
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 10 s (limit %d/h)\nlog:\n%s", what, limit(), logs.String())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if got := limit(); got != 5 {
		t.Fatalf("limit %d/h at start, want 5", got)
	}
	writeFile(t, filepath.Join(root, "v1", "config", "policy.yaml"), ratePolicy(7))
	waitFor("an edited file reloaded", func() bool { return limit() == 7 })
	swapLink(t, "v2", filepath.Join(root, "current"))
	waitFor("a swapped link reloaded", func() bool { return limit() == 9 })

	writeFile(t, filepath.Join(root, "v2", "config", "policy.yaml"), "domains: [{domain: api, descriptors: [{key: tenant, rate_limit: {unit: fortnight}}]}]\n")
	waitFor("the broken file seen", a.reloadFailing.Load)
	if got := limit(); got != 9 {
		t.Errorf("limit %d/h after a broken file, want the old 9", got)
	}
	if got := metricValue(t, a, "meridian_policy_reload_failing"); got != 1 {
		t.Errorf("meridian_policy_reload_failing = %v, want 1", got)
	}
	if got := metricValue(t, a, `meridian_policy_reloads_total{result="rejected"}`); got < 1 {
		t.Errorf("rejected reloads = %v, want at least 1", got)
	}
	waitFor("the rejection logged", func() bool {
		return strings.Contains(logs.String(), "policy reload rejected") && strings.Contains(logs.String(), "fortnight")
	})

	writeFile(t, filepath.Join(root, "v2", "config", "policy.yaml"), ratePolicy(11))
	waitFor("a fixed file reloaded", func() bool { return limit() == 11 })
	if a.reloadFailing.Load() {
		t.Error("meridian_policy_reload_failing still 1 after a good policy loaded")
	}
}

// metricValue is the value of the series name (with its labels, as the
// exposition format writes them) in a's registry; -1 when absent.
func metricValue(t *testing.T, a *Agent, name string) float64 {
	t.Helper()
	mfs, err := a.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			id := mf.GetName()
			if len(m.GetLabel()) > 0 {
				var ls []string
				for _, l := range m.GetLabel() {
					ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
				}
				id += "{" + strings.Join(ls, ",") + "}"
			}
			if id != name {
				continue
			}
			switch {
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			}
		}
	}
	return -1
}

// The policy the node was built with was read before New: an edit in
// between (cmd loads the policy, then waits up to 2 s for Redis) must
// still be picked up by the first poll.
//
// Fails on f96aee6: New took the digest of the file as it was then, so an
// edit made after the policy was read and before New was never loaded
// (the polls compared against the edited content and saw no change) until
// the file changed again.
func TestPolicyEditedBeforeNewIsReloaded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeFile(t, path, ratePolicy(5))
	pol, err := region.LoadPolicy(path, region.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, ratePolicy(7)) // edited after the read, before New
	node, err := region.NewNode(region.DefaultConfig("eu", "eu-1", "eu"), pol, regiontest.RedisStore(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.DrainDelay = 0 // stopped at once
	cfg.Region, cfg.Agent, cfg.Regions, cfg.Policy = "eu", "eu-1", []string{"eu"}, path
	a, err := New(cfg, node, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !a.policyChanged() {
		t.Fatal("policyChanged is false: the edit made before New would never be loaded")
	}
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	if got, want := node.Policy().Version(), mustLoad(t, path).Version(); got != want {
		t.Errorf("policy %s after the reload, want the edited file's %s", got, want)
	}
	if a.policyChanged() {
		t.Error("policyChanged still true after the reload")
	}
}

func mustLoad(t *testing.T, path string) *region.Policy {
	t.Helper()
	p, err := region.LoadPolicy(path, region.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}
