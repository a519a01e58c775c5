package region

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
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
	// ("domains[0].descriptors[1].descriptors[0]").
	Path string
	// Name is rate_limit.name ("" if not set); Replaces lists the names of
	// the rules this one replaces when both match one request.
	Name     string
	Replaces []string
	Domain   string
	// Limit is the global limit (zero when Unlimited).
	Limit       gcra.Limit
	Unlimited   bool
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
}

// Policy is a loaded, validated policy: immutable and safe to share.
type Policy struct {
	version string
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

// The YAML shapes. Every field is decoded by hand from yaml.Node so that
// each error carries its path and unknown fields are refused.
type policyFile struct {
	Domains []domainFile `json:"domains"`
}

type domainFile struct {
	Domain      string           `json:"domain"`
	HashTag     string           `json:"hash_tag,omitempty"`
	FailureMode string           `json:"failure_mode,omitempty"`
	Descriptors []descriptorFile `json:"descriptors,omitempty"`
}

type descriptorFile struct {
	Key         string           `json:"key"`
	Value       string           `json:"value,omitempty"`
	RateLimit   *rateLimitFile   `json:"rate_limit,omitempty"`
	ShadowMode  bool             `json:"shadow_mode,omitempty"`
	Descriptors []descriptorFile `json:"descriptors,omitempty"`
}

type rateLimitFile struct {
	Unit            string `json:"unit,omitempty"`
	RequestsPerUnit int64  `json:"requests_per_unit,omitempty"`
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
}

// ErrPolicy wraps every policy load error.
var ErrPolicy = errors.New("region: invalid policy")

// ParsePolicy parses and validates a YAML policy. It reports every problem
// at once, each with its path in the file (and line), wrapped in ErrPolicy;
// unknown fields are errors.
func ParsePolicy(data []byte) (*Policy, error) {
	return parsePolicy(data)
}

// LoadPolicy reads the policy at path: one file in either shape (Meridian's
// domains: [...] or envoyproxy/ratelimit's one domain: per file), or a
// directory of such files as upstream's runtime loads them
// (RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config/), merged as opt says. Every
// error names the file, the path within it and the line.
func LoadPolicy(path string, opt LoadOptions) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParsePolicy(data)
}

// LoadOptions are how LoadPolicy reads a directory of upstream files.
type LoadOptions struct {
	// MergeDomains merges files that name the same domain
	// (upstream's MERGE_DOMAIN_CONFIG); otherwise a domain in two files
	// is an error.
	MergeDomains bool
	// IgnoreDotFiles skips files and directories whose names start with a
	// dot (upstream's RUNTIME_IGNOREDOTFILES).
	IgnoreDotFiles bool
}

func parsePolicy(data []byte) (*Policy, error) {
	// A Decoder, not yaml.Unmarshal: Unmarshal reads the first document
	// only, so the domains of any later one would be dropped silently (not
	// even syntax-checked).
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: %w", ErrPolicy, err)
	}
	d := &decoder{}
	var pf policyFile
	if len(doc.Content) == 0 {
		d.errf("", &doc, "empty policy: want a mapping with a domains list")
	} else {
		d.policy(doc.Content[0], &pf)
	}
	for {
		var extra yaml.Node
		err := dec.Decode(&extra)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrPolicy, err)
		}
		// An empty document (a trailing "---") holds nothing to lose.
		if len(extra.Content) > 0 && extra.Content[0].Tag != "!!null" {
			d.errf("", extra.Content[0], "a second YAML document: a policy is one document; list every domain under its domains")
			break
		}
	}
	p := d.build(&pf)
	if len(d.errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrPolicy, errors.Join(d.errs...))
	}
	return p, nil
}

type decoder struct {
	errs []error
}

