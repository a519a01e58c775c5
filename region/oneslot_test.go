package region

import (
	"errors"
	"strings"
	"testing"

	"github.com/meridian-quota/meridian/gcra/memstore"
)

func TestPolicyCheckOneSlot(t *testing.T) {
	const rl = "rate_limit: {unit: second, requests_per_unit: 10}"
	tests := []struct {
		name, give string
		want       []string // none: passes
	}{
		{"envoy-style, no hash_tag", `domains: [{domain: api, descriptors: [{key: tenant, ` + rl + `, descriptors: [{key: route, ` + rl + `}]}]}]`,
			[]string{`domain "api" has no hash_tag`, "domains[0].descriptors[0], domains[0].descriptors[0].descriptors[0]"}},
		{"named limits", `domains: [{domain: api, descriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 10, name: first}}, {key: b, ` + rl + `}]}]`,
			[]string{`domains[0].descriptors[0] ("first"), domains[0].descriptors[1]`}},
		{"with hash_tag", `domains: [{domain: api, hash_tag: tenant, descriptors: [{key: tenant, ` + rl + `, descriptors: [{key: route, ` + rl + `}]}]}]`, nil},
		{"one limit", `domains: [{domain: api, descriptors: [{key: user, ` + rl + `}]}]`, nil},
		{"one limit and an unlimited one", `domains: [{domain: api, descriptors: [{key: user, ` + rl + `}, {key: user, value: root, rate_limit: {unlimited: true}}]}]`, nil},
		{"enforced and shadow never share a call", `domains: [{domain: api, descriptors: [{key: a, ` + rl + `}, {key: b, shadow_mode: true, ` + rl + `}]}]`, nil},
		{"two shadow limits do", `domains: [{domain: api, descriptors: [{key: a, shadow_mode: true, ` + rl + `}, {key: b, shadow_mode: true, ` + rl + `}]}]`,
			[]string{"domains[0].descriptors[0], domains[0].descriptors[1]"}},
		{"one replaces the other", `domains: [{domain: api, descriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 10, name: a}}, {key: b, rate_limit: {unit: second, requests_per_unit: 10, replaces: [a]}}]}]`, nil},
		{"only the domains that combine", `domains: [{domain: ok, descriptors: [{key: u, ` + rl + `}]}, {domain: bad, descriptors: [{key: a, ` + rl + `}, {key: b, ` + rl + `}]}]`,
			[]string{`domain "bad"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := mustPolicy(t, tt.give).CheckOneSlot()
			if len(tt.want) == 0 {
				if err != nil {
					t.Errorf("refused: %v", err)
				}
				return
			}
			for _, w := range tt.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("err = %v, want it to contain %q", err, w)
				}
			}
			if err != nil && strings.Contains(err.Error(), `domain "ok"`) {
				t.Errorf("err = %v names a domain with one limit", err)
			}
		})
	}
}

// With Config.OneSlot a node refuses, as a bad request, a request whose
// keys still could not share a slot, and decides the rest.
func TestNodeOneSlot(t *testing.T) {
	ms, err := memstore.New(memstore.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig("eu", "eu-1", regions...)
	cfg.OneSlot = true
	untagged := strings.Replace(testPolicy, "    hash_tag: tenant\n", "", 1)
	if _, err := NewNode(cfg, mustPolicy(t, untagged), ms); err == nil || !strings.Contains(err.Error(), `domain "api" has no hash_tag`) {
		t.Fatalf("NewNode with an untagged composite policy: %v", err)
	}
	single := `
domains:
  - domain: api
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 10}
`
	n, err := NewNode(cfg, mustPolicy(t, single), ms)
	if err != nil {
		t.Fatal(err)
	}
	user := func(v string) Descriptor { return Descriptor{Entries: []Entry{{"user", v}}} }
	var d Decision
	if err := n.Resolve(req(1, user("alice")), &d); err != nil {
		t.Errorf("one key: %v", err)
	}
	if err := n.Resolve(req(1, user("alice"), user("alice")), &d); err != nil {
		t.Errorf("the same key twice (one check): %v", err)
	}
	err = n.Resolve(req(1, user("alice"), user("bob")), &d)
	if !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "cannot share a Redis Cluster slot (the domain has no hash_tag)") {
		t.Errorf("two keys of an untagged domain: %v, want a bad request", err)
	}
	tagged, err := NewNode(cfg, mustPolicy(t, testPolicy), ms)
	if err != nil {
		t.Fatal(err)
	}
	if err := tagged.Resolve(req(1, tenant("acme"), tenant("acme", Entry{"route", "/search"})), &d); err != nil {
		t.Errorf("tagged composite: %v", err)
	}
}
