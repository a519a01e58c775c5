package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
	"unicode"
	"unicode/utf8"
)

// ElectionConfig times one Candidate. The shell fills its defaults and
// validates its configuration surface (gossip.ElectionConfig);
// NewCandidate refuses only what the machine cannot run.
type ElectionConfig struct {
	// ID names the candidate in the record it writes (see CheckID).
	ID string
	// TTL is how long leadership lasts after the write that last took or
	// renewed it, by the leader's monotonic clock; the record says the
	// same by its wall clock.
	TTL time.Duration
	// Renew is the leader's period between renewals.
	Renew time.Duration
	// Poll is a follower's period between reads of the key, shortened by
	// up to a quarter at random so that followers do not race in step.
	Poll time.Duration
	// MaxSkew is the largest difference between two candidates' wall
	// clocks: a follower takes a lapsed record only once its expiry plus
	// MaxSkew has passed on its own clock.
	MaxSkew time.Duration
}

// CheckID validates a candidate or holder ID: 1 to 256 bytes of
// printable UTF-8.
func CheckID(id string) error {
	switch {
	case id == "":
		return errors.New("empty")
	case len(id) > 256:
		return fmt.Errorf("%d bytes: at most 256", len(id))
	case !utf8.ValidString(id):
		return errors.New("not UTF-8")
	}
	for _, r := range id {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("%q: not printable", id)
		}
	}
	return nil
}

// LeaderRecord is the value of the election key, JSON-encoded:
//
//	{"v":1,"term":7,"holder":"eu/eu-1","since_us":1730000000000000,"expires_us":1730000003000000}
//
// Times are Unix microseconds of the writer's wall clock. A released
// record keeps term and holder and has ExpiresUS 0.
type LeaderRecord struct {
	Term      uint64 // the fencing term: 1 for the first leader ever, +1 per take
	Holder    string // the holder's ElectionConfig.ID
	SinceUS   int64  // when the holder took this term
	ExpiresUS int64  // when the holder's last renewal lapses; 0 once released
}

// leaderJSON is LeaderRecord's encoding; its field order is the byte
// format.
type leaderJSON struct {
	V         int    `json:"v"`
	Term      uint64 `json:"term"`
	Holder    string `json:"holder"`
	SinceUS   int64  `json:"since_us"`
	ExpiresUS int64  `json:"expires_us"`
}

const leaderRecordVersion = 1

// Encode returns r's stored form (version 1).
func (r LeaderRecord) Encode() []byte {
	b, err := json.Marshal(leaderJSON{V: leaderRecordVersion, Term: r.Term, Holder: r.Holder, SinceUS: r.SinceUS, ExpiresUS: r.ExpiresUS})
	if err != nil {
		panic(err) // plain struct: never fails
	}
	return b
}

// ParseLeaderRecord decodes and validates a stored record, reporting every
// problem at once.
func ParseLeaderRecord(b []byte) (LeaderRecord, error) {
	var j leaderJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return LeaderRecord{}, fmt.Errorf("gossip: election record: not JSON: %w", err)
	}
	r := LeaderRecord{Term: j.Term, Holder: j.Holder, SinceUS: j.SinceUS, ExpiresUS: j.ExpiresUS}
	var errs []error
	if j.V != leaderRecordVersion {
		errs = append(errs, fmt.Errorf("version %d, want %d", j.V, leaderRecordVersion))
	}
	if r.Term == 0 {
		errs = append(errs, errors.New("term 0"))
	}
	if err := CheckID(r.Holder); err != nil {
		errs = append(errs, fmt.Errorf("holder: %w", err))
	}
	if r.SinceUS <= 0 || r.ExpiresUS < 0 {
		errs = append(errs, fmt.Errorf("times since_us %d, expires_us %d", r.SinceUS, r.ExpiresUS))
	}
	if err := errors.Join(errs...); err != nil {
		return r, fmt.Errorf("gossip: election record: %w", err)
	}
	return r, nil
}

