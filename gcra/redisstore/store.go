package redisstore

import (
	"context"
	_ "embed"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/meridian-quota/meridian/gcra"
)

//go:embed gcra.lua
var luaSource string

var script = redis.NewScript(luaSource)

// scripter is what the store needs of a go-redis client: EVALSHA, and EVAL
// when the server answers NOSCRIPT (redis.Script.Run does that).
type scripter interface {
	redis.Scripter
}

// Errors. ErrCrossSlot, ErrBadInput and ErrMalformedState are about the
// call or one key's data, not about Redis: Redis answered, or was never
// asked. They have a method StoreHealthy() bool that returns true, so a
// caller's circuit breaker can tell them from Redis failing (region/agent's
// counts none of them). ErrReply and the client's own errors (time-outs,
// refused connections, Redis error replies) have no such method.
var (
	// ErrCrossSlot is returned on a Cluster for a composite check whose
	// keys do not hash to one slot; give them one Tag. Nothing is sent. A
	// single node or Sentinel has no slots and decides any composite.
	ErrCrossSlot error = &callError{"redisstore: composite keys hash to different cluster slots (give them the same gcra.Key.Tag)"}
	// ErrBadInput is wrapped around every error for input the store refuses
	// before sending anything (an invalid limit or schedule, a negative
	// cost, a key listed twice, …); the gcra error it explains stays
	// visible to errors.Is.
	ErrBadInput error = &callError{"redisstore: bad input"}
	// ErrReply is wrapped around any reply that does not have the shape
	// the script returns.
	ErrReply = errors.New("redisstore: unexpected reply from Redis")
	// ErrMalformedState is returned when a key under the store's prefix
	// holds something the script did not write. Nothing is decided, and
	// the key is left alone; other keys are unaffected.
	ErrMalformedState error = &callError{"redisstore: stored state is malformed"}

	// errNotDecided marks a composite's check that the script skipped
	// because another check's state is malformed; that one's error is
	// reported.
	errNotDecided = errors.New("redisstore: not decided")
)

// RoundTripError is the error of every decision one script call carried
// when that call failed (a time-out, a refused connection, an error reply
// from Redis), and of every decision whose caller gave up while queued
// behind it: one Redis round trip failing fails every decision batched
// into it or waiting on it, all with one RoundTripError. RoundTrip tells a
// caller's circuit breaker how many round trips failed, not how many
// decisions they carried (region/agent's counts each round trip once: a
// batch of 64 decisions that timed out once had opened a breaker set to
// open after 5 failures in a row — issue 19).
type RoundTripError struct {
	Call uint64 // the script call, numbered per Store from 1
	Err  error
}

func (e *RoundTripError) Error() string { return e.Err.Error() }
func (e *RoundTripError) Unwrap() error { return e.Err }

// RoundTrip identifies the failed script call within its Store.
func (e *RoundTripError) RoundTrip() uint64 { return e.Call }

// callError is an error about a call or one key's data, with Redis
// healthy.
type callError struct{ msg string }

func (e *callError) Error() string { return e.msg }

// StoreHealthy reports that the error is not Redis failing: true.
func (e *callError) StoreHealthy() bool { return true }

// badInput wraps err, an input the store refuses, in ErrBadInput.
func badInput(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrBadInput, err)
}

