package gossip

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"
)

// ElectionConfig times one candidate's campaign (see [Transport.Campaign]).
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
	if err := checkID(c.ID); err != nil {
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

// checkID validates a candidate or holder ID.
func checkID(id string) error {
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

// Leadership is who holds the coordinator role according to the KV.
type Leadership struct {
	Term    uint64    // the fencing term, 1 for the first leader ever, +1 per change of holder
	ID      string    // the holder's ElectionConfig.ID
	Since   time.Time // when the holder took this term (its clock)
	Expires time.Time // when the holder's last renewal lapses (its clock)
}

// leaderRecord is the value of <cluster>.leader, JSON-encoded:
//
//	{"v":1,"term":7,"holder":"eu/eu-1","since_us":1730000000000000,"expires_us":1730000003000000}
//
// Times are Unix microseconds of the writer's clock. A released record
// keeps term and holder and has expires_us 0.
type leaderRecord struct {
	V         int    `json:"v"`
	Term      uint64 `json:"term"`
	Holder    string `json:"holder"`
	SinceUS   int64  `json:"since_us"`
	ExpiresUS int64  `json:"expires_us"`
}

const leaderRecordVersion = 1

func parseLeader(b []byte) (leaderRecord, error) {
	var r leaderRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("gossip: election record: not JSON: %w", err)
	}
	var errs []error
	if r.V != leaderRecordVersion {
		errs = append(errs, fmt.Errorf("version %d, want %d", r.V, leaderRecordVersion))
	}
	if r.Term == 0 {
		errs = append(errs, errors.New("term 0"))
	}
	if err := checkID(r.Holder); err != nil {
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

func (r leaderRecord) encode() []byte {
	b, err := json.Marshal(r)
	if err != nil {
		panic(err) // plain struct: never fails
	}
	return b
}

// Leader returns the holder of the election key per the KV, ok=false when
// nobody holds it (never elected, released, or lapsed by this process's
// clock). It reads a KV replica, so it may lag a change by a moment.
func (t *Transport) Leader(ctx context.Context) (Leadership, bool, error) {
	e, err := t.kv.Get(ctx, t.keyPre+keyLeader)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Leadership{}, false, nil
	}
	if err != nil {
		return Leadership{}, false, t.kvErr("read leader", err)
	}
	r, err := parseLeader(e.Value())
	if err != nil {
		return Leadership{}, false, err
	}
	l := Leadership{Term: r.Term, ID: r.Holder, Since: time.UnixMicro(r.SinceUS), Expires: time.UnixMicro(r.ExpiresUS)}
	return l, time.Now().UnixMicro() < r.ExpiresUS, nil
}

// Campaign stands for coordinator until ctx ends (it then returns nil) or
// the transport is closed (ErrClosed). A configuration error is returned
// at once.
//
// The election key <cluster>.leader holds a record (term, holder, expiry).
// A follower reads it every Poll and takes it when it is absent (Create,
// term 1) or when its expiry has passed on the follower's clock by more
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
//
// onElected(term) is called when this candidate becomes leader and
// onDeposed(term) when it stops, including when ctx ends (after which the
// key is released — updated with expiry 0 — so a successor need not wait
// for TTL) and when the transport closes. Both run on the Campaign
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
func (t *Transport) Campaign(ctx context.Context, cfg ElectionConfig, maxSkew time.Duration, onElected, onDeposed func(term uint64)) error {
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
	c := &campaign{
		t:         t,
		cfg:       cfg.withDefaults(),
		skew:      maxSkew,
		key:       t.keyPre + keyLeader,
		onElected: onElected,
		onDeposed: onDeposed,
		log:       t.log.With("candidate", cfg.ID),
	}
	return c.run(ctx)
}

// campaign is the state of one Campaign call, owned by its goroutine.
type campaign struct {
	t         *Transport
	cfg       ElectionConfig
	skew      time.Duration
	key       string
	onElected func(uint64)
	onDeposed func(uint64)
	log       *slog.Logger

	leader   bool
	rec      leaderRecord // the record last written while leader
	rev      uint64       // its revision
	deadline time.Time    // leadership ends here (monotonic): last renewal sent + TTL
	badRev   uint64       // revision of the last invalid record logged
}

func (c *campaign) run(ctx context.Context) error {
	timer := time.NewTimer(0) // follower: next poll; leader: next renewal
	defer timer.Stop()
	lapse := time.NewTimer(time.Hour) // leader: the deadline
	lapse.Stop()
	defer lapse.Stop()
	for {
		select {
		case <-ctx.Done():
			if c.leader {
				c.depose("stopped")
				c.release(ctx)
			}
			return nil
		case <-c.t.closed:
			if c.leader {
				c.depose("transport closed")
			}
			return ErrClosed
		case <-lapse.C:
			if c.leader {
				c.depose("not renewed in time")
				timer.Reset(c.jitter(c.cfg.Poll))
			}
		case <-timer.C:
			if c.leader {
				c.renew(ctx)
			} else {
				c.try(ctx)
			}
			if c.leader {
				lapse.Reset(time.Until(c.deadline))
				timer.Reset(c.cfg.Renew)
			} else {
				lapse.Stop()
				timer.Reset(c.jitter(c.cfg.Poll))
			}
		}
	}
}

// jitter spreads followers' polls so they do not all race at once.
func (c *campaign) jitter(d time.Duration) time.Duration {
	return d - rand.N(d/4+1)
}

// try reads the election key and takes it if it is free.
func (c *campaign) try(ctx context.Context) {
	octx, cancel := context.WithTimeout(ctx, c.cfg.TTL)
	defer cancel()
	e, err := c.t.kv.Get(octx, c.key)
	term, rev := uint64(1), uint64(0)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
	case err != nil:
		c.log.Debug("election: read leader key", "err", err)
		return
	default:
		r, err := parseLeader(e.Value())
		if err != nil {
			// Only a foreign writer produces this; taking the key would
			// need a term we cannot know, so leave it to an operator.
			if e.Revision() != c.badRev {
				c.badRev = e.Revision()
				c.log.Error("election: invalid leader record; no election until it is fixed or deleted", "revision", e.Revision(), "err", err)
			}
			return
		}
		if time.Now().UnixMicro() <= r.ExpiresUS+c.skew.Microseconds() {
			return // held
		}
		term, rev = r.Term+1, e.Revision()
	}
	sent := time.Now()
	rec := leaderRecord{V: leaderRecordVersion, Term: term, Holder: c.cfg.ID, SinceUS: sent.UnixMicro(), ExpiresUS: sent.Add(c.cfg.TTL).UnixMicro()}
	if rev == 0 {
		rev, err = c.t.kv.Create(octx, c.key, rec.encode())
	} else {
		rev, err = c.t.kv.Update(octx, c.key, rec.encode(), rev)
	}
	switch {
	case isConflict(err):
		c.log.Debug("election: another candidate won", "term", term)
		return
	case err != nil:
		// Outcome unknown; if it was written, the record names us and
		// lapses after TTL like any other.
		c.log.Debug("election: take leader key", "term", term, "err", err)
		return
	}
	if time.Since(sent) >= c.cfg.TTL {
		// The write took a whole TTL: the record has lapsed already.
		c.log.Warn("election: won too late to lead", "term", term)
		return
	}
	c.leader, c.rec, c.rev, c.deadline = true, rec, rev, sent.Add(c.cfg.TTL)
	c.log.Info("election: elected", "term", term, "revision", rev)
	c.onElected(term)
}

// renew pushes the leader's expiry forward, or deposes it.
func (c *campaign) renew(ctx context.Context) {
	octx, cancel := context.WithDeadline(ctx, c.deadline)
	defer cancel()
	sent := time.Now()
	rec := c.rec
	rec.ExpiresUS = sent.Add(c.cfg.TTL).UnixMicro()
	rev, err := c.t.kv.Update(octx, c.key, rec.encode(), c.rev)
	switch {
	case isConflict(err):
		c.depose("leader key moved")
	case err != nil && ctx.Err() == nil && !time.Now().Before(c.deadline):
		c.depose("not renewed in time")
	case err != nil:
		c.log.Debug("election: renew", "term", c.rec.Term, "err", err) // retried at the next period
	default:
		c.rec, c.rev, c.deadline = rec, rev, sent.Add(c.cfg.TTL)
	}
}

// depose ends this candidate's leadership.
func (c *campaign) depose(why string) {
	c.leader = false
	c.log.Info("election: deposed", "term", c.rec.Term, "reason", why)
	c.onDeposed(c.rec.Term)
}

// release marks the record expired so that a follower takes over at its
// next poll; best effort, bounded by TTL.
func (c *campaign) release(ctx context.Context) {
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.TTL)
	defer cancel()
	rec := c.rec
	rec.ExpiresUS = 0
	if _, err := c.t.kv.Update(octx, c.key, rec.encode(), c.rev); err != nil {
		c.log.Debug("election: release", "term", rec.Term, "err", err)
	}
}
