package region

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/gcra"
)

// policyTestEnvoy is an envoyproxy/ratelimit-style policy. The comments give
// each descriptor's path; the match table below derives its expectations
// from the reference server's GetLimit (src/config/config_impl.go): at each
// depth the exact key_value, else the first wildcard of that level in file
// order, else the bare key; a limit counts only at the descriptor's last
// entry; no backtracking once a node is chosen.
const policyTestEnvoy = `
# edge: tenants, paths, methods.
domains:
  - domain: edge
    descriptors:
      # domains[0].descriptors[0]: the default for every tenant.
      - key: tenant
        rate_limit:
          name: tenant-default
          unit: minute
          requests_per_unit: 100
        descriptors:
          - key: path                 # [0].descriptors[0]
            value: /api/admin
            rate_limit: {unit: second, requests_per_unit: 1}
          - key: path                 # [0].descriptors[1]
            value: "/api/*"
            rate_limit: {unit: second, requests_per_unit: 10}
            descriptors:
              - key: method           # [0].descriptors[1].descriptors[0]
                value: POST
                rate_limit: {unit: second, requests_per_unit: 2}
          - key: path                 # [0].descriptors[2]: shadowed by /api/*
            value: "/api/v2*"
            rate_limit: {unit: second, requests_per_unit: 20}
          - key: path                 # [0].descriptors[3]
            rate_limit: {unit: second, requests_per_unit: 50}
          - key: region               # [0].descriptors[4]: no limit of its own
            value: eu
            descriptors:
              - key: zone             # [0].descriptors[4].descriptors[0]
                rate_limit: {unit: second, requests_per_unit: 30}
      - key: tenant                   # [1]
        value: acme
        rate_limit:
          name: acme
          replaces: [{name: tenant-default}]
          unit: minute
          requests_per_unit: 1000
        descriptors:
          - key: path                 # [1].descriptors[0]
            value: "*"
            rate_limit: {unit: second, requests_per_unit: 100}
      - key: tenant                   # [2]
        value: internal
        rate_limit: {unlimited: true}
      - key: tenant                   # [3]
        value: "beta*"
        detailed_metric: true
        rate_limit: {unit: hour, requests_per_unit: 10}
        descriptors:
          - key: plan                 # [3].descriptors[0]
            value: gold
            rate_limit: {unit: hour, requests_per_unit: 100}
      - key: tenant                   # [4]: after beta*, so only for be… not beta…
        value: "be*"
        rate_limit: {unit: hour, requests_per_unit: 5}
      - key: tenant                   # [5]: exact, after the wildcards it also matches
        value: betamax
        rate_limit: {unit: hour, requests_per_unit: 1}
      - key: remote_address           # [6]
        shadow_mode: true
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: client                   # [7]: no limit of its own
        value: mobile
        descriptors:
          - key: version              # [7].descriptors[0]
            rate_limit: {unit: second, requests_per_unit: 3}
  - domain: other
    descriptors:
      - key: tenant                   # domains[1].descriptors[0]
        value: acme
        rate_limit: {unit: second, requests_per_unit: 1}
`

func policyTestParse(t *testing.T, src string) *Policy {
	t.Helper()
	p, err := ParsePolicy([]byte(src))
	if err != nil {
		t.Fatalf("ParsePolicy: %v", err)
	}
	return p
}

// policyTestRule finds the rule at path.
func policyTestRule(t *testing.T, p *Policy, path string) *Rule {
	t.Helper()
	for _, r := range p.Rules() {
		if r.Path == path {
			return r
		}
	}
	t.Fatalf("no rule at %s", path)
	return nil
}

func TestPolicyMatchEnvoySemantics(t *testing.T) {
	p := policyTestParse(t, policyTestEnvoy)
	const (
		d0       = "domains[0].descriptors[0]"
		d1       = "domains[0].descriptors[1]"
		d3       = "domains[0].descriptors[3]"
		d7       = "domains[0].descriptors[7]"
		apiStar  = d0 + ".descriptors[1]"
		pathBare = d0 + ".descriptors[3]"
	)
	e := func(kv ...string) []Entry {
		var es []Entry
		for i := 0; i < len(kv); i += 2 {
			es = append(es, Entry{Key: kv[i], Value: kv[i+1]})
		}
		return es
	}
	tests := []struct {
		name   string
		give   []Entry
		domain string // "" for edge
		want   string // the matched rule's Path; "" for none
	}{
		{name: "bare key applies to any value", give: e("tenant", "foo"), want: d0},
		{name: "exact beats bare key", give: e("tenant", "acme"), want: d1},
		{name: "value case matters: exact misses, bare applies", give: e("tenant", "ACME"), want: d0},
		{name: "unlimited rule is returned", give: e("tenant", "internal"), want: "domains[0].descriptors[2]"},
		{name: "wildcard beats bare key", give: e("tenant", "betatest"), want: d3},
		{name: "wildcard matches its bare prefix", give: e("tenant", "beta"), want: d3},
		{name: "first wildcard in file order wins", give: e("tenant", "beta7"), want: d3},
		{name: "second wildcard when only it matches", give: e("tenant", "bert"), want: "domains[0].descriptors[4]"},
		{name: "exact beats a wildcard written before it", give: e("tenant", "betamax"), want: "domains[0].descriptors[5]"},
		{name: "no backtracking from an exact leaf to the wildcard's children", give: e("tenant", "betamax", "plan", "gold"), want: ""},
		{name: "child of a wildcard", give: e("tenant", "beta1", "plan", "gold"), want: d3 + ".descriptors[0]"},
		{name: "child of a wildcard, unknown value", give: e("tenant", "beta1", "plan", "silver"), want: ""},
		{name: "nested exact beats wildcard and bare", give: e("tenant", "foo", "path", "/api/admin"), want: d0 + ".descriptors[0]"},
		{name: "nested wildcard beats bare", give: e("tenant", "foo", "path", "/api/users"), want: apiStar},
		{name: "nested first wildcard in file order", give: e("tenant", "foo", "path", "/api/v2/items"), want: apiStar},
		{name: "nested bare key", give: e("tenant", "foo", "path", "/static/app.js"), want: pathBare},
		{name: "wildcard prefix is anchored at the start", give: e("tenant", "foo", "path", "/v1/api/x"), want: pathBare},
		{name: "wildcard prefix is case sensitive", give: e("tenant", "foo", "path", "/API/users"), want: pathBare},
		{name: "depth three under a wildcard", give: e("tenant", "foo", "path", "/api/users", "method", "POST"), want: apiStar + ".descriptors[0]"},
		{name: "shallower limit does not apply to a longer descriptor", give: e("tenant", "foo", "path", "/api/users", "method", "GET"), want: ""},
		{name: "shallower limit does not apply below a node without one", give: e("tenant", "foo", "region", "eu"), want: ""},
		{name: "limit below a node without one, under a limited node", give: e("tenant", "foo", "region", "eu", "zone", "a"), want: d0 + ".descriptors[4].descriptors[0]"},
		{name: "longer than the tree", give: e("tenant", "foo", "path", "/static", "method", "POST"), want: ""},
		{name: "exact leaf does not inherit the wildcard's children", give: e("tenant", "foo", "path", "/api/admin", "method", "POST"), want: ""},
		{name: "unlimited leaf with an extra entry", give: e("tenant", "internal", "path", "/x"), want: ""},
		{name: "star wildcard under an exact value", give: e("tenant", "acme", "path", "/api/admin"), want: d1 + ".descriptors[0]"},
		{name: "star wildcard matches an empty value", give: e("tenant", "acme", "path", ""), want: d1 + ".descriptors[0]"},
		{name: "unknown key", give: e("user", "alice"), want: ""},
		{name: "key case matters", give: e("Tenant", "acme"), want: ""},
		{name: "known key at the wrong depth", give: e("path", "/api/users"), want: ""},
		{name: "entry order matters", give: e("path", "/api/users", "tenant", "foo"), want: ""},
		{name: "shadow rule", give: e("remote_address", "10.0.0.1"), want: "domains[0].descriptors[6]"},
		{name: "node without a limit", give: e("client", "mobile"), want: ""},
		{name: "limit below a node without one", give: e("client", "mobile", "version", "1.2"), want: d7 + ".descriptors[0]"},
		{name: "no bare key to fall back on", give: e("client", "desktop", "version", "1.2"), want: ""},
		{name: "empty descriptor", give: nil, want: ""},
		{name: "other domain: its own tree", domain: "other", give: e("tenant", "acme"), want: "domains[1].descriptors[0]"},
		{name: "other domain: no bare key", domain: "other", give: e("tenant", "foo"), want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := cmp.Or(tt.domain, "edge")
			dom := p.domains[name]
			if dom == nil {
				t.Fatalf("no domain %q", name)
			}
			got := ""
			if r := dom.match(tt.give); r != nil {
				got = r.Path
				if r.Domain != name {
					t.Errorf("rule %s has Domain %q, want %q", r.Path, r.Domain, name)
				}
			}
			if got != tt.want {
				t.Errorf("match(%v) = %q, want %q", tt.give, got, tt.want)
			}
		})
	}
	if p.domains["nope"] != nil {
		t.Error("unknown domain resolved")
	}
}

