package region

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// upstreamCommit is the envoyproxy/ratelimit commit whose GetLimit
// (src/config/config_impl.go) and test/config/config_test.go these tests
// re-express: its main branch head when they were written.
const upstreamCommit = "f2fb15770f7fd1c88ca6c3a1b58ee513917ace96"

// matchTestDescriptor parses "k=v,k2=v2" into entries ("" is none; a value
// may be empty, "k=").
func matchTestDescriptor(t *testing.T, s string) []Entry {
	t.Helper()
	if s == "" {
		return nil
	}
	var es []Entry
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			t.Fatalf("descriptor %q: entry %q has no =", s, kv)
		}
		es = append(es, Entry{Key: k, Value: v})
	}
	return es
}

// matchTestLimit renders a rule as upstream's assertions name it:
// requests_per_unit/unit, "unlimited", then " shadow" and " name=…".
func matchTestLimit(r *Rule) string {
	var s string
	if r.Unlimited {
		s = "unlimited"
	} else {
		n, period := r.Limit.Rate()
		unit := period.String()
		for name, d := range units {
			if d == period {
				unit = name
			}
		}
		s = fmt.Sprintf("%d/%s", n, unit)
	}
	if r.Shadow {
		s += " shadow"
	}
	if r.Name != "" {
		s += " name=" + r.Name
	}
	return s
}

var matchTestPolicies = map[string]*Policy{}

func matchTestPolicy(t *testing.T, file string) *Policy {
	t.Helper()
	if p := matchTestPolicies[file]; p != nil {
		return p
	}
	p, err := LoadPolicy(filepath.Join("testdata", "upstream", "match", file), LoadOptions{})
	if err != nil {
		t.Fatalf("load %s: %v", file, err)
	}
	matchTestPolicies[file] = p
	return p
}

// matchTestRun matches give in domain and returns the rule's path within
// its domain ("" for none) and its limit.
func matchTestRun(t *testing.T, file, domain, give string) (path, limit string) {
	t.Helper()
	p := matchTestPolicy(t, file)
	r := p.Match(domain, matchTestDescriptor(t, give))
	if r == nil {
		return "", ""
	}
	if r.Domain != domain {
		t.Errorf("rule %s has Domain %q, want %q", r.Path, r.Domain, domain)
	}
	_, path, _ = strings.Cut(r.Path, ".")
	return path, matchTestLimit(r)
}

