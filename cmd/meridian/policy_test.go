package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// policyTestFile writes src to a policy file in a fresh directory.
func policyTestFile(t *testing.T, src string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

const policyTestValid = `domains:
  - domain: edge
    descriptors:
      - key: tenant
        rate_limit: {name: tenant-default, unit: minute, requests_per_unit: 600}
      - key: tenant
        value: acme
        rate_limit: {name: acme, replaces: [{name: tenant-default}], unit: second, requests_per_unit: 100, burst: 50}
      - key: path
        value: "/api/*/users/*"
        shadow_mode: true
        rate_limit: {unit: second, requests_per_unit: 30, failure_mode: open}
      - key: path
        value: "/static*"
        rate_limit: {unlimited: true}
      - key: path
        value: /internal
      - key: path
        rate_limit: {unit: second, requests_per_unit: 10, scope: regional}
`

func TestPolicyCheckValid(t *testing.T) {
	path := policyTestFile(t, policyTestValid)
	code, out, errs := runCmd(t, "policy", "check", path)
	if code != 0 {
		t.Fatalf("exit %d, want 0; stdout:\n%s\nstderr:\n%s", code, out, errs)
	}
	for _, want := range []string{path + ": valid: policy version ", "1 domain, 5 rules", `domain "edge": 5 rules`} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if errs != "" {
		t.Errorf("stderr %q, want nothing", errs)
	}
}

// TestPolicyCheckErrors: every problem, each with its line, and a non-zero
// exit for CI.
func TestPolicyCheckErrors(t *testing.T) {
	path := policyTestFile(t, `domains:
  - domain: edge
    descriptors:
      - key: tenant
        rate_limit: {unit: second, requests_per_unit: 5, bursts: 3}
      - key: path
        ratelimit: {unit: second, requests_per_unit: 1}
      - key: route
        shadow_mode: maybe
        rate_limit: {unit: second, requests_per_unit: 1}
`)
	code, out, errs := runCmd(t, "policy", "check", path)
	if code != 1 {
		t.Fatalf("exit %d, want 1; stdout:\n%s\nstderr:\n%s", code, out, errs)
	}
	if !strings.Contains(out, path+": invalid: 3 problems") {
		t.Errorf("output lacks the count of 3 problems:\n%s", out)
	}
	lineRE := regexp.MustCompile(`\bline (\d+)\b|:(\d+):`)
	var lines []int
	var problems []string
	for _, l := range strings.Split(out, "\n") {
		if !strings.HasPrefix(l, "  ") {
			continue
		}
		problems = append(problems, l)
		m := lineRE.FindStringSubmatch(l)
		if m == nil {
			t.Errorf("problem without a line: %q", l)
			continue
		}
		n, _ := strconv.Atoi(m[1] + m[2])
		lines = append(lines, n)
	}
	if len(problems) != 3 {
		t.Errorf("%d problems printed, want 3:\n%s", len(problems), out)
	}
	slices.Sort(lines)
	if want := []int{5, 7, 9}; !slices.Equal(lines, want) {
		t.Errorf("problem lines %v, want %v:\n%s", lines, want, out)
	}
	if !strings.Contains(errs, "3 problems") {
		t.Errorf("stderr %q lacks the summary", errs)
	}
}

func TestPolicyCheckExplainWildcard(t *testing.T) {
	path := policyTestFile(t, policyTestValid)
	// Flags after the file and the descriptors; two descriptors in one
	// argument; the acme rule replaces the tenant default only when both
	// match one request, which they cannot here (one tenant entry each).
	code, out, errs := runCmd(t, "policy", "check", path, "--explain", "edge",
		"path=/api/v1/users/42;path=/api/v1/orders", "path=/static/app.js", "path=/internal", "tenant=acme")
	if code != 0 {
		t.Fatalf("exit %d; stdout:\n%s\nstderr:\n%s", code, out, errs)
	}
	sections := policyTestSections(out)
	tests := []struct {
		desc string
		want []string
	}{
		{"path=/api/v1/users/42", []string{ // the middle and trailing wildcard
			"rule:      domains[0].descriptors[2]\n",
			"limit:     30 per second (T=33.334ms), burst 30",
			"mode:      shadow",
			"failure:   open",
			"scope:     global",
			"regional:  30 per second (T=33.334ms), burst 30: the full limit (standalone)",
		}},
		{"path=/api/v1/orders", []string{ // no wildcard: the bare key
			"rule:      domains[0].descriptors[5]\n",
			"limit:     10 per second (T=100ms), burst 10",
			"mode:      enforced",
			"scope:     regional",
			"in each region (regional scope: never shared)",
		}},
		{"path=/static/app.js", []string{"rule:      domains[0].descriptors[3]\n", "unlimited"}},
		{"path=/internal", []string{"rule:      none"}},
		{"tenant=acme", []string{`rule:      domains[0].descriptors[1] (name "acme")`, "replaces:  tenant-default", "burst 50", "failure:   local"}},
	}
	for _, tt := range tests {
		got, ok := sections[tt.desc]
		if !ok {
			t.Errorf("no section for %s in:\n%s", tt.desc, out)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: lacks %q:\n%s", tt.desc, w, got)
			}
		}
	}
	if !strings.Contains(out, "standalone (one region holds 100 % of every limit)") {
		t.Errorf("no standalone note:\n%s", out)
	}
}

