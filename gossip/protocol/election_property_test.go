package protocol

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// electionSim runs N candidates on one elKV in virtual time (µs of
// true time). Each candidate's wall clock is off true time by at most
// MaxSkew/2 (so two differ by at most MaxSkew) and may step within that
// bound; its monotonic clock has its own origin. Every op reaches the
// bucket after a random delay and answers after another, and may be lost
// on the way there or back; an answer later than the op's deadline is a
// timeout (the write may still land, later). Candidates crash (state
// lost, no release) or stop cleanly (release) and come back as new
// Candidates with the same ID.
type electionSim struct {
	t        *rapid.T
	rng      *rand.Rand
	kv       *elKV
	now      int64
	seq      int
	queue    elQueue
	cands    []*elSimCand
	maxDelay int64
	lossPct  int
	crashPct int // per mille per step
	skew     int64

	lastTerm  uint64 // the highest term anybody was elected to
	lastRec   uint64 // the highest term the bucket's record held
	elections int
	log       []string // the last events, for a failure report
}

type elSimCand struct {
	id      string
	c       *Candidate
	gen     int // bumped at each crash or stop: older events are void
	alive   bool
	wallOff int64
	monoOff int64
	term    uint64 // the term its events say it leads, 0 for none

	lastStep int64 // when it last stepped, and how many times at that instant
	spins    int
}

type elSimEvent struct {
	at   int64
	seq  int
	who  int
	gen  int
	kind int
	f    *elFlight
}

const (
	elEvStep    = iota // Step with no result (a wait ended)
	elEvApply          // an op reaches the bucket
	elEvReply          // an op's answer reaches its candidate
	elEvRestart        // a crashed or stopped candidate comes back
)

// elFlight is one op on its way.
type elFlight struct {
	op        KVOp
	res       KVResult
	applied   bool
	lostThere bool
	lostBack  bool
	noReply   bool // a release: nobody waits for it
}

type elQueue []elSimEvent

