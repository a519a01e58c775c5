package region

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gcra/memstore"
)

// The fixtures in testdata/upstream re-create envoyproxy/ratelimit's own
// example, test and integration configs and the error cases of its
// test/config/config_test.go, as of upstream commit
// f2fb15770f7fd1c88ca6c3a1b58ee513917ace96. The facts checked here are
// upstream's: the limit each descriptor resolves to, its unit (a week of 7
// days, a month of 30, a year of 365: its UnitToDivider), the zero limit
// of requests_per_unit: 0, unlimited, the allow-listed value, shadow mode,
// names and replaces, the domain merge of MERGE_DOMAIN_CONFIG.

const upstreamDir = "testdata/upstream"

// upstreamLoad loads a fixture (file or directory) under testdata/upstream.
func upstreamLoad(t *testing.T, rel string, opt LoadOptions) *Policy {
	t.Helper()
	p, err := LoadPolicy(filepath.Join(upstreamDir, rel), opt)
	if err != nil {
		t.Fatalf("LoadPolicy(%s): %v", rel, err)
	}
	return p
}

// upstreamProblems returns every PolicyError of a load error.
func upstreamProblems(t *testing.T, err error) []*PolicyError {
	t.Helper()
	if !errors.Is(err, ErrPolicy) {
		t.Fatalf("error %v does not wrap ErrPolicy", err)
	}
	var out []*PolicyError
	var walk func(error)
	walk = func(e error) {
		if pe, ok := e.(*PolicyError); ok {
			out = append(out, pe)
			return
		}
		if u, ok := e.(interface{ Unwrap() []error }); ok {
			for _, e := range u.Unwrap() {
				walk(e)
			}
		}
	}
	walk(err)
	return out
}

// upstreamWant is one problem a load must report: in the file whose name
// ends with file, at line, with msg in its message.
type upstreamWant struct {
	file string
	line int
	msg  string
}

func (w upstreamWant) in(ps []*PolicyError) bool {
	for _, p := range ps {
		if strings.HasSuffix(p.File, w.file) && p.Line == w.line && strings.Contains(p.Msg, w.msg) {
			return true
		}
	}
	return false
}

// upstreamLimit asserts what descriptor es of domain resolves to: the rule
// at path (in its file) with want as its limit ("" for no rule).
func upstreamLimit(t *testing.T, p *Policy, domain, path string, want gcra.Limit, es ...Entry) *Rule {
	t.Helper()
	r := p.Match(domain, es)
	switch {
	case path == "" && r != nil:
		t.Errorf("%s %v: matched %s, want no rule", domain, es, r.Path)
	case path == "":
	case r == nil:
		t.Errorf("%s %v: no rule, want %s", domain, es, path)
	case r.Path != path:
		t.Errorf("%s %v: matched %s, want %s", domain, es, r.Path, path)
	case r.Limit != want:
		t.Errorf("%s %v (%s): limit %v, want %v", domain, es, path, r.Limit, want)
	}
	return r
}

func e(k, v string) Entry { return Entry{Key: k, Value: v} }

var (
	perSecond = func(n int64) gcra.Limit { return gcra.New(n, time.Second, n) }
	perMinute = func(n int64) gcra.Limit { return gcra.New(n, time.Minute, n) }
	perHour   = func(n int64) gcra.Limit { return gcra.New(n, time.Hour, n) }
	perDay    = func(n int64) gcra.Limit { return gcra.New(n, 24*time.Hour, n) }
)