// TestPolicyRuleFields checks what the Envoy-style fields decode to.
func TestPolicyRuleFields(t *testing.T) {
	p := policyTestParse(t, policyTestEnvoy)
	var paths []string
	for _, r := range p.Rules() {
		paths = append(paths, r.Path)
	}
	wantPaths := []string{ // file order, depth first
		"domains[0].descriptors[0]",
		"domains[0].descriptors[0].descriptors[0]",
		"domains[0].descriptors[0].descriptors[1]",
		"domains[0].descriptors[0].descriptors[1].descriptors[0]",
		"domains[0].descriptors[0].descriptors[2]",
		"domains[0].descriptors[0].descriptors[3]",
		"domains[0].descriptors[0].descriptors[4].descriptors[0]",
		"domains[0].descriptors[1]",
		"domains[0].descriptors[1].descriptors[0]",
		"domains[0].descriptors[2]",
		"domains[0].descriptors[3]",
		"domains[0].descriptors[3].descriptors[0]",
		"domains[0].descriptors[4]",
		"domains[0].descriptors[5]",
		"domains[0].descriptors[6]",
		"domains[0].descriptors[7].descriptors[0]",
		"domains[1].descriptors[0]",
	}
	if !slices.Equal(paths, wantPaths) {
		t.Errorf("Rules() paths:\n got %q\nwant %q", paths, wantPaths)
	}

	def := policyTestRule(t, p, "domains[0].descriptors[0]")
	if def.Name != "tenant-default" || len(def.Replaces) != 0 || def.Domain != "edge" {
		t.Errorf("tenant default: Name %q Replaces %q Domain %q", def.Name, def.Replaces, def.Domain)
	}
	if want := gcra.New(100, time.Minute, 100); def.Limit != want {
		t.Errorf("tenant default: Limit %v, want %v", def.Limit, want)
	}
	acme := policyTestRule(t, p, "domains[0].descriptors[1]")
	if acme.Name != "acme" || !slices.Equal(acme.Replaces, []string{"tenant-default"}) {
		t.Errorf("acme: Name %q Replaces %q, want acme replacing tenant-default", acme.Name, acme.Replaces)
	}
	un := policyTestRule(t, p, "domains[0].descriptors[2]")
	if !un.Unlimited || !un.Limit.IsZero() || un.Shadow {
		t.Errorf("internal: Unlimited %v Limit %v Shadow %v, want unlimited with the zero limit", un.Unlimited, un.Limit, un.Shadow)
	}
	sh := policyTestRule(t, p, "domains[0].descriptors[6]")
	if !sh.Shadow || sh.Unlimited {
		t.Errorf("remote_address: Shadow %v Unlimited %v, want shadow", sh.Shadow, sh.Unlimited)
	}
	for _, r := range p.Rules() {
		if r != sh && r.Shadow {
			t.Errorf("%s: Shadow set, only remote_address asked for it", r.Path)
		}
		if r != un && (r.Unlimited || r.Limit.IsZero()) {
			t.Errorf("%s: Unlimited %v Limit %v", r.Path, r.Unlimited, r.Limit)
		}
	}
}

