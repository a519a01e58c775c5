package region

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// LoadOptions are how LoadPolicy reads a directory of upstream files. The
// zero value is upstream's default settings.
type LoadOptions struct {
	// MergeDomains merges files that name the same domain
	// (upstream's MERGE_DOMAIN_CONFIG): the later file's top-level
	// descriptors are added to the domain's, and one that repeats a key and
	// value already there is an error. Otherwise a domain in two files is an
	// error.
	MergeDomains bool
	// IgnoreDotFiles skips files and directories whose names start with a
	// dot (upstream's RUNTIME_IGNOREDOTFILES), such as the ..data links a
	// Kubernetes ConfigMap volume holds.
	IgnoreDotFiles bool
}

// LoadPolicy reads the policy at path: one file in either shape (Meridian's
// domains: [...] or envoyproxy/ratelimit's one domain: per file), or a
// directory of such files as upstream's runtime loads them
// (RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config/): every regular file below it,
// whatever its name ends with, in subdirectories too, in lexical order of
// their paths; symbolic links to files are read, links to directories are
// not followed (as upstream's walk). With opt.IgnoreDotFiles, names that
// start with a dot are skipped. A policy error wraps ErrPolicy and joins a
// PolicyError for each problem, naming the file, the path within it and the
// line. A path or file that cannot be read is an I/O error (an
// *fs.PathError, not ErrPolicy): the load fails (upstream logs such a
// file and loads the rest).
//
// The result depends only on the files' names and contents, so a caller
// that watches the directory calls LoadPolicy again on every change and
// compares Versions. Policy.Files lists what was read.
func LoadPolicy(path string, opt LoadOptions) (*Policy, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		return parsePolicyFiles([]policySource{{name: path, data: data}}, opt)
	}
	srcs, err := readPolicyDir(path, opt)
	if err != nil {
		return nil, err
	}
	if len(srcs) == 0 {
		return nil, fmt.Errorf("%w: %s: no policy files in the directory", ErrPolicy, path)
	}
	return parsePolicyFiles(srcs, opt)
}

// Files returns the files the policy was loaded from, in the order they
// were read (nil for ParsePolicy). The slice is shared; do not modify it.
func (p *Policy) Files() []string { return p.files }

// policySource is one file's name and contents. rel is its name relative to
// the directory it was found in ("" when it was given itself).
type policySource struct {
	name, rel string
	data      []byte
}

// readPolicyDir reads every policy file under root, in lexical order. A
// root that is a link is followed (upstream's RUNTIME_ROOT is usually one:
// /srv/runtime_data/current); names keep root as given.
func readPolicyDir(root string, opt LoadOptions) ([]policySource, error) {
	var srcs []policySource
	var errs []error
	walkRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return nil, err
	}
	err = filepath.WalkDir(walkRoot, func(path string, de fs.DirEntry, err error) error {
		if err != nil {
			errs = append(errs, err)
			if de != nil && de.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		dot := path != walkRoot && strings.HasPrefix(de.Name(), ".")
		if de.IsDir() {
			if dot && opt.IgnoreDotFiles {
				return fs.SkipDir
			}
			return nil
		}
		if dot && opt.IgnoreDotFiles {
			return nil
		}
		info, err := os.Stat(path) // follows a link
		switch {
		case err != nil:
			errs = append(errs, err)
			return nil
		case !info.Mode().IsRegular():
			return nil // a link to a directory, a socket, …
		}
		data, err := os.ReadFile(path)
		if err != nil {
			errs = append(errs, err)
			return nil
		}
		rel, err := filepath.Rel(walkRoot, path)
		if err != nil {
			return err // below its root: cannot happen
		}
		srcs = append(srcs, policySource{name: filepath.Join(root, rel), rel: filepath.ToSlash(rel), data: data})
		return nil
	})
	if err != nil {
		errs = append(errs, err)
	}
	return srcs, errors.Join(errs...)
}