// HeldAt reports whether the record is still held at wall time nowUS
// (Unix µs) by that clock alone, with no skew margin: what an observer
// shows, not what a candidate may take.
func (r LeaderRecord) HeldAt(nowUS int64) bool { return nowUS < r.ExpiresUS }

// Clocks is one reading of a candidate's two clocks, in microseconds.
// Records carry and are judged by the wall clock; the leader's own
// deadline runs on the monotonic clock, so a wall clock stepped back
// cannot stretch a leadership its record no longer covers.
type Clocks struct {
	Wall int64 // Unix µs
	Mono int64 // µs since any fixed origin; never decreases
}

// OpKind is what a KVOp asks the shell to do.
type OpKind uint8

const (
	// OpNone: nothing to do (Stop of a candidate that was not leading).
	OpNone OpKind = iota
	// OpWait: call Step again at monotonic time Until (earlier is harmless).
	OpWait
	// OpRead: Get the election key.
	OpRead
	// OpCreate: Create the key with Value.
	OpCreate
	// OpUpdate: Update the key to Value at revision Rev.
	OpUpdate
)

var opNames = [...]string{OpNone: "none", OpWait: "wait", OpRead: "read", OpCreate: "create", OpUpdate: "update"}

func (k OpKind) String() string {
	if int(k) < len(opNames) {
		return opNames[k]
	}
	return fmt.Sprintf("OpKind(%d)", k)
}

// KVOp is the next thing a Candidate needs done on the election key.
type KVOp struct {
	Kind  OpKind
	Value []byte // OpCreate, OpUpdate: the encoded LeaderRecord to write
	Rev   uint64 // OpUpdate: the revision the key must still have
	// Until is a monotonic time in µs. OpWait: when to Step again.
	// OpRead, OpCreate, OpUpdate: when to give up on the call and report
	// it failed (its outcome then unknown). The shell must answer by
	// then: a leader notices its deadline only when it steps, so a call
	// left hanging past Until stretches its belief that it leads.
	Until int64
}

// KVResult is the outcome of the last KVOp, fed back to Step. After an
// OpWait it is ignored (pass the zero value).
type KVResult struct {
	Value []byte // OpRead: the value read
	Rev   uint64 // OpRead: its revision; OpCreate, OpUpdate: the revision written
	// Err is nil on success; ErrNotFound from OpRead when the key is
	// absent; ErrConflict from OpCreate or OpUpdate when the key exists
	// or moved; any other error leaves the outcome unknown.
	Err error
}

// ElectionEventKind says what an ElectionEvent reports.
type ElectionEventKind uint8

const (
	// Elected: this candidate leads Term, from the record at Rev.
	Elected ElectionEventKind = iota + 1
	// Deposed: this candidate no longer leads Term, because Why.
	Deposed
	// LostRace: another candidate took Term first (compare-and-set lost).
	LostRace
	// WonTooLate: the write taking Term succeeded, but only after a whole
	// TTL: its record had lapsed already, so it is not leadership.
	WonTooLate
	// BadRecord: the record at Rev is not a valid LeaderRecord (Err); no
	// election until an operator fixes or deletes it. Reported once per
	// revision.
	BadRecord
	// OpFailed: an operation failed (Err), its outcome unknown; Why names
	// it ("read leader key", "take leader key", "renew"). It is retried at
	// the next poll or renewal.
	OpFailed
)

var electionEventNames = [...]string{Elected: "elected", Deposed: "deposed", LostRace: "lost race", WonTooLate: "won too late", BadRecord: "bad record", OpFailed: "op failed"}

func (k ElectionEventKind) String() string {
	if int(k) < len(electionEventNames) && electionEventNames[k] != "" {
		return electionEventNames[k]
	}
	return fmt.Sprintf("ElectionEventKind(%d)", k)
}

// ElectionEvent is something that happened to a Candidate, for the
// shell's callbacks and logs.
type ElectionEvent struct {
	Kind ElectionEventKind
	Term uint64 // Elected, Deposed, LostRace, WonTooLate; OpFailed when taking or renewing
	Rev  uint64 // Elected, BadRecord
	Why  string // Deposed, OpFailed
	Err  error  // BadRecord, OpFailed
}

