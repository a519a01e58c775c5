package region

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/rebalance"
)

// Input bounds. A request or policy beyond them is refused with an error.
const (
	MaxDomainLen   = 64  // bytes in a domain name
	MaxEntryKeyLen = 64  // bytes in a descriptor entry's key
	MaxValueLen    = 256 // bytes in a descriptor entry's value
	MaxEntries     = 8   // entries in one descriptor (nesting depth)
	MaxDescriptors = 64  // descriptors in one request
	// MaxCost is the largest cost a request may carry: Envoy's hits_addend
	// is a uint32.
	MaxCost = math.MaxUint32
)

// FailureMode is what a limit decides when its store fails.
type FailureMode uint8

const (
	// FailLocal decides with an in-memory GCRA at the region's share divided
	// by max(configured, live) agents: over-admission bounded by two
	// regional bursts per episode. The default: it neither lifts the limit
	// nor drops all traffic when Redis blips.
	FailLocal FailureMode = iota
	// FailOpen admits (and counts it).
	FailOpen
	// FailClosed denies.
	FailClosed
	// FailError fails the decision as envoyproxy/ratelimit does when its
	// Redis fails: the RLS call returns an error (counted as a fallback
	// decision) and Envoy's own failure_mode_deny decides. The default for
	// limits loaded from upstream's file shape without Meridian's
	// failure_mode.
	FailError
)

func (m FailureMode) String() string {
	switch m {
	case FailOpen:
		return "open"
	case FailClosed:
		return "closed"
	case FailError:
		return "error"
	default:
		return "local"
	}
}

// Scope says whether a limit's budget is shared by the regions.
type Scope uint8

const (
	// Global: one budget split into per-region shares by the coordinator.
	Global Scope = iota
	// Regional: enforced in full in each region and never shared; the
	// coordinator never sees it.
	Regional
)

func (s Scope) String() string {
	if s == Regional {
		return "regional"
	}
	return "global"
}

// Rule is one limit of a policy: the rate_limit block of one descriptor.
type Rule struct {
	// Path locates the rule in the policy file
	// ("domains[0].descriptors[1].descriptors[0]", or
	// "descriptors[1].descriptors[0]" in a file of upstream's shape). A
	// policy loaded from a directory prefixes it with the file's name
	// relative to the directory and a colon ("basic.yaml:descriptors[0]"),
	// so it is unique within the policy.
	Path string
	// File is the file the rule was loaded from ("" for ParsePolicy).
	File string
	// Name is rate_limit.name ("" if not set); Replaces lists the names of
	// the rules this one replaces when both match one request.
	Name     string
	Replaces []string
	Domain   string
	// Limit is the global limit. It is zero when Unlimited, and when the
	// rule's requests_per_unit is 0: a limit that denies every request, as
	// in envoyproxy/ratelimit (Unlimited false, Limit.IsZero()).
	Limit     gcra.Limit
	Unlimited bool
	// Unit is rate_limit.unit in lower case ("second" … "year"; "" when the
	// rule gives a period instead, or is unlimited): what an RLS answer
	// names as current_limit's unit, also for a zero limit.
	Unit        string
	Shadow      bool
	FailureMode FailureMode
	Scope       Scope
	// Strategy is the rebalance strategy for the rule's keys; "" means the
	// coordinator's default.
	Strategy string
	// LeaseUnits and LeaseTTL opt the limit into leasing (seed 003): an
	// agent takes LeaseUnits in one store call and serves them from memory
	// for at most LeaseTTL. 0: no leasing.
	LeaseUnits int64
	LeaseTTL   time.Duration
	id         int
	spath      string // the path while building (one policy of every file); see decoder.locate
	// shared is, for a rule under a share_threshold wildcard, the pattern
	// whose key each entry of a matching descriptor takes instead of its
	// value ("" where the entry keeps its value): every value the wildcard
	// matches shares one key, as upstream's ShareThresholdKeyPattern.
	shared []string
}

// keyValue is the value entry i of a descriptor matched to r has in its
// key: its own, or the share_threshold pattern it shares.
func (r *Rule) keyValue(i int, e Entry) string {
	if i < len(r.shared) && r.shared[i] != "" {
		return r.shared[i]
	}
	return e.Value
}

// appendKey appends the name of the key a descriptor's entries matched to
// r form (KeyName, with shared values replaced by their patterns).
func (r *Rule) appendKey(b []byte, domain string, entries []Entry) []byte {
	if len(r.shared) == 0 {
		return appendKeyName(b, domain, entries)
	}
	b = appendEscaped(b, domain)
	for i, e := range entries {
		b = append(b, '/')
		b = appendEscaped(b, e.Key)
		b = append(b, '=')
		b = appendEscaped(b, r.keyValue(i, e))
	}
	return b
}

// Policy is a loaded, validated policy: immutable and safe to share.
type Policy struct {
	version string
	files   []string
	domains map[string]*domain
	rules   []*Rule
}

type domain struct {
	name    string
	hashTag string // descriptor key whose value forms the hash tag; "" for none
	root    *level
}

// Version is the policy's content hash: the same for every file that parses
// to the same policy, whatever its formatting. Reports and tables carry it.
func (p *Policy) Version() string { return p.version }