func TestPolicyCheckExplainRegions(t *testing.T) {
	path := policyTestFile(t, policyTestValid)
	code, out, errs := runCmd(t, "policy", "check", "--regions", "3", "--explain", "edge", path, "tenant=beta7")
	if code != 0 {
		t.Fatalf("exit %d; stdout:\n%s\nstderr:\n%s", code, out, errs)
	}
	sec := policyTestSections(out)["tenant=beta7"]
	// 600/minute burst 600, safe fraction 0.1 over 3 regions: a floor of
	// 33333 ppm, T_r = ceil(100,000µs·10⁶/33333) = 3,000,031µs (19.9998
	// per minute), burst 1 + floor(597·33333/10⁶) = 20.
	for _, w := range []string{
		`rule:      domains[0].descriptors[0] (name "tenant-default")`,
		"limit:     600 per minute (T=100ms), burst 600",
		"safe floor 3.3333 % (33333 ppm of the limit): 19.9998 per minute (T=3.000031s), burst 20",
		"the share in force is the coordinator's table",
	} {
		if !strings.Contains(sec, w) {
			t.Errorf("lacks %q:\n%s", w, sec)
		}
	}
}

func TestPolicyCheckExplainReplaces(t *testing.T) {
	path := policyTestFile(t, `domains:
  - domain: d
    descriptors:
      - key: user
        rate_limit: {name: per-user, unit: second, requests_per_unit: 5}
      - key: plan
        value: gold
        rate_limit: {name: gold, replaces: [{name: per-user}], unit: second, requests_per_unit: 50}
`)
	code, out, errs := runCmd(t, "policy", "check", path, "--explain", "d", "user=alice;plan=gold")
	if code != 0 {
		t.Fatalf("exit %d; stdout:\n%s\nstderr:\n%s", code, out, errs)
	}
	if sec := policyTestSections(out)["user=alice"]; !strings.Contains(sec, "replaced:  by [1]'s rule domains[0].descriptors[1]") {
		t.Errorf("user=alice not shown replaced:\n%s", out)
	}
}

func TestPolicyCheckUsage(t *testing.T) {
	path := policyTestFile(t, policyTestValid)
	tests := []struct {
		name string
		args []string
		want int
		msg  string
	}{
		{"no file", []string{"policy", "check"}, 2, "want a policy FILE or DIR"},
		{"no subcommand", []string{"policy"}, 2, "Usage: meridian policy"},
		{"unknown subcommand", []string{"policy", "lint"}, 2, `unknown command "lint"`},
		{"descriptor without --explain", []string{"policy", "check", path, "tenant=a"}, 2, "need --explain"},
		{"--explain without descriptor", []string{"policy", "check", path, "--explain", "edge"}, 2, "at least one DESCRIPTOR"},
		{"bad descriptor", []string{"policy", "check", path, "--explain", "edge", "tenant"}, 2, "want KEY=VALUE"},
		{"bad regions", []string{"policy", "check", path, "--regions", "0"}, 2, "--regions 0"},
		{"two domains", []string{"policy", "check", path, "--explain", "edge", "--explain", "other", "k=v"}, 2, "given twice"},
		{"unknown flag", []string{"policy", "check", path, "--nope"}, 2, "-nope"},
		{"unreadable", []string{"policy", "check", filepath.Join(t.TempDir(), "missing.yaml")}, 1, "load "},
		{"help", []string{"policy", "check", "--help"}, 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errs := runCmd(t, tt.args...)
			if code != tt.want || !strings.Contains(errs+out, tt.msg) {
				t.Errorf("exit %d (want %d); stdout %q; stderr %q; want %q", code, tt.want, out, errs, tt.msg)
			}
		})
	}
	if _, out, _ := runCmd(t, "policy", "check", "--help"); !strings.Contains(out, "--explain") || !strings.Contains(out, `separated by ";"`) {
		t.Errorf("--help does not document --explain and its descriptors:\n%s", out)
	}
}

// TestPolicyCheckRedisCluster: --redis-cluster refuses what an agent on a
// Cluster would.
func TestPolicyCheckRedisCluster(t *testing.T) {
	path := policyTestFile(t, `domains:
  - domain: d
    descriptors:
      - key: a
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: b
        rate_limit: {unit: second, requests_per_unit: 5}
`)
	if code, out, errs := runCmd(t, "policy", "check", path); code != 0 {
		t.Fatalf("without --redis-cluster: exit %d\n%s%s", code, out, errs)
	}
	code, out, _ := runCmd(t, "policy", "check", "--redis-cluster", path)
	if code != 1 || !strings.Contains(out, "invalid: 1 problem") || !strings.Contains(out, "hash_tag") {
		t.Errorf("with --redis-cluster: exit %d, want 1 with the slot problem:\n%s", code, out)
	}
}

// policyTestSections splits --explain output into its descriptors'
// sections, by descriptor text.
func policyTestSections(out string) map[string]string {
	secs := map[string]string{}
	re := regexp.MustCompile(`(?m)^\[\d+\] (.*)$`)
	idx := re.FindAllStringSubmatchIndex(out, -1)
	for i, m := range idx {
		end := len(out)
		if i+1 < len(idx) {
			end = idx[i+1][0]
		}
		secs[out[m[2]:m[3]]] = out[m[0]:end]
	}
	return secs
}