// Config configures a Store. DefaultConfig documents each default.
type Config struct {
	// Prefix starts every key the store writes. It may not contain '{' or
	// '}' (the hash tag must be the store's).
	Prefix string
	// Timeout bounds each Redis call (a batch) unless the caller's context
	// ends sooner. The go-redis client must have ContextTimeoutEnabled for
	// a deadline to cut a blocked socket read short; otherwise its
	// ReadTimeout applies.
	Timeout time.Duration
	// MaxBatch is the most checks (decisions; a composite counts each of
	// its limits) one script call carries.
	MaxBatch int
	// MaxInFlight caps the decisions submitted and not yet answered; more
	// callers wait (or fail when their context ends). A caller that gives up
	// while its decision is on the wire frees its place at once, so the cap
	// can be briefly exceeded by such decisions.
	MaxInFlight int
	// Lanes is the number of independent batch queues on a single node or
	// Sentinel client, each with one script call in flight; keys map to a
	// lane by hash slot, so one key's calls keep their order. Cluster
	// clients use one lane per slot.
	Lanes int
	// WriteFormat is the form state is written in; every form is always
	// read. FormatValue (the default) stores the exact gcra.Value.
	// FormatValue12 stores the previous release's 12-byte value (no
	// writer's limit), so that its agents, which refuse a longer value, can
	// share the Redis during a rolling upgrade from it. FormatPacked stores
	// the packed integer of releases before those, so that
	// their agents, which cannot read a Value, can share the Redis during a
	// rolling upgrade; while it is set, a limit whose window exceeds
	// gcra.V1MaxWindow (36 h, the older releases' bound) decides as the zero
	// limit (deny), and reservations may not wait past it. Switch to
	// FormatValue once no older agent is left.
	WriteFormat Format
	// FenceWait bounds how long RaiseFence waits for every connected
	// replica to confirm the region fence (WAIT); 0 means 1 s. An
	// unconfirmed raise fails, and the coordinator then waits for the
	// region's leases rather than count its acknowledgement.
	FenceWait time.Duration
}

// Format is the form a Store writes a key's state in.
type Format uint8

const (
	// FormatValue is gcra.EncodeValue's 24 bytes: the exact TAT and epoch
	// tag, read back exactly under any later schedule, and the limit it
	// was written under, so that a reader under another limit converts it.
	FormatValue Format = iota
	// FormatPacked is gcra.PackV1's integer, the form releases before
	// the 12-byte value write and read.
	FormatPacked
	// FormatValue12 is gcra.EncodeValueV2's 12 bytes, the form the release
	// before FormatValue writes (TAT and tag); its agents fail a decision on
	// a longer value. Read back, it is a state whose writer's limit is
	// unknown, converted as that release converted it.
	FormatValue12
)

// String returns "value", "value12" or "packed".
func (f Format) String() string {
	switch f {
	case FormatValue:
		return "value"
	case FormatValue12:
		return "value12"
	case FormatPacked:
		return "packed"
	}
	return fmt.Sprintf("Format(%d)", uint8(f))
}

// ParseFormat parses "value", "value12" or "packed".
func ParseFormat(s string) (Format, error) {
	switch s {
	case "value":
		return FormatValue, nil
	case "value12":
		return FormatValue12, nil
	case "packed":
		return FormatPacked, nil
	}
	return 0, fmt.Errorf("redisstore: write format %q: want value, value12 or packed", s)
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Prefix:      "meridian:", // short, and names the owner of the keys
		Timeout:     250 * time.Millisecond,
		MaxBatch:    128,  // ~5 µs of script time per op: a batch stays under a millisecond
		MaxInFlight: 4096, // far above any sane concurrency; bounds memory under overload
		Lanes:       2,    // two calls in flight hide the round trip; more split callers into small batches (measured: bench redis)
	}
}

// Validate reports every problem with c.
func (c Config) Validate() error {
	var errs []error
	if strings.ContainsAny(c.Prefix, "{}") {
		errs = append(errs, fmt.Errorf("redisstore: Prefix %q: must not contain '{' or '}'", c.Prefix))
	}
	if len(c.Prefix) > 64 {
		errs = append(errs, fmt.Errorf("redisstore: Prefix %q: longer than 64 bytes", c.Prefix))
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("redisstore: Timeout %s: must be positive", c.Timeout))
	}
	if c.MaxBatch < 1 || c.MaxBatch > 1024 {
		errs = append(errs, fmt.Errorf("redisstore: MaxBatch %d: must be in [1, 1024]", c.MaxBatch))
	}
	if c.MaxInFlight < 1 {
		errs = append(errs, fmt.Errorf("redisstore: MaxInFlight %d: must be at least 1", c.MaxInFlight))
	}
	if c.Lanes < 1 || c.Lanes > 256 {
		errs = append(errs, fmt.Errorf("redisstore: Lanes %d: must be in [1, 256]", c.Lanes))
	}
	if c.FenceWait < 0 {
		errs = append(errs, fmt.Errorf("redisstore: FenceWait %s: must not be negative", c.FenceWait))
	}
	if c.WriteFormat > FormatValue12 {
		errs = append(errs, fmt.Errorf("redisstore: WriteFormat %v: want FormatValue, FormatValue12 or FormatPacked", c.WriteFormat))
	}
	return errors.Join(errs...)
}

