package gossip

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/meridian-quota/meridian/gossip/protocol"
)

// ElectionConfig times one candidate's campaign (see [Election.Campaign]).
// A zero TTL is 3 s; a zero Renew is TTL/3 and a zero Poll TTL/6.
type ElectionConfig struct {
	// ID names this candidate in the election record, e.g. "eu/eu-1";
	// 1 to 256 bytes of printable UTF-8. Candidates need distinct IDs.
	ID string `yaml:"id"`
	// TTL is how long leadership lasts after the last renewal: the
	// longest a dead leader's successor waits (plus the clock-skew
	// margin), and the longest a cut-off leader keeps leading.
	TTL time.Duration `yaml:"ttl"`
	// Renew is the leader's renewal period: several renewals fit in a TTL
	// so that one lost request does not depose it. At most TTL/2.
	Renew time.Duration `yaml:"renew"`
	// Poll is how often a follower reads the election key; with a
	// released key (the leader stopped cleanly) it is the failover time.
	Poll time.Duration `yaml:"poll"`
}

// DefaultElectionConfig returns the default timings (ID must still be set).
func DefaultElectionConfig() ElectionConfig {
	return ElectionConfig{
		TTL:   3 * time.Second,        // a crashed coordinator is replaced within a few seconds, well inside a table lease
		Renew: time.Second,            // three renewals per TTL: one slow or lost request is survived
		Poll:  500 * time.Millisecond, // followers notice a released or lapsed key within half a second
	}
}

// withDefaults fills the zero timings (see ElectionConfig).
func (c ElectionConfig) withDefaults() ElectionConfig {
	if c.TTL == 0 {
		c.TTL = 3 * time.Second
	}
	if c.Renew == 0 {
		c.Renew = c.TTL / 3
	}
	if c.Poll == 0 {
		c.Poll = c.TTL / 6
	}
	return c
}

// Validate reports every problem with c (after the zero timings are
// filled), each with its field path.
func (c ElectionConfig) Validate() error {
	c = c.withDefaults()
	var errs []error
	bad := func(field, format string, a ...any) {
		errs = append(errs, fmt.Errorf("election.%s: %s", field, fmt.Sprintf(format, a...)))
	}
	if err := protocol.CheckID(c.ID); err != nil {
		bad("id", "%v", err)
	}
	if c.TTL < 10*time.Millisecond {
		bad("ttl", "%v: must be at least 10ms", c.TTL)
	}
	if c.Renew <= 0 || c.Renew > c.TTL/2 {
		bad("renew", "%v: must be in (0, ttl/2 = %v]", c.Renew, c.TTL/2)
	}
	if c.Poll <= 0 || c.Poll > c.TTL {
		bad("poll", "%v: must be in (0, ttl = %v]", c.Poll, c.TTL)
	}
	return errors.Join(errs...)
}

// Leadership is who holds the coordinator role according to the KV.
type Leadership struct {
	Term    uint64    // the fencing term, 1 for the first leader ever, +1 per change of holder
	ID      string    // the holder's ElectionConfig.ID
	Since   time.Time // when the holder took this term (its clock)
	Expires time.Time // when the holder's last renewal lapses (its clock)
}

// Election is the coordinator election over one key of a protocol.KV:
// the NATS bucket's <cluster>.leader ([Transport.Election]) or any other
// KV with the same compare-and-set semantics (gossip/memnet's, in tests).
// Its zero value is not usable; an Election is a value, safe to copy and
// for concurrent use as far as its KV is.
type Election struct {
	// KV is the bucket the record lives in.
	KV protocol.KV
	// Key is the election record's key in KV.
	Key string
	// Closed, when closed, ends a Campaign with ErrClosed: the KV's owner
	// was shut down. Nil: never.
	Closed <-chan struct{}
	// Log receives the campaign's events (nil: discarded).
	Log *slog.Logger
	// TermFloor, when set, returns the newest table term this candidate
	// has seen; it takes no term at or below it (protocol.Candidate's
	// SetFloor), so terms keep rising even when the record is lost with
	// its bucket.
	TermFloor func() uint64

	// wrap names a KV error for Leader (nil: "gossip: <what>: err").
	wrap func(what string, err error) error
}

// Election returns the election over this transport's bucket, on the key
// <cluster>.leader; Campaign ends with ErrClosed once the transport is
// closed.
func (t *Transport) Election() Election {
	return Election{KV: natsKV{t.kv}, Key: t.keyPre + keyLeader, Closed: t.closed, Log: t.log, wrap: t.kvErr}
}

// Leader is [Election.Leader] on the transport's election.
func (t *Transport) Leader(ctx context.Context) (Leadership, bool, error) {
	return t.Election().Leader(ctx)
}