// TestPolicyScalarValues: keys and values are the scalars' text, whatever
// type YAML would give them, as in envoyproxy/ratelimit.
func TestPolicyScalarValues(t *testing.T) {
	p := policyTestParse(t, `
domains:
  - domain: 42
    descriptors:
      - key: date
        value: 2024-01-01
        rate_limit: {unit: day, requests_per_unit: 1}
      - key: version
        value: 1.50
        rate_limit: {unit: day, requests_per_unit: 2}
      - key: flag
        value: true
        rate_limit: {unit: day, requests_per_unit: 3}
      - key: 7
        value: 0x10
        rate_limit: {unit: day, requests_per_unit: 4}
`)
	tests := []struct {
		name string
		give Entry
		want string
	}{
		{name: "timestamp-like", give: Entry{"date", "2024-01-01"}, want: "domains[0].descriptors[0]"},
		{name: "float keeps its text", give: Entry{"version", "1.50"}, want: "domains[0].descriptors[1]"},
		{name: "float is not normalised", give: Entry{"version", "1.5"}, want: ""},
		{name: "bool", give: Entry{"flag", "true"}, want: "domains[0].descriptors[2]"},
		{name: "int key and hex value", give: Entry{"7", "0x10"}, want: "domains[0].descriptors[3]"},
		{name: "hex is not decoded", give: Entry{"7", "16"}, want: ""},
	}
	dom := p.domains["42"]
	if dom == nil {
		t.Fatal(`no domain "42"`)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ""
			if r := dom.match([]Entry{tt.give}); r != nil {
				got = r.Path
			}
			if got != tt.want {
				t.Errorf("match(%v) = %q, want %q", tt.give, got, tt.want)
			}
		})
	}
}

// policyTestNested is a chain of depth descriptors k0…k(depth-1), the last
// one limited.
func policyTestNested(depth int) string {
	var b strings.Builder
	b.WriteString("domains:\n  - domain: d\n    descriptors:\n")
	for i := range depth {
		ind := strings.Repeat("  ", 3+2*i)
		fmt.Fprintf(&b, "%s- key: k%d\n", ind, i)
		if i == depth-1 {
			fmt.Fprintf(&b, "%s  rate_limit: {unit: second, requests_per_unit: 1}\n", ind)
		} else {
			fmt.Fprintf(&b, "%s  descriptors:\n", ind)
		}
	}
	return b.String()
}

func TestPolicyMaxDepth(t *testing.T) {
	p := policyTestParse(t, policyTestNested(MaxEntries))
	var es []Entry
	for i := range MaxEntries {
		es = append(es, Entry{Key: fmt.Sprintf("k%d", i), Value: "v"})
	}
	r := p.domains["d"].match(es)
	if want := "domains[0].descriptors[0]" + strings.Repeat(".descriptors[0]", MaxEntries-1); r == nil || r.Path != want {
		t.Errorf("match of %d entries = %v, want the rule at %s", MaxEntries, r, want)
	}
}

// policyTestProblems returns the individual problems of a ParsePolicy error.
func policyTestProblems(err error) []error {
	var out []error
	u, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return []error{err}
	}
	for _, e := range u.Unwrap() {
		if e == ErrPolicy {
			continue
		}
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			out = append(out, j.Unwrap()...)
		} else {
			out = append(out, e)
		}
	}
	return out
}

// policyTestHas reports whether one of problems is at path (and line, if
// not 0) and contains msg. An empty path matches any problem.
func policyTestHas(problems []error, path string, line int, msg string) bool {
	for _, e := range problems {
		s := e.Error()
		if !strings.Contains(s, msg) {
			continue
		}
		switch {
		case path == "":
			return true
		case line != 0:
			if strings.HasPrefix(s, fmt.Sprintf("%s (line %d): ", path, line)) {
				return true
			}
		case strings.HasPrefix(s, path+": "), strings.HasPrefix(s, path+" (line "):
			return true
		}
	}
	return false
}

// policyTestOne wraps one domain d's descriptor list (flow YAML).
func policyTestOne(descriptors string) string {
	return "domains: [{domain: d, descriptors: " + descriptors + "}]"
}

// policyTestRL wraps one descriptor k with the given rate_limit (flow YAML).
func policyTestRL(rateLimit string) string {
	return policyTestOne("[{key: k, rate_limit: " + rateLimit + "}]")
}