// parsePolicyFiles decodes every source, merges their domains as opt says
// and builds one policy, reporting every problem of every file at once.
func parsePolicyFiles(srcs []policySource, opt LoadOptions) (*Policy, error) {
	d := &decoder{}
	var fds []fileDomain
	for _, src := range srcs {
		f := &fileLoc{name: src.name, rel: src.rel, nodes: map[string]*yaml.Node{}}
		d.file = f
		fds = append(fds, d.decodeFile(f, src.data)...)
	}
	d.file = nil
	pf := d.merge(fds, opt)
	p := d.build(pf)
	if len(d.errs) > 0 {
		// In reading order: the decoder finds unknown fields before the
		// values it validates, and a reader fixes a file top down.
		slices.SortStableFunc(d.errs, func(a, b error) int {
			var pa, pb *PolicyError
			if !errors.As(a, &pa) || !errors.As(b, &pb) {
				return 0
			}
			return cmp.Or(strings.Compare(pa.File, pb.File), cmp.Compare(pa.Line, pb.Line))
		})
		return nil, fmt.Errorf("%w: %w", ErrPolicy, errors.Join(d.errs...))
	}
	for _, src := range srcs {
		if src.name != "" {
			p.files = append(p.files, src.name)
		}
	}
	return p, nil
}

// decodeFile decodes one file's domains.
func (d *decoder) decodeFile(f *fileLoc, data []byte) []fileDomain {
	// A Decoder, not yaml.Unmarshal: Unmarshal reads the first document
	// only, so the domains of any later one would be dropped silently (not
	// even syntax-checked).
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		d.syntax(f, data, err)
		return nil
	}
	if len(doc.Content) == 0 {
		d.errf("", &doc, "empty policy: want domain: and descriptors: (one domain, as envoyproxy/ratelimit's files) or a domains list")
		return nil
	}
	f.root = doc.Content[0]
	d.steps = 0
	fds := d.policy(doc.Content[0])
	if d.steps > maxSteps {
		d.errf("", f.root, "the document expands to more than %d nodes through its aliases", maxSteps)
		return nil
	}
	for {
		var extra yaml.Node
		err := dec.Decode(&extra)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			d.syntax(f, data, err)
			break
		}
		// An empty document (a trailing "---") holds nothing to lose.
		if len(extra.Content) > 0 && extra.Content[0].Tag != "!!null" {
			d.errf("", extra.Content[0], "a second YAML document: a policy file is one document; list every domain under its domains, or give each its own file")
			break
		}
	}
	return fds
}

// merge makes one policy of the domains of every file: a domain named in
// several files is an error, or with opt.MergeDomains one domain with the
// descriptors of each, in file order (upstream's MERGE_DOMAIN_CONFIG: its
// top-level descriptors are added, and one repeating a key and value
// already there is reported as a duplicate by the tree builder). A domain
// twice in one file of Meridian's shape stays two, for build to report.
// The merged domains must agree on hash_tag and failure_mode. It registers
// how the merged policy's paths map back to each file's.
func (d *decoder) merge(fds []fileDomain, opt LoadOptions) *policyFile {
	pf := &policyFile{}
	first := map[string]int{} // domain name → index in pf.Domains
	from := map[string]*fileLoc{}
	for _, fd := range fds {
		d.file = fd.f
		k, ok := first[fd.df.Domain]
		if ok && from[fd.df.Domain] == fd.f {
			ok = false // twice in one file: build reports it
		}
		if ok && fd.df.Domain != "" {
			prev := from[fd.df.Domain]
			switch have := &pf.Domains[k]; {
			case !opt.MergeDomains:
				d.errf(join(fd.prefix, "domain"), nil, "domain %q is also defined in %s: give each domain one file, or merge them (merge_domains, upstream's MERGE_DOMAIN_CONFIG)", fd.df.Domain, prev.name)
			case have.HashTag != fd.df.HashTag:
				d.errf(join(fd.prefix, "hash_tag"), nil, "%q differs from %q in %s: the files of one domain must agree on its hash_tag", fd.df.HashTag, have.HashTag, prev.name)
			case have.FailureMode != fd.df.FailureMode:
				d.errf(join(fd.prefix, "failure_mode"), nil, "%q differs from %q in %s: the files of one domain must agree on its failure_mode (a file of upstream's shape without one defaults to error)", fd.df.FailureMode, have.FailureMode, prev.name)
			default:
				for j := range fd.df.Descriptors {
					d.xlate = append(d.xlate, xlate{
						synth: fmt.Sprintf("domains[%d].descriptors[%d]", k, len(have.Descriptors)+j),
						real:  join(fd.prefix, fmt.Sprintf("descriptors[%d]", j)),
						f:     fd.f,
					})
				}
				have.Descriptors = append(have.Descriptors, fd.df.Descriptors...)
				have.upstream = have.upstream && fd.df.upstream
			}
			continue
		}
		k = len(pf.Domains)
		if _, seen := first[fd.df.Domain]; !seen {
			first[fd.df.Domain], from[fd.df.Domain] = k, fd.f
		}
		pf.Domains = append(pf.Domains, fd.df)
		d.xlate = append(d.xlate, xlate{synth: fmt.Sprintf("domains[%d]", k), real: fd.prefix, f: fd.f})
	}
	d.file = nil
	return pf
}

