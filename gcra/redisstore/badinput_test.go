package redisstore

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/internal/testenv"
)

// TestBadInput: every invalid call returns a clear error, with the gcra or
// redisstore sentinel where one exists, and writes nothing.
func TestBadInput(t *testing.T) {
	s, c := newTestStore(t)
	ctx := context.Background()
	good := gcra.Steady(gcra.PerSecond(5, 3))
	k := gcra.Key{Tag: "t", Name: "k"}
	k2 := gcra.Key{Tag: "t", Name: "k2"}
	decide := func(k gcra.Key, sch gcra.Schedule, cost int64) func() error {
		return func() error { _, err := s.Decide(ctx, k, sch, cost); return err }
	}
	reserve := func(k gcra.Key, sch gcra.Schedule, cost int64, maxWait time.Duration) func() error {
		return func() error { _, err := s.Reserve(ctx, k, sch, cost, maxWait); return err }
	}
	decideAll := func(checks []gcra.Check, nout int) func() error {
		return func() error { _, err := s.DecideAll(ctx, checks, make([]gcra.Result, nout)); return err }
	}
	sameTag := func(n int) []gcra.Check {
		cs := make([]gcra.Check, n)
		for i := range cs {
			cs[i] = gcra.Check{Key: gcra.Key{Tag: "t", Name: fmt.Sprintf("c%d", i)}, Schedule: good, Cost: 1}
		}
		return cs
	}
	hour := int64(time.Hour / time.Microsecond)
	wide := gcra.Steady(gcra.FromInterval(hour, (gcra.MaxWindowMicros-6*hour)/hour)) // MaxWindow less 6 h or so
	tests := []struct {
		name    string
		call    func() error
		wantIs  error    // sentinel the error must wrap (nil: none exists)
		wantMsg []string // substrings the message must contain
	}{
		{"rate 0", decide(k, gcra.Steady(gcra.New(0, time.Second, 1)), 1), gcra.ErrInvalidLimit, []string{"rate 0", "at least 1"}},
		{"burst 0", decide(k, gcra.Steady(gcra.PerSecond(5, 0)), 1), gcra.ErrInvalidLimit, []string{"burst 0"}},
		{"rate 0 in reserve", reserve(k, gcra.Steady(gcra.New(0, time.Second, 1)), 1, time.Second), gcra.ErrInvalidLimit, []string{"rate 0"}},
		{"invalid previous limit", decide(k, gcra.Change(gcra.Version{Limit: gcra.PerSecond(5, 0)}, gcra.Version{Limit: gcra.PerSecond(5, 3), Epoch: 1}), 1),
			gcra.ErrInvalidLimit, []string{"previous limit", "burst 0"}},
		{"previous effective after current", decide(k, gcra.Change(gcra.Version{Limit: gcra.PerSecond(5, 3), Effective: 10}, gcra.Version{Limit: gcra.PerSecond(9, 3), Epoch: 1, Effective: 5}), 1),
			gcra.ErrInvalidLimit, []string{"after the current"}},
		{"negative cost", decide(k, good, -1), gcra.ErrNegativeCost, []string{"cost must not be negative"}},
		{"negative cost in reserve", reserve(k, good, -1, time.Second), gcra.ErrNegativeCost, []string{"cost"}},
		{"empty key name", decide(gcra.Key{Tag: "t"}, good, 1), gcra.ErrEmptyKey, []string{"empty key"}},
		{"key too long", decide(gcra.Key{Tag: strings.Repeat("t", 24), Name: strings.Repeat("n", gcra.MaxKeyLen-23)}, good, 1),
			gcra.ErrKeyTooLong, []string{"longer than 1024"}},
		{"negative maxWait", reserve(k, good, 1, -time.Nanosecond), gcra.ErrNegativeWait, []string{"maxWait must not be negative"}},
		{"maxWait past MaxWindow", reserve(k, good, 1, gcra.MaxWindow), gcra.ErrWaitTooLong, []string{"MaxWindow"}},
		{"maxWait past MaxWindow with a wide window", reserve(k, wide, 1, 7*time.Hour), gcra.ErrWaitTooLong, []string{"MaxWindow"}},
		{"maxWait past MaxWindow of the previous limit only",
			reserve(k, gcra.Change(gcra.Version{Limit: wide.Current.Limit}, gcra.Version{Limit: gcra.PerSecond(5, 3), Epoch: 1}), 1, 7*time.Hour),
			gcra.ErrWaitTooLong, []string{"MaxWindow"}},
		{"composite with no checks", decideAll(nil, 0), gcra.ErrNoChecks, []string{"no limits"}},
		{"composite with MaxChecks+1 checks", decideAll(sameTag(gcra.MaxChecks+1), gcra.MaxChecks+1), gcra.ErrTooManyChecks, []string{"more than 32"}},
		{"composite with a short out", decideAll(sameTag(2), 1), nil, []string{"out must have len(checks)"}},
		{"composite with one negative cost", decideAll([]gcra.Check{
			{Key: k, Schedule: good, Cost: 1}, {Key: k2, Schedule: good, Cost: -1},
		}, 2), gcra.ErrNegativeCost, []string{"cost"}},
		{"composite with one invalid limit", decideAll([]gcra.Check{
			{Key: k, Schedule: good, Cost: 1}, {Key: k2, Schedule: gcra.Steady(gcra.PerSecond(5, 0)), Cost: 1},
		}, 2), gcra.ErrInvalidLimit, []string{"burst 0", strconv.Quote(k2.Name)}},
		{"composite with one empty key", decideAll([]gcra.Check{
			{Key: k, Schedule: good, Cost: 1}, {Key: gcra.Key{Tag: "t"}, Schedule: good, Cost: 1},
		}, 2), gcra.ErrEmptyKey, []string{"empty key"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if err == nil {
				t.Fatalf("no error")
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("error %q does not wrap %q", err, tt.wantIs)
			}
			for _, m := range tt.wantMsg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not mention %q", err, m)
				}
			}
			wantNoKeys(t, c, s.cfg.Prefix, tt.name)
		})
	}

	// Boundaries that are valid: a key of exactly MaxKeyLen bytes, a maxWait
	// that fills the window exactly, MaxChecks checks.
	t.Run("boundaries accepted", func(t *testing.T) {
		long := gcra.Key{Tag: strings.Repeat("t", 24), Name: strings.Repeat("n", gcra.MaxKeyLen-24)}
		if _, err := s.Decide(ctx, long, good, 1); err != nil {
			t.Errorf("key of %d bytes: %v", gcra.MaxKeyLen, err)
		}
		if _, err := s.Reserve(ctx, k, wide, 1, gcra.MaxWindow-wide.Current.Limit.Window()); err != nil {
			t.Errorf("maxWait filling MaxWindow: %v", err)
		}
		if _, err := s.DecideAll(ctx, sameTag(gcra.MaxChecks), make([]gcra.Result, gcra.MaxChecks)); err != nil {
			t.Errorf("%d checks: %v", gcra.MaxChecks, err)
		}
	})
}

