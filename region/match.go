package region

import (
	"fmt"
	"slices"
	"strings"
)

// level is one depth of a domain's descriptor tree. Lookups follow
// envoyproxy/ratelimit's GetLimit (src/config/config_impl.go at f2fb157):
// the exact value first, then the first wildcard of the level in file
// order, then the bare key (a descriptor without a value).
//
// A wildcard is a value containing "*": each "*" matches any run of bytes,
// the empty one included ("bar*b" matches "barb" and "bar123b", "foo*"
// matches "foo"). Upstream keeps a wildcard's literal text in its exact
// map too, so a request value equal to a pattern's text picks that pattern
// before any earlier wildcard: so does exact here.
//
// Where Meridian differs on purpose (upstream matches the joined string
// key+"_"+value, so patterns and exact values reach across the "_" seam
// into other keys; here key and value are compared apart) is pinned by
// TestMatchUpstreamDifferences.
type level struct {
	exact map[string]map[string]*node // key → value → node (wildcards by their text too)
	wild  []wildcard                  // file order
	bare  map[string]*node
}

// wildcard is one value pattern, split at its stars when the policy loads
// so a lookup allocates nothing.
type wildcard struct {
	key   string
	parts []string // strings.Split(value, "*"): at least two
	n     *node
}

type node struct {
	rule     *Rule
	children *level
}

// globMatch reports whether value matches the pattern split into parts at
// its stars (len(parts) ≥ 2). Each star matches zero or more bytes; the
// literal parts appear in order, the first at the start and the last at
// the end, without overlapping. Taking each middle part at its leftmost
// place is enough: a later place would only leave less room for the rest.
func globMatch(parts []string, value string) bool {
	first, last := parts[0], parts[len(parts)-1]
	fixed := 0
	for _, p := range parts {
		fixed += len(p)
	}
	if len(value) < fixed || !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) {
		return false
	}
	rest := value[len(first) : len(value)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

// level builds one depth of the tree. keys lists the descriptor keys on the
// path so far (to check the hash tag is on every limited path).
func (d *decoder) level(p *Policy, dom *domain, fm FailureMode, path string, ds []descriptorFile, keys []string) *level {
	if len(ds) == 0 {
		return nil
	}
	lv := &level{exact: map[string]map[string]*node{}, bare: map[string]*node{}}
	if len(keys) >= MaxEntries {
		d.errf(path, nil, "descriptors nested deeper than %d entries", MaxEntries)
		return lv
	}
	for i := range ds {
		df := &ds[i]
		dp := fmt.Sprintf("%s[%d]", path, i)
		switch {
		case df.Key == "":
			d.errf(join(dp, "key"), nil, "empty: every descriptor needs a key")
		case len(df.Key) > MaxEntryKeyLen:
			d.errf(join(dp, "key"), nil, "%d bytes, above the maximum %d", len(df.Key), MaxEntryKeyLen)
		case strings.Contains(df.Key, "*"):
			// Upstream would match "*" in a key as a wildcard over the
			// joined key_value (so "tenant*" limits every key starting
			// with tenant, whatever its value); Meridian matches keys
			// exactly and refuses the pattern rather than read it
			// another way.
			d.errf(join(dp, "key"), nil, "%q: a key is matched exactly; \"*\" is a wildcard in values only (envoyproxy/ratelimit would match it against key_value)", df.Key)
		}
		if len(df.Value) > MaxValueLen {
			d.errf(join(dp, "value"), nil, "%d bytes, above the maximum %d", len(df.Value), MaxValueLen)
		}
		n := &node{}
		path := append(slices.Clip(keys), df.Key)
		if df.RateLimit != nil {
			n.rule = d.rule(p, dom, fm, dp, df, path)
		} else if df.ShadowMode {
			d.errf(join(dp, "shadow_mode"), nil, "set on a descriptor without a rate_limit")
		}
		// A descriptor with neither rate_limit nor descriptors is
		// upstream's allow-list idiom: it matches and limits nothing, so a
		// value listed this way escapes its key's wildcards and default.
		n.children = d.level(p, dom, fm, join(dp, "descriptors"), df.Descriptors, path)
		dup := false
		if df.Value == "" {
			dup = lv.bare[df.Key] != nil
			if !dup {
				lv.bare[df.Key] = n
			}
		} else {
			m := lv.exact[df.Key]
			if m == nil {
				m = map[string]*node{}
				lv.exact[df.Key] = m
			}
			dup = m[df.Value] != nil
			if !dup {
				m[df.Value] = n
				if strings.Contains(df.Value, "*") {
					lv.wild = append(lv.wild, wildcard{key: df.Key, parts: strings.Split(df.Value, "*"), n: n})
				}
			}
		}
		if dup {
			d.errf(dp, nil, "duplicate descriptor key %q value %q at this level", df.Key, df.Value)
		}
	}
	return lv
}

// match resolves one request descriptor to its rule, as upstream's GetLimit
// does: at each depth the exact value, then the first matching wildcard in
// file order, then the bare key; no backtracking once a node is chosen; a
// rule applies only when found at the descriptor's last entry, so a
// descriptor longer than the tree, or ending at a node without rate_limit,
// matches none. Safe for concurrent use; allocates nothing.
func (dom *domain) match(entries []Entry) *Rule {
	lv := dom.root
	var found *Rule
	for i, e := range entries {
		if lv == nil {
			return nil
		}
		var n *node
		if m := lv.exact[e.Key]; m != nil {
			n = m[e.Value]
		}
		if n == nil {
			for j := range lv.wild {
				w := &lv.wild[j]
				if w.key == e.Key && globMatch(w.parts, e.Value) {
					n = w.n
					break
				}
			}
		}
		if n == nil {
			n = lv.bare[e.Key]
		}
		if n == nil {
			return nil
		}
		if n.rule != nil && i == len(entries)-1 {
			found = n.rule
		}
		lv = n.children
	}
	return found
}
