package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/rebalance"
	"github.com/meridian-quota/meridian/region"
)

const policySynopsis = `
Tools for rate-limit policies (the descriptors file an agent's policy: names).

  meridian policy check FILE|DIR [flags] [DESCRIPTOR...]

Run meridian policy check --help for its flags.`

const policyCheckSynopsis = `
Validate a policy — one file in Meridian's domains: [...] shape or
envoyproxy/ratelimit's one domain: per file, or a directory of such files as
upstream's runtime loads them — and print every problem with its place and
line. The exit status is 0 for a valid policy, 1 for an invalid one (or one
that cannot be read), 2 for a usage error: fit for a CI step.

With --explain DOMAIN, each DESCRIPTOR argument is one request descriptor
written KEY=VALUE,KEY=VALUE (entries in order; an empty value is KEY=; a value
cannot hold a comma). Several descriptors go in several arguments or in one
argument separated by ";"; together they are one request, as Envoy sends
them, so a rule's replaces applies across them. For each it prints the rule
that matches (its path, name, limit, burst, failure mode, scope, shadow or
unlimited) or that none does, and the limit a region runs it at: standalone
(--regions 1, the default) the full limit; with --regions N the safe-share
floor every region keeps (the share in force is the coordinator's, at least
that floor). Flags may come before or after FILE|DIR and the descriptors.

Examples:
  meridian policy check policy.yaml
  meridian policy check config/ --merge-domains
  meridian policy check policy.yaml --explain edge 'tenant=acme,path=/api/users' 'tenant=acme'
  meridian policy check policy.yaml --explain edge --regions 3 'tenant=beta7;tenant=acme'`

func runPolicy(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "-help" || args[0] == "help" {
		w := stdout
		if len(args) == 0 {
			w = stderr
		}
		fmt.Fprintf(w, "Usage: meridian policy <command>\n\n%s\n", strings.TrimSpace(policySynopsis))
		if len(args) == 0 {
			return errUsage
		}
		return flag.ErrHelp
	}
	switch args[0] {
	case "check":
		return runPolicyCheck(ctx, args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "meridian policy: unknown command %q (want check)\n", args[0])
	return errUsage
}

// policyCheckFlags are policy check's settings.
type policyCheckFlags struct {
	opt          region.LoadOptions
	explain      string
	regions      int
	safeFraction float64
	cluster      bool
}

func runPolicyCheck(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("policy check", policyCheckSynopsis, stdout, stderr)
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprintf(out, "Usage: meridian policy check FILE|DIR [flags] [DESCRIPTOR...]\n\n%s\n\nFlags:\n", strings.TrimSpace(policyCheckSynopsis))
		fs.PrintDefaults()
	}
	var f policyCheckFlags
	fs.BoolVar(&f.opt.MergeDomains, "merge-domains", false, "merge files of a directory that name the same domain (upstream's MERGE_DOMAIN_CONFIG); otherwise that is an error")
	fs.BoolVar(&f.opt.IgnoreDotFiles, "ignore-dotfiles", false, "skip files and directories whose names start with a dot (upstream's RUNTIME_IGNOREDOTFILES)")
	fs.Var((*onceString)(&f.explain), "explain", "DOMAIN: print which rule each DESCRIPTOR argument matches in it, and the regional limit (one domain: a request has one)")
	fs.IntVar(&f.regions, "regions", 1, "with --explain: the number of regions sharing each global limit (1: standalone, the full limit)")
	fs.Float64Var(&f.safeFraction, "safe-fraction", region.DefaultConfig("", "").SafeFraction, "with --explain --regions N: the part of every budget set aside as the regions' floors, split equally (the agents' and coordinator's safe_fraction)")
	fs.BoolVar(&f.cluster, "redis-cluster", false, "also refuse limits one request can combine whose keys cannot share a Redis Cluster slot (what an agent on a Cluster refuses)")
	pos, err := parseInterspersed(fs, args, stdout)
	if err != nil {
		return err
	}
	usageErr := func(format string, a ...any) error {
		fmt.Fprintf(stderr, "meridian policy check: "+format+"\n", a...)
		return errUsage
	}
	switch {
	case len(pos) == 0:
		return usageErr("want a policy FILE or DIR")
	case f.explain == "" && len(pos) > 1:
		return usageErr("unexpected argument %q (descriptors need --explain DOMAIN)", pos[1])
	case f.explain != "" && len(pos) == 1:
		return usageErr("--explain %s: want at least one DESCRIPTOR argument (KEY=VALUE,...)", f.explain)
	case f.regions < 1:
		return usageErr("--regions %d: must be at least 1", f.regions)
	case !(f.safeFraction > 0 && f.safeFraction <= 1):
		return usageErr("--safe-fraction %v: must be in (0, 1]", f.safeFraction)
	}
	var descs [][]region.Entry
	var texts []string
	for _, arg := range pos[1:] {
		for _, s := range strings.Split(arg, ";") {
			es, err := parseDescriptor(s)
			if err != nil {
				return usageErr("descriptor %q: %v", s, err)
			}
			descs = append(descs, es)
			texts = append(texts, s)
		}
	}
	if len(descs) > region.MaxDescriptors {
		return usageErr("%d descriptors, above the maximum %d of one request", len(descs), region.MaxDescriptors)
	}

	path := pos[0]
	p, err := region.LoadPolicy(path, f.opt)
	if err != nil && !errors.Is(err, region.ErrPolicy) {
		return fmt.Errorf("load %s: %w", path, err) // unreadable, not invalid
	}
	if err == nil && f.cluster {
		err = p.CheckOneSlot()
	}
	if err != nil {
		problems := policyProblems(err)
		fmt.Fprintf(stdout, "%s: invalid: %d %s\n", path, len(problems), plural(len(problems), "problem", "problems"))
		for _, pr := range problems {
			fmt.Fprintf(stdout, "  %s\n", pr)
		}
		return fmt.Errorf("%s: %d %s", path, len(problems), plural(len(problems), "problem", "problems"))
	}
	printPolicySummary(stdout, path, p)
	if f.explain != "" {
		explainRequest(stdout, p, f, descs, texts)
	}
	return nil
}