// yamlLine is the "yaml: line N: " that go-yaml puts before a syntax error.
var yamlLine = regexp.MustCompile(`^yaml: line (\d+): `)

// syntax reports a YAML syntax error. go-yaml names the line where the
// enclosing block starts ("did not find expected key" at the sequence
// that holds the mistake), which can be far above it; so the error is
// reported at the first line whose prefix of the file fails with the same
// complaint — the line with the mistake — naming go-yaml's line too.
func (d *decoder) syntax(f *fileLoc, data []byte, err error) {
	msg := err.Error()
	m := yamlLine.FindStringSubmatch(msg)
	if m == nil {
		d.errs = append(d.errs, &PolicyError{File: f.name, Msg: msg})
		return
	}
	ctx, _ := strconv.Atoi(m[1])
	what := msg[len(m[0]):]
	// Path stays "": Error prints Msg, which names the line as go-yaml does.
	e := &PolicyError{File: f.name, Line: ctx, Msg: msg}
	if line := firstBadLine(data, what); line > 0 && line != ctx {
		e.Line = line
		e.Msg = fmt.Sprintf("yaml: line %d: %s (go-yaml reports line %d, where the enclosing block starts)", line, what, ctx)
	}
	d.errs = append(d.errs, e)
}

// maxBisectLines bounds the files syntax searches line by line (each step
// parses a prefix of the file).
const maxBisectLines = 4000

// firstBadLine returns the first line n such that lines 1..n fail to parse
// with the complaint what, or 0. A prefix can fail where the whole file
// does not only by being cut (an open flow collection or quoted string),
// and then its complaint differs. The prefixes before the mistake parse
// (or fail otherwise) and those from it on fail with its complaint, so a
// binary search finds the line in O(log n) parses, not one per line.
func firstBadLine(data []byte, what string) int {
	lines := bytes.SplitAfter(data, []byte("\n"))
	if len(lines) > maxBisectLines {
		return 0
	}
	ends := make([]int, len(lines)) // ends[i]: the length of lines 1..i+1
	for i, l := range lines {
		ends[i] = len(l)
		if i > 0 {
			ends[i] += ends[i-1]
		}
	}
	if len(lines) == 0 || !prefixFails(data[:ends[len(ends)-1]], what) {
		return 0
	}
	lo, hi := 0, len(lines)-1 // the answer is in lines[lo..hi] (0-based)
	for lo < hi {
		mid := lo + (hi-lo)/2
		if prefixFails(data[:ends[mid]], what) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo + 1
}

// prefixFails reports whether prefix fails to parse with the complaint
// what (a variable so that a test counts the parses).
var prefixFails = func(prefix []byte, what string) bool {
	dec := yaml.NewDecoder(bytes.NewReader(prefix))
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if err == nil {
			continue
		}
		if errors.Is(err, io.EOF) {
			return false
		}
		m := yamlLine.FindStringSubmatch(err.Error())
		return m != nil && err.Error()[len(m[0]):] == what
	}
}