// TestMatchUpstream re-expresses every matching assertion of upstream's
// test/config/config_test.go (at upstreamCommit) over Meridian's policy:
// for each domain and descriptor, the rule GetLimit returns — by its place
// in the fixture and its requests_per_unit/unit as upstream asserts them —
// or none. The fixtures in testdata/upstream/match re-create upstream's
// configs in Meridian's domains: [...] form, leaving out the fields that
// change only stats or cache keys (value_to_metric, share_threshold,
// metadata), which Meridian's policy does not take today.
//
// Not expressed (Match has no per-request override): the three
// TestConfigLimitOverride lookups, where an Envoy limit override replaces
// the configured rule; region.Node.Resolve handles overrides.
func TestMatchUpstream(t *testing.T) {
	const (
		d0   = "descriptors[0]"
		d00  = "descriptors[0].descriptors[0]"
		d01  = "descriptors[0].descriptors[1]"
		d000 = "descriptors[0].descriptors[0].descriptors[0]"
		d010 = "descriptors[0].descriptors[1].descriptors[0]"
	)
	tests := []struct {
		from   string // upstream test (and sub-test) asserting it
		file   string
		domain string
		give   string // "k=v,k2=v2"
		want   string // the rule's path in its domain; "" for none
		limit  string // as upstream asserts it
	}{
		// TestBasicConfig: basic_config.yaml.
		{from: "TestBasicConfig", file: "basic_config.yaml", domain: "foo_domain", give: ""},
		{from: "TestBasicConfig", file: "basic_config.yaml", domain: "test-domain", give: ""},
		{from: "TestBasicConfig", file: "basic_config.yaml", domain: "test-domain", give: "key1=something"},
		{from: "TestBasicConfig", file: "basic_config.yaml", domain: "test-domain", give: "key1=value1"},
		{from: "TestBasicConfig", file: "basic_config.yaml", domain: "test-domain", give: "key2=value2,subkey=subvalue"},
		{from: "TestBasicConfig", file: "basic_config.yaml", domain: "test-domain", give: "key5=value5,subkey5=subvalue"},
		{from: "TestBasicConfig", file: "basic_config.yaml", domain: "test-domain", give: "key1=value1,subkey1=something", want: d00, limit: "5/second"},
		{from: "TestBasicConfig", file: "basic_config.yaml", domain: "test-domain", give: "key1=value1,subkey1=subvalue1", want: d01, limit: "10/second"},
		{from: "TestBasicConfig", file: "basic_config.yaml", domain: "test-domain", give: "key2=something", want: "descriptors[1]", limit: "20/minute"},
		{from: "TestBasicConfig", file: "basic_config.yaml", domain: "test-domain", give: "key2=value2", want: "descriptors[2]", limit: "30/minute"},
		{from: "TestBasicConfig", file: "basic_config.yaml", domain: "test-domain", give: "key2=value3"},
		{from: "TestBasicConfig", file: "basic_config.yaml", domain: "test-domain", give: "key3=foo", want: "descriptors[4]", limit: "1/hour"},
		{from: "TestBasicConfig", file: "basic_config.yaml", domain: "test-domain", give: "key4=foo", want: "descriptors[5]", limit: "1/day name=key4_rate_limit"},
		{from: "TestBasicConfig", file: "basic_config.yaml", domain: "test-domain", give: "key6=foo", want: "descriptors[7]", limit: "unlimited"},
		{from: "TestBasicConfig", file: "basic_config.yaml", domain: "test-domain", give: "key7=unspecified_value", want: "descriptors[8]", limit: "70/minute"},
		{from: "TestBasicConfig", file: "basic_config.yaml", domain: "test-domain", give: "key7=another_value", want: "descriptors[8]", limit: "70/minute"},

		// TestDomainMerge: merge_domain_key1.yaml + merge_domain_key2.yaml, merged.
		{from: "TestDomainMerge", file: "merge_domain.yaml", domain: "foo_domain", give: ""},
		{from: "TestDomainMerge", file: "merge_domain.yaml", domain: "test-domain", give: ""},
		{from: "TestDomainMerge", file: "merge_domain.yaml", domain: "test-domain", give: "key1=value1", want: d0, limit: "10/minute"},
		{from: "TestDomainMerge", file: "merge_domain.yaml", domain: "test-domain", give: "key2=value2", want: "descriptors[1]", limit: "20/minute"},

		// TestShadowModeConfig: shadowmode_config.yaml.
		{from: "TestShadowModeConfig", file: "shadowmode_config.yaml", domain: "test-domain", give: "key1=value1,subkey1=something", want: d00, limit: "5/second"},
		{from: "TestShadowModeConfig", file: "shadowmode_config.yaml", domain: "test-domain", give: "key1=value1,subkey1=subvalue1", want: d01, limit: "10/second shadow"},
		{from: "TestShadowModeConfig", file: "shadowmode_config.yaml", domain: "test-domain", give: "key2=something", want: "descriptors[1]", limit: "20/minute shadow"},
		{from: "TestShadowModeConfig", file: "shadowmode_config.yaml", domain: "test-domain", give: "key2=value2", want: "descriptors[2]", limit: "30/minute"},

		// TestWildcardConfig: wildcard.yaml.
		{from: "TestWildcardConfig", file: "wildcard.yaml", domain: "test-domain", give: "noVal=foo1", want: "descriptors[2]", limit: "20/minute"},
		{from: "TestWildcardConfig", file: "wildcard.yaml", domain: "test-domain", give: "noVal=foo2", want: "descriptors[2]", limit: "20/minute"},
		{from: "TestWildcardConfig", file: "wildcard.yaml", domain: "test-domain", give: "wild=foo1", want: d0, limit: "20/minute"},
		{from: "TestWildcardConfig", file: "wildcard.yaml", domain: "test-domain", give: "wild=foo2", want: d0, limit: "20/minute"},
		{from: "TestWildcardConfig", file: "wildcard.yaml", domain: "test-domain", give: "nestedWild=val1,wild=goo2", want: "descriptors[5].descriptors[0]", limit: "20/minute"},
		{from: "TestWildcardConfig", file: "wildcard.yaml", domain: "test-domain", give: "wild=bar"},
		{from: "TestWildcardConfig", file: "wildcard.yaml", domain: "test-domain", give: "noWild=foo1"},
		{from: "TestWildcardConfig", file: "wildcard.yaml", domain: "test-domain", give: "midWild=barab", want: "descriptors[3]", limit: "20/minute"},
		{from: "TestWildcardConfig", file: "wildcard.yaml", domain: "test-domain", give: "midWild=bar123b", want: "descriptors[3]", limit: "20/minute"},
		{from: "TestWildcardConfig", file: "wildcard.yaml", domain: "test-domain", give: "midWild=barb", want: "descriptors[3]", limit: "20/minute"},
		{from: "TestWildcardConfig", file: "wildcard.yaml", domain: "test-domain", give: "midWild=bara"},
		{from: "TestWildcardConfig", file: "wildcard.yaml", domain: "test-domain", give: "midWild=xbarb"},
		{from: "TestWildcardConfig", file: "wildcard.yaml", domain: "test-domain", give: "multiWild=foo123bar456baz", want: "descriptors[4]", limit: "10/minute"},
		{from: "TestWildcardConfig", file: "wildcard.yaml", domain: "test-domain", give: "multiWild=foobarbaz", want: "descriptors[4]", limit: "10/minute"},
		{from: "TestWildcardConfig", file: "wildcard.yaml", domain: "test-domain", give: "multiWild=foo123baz"},
		{from: "TestWildcardConfig", file: "wildcard.yaml", domain: "test-domain", give: "multiWild=bar456baz"},

		// TestDetailedMetric: one domain per case (upstream: "nested" each).
		{from: "TestDetailedMetric/nested with no values but request only top-level key", file: "detailed_metric.yaml", domain: "nested-top-detailed", give: "key-1=value-1", want: d0, limit: "100/minute"},
		{from: "TestDetailedMetric/... with no detailed metric", file: "detailed_metric.yaml", domain: "nested-top", give: "key-1=value-1", want: d0, limit: "100/minute"},
		{from: "TestDetailedMetric/nested with no values and request fully nested descriptors", file: "detailed_metric.yaml", domain: "nested-full-detailed", give: "key-1=value-1,key-2=value-2", want: d00, limit: "5/minute"},
		{from: "TestDetailedMetric/... with no detailed metric", file: "detailed_metric.yaml", domain: "nested-full", give: "key-1=value-1,key-2=value-2", want: d00, limit: "5/minute"},
		{from: "TestDetailedMetric/test nested descriptors with simple request", file: "detailed_metric.yaml", domain: "nested", give: "key_1=value-for-key-1", want: d0, limit: "500/minute"},
		{from: "TestDetailedMetric/test nested only second descriptor request not nested", file: "detailed_metric.yaml", domain: "nested", give: "key_2=key-2-value", want: "descriptors[2]", limit: "5000/minute"},
		{from: "TestDetailedMetric/test nested descriptors with nested request", file: "detailed_metric.yaml", domain: "nested", give: "key_2=key-2-value,key_3=requested-key3-value", want: "descriptors[2].descriptors[1]", limit: "5/minute"},

		// TestValueToMetric_*: one domain per test.
		{from: "TestValueToMetric_UsesRuntimeValuesInStats", file: "value_to_metric.yaml", domain: "runtime-values", give: "route=draw,http_method=GET,subject_id=123", want: d000, limit: "60/minute"},
		{from: "TestValueToMetric_DefaultKeyIncludesValueAtThatLevel", file: "value_to_metric.yaml", domain: "default-key", give: "k1=A,k2=foo", want: d00, limit: "1/second"},
		{from: "TestValueToMetric_MidLevelOnly", file: "value_to_metric.yaml", domain: "mid-level", give: "k1=X,k2=Y,k3=Z", want: d000, limit: "1/second"},
		{from: "TestValueToMetric_NoFlag_Unchanged", file: "value_to_metric.yaml", domain: "no-flag", give: "k1=X,k2=Y", want: d00, limit: "1/second"},
		{from: "TestValueToMetric_DoesNotOverrideDetailedMetric", file: "value_to_metric.yaml", domain: "detailed", give: "route=draw,http_method=GET,subject_id=123", want: d000, limit: "60/minute"},
		{from: "TestValueToMetric_WithConfiguredValues", file: "value_to_metric.yaml", domain: "configured-values", give: "route=api,http_method=GET,subject_id=user123", want: d000, limit: "60/minute"},
		{from: "TestValueToMetric_WithConfiguredValues", file: "value_to_metric.yaml", domain: "configured-values", give: "route=api,http_method=POST,subject_id=user456", want: d010, limit: "30/minute"},
		{from: "TestValueToMetric_WithWildcard", file: "value_to_metric.yaml", domain: "with-wildcard", give: "user=alice,action=readfile,resource=documents", want: d000, limit: "100/minute"},
		{from: "TestValueToMetric_WithWildcard", file: "value_to_metric.yaml", domain: "with-wildcard", give: "user=bob,action=readdata,resource=database", want: d000, limit: "100/minute"},
		{from: "TestValueToMetric_WithEmptyValue", file: "value_to_metric.yaml", domain: "empty-value", give: "route=,http_method=GET,subject_id=123", want: d000, limit: "60/minute"},
		{from: "TestValueToMetric_WithEmptyValue", file: "value_to_metric.yaml", domain: "empty-value", give: "route=draw,http_method=,subject_id=123", want: d000, limit: "60/minute"},
		{from: "TestValueToMetric_WithEmptyValue", file: "value_to_metric.yaml", domain: "empty-value", give: "route=,http_method=,subject_id=123", want: d000, limit: "60/minute"},
		{from: "TestValueToMetric_FullKeyMatchesStatsKey/1", file: "value_to_metric.yaml", domain: "test-domain", give: "route=api,http_method=GET,subject_id=user123", want: d000, limit: "60/minute"},
		{from: "TestValueToMetric_FullKeyMatchesStatsKey/2", file: "value_to_metric.yaml", domain: "test-domain-2", give: "route=api,http_method=GET,subject_id=user123", want: d000, limit: "60/minute"},
		{from: "TestValueToMetric_FullKeyMatchesStatsKey/3", file: "value_to_metric.yaml", domain: "test-domain-3", give: "route=api,http_method=GET,subject_id=user123", want: d000, limit: "60/minute"},

		// TestShareThreshold: share_threshold.yaml.
		{from: "TestShareThreshold/Basic share_threshold", file: "share_threshold.yaml", domain: "test-domain", give: "files=files/a.pdf", want: d0, limit: "100/minute"},
		{from: "TestShareThreshold/Basic share_threshold", file: "share_threshold.yaml", domain: "test-domain", give: "files=files/b.csv", want: d0, limit: "100/minute"},
		{from: "TestShareThreshold/Basic share_threshold", file: "share_threshold.yaml", domain: "test-domain", give: "files=files/c.txt", want: d0, limit: "100/minute"},
		{from: "TestShareThreshold/share_threshold with metrics", file: "share_threshold.yaml", domain: "test-domain", give: "route=api/v1,method=GET", want: "descriptors[3].descriptors[0]", limit: "60/minute"},
		{from: "TestShareThreshold/share_threshold with metrics", file: "share_threshold.yaml", domain: "test-domain", give: "service=svc/user,endpoint=get", want: "descriptors[4].descriptors[0]", limit: "80/minute"},
		{from: "TestShareThreshold/Nested wildcards", file: "share_threshold.yaml", domain: "test-domain", give: "nested=parent,files=nested/file1.txt", want: "descriptors[1].descriptors[0]", limit: "200/minute"},
		{from: "TestShareThreshold/Nested wildcards", file: "share_threshold.yaml", domain: "test-domain", give: "files=top/file1.txt,files=nested/file1.txt", want: "descriptors[2].descriptors[0]", limit: "300/minute"},
		{from: "TestShareThreshold/Nested wildcards", file: "share_threshold.yaml", domain: "test-domain", give: "path=path/foo,file=file/doc1,type=pdf", want: "descriptors[5].descriptors[0].descriptors[0]", limit: "120/minute"},
		{from: "TestShareThreshold/Nested wildcards", file: "share_threshold.yaml", domain: "test-domain", give: "user=user/alice,resource=res/file1,action=read", want: "descriptors[6].descriptors[0].descriptors[0]", limit: "150/minute"},
		{from: "TestShareThreshold/Explicit value precedence over wildcard", file: "share_threshold.yaml", domain: "test-domain", give: "file=test1", want: "descriptors[7]", limit: "50/minute"},
		{from: "TestShareThreshold/Explicit value precedence over wildcard", file: "share_threshold.yaml", domain: "test-domain", give: "file=test2", want: "descriptors[8]", limit: "100/minute"},
		{from: "TestShareThreshold/Explicit value precedence over wildcard", file: "share_threshold.yaml", domain: "test-domain", give: "file=test23", want: "descriptors[8]", limit: "100/minute"},
		{from: "TestShareThreshold/Explicit value precedence over wildcard", file: "share_threshold.yaml", domain: "test-domain", give: "file=test123", want: "descriptors[8]", limit: "100/minute"},
		{from: "TestShareThreshold/share_threshold with middle wildcard", file: "share_threshold.yaml", domain: "test-domain", give: "midpath=/api/v1", want: "descriptors[9]", limit: "100/minute"},
		{from: "TestShareThreshold/share_threshold with middle wildcard", file: "share_threshold.yaml", domain: "test-domain", give: "midpath=/api-beta-v1", want: "descriptors[9]", limit: "100/minute"},
		{from: "TestShareThreshold/share_threshold with middle wildcard", file: "share_threshold.yaml", domain: "test-domain", give: "midpath=/apiXYZv1", want: "descriptors[9]", limit: "100/minute"},
		{from: "TestShareThreshold/share_threshold with middle wildcard", file: "share_threshold.yaml", domain: "test-domain", give: "midpath=/api/v2"},
		{from: "TestShareThreshold/share_threshold with multi-wildcard", file: "share_threshold.yaml", domain: "test-domain", give: "multiroute=svcAepBrpc", want: "descriptors[10]", limit: "50/minute"},
		{from: "TestShareThreshold/share_threshold with multi-wildcard", file: "share_threshold.yaml", domain: "test-domain", give: "multiroute=svcXXXepYYYrpc", want: "descriptors[10]", limit: "50/minute"},
		{from: "TestShareThreshold/share_threshold with multi-wildcard", file: "share_threshold.yaml", domain: "test-domain", give: "multiroute=svceprpc", want: "descriptors[10]", limit: "50/minute"},
		{from: "TestShareThreshold/share_threshold with multi-wildcard", file: "share_threshold.yaml", domain: "test-domain", give: "multiroute=svcABCrpc"},
		{from: "TestShareThreshold/share_threshold priority over value_to_metric with middle wildcard", file: "share_threshold.yaml", domain: "test-domain", give: "midroute=/api/v2", want: "descriptors[11]", limit: "80/minute"},
		{from: "TestShareThreshold/share_threshold priority over value_to_metric with middle wildcard", file: "share_threshold.yaml", domain: "test-domain", give: "midroute=/api-beta-v2", want: "descriptors[11]", limit: "80/minute"},
		{from: "TestShareThreshold/share_threshold with nested middle wildcards", file: "share_threshold.yaml", domain: "test-domain", give: "tenant=t1prod,resource=resAv2", want: "descriptors[12].descriptors[0]", limit: "60/minute"},
		{from: "TestShareThreshold/share_threshold with nested middle wildcards", file: "share_threshold.yaml", domain: "test-domain", give: "tenant=t99prod,resource=resBBBv2", want: "descriptors[12].descriptors[0]", limit: "60/minute"},

		// TestWildcardStatsBehavior: one domain per sub-test.
		{from: "TestWildcardStatsBehavior/No flags", file: "wildcard_stats.yaml", domain: "no-flags", give: "wild=foo1", want: d0, limit: "20/minute"},
		{from: "TestWildcardStatsBehavior/value_to_metric", file: "wildcard_stats.yaml", domain: "value-to-metric", give: "wild=foo1", want: d0, limit: "20/minute"},
		{from: "TestWildcardStatsBehavior/share_threshold", file: "wildcard_stats.yaml", domain: "share-threshold", give: "wild=foo1", want: d0, limit: "20/minute"},
		{from: "TestWildcardStatsBehavior/share_threshold with value_to_metric", file: "wildcard_stats.yaml", domain: "share-threshold-vtm", give: "wild=foo1", want: d0, limit: "20/minute"},
		{from: "TestWildcardStatsBehavior/value_to_metric in other descriptor", file: "wildcard_stats.yaml", domain: "other-descriptor", give: "wild=foo1,other=bar,limit=X", want: d000, limit: "20/minute"},
		{from: "TestWildcardStatsBehavior/middle+trailing wildcard - no flags", file: "wildcard_stats.yaml", domain: "middle-trailing", give: "wild=foo123bar456", want: d0, limit: "20/minute"},
		{from: "TestWildcardStatsBehavior/middle+trailing wildcard - no flags", file: "wildcard_stats.yaml", domain: "middle-trailing", give: "wild=fooXbarY", want: d0, limit: "20/minute"},
		{from: "TestWildcardStatsBehavior/middle+trailing wildcard - value_to_metric", file: "wildcard_stats.yaml", domain: "middle-trailing-vtm", give: "wild=foo123bar456", want: d0, limit: "20/minute"},

		// TestMetadata: metadata.yaml.
		{from: "TestMetadata", file: "metadata.yaml", domain: "test-domain", give: ""},
		{from: "TestMetadata", file: "metadata.yaml", domain: "test-domain", give: "key1=value1,subkey1=something", want: d00, limit: "5/second"},
		{from: "TestMetadata", file: "metadata.yaml", domain: "test-domain", give: "key2=something", want: "descriptors[1]", limit: "20/minute"},
	}
	agree := 0
	for _, tt := range tests {
		t.Run(tt.from+"/"+tt.domain+"/"+tt.give, func(t *testing.T) {
			path, limit := matchTestRun(t, tt.file, tt.domain, tt.give)
			if path != tt.want || limit != tt.limit {
				t.Errorf("%s: Match(%q, %q) = %q (%s), upstream at %.7s matches %q (%s)",
					tt.file, tt.domain, tt.give, path, limit, upstreamCommit, tt.want, tt.limit)
				return
			}
			agree++
		})
	}
	if len(tests) < 60 {
		t.Errorf("%d cases: issue 15 asks for at least 60", len(tests))
	}
	t.Logf("%d of %d of upstream's matching assertions agree", agree, len(tests))
}