func TestPolicyInvalid(t *testing.T) {
	const (
		d0 = "domains[0].descriptors[0]"
		rl = d0 + ".rate_limit"
		ok = "{unit: second, requests_per_unit: 1}"
	)
	tests := []struct {
		name     string
		give     string
		wantPath string // the problem's path; "" for a YAML syntax error
		wantLine int    // 0: not checked
		wantMsg  string
	}{
		// Unknown fields, at each level.
		{
			name:     "unknown field at the root",
			give:     "domains: [{domain: d, descriptors: [{key: k, rate_limit: " + ok + "}]}]\nlimits: []\n",
			wantPath: "limits", wantLine: 2, wantMsg: "unknown field (valid: domains)",
		},
		{
			name: "unknown field in a domain",
			give: `
domains:
  - domain: d
    descriptor:
      - key: k
`,
			wantPath: "domains[0].descriptor", wantLine: 4, wantMsg: "unknown field",
		},
		{
			name:     "unknown field in a descriptor",
			give:     policyTestOne("[{key: k, val: v, rate_limit: " + ok + "}]"),
			wantPath: d0 + ".val", wantLine: 1, wantMsg: "unknown field",
		},
		{
			name: "unknown field in a rate_limit",
			give: `
domains:
  - domain: d
    descriptors:
      - key: k
        rate_limit:
          unit: second
          requests_per_second: 5
`,
			wantPath: rl + ".requests_per_second", wantLine: 8, wantMsg: "unknown field",
		},
		{
			name:     "unknown field in a replaces entry",
			give:     policyTestRL("{unit: second, requests_per_unit: 1, replaces: [{rule: x}]}"),
			wantPath: rl + ".replaces[0].rule", wantMsg: "unknown field (valid: name)",
		},
		{
			name: "field given twice",
			give: `
domains:
  - domain: d
    descriptors:
      - key: a
        key: b
        rate_limit: {unit: second, requests_per_unit: 1}
`,
			wantPath: d0 + ".key", wantLine: 6, wantMsg: "given twice",
		},

		// Wrong types.
		{name: "root is a list", give: "- domain: d\n", wantPath: "(root)", wantMsg: "want a mapping, got a list"},
		{name: "domains is a string", give: "domains: edge\n", wantPath: "domains", wantLine: 1, wantMsg: "want a list"},
		{name: "domains is null", give: "domains:\n", wantPath: "domains", wantMsg: "want a list"},
		{name: "domain entry is a list", give: "domains: [[d]]\n", wantPath: "domains[0]", wantMsg: "want a mapping, got a list"},
		{name: "descriptors is a string", give: "domains: [{domain: d, descriptors: tenant}]", wantPath: "domains[0].descriptors", wantMsg: "want a list"},
		{name: "rate_limit is a list", give: policyTestRL("[second, 1]"), wantPath: rl, wantMsg: "want a mapping, got a list"},
		{name: "descriptor is a string", give: policyTestOne("[tenant]"), wantPath: d0, wantMsg: "want a mapping"},
		{name: "key is a mapping", give: policyTestOne("[{key: {a: b}, rate_limit: " + ok + "}]"), wantPath: d0 + ".key", wantMsg: "want a string, got a mapping"},
		{name: "value is a list", give: policyTestOne("[{key: k, value: [a], rate_limit: " + ok + "}]"), wantPath: d0 + ".value", wantMsg: "want a string, got a list"},
		{name: "value is null", give: policyTestOne("[{key: k, value: ~, rate_limit: " + ok + "}]"), wantPath: d0 + ".value", wantMsg: "want a string"},
		{name: "replaces is a string", give: policyTestRL("{unit: second, requests_per_unit: 1, replaces: x}"), wantPath: rl + ".replaces", wantMsg: "want a list"},
		{name: "requests_per_unit is a word", give: policyTestRL("{unit: second, requests_per_unit: ten}"), wantPath: rl + ".requests_per_unit", wantMsg: "want an integer"},
		{name: "requests_per_unit is a fraction", give: policyTestRL("{unit: second, requests_per_unit: 1.5}"), wantPath: rl + ".requests_per_unit", wantMsg: "want an integer"},
		{name: "requests_per_unit is quoted", give: policyTestRL(`{unit: second, requests_per_unit: "5"}`), wantPath: rl + ".requests_per_unit", wantMsg: "want an integer"},
		{name: "requests_per_unit overflows", give: policyTestRL("{unit: second, requests_per_unit: 9223372036854775808}"), wantPath: rl + ".requests_per_unit", wantMsg: "want an integer"},
		{name: "burst is a word", give: policyTestRL("{unit: second, requests_per_unit: 1, burst: many}"), wantPath: rl + ".burst", wantMsg: "want an integer"},
		{name: "shadow_mode is a quoted bool", give: policyTestOne(`[{key: k, shadow_mode: "true", rate_limit: ` + ok + "}]"), wantPath: d0 + ".shadow_mode", wantMsg: "want true or false"},
		{name: "shadow_mode is yes", give: policyTestOne("[{key: k, shadow_mode: yes, rate_limit: " + ok + "}]"), wantPath: d0 + ".shadow_mode", wantMsg: "want true or false"},
		{name: "unlimited is a number", give: policyTestRL("{unlimited: 1}"), wantPath: rl + ".unlimited", wantMsg: "want true or false"},
		{name: "detailed_metric is not a bool", give: policyTestOne("[{key: k, detailed_metric: all, rate_limit: " + ok + "}]"), wantPath: d0 + ".detailed_metric", wantMsg: "want true or false"},

		// Domains.
		{name: "empty domain", give: `domains: [{domain: "", descriptors: [{key: k, rate_limit: ` + ok + "}]}]", wantPath: "domains[0].domain", wantMsg: "empty"},
		{name: "missing domain", give: "domains: [{descriptors: [{key: k, rate_limit: " + ok + "}]}]", wantPath: "domains[0].domain", wantMsg: "empty"},
		{name: "domain too long", give: "domains: [{domain: " + strings.Repeat("d", MaxDomainLen+1) + ", descriptors: [{key: k, rate_limit: " + ok + "}]}]", wantPath: "domains[0].domain", wantMsg: "65 bytes, above the maximum 64"},
		{
			name:     "duplicate domain",
			give:     "domains: [{domain: d, descriptors: [{key: k, rate_limit: " + ok + "}]}, {domain: d, descriptors: [{key: j, rate_limit: " + ok + "}]}]",
			wantPath: "domains[1].domain", wantMsg: `domain "d" defined twice`,
		},
		{name: "no domains", give: "domains: []\n", wantPath: "domains", wantMsg: "no domains"},
		{name: "domain without descriptors", give: "domains: [{domain: d}]", wantPath: "domains[0].descriptors", wantMsg: "no descriptors"},
		{name: "bad domain failure_mode", give: "domains: [{domain: d, failure_mode: sometimes, descriptors: [{key: k, rate_limit: " + ok + "}]}]", wantPath: "domains[0].failure_mode", wantMsg: `"sometimes": want open, closed or local`},
		{name: "hash_tag too long", give: "domains: [{domain: d, hash_tag: " + strings.Repeat("h", MaxEntryKeyLen+1) + ", descriptors: [{key: k, rate_limit: " + ok + "}]}]", wantPath: "domains[0].hash_tag", wantMsg: "above the maximum 64"},

		// Descriptors.
		{name: "empty key", give: policyTestOne(`[{key: "", rate_limit: ` + ok + "}]"), wantPath: d0 + ".key", wantMsg: "empty"},
		{name: "missing key", give: policyTestOne("[{value: v, rate_limit: " + ok + "}]"), wantPath: d0 + ".key", wantMsg: "empty"},
		{name: "key too long", give: policyTestOne("[{key: " + strings.Repeat("k", MaxEntryKeyLen+1) + ", rate_limit: " + ok + "}]"), wantPath: d0 + ".key", wantMsg: "65 bytes, above the maximum 64"},
		{name: "value too long", give: policyTestOne("[{key: k, value: " + strings.Repeat("v", MaxValueLen+1) + ", rate_limit: " + ok + "}]"), wantPath: d0 + ".value", wantMsg: "257 bytes, above the maximum 256"},
		{
			name:     "duplicate key and value",
			give:     policyTestOne("[{key: k, value: v, rate_limit: " + ok + "}, {key: k, value: v, rate_limit: " + ok + "}]"),
			wantPath: "domains[0].descriptors[1]", wantMsg: `duplicate descriptor key "k" value "v" at this level`,
		},
		{
			name:     "duplicate value written as int and string",
			give:     policyTestOne("[{key: k, value: 5, rate_limit: " + ok + `}, {key: k, value: "5", rate_limit: ` + ok + "}]"),
			wantPath: "domains[0].descriptors[1]", wantMsg: `duplicate descriptor key "k" value "5"`,
		},
		{
			name:     "duplicate wildcard",
			give:     policyTestOne(`[{key: k, value: "v*", rate_limit: ` + ok + `}, {key: k, value: "v*", rate_limit: ` + ok + "}]"),
			wantPath: "domains[0].descriptors[1]", wantMsg: `duplicate descriptor key "k" value "v*"`,
		},
		{
			name:     "duplicate bare key",
			give:     policyTestOne("[{key: k, rate_limit: " + ok + "}, {key: k, rate_limit: " + ok + "}]"),
			wantPath: "domains[0].descriptors[1]", wantMsg: `duplicate descriptor key "k" value ""`,
		},
		{
			name:     "duplicate at a nested level",
			give:     policyTestOne("[{key: t, descriptors: [{key: k, rate_limit: " + ok + "}, {key: k, rate_limit: " + ok + "}]}]"),
			wantPath: d0 + ".descriptors[1]", wantMsg: "duplicate descriptor",
		},
		{
			name:     "shadow_mode without rate_limit",
			give:     policyTestOne("[{key: k, shadow_mode: true, descriptors: [{key: j, rate_limit: " + ok + "}]}]"),
			wantPath: d0 + ".shadow_mode", wantMsg: "without a rate_limit",
		},
		{
			name:     "nested deeper than MaxEntries",
			give:     policyTestNested(MaxEntries + 1),
			wantPath: "domains[0].descriptors" + strings.Repeat("[0].descriptors", MaxEntries), wantMsg: "nested deeper than 8 entries",
		},

		// Units, periods, counts.
		{name: "bad unit", give: policyTestRL("{unit: fortnight, requests_per_unit: 1}"), wantPath: rl + ".unit", wantMsg: `"fortnight": want second, minute, hour, day, week, month or year`},
		{name: "plural unit", give: policyTestRL("{unit: seconds, requests_per_unit: 1}"), wantPath: rl + ".unit", wantMsg: "want second"},
		{name: "no unit or period", give: policyTestRL("{requests_per_unit: 1}"), wantPath: rl + ".unit", wantMsg: "missing"},
		{name: "both unit and period", give: policyTestRL("{unit: second, period: 1s, requests_per_unit: 1}"), wantPath: rl, wantMsg: "both unit and period"},
		{name: "bad period", give: policyTestRL("{period: 10 seconds, requests_per_unit: 1}"), wantPath: rl + ".period", wantMsg: `"10 seconds": not a duration`},
		{name: "period below 1ms", give: policyTestRL("{period: 500us, requests_per_unit: 1}"), wantPath: rl + ".period", wantMsg: "500µs: outside [1ms, 2^51µs (about 71 years)]"},
		{name: "period above MaxWindow", give: policyTestRL("{period: 700000h, requests_per_unit: 1}"), wantPath: rl + ".period", wantMsg: "outside [1ms, 2^51µs (about 71 years)]"},
		{name: "negative period", give: policyTestRL("{period: -1s, requests_per_unit: 1}"), wantPath: rl + ".period", wantMsg: "outside"},
		{name: "requests_per_unit 0", give: policyTestRL("{unit: second, requests_per_unit: 0}"), wantPath: rl + ".requests_per_unit", wantMsg: "0: must be at least 1"},
		{name: "requests_per_unit missing", give: policyTestRL("{unit: second}"), wantPath: rl + ".requests_per_unit", wantMsg: "must be at least 1"},
		{name: "requests_per_unit negative", give: policyTestRL("{unit: second, requests_per_unit: -5}"), wantPath: rl + ".requests_per_unit", wantMsg: "-5: must be at least 1"},
		{name: "negative burst", give: policyTestRL("{unit: second, requests_per_unit: 1, burst: -1}"), wantPath: rl + ".burst", wantMsg: "-1: must be at least 1"},
		{name: "zero burst", give: policyTestRL("{unit: second, requests_per_unit: 1, burst: 0}"), wantPath: rl + ".burst", wantMsg: "0: must be at least 1 (omit it"},
		{name: "unlimited with unit", give: policyTestRL("{unlimited: true, unit: second}"), wantPath: rl, wantMsg: "unlimited with unit"},
		{name: "unlimited with requests_per_unit", give: policyTestRL("{unlimited: true, requests_per_unit: 5}"), wantPath: rl, wantMsg: "unlimited with unit"},
		{
			// 1 per year: T = 365 days; burst 72 makes a 72-year window,
			// above gcra.MaxWindow (2^51 µs, 71.4 years).
			name: "window above MaxWindow", give: policyTestRL("{unit: year, requests_per_unit: 1, burst: 72}"),
			wantPath: rl, wantMsg: "exceeds the maximum window of 2^51 µs",
		},
		{
			// 999 per 1 ms: T rounds up from 1.001 µs to 2 µs, halving the rate.
			name: "interval rounding loses more than 1%", give: policyTestRL("{period: 1ms, requests_per_unit: 999}"),
			wantPath: rl, wantMsg: "more than 1% below the rate",
		},

		// Modes, scopes, strategies.
		{name: "bad rule failure_mode", give: policyTestRL("{unit: second, requests_per_unit: 1, failure_mode: maybe}"), wantPath: rl + ".failure_mode", wantMsg: `"maybe": want open, closed or local`},
		{name: "bad scope", give: policyTestRL("{unit: second, requests_per_unit: 1, scope: planet}"), wantPath: rl + ".scope", wantMsg: `"planet": want global or regional`},
		{name: "unknown strategy", give: policyTestRL("{unit: second, requests_per_unit: 1, strategy: fifo}"), wantPath: rl + ".strategy", wantMsg: `unknown strategy "fifo"`},

		// Names and replaces.
		{name: "replaces a missing rule", give: policyTestRL("{unit: second, requests_per_unit: 1, replaces: [{name: ghost}]}"), wantPath: rl + ".replaces", wantMsg: `no rule named "ghost" in domain "d"`},
		{
			name: "replaces a rule of another domain",
			give: "domains: [{domain: a, descriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1, name: x}}]}," +
				" {domain: b, descriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: x}]}}]}]",
			wantPath: "domains[1].descriptors[0].rate_limit.replaces", wantMsg: `no rule named "x" in domain "b"`,
		},
		{name: "replaces itself", give: policyTestRL("{unit: second, requests_per_unit: 1, name: me, replaces: [{name: me}]}"), wantPath: rl + ".replaces", wantMsg: `cannot replace itself ("me")`},
		{
			name: "replaces cycle",
			give: "domains: [{domain: d, descriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1, name: x, replaces: [y]}}," +
				" {key: b, rate_limit: {unit: second, requests_per_unit: 1, name: y, replaces: [x]}}]}]",
			wantPath: rl + ".replaces", wantMsg: `replaces cycle through "x"`,
		},
		{
			name: "replaces listed twice",
			give: "domains: [{domain: d, descriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1, name: x}}," +
				" {key: b, rate_limit: {unit: second, requests_per_unit: 1, replaces: [x, x]}}]}]",
			wantPath: "domains[0].descriptors[1].rate_limit.replaces", wantMsg: `"x" listed twice`,
		},
		{name: "replaces an empty name", give: policyTestRL(`{unit: second, requests_per_unit: 1, replaces: [{name: ""}]}`), wantPath: rl + ".replaces[0]", wantMsg: "empty name"},
		{
			name:     "duplicate name in a domain",
			give:     policyTestOne("[{key: a, rate_limit: {unit: second, requests_per_unit: 1, name: n}}, {key: b, rate_limit: {unlimited: true, name: n}}]"),
			wantPath: "domains[0].descriptors[1].rate_limit.name", wantMsg: `name "n" already used by domains[0].descriptors[0]`,
		},

		// Hash tags.
		{
			name:     "limit without the hash_tag key",
			give:     "domains: [{domain: d, hash_tag: tenant, descriptors: [{key: tenant, rate_limit: " + ok + "}, {key: ip, rate_limit: " + ok + "}]}]",
			wantPath: "domains[0].descriptors[1]", wantMsg: `no "tenant" entry on this path`,
		},
		{
			name:     "nested limit without the hash_tag key",
			give:     "domains: [{domain: d, hash_tag: tenant, descriptors: [{key: route, descriptors: [{key: method, rate_limit: " + ok + "}]}]}]",
			wantPath: d0 + ".descriptors[0]", wantMsg: `no "tenant" entry on this path`,
		},

		// Files.
		{name: "empty file", give: "", wantPath: "(root)", wantMsg: "empty policy"},
		{name: "comments only", give: "# nothing yet\n", wantPath: "(root)", wantMsg: "empty policy"},
		{name: "empty document", give: "---\n", wantPath: "(root)", wantMsg: "want a mapping"},
		{name: "malformed YAML", give: "domains: [{domain: d\n", wantMsg: "yaml: line"},
		{name: "tab indentation", give: "domains:\n\t- domain: d\n", wantMsg: "yaml: line 2"},
		{
			name:     "second document",
			give:     policyTestRL(ok) + "\n---\n" + "domains: [{domain: e, descriptors: []}]\n",
			wantPath: "(root)", wantLine: 3, wantMsg: "a second YAML document",
		},
		{name: "malformed second document", give: policyTestRL(ok) + "\n---\ndomains: [\n", wantMsg: "yaml: line"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := ParsePolicy([]byte(tt.give))
			if err == nil {
				t.Fatalf("ParsePolicy succeeded (version %s), want an error at %s: %s", p.Version(), tt.wantPath, tt.wantMsg)
			}
			if p != nil {
				t.Errorf("ParsePolicy returned a policy with its error")
			}
			if !errors.Is(err, ErrPolicy) {
				t.Errorf("error %v does not wrap ErrPolicy", err)
			}
			if !policyTestHas(policyTestProblems(err), tt.wantPath, tt.wantLine, tt.wantMsg) {
				line := ""
				if tt.wantLine != 0 {
					line = fmt.Sprintf(" (line %d)", tt.wantLine)
				}
				t.Errorf("error lacks %q%s: %q\ngot:\n%v", tt.wantPath, line, tt.wantMsg, err)
			}
		})
	}
}