// TestNeverAdmittedWritesNothing: a cost above Burst and the zero limit are
// denials (TooLarge, RetryAfter Never), not errors, and write nothing.
func TestNeverAdmittedWritesNothing(t *testing.T) {
	s, c := newTestStore(t)
	ctx := context.Background()
	good := gcra.Steady(gcra.PerSecond(5, 3))
	k := gcra.Key{Tag: "t", Name: "k"}
	huge := int64(1) << 62
	tests := []struct {
		name string
		call func() (gcra.Result, error)
	}{
		{"huge cost", func() (gcra.Result, error) { return s.Decide(ctx, k, good, huge) }},
		{"burst+1", func() (gcra.Result, error) { return s.Decide(ctx, k, good, 4) }},
		{"huge cost reserve", func() (gcra.Result, error) { return s.Reserve(ctx, k, good, huge, time.Second) }},
		{"zero limit", func() (gcra.Result, error) { return s.Decide(ctx, k, gcra.Steady(gcra.Limit{}), 1) }},
		{"zero limit reserve", func() (gcra.Result, error) { return s.Reserve(ctx, k, gcra.Steady(gcra.Limit{}), 1, time.Hour) }},
		{"huge cost in a composite", func() (gcra.Result, error) {
			return s.DecideAll(ctx, []gcra.Check{
				{Key: k, Schedule: good, Cost: 1},
				{Key: gcra.Key{Tag: "t", Name: "k2"}, Schedule: good, Cost: huge},
			}, make([]gcra.Result, 2))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := tt.call()
			if err != nil {
				t.Fatalf("error %v, want a TooLarge result", err)
			}
			if r.Allowed || !r.TooLarge || r.RetryAfter != gcra.Never {
				t.Errorf("result %+v, want TooLarge, not allowed, RetryAfter Never", r)
			}
			wantNoKeys(t, c, s.cfg.Prefix, tt.name)
		})
	}
}

