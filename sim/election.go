package sim

import (
	"fmt"
	"slices"
	"time"

	"github.com/meridian-quota/meridian/gossip/protocol"
)

// ElectionTTL is how long the coordinator's leadership lasts after its last
// renewal: production's (gossip.DefaultLoopConfig's Election.TTL; a test
// in cmd/meridian holds the two equal). Renewals and polls follow from it
// as gossip.ElectionConfig's defaults derive them: every TTL/3 and TTL/6.
const ElectionTTL = 3 * time.Second

// candidate is one agent's campaign for the coordinator's key: the
// protocol.Candidate that gossip.Election.Campaign steps, stepped here in
// virtual time against electKV.
type candidate struct {
	ri, a int // region, agent
	c     *protocol.Candidate
	// gen counts the process's lives: a step or an answer scheduled in an
	// earlier life is dropped (a crashed process hears nothing).
	gen  uint32
	dead bool
	res  protocol.KVResult // the answer to the call in flight, once it came
	// led is the newest term this process coordinated or found stored (a
	// restart forgets it, as gossip.Loop's seenTerm is lost with the
	// process).
	led uint64
}

// TermStart is one coordinator term of a run: when it started (virtual
// µs) and on which agent.
type TermStart struct {
	Term          uint64
	At            int64
	Region, Agent string
}

// Terms lists the run's coordinator terms in the order they started.
func (r *Run) Terms() []TermStart { return slices.Clone(r.terms) }

// electKV is the election key of the KV bucket, with compare-and-set on
// its revision as JetStream KV does. Calls reach it after half the
// scenario's mean latency and are answered after the other half (the
// bucket is replicated, so its nearest copy is one link away from every
// region); a region that is down has no process to make a call, and a
// call fails while its agent is cut from NATS or the bucket is lost. Its
// revisions come from the bucket's sequence, which the table head shares.
type electKV struct {
	value []byte
	rev   uint64 // 0: absent
}

// electionConfig is what each candidate runs on: production's timing, and
// the cluster's maximum clock skew as gossip.Loop passes it to Campaign.
func (r *Run) electionConfig(c *candidate) protocol.ElectionConfig {
	rg := r.regions[c.ri]
	return protocol.ElectionConfig{ID: rg.name + "/" + agentName(rg.name, c.a),
		TTL: ElectionTTL, Renew: ElectionTTL / 3, Poll: ElectionTTL / 6, MaxSkew: r.rcfg.MaxSkew}
}

// buildCandidates makes every agent a candidate, as the demo and a
// default deployment run them, the scenario's coordinator region's agents
// first, and runs the cluster's first election at time 0: the first
// candidate reads the key absent and creates it, its two calls taking no
// virtual time, so the run starts with its coordinator elected and its
// first table published at 0 (as a deployment is up before traffic; a run
// without coordinator faults is exactly what it was before the election
// was simulated). The others campaign from time 0 and find the key held.
func (r *Run) buildCandidates() error {
	order := []int{r.coordIdx}
	for ri := range r.regions {
		if ri != r.coordIdx {
			order = append(order, ri)
		}
	}
	for _, ri := range order {
		for a := range r.regions[ri].nodes {
			r.cands = append(r.cands, candidate{ri: ri, a: a})
			if err := r.newCandidate(len(r.cands) - 1); err != nil {
				return err
			}
		}
	}
	c := &r.cands[0]
	var res protocol.KVResult
	for range 2 { // read, create
		op, _ := c.c.Step(r.candClocks(c), res)
		res = r.kvApply(op)
	}
	c.res = res
	if err := r.step(0, c.gen); err != nil {
		return err
	}
	if r.leader != 0 {
		return fmt.Errorf("sim: the first election did not elect %s", r.electionConfig(c).ID)
	}
	return nil
}

func (r *Run) newCandidate(ci int) error {
	c := &r.cands[ci]
	pc, err := protocol.NewCandidate(r.electionConfig(c), r.erng)
	if err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	c.c, c.res = pc, protocol.KVResult{}
	return nil
}

// crash ends candidate ci's process: it steps no more and releases
// nothing; a call it had sent still reaches the bucket. A coordinator's
// term ends with it.
func (r *Run) crash(ci int) {
	c := &r.cands[ci]
	c.dead = true
	c.gen++
	if r.leader == ci {
		r.leader, r.coord = -1, nil
	}
}

// deposeCandidate ends candidate ci's term as gossip's campaignOnce does
// when its coordinate returns ErrDeposed (a fenced store, or a stored
// table of this term or later): the term stops, the campaign stops —
// releasing the key if it still leads, best effort — and a new campaign
// starts TTL/3 later.
func (r *Run) deposeCandidate(ci int) {
	c := &r.cands[ci]
	if r.leader == ci {
		r.leader, r.coord = -1, nil
	}
	op, _ := c.c.Stop(r.candClocks(c), "deposed")
	old := c.gen
	c.gen++ // the old campaign hears nothing more
	if op.Kind == protocol.OpUpdate {
		r.schedule(event{t: r.now + r.kvHalf(), kind: evKV, a: int32(ci), b: int32(old), msg: op})
	}
	r.schedule(event{t: r.now + (ElectionTTL / 3).Microseconds(), kind: evCampaign, a: int32(ci), b: int32(c.gen)})
}

