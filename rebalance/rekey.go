package rebalance

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/meridian-quota/meridian/gcra"
)

// A rekey moves the coordinator's per-key state from one sorted key set to
// the next in place: every per-key (and per key × region) slice keeps its
// storage, kept keys slide to their new index, removed keys' rows are
// overwritten and new keys' rows are filled in. A change of a few keys
// among a million then allocates nothing per key — where rebuilding every
// slice held two copies of the coordinator's state at once and left one to
// the collector each time a key came or went (issue 17, defect 6).
type rekey struct {
	// from: per new index, the old index of the key (-1: a key new to
	// the coordinator). Kept keys' old indexes increase with the new ones.
	from []int32
	// to: per old index, its new index (-1: removed).
	to []int32
	// repl: per new index, whether the key takes the budget in with — a
	// key new to the coordinator, or one whose budget changed (with is
	// the zero Budget elsewhere).
	repl []bool
	with []Budget
	// limit: per new index, whether a kept key's limit changed (apply),
	// and was its limit before.
	limit []bool
	was   []gcra.Limit
}

// plan merges the sorted current keys with upd, sorted budgets for keys
// added or changed: each of upd's keys replaces the current one of that
// name. A current key upd does not name is dropped when full (upd is the
// whole new set) or when gone names it.
func (c *Coordinator) plan(upd []Budget, gone map[string]bool, full bool) *rekey {
	p := &c.scratch.rekey
	p.from, p.to = p.from[:0], p.to[:0]
	p.repl, p.with = p.repl[:0], p.with[:0]
	old := c.budgets
	i, j := 0, 0
	for i < len(old) || j < len(upd) {
		switch {
		case j == len(upd) || (i < len(old) && old[i].Key < upd[j].Key):
			if full || gone[old[i].Key] {
				p.to = append(p.to, -1)
			} else {
				p.to = append(p.to, int32(len(p.from)))
				p.from = append(p.from, int32(i))
				p.repl, p.with = append(p.repl, false), append(p.with, Budget{})
			}
			i++
		case i == len(old) || upd[j].Key < old[i].Key:
			p.from = append(p.from, -1)
			p.repl, p.with = append(p.repl, true), append(p.with, upd[j])
			j++
		default: // the same key: upd's budget replaces it
			p.to = append(p.to, int32(len(p.from)))
			p.from = append(p.from, int32(i))
			same := budgetEqual(old[i], upd[j])
			p.repl, p.with = append(p.repl, !same), append(p.with, upd[j])
			i++
			j++
		}
	}
	return p
}

// budgetEqual reports whether a and b budget a key alike.
func budgetEqual(a, b Budget) bool {
	return a.Key == b.Key && a.Limit == b.Limit && a.Strategy == b.Strategy &&
		a.Frozen == b.Frozen && (a.Pinned == nil) == (b.Pinned == nil) && maps.Equal(a.Pinned, b.Pinned)
}

// move rekeys s, a slice of width elements per key, in place: it grows
// (amortised) or shrinks to len(p.from)·width, slides kept keys' rows to
// their new index and leaves new keys' rows as they were (the caller fills
// them). A nil s stays nil. A slice left at under a quarter of its
// capacity is copied into a smaller one, so a key set that shrinks for
// good gives its memory back.
//
// Kept keys keep their order, so rows that move down are moved in
// ascending order and rows that move up in descending order: a row is
// never overwritten before it has moved.
func move[T any](s []T, p *rekey, width int) []T {
	if s == nil {
		return nil
	}
	n := len(p.from) * width
	if n > len(s) {
		s = slices.Grow(s, n-len(s))[:n]
	}
	for i, o := range p.from {
		if o >= 0 && int(o) > i {
			copy(s[i*width:(i+1)*width], s[int(o)*width:(int(o)+1)*width])
		}
	}
	for i := len(p.from) - 1; i >= 0; i-- {
		if o := p.from[i]; o >= 0 && int(o) < i {
			copy(s[i*width:(i+1)*width], s[int(o)*width:(int(o)+1)*width])
		}
	}
	clear(s[n:])
	s = s[:n]
	if cap(s) > 64 && n < cap(s)/4 {
		s = slices.Clone(s)
	}
	return s
}

// validBudget checks one budget, the i-th given, and returns its strategy
// and pinned shares (nil: not pinned).
func (c *Coordinator) validBudget(b Budget, i int) (Strategy, []uint32, []error) {
	var errs []error
	var where string
	if b.Key == "" || b.Limit.Validate() != nil || b.Pinned != nil {
		where = fmt.Sprintf("rebalance: budget %d (key %q)", i, b.Key)
	}
	if b.Key == "" {
		errs = append(errs, fmt.Errorf("%s: empty key", where))
	}
	if err := b.Limit.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", where, err))
	}
	s, err := c.strategy(b.Strategy)
	if err != nil {
		errs = append(errs, fmt.Errorf("rebalance: budget %d (key %q): %w", i, b.Key, err))
	}
	var pinned []uint32
	if b.Pinned != nil {
		pinned = slices.Clone(c.safe)
		for r, v := range b.Pinned {
			ri, ok := c.ridx[r]
			if !ok {
				errs = append(errs, fmt.Errorf("%s: pinned region %q: %w", where, r, ErrUnknownRegion))
				continue
			}
			pinned[ri] = v
		}
		if err := CheckShares(pinned, c.safe, false); err != nil {
			errs = append(errs, fmt.Errorf("%s: pinned shares: %w", where, err))
		}
	}
	return s, pinned, errs
}

// sortBudgets returns budgets sorted by key (a copy): tables list keys
// sorted (agents check it; lookups and the wire format rely on it),
// whatever order the budgets come in.
func sortBudgets(budgets []Budget) []Budget {
	budgets = slices.Clone(budgets)
	slices.SortStableFunc(budgets, func(a, b Budget) int { return strings.Compare(a.Key, b.Key) })
	return budgets
}