func (d *decoder) errf(path string, n *yaml.Node, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if path == "" {
		path = "(root)"
	}
	if n != nil && n.Line > 0 {
		d.errs = append(d.errs, fmt.Errorf("%s (line %d): %s", path, n.Line, msg))
		return
	}
	d.errs = append(d.errs, fmt.Errorf("%s: %s", path, msg))
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

// fields walks a mapping node, calling set for each known field and
// reporting unknown and duplicate ones.
func (d *decoder) fields(path string, n *yaml.Node, known []string, set func(name string, v *yaml.Node)) {
	if n.Kind != yaml.MappingNode {
		d.errf(path, n, "want a mapping, got %s", kindName(n))
		return
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		name := k.Value
		if !slices.Contains(known, name) {
			d.errf(join(path, name), k, "unknown field (valid: %s)", strings.Join(known, ", "))
			continue
		}
		if seen[name] {
			d.errf(join(path, name), k, "field given twice")
			continue
		}
		seen[name] = true
		set(name, v)
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
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!str" && n.Tag != "!!int" && n.Tag != "!!float" && n.Tag != "!!bool" && n.Tag != "!!timestamp") {
		d.errf(path, n, "want a string, got %s", kindName(n))
		return
	}
	*dst = n.Value
}

func (d *decoder) boolean(path string, n *yaml.Node, dst *bool) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
		d.errf(path, n, "want true or false, got %s", kindName(n))
		return
	}
	*dst = n.Value == "true"
}

func (d *decoder) integer(path string, n *yaml.Node, dst *int64) {
	var v int64
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" || n.Decode(&v) != nil {
		d.errf(path, n, "want an integer, got %s", kindName(n))
		return
	}
	*dst = v
}

func (d *decoder) list(path string, n *yaml.Node, each func(path string, v *yaml.Node)) {
	if n.Kind != yaml.SequenceNode {
		d.errf(path, n, "want a list, got %s", kindName(n))
		return
	}
	for i, v := range n.Content {
		each(fmt.Sprintf("%s[%d]", path, i), v)
	}
}

func (d *decoder) policy(n *yaml.Node, pf *policyFile) {
	d.fields("", n, []string{"domains"}, func(_ string, v *yaml.Node) {
		d.list("domains", v, func(p string, v *yaml.Node) {
			pf.Domains = append(pf.Domains, domainFile{})
			d.domain(p, v, &pf.Domains[len(pf.Domains)-1])
		})
	})
}