// TestPolicyInvalidReportsEveryProblem: one file, several independent
// problems; each is reported, once, as its own joined error.
func TestPolicyInvalidReportsEveryProblem(t *testing.T) {
	src := `
domains:
  - domain: edge
    failure_mode: never
    descriptors:
      - key: tenant
        bogus: 1
        rate_limit: {unit: fortnight, requests_per_unit: 10}
      - key: tenant
        value: acme
        shadow_mode: "yes"
        rate_limit: {unit: second, requests_per_unit: 0, scope: everywhere}
      - key: path
        rate_limit: {unit: second, requests_per_unit: 5, replaces: [{name: nobody}]}
  - domain: edge
    descriptors:
      - key: x
        rate_limit: {unit: second, requests_per_unit: 1}
`
	_, err := ParsePolicy([]byte(src))
	if err == nil {
		t.Fatal("ParsePolicy succeeded")
	}
	if !errors.Is(err, ErrPolicy) {
		t.Errorf("error %v does not wrap ErrPolicy", err)
	}
	want := []struct {
		path string
		line int
		msg  string
	}{
		{"domains[0].descriptors[0].bogus", 7, "unknown field"},
		{"domains[0].descriptors[1].shadow_mode", 11, "want true or false"},
		{"domains[0].failure_mode", 0, `"never"`},
		{"domains[0].descriptors[0].rate_limit.unit", 0, `"fortnight"`},
		{"domains[0].descriptors[1].rate_limit.scope", 0, `"everywhere"`},
		{"domains[0].descriptors[1].rate_limit.requests_per_unit", 0, "0: must be at least 1"},
		{"domains[0].descriptors[2].rate_limit.replaces", 0, `no rule named "nobody"`},
		{"domains[1].domain", 0, `domain "edge" defined twice`},
	}
	problems := policyTestProblems(err)
	for _, w := range want {
		if !policyTestHas(problems, w.path, w.line, w.msg) {
			t.Errorf("missing problem at %s (line %d): %s", w.path, w.line, w.msg)
		}
	}
	if len(problems) != len(want) {
		t.Errorf("%d problems, want %d:\n%v", len(problems), len(want), err)
	}
}