// TestMalformedState: a key holding something the script did not write is
// reported as ErrMalformedState and left untouched, alone or in a composite
// (whose other keys are not written either).
func TestMalformedState(t *testing.T) {
	s, c := newTestStore(t)
	ctx := context.Background()
	good := gcra.Steady(gcra.PerSecond(5, 3))
	k := gcra.Key{Tag: "t", Name: "k"}
	other := gcra.Key{Tag: "t", Name: "other"}
	rk := s.RedisKey(k)
	// The script writes only decimal digits; Lua's tonumber also takes hex,
	// spaces and exponents, which would be read as some TAT up to 37 h ahead.
	values := []string{"garbage", "", "-1", "1.5", "9007199254740992", "nan", "inf", "0x10", " 12", "1e5"}
	// 24-byte values whose writer's limit no store decides under (T or
	// burst zero alone, a burst above MaxBurst, a window above
	// MaxWindow by one), and lengths between the two Value forms.
	valueWith := func(wt, wb uint64) string {
		b := make([]byte, gcra.ValueLen)
		put := func(to []byte, x uint64) {
			for i := len(to) - 1; i >= 0; i-- {
				to[i] = byte(x)
				x >>= 8
			}
		}
		put(b[0:7], 1_000_000)
		put(b[7:12], 0)
		put(b[12:19], wt)
		put(b[19:24], wb)
		return string(b)
	}
	bad24 := []string{valueWith(0, 5), valueWith(5, 0), valueWith(1, uint64(gcra.MaxBurst)+1),
		valueWith(uint64(gcra.MaxWindowMicros)/4+1, 4), valueWith(uint64(gcra.MaxWindowMicros)+1, 1),
		valueWith(1<<56-1, 1<<40-1), string(make([]byte, 18)), string(make([]byte, 25))}
	for _, v := range bad24 {
		if _, err := gcra.DecodeValue([]byte(v)); !errors.Is(err, gcra.ErrBadValue) {
			t.Errorf("DecodeValue(%x) = %v, want ErrBadValue as the script refuses it", v, err)
		}
	}
	values = append(values, bad24...)
	calls := []struct {
		name string
		call func() error
	}{
		{"decide", func() error { _, err := s.Decide(ctx, k, good, 1); return err }},
		{"peek", func() error { _, err := s.Decide(ctx, k, good, 0); return err }},
		{"reserve", func() error { _, err := s.Reserve(ctx, k, good, 1, time.Second); return err }},
		{"composite", func() error {
			_, err := s.DecideAll(ctx, []gcra.Check{{Key: other, Schedule: good, Cost: 1}, {Key: k, Schedule: good, Cost: 1}}, make([]gcra.Result, 2))
			return err
		}},
	}
	for _, v := range values {
		for _, cl := range calls {
			t.Run(fmt.Sprintf("%s %q", cl.name, v), func(t *testing.T) {
				if err := c.Set(ctx, rk, v, 0).Err(); err != nil {
					t.Fatal(err)
				}
				err := cl.call()
				if !errors.Is(err, ErrMalformedState) {
					t.Errorf("error %v, want ErrMalformedState", err)
				}
				if err != nil && !strings.Contains(err.Error(), strconv.Quote(k.Name)) {
					t.Errorf("error %q does not name the key %q", err, k.Name)
				}
				got, gerr := c.Get(ctx, rk).Result()
				if gerr != nil || got != v {
					t.Errorf("stored value now %q (%v), want %q untouched", got, gerr, v)
				}
				if ttl := c.PTTL(ctx, rk).Val(); ttl != -1 {
					t.Errorf("PTTL %v, want -1 (no TTL set)", ttl)
				}
				if n := c.Exists(ctx, s.RedisKey(other)).Val(); n != 0 {
					t.Errorf("composite partner written despite the malformed key")
				}
			})
		}
	}
}