// Rules returns the policy's rules in file order. The slice is shared; do
// not modify it.
func (p *Policy) Rules() []*Rule { return p.rules }

// Match returns the rule one descriptor of a request in domain resolves to,
// as a request's descriptor would (nil when none applies). Safe for
// concurrent use.
func (p *Policy) Match(domain string, entries []Entry) *Rule {
	dom := p.domains[domain]
	if dom == nil {
		return nil
	}
	return dom.match(entries)
}

// Budget is key's budget at the coordinator under r — the rule's global
// limit and strategy — and false when r is nil or its keys share no budget
// (unlimited, regional, or without a limit).
func (r *Rule) Budget(key string) (rebalance.Budget, bool) {
	if r == nil || r.Unlimited || r.Scope == Regional || r.Limit.IsZero() {
		return rebalance.Budget{}, false
	}
	return rebalance.Budget{Key: key, Limit: r.Limit, Strategy: r.Strategy}, true
}

// RuleForKey returns the rule that governs the key named name (a canonical
// KeyName, as reports carry): the coordinator's way from a reported key to
// its budget. A name that does not parse is an error; a key no rule matches
// (an unknown domain, a policy that changed since) returns nil.
func (p *Policy) RuleForKey(name string) (*Rule, error) {
	domain, entries, err := ParseKeyName(name)
	if err != nil {
		return nil, err
	}
	return p.Match(domain, entries), nil
}

// The YAML shapes. Every field is decoded by hand from yaml.Node — known
// fields only, as yaml.Decoder.KnownFields(true) would, but reporting every
// unknown field instead of stopping — so that each error carries its path
// and line. The JSON tags give the canonical form the version hashes.
type policyFile struct {
	Domains []domainFile `json:"domains"`
}

type domainFile struct {
	Domain      string           `json:"domain"`
	HashTag     string           `json:"hash_tag,omitempty"`
	FailureMode string           `json:"failure_mode,omitempty"`
	Descriptors []descriptorFile `json:"descriptors,omitempty"`
	// upstream: read from a file of envoyproxy/ratelimit's shape (one
	// domain: at the top), whose domain may have no descriptors.
	upstream bool
}

type descriptorFile struct {
	Key         string           `json:"key"`
	Value       string           `json:"value,omitempty"`
	RateLimit   *rateLimitFile   `json:"rate_limit,omitempty"`
	ShadowMode  bool             `json:"shadow_mode,omitempty"`
	Descriptors []descriptorFile `json:"descriptors,omitempty"`
	Share       bool             `json:"share_threshold,omitempty"`
	// Fields of envoyproxy/ratelimit's that change no decision here
	// (detailed_metric, value_to_metric, metadata, quota_mode: false) are
	// checked and not kept, so they leave the version alone.
	shared []string // see Rule.shared
}

type rateLimitFile struct {
	Unit            string `json:"unit,omitempty"`
	RequestsPerUnit int64  `json:"requests_per_unit,omitempty"`
	rpuSet          bool
	Period          string `json:"period,omitempty"`
	Burst           int64  `json:"burst,omitempty"`
	burstSet        bool
	Unlimited       bool     `json:"unlimited,omitempty"`
	Name            string   `json:"name,omitempty"`
	Replaces        []string `json:"replaces,omitempty"`
	FailureMode     string   `json:"failure_mode,omitempty"`
	Scope           string   `json:"scope,omitempty"`
	Strategy        string   `json:"strategy,omitempty"`
	LeaseUnits      int64    `json:"lease_units,omitempty"`
	LeaseTTL        string   `json:"lease_ttl,omitempty"`
	// allow marks a descriptor without rate_limit and without descriptors
	// (upstream's allow-list idiom: it matches and limits nothing). The
	// tree builder sees a rate_limit, so it keeps the node; rule returns
	// no rule for it.
	allow bool
}

// ErrPolicy wraps every policy load error.
var ErrPolicy = errors.New("region: invalid policy")

// PolicyError is one problem of a policy: where it is and what is wrong. A
// policy load error wraps ErrPolicy and joins one PolicyError per problem
// (errors.As finds the first; unwrap the join for all of them).
type PolicyError struct {
	// File is the file's name as LoadPolicy found it ("" for ParsePolicy).
	File string
	// Path is the field's path within the file
	// ("domains[0].descriptors[1].rate_limit.unit"; "(root)" for the file
	// itself; "" for a YAML syntax error, whose Msg names the line as
	// go-yaml does: "yaml: line 5: …").
	Path string
	// Line is the 1-based line of the field (or of the nearest enclosing
	// one when the field is missing); 0 when unknown.
	Line int
	// Msg says what is wrong.
	Msg string
}