// Reasons a leader is deposed.
const (
	WhyStopped    = "stopped"             // the shell ended the campaign (Stop)
	WhyMoved      = "leader key moved"    // a renewal lost its compare-and-set
	WhyNotRenewed = "not renewed in time" // the deadline passed without a successful renewal
)

// Candidate is one candidate's election as a state machine over the
// election key: it reads the key every Poll (jittered), takes it with
// term 1 when absent (Create) or term + 1 when its record's expiry plus
// MaxSkew has passed on this wall clock (Update on the revision read), and
// while leading renews it every Renew (Update on its own last revision,
// expiry now + TTL). A leader is deposed when a renewal loses its
// compare-and-set or when TTL has passed on its monotonic clock since it
// sent its last successful write. A record naming this candidate's own ID
// gets no favour. An invalid record blocks the election: taking it would
// need a term nobody can know. Either term is at least one above the
// floor (SetFloor): the newest table term the candidate has seen.
//
// With wall clocks that differ by less than MaxSkew, a successor is
// elected only after the previous leader's deadline: no two candidates
// believe they lead at once. The election still is not the fence (see
// the package's Election section).
//
// The shell calls Step with the outcome of the op it last performed and
// does what it returns; Stop ends the campaign. A Candidate reads no
// clock and does no I/O; it is not safe for concurrent use.
type Candidate struct {
	id                     string
	ttl, renew, poll, skew int64 // µs
	rng                    *rand.Rand

	phase candPhase
	at    int64 // candWait: when to act (mono)
	until int64 // candRead, candTake: the read's and take's common deadline (mono)

	sent    int64        // candTake, candRenew: when the write was sent (mono)
	pending LeaderRecord // candTake, candRenew: the record being written

	floor uint64 // SetFloor: the highest term known held

	leading  bool
	rec      LeaderRecord // leading: the record last written
	rev      uint64       // its revision
	deadline int64        // leading: leadership ends here (mono): last write sent + TTL

	badRev uint64 // the revision of the last invalid record reported
}

type candPhase uint8

const (
	candWait  candPhase = iota // until at
	candRead                   // a read is out
	candTake                   // a Create or Update taking the key is out
	candRenew                  // a renewal is out
)