// TestWrongTypeState: a key of another Redis type under the prefix is
// malformed state too: ErrMalformedState, the key untouched, rather than a
// script error (which would fail every op batched with it).
func TestWrongTypeState(t *testing.T) {
	s, c := newTestStore(t)
	ctx := context.Background()
	good := gcra.Steady(gcra.PerSecond(5, 3))
	k := gcra.Key{Tag: "t", Name: "k"}
	rk := s.RedisKey(k)
	calls := []struct {
		name string
		call func() error
	}{
		{"decide", func() error { _, err := s.Decide(ctx, k, good, 1); return err }},
		{"reserve", func() error { _, err := s.Reserve(ctx, k, good, 1, time.Second); return err }},
		{"composite", func() error {
			_, err := s.DecideAll(ctx, []gcra.Check{{Key: gcra.Key{Tag: "t", Name: "other"}, Schedule: good, Cost: 1}, {Key: k, Schedule: good, Cost: 1}}, make([]gcra.Result, 2))
			return err
		}},
	}
	if err := c.RPush(ctx, rk, "x").Err(); err != nil {
		t.Fatal(err)
	}
	for _, cl := range calls {
		err := cl.call()
		if !errors.Is(err, ErrMalformedState) {
			t.Errorf("%s on a list: error %v, want ErrMalformedState", cl.name, err)
		}
		if typ, _ := c.Type(ctx, rk).Result(); typ != "list" || c.LLen(ctx, rk).Val() != 1 {
			t.Errorf("%s: the list was changed (type %q)", cl.name, typ)
		}
	}
	if n := c.Exists(ctx, s.RedisKey(gcra.Key{Tag: "t", Name: "other"})).Val(); n != 0 {
		t.Errorf("composite partner written despite the wrong-typed key")
	}
}

