package region

import (
	"fmt"
	"strings"
	"testing"
)

// A syntax error is placed on its line by parsing prefixes of the file;
// that search must take a number of parses logarithmic in the file's
// lines, not one per line: the agent runs it on its control loop when a
// reload meets a broken file, and policy check in CI.
//
// Fails on f96aee6 (which has no prefixFails seam, so this does not compile
// there): firstBadLine parsed every prefix, line by line, so this
// 3,992-line file with a mistake on its last line took 3,992 parses of up
// to the whole file — 23 s of CPU for `meridian policy check`, and as long
// with the agent's Run loop (tables, leases, reloads) standing still.
func TestSyntaxErrorLineSearchIsLogarithmic(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: big\ndescriptors:\n")
	const rules = 1995
	for i := range rules {
		fmt.Fprintf(&b, "  - key: k%d\n    rate_limit: {unit: second, requests_per_unit: %d}\n", i, i+1)
	}
	b.WriteString("  - key: bad\n   value: x\n") // value indented one column short
	src := b.String()
	wantLine := 2 + 2*rules + 2

	parses := 0
	defer func(orig func([]byte, string) bool) { prefixFails = orig }(prefixFails)
	orig := prefixFails
	prefixFails = func(prefix []byte, what string) bool {
		parses++
		return orig(prefix, what)
	}
	_, err := ParsePolicy([]byte(src))
	if err == nil {
		t.Fatal("the policy loaded; want a syntax error")
	}
	if want := fmt.Sprintf("yaml: line %d:", wantLine); !strings.Contains(err.Error(), want) {
		t.Errorf("error %q, want it at line %d", err, wantLine)
	}
	if parses > 2*13 { // 2·⌈log2 3992⌉
		t.Errorf("%d prefix parses for %d lines, want O(log n)", parses, wantLine)
	}
}