func (e *PolicyError) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		b.WriteString(": ")
	}
	switch {
	case e.Path != "" && e.Line > 0:
		fmt.Fprintf(&b, "%s (line %d): ", e.Path, e.Line)
	case e.Path != "":
		b.WriteString(e.Path + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// ParsePolicy parses and validates a YAML policy in either shape:
// Meridian's (a domains list) or envoyproxy/ratelimit's (one domain: and
// its descriptors: at the top). It reports every problem at once, each a
// PolicyError with its path in the file and line, wrapped in ErrPolicy;
// unknown fields are errors.
func ParsePolicy(data []byte) (*Policy, error) {
	return parsePolicyFiles([]policySource{{data: data}}, LoadOptions{})
}

// decoder decodes policy files and validates them, collecting every
// problem. It decodes each file with its own paths (file is set), then
// builds one policy of all of them (file is nil), whose paths it maps back
// to each file's with xlate.
type decoder struct {
	errs  []error
	file  *fileLoc
	xlate []xlate
	steps int // nodes visited, bounding what aliases can expand to
	bad   int // placeholders made for entries that are not mappings
}

// fileLoc is one decoded file: its name and each path's node, for lines.
type fileLoc struct {
	name  string
	rel   string // the name relative to a loaded directory ("" for one file)
	root  *yaml.Node
	nodes map[string]*yaml.Node
}

// xlate maps the paths under synth, in the policy being built, to the
// paths under real in file f.
type xlate struct {
	synth, real string
	f           *fileLoc
}

// maxSteps bounds the nodes one file may expand to through aliases (a
// "billion laughs" document is refused, not walked).
const maxSteps = 1 << 20

func (d *decoder) errf(path string, n *yaml.Node, format string, args ...any) {
	e := &PolicyError{Path: path, Msg: fmt.Sprintf(format, args...)}
	f := d.file
	if f == nil {
		f, e.Path = d.locate(path)
	}
	if f != nil {
		e.File = f.name
		if n == nil {
			n = f.lookup(e.Path)
		}
	}
	if e.Path == "" {
		e.Path = "(root)"
	}
	if n != nil {
		e.Line = n.Line
	}
	d.errs = append(d.errs, e)
}

// locate maps a path of the policy being built to its file and the path
// within it: the longest registered prefix decides.
func (d *decoder) locate(path string) (*fileLoc, string) {
	best := -1
	for i, x := range d.xlate {
		if under(path, x.synth) && (best < 0 || len(x.synth) > len(d.xlate[best].synth)) {
			best = i
		}
	}
	if best < 0 {
		return nil, path
	}
	x := d.xlate[best]
	rest := path[len(x.synth):]
	if x.real == "" {
		rest = strings.TrimPrefix(rest, ".")
	}
	return x.f, x.real + rest
}

// under reports whether path is prefix or a path below it.
func under(path, prefix string) bool {
	if !strings.HasPrefix(path, prefix) {
		return false
	}
	rest := path[len(prefix):]
	return rest == "" || rest[0] == '.' || rest[0] == '[' || prefix == ""
}

// lookup returns the node at path, or at its nearest enclosing path that
// has one (a missing field is reported at its parent's line).
func (f *fileLoc) lookup(path string) *yaml.Node {
	for {
		if n, ok := f.nodes[path]; ok {
			return n
		}
		i := strings.LastIndexAny(path, ".[")
		if i <= 0 {
			return f.root
		}
		path = path[:i]
	}
}

func (d *decoder) note(path string, n *yaml.Node) {
	if d.file != nil && n != nil {
		if _, ok := d.file.nodes[path]; !ok {
			d.file.nodes[path] = n
		}
	}
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

// deref follows an alias to the node it names, counting the step.
func (d *decoder) deref(n *yaml.Node) *yaml.Node {
	d.steps++
	for n != nil && n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// fields walks a mapping node, calling set for each known field and
// reporting unknown, non-string and duplicate ones. valid, if not "", is
// what an unknown field's error says after "unknown field" (by default
// "(valid: " and the known fields). YAML merge keys
// (<<: *anchor) contribute the fields the mapping does not set itself.
func (d *decoder) fields(path string, n *yaml.Node, known []string, valid string, set func(name string, k, v *yaml.Node)) {
	if d.steps > maxSteps {
		return
	}
	n = d.deref(n)
	if n.Kind != yaml.MappingNode {
		d.errf(path, n, "want a mapping, got %s", kindName(n))
		return
	}
	if valid == "" {
		valid = "(valid: " + strings.Join(known, ", ") + ")"
	}
	seen := map[string]bool{}
	var merged []*yaml.Node // pairs from merge keys, applied after the mapping's own
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.Tag == "!!merge" {
			v = d.deref(v)
			srcs := []*yaml.Node{v}
			if v.Kind == yaml.SequenceNode {
				srcs = v.Content
			}
			for _, src := range srcs {
				if src = d.deref(src); src.Kind != yaml.MappingNode {
					d.errf(path, k, "merge key (<<) with %s: want a mapping or a list of them", kindName(src))
					continue
				}
				merged = append(merged, src.Content...)
			}
			continue
		}
		if k.Kind != yaml.ScalarNode || k.Tag != "!!str" {
			d.errf(join(path, k.Value), k, "key %s is not a string", kindName(k))
			continue
		}
		name := k.Value
		if !slices.Contains(known, name) {
			d.errf(join(path, name), k, "unknown field %s", valid)
			continue
		}
		if seen[name] {
			d.errf(join(path, name), k, "field given twice")
			continue
		}
		seen[name] = true
		d.note(join(path, name), k)
		set(name, k, v)
	}
	for i := 0; i+1 < len(merged); i += 2 {
		k, v := merged[i], merged[i+1]
		if k.Kind != yaml.ScalarNode || k.Tag != "!!str" || seen[k.Value] {
			continue // an explicit field wins; an earlier merge source wins
		}
		if !slices.Contains(known, k.Value) {
			d.errf(join(path, k.Value), k, "unknown field %s", valid)
			continue
		}
		seen[k.Value] = true
		d.note(join(path, k.Value), k)
		set(k.Value, k, v)
	}
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return fmt.Sprintf("%q", n.Value)
	case yaml.AliasNode:
		return "an alias"
	}
	return "nothing"
}

func (d *decoder) str(path string, n *yaml.Node, dst *string) {
	// Any non-null scalar is its text, as in envoyproxy/ratelimit: value:
	// 2024-01-01 is "2024-01-01" (YAML tags it !!timestamp).
	n = d.deref(n)
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!str" && n.Tag != "!!int" && n.Tag != "!!float" && n.Tag != "!!bool" && n.Tag != "!!timestamp") {
		d.errf(path, n, "want a string, got %s", kindName(n))
		return
	}
	*dst = n.Value
}

func (d *decoder) boolean(path string, n *yaml.Node, dst *bool) {
	n = d.deref(n)
	if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
		d.errf(path, n, "want true or false, got %s", kindName(n))
		return
	}
	*dst = n.Value == "true" || n.Value == "True" || n.Value == "TRUE"
}