func TestPolicyVersion(t *testing.T) {
	const base = `
domains:
  - domain: edge
    failure_mode: closed
    descriptors:
      - key: tenant
        rate_limit: {name: t, unit: minute, requests_per_unit: 100}
        descriptors:
          - key: path
            value: /api/*
            rate_limit:
              unit: second
              requests_per_unit: 10
              burst: 20
              replaces: [{name: t}]
`
	v0 := policyTestParse(t, base).Version()
	if len(v0) != 16 || strings.Trim(v0, "0123456789abcdef") != "" {
		t.Errorf("Version %q: want 16 hex digits", v0)
	}
	if v := policyTestParse(t, base).Version(); v != v0 {
		t.Errorf("Version not deterministic: %s then %s", v0, v)
	}
	tests := []struct {
		name     string
		give     string
		wantSame bool
	}{
		{
			name: "comments, blank lines and a document marker",
			give: `---
# The edge policy.
domains:

  - domain: edge          # public traffic
    failure_mode: closed
    descriptors:
      # every tenant
      - key: tenant
        rate_limit: {name: t, unit: minute, requests_per_unit: 100}
        descriptors:
          - key: path
            value: /api/*     # all of the API
            rate_limit:
              unit: second
              requests_per_unit: 10
              burst: 20
              replaces: [{name: t}]
`,
			wantSame: true,
		},
		{
			name:     "flow style on one line",
			give:     `{domains: [{domain: edge, failure_mode: closed, descriptors: [{key: tenant, rate_limit: {name: t, unit: minute, requests_per_unit: 100}, descriptors: [{key: path, value: /api/*, rate_limit: {unit: second, requests_per_unit: 10, burst: 20, replaces: [{name: t}]}}]}]}]}`,
			wantSame: true,
		},
		{
			name: "key order, quoting, indentation and replaces written as names",
			give: `
domains:
    -   descriptors:
          -   descriptors:
                -   rate_limit:
                        replaces:
                          - t
                        burst: 20
                        requests_per_unit: 10
                        unit: 'second'
                    value: "/api/*"
                    key: "path"
              rate_limit:
                requests_per_unit: 100
                unit: minute
                name: "t"
              key: tenant
        failure_mode: "closed"
        domain: 'edge'
`,
			wantSame: true,
		},
		{
			name:     "the same number in hex, detailed_metric ignored",
			give:     strings.Replace(strings.Replace(base, "requests_per_unit: 100", "requests_per_unit: 0x64", 1), "- key: path", "- key: path\n            detailed_metric: true", 1),
			wantSame: true,
		},
		{name: "requests_per_unit", give: strings.Replace(base, "requests_per_unit: 100", "requests_per_unit: 101", 1)},
		{name: "burst", give: strings.Replace(base, "burst: 20", "burst: 21", 1)},
		{name: "unit", give: strings.Replace(base, "unit: minute", "unit: hour", 1)},
		{name: "wildcard value", give: strings.Replace(base, "/api/*", "/api/v1*", 1)},
		{name: "failure_mode", give: strings.Replace(base, "failure_mode: closed", "failure_mode: open", 1)},
		{name: "domain", give: strings.Replace(base, "domain: edge", "domain: edge2", 1)},
		{name: "shadow_mode", give: strings.Replace(base, "- key: path", "- key: path\n            shadow_mode: true", 1)},
		{name: "replaces dropped", give: strings.Replace(base, "              replaces: [{name: t}]\n", "", 1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.give == base {
				t.Fatal("the variant is the base policy")
			}
			v := policyTestParse(t, tt.give).Version()
			if same := v == v0; same != tt.wantSame {
				t.Errorf("Version %s, base %s: same = %v, want %v", v, v0, same, tt.wantSame)
			}
		})
	}
}