// TestMatchUpstreamDerived checks lookups that upstream's GetLimit decides
// but its tests do not assert, worked out from its code: a pattern's text
// is also an exact value; the literal parts of a pattern never overlap;
// "**" is one star; "*" matches the empty value; a wildcard beats the bare
// key wherever it is written; no backtracking to a sibling once a node is
// chosen; a descriptor without rate_limit allow-lists its value.
func TestMatchUpstreamDerived(t *testing.T) {
	tests := []struct {
		domain, give, want, limit string
	}{
		{domain: "literal-pattern", give: "k=fox", want: "descriptors[0]", limit: "1/second"},
		{domain: "literal-pattern", give: "k=f*", want: "descriptors[0]", limit: "1/second"},
		{domain: "literal-pattern", give: "k=fo*", want: "descriptors[1]", limit: "2/second"},
		{domain: "overlap", give: "k=aba"},
		{domain: "overlap", give: "k=ab"},
		{domain: "overlap", give: "k=abba", want: "descriptors[0]", limit: "1/second"},
		{domain: "overlap", give: "k=ab-ba", want: "descriptors[0]", limit: "1/second"},
		{domain: "double-star", give: "k=xy", want: "descriptors[0]", limit: "1/second"},
		{domain: "double-star", give: "k=x-y", want: "descriptors[0]", limit: "1/second"},
		{domain: "double-star", give: "k=yx"},
		{domain: "star", give: "k=", want: "descriptors[0]", limit: "1/second"},
		{domain: "star", give: "k=anything", want: "descriptors[0]", limit: "1/second"},
		{domain: "star", give: "j=anything"},
		{domain: "wildcard-after-bare", give: "k=abc", want: "descriptors[1]", limit: "2/second"},
		{domain: "wildcard-after-bare", give: "k=bc", want: "descriptors[0]", limit: "1/second"},
		{domain: "no-backtracking", give: "k=ab,j=x", want: "descriptors[0].descriptors[0]", limit: "1/second"},
		{domain: "no-backtracking", give: "k=ab,j=y"},
		{domain: "no-backtracking", give: "k=b,j=y", want: "descriptors[1].descriptors[0]", limit: "2/second"},
		{domain: "no-backtracking", give: "k=ab"},
		{domain: "allow-list", give: "k=vip"},
		{domain: "allow-list", give: "k=vip,j=x"},
		{domain: "allow-list", give: "k=vip2", want: "descriptors[1]", limit: "1/second"},
		{domain: "allow-list", give: "k=other", want: "descriptors[2]", limit: "2/second"},
	}
	for _, tt := range tests {
		t.Run(tt.domain+"/"+tt.give, func(t *testing.T) {
			path, limit := matchTestRun(t, "derived.yaml", tt.domain, tt.give)
			if path != tt.want || limit != tt.limit {
				t.Errorf("Match(%q, %q) = %q (%s), upstream's GetLimit gives %q (%s)", tt.domain, tt.give, path, limit, tt.want, tt.limit)
			}
		})
	}
}