func (d *decoder) integer(path string, n *yaml.Node, dst *int64) {
	n = d.deref(n)
	var v int64
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" || n.Decode(&v) != nil {
		d.errf(path, n, "want an integer, got %s", kindName(n))
		return
	}
	*dst = v
}

// list walks a sequence node; with nullOK an empty value (descriptors:
// with nothing after it, as upstream's files have) is an empty list.
func (d *decoder) list(path string, n *yaml.Node, nullOK bool, each func(path string, v *yaml.Node)) {
	n = d.deref(n)
	if nullOK && n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return
	}
	if n.Kind != yaml.SequenceNode {
		d.errf(path, n, "want a list, got %s", kindName(n))
		return
	}
	for i, v := range n.Content {
		if d.steps > maxSteps {
			return
		}
		p := fmt.Sprintf("%s[%d]", path, i)
		d.note(p, v)
		each(p, v)
	}
}

// fileDomain is one domain as one file gives it: prefix is its path in the
// file ("domains[2]", or "" for a file of upstream's shape).
type fileDomain struct {
	df     domainFile
	prefix string
	f      *fileLoc
}

// policy decodes one file's root: Meridian's domains list, or (without
// one) upstream's single domain.
func (d *decoder) policy(n *yaml.Node) []fileDomain {
	n = d.deref(n)
	if n.Kind != yaml.MappingNode {
		d.errf("", n, "want a mapping, got %s", kindName(n))
		return nil
	}
	meridian := false
	for i := 0; i < len(n.Content); i += 2 {
		meridian = meridian || n.Content[i].Value == "domains"
	}
	if !meridian {
		fd := fileDomain{f: d.file, df: domainFile{upstream: true}}
		d.domain("", n, &fd.df, "(valid: domain, descriptors, hash_tag, failure_mode) — or Meridian's domains: [...]")
		if fd.df.FailureMode == "" {
			// Upstream fails the RLS call when its Redis fails, and
			// Envoy's failure_mode_deny decides: keep that.
			fd.df.FailureMode = FailError.String()
		}
		return []fileDomain{fd}
	}
	var out []fileDomain
	d.fields("", n, []string{"domains"}, "(valid: domains) — or domain: and descriptors: for one domain per file, as envoyproxy/ratelimit's files have them", func(_ string, _, v *yaml.Node) {
		d.list("domains", v, false, func(p string, v *yaml.Node) {
			fd := fileDomain{prefix: p, f: d.file}
			d.domain(p, v, &fd.df, "")
			out = append(out, fd)
		})
		if v = d.deref(v); v.Kind == yaml.SequenceNode && len(v.Content) == 0 {
			d.errf("domains", v, "no domains: a policy needs at least one")
		}
	})
	return out
}

func (d *decoder) domain(path string, n *yaml.Node, df *domainFile, valid string) {
	if n = d.deref(n); n.Kind != yaml.MappingNode {
		d.errf(path, n, "want a mapping, got %s", kindName(n))
		d.bad++
		df.Domain, df.upstream = fmt.Sprintf("\x00%d", d.bad), true
		return
	}
	d.fields(path, n, []string{"domain", "hash_tag", "failure_mode", "descriptors"}, valid, func(name string, _, v *yaml.Node) {
		p := join(path, name)
		switch name {
		case "domain":
			d.str(p, v, &df.Domain)
		case "hash_tag":
			d.str(p, v, &df.HashTag)
		case "failure_mode":
			d.str(p, v, &df.FailureMode)
		case "descriptors":
			d.descriptors(p, v, &df.Descriptors)
		}
	})
}