// restart starts candidate ci's process afresh: a follower that reads the
// key at once.
func (r *Run) restart(ci int) error {
	c := &r.cands[ci]
	c.dead = false
	c.gen++
	c.led = 0
	if err := r.newCandidate(ci); err != nil {
		return err
	}
	r.schedule(event{t: r.now, kind: evElect, a: int32(ci), b: int32(c.gen)})
	return nil
}

// termFloor is what gossip.Loop gives its campaign as the term floor: the
// newest table term its agent's Follower delivered or its process
// coordinated.
func (r *Run) termFloor(c *candidate) uint64 {
	t, _ := r.regions[c.ri].follow[c.a].Last()
	return max(t, c.led)
}

// candClocks are candidate c's clocks now: its host's wall clock (the
// region's skew) as Unix µs from electionEpoch, and a monotonic one.
func (r *Run) candClocks(c *candidate) protocol.Clocks {
	return protocol.Clocks{Wall: electionEpoch + r.now + r.regions[c.ri].skew, Mono: r.now}
}

// electionEpoch is the Unix time (µs) the run's virtual time 0 reads as on
// the candidates' wall clocks: a record's times must be positive Unix µs.
const electionEpoch = 1_750_000_000_000_000

// step runs candidate ci as gossip's campaign loop does: Step with the last
// call's answer, act on its events — Elected starts the term from the
// stored table, Deposed ends it — and send the call it returns or wait.
func (r *Run) step(ci int, gen uint32) error {
	c := &r.cands[ci]
	if c.dead || gen != c.gen {
		return nil
	}
	res := c.res
	c.res = protocol.KVResult{}
	c.c.SetFloor(r.termFloor(c))
	op, evs := c.c.Step(r.candClocks(c), res)
	for _, ev := range evs {
		switch ev.Kind {
		case protocol.Elected:
			if r.leader >= 0 {
				// The candidates' clocks differ by less than MaxSkew, so
				// the key elects two at once only when the bucket was lost
				// under a leader that has not yet tried to renew: the new
				// term's first store moves the head, and the old term's
				// next one is fenced. The simulator runs one term at a
				// time, so the old one ends here, a renewal early.
				if !r.tkv.lost && len(r.sc.Faults.KVLoss) == 0 {
					return fmt.Errorf("sim: %s elected for term %d while term %d runs", r.electionConfig(c).ID, ev.Term, r.term)
				}
				r.deposeCandidate(r.leader)
			}
			r.leader, r.coordIdx = ci, c.ri
			r.terms = append(r.terms, TermStart{Term: ev.Term, At: r.now, Region: r.regions[c.ri].name, Agent: agentName(r.regions[c.ri].name, c.a)})
			if err := r.startCoordinator(ci, ev.Term, r.coordNow()); err != nil {
				return err
			}
		case protocol.Deposed:
			if r.leader == ci {
				r.leader, r.coord = -1, nil
			}
		case protocol.BadRecord:
			return fmt.Errorf("sim: election key: %w", ev.Err) // only candidates write it
		}
	}
	switch op.Kind {
	case protocol.OpWait:
		r.schedule(event{t: max(op.Until, r.now), kind: evElect, a: int32(ci), b: int32(gen)})
	case protocol.OpRead, protocol.OpCreate, protocol.OpUpdate:
		r.regions[c.ri].kvOps[c.a]++
		r.schedule(event{t: r.now + r.kvHalf(), kind: evKV, a: int32(ci), b: int32(gen), msg: op})
	}
	return nil
}

// kvHalf is the one-way time of a call to the bucket.
func (r *Run) kvHalf() int64 { return us(r.sc.Latency.Mean) }

// kvArrive applies candidate ci's call at the bucket and sends the answer
// back, which its process hears only if it is the one that sent it.
func (r *Run) kvArrive(ci int, gen uint32, op protocol.KVOp) {
	var res protocol.KVResult
	if c := &r.cands[ci]; r.kvReachable(c.ri, c.a) {
		res = r.kvApply(op)
	} else {
		res.Err = errKVUnavailable
	}
	if c := &r.cands[ci]; !c.dead && gen == c.gen {
		c.res = res
		r.schedule(event{t: r.now + r.kvHalf(), kind: evElect, a: int32(ci), b: int32(gen)})
	}
}

// kvApply runs one call on the election key.
func (r *Run) kvApply(op protocol.KVOp) protocol.KVResult {
	kv := &r.elect
	var res protocol.KVResult
	switch op.Kind {
	case protocol.OpRead:
		if kv.rev == 0 {
			res.Err = protocol.ErrNotFound
		} else {
			res.Value, res.Rev = kv.value, kv.rev
		}
	case protocol.OpCreate, protocol.OpUpdate:
		if (op.Kind == protocol.OpCreate && kv.rev != 0) || (op.Kind == protocol.OpUpdate && (kv.rev == 0 || kv.rev != op.Rev)) {
			res.Err = protocol.ErrConflict
			break
		}
		r.bucketSeq++
		kv.value, kv.rev = op.Value, r.bucketSeq
		res.Rev = kv.rev
	}
	return res
}