// TestMatchUpstreamDifferences pins each deliberate difference from
// upstream's matching, which the README's "Coming from
// envoyproxy/ratelimit" lists: upstream looks up key+"_"+value as one
// string, Meridian the key and the value apart.
func TestMatchUpstreamDifferences(t *testing.T) {
	tests := []struct {
		domain, give string
		want         string // Meridian
		upstream     string // upstream's GetLimit at upstreamCommit
		why          string
	}{
		{
			domain: "seam-exact", give: "key1=local", want: "descriptors[0]", upstream: "descriptors[1]",
			why: `upstream's "key1_local" is key1=local's joined string, so the key1_local rule captures it`,
		},
		{
			domain: "seam-wildcard", give: "tenant_id=42", want: "", upstream: "descriptors[0]",
			why: `upstream's pattern "tenant_*" also matches the joined "tenant_id_42"`,
		},
		{domain: "seam-wildcard", give: "tenant=42", want: "descriptors[0]", upstream: "descriptors[0]", why: "(agrees)"},
		{
			domain: "seam-empty-value", give: "k=", want: "descriptors[0]", upstream: "descriptors[1]",
			why: `upstream joins an empty value as "k_", the bare key k_`,
		},
		{
			domain: "seam-duplicate", give: "a=b_c", want: "descriptors[1]", upstream: "(load error)",
			why: "upstream refuses a_b=c beside a=b_c as one composite key a_b_c",
		},
		{domain: "seam-duplicate", give: "a_b=c", want: "descriptors[0]", upstream: "(load error)", why: "as above"},
	}
	for _, tt := range tests {
		t.Run(tt.domain+"/"+tt.give, func(t *testing.T) {
			path, _ := matchTestRun(t, "differences.yaml", tt.domain, tt.give)
			if path != tt.want {
				t.Errorf("Match(%q, %q) = %q, want %q (upstream: %q; %s)", tt.domain, tt.give, path, tt.want, tt.upstream, tt.why)
			}
		})
	}

	// A "*" in a key: upstream globs it over key_value; Meridian refuses it.
	_, err := ParsePolicy([]byte("domains: [{domain: d, descriptors: [{key: \"tenant*\", rate_limit: {unit: second, requests_per_unit: 1}}]}]"))
	if err == nil || !strings.Contains(err.Error(), "domains[0].descriptors[0].key") || !strings.Contains(err.Error(), "matched exactly") {
		t.Errorf("a key with *: err = %v, want a refusal at domains[0].descriptors[0].key", err)
	}
}