// Store is a gcra.Store on Redis: single node, Cluster or Sentinel through a
// go-redis UniversalClient. It is safe for concurrent use; concurrent calls
// are coalesced into batched script calls (see the package documentation).
type Store struct {
	c       scripter
	cfg     Config
	cluster bool
	sem     chan struct{}
	lanes   laneSet
	format  string // ARGV[3]: "" writes a Value, "2" a 12-byte value, "1" the packed integer
	testNow string // test only: "now" passed to the script instead of TIME
	script  *redis.Script
	markers stateMarkers          // CheckState's
	uc      redis.UniversalClient // CheckState's SET NX and CLUSTER SLOTS
	// fenceKey is the region fence's key (fence.go): the prefix and a
	// name with no '{', so no key RedisKey makes can be it.
	fenceKey string
	calls    atomic.Uint64 // script calls made (RoundTripError.Call)
}

var _ gcra.Store = (*Store)(nil)

// New returns a Store on c.
func New(c redis.UniversalClient, cfg Config) (*Store, error) {
	if c == nil {
		return nil, errors.New("redisstore: nil client")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if _, ring := c.(*redis.Ring); ring {
		// A Ring shards by key on the client side; a batch mixing shards
		// would run on the first key's shard.
		return nil, errors.New("redisstore: redis.Ring is not supported (use a single node, Sentinel or Cluster client)")
	}
	_, cluster := c.(*redis.ClusterClient)
	s := &Store{c: c, uc: c, cfg: cfg, cluster: cluster, sem: make(chan struct{}, cfg.MaxInFlight), script: script,
		fenceKey: cfg.Prefix + "meridian-fence"}
	switch cfg.WriteFormat {
	case FormatPacked:
		s.format = "1"
	case FormatValue12:
		s.format = "2"
	}
	s.lanes.init(cluster, cfg.Lanes)
	return s, nil
}

// Load loads the script into every server (optional: the first call does it
// on NOSCRIPT anyway). Useful at start-up to fail fast.
func (s *Store) Load(ctx context.Context) error {
	if cc, ok := s.c.(*redis.ClusterClient); ok {
		return cc.ForEachShard(ctx, func(ctx context.Context, sh *redis.Client) error {
			return s.script.Load(ctx, sh).Err()
		})
	}
	return s.script.Load(ctx, s.c).Err()
}

// RedisKey returns the Redis key the store uses for k:
// Prefix + "{" + base64url(Tag) + "}" + Name. The tag encoding is injective
// and brace-free, so no Tag or Name can move a key to another slot or make
// two keys collide.
func (s *Store) RedisKey(k gcra.Key) string {
	var b strings.Builder
	b.Grow(len(s.cfg.Prefix) + 2 + base64.RawURLEncoding.EncodedLen(len(k.Tag)) + len(k.Name))
	b.WriteString(s.cfg.Prefix)
	b.WriteByte('{')
	// Encode the tag 30 bytes at a time through stack buffers: whole 3-byte
	// groups encode alone, so the pieces join into the tag's encoding.
	var src [30]byte
	var dst [40]byte
	for tag := k.Tag; tag != ""; {
		n := copy(src[:], tag)
		tag = tag[n:]
		m := base64.RawURLEncoding.EncodedLen(n)
		base64.RawURLEncoding.Encode(dst[:m], src[:n])
		b.Write(dst[:m])
	}
	b.WriteByte('}')
	b.WriteString(k.Name)
	return b.String()
}

// Decide implements gcra.Store.
func (s *Store) Decide(ctx context.Context, k gcra.Key, sch gcra.Schedule, cost int64) (gcra.Result, error) {
	var out [1]gcra.Result
	chk := [1]gcra.Check{{Key: k, Schedule: sch, Cost: cost}}
	if err := s.run(ctx, opDecide, chk[:], 0, out[:]); err != nil {
		return gcra.Result{}, err
	}
	return out[0], nil
}

// Reserve implements gcra.Store. The script picks the limit by the
// server's clock, so maxWait is checked against the window of both limits
// a schedule names, before anything is sent (ErrWaitTooLong).
func (s *Store) Reserve(ctx context.Context, k gcra.Key, sch gcra.Schedule, cost int64, maxWait time.Duration) (gcra.Result, error) {
	mw, err := gcra.ValidateMaxWait(maxWait)
	if err != nil {
		return gcra.Result{}, badInput(err)
	}
	// The script picks the limit by the server's clock, so maxWait must fit
	// the window of either limit the schedule names.
	w := sch.Current.Limit.Burst() * sch.Current.Limit.IntervalMicros()
	if sch.HasPrevious {
		w = max(w, sch.Previous.Limit.Burst()*sch.Previous.Limit.IntervalMicros())
	}
	if mw > gcra.MaxWindowMicros-w {
		return gcra.Result{}, badInput(gcra.ErrWaitTooLong)
	}
	if s.cfg.WriteFormat == FormatPacked && mw > gcra.V1MaxWindow-min(w, gcra.V1MaxWindow) {
		return gcra.Result{}, fmt.Errorf("%w: %s and window %s exceed the packed format's %s (redisstore.FormatPacked)",
			gcra.ErrWaitTooLong, maxWait, time.Duration(w)*time.Microsecond, time.Duration(gcra.V1MaxWindow)*time.Microsecond)
	}
	var out [1]gcra.Result
	chk := [1]gcra.Check{{Key: k, Schedule: sch, Cost: cost}}
	if err := s.run(ctx, opReserve, chk[:], mw, out[:]); err != nil {
		return gcra.Result{}, err
	}
	return out[0], nil
}

// DecideAll implements gcra.Store: one script call, all or nothing. On a
// Cluster all keys must hash to one slot (share a non-empty Tag), or it
// fails with ErrCrossSlot; a single node or Sentinel decides any keys
// together.
func (s *Store) DecideAll(ctx context.Context, checks []gcra.Check, out []gcra.Result) (gcra.Result, error) {
	switch {
	case len(checks) == 0:
		return gcra.Result{}, badInput(gcra.ErrNoChecks)
	case len(checks) > gcra.MaxChecks:
		return gcra.Result{}, badInput(gcra.ErrTooManyChecks)
	case len(out) != len(checks):
		return gcra.Result{}, badInput(errors.New("DecideAll: out must have len(checks) elements"))
	}
	if err := s.run(ctx, opComposite, checks, 0, out); err != nil {
		return gcra.Result{}, err
	}
	return gcra.Combine(out), nil
}

// validate checks every input of an op before anything is sent; its error
// wraps ErrBadInput.
func validate(checks []gcra.Check) error {
	for i := range checks {
		c := &checks[i]
		if err := c.Key.Validate(); err != nil {
			return badInput(fmt.Errorf("key %q: %w", c.Key.Name, err))
		}
		if c.Cost < 0 {
			return badInput(gcra.ErrNegativeCost)
		}
		if !c.Schedule.Valid() {
			return badInput(fmt.Errorf("key %q: %w", c.Key.Name, c.Schedule.Validate()))
		}
		for j := range i {
			if checks[j].Key == c.Key {
				return badInput(fmt.Errorf("key %q (tag %q) listed twice in one composite", c.Key.Name, c.Key.Tag))
			}
		}
	}
	return nil
}

// packedLimits replaces every limit whose window exceeds gcra.V1MaxWindow
// with the zero limit, as the packed format requires (Config.WriteFormat).
func packedLimits(checks []gcra.Check) {
	cut := func(v *gcra.Version) {
		if v.Limit.Burst()*v.Limit.IntervalMicros() > gcra.V1MaxWindow {
			v.Limit = gcra.Limit{}
		}
	}
	for i := range checks {
		cut(&checks[i].Schedule.Current)
		if checks[i].Schedule.HasPrevious {
			cut(&checks[i].Schedule.Previous)
		}
	}
}

// appendInt appends v to a batch as the script reads it: 8 bytes,
// big-endian, two's complement (struct.unpack '>i8'). Every value sent is
// below 2^53 in magnitude, so the script's doubles hold it exactly.
func appendInt(b []byte, v int64) []byte {
	return binary.BigEndian.AppendUint64(b, uint64(v))
}

// appendSchedule appends one schedule to a batch: cur T, Burst, tag,
// effective, flags (1 hasPrev, 2 fenced), and if hasPrev the previous
// limit's four, and if fenced (and fence is set: a Cluster keeps no
// fence) the fence's term and epoch.
func appendSchedule(b []byte, sch *gcra.Schedule, fence bool) []byte {
	cur := &sch.Current
	b = appendInt(b, cur.Limit.IntervalMicros())
	b = appendInt(b, cur.Limit.Burst())
	b = appendInt(b, int64(gcra.EpochTag(cur.Epoch)))
	b = appendInt(b, cur.Effective)
	fenced := fence && !sch.Fence.IsZero()
	flags := int64(0)
	if sch.HasPrevious {
		flags |= 1
	}
	if fenced {
		flags |= 2
	}
	b = appendInt(b, flags)
	if sch.HasPrevious {
		p := &sch.Previous
		b = appendInt(b, p.Limit.IntervalMicros())
		b = appendInt(b, p.Limit.Burst())
		b = appendInt(b, int64(gcra.EpochTag(p.Epoch)))
		b = appendInt(b, p.Effective)
	}
	if fenced {
		b = appendInt(b, int64(sch.Fence.Term))
		b = appendInt(b, int64(sch.Fence.Epoch))
	}
	return b
}

// replyWidth is how many integers the script returns for one check of an
// op of the given kind.
func replyWidth(k opKind) int {
	if k == opReserve {
		return 5
	}
	return 4
}

// decode turns one check's reply integers (code + 8·version, remaining,
// retry-after µs or -1, reset-after µs, and for a reservation wait µs) into
// a result for check c.
func decode(v []int64, c *gcra.Check) (gcra.Result, error) {
	var r gcra.Result
	code, ver := v[0]%8, v[0]/8
	switch {
	case v[0] < 0 || ver > 1:
		return r, fmt.Errorf("%w: code %d", ErrReply, v[0])
	case ver == 0:
		r.Limit = c.Schedule.Current.Limit
	default:
		r.Limit = c.Schedule.Previous.Limit
	}
	switch code {
	case 0:
	case 1:
		r.Allowed = true
	case 2:
		r.TooLarge = true
	case 3:
		return gcra.Result{}, fmt.Errorf("%w (key %q)", ErrMalformedState, c.Key.Name)
	case 4:
		return gcra.Result{}, errNotDecided
	case 5:
		return gcra.Result{}, gcra.ErrFenced
	default:
		return r, fmt.Errorf("%w: code %d", ErrReply, v[0])
	}
	if v[1] < 0 || v[3] < 0 || v[2] < -1 || (v[2] == -1) != r.TooLarge || (len(v) > 4 && v[4] < 0) {
		return gcra.Result{}, fmt.Errorf("%w: values %v", ErrReply, v)
	}
	r.Remaining = v[1]
	if v[2] == -1 {
		r.RetryAfter = gcra.Never
	} else {
		r.RetryAfter = time.Duration(v[2]) * time.Microsecond
	}
	r.ResetAfter = time.Duration(v[3]) * time.Microsecond
	if len(v) > 4 {
		r.Wait = time.Duration(v[4]) * time.Microsecond
	}
	return r, nil
}

// replyInts checks that reply is one string of exactly n big-endian 64-bit
// integers (what the script packs), each in [-1, 2^53), and appends them to
// buf.
func replyInts(reply any, n int, buf []int64) ([]int64, error) {
	str, ok := reply.(string)
	if !ok {
		return nil, fmt.Errorf("%w: %T, want a string", ErrReply, reply)
	}
	if len(str) != 8*n {
		return nil, fmt.Errorf("%w: %d bytes, want %d (%d 8-byte integers)", ErrReply, len(str), 8*n, n)
	}
	for i := 0; i < len(str); i += 8 {
		v := int64(uint64(str[i])<<56 | uint64(str[i+1])<<48 | uint64(str[i+2])<<40 | uint64(str[i+3])<<32 |
			uint64(str[i+4])<<24 | uint64(str[i+5])<<16 | uint64(str[i+6])<<8 | uint64(str[i+7]))
		if v < -1 || v >= 1<<53 {
			return nil, fmt.Errorf("%w: value %d is %d, want an integer in [-1, 2^53)", ErrReply, i/8, v)
		}
		buf = append(buf, v)
	}
	return buf, nil
}