// upstreamStrip writes a copy of the fixture rel into a temporary
// directory without the lines that contain any of drop, and returns the
// copy's path: what a user of the file changes to load it here.
func upstreamStrip(t *testing.T, rel string, drop ...string) string {
	t.Helper()
	src := filepath.Join(upstreamDir, rel)
	dst := filepath.Join(t.TempDir(), filepath.Base(rel))
	err := filepath.WalkDir(src, func(path string, de os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		r, _ := filepath.Rel(src, path)
		to := filepath.Join(dst, r)
		if de.IsDir() {
			return os.MkdirAll(to, 0o755)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var kept []string
		for _, l := range strings.SplitAfter(string(data), "\n") {
			if !slices.ContainsFunc(drop, func(d string) bool { return strings.Contains(l, d) }) {
				kept = append(kept, l)
			}
		}
		return os.WriteFile(to, []byte(strings.Join(kept, "")), 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// upstreamLinesWith returns the lines of the file at path that contain s.
func upstreamLinesWith(t *testing.T, path, s string) []int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for i, l := range strings.Split(string(data), "\n") {
		if strings.Contains(l, s) {
			out = append(out, i+1)
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s holds no %q", path, s)
	}
	return out
}

const quotaOn = "quota_mode: true"

// TestUpstreamValidFiles: each of the 13 files upstream accepts either loads
// as is, with upstream's meaning, or is refused for the fields Meridian
// cannot honour (and loads once those lines go).
func TestUpstreamValidFiles(t *testing.T) {
	tests := []struct {
		name string
		path string
		opt  LoadOptions
		// A file Meridian refuses has one problem, with wantMsg, at each
		// line that holds wantRefusedAt, and loads without the lines that
		// hold any of drop.
		wantRefusedAt, wantMsg string
		drop                   []string
		check                  func(t *testing.T, p *Policy)
	}{
		{
			name: "examples/config.yaml", path: "examples/config.yaml",
			check: func(t *testing.T, p *Policy) {
				r := upstreamLimit(t, p, "mongo_cps", "descriptors[0]", perSecond(500), e("database", "users"))
				if r != nil && (r.FailureMode != FailError || r.Unit != "second" || r.Limit.Burst() != 500) {
					t.Errorf("failure mode %v unit %q burst %d, want error, second, 500", r.FailureMode, r.Unit, r.Limit.Burst())
				}
				upstreamLimit(t, p, "mongo_cps", "descriptors[1]", perSecond(500), e("database", "default"))
				upstreamLimit(t, p, "mongo_cps", "", gcra.Limit{}, e("database", "other"))
			},
		},
		{
			name: "examples/example.yaml", path: "examples/example.yaml",
			wantRefusedAt: quotaOn, wantMsg: "quota_mode: true is not supported",
			drop: []string{quotaOn},
			check: func(t *testing.T, p *Policy) {
				const foo = "descriptors[2]"
				r := upstreamLimit(t, p, "rl", "descriptors[0]", perMinute(4), e("category", "account"))
				if r != nil && !slices.Equal(r.Replaces, []string{"bkthomps", "fake_name"}) {
					t.Errorf("category=account replaces %q", r.Replaces)
				}
				upstreamLimit(t, p, "rl", "", gcra.Limit{}, e("source_cluster", "proxy"))
				r = upstreamLimit(t, p, "rl", "descriptors[1].descriptors[0]", perMinute(2), e("source_cluster", "proxy"), e("destination_cluster", "bkthomps"))
				if r != nil && !slices.Equal(r.Replaces, []string{"bkthomps"}) {
					t.Errorf("destination_cluster=bkthomps replaces %q", r.Replaces)
				}
				upstreamLimit(t, p, "rl", "descriptors[1].descriptors[3]", perMinute(2), e("source_cluster", "proxy"), e("destination_cluster", "fake"))
				upstreamLimit(t, p, "rl", foo, perMinute(2), e("foo", "anything"))
				upstreamLimit(t, p, "rl", foo+".descriptors[0]", perMinute(3), e("foo", "x"), e("bar", "y"))
				r = upstreamLimit(t, p, "rl", foo+".descriptors[1]", perMinute(1), e("foo", "x"), e("bar", "bkthomps"))
				if r != nil && r.Name != "bkthomps" {
					t.Errorf("bar=bkthomps named %q", r.Name)
				}
				// requests_per_unit: 0 is upstream's block-all limit.
				r = upstreamLimit(t, p, "rl", foo+".descriptors[2]", gcra.Limit{}, e("foo", "x"), e("bar", "banned"))
				if r != nil && (r.Unlimited || r.Name != "banned_limit" || r.Unit != "minute") {
					t.Errorf("bar=banned: unlimited %v name %q unit %q, want a zero limit named banned_limit per minute", r.Unlimited, r.Name, r.Unit)
				}
				upstreamLimit(t, p, "rl", foo+".descriptors[3]", perSecond(1), e("foo", "x"), e("baz", "y"))
				if r = upstreamLimit(t, p, "rl", foo+".descriptors[5]", perMinute(3), e("foo", "x"), e("baz", "shady")); r != nil && !r.Shadow {
					t.Error("baz=shady is not shadow mode")
				}
				if r = upstreamLimit(t, p, "rl", foo+".descriptors[4]", perMinute(3), e("foo", "x"), e("baz", "not-so-shady")); r != nil && r.Shadow {
					t.Error("baz=not-so-shady is shadow mode")
				}
				if r = p.Match("rl", []Entry{e("foo", "x"), e("bay", "y")}); r == nil || !r.Unlimited {
					t.Errorf("bay: %v, want unlimited", r)
				}
				upstreamLimit(t, p, "rl", "descriptors[3]", perMinute(2), e("unspec", "z"))
				if r = p.Match("rl", []Entry{e("qux", "q")}); r == nil || !r.Unlimited {
					t.Errorf("qux: %v, want unlimited", r)
				}
				upstreamLimit(t, p, "rl", "descriptors[5]", perMinute(1), e("service", "service_1"))
				upstreamLimit(t, p, "rl", "descriptors[6]", perMinute(2), e("service", "service_2"))
			},
		},
		{
			name: "config/basic_config.yaml", path: "config/basic_config.yaml",
			check: func(t *testing.T, p *Policy) {
				const d = "test-domain"
				upstreamLimit(t, p, d, "", gcra.Limit{}, e("key1", "value1"))
				upstreamLimit(t, p, d, "descriptors[0].descriptors[0]", perSecond(5), e("key1", "value1"), e("subkey1", "other"))
				upstreamLimit(t, p, d, "descriptors[0].descriptors[1]", perSecond(10), e("key1", "value1"), e("subkey1", "subvalue1"))
				upstreamLimit(t, p, d, "", gcra.Limit{}, e("key1", "value2"), e("subkey1", "subvalue1"))
				upstreamLimit(t, p, d, "descriptors[1]", perMinute(20), e("key2", "something"))
				upstreamLimit(t, p, d, "descriptors[2]", perMinute(30), e("key2", "value2"))
				upstreamLimit(t, p, d, "", gcra.Limit{}, e("key2", "value3")) // allow-listed
				upstreamLimit(t, p, d, "descriptors[4]", perHour(1), e("key3", "x"))
				if r := upstreamLimit(t, p, d, "descriptors[5]", perDay(1), e("key4", "x")); r != nil && (r.Name != "key4_rate_limit" || r.Unit != "day") {
					t.Errorf("key4: name %q unit %q", r.Name, r.Unit)
				}
				upstreamLimit(t, p, d, "descriptors[6]", perDay(15), e("key5", "value5"))
				upstreamLimit(t, p, d, "descriptors[6].descriptors[0]", perDay(25), e("key5", "value5"), e("subkey5", "subvalue5"))
				upstreamLimit(t, p, d, "", gcra.Limit{}, e("key5", "value5"), e("subkey5", "other"))
				if r := p.Match(d, []Entry{e("key6", "x")}); r == nil || !r.Unlimited {
					t.Errorf("key6: %v, want unlimited", r)
				}
				upstreamLimit(t, p, d, "descriptors[8]", perMinute(70), e("key7", "x"))
				if n := len(p.Rules()); n != 10 {
					t.Errorf("%d rules, want 10 (the allow-listed value has none)", n)
				}
			},
		},
		{
			name: "config/metadata.yaml", path: "config/metadata.yaml",
			check: func(t *testing.T, p *Policy) {
				upstreamLimit(t, p, "test-domain", "descriptors[0].descriptors[0]", perSecond(5), e("key1", "value1"), e("subkey1", "x"))
				upstreamLimit(t, p, "test-domain", "descriptors[0].descriptors[1]", perSecond(10), e("key1", "value1"), e("subkey1", "subvalue1"))
				upstreamLimit(t, p, "test-domain", "descriptors[1]", perMinute(20), e("key2", "x"))
			},
		},
		{
			name: "config/shadowmode_config.yaml", path: "config/shadowmode_config.yaml",
			check: func(t *testing.T, p *Policy) {
				for _, c := range []struct {
					path   string
					es     []Entry
					shadow bool
				}{
					{"descriptors[0].descriptors[0]", []Entry{e("key1", "value1"), e("subkey1", "x")}, false},
					{"descriptors[0].descriptors[1]", []Entry{e("key1", "value1"), e("subkey1", "subvalue1")}, true},
					{"descriptors[1]", []Entry{e("key2", "x")}, true},
					{"descriptors[2]", []Entry{e("key2", "value2")}, false},
				} {
					if r := p.Match("test-domain", c.es); r == nil || r.Path != c.path || r.Shadow != c.shadow {
						t.Errorf("%v: %v, want %s with shadow %v", c.es, r, c.path, c.shadow)
					}
				}
			},
		},
		{
			name: "config/wildcard.yaml", path: "config/wildcard.yaml",
			check: func(t *testing.T, p *Policy) {
				// Trailing wildcards, exact values and bare keys; the middle
				// and multiple wildcards are matched by match.go.
				upstreamLimit(t, p, "test-domain", "descriptors[0]", perMinute(20), e("wild", "foo1"))
				upstreamLimit(t, p, "test-domain", "descriptors[1]", perMinute(20), e("noWild", "foo"))
				upstreamLimit(t, p, "test-domain", "", gcra.Limit{}, e("noWild", "foo1"))
				upstreamLimit(t, p, "test-domain", "descriptors[2]", perMinute(20), e("noVal", "anything"))
				upstreamLimit(t, p, "test-domain", "descriptors[5].descriptors[0]", perMinute(20), e("nestedWild", "val1"), e("wild", "goo2"))
				if n := len(p.Rules()); n != 6 {
					t.Errorf("%d rules, want 6", n)
				}
			},
		},
		{
			name: "config/share_threshold.yaml", path: "config/share_threshold.yaml",
			check: func(t *testing.T, p *Policy) {
				upstreamLimit(t, p, "test-domain", "descriptors[0]", perMinute(100), e("files", "files/a.pdf"))
				upstreamLimit(t, p, "test-domain", "descriptors[7]", perMinute(50), e("file", "test1"))
				upstreamLimit(t, p, "test-domain", "descriptors[8]", perMinute(100), e("file", "test2"))
				upstreamLimit(t, p, "test-domain", "descriptors[5].descriptors[0].descriptors[0]", perMinute(120),
					e("path", "path/a"), e("file", "file/b"), e("type", "t"))
			},
		},
		{
			name: "merge (a directory, MERGE_DOMAIN_CONFIG)", path: "merge", opt: LoadOptions{MergeDomains: true},
			check: func(t *testing.T, p *Policy) {
				upstreamLimit(t, p, "test-domain", "merge_domain_key1.yaml:descriptors[0]", perMinute(10), e("key1", "value1"))
				upstreamLimit(t, p, "test-domain", "merge_domain_key2.yaml:descriptors[0]", perMinute(20), e("key2", "value2"))
				upstreamLimit(t, p, "test-domain", "", gcra.Limit{}, e("key2", "value1"))
				want := []string{filepath.Join(upstreamDir, "merge", "merge_domain_key1.yaml"), filepath.Join(upstreamDir, "merge", "merge_domain_key2.yaml")}
				if !slices.Equal(p.Files(), want) {
					t.Errorf("Files() = %q, want %q", p.Files(), want)
				}
			},
		},
		{
			name: "merge/merge_domain_key1.yaml alone", path: "merge/merge_domain_key1.yaml",
			check: func(t *testing.T, p *Policy) {
				upstreamLimit(t, p, "test-domain", "descriptors[0]", perMinute(10), e("key1", "value1"))
				upstreamLimit(t, p, "test-domain", "", gcra.Limit{}, e("key2", "value2"))
			},
		},
		{
			name: "merge/merge_domain_key2.yaml alone", path: "merge/merge_domain_key2.yaml",
			check: func(t *testing.T, p *Policy) {
				upstreamLimit(t, p, "test-domain", "descriptors[0]", perMinute(20), e("key2", "value2"))
			},
		},
		{
			name: "integration/config/another.yaml", path: "integration/config/another.yaml",
			check: func(t *testing.T, p *Policy) {
				upstreamLimit(t, p, "another", "descriptors[0]", perMinute(20), e("key2", "x"))
				upstreamLimit(t, p, "another", "descriptors[1]", perHour(10), e("key3", "x"))
				upstreamLimit(t, p, "another", "descriptors[3]", perHour(10), e("key3_local", "x"))
				upstreamLimit(t, p, "another", "descriptors[4]", perDay(20), e("key4", "x"))
				upstreamLimit(t, p, "another", "descriptors[5]", perDay(20), e("key4_local", "x"))
			},
		},
		{
			name: "integration/config/basic.yaml", path: "integration/config/basic.yaml",
			check: func(t *testing.T, p *Policy) {
				upstreamLimit(t, p, "basic", "descriptors[0]", perSecond(50), e("key1", "x"))
				upstreamLimit(t, p, "basic", "descriptors[1]", perSecond(50), e("key1_local", "x"))
				upstreamLimit(t, p, "basic", "descriptors[2]", perMinute(1), e("one_per_minute", "x"))
			},
		},
		{
			name: "integration/config/share_threshold.yaml", path: "integration/config/share_threshold.yaml",
			check: func(t *testing.T, p *Policy) {
				upstreamLimit(t, p, "share-threshold-test", "descriptors[0]", perHour(10), e("files", "files/a"))
				upstreamLimit(t, p, "share-threshold-test", "descriptors[1]", perHour(10), e("files_no_share", "files_no_share/b.csv"))
			},
		},
		{
			name: "integration/reload.yaml", path: "integration/reload.yaml",
			check: func(t *testing.T, p *Policy) {
				upstreamLimit(t, p, "reload", "descriptors[0]", perSecond(50), e("key1", "x"))
				if r := upstreamLimit(t, p, "reload", "descriptors[1]", gcra.Limit{}, e("block", "x")); r != nil && r.Unlimited {
					t.Error("block is unlimited, want the zero limit")
				}
				upstreamLimit(t, p, "reload", "descriptors[2]", perMinute(1), e("one_per_minute", "x"))
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(upstreamDir, tt.path)
			p, err := LoadPolicy(path, tt.opt)
			if tt.wantRefusedAt == "" {
				if err != nil {
					t.Fatalf("LoadPolicy: %v", err)
				}
				tt.check(t, p)
				return
			}
			if err == nil {
				t.Fatalf("LoadPolicy succeeded, want it refused where it says %q", tt.wantRefusedAt)
			}
			ps := upstreamProblems(t, err)
			lines := upstreamLinesWith(t, path, tt.wantRefusedAt)
			for _, l := range lines {
				if w := (upstreamWant{filepath.Base(path), l, tt.wantMsg}); !w.in(ps) {
					t.Errorf("no problem at line %d with %q:\n%v", l, tt.wantMsg, err)
				}
			}
			if len(ps) != len(lines) {
				t.Errorf("%d problems, want %d:\n%v", len(ps), len(lines), err)
			}
			p, err = LoadPolicy(upstreamStrip(t, tt.path, tt.drop...), tt.opt)
			if err != nil {
				t.Fatalf("without %q: %v", tt.drop, err)
			}
			tt.check(t, p)
		})
	}
}

// TestUpstreamDirectories loads upstream's directories as its runtime does:
// every file of examples/ and of the integration config/ together, and
// they fail only on the refused fields, naming the file and line.
func TestUpstreamDirectories(t *testing.T) {
	tests := []struct {
		dir         string
		wantRefused []upstreamWant
		drop        []string
		wantDomains []string
	}{
		{
			dir: "examples",
			wantRefused: []upstreamWant{
				{"examples/example.yaml", 63, "quota_mode"},
				{"examples/example.yaml", 70, "quota_mode"},
			},
			drop: []string{quotaOn}, wantDomains: []string{"mongo_cps", "rl"},
		},
		{dir: "integration/config", wantDomains: []string{"another", "basic", "share-threshold-test"}},
	}
	for _, tt := range tests {
		t.Run(tt.dir, func(t *testing.T) {
			_, err := LoadPolicy(filepath.Join(upstreamDir, tt.dir), LoadOptions{})
			if len(tt.wantRefused) > 0 {
				if err == nil {
					t.Fatal("LoadPolicy succeeded")
				}
				ps := upstreamProblems(t, err)
				for _, w := range tt.wantRefused {
					if !w.in(ps) {
						t.Errorf("no problem in %s at line %d with %q:\n%v", w.file, w.line, w.msg, err)
					}
				}
				if len(ps) != len(tt.wantRefused) {
					t.Errorf("%d problems, want %d:\n%v", len(ps), len(tt.wantRefused), err)
				}
			} else if err != nil {
				t.Fatalf("LoadPolicy: %v", err)
			}
			dir := upstreamStrip(t, tt.dir, tt.drop...)
			p, err := LoadPolicy(dir, LoadOptions{})
			if err != nil {
				t.Fatalf("without %q: %v", tt.drop, err)
			}
			var domains []string
			for name := range p.domains {
				domains = append(domains, name)
			}
			slices.Sort(domains)
			if !slices.Equal(domains, tt.wantDomains) {
				t.Errorf("domains %q, want %q", domains, tt.wantDomains)
			}
			for _, r := range p.Rules() {
				if r.FailureMode != FailError {
					t.Errorf("%s: failure mode %v, want error (upstream's shape)", r.Path, r.FailureMode)
				}
				if !strings.HasPrefix(r.File, dir) || !strings.HasPrefix(r.Path, filepath.Base(r.File)+":") {
					t.Errorf("rule %s in file %s: want the path to start with the file's name", r.Path, r.File)
				}
			}
		})
	}
}

// TestUpstreamErrorFixtures: each error case of upstream's config_test.go
// (and a few of Meridian's) is refused with the matching reason at its line.
func TestUpstreamErrorFixtures(t *testing.T) {
	tests := []struct {
		name  string
		path  string
		opt   LoadOptions
		want  upstreamWant
		count int // problems in all; 0: not checked
	}{
		// TestBadLimitUnit: "invalid rate limit unit 'foo'".
		{name: "bad limit unit", path: "bad_limit_unit.yaml", want: upstreamWant{"bad_limit_unit.yaml", 7, `"foo": want second, minute, hour, day, week, month or year`}, count: 1},
		// TestBadYaml: "error loading config file: yaml: line 2: found unexpected end of stream".
		{name: "bad yaml", path: "bad_yaml.yaml", want: upstreamWant{"bad_yaml.yaml", 2, "yaml: line 2: found unexpected end of stream"}, count: 1},
		// TestDuplicateDomain: "duplicate domain 'test-domain' in config file".
		{name: "duplicate domain", path: "duplicate_domain", want: upstreamWant{"duplicate_domain/b_duplicate.yaml", 1, `domain "test-domain" is also defined in ` + filepath.Join(upstreamDir, "errors", "duplicate_domain", "a_basic.yaml")}, count: 1},
		// TestDuplicateKey: "duplicate descriptor composite key 'test-domain.key1_value1'".
		{name: "duplicate key", path: "duplicate_key.yaml", want: upstreamWant{"duplicate_key.yaml", 8, `duplicate descriptor key "key1" value "value1"`}, count: 1},
		// TestDuplicateKeyDomainMerge: the same descriptor in two merged files.
		{name: "duplicate key across merged files", path: "merge_duplicate", opt: LoadOptions{MergeDomains: true}, want: upstreamWant{"merge_duplicate/b.yaml", 5, `duplicate descriptor key "key1" value "value1"`}, count: 1},
		{name: "the same two files unmerged", path: "merge_duplicate", want: upstreamWant{"merge_duplicate/b.yaml", 3, "MERGE_DOMAIN_CONFIG"}, count: 1},
		// TestEmptyDomain: "config file cannot have empty domain".
		{name: "empty domain", path: "empty_domain.yaml", want: upstreamWant{"empty_domain.yaml", 1, "empty: every domain needs a name"}, count: 1},
		// TestEmptyKey: "descriptor has empty key".
		{name: "empty key", path: "empty_key.yaml", want: upstreamWant{"empty_key.yaml", 4, "empty: every descriptor needs a key"}, count: 1},
		// TestMisspelledKey: "unknown key 'ratelimit'", "unknown key 'requestsperunit'".
		{name: "misspelled key", path: "misspelled_key.yaml", want: upstreamWant{"misspelled_key.yaml", 6, "unknown field (valid: key, value, rate_limit,"}, count: 1},
		{name: "misspelled key in rate_limit", path: "misspelled_key2.yaml", want: upstreamWant{"misspelled_key2.yaml", 9, "unknown field (valid: unit, requests_per_unit,"}, count: 2},
		{name: "misspelled key leaves requests_per_unit missing", path: "misspelled_key2.yaml", want: upstreamWant{"misspelled_key2.yaml", 7, "requests_per_unit: 0 denies every request"}, count: 2},
		// TestNonStringKey: "key is not of type string: 0.25".
		{name: "non-string key", path: "non_string_key.yaml", want: upstreamWant{"non_string_key.yaml", 2, `key "0.25" is not a string`}, count: 2},
		// TestNonMapList: "yaml file contains list of type other than map: a".
		{name: "non-map list", path: "non_map_list.yaml", want: upstreamWant{"non_map_list.yaml", 5, `want a mapping, got "a"`}, count: 3},
		// TestReplacesEmpty: "should not have an empty replaces entry".
		{name: "replaces empty", path: "replaces_empty.yaml", want: upstreamWant{"replaces_empty.yaml", 12, "empty name"}, count: 1},
		// TestReplacesSelf: "replaces should not contain name of same descriptor".
		{name: "replaces self", path: "replaces_self.yaml", want: upstreamWant{"replaces_self.yaml", 11, `a rule cannot replace itself ("self")`}, count: 1},
		// TestUnlimitedWithRateLimitUnit: "should not specify rate limit unit when unlimited".
		{name: "unlimited with unit", path: "unlimited_with_unit.yaml", want: upstreamWant{"unlimited_with_unit.yaml", 6, "unlimited with unit"}, count: 1},
		// config_impl.go: "share_threshold can only be used with wildcard values".
		{name: "share_threshold without a wildcard", path: "share_threshold_no_wildcard.yaml", want: upstreamWant{"share_threshold_no_wildcard.yaml", 7, "share_threshold can only be used with a wildcard value"}, count: 1},

		// An indentation mistake is reported where it is, not where
		// go-yaml's enclosing block starts (line 2).
		{name: "indentation", path: "indentation.yaml", want: upstreamWant{"indentation.yaml", 5, "yaml: line 5: did not find expected '-' indicator (go-yaml reports line 2"}, count: 1},
		{name: "indentation that parses", path: "indentation_value.yaml", want: upstreamWant{"indentation_value.yaml", 6, "unknown field"}, count: 2},
		{name: "several problems: quota_mode", path: "several.yaml", want: upstreamWant{"several.yaml", 7, "quota_mode: true is not supported"}, count: 5},
		{name: "several problems: unit", path: "several.yaml", want: upstreamWant{"several.yaml", 5, `"fortnight"`}, count: 5},
		{name: "several problems: negative", path: "several.yaml", want: upstreamWant{"several.yaml", 8, "-3: must be at least 0"}, count: 5},
		{name: "several problems: unknown", path: "several.yaml", want: upstreamWant{"several.yaml", 10, "unknown field"}, count: 5},
		{name: "several problems: missing", path: "several.yaml", want: upstreamWant{"several.yaml", 11, "requests_per_unit"}, count: 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := LoadPolicy(filepath.Join(upstreamDir, "errors", tt.path), tt.opt)
			if err == nil {
				t.Fatalf("LoadPolicy succeeded (version %s), want %v", p.Version(), tt.want)
			}
			if p != nil {
				t.Error("a policy returned with the error")
			}
			ps := upstreamProblems(t, err)
			if !tt.want.in(ps) {
				t.Errorf("no problem in %s at line %d with %q:\n%v", tt.want.file, tt.want.line, tt.want.msg, err)
			}
			if tt.count != 0 && len(ps) != tt.count {
				t.Errorf("%d problems, want %d:\n%v", len(ps), tt.count, err)
			}
			for _, p := range ps {
				if p.File == "" || p.Line == 0 {
					t.Errorf("problem without its file or line: %v", p)
				}
			}
		})
	}
}

// upstreamWrite writes files (name → content) under dir.
func upstreamWrite(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestUpstreamRuntimeLayout: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config/ as
// upstream's runtime walks it: every file below, in subdirectories too,
// whatever its extension; dotfiles unless RUNTIME_IGNOREDOTFILES; links to
// files read, links to directories not followed (a Kubernetes ConfigMap
// volume: name → ..data/name, ..data → ..2026_12_01/).
func TestUpstreamRuntimeLayout(t *testing.T) {
	root := t.TempDir()
	cfg := filepath.Join(root, "current", "ratelimit", "config")
	one := func(domain string) string {
		return "domain: " + domain + "\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	}
	upstreamWrite(t, cfg, map[string]string{
		"b.yaml":                 one("b"),
		"a.yml":                  one("a"),
		"nested/deeper/c.yaml":   one("c"),
		"d.conf":                 one("d"),
		"..2026_12_01/e.yaml":    one("e"),
		".hidden/f.yaml":         one("f"),
		".g.yaml":                one("g"),
		"nested/.swap/h.yaml":    one("h"),
		"nested/deeper/.i.yaml":  one("i"),
		"nested/deeper/z.yaml":   one("z"),
		"nested/deeper/yy.yaml":  one("yy"),
		"nested/deeper/y_y.yaml": one("y_y"),
	})
	if err := os.Symlink("..2026_12_01", filepath.Join(cfg, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("..data", "e.yaml"), filepath.Join(cfg, "e.yaml")); err != nil {
		t.Fatal(err)
	}

	// Without IgnoreDotFiles, e.yaml's domain is read twice (through the
	// link and in ..2026_12_01/), as upstream reads it.
	_, err := LoadPolicy(cfg, LoadOptions{})
	if err == nil {
		t.Fatal("LoadPolicy without IgnoreDotFiles succeeded, want e twice")
	}
	want := upstreamWant{"config/e.yaml", 1, `domain "e" is also defined in ` + filepath.Join(cfg, "..2026_12_01", "e.yaml")}
	if ps := upstreamProblems(t, err); !want.in(ps) || len(ps) != 1 {
		t.Errorf("want only %v, got:\n%v", want, err)
	}

	p, err := LoadPolicy(cfg, LoadOptions{IgnoreDotFiles: true})
	if err != nil {
		t.Fatalf("LoadPolicy: %v", err)
	}
	var got []string
	for _, f := range p.Files() {
		rel, _ := filepath.Rel(cfg, f)
		got = append(got, filepath.ToSlash(rel))
	}
	wantFiles := []string{"a.yml", "b.yaml", "d.conf", "e.yaml", "nested/deeper/c.yaml", "nested/deeper/y_y.yaml", "nested/deeper/yy.yaml", "nested/deeper/z.yaml"}
	if !slices.Equal(got, wantFiles) {
		t.Errorf("Files() = %q, want %q (lexical, dotfiles skipped)", got, wantFiles)
	}
	for _, d := range []string{"a", "b", "c", "d", "e", "y_y", "yy", "z"} {
		if p.Match(d, []Entry{e("k", "v")}) == nil {
			t.Errorf("domain %s: no limit", d)
		}
	}
	for _, d := range []string{"f", "g", "h", "i"} {
		if p.Match(d, []Entry{e("k", "v")}) != nil {
			t.Errorf("domain %s of a dotfile loaded with IgnoreDotFiles", d)
		}
	}
	if r := p.Match("c", []Entry{e("k", "v")}); r == nil || r.Path != "nested/deeper/c.yaml:descriptors[0]" {
		t.Errorf("rule of c: %v, want the path nested/deeper/c.yaml:descriptors[0]", r)
	}

	// Deterministic: the same files give the same policy version, and a
	// change gives another.
	again, err := LoadPolicy(cfg, LoadOptions{IgnoreDotFiles: true})
	if err != nil || again.Version() != p.Version() {
		t.Fatalf("second load: version %v, err %v; want %s", again, err, p.Version())
	}
	upstreamWrite(t, cfg, map[string]string{"b.yaml": strings.Replace(one("b"), "requests_per_unit: 1", "requests_per_unit: 2", 1)})
	changed, err := LoadPolicy(cfg, LoadOptions{IgnoreDotFiles: true})
	if err != nil || changed.Version() == p.Version() {
		t.Fatalf("after a change: %v, err %v; want a new version", changed, err)
	}

	// RUNTIME_ROOT is usually a link (current → a dated snapshot): a root
	// that is a link is followed, and names keep the path as given.
	link := filepath.Join(root, "link")
	if err := os.Symlink(cfg, link); err != nil {
		t.Fatal(err)
	}
	viaLink, err := LoadPolicy(link, LoadOptions{IgnoreDotFiles: true})
	if err != nil {
		t.Fatalf("through a link: %v", err)
	}
	if viaLink.Version() != changed.Version() || len(viaLink.Files()) != len(wantFiles) || viaLink.Files()[0] != filepath.Join(link, "a.yml") {
		t.Errorf("through a link: version %s files %q, want %s and %d files under %s", viaLink.Version(), viaLink.Files(), changed.Version(), len(wantFiles), link)
	}

	// An empty directory is an error, not an empty policy.
	empty := filepath.Join(root, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadPolicy(empty, LoadOptions{}); !errors.Is(err, ErrPolicy) || !strings.Contains(err.Error(), "no policy files") {
		t.Errorf("empty directory: %v", err)
	}
	// What cannot be read is an I/O error, not a policy error.
	if _, err := LoadPolicy(filepath.Join(root, "absent"), LoadOptions{}); errors.Is(err, ErrPolicy) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("absent path: %v, want os.ErrNotExist and not ErrPolicy", err)
	}
	if err := os.Symlink("nowhere.yaml", filepath.Join(empty, "dangling.yaml")); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadPolicy(empty, LoadOptions{}); errors.Is(err, ErrPolicy) || !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "dangling.yaml") {
		t.Errorf("dangling link: %v, want os.ErrNotExist naming it, not ErrPolicy", err)
	}
}

// TestUpstreamShapeExtensionsAndDefaults: Meridian's extensions work in a
// file of upstream's shape; such a file's limits fail with error unless it
// says otherwise; burst defaults to requests_per_unit in both shapes.
func TestUpstreamShapeExtensionsAndDefaults(t *testing.T) {
	p := policyTestParse(t, `
domain: api
hash_tag: tenant
failure_mode: open
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 100, burst: 20, failure_mode: closed, scope: regional}
    descriptors:
      - key: route
        rate_limit: {period: 10s, requests_per_unit: 50, strategy: proportional, lease: {units: 10, ttl: 100ms}}
`)
	r := upstreamLimit(t, p, "api", "descriptors[0]", gcra.New(100, time.Second, 20), e("tenant", "a"))
	if r != nil && (r.FailureMode != FailClosed || r.Scope != Regional) {
		t.Errorf("tenant: %v %v, want closed regional", r.FailureMode, r.Scope)
	}
	r = upstreamLimit(t, p, "api", "descriptors[0].descriptors[0]", gcra.New(50, 10*time.Second, 50), e("tenant", "a"), e("route", "/"))
	if r != nil && (r.FailureMode != FailOpen || r.Strategy != "proportional" || r.LeaseUnits != 10 || r.LeaseTTL != 100*time.Millisecond || r.Unit != "") {
		t.Errorf("route: %v %q %d %v %q, want the domain's open, proportional, a lease of 10 for 100ms, no unit", r.FailureMode, r.Strategy, r.LeaseUnits, r.LeaseTTL, r.Unit)
	}

	for _, tt := range []struct {
		name, src string
		want      FailureMode
	}{
		{"upstream shape", "domain: d\ndescriptors: [{key: k, rate_limit: {unit: minute, requests_per_unit: 30}}]\n", FailError},
		{"Meridian shape", "domains: [{domain: d, descriptors: [{key: k, rate_limit: {unit: minute, requests_per_unit: 30}}]}]\n", FailLocal},
	} {
		p := policyTestParse(t, tt.src)
		r := upstreamLimit(t, p, "d", "", gcra.Limit{}, e("x", "y"))
		_ = r
		r = p.Match("d", []Entry{e("k", "v")})
		if r == nil || r.FailureMode != tt.want || r.Limit.Burst() != 30 || r.Limit != gcra.New(30, time.Minute, DefaultBurst(30, time.Minute)) {
			t.Errorf("%s: %v, want failure mode %v and burst 30", tt.name, r, tt.want)
		}
	}

	// Upstream's file and Meridian's equivalent (failure_mode: error) are
	// the same policy; fields that change only upstream's metrics leave
	// the version alone.
	up := policyTestParse(t, "domain: d\ndescriptors:\n  - key: k\n    value_to_metric: true\n    detailed_metric: true\n    metadata: {a: {b: [1, 2]}}\n    quota_mode: false\n    rate_limit: {unit: minute, requests_per_unit: 30}\n")
	mer := policyTestParse(t, "domains: [{domain: d, failure_mode: error, descriptors: [{key: k, rate_limit: {unit: minute, requests_per_unit: 30}}]}]\n")
	if up.Version() != mer.Version() {
		t.Errorf("versions %s and %s differ for one policy", up.Version(), mer.Version())
	}
	if loc := policyTestParse(t, "domains: [{domain: d, descriptors: [{key: k, rate_limit: {unit: minute, requests_per_unit: 30}}]}]\n"); loc.Version() == up.Version() {
		t.Error("a local and an error failure mode have one version")
	}
}

// TestUpstreamUnits: upstream's seven units and their lengths, in any case.
func TestUpstreamUnits(t *testing.T) {
	for _, tt := range []struct {
		unit string
		want time.Duration
	}{
		{"second", time.Second}, {"MINUTE", time.Minute}, {"Hour", time.Hour}, {"day", 24 * time.Hour},
		{"week", 7 * 24 * time.Hour}, {"month", 30 * 24 * time.Hour}, {"year", 365 * 24 * time.Hour},
	} {
		p := policyTestParse(t, "domain: d\ndescriptors: [{key: k, rate_limit: {unit: "+tt.unit+", requests_per_unit: 7}}]\n")
		r := p.Match("d", []Entry{e("k", "v")})
		if n, per := r.Limit.Rate(); n != 7 || per != tt.want || r.Limit.Burst() != 7 || r.Unit != strings.ToLower(tt.unit) {
			t.Errorf("unit %s: %v (unit %q), want 7 per %s burst 7", tt.unit, r.Limit, r.Unit, tt.want)
		}
	}
}

// TestUpstreamMergeRules: merged files must agree on the domain's hash_tag
// and failure_mode; a file of each shape may hold one domain.
func TestUpstreamMergeRules(t *testing.T) {
	rl := "{unit: second, requests_per_unit: 1}"
	tests := []struct {
		name  string
		files map[string]string
		want  upstreamWant
	}{
		{
			name: "failure modes differ",
			files: map[string]string{
				"a.yaml": "domain: d\ndescriptors: [{key: a, rate_limit: " + rl + "}]\n",
				"b.yaml": "domains:\n  - domain: d\n    descriptors: [{key: b, rate_limit: " + rl + "}]\n",
			},
			want: upstreamWant{"b.yaml", 2, `"" differs from "error"`},
		},
		{
			name: "hash tags differ",
			files: map[string]string{
				"a.yaml": "domain: d\nhash_tag: a\ndescriptors: [{key: a, rate_limit: " + rl + "}]\n",
				"b.yaml": "domain: d\ndescriptors: [{key: a, descriptors: [{key: b, rate_limit: " + rl + "}]}]\n",
			},
			want: upstreamWant{"b.yaml", 1, `"" differs from "a"`},
		},
		{
			name: "a bad value in the second file",
			files: map[string]string{
				"a.yaml": "domain: d\ndescriptors: [{key: a, rate_limit: " + rl + "}]\n",
				"b.yaml": "# b\ndomain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
			},
			want: upstreamWant{"b.yaml", 5, `"fortnight"`},
		},
		{
			name: "a replaces across files names the file",
			files: map[string]string{
				"a.yaml": "domain: d\ndescriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1, name: n}}]\n",
				"b.yaml": "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1, name: n}\n",
			},
			want: upstreamWant{"b.yaml", 4, `name "n" already used by `},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			upstreamWrite(t, dir, tt.files)
			_, err := LoadPolicy(dir, LoadOptions{MergeDomains: true})
			if err == nil {
				t.Fatal("LoadPolicy succeeded")
			}
			ps := upstreamProblems(t, err)
			if !tt.want.in(ps) || len(ps) != 1 {
				t.Errorf("want only %v, got:\n%v", tt.want, err)
			}
		})
	}

	// Merged, replaces reaches across files, as upstream's names do.
	dir := t.TempDir()
	upstreamWrite(t, dir, map[string]string{
		"a.yaml": "domain: d\ndescriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1, name: n}}]\n",
		"b.yaml": "domain: d\ndescriptors: [{key: b, rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: n}]}}]\n",
	})
	p, err := LoadPolicy(dir, LoadOptions{MergeDomains: true})
	if err != nil {
		t.Fatal(err)
	}
	if r := p.Match("d", []Entry{e("b", "")}); r == nil || !slices.Equal(r.Replaces, []string{"n"}) || r.Path != "b.yaml:descriptors[0]" {
		t.Errorf("b: %v", r)
	}
}

// TestUpstreamAliases: anchors, aliases and merge keys, which upstream's
// YAML parser reads too.
func TestUpstreamAliases(t *testing.T) {
	p := policyTestParse(t, `
domain: d
descriptors:
  - key: a
    rate_limit: &per_minute {unit: minute, requests_per_unit: 10}
  - key: b
    rate_limit: *per_minute
  - key: c
    rate_limit:
      <<: *per_minute
      requests_per_unit: 20
`)
	upstreamLimit(t, p, "d", "descriptors[0]", perMinute(10), e("a", "x"))
	upstreamLimit(t, p, "d", "descriptors[1]", perMinute(10), e("b", "x"))
	upstreamLimit(t, p, "d", "descriptors[2]", perMinute(20), e("c", "x"))

	// A billion laughs is refused, not expanded: each level lists the one
	// before ten times, 10^8 descriptors at the eighth.
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n  - key: l0\n    descriptors: &x0 [{key: a, rate_limit: {unit: second, requests_per_unit: 1}}]\n")
	for i := 1; i <= 8; i++ {
		b.WriteString("  - key: l" + strconv.Itoa(i) + "\n    descriptors: &x" + strconv.Itoa(i) + " [")
		for j := range 10 {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString("{key: k" + strconv.Itoa(j) + ", descriptors: *x" + strconv.Itoa(i-1) + "}")
		}
		b.WriteString("]\n")
	}
	_, err := ParsePolicy([]byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "expands to more than") {
		t.Errorf("a billion laughs: %v, want it refused for its size", err)
	}
}

// TestUpstreamBlockAllAndAllowList decides through a Node: the zero limit
// of requests_per_unit: 0 denies every request and never advances; an
// allow-listed value admits, touching no limit; unlimited admits.
func TestUpstreamBlockAllAndAllowList(t *testing.T) {
	p := upstreamLoad(t, "config/basic_config.yaml", LoadOptions{})
	blocked := upstreamLoad(t, "integration/reload.yaml", LoadOptions{})
	cfg := memstore.DefaultConfig()
	cfg.Clock = func() int64 { return 1_700_000_000_000_000 }
	ms, err := memstore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name        string
		pol         *Policy
		req         *Request
		wantAllowed bool
		wantMatches int
	}{
		{"block", blocked, &Request{Domain: "reload", Descriptors: []Descriptor{{Entries: []Entry{e("block", "x")}}}, Cost: 1}, false, 1},
		{"key1 beside block", blocked, &Request{Domain: "reload", Descriptors: []Descriptor{{Entries: []Entry{e("key1", "x")}}}, Cost: 1}, true, 1},
		{"allow-listed value", p, &Request{Domain: "test-domain", Descriptors: []Descriptor{{Entries: []Entry{e("key2", "value3")}}}, Cost: 1}, true, 0},
		{"its key's default", p, &Request{Domain: "test-domain", Descriptors: []Descriptor{{Entries: []Entry{e("key2", "value4")}}}, Cost: 1}, true, 1},
		{"unlimited", p, &Request{Domain: "test-domain", Descriptors: []Descriptor{{Entries: []Entry{e("key6", "x")}}}, Cost: 1}, true, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n, err := NewNode(DefaultConfig("eu", "eu-1", "eu"), tt.pol, ms)
			if err != nil {
				t.Fatal(err)
			}
			tries := 1 // a cold standalone region may run at its safe share
			if !tt.wantAllowed {
				tries = 3
			}
			for i := range tries {
				var d Decision
				if err := n.Decide(context.Background(), 1_700_000_000_000_000, tt.req, &d); err != nil {
					t.Fatal(err)
				}
				if d.Allowed != tt.wantAllowed || len(d.Matches) != tt.wantMatches || d.Fallback {
					t.Fatalf("request %d: allowed %v, %d matches, fallback %v; want allowed %v, %d matches", i, d.Allowed, len(d.Matches), d.Fallback, tt.wantAllowed, tt.wantMatches)
				}
				if !tt.wantAllowed && !d.Matches[0].Denied() {
					t.Errorf("request %d: the zero limit's match is not a denial", i)
				}
			}
		})
	}
}

// TestUpstreamShareThreshold decides through a Node: the values a
// share_threshold wildcard matches share one key (and budget), those of a
// wildcard without it have one each, as upstream's cache keys.
func TestUpstreamShareThreshold(t *testing.T) {
	p := upstreamLoad(t, "integration/config/share_threshold.yaml", LoadOptions{})
	cfg := memstore.DefaultConfig()
	cfg.Clock = func() int64 { return 1_700_000_000_000_000 }
	ms, err := memstore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n, err := NewNode(DefaultConfig("eu", "eu-1", "eu"), p, ms)
	if err != nil {
		t.Fatal(err)
	}
	const now = 1_700_000_000_000_000
	one := func(key, value string) *Request {
		return &Request{Domain: "share-threshold-test", Descriptors: []Descriptor{{Entries: []Entry{e(key, value)}}}, Cost: 1}
	}
	// Spend a/pdf's budget (whatever share this cold region runs at).
	for _, k := range []string{"files", "files_no_share"} {
		admitted := decideN(t, n, now, one(k, k+"/a.pdf"), 20)
		if admitted == 0 || admitted == 20 {
			t.Fatalf("%s/a.pdf: %d of 20 admitted, want the budget spent", k, admitted)
		}
	}
	if got := decideN(t, n, now, one("files", "files/b.csv"), 1); got != 0 {
		t.Error("files/b.csv admitted after files/a.pdf spent the shared budget")
	}
	if got := decideN(t, n, now, one("files_no_share", "files_no_share/b.csv"), 1); got != 1 {
		t.Error("files_no_share/b.csv denied: it has its own budget")
	}
	var d Decision
	if err := n.Resolve(one("files", "files/c"), &d); err != nil || len(d.Matches) != 1 || d.Matches[0].Key.Name != "share-threshold-test/files=files%2F*" {
		t.Errorf("files/c: key %+v, err %v; want the pattern's key", d.Matches, err)
	}
	// The coordinator finds the rule from the shared key's name.
	if r, err := p.RuleForKey("share-threshold-test/files=files%2F*"); err != nil || r == nil || r.Path != "descriptors[0]" {
		t.Errorf("RuleForKey of the shared key: %v, %v", r, err)
	}
}

// TestPolicyErrorsInLineOrder: every problem of a file is listed top down,
// whichever pass of the decoder found it. Fails on f96aee6: the
// unknown field at line 8 came before the bad unit at line 5.
func TestPolicyErrorsInLineOrder(t *testing.T) {
	const file = "domain: api\ndescriptors:\n  - key: tenant\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 5\n  - key: route\n    valeu: x\n"
	_, err := ParsePolicy([]byte(file))
	if err == nil {
		t.Fatal("loaded")
	}
	var lines []int
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap()[1].(interface{ Unwrap() []error }).Unwrap() {
		var pe *PolicyError
		if errors.As(e, &pe) {
			lines = append(lines, pe.Line)
		}
	}
	if !slices.Equal(lines, []int{5, 8}) {
		t.Errorf("problems at lines %v, want [5 8] in that order (%v)", lines, err)
	}
}