func TestPolicyDefaultBurst(t *testing.T) {
	tests := []struct {
		name     string
		requests int64
		period   time.Duration
		want     int64
	}{
		{name: "per minute: the rate", requests: 600, period: time.Minute, want: 600},
		{name: "per second", requests: 5, period: time.Second, want: 5},
		{name: "10s period", requests: 5, period: 10 * time.Second, want: 5},
		{name: "one per day: 24h window fits", requests: 1, period: 24 * time.Hour, want: 1},
		{name: "ten per day", requests: 10, period: 24 * time.Hour, want: 10},
		{name: "a month's budget", requests: 10_000, period: 30 * 24 * time.Hour, want: 10_000},
		{name: "a year's budget", requests: 7, period: 365 * 24 * time.Hour, want: 7},
		// T = ⌈2^51·1.1 µs / 7⌉; 2^51 µs / T = 6.36…: 6.
		{name: "capped by MaxWindow", requests: 7, period: gcra.MaxWindow + gcra.MaxWindow/10, want: 6},
		{name: "capped by MaxBurst", requests: gcra.MaxBurst + 5, period: 365 * 24 * time.Hour, want: gcra.MaxBurst},
		{name: "T of 1µs", requests: 1_000_000_000, period: time.Second, want: 1_000_000_000},
		{name: "zero requests", requests: 0, period: time.Second, want: 0},
		{name: "negative requests", requests: -1, period: time.Second, want: 0},
		{name: "zero period", requests: 5, period: 0, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := DefaultBurst(tt.requests, tt.period); got != tt.want {
				t.Errorf("DefaultBurst(%d, %s) = %d, want %d", tt.requests, tt.period, got, tt.want)
			}
		})
	}
}

