package archtest

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestCheck runs the checker on an in-memory module so that a broken checker
// (one that never reports anything) cannot pass unnoticed.
func TestCheck(t *testing.T) {
	const m = "example.com/mod"
	c := checker{module: m, rules: rules}
	tests := []struct {
		name string
		give goFile
		want []string
	}{
		{
			name: "memstore imports gcra and stdlib",
			give: goFile{path: "gcra/memstore/x.go", pkg: "gcra/memstore", imports: []string{"sync", "time", m + "/gcra"}},
		},
		{
			name: "memstore imports a third party",
			give: goFile{path: "gcra/memstore/x.go", pkg: "gcra/memstore", imports: []string{"github.com/foo/bar"}},
			want: []string{"gcra/memstore/x.go imports github.com/foo/bar: gcra/memstore may import only stdlib, gcra"},
		},
		{
			name: "gcra imports its store",
			give: goFile{path: "gcra/x.go", pkg: "gcra", imports: []string{m + "/gcra/memstore"}},
			want: []string{"gcra/x.go imports " + m + "/gcra/memstore: gcra may import only stdlib"},
		},
		{
			name: "unlisted sub-package inherits its ancestor's rule",
			give: goFile{path: "gcra/foo/x.go", pkg: "gcra/foo", imports: []string{"github.com/redis/go-redis/v9"}},
			want: []string{"gcra/foo/x.go imports github.com/redis/go-redis/v9: gcra/foo (under gcra) may import only stdlib"},
		},
		{
			name: "package imports a sub-package under the same rule",
			give: goFile{path: "gcra/x.go", pkg: "gcra", imports: []string{m + "/gcra/foo"}},
		},
		{
			name: "redisstore imports go-redis sub-packages",
			give: goFile{path: "gcra/redisstore/x.go", pkg: "gcra/redisstore", imports: []string{"github.com/redis/go-redis/v9", "github.com/redis/go-redis/v9/maintnotifications", m + "/gcra"}},
		},
		{
			name: "region imports a YAML parser, not grpc",
			give: goFile{path: "region/x.go", pkg: "region", imports: []string{"go.yaml.in/yaml/v3", "google.golang.org/grpc"}},
			want: []string{"region/x.go imports google.golang.org/grpc: region may import only stdlib, gcra, rebalance, go.yaml.in/yaml/v3/..., gopkg.in/yaml.v3/..., github.com/goccy/go-yaml/..., sigs.k8s.io/yaml/..."},
		},
		{
			name: "client imports agent API types but not the agent",
			give: goFile{path: "region/client/c.go", pkg: "region/client", imports: []string{m + "/region/agent/api", m + "/region/agent"}},
			want: []string{"region/client/c.go imports " + m + "/region/agent: region/client may import only stdlib, region/agent/api/..."},
		},
		{
			name: "sim never imports a network adapter",
			give: goFile{path: "sim/s.go", pkg: "sim", imports: []string{m + "/gossip/wire", m + "/gossip", m + "/gcra/redisstore"}},
			want: []string{
				"sim/s.go imports " + m + "/gcra/redisstore: sim may import only stdlib, gcra, gcra/memstore, rebalance, region, gossip/wire, gossip/protocol, gossip/memnet, go.yaml.in/yaml/v3/..., gopkg.in/yaml.v3/..., github.com/goccy/go-yaml/..., sigs.k8s.io/yaml/...",
				"sim/s.go imports " + m + "/gossip: sim may import only stdlib, gcra, gcra/memstore, rebalance, region, gossip/wire, gossip/protocol, gossip/memnet, go.yaml.in/yaml/v3/..., gopkg.in/yaml.v3/..., github.com/goccy/go-yaml/..., sigs.k8s.io/yaml/...",
			},
		},
		{
			name: "nothing outside cmd imports sim or cmd",
			give: goFile{path: "internal/testenv/e.go", pkg: "internal/testenv", imports: []string{m + "/sim", m + "/cmd/meridian"}},
			want: []string{
				"internal/testenv/e.go imports " + m + "/cmd/meridian: nothing outside cmd may import cmd",
				"internal/testenv/e.go imports " + m + "/sim: nothing outside cmd and sim may import sim",
			},
		},
		{
			name: "production code does not import internal",
			give: goFile{path: "gcra/redisstore/r.go", pkg: "gcra/redisstore", imports: []string{m + "/internal/testenv"}},
			want: []string{"gcra/redisstore/r.go imports " + m + "/internal/testenv: only cmd and internal may import internal (other packages only from _test.go files)"},
		},
		{
			name: "cmd imports anything",
			give: goFile{path: "cmd/meridian/main.go", pkg: "cmd/meridian", imports: []string{m + "/sim", m + "/internal/testenv", "github.com/spf13/cobra"}},
		},
		{
			name: "internal imports internal and third parties",
			give: goFile{path: "internal/a/a.go", pkg: "internal/a", imports: []string{m + "/internal/b", "github.com/redis/go-redis/v9"}},
		},
		{
			name: "unlisted top-level package",
			give: goFile{path: "extra/x.go", pkg: "extra", imports: []string{"fmt"}},
			want: []string{"extra/x.go: package extra is not covered by any import rule; ARCHITECTURE.md must name it (then encode its rule in internal/archtest)"},
		},
		{
			name: "module root package",
			give: goFile{path: "x.go", pkg: "."},
			want: []string{"x.go: package . is not covered by any import rule; ARCHITECTURE.md must name it (then encode its rule in internal/archtest)"},
		},
		{
			name: "a third party that merely shares a prefix",
			give: goFile{path: "gossip/g.go", pkg: "gossip", imports: []string{"github.com/hashicorp/memberlist-fork", "github.com/hashicorp/memberlist"}},
			want: []string{"gossip/g.go imports github.com/hashicorp/memberlist-fork: gossip may import only stdlib, gossip/protocol, gossip/wire, region, rebalance, gcra, github.com/hashicorp/memberlist, github.com/nats-io/nats.go/..., github.com/prometheus/..."},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := c.check([]goFile{tt.give})
			want := slices.Clone(tt.want)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("check(%s)\n got: %q\nwant: %q", tt.give.path, got, want)
			}
		})
	}
}