// TestReplyShapes feeds replyInts and decode every wrong shape; each must be
// an error wrapping ErrReply (ErrMalformedState for code 3, errNotDecided
// for code 4), never a panic.
func TestReplyShapes(t *testing.T) {
	packed := func(v ...int64) string {
		var b []byte
		for _, x := range v {
			b = appendInt(b, x)
		}
		return string(b)
	}
	six := packed(1, 2, 0, 3, 0, 0)
	intsTests := []struct {
		name  string
		give  any
		giveN int
	}{
		{"nil", nil, 6},
		{"integer", int64(1), 6},
		{"error", errors.New("boom"), 6},
		{"map", map[any]any{"a": int64(1)}, 6},
		{"bytes", []byte(six), 6},
		{"array of integers", []any{int64(1), int64(2), int64(0), int64(3), int64(0), int64(0)}, 6},
		{"empty array", []any{}, 6},
		{"empty string", "", 6},
		{"OK", "OK", 6},
		{"five integers", packed(1, 2, 0, 3, 0), 6},
		{"seven integers", packed(1, 2, 0, 3, 0, 0, 0), 6},
		{"one byte short", six[:47], 6},
		{"one byte long", six + "\x00", 6},
		{"decimal text of the right length", strings.Repeat("1,", 24), 6},
		{"value below -1", packed(1, 2, -2, 3, 0, 0), 6},
		{"most negative value", packed(1, 2, 0, -1<<63, 0, 0), 6},
		{"value of 2^53", packed(1, 2, 0, 3, 0, 1<<53), 6},
		{"largest value", packed(1<<63-1, 2, 0, 3, 0, 0), 6},
	}
	for _, tt := range intsTests {
		t.Run("replyInts "+tt.name, func(t *testing.T) {
			var err error
			noPanic(t, func() { _, err = replyInts(tt.give, tt.giveN, nil) })
			if !errors.Is(err, ErrReply) {
				t.Errorf("error %v, want ErrReply", err)
			}
		})
	}
	if v, err := replyInts(six, 6, nil); err != nil || !slices.Equal(v, []int64{1, 2, 0, 3, 0, 0}) {
		t.Errorf("well-formed reply: %v, %v", v, err)
	}
	if v, err := replyInts(packed(2, 0, -1, 1<<53-1), 4, nil); err != nil || !slices.Equal(v, []int64{2, 0, -1, 1<<53 - 1}) {
		t.Errorf("reply with -1 and 2^53-1: %v, %v", v, err)
	}

	chk := gcra.Check{Key: gcra.Key{Name: "k"}, Schedule: gcra.Steady(gcra.PerSecond(5, 3))}
	decodeTests := []struct {
		name   string
		give   []int64
		wantIs error
	}{
		{"unknown code", []int64{6, 0, 0, 0, 0}, ErrReply},
		{"huge code", []int64{1 << 40, 0, 0, 0, 0}, ErrReply},
		{"negative code", []int64{-1, 0, 0, 0, 0}, ErrReply},
		{"bad version", []int64{1 + 8*2, 0, 0, 0, 0}, ErrReply},
		{"negative code and version", []int64{-7, 0, 0, 0, 0}, ErrReply},
		{"negative remaining", []int64{1, -1, 0, 0, 0}, ErrReply},
		{"retry-after below -1", []int64{0, 0, -2, 0, 0}, ErrReply},
		{"never on a plain denial", []int64{0, 0, -1, 0, 0}, ErrReply},
		{"too large without never", []int64{2, 0, 5, 0, 0}, ErrReply},
		{"negative reset-after", []int64{1, 0, 0, -1, 0}, ErrReply},
		{"negative wait", []int64{1, 0, 0, 0, -1}, ErrReply},
		{"malformed state", []int64{3, 0, 0, 0, 0}, ErrMalformedState},
		{"not decided (a composite partner is malformed)", []int64{4, 0, 0, 0, 0}, errNotDecided},
		{"fenced", []int64{5, 0, 0, 0, 0}, gcra.ErrFenced},
	}
	for _, tt := range decodeTests {
		t.Run("decode "+tt.name, func(t *testing.T) {
			var err error
			noPanic(t, func() { _, err = decode(tt.give, &chk) })
			if !errors.Is(err, tt.wantIs) {
				t.Errorf("error %v, want %v", err, tt.wantIs)
			}
		})
	}
	r, err := decode([]int64{0, 1, 150_000, 400_000}, &chk)
	want := gcra.Result{Limit: gcra.PerSecond(5, 3), Remaining: 1, RetryAfter: 150 * time.Millisecond, ResetAfter: 400 * time.Millisecond}
	if err != nil || r != want {
		t.Errorf("decode of a denial = %+v, %v; want %+v", r, err, want)
	}
	r, err = decode([]int64{2, 0, -1, 0}, &chk)
	if err != nil || !r.TooLarge || r.RetryAfter != gcra.Never {
		t.Errorf("decode of too large = %+v, %v", r, err)
	}
}

// TestBatchShapes sends the script batches of the wrong shape (the Go side
// never builds them): each must fail with an error that names the problem,
// and write nothing.
func TestBatchShapes(t *testing.T) {
	s, c := newTestStore(t)
	ctx := context.Background()
	sch := gcra.Steady(gcra.PerSecond(5, 3))
	key := s.RedisKey(gcra.Key{Tag: "t", Name: "k"})
	good := appendSchedule(appendInt(appendInt(nil, 1), 1), &sch, false)
	good = appendInt(good, opWord(opDecide, 1, 1))
	tests := []struct {
		name  string
		args  []any
		wantE string
	}{
		{"no batch", []any{""}, "8-byte integers"},
		{"a batch of 7 bytes", []any{"", good[:7]}, "8-byte integers"},
		{"one byte over", []any{"", append(slices.Clone(good), 0)}, "8-byte integers"},
		{"empty batch", []any{"", ""}, "too short"},
		{"decimal arguments", []any{"", "1", "1"}, "8-byte integers"},
		{"no op word", []any{"", good[:len(good)-8]}, "too short"},
		{"a schedule short", []any{"", good[:16+24]}, "too short"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			noPanic(t, func() { err = script.Run(ctx, s.c, []string{key}, tt.args...).Err() })
			if err == nil || !strings.Contains(err.Error(), tt.wantE) {
				t.Errorf("error %v, want one mentioning %q", err, tt.wantE)
			}
			wantNoKeys(t, c, s.cfg.Prefix, tt.name)
		})
	}
	v, err := script.Run(ctx, s.c, []string{key}, "", good).Result()
	if err != nil {
		t.Fatalf("well-formed batch: %v", err)
	}
	if vals, err := replyInts(v, 4, nil); err != nil || vals[0] != 1 {
		t.Errorf("well-formed batch: reply %v, %v; want an admission", vals, err)
	}
}