// onceString is a string flag that may be given once.
type onceString string

func (s *onceString) String() string { return string(*s) }

func (s *onceString) Set(v string) error {
	if *s != "" {
		return fmt.Errorf("given twice (%q, then %q): one request is in one domain", string(*s), v)
	}
	if v == "" {
		return errors.New("empty domain")
	}
	*s = onceString(v)
	return nil
}

// parseInterspersed parses flags wherever they are among the positional
// arguments (flag.Parse stops at the first of them), returning those in
// order; "--" ends the flags. --help prints the usage on stdout.
func parseInterspersed(fs *flag.FlagSet, args []string, stdout io.Writer) ([]string, error) {
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "-h" || a == "--help" || a == "-help" {
			fs.SetOutput(stdout)
			fs.Usage()
			return nil, flag.ErrHelp
		}
	}
	var pos []string
	rest := args
	for len(rest) > 0 {
		if err := fs.Parse(rest); err != nil {
			return nil, errUsage
		}
		left := fs.Args()
		if used := len(rest) - len(left); used > 0 && rest[used-1] == "--" {
			return append(pos, left...), nil
		}
		if len(left) == 0 {
			break
		}
		pos = append(pos, left[0])
		rest = left[1:]
	}
	return pos, nil
}

// parseDescriptor parses KEY=VALUE,KEY=VALUE.
func parseDescriptor(s string) ([]region.Entry, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("empty: want KEY=VALUE,...")
	}
	var es []region.Entry
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		switch {
		case !ok:
			return nil, fmt.Errorf("entry %q: want KEY=VALUE", kv)
		case k == "":
			return nil, fmt.Errorf("entry %q: empty key", kv)
		case len(k) > region.MaxEntryKeyLen:
			return nil, fmt.Errorf("key %q: %d bytes, above the maximum %d", k, len(k), region.MaxEntryKeyLen)
		case len(v) > region.MaxValueLen:
			return nil, fmt.Errorf("value of %q: %d bytes, above the maximum %d", k, len(v), region.MaxValueLen)
		}
		es = append(es, region.Entry{Key: k, Value: v})
	}
	if len(es) > region.MaxEntries {
		return nil, fmt.Errorf("%d entries, above the maximum %d", len(es), region.MaxEntries)
	}
	return es, nil
}