// NewCandidate returns a follower that reads the key at its first Step.
// rng jitters its polls; the simulator passes a seeded one.
func NewCandidate(cfg ElectionConfig, rng *rand.Rand) (*Candidate, error) {
	var errs []error
	if err := CheckID(cfg.ID); err != nil {
		errs = append(errs, fmt.Errorf("id: %w", err))
	}
	if cfg.TTL < time.Microsecond {
		errs = append(errs, fmt.Errorf("ttl %v: must be at least 1µs", cfg.TTL))
	}
	if cfg.Renew < time.Microsecond || cfg.Renew > cfg.TTL {
		errs = append(errs, fmt.Errorf("renew %v: must be in [1µs, ttl]", cfg.Renew))
	}
	if cfg.Poll < time.Microsecond {
		errs = append(errs, fmt.Errorf("poll %v: must be at least 1µs", cfg.Poll))
	}
	if cfg.MaxSkew < 0 {
		errs = append(errs, fmt.Errorf("max skew %v: must not be negative", cfg.MaxSkew))
	}
	if rng == nil {
		errs = append(errs, errors.New("nil rand source"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("protocol: candidate: %w", err)
	}
	return &Candidate{
		id:    cfg.ID,
		ttl:   cfg.TTL.Microseconds(),
		renew: cfg.Renew.Microseconds(),
		poll:  cfg.Poll.Microseconds(),
		skew:  cfg.MaxSkew.Microseconds(),
		rng:   rng,
		at:    math.MinInt64,
	}, nil
}

// Leading returns the term this candidate believes it leads, ok false
// when it is a follower.
func (c *Candidate) Leading() (term uint64, ok bool) {
	if !c.leading {
		return 0, false
	}
	return c.rec.Term, true
}

// Step advances the candidate to now: res is the outcome of the op the
// previous Step returned (ignored after an OpWait, and at the first
// call). It returns the next op, never OpNone, and what happened.
func (c *Candidate) Step(now Clocks, res KVResult) (KVOp, []ElectionEvent) {
	switch c.phase {
	case candRead:
		return c.afterRead(now, res)
	case candTake:
		return c.afterTake(now, res)
	case candRenew:
		return c.afterRenew(now, res)
	}
	if c.leading && now.Mono >= c.deadline {
		ev := c.depose(WhyNotRenewed)
		return c.waitPoll(now), []ElectionEvent{ev}
	}
	if now.Mono < c.at {
		return c.wait(), nil
	}
	if c.leading {
		return c.sendRenewal(now), nil
	}
	c.phase, c.until = candRead, now.Mono+c.ttl
	return KVOp{Kind: OpRead, Until: c.until}, nil
}

// Stop ends the campaign at now. A leader is deposed (why, WhyStopped for
// a clean stop) and the returned OpUpdate releases the key — its record
// with expiry 0 on its revision, so that a follower takes over at its next
// read instead of waiting for TTL — which the shell performs if it still
// can (best effort; its outcome is not fed back). Otherwise it returns
// OpNone. An op in flight is abandoned. A later Step campaigns anew, as a
// follower reading at its next poll.
func (c *Candidate) Stop(now Clocks, why string) (KVOp, []ElectionEvent) {
	c.phase = candWait
	if !c.leading {
		return KVOp{}, nil
	}
	ev := c.depose(why)
	c.waitPoll(now)
	rel := c.rec
	rel.ExpiresUS = 0
	return KVOp{Kind: OpUpdate, Value: rel.Encode(), Rev: c.rev, Until: now.Mono + c.ttl}, []ElectionEvent{ev}
}

// SetFloor tells the candidate the highest term it knows a coordinator
// held — the newest table it has seen — so that a take uses a term above
// it whatever the key holds. The key can be lost with its bucket, and the
// next election would then start again at term 1, below the tables every
// agent holds: they would refuse the new coordinator's tables as older
// (issue 17, defect 3; explorer schedule 4 of seed 1). The floor only
// rises; the shell sets it before each Step.
func (c *Candidate) SetFloor(term uint64) { c.floor = max(c.floor, term) }

// afterRead decides from what the key holds whether to take it.
func (c *Candidate) afterRead(now Clocks, res KVResult) (KVOp, []ElectionEvent) {
	if c.floor == math.MaxUint64 {
		return c.waitPoll(now), []ElectionEvent{{Kind: BadRecord, Err: errors.New("gossip: election: the term floor is at its maximum: no next term")}}
	}
	term, rev := c.floor+1, uint64(0)
	switch {
	case errors.Is(res.Err, ErrNotFound):
	case res.Err != nil:
		return c.waitPoll(now), []ElectionEvent{{Kind: OpFailed, Why: "read leader key", Err: res.Err}}
	default:
		r, err := ParseLeaderRecord(res.Value)
		if err == nil && r.Term == math.MaxUint64 {
			err = errors.New("gossip: election record: term at its maximum: no next term")
		}
		if err != nil {
			var evs []ElectionEvent
			if res.Rev != c.badRev {
				c.badRev = res.Rev
				evs = append(evs, ElectionEvent{Kind: BadRecord, Rev: res.Rev, Err: err})
			}
			return c.waitPoll(now), evs
		}
		if now.Wall <= heldThrough(r, c.skew) {
			return c.waitPoll(now), nil // held
		}
		term, rev = max(r.Term+1, c.floor+1), res.Rev
	}
	c.phase, c.sent = candTake, now.Mono
	c.pending = LeaderRecord{Term: term, Holder: c.id, SinceUS: now.Wall, ExpiresUS: now.Wall + c.ttl}
	if rev == 0 {
		return KVOp{Kind: OpCreate, Value: c.pending.Encode(), Until: c.until}, nil
	}
	return KVOp{Kind: OpUpdate, Value: c.pending.Encode(), Rev: rev, Until: c.until}, nil
}

// afterTake makes a won take leadership, unless it came too late.
func (c *Candidate) afterTake(now Clocks, res KVResult) (KVOp, []ElectionEvent) {
	term := c.pending.Term
	switch {
	case errors.Is(res.Err, ErrConflict):
		return c.waitPoll(now), []ElectionEvent{{Kind: LostRace, Term: term}}
	case res.Err != nil:
		// If it was written, the record names us and lapses after TTL
		// like any other.
		return c.waitPoll(now), []ElectionEvent{{Kind: OpFailed, Term: term, Why: "take leader key", Err: res.Err}}
	case now.Mono-c.sent >= c.ttl:
		return c.waitPoll(now), []ElectionEvent{{Kind: WonTooLate, Term: term}}
	}
	c.leading, c.rec, c.rev, c.deadline = true, c.pending, res.Rev, c.sent+c.ttl
	return c.waitRenew(now), []ElectionEvent{{Kind: Elected, Term: term, Rev: res.Rev}}
}

// sendRenewal writes the leader's record with its expiry pushed to now + TTL.
func (c *Candidate) sendRenewal(now Clocks) KVOp {
	c.phase, c.sent = candRenew, now.Mono
	c.pending = c.rec
	c.pending.ExpiresUS = now.Wall + c.ttl
	return KVOp{Kind: OpUpdate, Value: c.pending.Encode(), Rev: c.rev, Until: c.deadline}
}

// afterRenew keeps or ends the leadership.
func (c *Candidate) afterRenew(now Clocks, res KVResult) (KVOp, []ElectionEvent) {
	switch {
	case errors.Is(res.Err, ErrConflict):
		ev := c.depose(WhyMoved)
		return c.waitPoll(now), []ElectionEvent{ev}
	case res.Err != nil && now.Mono >= c.deadline:
		ev := c.depose(WhyNotRenewed)
		return c.waitPoll(now), []ElectionEvent{ev}
	case res.Err != nil:
		return c.waitRenew(now), []ElectionEvent{{Kind: OpFailed, Term: c.rec.Term, Why: "renew", Err: res.Err}}
	}
	c.rec, c.rev, c.deadline = c.pending, res.Rev, c.sent+c.ttl
	if now.Mono >= c.deadline {
		// Written, but answered a whole TTL after it was sent: the
		// record it wrote has lapsed already.
		ev := c.depose(WhyNotRenewed)
		return c.waitPoll(now), []ElectionEvent{ev}
	}
	return c.waitRenew(now), nil
}

func (c *Candidate) depose(why string) ElectionEvent {
	c.leading = false
	return ElectionEvent{Kind: Deposed, Term: c.rec.Term, Why: why}
}

// waitPoll waits a jittered Poll, so that followers do not all race at once.
func (c *Candidate) waitPoll(now Clocks) KVOp {
	c.phase, c.at = candWait, now.Mono+c.poll-c.rng.Int64N(c.poll/4+1)
	return c.wait()
}

// waitRenew waits Renew, or less when the deadline comes first.
func (c *Candidate) waitRenew(now Clocks) KVOp {
	c.phase, c.at = candWait, now.Mono+c.renew
	return c.wait()
}

func (c *Candidate) wait() KVOp {
	until := c.at
	if c.leading && c.deadline < until {
		until = c.deadline
	}
	return KVOp{Kind: OpWait, Until: until}
}

// heldThrough is the last wall time at which r is held for a candidate
// allowing skew µs (≥ 0): its expiry + skew, saturating at MaxInt64 so
// that a foreign record's expiry near the top of the range stays held.
func heldThrough(r LeaderRecord, skew int64) int64 {
	if r.ExpiresUS > math.MaxInt64-skew {
		return math.MaxInt64
	}
	return r.ExpiresUS + skew
}
