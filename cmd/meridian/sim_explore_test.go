package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSimExplore runs the explorer from the command line: seed 1's first
// 20 schedules hold the known region-return failure (schedule 19, see
// sim's knownFailures), so it exits 1 and prints the shrunk scenario,
// whose file --check replays to the same violation.
func TestSimExplore(t *testing.T) {
	var stdout, stderr strings.Builder
	code := run(context.Background(), []string{"sim", "--explore", "20", "--seed", "1"}, &stdout, &stderr)
	out := stdout.String()
	if code != 1 || !strings.Contains(out, "explore: 20 schedules from seed 1") || !strings.Contains(out, "1 violations") {
		t.Fatalf("exit %d, want 1 with one violation\nstdout:\n%s\nstderr:\n%s", code, out, stderr.String())
	}
	_, yml, ok := strings.Cut(out, "schedule 19: safety/share at 19.8s (agent-tick), shrunk from 2 to 1 events:\n")
	if !ok {
		t.Fatalf("no shrunk schedule 19 in:\n%s", out)
	}
	file := filepath.Join(t.TempDir(), "shrunk.yaml")
	if err := os.WriteFile(file, []byte(yml), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout.Reset()
	stderr.Reset()
	code = run(context.Background(), []string{"sim", "--scenario", file, "--check"}, &stdout, &stderr)
	if want := "safety/share violated at 19.8s after agent-tick: key sim/k=key-000000"; code != 1 || !strings.Contains(stdout.String(), want) {
		t.Errorf("--check: exit %d, want 1 and %q\nstdout:\n%s\nstderr:\n%s", code, want, stdout.String(), stderr.String())
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