// policyProblems lists the individual problems of a load error: the leaves
// of its joined errors, without the ErrPolicy sentinel, each on one line.
func policyProblems(err error) []string {
	var out []string
	var walk func(e error)
	walk = func(e error) {
		if e == nil || e == region.ErrPolicy {
			return
		}
		if m, ok := e.(interface{ Unwrap() []error }); ok {
			for _, c := range m.Unwrap() {
				walk(c)
			}
			return
		}
		for _, line := range strings.Split(e.Error(), "\n") {
			if line = strings.TrimSpace(line); line != "" {
				out = append(out, line)
			}
		}
	}
	walk(err)
	if len(out) == 0 {
		out = []string{err.Error()}
	}
	return out
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// printPolicySummary prints a valid policy's version and its rules per
// domain, in file order.
func printPolicySummary(w io.Writer, path string, p *region.Policy) {
	var order []string
	count := map[string]int{}
	for _, r := range p.Rules() {
		if _, ok := count[r.Domain]; !ok {
			order = append(order, r.Domain)
		}
		count[r.Domain]++
	}
	fmt.Fprintf(w, "%s: valid: policy version %s, %d %s, %d %s\n", path, p.Version(),
		len(order), plural(len(order), "domain", "domains"), len(p.Rules()), plural(len(p.Rules()), "rule", "rules"))
	for _, d := range order {
		fmt.Fprintf(w, "  domain %q: %d %s\n", d, count[d], plural(count[d], "rule", "rules"))
	}
}

// explainRequest prints, for each descriptor of one request in the
// --explain domain, the rule it matches and the limit a region runs it at.
func explainRequest(w io.Writer, p *region.Policy, f policyCheckFlags, descs [][]region.Entry, texts []string) {
	fmt.Fprintf(w, "\nexplain: domain %q, %d %s", f.explain, len(descs), plural(len(descs), "descriptor", "descriptors"))
	if f.regions == 1 {
		fmt.Fprintf(w, ", standalone (one region holds 100 %% of every limit)\n")
	} else {
		fmt.Fprintf(w, ", %d regions, safe fraction %v\n", f.regions, f.safeFraction)
	}
	known := false
	for _, r := range p.Rules() {
		known = known || r.Domain == f.explain
	}
	if !known {
		fmt.Fprintf(w, "  (no rule of the policy is in domain %q: a request in it is never limited)\n", f.explain)
	}
	rules := make([]*region.Rule, len(descs))
	for i, es := range descs {
		rules[i] = p.Match(f.explain, es)
	}
	for i, r := range rules {
		fmt.Fprintf(w, "\n[%d] %s\n", i, texts[i])
		if r == nil {
			fmt.Fprintf(w, "  rule:      none: the descriptor is not limited (as in envoyproxy/ratelimit)\n")
			continue
		}
		name := ""
		if r.Name != "" {
			name = fmt.Sprintf(" (name %q)", r.Name)
		}
		fmt.Fprintf(w, "  rule:      %s%s\n", r.Path, name)
		if len(r.Replaces) > 0 {
			fmt.Fprintf(w, "  replaces:  %s\n", strings.Join(r.Replaces, ", "))
		}
		if by := replacedBy(rules, r); by >= 0 {
			fmt.Fprintf(w, "  replaced:  by [%d]'s rule %s: not decided in this request\n", by, rules[by].Path)
		}
		if r.Unlimited {
			fmt.Fprintf(w, "  limit:     unlimited: matched, never limited\n")
			continue
		}
		_, period := r.Limit.Rate()
		fmt.Fprintf(w, "  limit:     %s, burst %d\n", limitText(r.Limit, period), r.Limit.Burst())
		mode := "enforced"
		if r.Shadow {
			mode = "shadow: decided and counted, never denies"
		}
		fmt.Fprintf(w, "  mode:      %s\n", mode)
		fmt.Fprintf(w, "  failure:   %s\n", r.FailureMode)
		fmt.Fprintf(w, "  scope:     %s\n", r.Scope)
		if r.Strategy != "" {
			fmt.Fprintf(w, "  strategy:  %s\n", r.Strategy)
		}
		if r.LeaseUnits > 0 {
			fmt.Fprintf(w, "  lease:     %d units for at most %s\n", r.LeaseUnits, r.LeaseTTL)
		}
		switch {
		case r.Scope == region.Regional:
			fmt.Fprintf(w, "  regional:  %s, burst %d in each region (regional scope: never shared)\n", limitText(r.Limit, period), r.Limit.Burst())
		case f.regions == 1:
			fmt.Fprintf(w, "  regional:  %s, burst %d: the full limit (standalone)\n", limitText(r.Limit, period), r.Limit.Burst())
		default:
			ppm := rebalance.EqualFloor(f.safeFraction, f.regions)
			floor := region.SafeLimit(r.Limit, ppm, f.regions)
			if floor.IsZero() {
				fmt.Fprintf(w, "  regional:  at least the safe floor %s (%d ppm of the limit): zero, a region at its floor denies every request;\n",
					pct(ppm), ppm)
			} else {
				fmt.Fprintf(w, "  regional:  at least the safe floor %s (%d ppm of the limit): %s, burst %d;\n",
					pct(ppm), ppm, limitText(floor, period), floor.Burst())
			}
			fmt.Fprintf(w, "             the share in force is the coordinator's table (the floor before the first table and once a lease lapses)\n")
		}
	}
}

// replacedBy returns the index of the descriptor whose rule replaces r in
// one request (as region.Node.Resolve drops it), or -1. Only limited rules
// are decided, so only they replace.
func replacedBy(rules []*region.Rule, r *region.Rule) int {
	if r.Name == "" {
		return -1
	}
	for i, q := range rules {
		if q == nil || q == r || q.Unlimited {
			continue
		}
		for _, name := range q.Replaces {
			if name == r.Name {
				return i
			}
		}
	}
	return -1
}

// limitText renders l's rate per period (the global limit's, so a region's
// part reads beside it: "20 per minute", "0.6667 per minute") with its
// emission interval.
func limitText(l gcra.Limit, period time.Duration) string {
	if l.IsZero() {
		return "zero (denies every request)"
	}
	if period <= 0 {
		period = time.Second
	}
	n, per := l.Rate()
	if n <= 0 || per != period {
		n = 0
	}
	rate := fmtRate(float64(period) / float64(l.Interval()))
	if n > 0 {
		rate = fmt.Sprint(n)
	}
	return fmt.Sprintf("%s per %s (T=%s)", rate, periodName(period), l.Interval())
}

// periodName names the units of envoyproxy/ratelimit's policies.
func periodName(d time.Duration) string {
	const day = 24 * time.Hour
	switch d {
	case time.Second:
		return "second"
	case time.Minute:
		return "minute"
	case time.Hour:
		return "hour"
	case day:
		return "day"
	case 7 * day:
		return "week"
	case 30 * day:
		return "month"
	case 365 * day:
		return "year"
	}
	return d.String()
}

func fmtRate(r float64) string {
	s := strconv.FormatFloat(r, 'f', 4, 64)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	if s == "0" {
		s = strconv.FormatFloat(r, 'g', 4, 64)
	}
	return s
}

func pct(ppm uint32) string {
	return fmtRate(float64(ppm)/1e4) + " %"
}
