package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// TestSimExplore runs the explorer from the command line: seed 1's first
// 20 schedules violate nothing (exit 0). testdata/explore-1-19-shrunk.yaml
// is what `meridian sim --explore 20 --seed 1` printed before a decision
// lapsed a passed lease (schedule 19: a region back from a loss ran its old
// share until its next tick, Σ in force 1,042,627 ppm); --check replays it
// clean now, and it failed with safety/share at 19.8s before the fix.
func TestSimExplore(t *testing.T) {
	var stdout, stderr strings.Builder
	code := run(context.Background(), []string{"sim", "--explore", "20", "--seed", "1"}, &stdout, &stderr)
	out := stdout.String()
	if code != 0 || !strings.Contains(out, "explore: 20 schedules from seed 1") || !strings.Contains(out, "0 violations") {
		t.Fatalf("exit %d, want 0 with no violation\nstdout:\n%s\nstderr:\n%s", code, out, stderr.String())
	}
	stdout.Reset()
	stderr.Reset()
	file := filepath.Join("testdata", "explore-1-19-shrunk.yaml")
	code = run(context.Background(), []string{"sim", "--scenario", file, "--check"}, &stdout, &stderr)
	if want := "no violation"; code != 0 || !strings.Contains(stdout.String(), want) {
		t.Errorf("--check %s: exit %d, want 0 and %q\nstdout:\n%s\nstderr:\n%s", file, code, want, stdout.String(), stderr.String())
	}

	stdout.Reset()
	stderr.Reset()
	code = run(context.Background(), []string{"sim", "--explore", "5", "--kinds", "partition,failover"}, &stdout, &stderr)
	if code != 0 || !strings.Contains(stdout.String(), "0 violations") {
		t.Errorf("--explore 5 --kinds partition,failover: exit %d, want 0\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	stderr.Reset()
	if code := run(context.Background(), []string{"sim", "--explore", "5", "--kinds", "meteor"}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), `unknown fault kind "meteor"`) {
		t.Errorf("--kinds meteor: exit %d, stderr %q", code, stderr.String())
	}
}
