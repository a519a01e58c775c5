package rebalance

import (
	"slices"
	"testing"
	"time"
)

// raises reports whether tb gives key some region a share above prev's.
func raises(prev, tb *Table, key string) bool {
	p, s := sharesOf(prev, key), sharesOf(tb, key)
	for r := range s {
		if s[r] > p[r] {
			return true
		}
	}
	return false
}

// No table supersedes an increase before it is in force on every store:
// its effective time plus MaxSkew (a store's clock may lag the
// coordinator's by that much). A table issued at the increase's effective
// time reaches the regions a link latency later, before their stores have
// rewritten the keys' state under the increase (they do at each key's next
// admission), and state two changes old is read as empty at the increase or
// its stored TAT if later — a saturated key at a small share with a large
// burst carries ~10 s of debt into its new share (see region's
// TestNodeSupersedingAChangeBeforeItsStateIsRewritten; found by the
// simulator). Demand moves every interval, so every rebalance changes the
// shares, and Fence ≥ Δ, so the increase's fence decides when the next
// rebalance runs.
func TestNextRebalanceWaitsForTheIncreaseInForceEverywhere(t *testing.T) {
	cfg := unitConfig("a", "b")
	cfg.Fence = 2 * time.Second
	skew := int64(cfg.MaxSkew / time.Microsecond)
	c := started(t, cfg, budget("k"))
	if err := c.MemberChange([]Member{{Region: "a", Agent: "a1"}, {Region: "b", Agent: "b1"}}); err != nil {
		t.Fatal(err)
	}
	var tables []*Table
	var latest *Table
	acked := map[*Table]bool{}
	for now := int64(0); now <= 20*sec; now += 100_000 {
		if now%sec == 0 && now >= sec {
			i := now/sec - 1
			observe(t, c, "a", "a1", i, now, map[string]int64{"k": 900 - 300*(i%2)})
			observe(t, c, "b", "b1", i, now, map[string]int64{"k": 100 + 300*(i%2)})
		}
		c.Tick(now)
		for _, tb := range take(c) {
			tables = append(tables, tb)
			latest = tb
		}
		// Agents acknowledge the newest table once it is in force on their
		// clock (InForce: effective time plus MaxSkew).
		if latest != nil && now >= latest.Effective+skew && !acked[latest] {
			acked[latest] = true
			for _, r := range []string{"a", "b"} {
				if err := c.Ack(r, r+"1", latest.Term, latest.Epoch); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	increases := 0
	for i := 1; i+1 < len(tables); i++ {
		inc, next := tables[i], tables[i+1]
		if !raises(tables[i-1], inc, "k") || inc.Effective <= inc.Issued {
			continue // not an increase behind a fence
		}
		increases++
		if next.Issued < inc.Effective+skew {
			t.Errorf("increase (%d,%d) effective at %dµs superseded by (%d,%d) issued at %dµs, before it is in force everywhere (%dµs)",
				inc.Term, inc.Epoch, inc.Effective, next.Term, next.Epoch, next.Issued, inc.Effective+skew)
		}
	}
	if increases < 3 {
		t.Fatalf("only %d increases in 20 s: the test does not exercise the wait", increases)
	}
}

// A decrease whose previous table named no agent (a term's first table is
// published before membership is known) waits for nobody's
// acknowledgement, but it is in force only once its effective time plus
// MaxSkew has passed: the increase, which supersedes it, waits that long.
// Found with the simulator: the increase went out at the next tick and the
// non-home regions of hot keys, whose state was still written under the
// floors' 66-unit burst, were blocked for ~7 s.
func TestIncreaseAfterAnUnwitnessedDecreaseWaitsForSkew(t *testing.T) {
	cfg := unitConfig("a", "b")
	skew := int64(cfg.MaxSkew / time.Microsecond)
	c := started(t, cfg, budget("k")) // the first table names no agent
	first := c.Latest()
	if slices.ContainsFunc(first.Agents, func(a []string) bool { return len(a) > 0 }) {
		t.Fatalf("setup: the first table names agents %v", first.Agents)
	}
	observe(t, c, "a", "a1", 0, sec, map[string]int64{"k": 900})
	observe(t, c, "b", "b1", 0, sec, map[string]int64{"k": 100})
	c.Tick(sec)
	dec := take(c)
	if len(dec) != 1 || !c.transition {
		t.Fatalf("setup: %d tables at the first rebalance, transition %v: want one decrease", len(dec), c.transition)
	}
	var inc *Table
	for now := sec + 10_000; now <= sec+3*skew && inc == nil; now += 10_000 {
		c.Tick(now)
		for _, tb := range take(c) {
			if raises(dec[0], tb, "k") {
				inc = tb
			}
		}
	}
	switch {
	case inc == nil:
		t.Fatalf("no increase within %dµs of the decrease", 3*skew)
	case inc.Issued < dec[0].Effective+skew:
		t.Errorf("increase issued at %dµs, %dµs after the decrease took effect: before it is in force everywhere (MaxSkew %dµs)",
			inc.Issued, inc.Issued-dec[0].Effective, skew)
	case inc.Issued > dec[0].Effective+skew+10_000:
		t.Errorf("increase issued at %dµs, want at the first tick from %dµs", inc.Issued, dec[0].Effective+skew)
	}
}