func (d *decoder) descriptors(path string, n *yaml.Node, dst *[]descriptorFile) {
	d.list(path, n, true, func(p string, v *yaml.Node) {
		*dst = append(*dst, descriptorFile{})
		d.descriptor(p, v, &(*dst)[len(*dst)-1])
	})
}

// placeholder fills a descriptor that is not a mapping (already reported)
// with a unique key, so that it raises no second error (empty key,
// duplicate) and keeps the indices of the descriptors after it.
func (d *decoder) placeholder(df *descriptorFile) {
	d.bad++
	df.Key = fmt.Sprintf("\x00%d", d.bad)
}

// The descriptor fields of envoyproxy/ratelimit's that Meridian accepts but
// whose effect it does not have, and the one it refuses when true, with
// the reason the error gives.
const (
	whyQuotaMode = "quota_mode: true is not supported: upstream denies a request only when every quota-mode limit it matches is over (an over quota alone never denies), " +
		"while Meridian decides a request's limits together, all or nothing, so the limit would deny on its own; remove it, or use shadow_mode: true to count without denying"
)

func (d *decoder) descriptor(path string, n *yaml.Node, df *descriptorFile) {
	// detailed_metric and value_to_metric name upstream's statistics after
	// the request's values; Meridian's metrics have no per-value labels
	// (cardinality stays bounded), so they are accepted and change
	// nothing. metadata is what upstream returns in dynamic metadata when
	// RESPONSE_DYNAMIC_METADATA is set; Meridian returns none, so it is
	// checked to be a mapping and ignored.
	known := []string{"key", "value", "rate_limit", "shadow_mode", "descriptors",
		"detailed_metric", "value_to_metric", "metadata", "quota_mode", "share_threshold"}
	if n = d.deref(n); n.Kind != yaml.MappingNode {
		d.errf(path, n, "want a mapping, got %s", kindName(n))
		d.placeholder(df)
		return
	}
	var shareSet bool
	var shareK *yaml.Node
	d.fields(path, n, known, "", func(name string, k, v *yaml.Node) {
		p := join(path, name)
		switch name {
		case "key":
			d.str(p, v, &df.Key)
		case "value":
			d.str(p, v, &df.Value)
		case "shadow_mode":
			d.boolean(p, v, &df.ShadowMode)
		case "detailed_metric", "value_to_metric":
			var ignored bool
			d.boolean(p, v, &ignored)
		case "metadata":
			if v = d.deref(v); v.Kind != yaml.MappingNode && v.Tag != "!!null" {
				d.errf(p, v, "want a mapping, got %s", kindName(v))
			}
		case "quota_mode":
			var on bool
			d.boolean(p, v, &on)
			if on {
				d.errf(p, k, "%s", whyQuotaMode)
			}
		case "share_threshold":
			d.boolean(p, v, &shareSet)
			shareK = k
		case "descriptors":
			d.descriptors(p, v, &df.Descriptors)
		case "rate_limit":
			df.RateLimit = &rateLimitFile{}
			d.rateLimit(p, v, df.RateLimit)
		}
	})
	if shareK != nil {
		if !strings.Contains(df.Key+"_"+df.Value, "*") {
			// Upstream's own check, on its key_value.
			d.errf(join(path, "share_threshold"), shareK, "share_threshold can only be used with a wildcard value (one with *), not %q", df.Value)
		} else {
			df.Share = shareSet
		}
	}
}

func (d *decoder) rateLimit(path string, n *yaml.Node, rf *rateLimitFile) {
	known := []string{"unit", "requests_per_unit", "period", "burst", "unlimited", "name", "replaces",
		"failure_mode", "scope", "strategy", "lease"}
	d.fields(path, n, known, "", func(name string, _, v *yaml.Node) {
		p := join(path, name)
		switch name {
		case "unit":
			d.str(p, v, &rf.Unit)
		case "requests_per_unit":
			d.integer(p, v, &rf.RequestsPerUnit)
			rf.rpuSet = true
		case "period":
			d.str(p, v, &rf.Period)
		case "burst":
			d.integer(p, v, &rf.Burst)
			rf.burstSet = true
		case "unlimited":
			d.boolean(p, v, &rf.Unlimited)
		case "name":
			d.str(p, v, &rf.Name)
		case "failure_mode":
			d.str(p, v, &rf.FailureMode)
		case "scope":
			d.str(p, v, &rf.Scope)
		case "strategy":
			d.str(p, v, &rf.Strategy)
		case "lease":
			d.fields(p, v, []string{"units", "ttl"}, "", func(name string, _, v *yaml.Node) {
				switch name {
				case "units":
					d.integer(join(p, name), v, &rf.LeaseUnits)
				case "ttl":
					d.str(join(p, name), v, &rf.LeaseTTL)
				}
			})
		case "replaces":
			d.list(p, v, false, func(p string, v *yaml.Node) {
				// envoyproxy/ratelimit writes replaces as [{name: x}].
				var s string
				if v = d.deref(v); v.Kind == yaml.MappingNode {
					d.fields(p, v, []string{"name"}, "", func(_ string, _, v *yaml.Node) {
						if v = d.deref(v); v.Tag != "!!null" { // "- name:" is the empty name below
							d.str(join(p, "name"), v, &s)
						}
					})
				} else {
					d.str(p, v, &s)
				}
				if s == "" {
					d.errf(p, v, "empty name: every replaces entry names the rule it replaces")
					return
				}
				rf.Replaces = append(rf.Replaces, s)
			})
		}
	})
}