func (d *decoder) domain(path string, n *yaml.Node, df *domainFile) {
	d.fields(path, n, []string{"domain", "hash_tag", "failure_mode", "descriptors"}, func(name string, v *yaml.Node) {
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
	d.list(path, n, func(p string, v *yaml.Node) {
		*dst = append(*dst, descriptorFile{})
		d.descriptor(p, v, &(*dst)[len(*dst)-1])
	})
}

func (d *decoder) descriptor(path string, n *yaml.Node, df *descriptorFile) {
	// detailed_metric is accepted for compatibility with envoyproxy/ratelimit
	// files and has no effect (metric labels are bounded here).
	known := []string{"key", "value", "rate_limit", "shadow_mode", "descriptors", "detailed_metric"}
	d.fields(path, n, known, func(name string, v *yaml.Node) {
		p := join(path, name)
		switch name {
		case "key":
			d.str(p, v, &df.Key)
		case "value":
			d.str(p, v, &df.Value)
		case "shadow_mode":
			d.boolean(p, v, &df.ShadowMode)
		case "detailed_metric":
			var ignored bool
			d.boolean(p, v, &ignored)
		case "descriptors":
			d.descriptors(p, v, &df.Descriptors)
		case "rate_limit":
			df.RateLimit = &rateLimitFile{}
			d.rateLimit(p, v, df.RateLimit)
		}
	})
}

func (d *decoder) rateLimit(path string, n *yaml.Node, rf *rateLimitFile) {
	known := []string{"unit", "requests_per_unit", "period", "burst", "unlimited", "name", "replaces",
		"failure_mode", "scope", "strategy", "lease"}
	d.fields(path, n, known, func(name string, v *yaml.Node) {
		p := join(path, name)
		switch name {
		case "unit":
			d.str(p, v, &rf.Unit)
		case "requests_per_unit":
			d.integer(p, v, &rf.RequestsPerUnit)
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
			d.fields(p, v, []string{"units", "ttl"}, func(name string, v *yaml.Node) {
				switch name {
				case "units":
					d.integer(join(p, name), v, &rf.LeaseUnits)
				case "ttl":
					d.str(join(p, name), v, &rf.LeaseTTL)
				}
			})
		case "replaces":
			d.list(p, v, func(p string, v *yaml.Node) {
				// envoyproxy/ratelimit writes replaces as [{name: x}].
				var s string
				if v.Kind == yaml.MappingNode {
					d.fields(p, v, []string{"name"}, func(_ string, v *yaml.Node) { d.str(join(p, "name"), v, &s) })
				} else {
					d.str(p, v, &s)
				}
				if s == "" {
					d.errf(p, v, "empty name")
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

// build validates the decoded file and builds the matching trees.
func (d *decoder) build(pf *policyFile) *Policy {
	p := &Policy{domains: map[string]*domain{}}
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
				d.errf(join(path, "failure_mode"), nil, "%q: want open, closed or local", df.FailureMode)
			}
			fm = m
		}
		if len(df.Descriptors) == 0 {
			d.errf(join(path, "descriptors"), nil, "no descriptors: the domain limits nothing")
		}
		dom.root = d.level(p, dom, fm, join(path, "descriptors"), df.Descriptors, nil)
	}
	// Names are unique per domain so replaces is unambiguous.
	names := map[string]string{}
	for _, r := range p.rules {
		if r.Name == "" {
			continue
		}
		k := r.Domain + "\x00" + r.Name
		if prev, ok := names[k]; ok {
			d.errf(join(r.Path, "rate_limit.name"), nil, "name %q already used by %s", r.Name, prev)
		}
		names[k] = r.Path
	}
	byName := map[string]*Rule{}
	for _, r := range p.rules {
		if r.Name != "" {
			byName[r.Domain+"\x00"+r.Name] = r
		}
	}
	for _, r := range p.rules {
		for i, name := range r.Replaces {
			switch {
			case name == r.Name:
				d.errf(join(r.Path, "rate_limit.replaces"), nil, "a rule cannot replace itself (%q)", name)
			case slices.Contains(r.Replaces[:i], name):
				d.errf(join(r.Path, "rate_limit.replaces"), nil, "%q listed twice", name)
			case byName[r.Domain+"\x00"+name] == nil:
				d.errf(join(r.Path, "rate_limit.replaces"), nil, "no rule named %q in domain %q", name, r.Domain)
			}
		}
	}
	// A cycle (a replaces b replaces a) would drop every limit of a request
	// matching both: refuse it.
	for _, r := range p.rules {
		if r.Name != "" && replacesReach(byName, r, r.Name, map[*Rule]bool{}) {
			d.errf(join(r.Path, "rate_limit.replaces"), nil, "replaces cycle through %q: a request matching them all would be limited by none", r.Name)
		}
	}
	canon, err := json.Marshal(pf)
	if err != nil {
		d.errf("", nil, "hash the policy: %v", err)
	}
	sum := sha256.Sum256(canon)
	p.version = hex.EncodeToString(sum[:8])
	return p
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

// DefaultBurst is the burst of a rule that does not set one: its
// requests_per_unit, the most Envoy's reference server admits in one
// instant (a fresh fixed window), capped so the window fits gcra.MaxWindow.
func DefaultBurst(requests int64, period time.Duration) int64 {
	if requests <= 0 || period <= 0 {
		return 0
	}
	t := (int64(period/time.Microsecond) + requests - 1) / requests
	return max(1, min(requests, gcra.MaxBurst, gcra.MaxWindowMicros/max(t, 1)))
}

func (d *decoder) rule(p *Policy, dom *domain, fm FailureMode, dp string, df *descriptorFile, keys []string) *Rule {
	rf := df.RateLimit
	rp := join(dp, "rate_limit")
	r := &Rule{Path: dp, Name: rf.Name, Replaces: rf.Replaces, Domain: dom.name, Shadow: df.ShadowMode,
		Unlimited: rf.Unlimited, FailureMode: fm, Strategy: rf.Strategy, id: len(p.rules)}
	if rf.FailureMode != "" {
		m, ok := parseFailureMode(rf.FailureMode)
		if !ok {
			d.errf(join(rp, "failure_mode"), nil, "%q: want open, closed or local", rf.FailureMode)
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
	if rf.LeaseUnits != 0 || rf.LeaseTTL != "" {
		ttl, err := time.ParseDuration(rf.LeaseTTL)
		switch {
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
		period = u
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
	if rf.RequestsPerUnit <= 0 {
		d.errf(join(rp, "requests_per_unit"), nil, "%d: must be at least 1", rf.RequestsPerUnit)
	}
	if rf.burstSet && rf.Burst < 1 {
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