func noPanic(t *testing.T, f func()) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			t.Errorf("panic: %v", p)
		}
	}()
	f()
}

// blackHole is a TCP listener on 127.0.0.1 standing in for a Redis that
// stops answering. Silent never writes a byte. Otherwise it speaks just
// enough RESP to get a go-redis client through its handshake (every command
// but EVAL/EVALSHA gets an error reply, so HELLO falls back to RESP2) and
// then swallows the script call.
type blackHole struct {
	ln     net.Listener
	silent bool
	mu     sync.Mutex
	conns  []net.Conn
	seen   []string // command names received
	wg     sync.WaitGroup
}

func startBlackHole(t *testing.T, silent bool) *blackHole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackHole{ln: ln, silent: silent}
	b.wg.Add(1)
	go b.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		b.mu.Lock()
		for _, c := range b.conns {
			_ = c.Close()
		}
		b.mu.Unlock()
		b.wg.Wait()
	})
	return b
}

func (b *blackHole) accept() {
	defer b.wg.Done()
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		b.mu.Lock()
		b.conns = append(b.conns, c)
		b.mu.Unlock()
		b.wg.Add(1)
		go b.serve(c)
	}
}

func (b *blackHole) serve(c net.Conn) {
	defer b.wg.Done()
	r := bufio.NewReader(c)
	for {
		cmd, err := readCommand(r)
		if err != nil {
			_, _ = io.Copy(io.Discard, r)
			return
		}
		b.mu.Lock()
		b.seen = append(b.seen, cmd)
		b.mu.Unlock()
		if b.silent || cmd == "EVALSHA" || cmd == "EVAL" {
			continue
		}
		if _, err := io.WriteString(c, "-ERR unknown command '"+cmd+"'\r\n"); err != nil {
			return
		}
	}
}

func (b *blackHole) commands() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.seen...)
}

// readCommand reads one RESP array of bulk strings and returns its first
// element, upper-cased.
func readCommand(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	if !strings.HasPrefix(line, "*") {
		return "", fmt.Errorf("not an array: %q", line)
	}
	n, err := strconv.Atoi(strings.TrimSpace(line[1:]))
	if err != nil {
		return "", err
	}
	var name string
	for i := range n {
		hdr, err := r.ReadString('\n')
		if err != nil {
			return "", err
		}
		size, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(hdr, "$")))
		if err != nil {
			return "", err
		}
		buf := make([]byte, size+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		if i == 0 {
			name = strings.ToUpper(string(buf[:size]))
		}
	}
	return name, nil
}