// units are envoyproxy/ratelimit's: a week of 7 days, a month of 30 and a
// year of 365 (its UnitToDivider).
var units = map[string]time.Duration{
	"second": time.Second, "minute": time.Minute, "hour": time.Hour, "day": 24 * time.Hour,
	"week": 7 * 24 * time.Hour, "month": 30 * 24 * time.Hour, "year": 365 * 24 * time.Hour,
}

// maxWindowText is gcra.MaxWindow as errors name it.
const maxWindowText = "2^51µs (about 71 years)"

func parseFailureMode(s string) (FailureMode, bool) {
	switch s {
	case "local":
		return FailLocal, true
	case "open":
		return FailOpen, true
	case "closed":
		return FailClosed, true
	case "error":
		return FailError, true
	}
	return 0, false
}

const failureModes = "want open, closed, local or error"

// prepare gives each descriptor without rate_limit and without
// descriptors the allow marker (see rateLimitFile.allow), and each below a
// share_threshold wildcard (or one itself) the patterns its keys share
// (see Rule.shared); shared holds those of the descriptors above.
func prepare(ds []descriptorFile, shared []string) {
	for i := range ds {
		df := &ds[i]
		if df.RateLimit == nil && len(df.Descriptors) == 0 {
			df.RateLimit = &rateLimitFile{allow: true}
		}
		pattern := ""
		if df.Share {
			pattern = df.Value
		}
		own := append(slices.Clip(shared), pattern)
		if slices.ContainsFunc(own, func(s string) bool { return s != "" }) {
			df.shared = own
		}
		prepare(df.Descriptors, own)
	}
}

// build validates the decoded policy and builds the matching trees.
func (d *decoder) build(pf *policyFile) *Policy {
	p := &Policy{domains: map[string]*domain{}}
	// The version first: the allow markers below are no part of the file.
	canon, err := json.Marshal(pf)
	if err != nil {
		d.errf("", nil, "hash the policy: %v", err)
	}
	sum := sha256.Sum256(canon)
	p.version = hex.EncodeToString(sum[:8])
	if len(pf.Domains) == 0 && len(d.errs) == 0 {
		d.errf("domains", nil, "no domains: a policy needs at least one")
	}
	for i := range pf.Domains {
		df := &pf.Domains[i]
		path := fmt.Sprintf("domains[%d]", i)
		dom := &domain{name: df.Domain, hashTag: df.HashTag}
		switch {
		case df.Domain == "":
			d.errf(join(path, "domain"), nil, "empty: every domain needs a name")
		case len(df.Domain) > MaxDomainLen:
			d.errf(join(path, "domain"), nil, "%d bytes, above the maximum %d", len(df.Domain), MaxDomainLen)
		case p.domains[df.Domain] != nil:
			d.errf(join(path, "domain"), nil, "domain %q defined twice", df.Domain)
		default:
			p.domains[df.Domain] = dom
		}
		if len(df.HashTag) > MaxEntryKeyLen {
			d.errf(join(path, "hash_tag"), nil, "%d bytes, above the maximum %d", len(df.HashTag), MaxEntryKeyLen)
		}
		fm := FailLocal
		if df.FailureMode != "" {
			m, ok := parseFailureMode(df.FailureMode)
			if !ok {
				d.errf(join(path, "failure_mode"), nil, "%q: %s", df.FailureMode, failureModes)
			}
			fm = m
		}
		if len(df.Descriptors) == 0 && !df.upstream {
			// Upstream loads a domain without descriptors (it limits
			// nothing, like an unknown domain); in Meridian's own shape
			// it is taken for a mistake.
			d.errf(join(path, "descriptors"), nil, "no descriptors: the domain limits nothing")
		}
		prepare(df.Descriptors, nil)
		dom.root = d.level(p, dom, fm, join(path, "descriptors"), df.Descriptors, nil)
	}
	// Names are unique per domain so replaces is unambiguous.
	names := map[string]*Rule{}
	for _, r := range p.rules {
		if r.Name == "" {
			continue
		}
		k := r.Domain + "\x00" + r.Name
		if prev, ok := names[k]; ok {
			d.errf(join(r.spath, "rate_limit.name"), nil, "name %q already used by %s", r.Name, prev.where())
			continue
		}
		names[k] = r
	}
	for _, r := range p.rules {
		for i, name := range r.Replaces {
			switch {
			case name == r.Name:
				d.errf(join(r.spath, "rate_limit.replaces"), nil, "a rule cannot replace itself (%q)", name)
			case slices.Contains(r.Replaces[:i], name):
				d.errf(join(r.spath, "rate_limit.replaces"), nil, "%q listed twice", name)
			case names[r.Domain+"\x00"+name] == nil:
				d.errf(join(r.spath, "rate_limit.replaces"), nil, "no rule named %q in domain %q", name, r.Domain)
			}
		}
	}
	// A cycle (a replaces b replaces a) would drop every limit of a request
	// matching both: refuse it.
	for _, r := range p.rules {
		if r.Name != "" && replacesReach(names, r, r.Name, map[*Rule]bool{}) {
			d.errf(join(r.spath, "rate_limit.replaces"), nil, "replaces cycle through %q: a request matching them all would be limited by none", r.Name)
		}
	}
	return p
}

