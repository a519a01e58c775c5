package region

import "github.com/meridian-quota/meridian/gcra"

// lostState is the conservative mode after the store lost its state
// (StateLost): every global key whose limit's burst window is longer than
// the time since the loss runs at min(its share, the safe share).
type lostState struct {
	at      int64 // µs on the node's clock: when the loss was seen
	elapsed int64 // µs since at, as of the last Tick (or StateLost)
	capped  int   // the policy's global rules still capped at elapsed
}

// StateLost tells the node that its store lost every key's state at now
// (µs on the node's clock): a Redis that restarted without persistence,
// failed over to a replica that had not caught up, or was flushed. Such a
// store reads every key as full, granting each its whole burst again while
// the other regions, whose stores kept their state, spend theirs. From now
// until one burst window of its limit has passed (Limit.Window: a full
// bucket refills in that time anyway), each global key runs at
// min(its share, the safe share) — its rate and its burst — so the
// re-granted burst is a safe share's, not the region's whole share's.
// Regional keys are not capped (there is no share to fall back to), and a
// standalone node's safe share is the whole budget, so it changes
// nothing there. Tick ends the mode key by key as the windows pass; a
// second loss restarts it. Stats.StateLost counts the calls.
func (n *Node) StateLost(now int64) {
	n.pubMu.Lock()
	defer n.pubMu.Unlock()
	n.stateLost.Add(1)
	ls := &lostState{at: now}
	ls.capped = n.cappedRules(n.snap.Load().policy, 0)
	n.lost.Store(ls)
	n.republish()
}

// tickLost moves the conservative mode to now: keys whose burst window has
// passed since the loss run uncapped again (a new snapshot generation, so
// prepared requests pick up their schedules), and the mode ends with the
// last one.
func (n *Node) tickLost(now int64) {
	ls := n.lost.Load()
	if ls == nil {
		return
	}
	n.pubMu.Lock()
	defer n.pubMu.Unlock()
	if ls = n.lost.Load(); ls == nil {
		return
	}
	elapsed := max(now-ls.at, ls.elapsed)
	capped := n.cappedRules(n.snap.Load().policy, elapsed)
	switch {
	case capped == 0:
		n.lost.Store(nil)
		n.republish()
	case capped != ls.capped || elapsed != ls.elapsed:
		n.lost.Store(&lostState{at: ls.at, elapsed: elapsed, capped: capped})
		if capped != ls.capped {
			n.republish()
		}
	}
}

// cappedRules counts p's global rules whose burst window is longer than
// elapsed (µs).
func (n *Node) cappedRules(p *Policy, elapsed int64) int {
	c := 0
	for _, r := range p.Rules() {
		if r.Scope == Global && r.Limit.Window().Microseconds() > elapsed {
			c++
		}
	}
	return c
}

// republish publishes the snapshot in force again under a new generation:
// prepared requests recompute their schedules. The caller holds pubMu.
func (n *Node) republish() {
	s := *n.snap.Load()
	n.publish(&s)
}

// capLost is sch for a key under rule, capped at the safe share while the
// conservative mode after a state loss holds for it (StateLost).
func (n *Node) capLost(rule *Rule, sch gcra.Schedule) gcra.Schedule {
	ls := n.lost.Load()
	if ls == nil || rule.Scope != Global || rule.Limit.Window().Microseconds() <= ls.elapsed {
		return sch
	}
	safe := SafeLimit(rule.Limit, n.safe, len(n.cfg.Regions))
	sch.Current.Limit = minLimit(sch.Current.Limit, safe)
	if sch.HasPrevious {
		sch.Previous.Limit = minLimit(sch.Previous.Limit, safe)
	}
	return sch
}
