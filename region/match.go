package region

import (
	"fmt"
	"slices"
	"strings"
)

// level is one depth of a domain's descriptor tree. Lookups follow Envoy's
// reference server: exact key and value, then the first wildcard (value
// prefix ending in "*", in file order), then the bare key.
type level struct {
	exact map[string]map[string]*node // key → value → node
	wild  []wildcard
	bare  map[string]*node
}

type wildcard struct {
	key, prefix string
	n           *node
}

type node struct {
	rule     *Rule
	children *level
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
		if df.RateLimit == nil && len(df.Descriptors) == 0 {
			d.errf(dp, nil, "neither rate_limit nor descriptors: the descriptor does nothing")
		}
		n.children = d.level(p, dom, fm, join(dp, "descriptors"), df.Descriptors, path)
		dup := false
		switch {
		case df.Value == "":
			dup = lv.bare[df.Key] != nil
			if !dup {
				lv.bare[df.Key] = n
			}
		case strings.HasSuffix(df.Value, "*"):
			prefix := strings.TrimSuffix(df.Value, "*")
			for _, w := range lv.wild {
				dup = dup || (w.key == df.Key && w.prefix == prefix)
			}
			if !dup {
				lv.wild = append(lv.wild, wildcard{key: df.Key, prefix: prefix, n: n})
			}
		default:
			m := lv.exact[df.Key]
			if m == nil {
				m = map[string]*node{}
				lv.exact[df.Key] = m
			}
			dup = m[df.Value] != nil
			if !dup {
				m[df.Value] = n
			}
		}
		if dup {
			d.errf(dp, nil, "duplicate descriptor key %q value %q at this level", df.Key, df.Value)
		}
	}
	return lv
}

// match resolves one request descriptor to its rule, as Envoy's reference
// server does: at each depth exact value, then wildcard, then bare key; a
// rule applies only when found at the descriptor's last entry.
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
				if w.key == e.Key && strings.HasPrefix(e.Value, w.prefix) {
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