// where names r's place for a message: its file (if any) and path.
func (r *Rule) where() string {
	if r.File != "" && !strings.Contains(r.Path, ":") {
		return r.File + ": " + r.Path
	}
	return r.Path
}

// replacesReach reports whether name is reachable from r's replaces.
func replacesReach(byName map[string]*Rule, r *Rule, name string, seen map[*Rule]bool) bool {
	if seen[r] {
		return false
	}
	seen[r] = true
	for _, n := range r.Replaces {
		if n == name && n != r.Name {
			return true
		}
		if n == name {
			continue // replacing itself is reported on its own
		}
		if next := byName[r.Domain+"\x00"+n]; next != nil && replacesReach(byName, next, name, seen) {
			return true
		}
	}
	return false
}

// DefaultBurst is the burst of a rule that does not set one, in either file
// shape: its requests_per_unit, capped so the window fits gcra.MaxWindow.
// It makes an unchanged envoyproxy/ratelimit config admit what upstream's
// fixed window admits: requests_per_unit back to back after idle (a fresh
// window), and over any n consecutive units at most (n+1)·requests_per_unit
// (upstream: a full window on each side of a boundary; GCRA: the burst plus
// one per emission interval), so the long-run rate is the same. What GCRA
// changes is the shape, never the budget: no window boundary at which a
// client may spend two windows' worth at once on a fixed schedule.
func DefaultBurst(requests int64, period time.Duration) int64 {
	if requests <= 0 || period <= 0 {
		return 0
	}
	t := (int64(period/time.Microsecond) + requests - 1) / requests
	return max(1, min(requests, gcra.MaxBurst, gcra.MaxWindowMicros/max(t, 1)))
}

func (d *decoder) rule(p *Policy, dom *domain, fm FailureMode, dp string, df *descriptorFile, keys []string) *Rule {
	rf := df.RateLimit
	if rf.allow {
		// Upstream's allow-list idiom: the descriptor matches (so a broader
		// one does not) and limits nothing.
		if df.ShadowMode {
			d.errf(join(dp, "shadow_mode"), nil, "set on a descriptor without a rate_limit")
		}
		return nil
	}
	rp := join(dp, "rate_limit")
	r := &Rule{Path: dp, Name: rf.Name, Replaces: rf.Replaces, Domain: dom.name, Shadow: df.ShadowMode,
		Unlimited: rf.Unlimited, FailureMode: fm, Strategy: rf.Strategy, id: len(p.rules), spath: dp, shared: df.shared}
	if f, path := d.locate(dp); f != nil {
		r.File, r.Path = f.name, path
		if f.rel != "" {
			r.Path = f.rel + ":" + path
		}
	}
	if rf.FailureMode != "" {
		m, ok := parseFailureMode(rf.FailureMode)
		if !ok {
			d.errf(join(rp, "failure_mode"), nil, "%q: %s", rf.FailureMode, failureModes)
		}
		r.FailureMode = m
	}
	switch rf.Scope {
	case "", "global":
	case "regional":
		r.Scope = Regional
	default:
		d.errf(join(rp, "scope"), nil, "%q: want global or regional", rf.Scope)
	}
	if rf.Strategy != "" && !slices.Contains(rebalance.StrategyNames(), rf.Strategy) {
		d.errf(join(rp, "strategy"), nil, "unknown strategy %q (valid: %s)", rf.Strategy,
			strings.Join(rebalance.StrategyNames(), ", "))
	}
	zero := rf.rpuSet && rf.RequestsPerUnit == 0 && !rf.Unlimited
	if rf.LeaseUnits != 0 || rf.LeaseTTL != "" {
		ttl, err := time.ParseDuration(rf.LeaseTTL)
		switch {
		case zero:
			d.errf(join(rp, "lease"), nil, "with requests_per_unit: 0: a limit that admits nothing has nothing to lease")
		case rf.LeaseUnits < 2:
			d.errf(join(rp, "lease.units"), nil, "%d: must be at least 2 (a lease of one unit saves nothing)", rf.LeaseUnits)
		case err != nil:
			d.errf(join(rp, "lease.ttl"), nil, "%q: not a duration", rf.LeaseTTL)
		case ttl <= 0 || ttl > time.Second:
			d.errf(join(rp, "lease.ttl"), nil, "%s: must be in (0, 1s]: leased units are served late by up to the TTL", ttl)
		default:
			r.LeaseUnits, r.LeaseTTL = rf.LeaseUnits, ttl
		}
	}
	if rf.Unlimited {
		if rf.Unit != "" || rf.Period != "" || rf.RequestsPerUnit != 0 || rf.burstSet {
			d.errf(rp, nil, "unlimited with unit, period, requests_per_unit or burst: choose one")
		}
		p.rules = append(p.rules, r)
		return r
	}
	var period time.Duration
	switch {
	case rf.Unit != "" && rf.Period != "":
		d.errf(rp, nil, "both unit and period: give one")
	case rf.Unit != "":
		u, ok := units[strings.ToLower(rf.Unit)]
		if !ok {
			d.errf(join(rp, "unit"), nil, "%q: want second, minute, hour, day, week, month or year (or period: a duration)", rf.Unit)
		}
		period, r.Unit = u, strings.ToLower(rf.Unit)
	case rf.Period != "":
		v, err := time.ParseDuration(rf.Period)
		switch {
		case err != nil:
			d.errf(join(rp, "period"), nil, "%q: not a duration (%v)", rf.Period, err)
		case v < time.Millisecond || v > gcra.MaxWindow:
			d.errf(join(rp, "period"), nil, "%s: outside [1ms, %s]", v, maxWindowText)
		default:
			period = v
		}
	default:
		d.errf(join(rp, "unit"), nil, "missing: give unit (second … year) or period, or unlimited: true")
	}
	switch {
	case !rf.rpuSet:
		// Upstream reads a missing requests_per_unit as 0, a limit that
		// denies everything: too easy to write by accident to take silently.
		d.errf(join(rp, "requests_per_unit"), nil, "missing: give the number of requests per unit (requests_per_unit: 0 denies every request)")
	case rf.RequestsPerUnit < 0:
		d.errf(join(rp, "requests_per_unit"), nil, "%d: must be at least 0 (0 denies every request)", rf.RequestsPerUnit)
	}
	if rf.burstSet && zero {
		d.errf(join(rp, "burst"), nil, "with requests_per_unit: 0: a limit that admits nothing has no burst")
	} else if rf.burstSet && rf.Burst < 1 {
		d.errf(join(rp, "burst"), nil, "%d: must be at least 1 (omit it for the default)", rf.Burst)
	}
	if period > 0 && rf.RequestsPerUnit > 0 && (!rf.burstSet || rf.Burst >= 1) {
		burst := rf.Burst
		if burst == 0 {
			burst = DefaultBurst(rf.RequestsPerUnit, period)
		}
		r.Limit = gcra.New(rf.RequestsPerUnit, period, burst)
		if err := r.Limit.Validate(); err != nil {
			d.errf(rp, nil, "%v", err)
		}
	}
	// zero: r.Limit stays the zero limit, which denies every request and
	// writes nothing (and which the coordinator never shares).
	if dom.hashTag != "" && !slices.Contains(keys, dom.hashTag) {
		d.errf(dp, nil, "no %q entry on this path: every limit of the domain needs its hash_tag descriptor, or its keys cannot share a Redis Cluster slot with the domain's other limits in one composite decision", dom.hashTag)
	}
	p.rules = append(p.rules, r)
	return r
}