func TestCheckReportsAllAtOnce(t *testing.T) {
	c := checker{module: "example.com/mod", rules: rules}
	got := c.check([]goFile{
		{path: "gcra/a.go", pkg: "gcra", imports: []string{"github.com/x/y"}},
		{path: "extra/b.go", pkg: "extra"},
		{path: "extra/c.go", pkg: "extra"},
		{path: "rebalance/d.go", pkg: "rebalance", imports: []string{"github.com/x/y", "github.com/x/z"}},
	})
	if len(got) != 4 { // one per bad import, one per uncovered package
		t.Errorf("got %d violations, want 4:\n%q", len(got), got)
	}
}

func TestRulesWellFormed(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range rules {
		if seen[r.pkg] {
			t.Errorf("rule for %s listed twice", r.pkg)
		}
		seen[r.pkg] = true
		if r.any && len(r.allow) > 0 {
			t.Errorf("rule for %s allows anything and also lists imports", r.pkg)
		}
	}
}

// TestParseModule runs the file walk on a small module written to disk: test
// files, testdata, hidden directories, nested modules and ignored files are
// skipped; a bad import in a real file is found.
func TestParseModule(t *testing.T) {
	root := t.TempDir()
	write := func(rel, src string) {
		t.Helper()
		p := filepath.Join(root, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/mod\n")
	write("gcra/gcra.go", "package gcra\n\nimport (\n\t\"time\"\n\t\"github.com/foo/bar\"\n)\n")
	write("gcra/gcra_test.go", "package gcra\n\nimport \"github.com/test/only\"\n")
	write("gcra/gen.go", "//go:build ignore\n\npackage main\n\nimport \"github.com/gen/tool\"\n")
	write("gcra/testdata/x.go", "package x\n\nimport \"github.com/testdata/x\"\n")
	write(".hidden/h.go", "package h\n\nimport \"github.com/hidden/h\"\n")
	write("nested/go.mod", "module example.com/nested\n")
	write("nested/n.go", "package n\n\nimport \"github.com/nested/n\"\n")

	files, err := parseModule(root)
	if err != nil {
		t.Fatal(err)
	}
	want := []goFile{{path: "gcra/gcra.go", pkg: "gcra", imports: []string{"time", "github.com/foo/bar"}}}
	if !slices.EqualFunc(files, want, func(a, b goFile) bool {
		return a.path == b.path && a.pkg == b.pkg && slices.Equal(a.imports, b.imports)
	}) {
		t.Fatalf("parseModule = %+v, want %+v", files, want)
	}
	got := checker{module: "example.com/mod", rules: rules}.check(files)
	if len(got) != 1 || got[0] != "gcra/gcra.go imports github.com/foo/bar: gcra may import only stdlib" {
		t.Errorf("check = %q", got)
	}
}
