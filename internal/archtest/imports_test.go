package archtest

import (
	"bufio"
	"errors"
	"fmt"
	"go/build/constraint"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// yaml lists the YAML parsers a package that reads the policy model may use.
var yaml = []string{
	"go.yaml.in/yaml/v3/...",
	"gopkg.in/yaml.v3/...",
	"github.com/goccy/go-yaml/...",
	"sigs.k8s.io/yaml/...",
}

// rules encodes ARCHITECTURE.md "Import direction" for non-test files. Every
// rule allows the standard library and packages governed by the same rule (a
// rule's own sub-packages). In allow, a path whose first element has a dot is
// a third-party import path, any other is a path inside this module; a
// trailing "/..." also matches every path below it.
var rules = []rule{
	{pkg: "gcra"},
	{pkg: "gcra/memstore", allow: []string{"gcra"}},
	{pkg: "gcra/redisstore", allow: []string{"gcra", "github.com/redis/go-redis/v9/..."}},
	// Issue 3 ("Builds on the GCRA issue (gcra.Limit only)"): budgets and
	// regional limits are gcra.Limit values.
	{pkg: "rebalance", allow: []string{"gcra"}},
	{pkg: "region", allow: concat([]string{"gcra", "rebalance"}, yaml)},
	{pkg: "region/agent", allow: concat([]string{
		"region", "gcra", "rebalance",
		"google.golang.org/grpc/...",
		"google.golang.org/protobuf/...",
		"google.golang.org/genproto/...",
		"github.com/envoyproxy/go-control-plane/...",
		"github.com/prometheus/...",
		"go.opentelemetry.io/...",
	}, yaml)},
	{pkg: "region/client", allow: []string{"region/agent/api/..."}},
	// gcra too, like rebalance: a table's budgets and regional limits are
	// gcra.Limit values, which the codec must rebuild.
	{pkg: "gossip/wire", allow: []string{"gcra", "rebalance", "region", "google.golang.org/protobuf/..."}},
	// Issue 16: the cluster protocol's logic and the in-memory transports
	// import no network client, so the simulator can run them.
	{pkg: "gossip/protocol", allow: []string{"gossip/wire", "region", "rebalance", "gcra"}},
	{pkg: "gossip/memnet", allow: []string{"gossip/protocol", "gossip/wire", "region", "rebalance", "gcra"}},
	{pkg: "gossip", allow: []string{
		"gossip/protocol", "gossip/wire", "region", "rebalance", "gcra",
		"github.com/hashicorp/memberlist",
		"github.com/nats-io/nats.go/...",
		"github.com/prometheus/...",
	}},
	{pkg: "sim", allow: concat([]string{"gcra", "gcra/memstore", "rebalance", "region", "gossip/wire", "gossip/protocol", "gossip/memnet"}, yaml)},
	{pkg: "cmd", any: true},
	{pkg: "internal", any: true},
}

func concat(a, b []string) []string { return append(slices.Clip(a), b...) }

// rule says what the non-test files of package pkg and of the packages below
// it that no other rule lists may import besides the standard library.
type rule struct {
	pkg   string   // module-relative directory, e.g. "gcra/memstore"
	allow []string // patterns, see rules
	any   bool     // anything goes (still subject to the module-wide bans)
}

// describe lists what r allows, for messages: "stdlib, gcra".
func (r rule) describe() string {
	return strings.Join(append([]string{"stdlib"}, r.allow...), ", ")
}

// goFile is one parsed non-test Go file.
type goFile struct {
	path    string   // module-relative, slash-separated, e.g. "gcra/memstore/x.go"
	pkg     string   // module-relative directory, "." for the module root
	imports []string // import paths as written
}

// checker applies rules to the files of the module named module.
type checker struct {
	module string
	rules  []rule
}

// ruleFor returns the rule of pkg's nearest listed ancestor (pkg included).
func (c checker) ruleFor(pkg string) (rule, bool) {
	best, found := rule{}, false
	for _, r := range c.rules {
		if under(pkg, r.pkg) && (!found || len(r.pkg) > len(best.pkg)) {
			best, found = r, true
		}
	}
	return best, found
}

// under reports whether p is dir or lies below it.
func under(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+"/")
}

// isThirdParty reports whether an import path (or pattern) names a module
// outside the standard library and this module: its first element has a dot.
func isThirdParty(p string) bool {
	first, _, _ := strings.Cut(p, "/")
	return strings.Contains(first, ".")
}

// matches reports whether path matches pattern ("x" or "x/...").
func matches(path, pattern string) bool {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return under(path, base)
	}
	return path == pattern
}