// Campaign is [Election.Campaign] on the transport's election: it returns
// ErrClosed once the transport is closed.
func (t *Transport) Campaign(ctx context.Context, cfg ElectionConfig, maxSkew time.Duration, onElected, onDeposed func(term uint64)) error {
	return t.Election().Campaign(ctx, cfg, maxSkew, onElected, onDeposed)
}

// Leader returns the holder of the election key per the KV, ok=false when
// nobody holds it (never elected, released, or lapsed by this process's
// clock). It reads a KV replica, so it may lag a change by a moment.
func (e Election) Leader(ctx context.Context) (Leadership, bool, error) {
	v, _, err := e.KV.Get(ctx, e.Key)
	if errors.Is(err, protocol.ErrNotFound) {
		return Leadership{}, false, nil
	}
	if err != nil {
		if e.wrap != nil {
			return Leadership{}, false, e.wrap("read leader", err)
		}
		return Leadership{}, false, fmt.Errorf("gossip: read leader: %w", err)
	}
	r, err := protocol.ParseLeaderRecord(v)
	if err != nil {
		return Leadership{}, false, err
	}
	l := Leadership{Term: r.Term, ID: r.Holder, Since: time.UnixMicro(r.SinceUS), Expires: time.UnixMicro(r.ExpiresUS)}
	return l, r.HeldAt(time.Now().UnixMicro()), nil
}

// Campaign stands for coordinator until ctx ends (it then returns nil) or
// e.Closed is closed (ErrClosed). A configuration error is returned at
// once.
//
// The election key (<cluster>.leader on NATS) holds a record (term,
// holder, expiry). A follower reads it every Poll and takes it when it is
// absent (Create, term 1) or when its expiry has passed on the follower's clock by more
// than maxSkew (Update on the observed revision, term + 1): the
// compare-and-set lets exactly one of several followers win. The leader
// renews every Renew with an Update on its own last revision, pushing the
// expiry to now + TTL. It is deposed when an update fails because the
// revision moved, or when TTL has passed since it sent its last
// successful renewal (by its monotonic clock, so a successor, which waits
// for the same expiry plus maxSkew on its own clock, starts only after
// the old leader stopped, provided the clocks differ by less than maxSkew).
// A record naming this candidate's own ID gets no favour: a restarted
// candidate waits for its earlier record to lapse like everyone else. The
// key is never deleted (releasing updates it), so terms keep increasing.
// These decisions are protocol.Candidate's; Campaign performs its
// operations on the bucket, keeps its timers and logs.
//
// onElected(term) is called when this candidate becomes leader and
// onDeposed(term) when it stops, including when ctx ends (after which the
// key is released — updated with expiry 0 — so a successor need not wait
// for TTL) and when e.Closed is closed. Both run on the Campaign
// goroutine, alternate strictly starting with onElected, and must return
// quickly: renewals wait for them. Nil callbacks are allowed.
//
// # The election is not the fence
//
// A leader cut off from NATS, paused by the garbage collector or by a
// stalled VM may not learn it was deposed until after its successor is
// elected. The election only keeps contention rare; what keeps a deposed
// coordinator from publishing is StoreTable's compare-and-set on the head
// revision: its successor's first write moves the head, and every later
// write based on the old revision fails with ErrFenced. Coordinators must
// therefore store each table on the revision they last wrote or read,
// never blindly.
func (e Election) Campaign(ctx context.Context, cfg ElectionConfig, maxSkew time.Duration, onElected, onDeposed func(term uint64)) error {
	var errs []error
	if err := cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	if maxSkew < 0 {
		errs = append(errs, fmt.Errorf("max skew %v: must not be negative", maxSkew))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("gossip: campaign: %w", err)
	}
	if onElected == nil {
		onElected = func(uint64) {}
	}
	if onDeposed == nil {
		onDeposed = func(uint64) {}
	}
	cfg = cfg.withDefaults()
	log := e.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	pcfg := protocol.ElectionConfig{ID: cfg.ID, TTL: cfg.TTL, Renew: cfg.Renew, Poll: cfg.Poll, MaxSkew: maxSkew}
	cand, err := protocol.NewCandidate(pcfg, rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())))
	if err != nil {
		return fmt.Errorf("gossip: campaign: %w", err) // Validate admits only what a candidate runs
	}
	c := &campaign{
		kv:        e.KV,
		key:       e.Key,
		closed:    e.Closed,
		cand:      cand,
		base:      time.Now(),
		onElected: onElected,
		onDeposed: onDeposed,
		floor:     e.TermFloor,
		log:       log.With("candidate", cfg.ID),
	}
	return c.run(ctx)
}