// TestTimeout: a Redis that accepts and never answers costs the caller no
// more than the store's Timeout (plus slack), with an error that says so,
// on a client with ContextTimeoutEnabled and long timeouts of its own.
func TestTimeout(t *testing.T) {
	shared := testenv.Redis(t) // to prove nothing lands in the real Redis
	for _, silent := range []bool{true, false} {
		name := "silent from the start"
		if !silent {
			name = "hangs on the script call"
		}
		t.Run(name, func(t *testing.T) {
			bh := startBlackHole(t, silent)
			c := redis.NewClient(&redis.Options{
				Addr:                  bh.ln.Addr().String(),
				ContextTimeoutEnabled: true,
				// The client's own timeouts are long: only the store's
				// 50 ms Timeout can end the call within a second.
				DialTimeout:  5 * time.Second,
				ReadTimeout:  5 * time.Second,
				WriteTimeout: 5 * time.Second,
			})
			t.Cleanup(func() { _ = c.Close() })
			cfg := DefaultConfig()
			cfg.Prefix = testenv.Prefix(t)
			cfg.Timeout = 50 * time.Millisecond
			s, err := New(c, cfg)
			if err != nil {
				t.Fatal(err)
			}
			k := gcra.Key{Tag: "t", Name: "k"}
			start := time.Now()
			_, err = s.Decide(context.Background(), k, gcra.Steady(gcra.PerSecond(5, 3)), 1)
			elapsed := time.Since(start)
			t.Logf("error after %v: %v; server saw %q", elapsed, err, bh.commands())
			if err == nil {
				t.Fatal("no error from a server that never answers")
			}
			if msg := strings.ToLower(err.Error()); !strings.Contains(msg, "deadline") && !strings.Contains(msg, "timeout") {
				t.Errorf("error %q mentions neither a deadline nor a timeout", err)
			}
			var ne net.Error
			if !errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &ne) && ne.Timeout()) {
				t.Errorf("error %q is neither context.DeadlineExceeded nor a net timeout: a failure policy cannot tell it is one", err)
			}
			// A wide margin (200× the Timeout): the verdict is "the call
			// ends" rather than "it ends fast", so a loaded machine cannot
			// fail it; without the Timeout the call never returns.
			if elapsed > 10*time.Second {
				t.Errorf("took %v, want about the store's 50ms Timeout", elapsed)
			}
			if !silent && !containsCmd(bh.commands(), "EVALSHA") {
				t.Errorf("the script call never reached the server (saw %q): the test did not exercise its timeout", bh.commands())
			}
			// Callers queued behind a hung call time out too: the lane's
			// batch call carries the same Timeout.
			var wg sync.WaitGroup
			errs := make([]error, 10)
			start = time.Now()
			for i := range errs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, errs[i] = s.Decide(context.Background(), k, gcra.Steady(gcra.PerSecond(5, 3)), 1)
				}()
			}
			wg.Wait()
			elapsed = time.Since(start)
			for i, err := range errs {
				if !isTimeout(err) {
					t.Errorf("concurrent caller %d: %v, want a deadline error", i, err)
				}
			}
			if elapsed > 10*time.Second {
				t.Errorf("10 concurrent callers took %v, want a few store Timeouts", elapsed)
			}
			wantNoKeys(t, shared, cfg.Prefix, "timed-out decision")
		})
	}
}

func containsCmd(cmds []string, name string) bool {
	for _, c := range cmds {
		if c == name {
			return true
		}
	}
	return false
}

// TestConfigValidate: Validate reports every problem at once, naming each
// field, and New refuses a bad config.
func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("DefaultConfig invalid: %v", err)
	}
	bad := Config{Prefix: "a{b", Timeout: 0, MaxBatch: 0, MaxInFlight: 0, Lanes: 0}
	err := bad.Validate()
	if err == nil {
		t.Fatal("bad config accepted")
	}
	for _, want := range []string{"Prefix", "'{'", "Timeout", "MaxBatch 0", "MaxInFlight 0", "Lanes 0"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	tests := []struct {
		name   string
		modify func(*Config)
		want   string
	}{
		{"closing brace in prefix", func(c *Config) { c.Prefix = "a}" }, "Prefix"},
		{"long prefix", func(c *Config) { c.Prefix = strings.Repeat("p", 65) }, "longer than 64"},
		{"negative timeout", func(c *Config) { c.Timeout = -time.Second }, "Timeout"},
		{"MaxBatch too big", func(c *Config) { c.MaxBatch = 1025 }, "MaxBatch 1025"},
		{"Lanes too many", func(c *Config) { c.Lanes = 257 }, "Lanes 257"},
	}
	for _, tt := range tests {
		cfg := DefaultConfig()
		tt.modify(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Validate() = %v, want an error mentioning %q", tt.name, err, tt.want)
		}
		c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
		if s, err := New(c, cfg); err == nil || s != nil {
			t.Errorf("%s: New accepted the config", tt.name)
		}
		_ = c.Close()
	}
	if _, err := New(nil, DefaultConfig()); err == nil {
		t.Error("New(nil client) accepted")
	}
}