// CheckOneSlot reports every domain whose limits one request can combine in
// a store call while their keys cannot share a Redis Cluster slot, naming
// the limits: a domain without hash_tag in which two limits can match one
// request (two of its descriptors, each matching one) and be decided in the
// same call — both enforced or both shadow, neither replacing the other.
// Its keys hash by their whole names, so on a Cluster every such request
// would fail as cross-slot. A domain with a hash_tag keeps every key of a
// request in its tag's slot (descriptors naming different tag values are a
// request error). A domain with one limit passes: two keys of it in one
// request (two values of a descriptor without an exact one) are refused per
// request under Config.OneSlot. Call it when the store is a Cluster:
// NewNode does with Config.OneSlot, the agent at load and reload.
func (p *Policy) CheckOneSlot() error {
	var errs []error
	var order []string
	byDomain := map[string][]*Rule{}
	for _, r := range p.rules {
		if r.Unlimited {
			continue
		}
		if _, ok := byDomain[r.Domain]; !ok {
			order = append(order, r.Domain)
		}
		byDomain[r.Domain] = append(byDomain[r.Domain], r)
	}
	for _, name := range order {
		if p.domains[name].hashTag != "" {
			continue
		}
		rules := byDomain[name]
		together := make([]bool, len(rules))
		some := false
		for i, a := range rules {
			for j := i + 1; j < len(rules); j++ {
				if b := rules[j]; a.Shadow == b.Shadow && !replaces(a, b) && !replaces(b, a) {
					together[i], together[j], some = true, true, true
				}
			}
		}
		if !some {
			continue
		}
		var named []string
		for i, r := range rules {
			if together[i] {
				s := r.Path
				if r.Name != "" {
					s += fmt.Sprintf(" (%q)", r.Name)
				}
				named = append(named, s)
			}
		}
		errs = append(errs, fmt.Errorf("region: domain %q has no hash_tag, and one request can match its limits %s together: on a Redis Cluster their keys hash to different slots, so every such request would fail; set hash_tag to a descriptor key on every limit's path, or split the domain",
			name, strings.Join(named, ", ")))
	}
	return errors.Join(errs...)
}

// replaces reports whether rule a drops rule b when both match a request.
func replaces(a, b *Rule) bool {
	return b.Name != "" && slices.Contains(a.Replaces, b.Name)
}