// TestMatchGlob checks the pattern matcher on its own, against a plain
// recursive reference.
func TestMatchGlob(t *testing.T) {
	var ref func(p, s string) bool
	ref = func(p, s string) bool {
		if p == "" {
			return s == ""
		}
		if p[0] == '*' {
			return ref(p[1:], s) || (s != "" && ref(p, s[1:]))
		}
		return s != "" && s[0] == p[0] && ref(p[1:], s[1:])
	}
	patterns := []string{"*", "**", "a*", "*a", "a*b", "ab*ba", "a*b*c", "*a*", "a**b", "aa*aa*aa", "*ab*ab*"}
	alphabet := "ab*c"
	var values []string
	var gen func(prefix string, n int)
	gen = func(prefix string, n int) {
		values = append(values, prefix)
		if n == 0 {
			return
		}
		for i := range len(alphabet) {
			gen(prefix+alphabet[i:i+1], n-1)
		}
	}
	gen("", 6)
	for _, p := range patterns {
		parts := strings.Split(p, "*")
		for _, v := range values {
			if got, want := globMatch(parts, v), ref(p, v); got != want {
				t.Fatalf("globMatch(%q, %q) = %v, want %v", p, v, got, want)
			}
		}
	}
}

// The fixtures' comments and their rules agree: every rule's limit is one
// upstream's units express (guards the table's limit strings).
func TestMatchUpstreamFixturesLoad(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "upstream", "match", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	for _, f := range files {
		p := matchTestPolicy(t, filepath.Base(f))
		for _, r := range p.Rules() {
			if r.Unlimited {
				continue
			}
			if _, period := r.Limit.Rate(); period < time.Second {
				t.Errorf("%s %s: period %s is not one of upstream's units", f, r.Path, period)
			}
		}
	}
}

// TestMatchNoAlloc: the hot path's lookup allocates nothing, wildcards
// included.
func TestMatchNoAlloc(t *testing.T) {
	p := matchTestPolicy(t, "share_threshold.yaml")
	es := []Entry{{Key: "tenant", Value: "t99prod"}, {Key: "resource", Value: "resBBBv2"}}
	if n := testing.AllocsPerRun(100, func() {
		if p.Match("test-domain", es) == nil {
			t.Fatal("no match")
		}
	}); n != 0 {
		t.Errorf("Match allocates %v times per call, want 0", n)
	}
}