func TestPolicyDefaults(t *testing.T) {
	p := policyTestParse(t, `
domains:
  - domain: strict
    failure_mode: closed
    descriptors:
      - key: a                    # domains[0].descriptors[0]
        rate_limit: {unit: minute, requests_per_unit: 600}
      - key: b                    # [1]
        rate_limit: {unit: second, requests_per_unit: 5, burst: 7, failure_mode: open}
      - key: c                    # [2]
        rate_limit: {period: 10s, requests_per_unit: 5, failure_mode: local}
      - key: d                    # [3]
        rate_limit: {unit: day, requests_per_unit: 1, scope: regional, strategy: proportional}
      - key: e                    # [4]
        rate_limit: {unit: year, requests_per_unit: 7}
      - key: f                    # [5]
        rate_limit: {unlimited: true}
  - domain: plain
    descriptors:
      - key: a                    # domains[1].descriptors[0]
        rate_limit: {unit: Hour, requests_per_unit: 3600, scope: global}
      - key: b                    # [1]
        rate_limit: {unit: second, requests_per_unit: 1, failure_mode: closed}
`)
	tests := []struct {
		path         string
		wantInterval time.Duration
		wantBurst    int64
		wantLimit    gcra.Limit
		wantMode     FailureMode
		wantScope    Scope
		wantStrategy string
	}{
		{
			path:         "domains[0].descriptors[0]",
			wantInterval: 100 * time.Millisecond, wantBurst: 600, wantLimit: gcra.New(600, time.Minute, 600),
			wantMode: FailClosed, wantScope: Global,
		},
		{
			path:         "domains[0].descriptors[1]",
			wantInterval: 200 * time.Millisecond, wantBurst: 7, wantLimit: gcra.New(5, time.Second, 7),
			wantMode: FailOpen, wantScope: Global,
		},
		{
			path:         "domains[0].descriptors[2]",
			wantInterval: 2 * time.Second, wantBurst: 5, wantLimit: gcra.New(5, 10*time.Second, 5),
			wantMode: FailLocal, wantScope: Global,
		},
		{
			path:         "domains[0].descriptors[3]",
			wantInterval: 24 * time.Hour, wantBurst: 1, wantLimit: gcra.New(1, 24*time.Hour, 1),
			wantMode: FailClosed, wantScope: Regional, wantStrategy: "proportional",
		},
		{
			// No burst: the default, requests_per_unit; a year's window.
			path:         "domains[0].descriptors[4]",
			wantInterval: 4_505_142_857_143 * time.Microsecond, wantBurst: 7, wantLimit: gcra.New(7, 365*24*time.Hour, 7),
			wantMode: FailClosed, wantScope: Global,
		},
		{path: "domains[0].descriptors[5]", wantMode: FailClosed, wantScope: Global},
		{
			path:         "domains[1].descriptors[0]",
			wantInterval: time.Second, wantBurst: 3600, wantLimit: gcra.New(3600, time.Hour, 3600),
			wantMode: FailLocal, wantScope: Global,
		},
		{
			path:         "domains[1].descriptors[1]",
			wantInterval: time.Second, wantBurst: 1, wantLimit: gcra.New(1, time.Second, 1),
			wantMode: FailClosed, wantScope: Global,
		},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			r := policyTestRule(t, p, tt.path)
			if r.Limit != tt.wantLimit {
				t.Errorf("Limit %v, want %v", r.Limit, tt.wantLimit)
			}
			if got := r.Limit.Interval(); got != tt.wantInterval {
				t.Errorf("Interval %s, want %s", got, tt.wantInterval)
			}
			if got := r.Limit.Burst(); got != tt.wantBurst {
				t.Errorf("Burst %d, want %d", got, tt.wantBurst)
			}
			if err := r.Limit.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
			if r.FailureMode != tt.wantMode {
				t.Errorf("FailureMode %s, want %s", r.FailureMode, tt.wantMode)
			}
			if r.Scope != tt.wantScope {
				t.Errorf("Scope %s, want %s", r.Scope, tt.wantScope)
			}
			if r.Strategy != tt.wantStrategy {
				t.Errorf("Strategy %q, want %q", r.Strategy, tt.wantStrategy)
			}
		})
	}
	// Omitted burst is DefaultBurst(requests_per_unit, the unit's period).
	for _, c := range []struct {
		path     string
		requests int64
		period   time.Duration
	}{
		{"domains[0].descriptors[0]", 600, time.Minute},
		{"domains[0].descriptors[2]", 5, 10 * time.Second},
		{"domains[0].descriptors[3]", 1, 24 * time.Hour},
		{"domains[0].descriptors[4]", 7, 365 * 24 * time.Hour},
		{"domains[1].descriptors[0]", 3600, time.Hour},
	} {
		if got, want := policyTestRule(t, p, c.path).Limit.Burst(), DefaultBurst(c.requests, c.period); got != want {
			t.Errorf("%s: Burst %d, want DefaultBurst(%d, %s) = %d", c.path, got, c.requests, c.period, want)
		}
	}
	if u := policyTestRule(t, p, "domains[0].descriptors[5]"); !u.Unlimited || !u.Limit.IsZero() {
		t.Errorf("unlimited rule: Unlimited %v Limit %v", u.Unlimited, u.Limit)
	}
}

// TestPolicyHashTag: with a hash_tag, every limited path carries the tag's
// key (at any depth); an unlimited rule, which keeps no state, need not.
func TestPolicyHashTag(t *testing.T) {
	p := policyTestParse(t, `
domains:
  - domain: d
    hash_tag: tenant
    descriptors:
      - key: tenant
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: route
        descriptors:
          - key: tenant
            rate_limit: {unit: second, requests_per_unit: 2}
      - key: health
        rate_limit: {unlimited: true}
`)
	if dom := p.domains["d"]; dom == nil || dom.hashTag != "tenant" {
		t.Fatalf("domain d: %+v, want hash tag tenant", dom)
	}
	if r := p.domains["d"].match([]Entry{{"route", "/x"}, {"tenant", "acme"}}); r == nil || r.Path != "domains[0].descriptors[1].descriptors[0]" {
		t.Errorf("route/tenant resolved to %v", r)
	}
}

func TestRuleForKey(t *testing.T) {
	p, err := ParsePolicy([]byte(`
domains:
  - domain: api
    descriptors:
      - key: tenant
        rate_limit: {unit: second, requests_per_unit: 100}
        descriptors:
          - key: route
            value: /search
            rate_limit: {unit: minute, requests_per_unit: 600}
`))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		give     string
		wantPath string // "" for no rule
		wantErr  bool
	}{
		{give: KeyName("api", []Entry{{"tenant", "acme"}}), wantPath: "domains[0].descriptors[0]"},
		{give: KeyName("api", []Entry{{"tenant", "acme"}, {"route", "/search"}}), wantPath: "domains[0].descriptors[0].descriptors[0]"},
		{give: KeyName("api", []Entry{{"tenant", "acme"}, {"route", "/other"}})},
		{give: KeyName("web", []Entry{{"tenant", "acme"}})},
		{give: "api", wantErr: true},
		{give: "api/tenant", wantErr: true},
	}
	for _, tt := range tests {
		r, err := p.RuleForKey(tt.give)
		if (err != nil) != tt.wantErr {
			t.Errorf("RuleForKey(%q) error = %v, want error %v", tt.give, err, tt.wantErr)
			continue
		}
		got := ""
		if r != nil {
			got = r.Path
		}
		if got != tt.wantPath {
			t.Errorf("RuleForKey(%q) = rule %q, want %q", tt.give, got, tt.wantPath)
		}
	}
}

func TestRuleBudget(t *testing.T) {
	p, err := ParsePolicy([]byte(`
domains:
  - domain: api
    descriptors:
      - key: tenant
        rate_limit: {unit: second, requests_per_unit: 100, strategy: maxmin}
      - key: region_only
        rate_limit: {unit: second, requests_per_unit: 100, scope: regional}
      - key: free
        rate_limit: {unlimited: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	key := KeyName("api", []Entry{{"tenant", "acme"}})
	r, _ := p.RuleForKey(key)
	if b, ok := r.Budget(key); !ok || b.Key != key || b.Limit != r.Limit || b.Strategy != "maxmin" {
		t.Errorf("tenant: Budget = %+v, %v", b, ok)
	}
	for _, k := range []string{"region_only", "free", "nothing"} {
		name := KeyName("api", []Entry{{k, "x"}})
		r, _ := p.RuleForKey(name)
		if b, ok := r.Budget(name); ok {
			t.Errorf("%s: Budget = %+v, want none", k, b)
		}
	}
}