func (q elQueue) Len() int { return len(q) }
func (q elQueue) Less(i, j int) bool {
	return q[i].at < q[j].at || q[i].at == q[j].at && q[i].seq < q[j].seq
}
func (q elQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *elQueue) Push(x any)   { *q = append(*q, x.(elSimEvent)) }
func (q *elQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

func (s *electionSim) push(at int64, who, kind int, f *elFlight) {
	s.seq++
	heap.Push(&s.queue, elSimEvent{at: at, seq: s.seq, who: who, gen: s.cands[who].gen, kind: kind, f: f})
}

func (s *electionSim) clocks(i int) Clocks {
	sc := s.cands[i]
	return Clocks{Wall: elWall0 + s.now + sc.wallOff, Mono: s.now + sc.monoOff}
}

func (s *electionSim) note(format string, a ...any) {
	s.log = append(s.log, fmt.Sprintf("%9d ", s.now)+fmt.Sprintf(format, a...))
	if len(s.log) > 40 {
		s.log = s.log[1:]
	}
}

func (s *electionSim) fail(format string, a ...any) {
	s.t.Fatalf("at %d µs: %s\nlast events:\n%s", s.now, fmt.Sprintf(format, a...), strings.Join(s.log, "\n"))
}

// offset draws a wall clock offset in [-skew/2, skew/2], often at the ends.
func (s *electionSim) offset() int64 {
	h := s.skew / 2
	switch s.rng.IntN(3) {
	case 0:
		return -h
	case 1:
		return h
	}
	return s.rng.Int64N(2*h+1) - h
}

func (s *electionSim) start(i int) {
	sc := s.cands[i]
	c, err := NewCandidate(elCfgSkew(sc.id, s.skew), rand.New(rand.NewPCG(s.rng.Uint64(), s.rng.Uint64())))
	if err != nil {
		s.t.Fatal(err)
	}
	sc.c, sc.alive, sc.term = c, true, 0
	sc.monoOff = s.rng.Int64N(1 << 40)
	s.step(i, KVResult{})
}

func elCfgSkew(id string, skew int64) ElectionConfig {
	cfg := elCfg(id)
	cfg.MaxSkew = elDurUS(skew)
	return cfg
}

// step feeds res to candidate i and schedules what it asks for.
func (s *electionSim) step(i int, res KVResult) {
	sc := s.cands[i]
	if s.now == sc.lastStep {
		if sc.spins++; sc.spins > 3 {
			s.fail("%s steps %d times at one instant: spinning", sc.id, sc.spins)
		}
	} else {
		sc.lastStep, sc.spins = s.now, 0
	}
	if s.rng.IntN(20) == 0 {
		sc.wallOff = s.offset() // an NTP step, within the skew bound
	}
	op, evs := sc.c.Step(s.clocks(i), res)
	s.events(i, evs)
	s.schedule(i, op, false)
}

func (s *electionSim) schedule(i int, op KVOp, noReply bool) {
	sc := s.cands[i]
	if op.Kind == OpWait {
		at := op.Until - sc.monoOff
		if at < s.now {
			s.fail("%s waits until %d, in the past", sc.id, at)
		}
		s.push(at, i, elEvStep, nil)
		return
	}
	f := &elFlight{op: op, noReply: noReply}
	f.lostThere = s.rng.IntN(100) < s.lossPct
	f.lostBack = !f.lostThere && s.rng.IntN(100) < s.lossPct
	d1, d2 := s.rng.Int64N(s.maxDelay+1), s.rng.Int64N(s.maxDelay+1)
	if !f.lostThere {
		s.push(s.now+d1, i, elEvApply, f)
	}
	if noReply {
		return
	}
	reply := s.now + d1 + d2
	if deadline := op.Until - sc.monoOff; reply > deadline {
		// The shell's context gives up at the deadline; one time in
		// four an answer that was on its way wins the race with it.
		reply = deadline
		f.lostBack = f.lostBack || s.now+d1 > deadline || s.rng.IntN(4) != 0
	}
	s.push(reply, i, elEvReply, f)
}

func (s *electionSim) events(i int, evs []ElectionEvent) {
	sc := s.cands[i]
	for _, e := range evs {
		s.note("%s: %v", sc.id, elEvents([]ElectionEvent{e}))
		switch e.Kind {
		case Elected:
			if sc.term != 0 {
				s.fail("%s elected to %d while leading %d", sc.id, e.Term, sc.term)
			}
			if e.Term <= s.lastTerm {
				s.fail("%s elected to term %d after term %d was", sc.id, e.Term, s.lastTerm)
			}
			sc.term, s.lastTerm = e.Term, e.Term
			s.elections++
		case Deposed:
			if e.Term != sc.term || sc.term == 0 {
				s.fail("%s deposed from %d while leading %d", sc.id, e.Term, sc.term)
			}
			sc.term = 0
		}
	}
	if term, ok := sc.c.Leading(); term != sc.term || ok != (sc.term != 0) {
		s.fail("%s: Leading() = %d, %v; its events say %d", sc.id, term, ok, sc.term)
	}
}

// check holds the invariants after every event.
func (s *electionSim) check() {
	var leaders []string
	for _, sc := range s.cands {
		if sc.alive && sc.term != 0 {
			leaders = append(leaders, fmt.Sprintf("%s (term %d)", sc.id, sc.term))
		}
	}
	if len(leaders) > 1 {
		s.fail("two believe they lead: %v", leaders)
	}
}

func (s *electionSim) apply(f *elFlight) {
	f.res, f.applied = elDo(s.kv, f.op), true
	if f.res.Err == nil && f.op.Kind != OpRead {
		r, err := ParseLeaderRecord(f.op.Value)
		if err != nil {
			s.fail("wrote an invalid record %s: %v", f.op.Value, err)
		}
		if r.Term < s.lastRec {
			s.fail("record term %d after %d: terms went back", r.Term, s.lastRec)
		}
		s.lastRec = r.Term
		s.note("bucket: %s rev %d", f.op.Value, f.res.Rev)
	}
}

func (s *electionSim) run(until int64) {
	for s.queue.Len() > 0 {
		e := heap.Pop(&s.queue).(elSimEvent)
		if e.at > until {
			return
		}
		s.now = e.at
		sc := s.cands[e.who]
		switch e.kind {
		case elEvApply:
			s.apply(e.f) // in elFlight: lands whether its sender lives or not
		case elEvRestart:
			if e.gen == sc.gen {
				s.start(e.who)
			}
		case elEvStep, elEvReply:
			if e.gen != sc.gen || !sc.alive {
				break
			}
			if n := s.rng.IntN(1000); n < s.crashPct {
				s.crash(e.who, n%2 == 0)
				break
			}
			res := KVResult{}
			if e.kind == elEvReply {
				res = e.f.res
				if !e.f.applied || e.f.lostBack {
					res = KVResult{Err: elErrLost}
				}
			}
			s.step(e.who, res)
		}
		s.check()
	}
}

// crash ends candidate i: cleanly (Stop, release) or not (state lost).
func (s *electionSim) crash(i int, clean bool) {
	sc := s.cands[i]
	if clean {
		op, evs := sc.c.Stop(s.clocks(i), WhyStopped)
		s.events(i, evs)
		if op.Kind == OpUpdate {
			s.schedule(i, op, true)
		}
		s.note("%s stops", sc.id)
	} else {
		s.note("%s crashes", sc.id)
	}
	sc.gen++
	sc.alive, sc.term = false, 0
	s.push(s.now+s.rng.Int64N(2*elTTL+1), i, elEvRestart, nil)
}

func elDurUS(us int64) time.Duration { return time.Duration(us) * time.Microsecond }

// TestCandidatesProperty: N candidates with random delays, losses,
// crashes, clean stops and wall clock steps within MaxSkew never have two
// believing they lead at once (so never two in one term), elect strictly
// increasing terms, and never write a record with a lower term. Without
// faults and with short delays, the first leader keeps its term to the
// end. rapid prints the failing draws (replay with -rapid.seed).
func TestCandidatesProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(1, 5).Draw(rt, "candidates")
		faults := rapid.Bool().Draw(rt, "faults")
		s := &electionSim{
			t:    rt,
			rng:  rand.New(rand.NewPCG(rapid.Uint64().Draw(rt, "seed"), 0)),
			kv:   newElKV(),
			skew: rapid.Int64Range(0, elTTL).Draw(rt, "skew_us"),
		}
		if faults {
			s.maxDelay = rapid.Int64Range(0, 2*elTTL).Draw(rt, "max_delay_us")
			s.lossPct = rapid.IntRange(0, 50).Draw(rt, "loss_pct")
			s.crashPct = rapid.IntRange(0, 20).Draw(rt, "crash_per_mille")
		} else {
			s.maxDelay = rapid.Int64Range(0, elTTL/12).Draw(rt, "max_delay_us")
		}
		for i := range n {
			s.cands = append(s.cands, &elSimCand{id: fmt.Sprintf("r%d/a", i)})
			s.cands[i].wallOff = s.offset()
		}
		for i := range n {
			s.start(i)
		}
		s.run(60 * elTTL)
		if !faults && s.elections != 1 {
			s.fail("%d elections without faults, want 1", s.elections)
		}
	})
}