// campaign is the shell of one Campaign call, owned by its goroutine: it
// performs the candidate's operations, waits its waits and reports its
// events.
type campaign struct {
	kv        protocol.KV
	key       string
	closed    <-chan struct{}
	cand      *protocol.Candidate
	base      time.Time // the origin of the candidate's monotonic clock
	onElected func(uint64)
	onDeposed func(uint64)
	floor     func() uint64 // nil: none
	log       *slog.Logger
}

// step is the candidate's Step, its floor set first.
func (c *campaign) step(res protocol.KVResult) (protocol.KVOp, []protocol.ElectionEvent) {
	if c.floor != nil {
		c.cand.SetFloor(c.floor())
	}
	return c.cand.Step(c.now(), res)
}

// now reads both clocks at once: the wall clock, and base's monotonic
// reading for the leader's deadline.
func (c *campaign) now() protocol.Clocks {
	n := time.Now()
	return protocol.Clocks{Wall: n.UnixMicro(), Mono: n.Sub(c.base).Microseconds()}
}

// at is the instant of the candidate's monotonic time mono µs.
func (c *campaign) at(mono int64) time.Time {
	return c.base.Add(time.Duration(mono) * time.Microsecond)
}

func (c *campaign) run(ctx context.Context) error {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	op, evs := c.step(protocol.KVResult{})
	for {
		c.report(evs)
		var res protocol.KVResult
		if op.Kind == protocol.OpWait {
			timer.Reset(time.Until(c.at(op.Until)))
			select {
			case <-ctx.Done():
				c.stop(ctx, protocol.WhyStopped, true)
				return nil
			case <-c.closed:
				c.stop(ctx, "transport closed", false)
				return ErrClosed
			case <-timer.C:
			}
		} else {
			res = c.do(ctx, op)
			if res.Err != nil && !errors.Is(res.Err, protocol.ErrConflict) && ctx.Err() != nil {
				// Cut short by the end of the campaign, not by the
				// bucket: no verdict on the leadership but "stopped".
				c.stop(ctx, protocol.WhyStopped, true)
				return nil
			}
		}
		op, evs = c.step(res)
	}
}

// do performs one read or write, bounded by the op's deadline.
func (c *campaign) do(ctx context.Context, op protocol.KVOp) protocol.KVResult {
	octx, cancel := context.WithDeadline(ctx, c.at(op.Until))
	defer cancel()
	var r protocol.KVResult
	switch op.Kind {
	case protocol.OpRead:
		r.Value, r.Rev, r.Err = c.kv.Get(octx, c.key)
	case protocol.OpCreate:
		r.Rev, r.Err = c.kv.Create(octx, c.key, op.Value)
	case protocol.OpUpdate:
		r.Rev, r.Err = c.kv.Update(octx, c.key, op.Value, op.Rev)
	default:
		r.Err = fmt.Errorf("gossip: campaign: unexpected op %v", op.Kind)
	}
	return r
}

// stop ends the candidate and, when release and it led, releases the
// key so that a follower takes over at its next poll; best effort,
// bounded by TTL, and not cut short by ctx.
func (c *campaign) stop(ctx context.Context, why string, release bool) {
	op, evs := c.cand.Stop(c.now(), why)
	c.report(evs)
	if !release || op.Kind != protocol.OpUpdate {
		return
	}
	octx, cancel := context.WithDeadline(context.WithoutCancel(ctx), c.at(op.Until))
	defer cancel()
	if _, err := c.kv.Update(octx, c.key, op.Value, op.Rev); err != nil {
		term := uint64(0)
		for _, ev := range evs {
			term = ev.Term
		}
		c.log.Debug("election: release", "term", term, "err", err)
	}
}

// report logs the candidate's events and calls the callbacks.
func (c *campaign) report(evs []protocol.ElectionEvent) {
	for _, ev := range evs {
		switch ev.Kind {
		case protocol.Elected:
			c.log.Info("election: elected", "term", ev.Term, "revision", ev.Rev)
			c.onElected(ev.Term)
		case protocol.Deposed:
			c.log.Info("election: deposed", "term", ev.Term, "reason", ev.Why)
			c.onDeposed(ev.Term)
		case protocol.LostRace:
			c.log.Debug("election: another candidate won", "term", ev.Term)
		case protocol.WonTooLate:
			c.log.Warn("election: won too late to lead", "term", ev.Term)
		case protocol.BadRecord:
			c.log.Error("election: invalid leader record; no election until it is fixed or deleted", "revision", ev.Rev, "err", ev.Err)
		case protocol.OpFailed:
			if ev.Term == 0 {
				c.log.Debug("election: "+ev.Why, "err", ev.Err)
			} else {
				c.log.Debug("election: "+ev.Why, "term", ev.Term, "err", ev.Err)
			}
		}
	}
}