// check returns every violation in files, one message per offending import
// (and one per package no rule covers), sorted.
func (c checker) check(files []goFile) []string {
	var out []string
	uncovered := map[string]bool{}
	for _, f := range files {
		r, ok := c.ruleFor(f.pkg)
		if !ok {
			if !uncovered[f.pkg] {
				uncovered[f.pkg] = true
				out = append(out, fmt.Sprintf("%s: package %s is not covered by any import rule; ARCHITECTURE.md must name it (then encode its rule in internal/archtest)", f.path, f.pkg))
			}
			continue
		}
		for _, imp := range f.imports {
			if msg := c.checkImport(f, r, imp); msg != "" {
				out = append(out, fmt.Sprintf("%s imports %s: %s", f.path, imp, msg))
			}
		}
	}
	slices.Sort(out)
	return out
}

// checkImport returns why file f, governed by r, may not import imp, or "".
func (c checker) checkImport(f goFile, r rule, imp string) string {
	local, isLocal := c.local(imp)
	switch {
	case !isLocal && !isThirdParty(imp):
		return "" // the standard library
	case isLocal && under(local, "cmd") && !under(f.pkg, "cmd"):
		return "nothing outside cmd may import cmd"
	case isLocal && under(local, "sim") && !under(f.pkg, "cmd") && !under(f.pkg, "sim"):
		return "nothing outside cmd and sim may import sim"
	case isLocal && under(local, "internal") && !under(f.pkg, "cmd") && !under(f.pkg, "internal"):
		return "only cmd and internal may import internal (other packages only from _test.go files)"
	case r.any:
		return ""
	case isLocal:
		if lr, ok := c.ruleFor(local); ok && lr.pkg == r.pkg {
			return "" // within the same rule, e.g. a package's own sub-package
		}
		for _, p := range r.allow {
			if !isThirdParty(p) && matches(local, p) {
				return ""
			}
		}
	default:
		for _, p := range r.allow {
			if isThirdParty(p) && matches(imp, p) {
				return ""
			}
		}
	}
	who := r.pkg
	if f.pkg != r.pkg {
		who = fmt.Sprintf("%s (under %s)", f.pkg, r.pkg)
	}
	return fmt.Sprintf("%s may import only %s", who, r.describe())
}

// local returns imp relative to the module ("." for the module itself) and
// whether imp lies in the module.
func (c checker) local(imp string) (string, bool) {
	if imp == c.module {
		return ".", true
	}
	rel, ok := strings.CutPrefix(imp, c.module+"/")
	return rel, ok
}

func TestImportDirection(t *testing.T) {
	root, module := moduleRoot(t)
	files, err := parseModule(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("found no Go files below %s", root)
	}
	c := checker{module: module, rules: rules}
	if v := c.check(files); len(v) > 0 {
		t.Errorf("%d import-direction violations (see ARCHITECTURE.md \"Import direction\"):\n%s", len(v), strings.Join(v, "\n"))
	}
	t.Logf("checked %d non-test files", len(files))
}

// moduleRoot walks up from the working directory to the directory holding
// go.mod and returns it with the module path that go.mod declares.
func moduleRoot(t *testing.T) (root, module string) {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		f, err := os.Open(filepath.Join(dir, "go.mod"))
		if err == nil {
			defer f.Close()
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				if rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module"); ok && rest != "" && (rest[0] == ' ' || rest[0] == '\t') {
					module = strings.TrimSpace(rest)
					if uq, err := strconv.Unquote(module); err == nil {
						module = uq
					}
					return dir, module
				}
			}
			t.Fatalf("%s/go.mod declares no module (scan error: %v)", dir, sc.Err())
		}
		if !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the working directory")
		}
		dir = parent
	}
}

// parseModule parses the imports of every non-test .go file below root,
// skipping what the go command ignores (directories named testdata or vendor,
// or starting with "." or "_"; nested modules) and files constrained by
// "//go:build ignore".
func parseModule(root string) ([]goFile, error) {
	var files []goFile
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p == root {
				return nil
			}
			if name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ImportsOnly|parser.ParseComments)
		if err != nil {
			return err
		}
		for _, cg := range f.Comments {
			if cg.Pos() > f.Package {
				break
			}
			for _, c := range cg.List {
				if expr, err := constraint.Parse(c.Text); err == nil && expr.String() == "ignore" {
					return nil
				}
			}
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		gf := goFile{path: rel, pkg: path.Dir(rel)}
		for _, s := range f.Imports {
			imp, err := strconv.Unquote(s.Path.Value)
			if err != nil {
				return fmt.Errorf("%s: import %s: %w", rel, s.Path.Value, err)
			}
			gf.imports = append(gf.imports, imp)
		}
		files = append(files, gf)
		return nil
	})
	return files, err
}
