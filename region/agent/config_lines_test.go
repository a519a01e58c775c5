package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLoadConfigUnknownFieldHidesNothing: a misspelt field is reported
// together with every other problem of the file, each with its line.
func TestLoadConfigUnknownFieldHidesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.yaml")
	const src = `region: eu
agent: eu-1
regions: [us]
policy: policy.yaml
colour: red
redis:
  addr: localhost:6379
  timeuot: 5ms
  lanes: 0
interval: 50ms
`
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := LoadConfig(path)
	if err == nil {
		t.Fatal("LoadConfig succeeded")
	}
	if !errors.Is(err, ErrConfig) {
		t.Errorf("error %v does not wrap ErrConfig", err)
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, path+": ") {
		t.Errorf("error does not name the file: %v", err)
	}
	for _, want := range []string{
		"line 5: field colour not found",
		"line 8: field timeuot not found",
		`line 3: regions: ["us"] does not list region "eu"`,
		"line 9: redis.lanes: 0: must be in [1, 256]",
		"line 10: interval: 50ms: must be in [100ms, 10m]",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if n := strings.Count(msg, "\n") + 1; n != 5 {
		t.Errorf("%d problems, want 5:\n%v", n, err)
	}

	// A problem of a field the file does not have has no line to name.
	_, err = ParseConfig([]byte("region: eu\nagent: eu-1\nregions: [eu]\n"))
	if err == nil || !strings.Contains(err.Error(), "invalid config: policy: empty") {
		t.Errorf("missing policy: %v", err)
	}
	// A syntax error decodes nothing, so there is nothing else to report.
	if _, err := ParseConfig([]byte("region: [eu\n")); err == nil || !strings.Contains(err.Error(), "yaml: line") {
		t.Errorf("syntax error: %v", err)
	}
}
