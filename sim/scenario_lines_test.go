package sim

import (
	"errors"
	"strings"
	"testing"
)

// TestScenarioUnknownFieldHidesNothing: a misspelt field is reported
// together with every other problem of the scenario, each with its line.
func TestScenarioUnknownFieldHidesNothing(t *testing.T) {
	const src = `name: x
duration: 10s
warmup: 10s
regions:
  - {name: eu}
  - {name: eu}
keys: {count: 5, ratio: 2}
workload: {rate: -5, speed: 3}
colour: red
`
	_, err := ParseScenario([]byte(src))
	if err == nil || !errors.Is(err, ErrScenario) {
		t.Fatalf("err = %v, want ErrScenario", err)
	}
	msg := err.Error()
	for _, want := range []string{
		"line 8: field speed not found",
		"line 9: field colour not found",
		"line 3: warmup: 10s: must be in [0, duration)",
		`line 6: regions[1].name: "eu" given twice`,
		"line 8: workload.rate: -5",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}
