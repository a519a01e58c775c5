package gossip

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/meridian-quota/meridian/gossip/protocol"
	"github.com/meridian-quota/meridian/internal/natstest"
)

// newNKeySeedFile writes a fresh nkey user seed to a file and returns the
// file and the public key.
func newNKeySeedFile(t *testing.T) (file, pub string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	if pub, err = kp.PublicKey(); err != nil {
		t.Fatal(err)
	}
	return writeFile(t, "user.nk", string(seed)+"\n"), pub
}

// Fast election timings for tests: failover within about a second.
var testElection = ElectionConfig{TTL: time.Second, Renew: 250 * time.Millisecond, Poll: 100 * time.Millisecond}

const testSkew = 200 * time.Millisecond

// referee records the callbacks of several candidates and checks that at
// most one leads at a time and that terms strictly increase.
type referee struct {
	mu      sync.Mutex
	leader  string // "" when none
	term    uint64 // of the last election
	history []string
	errs    []string
}

func (r *referee) callbacks(id string) (onElected, onDeposed func(uint64)) {
	onElected = func(term uint64) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.history = append(r.history, fmt.Sprintf("%s elected term %d", id, term))
		if r.leader != "" {
			r.errs = append(r.errs, fmt.Sprintf("%s elected (term %d) while %s leads", id, term, r.leader))
		}
		if term <= r.term {
			r.errs = append(r.errs, fmt.Sprintf("%s elected with term %d after term %d", id, term, r.term))
		}
		r.leader, r.term = id, term
	}
	onDeposed = func(term uint64) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.history = append(r.history, fmt.Sprintf("%s deposed term %d", id, term))
		if r.leader != id || r.term != term {
			r.errs = append(r.errs, fmt.Sprintf("%s deposed from term %d, but the leader is %q term %d", id, term, r.leader, r.term))
		}
		r.leader = ""
	}
	return onElected, onDeposed
}

// waitLeader waits for a leader other than every id in not.
func (r *referee) waitLeader(t *testing.T, not ...string) (string, uint64) {
	t.Helper()
	var id string
	var term uint64
	eventually(t, natsDeadline, "a leader other than "+strings.Join(not, ", "), func() error {
		r.mu.Lock()
		defer r.mu.Unlock()
		id, term = r.leader, r.term
		if id == "" {
			return errors.New("no leader")
		}
		for _, n := range not {
			if id == n {
				return fmt.Errorf("%s still leads", id)
			}
		}
		return nil
	})
	return id, term
}

func (r *referee) check(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.errs {
		t.Error(e)
	}
	if t.Failed() {
		t.Logf("history:\n%s", strings.Join(r.history, "\n"))
	}
}

// candidate is one Campaign running on its own transport.
type candidate struct {
	id     string
	tr     *Transport
	cancel context.CancelFunc
	done   chan error
}

func startCandidate(t *testing.T, url, id string, ref *referee) *candidate {
	t.Helper()
	c := &candidate{id: id, tr: dialT(t, "c1", natsTestConfig(url)), done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	cfg := testElection
	cfg.ID = id
	onElected, onDeposed := ref.callbacks(id)
	go func() { c.done <- c.tr.Campaign(ctx, cfg, testSkew, onElected, onDeposed) }()
	t.Cleanup(func() {
		cancel()
		recv(t, c.done, id+"'s Campaign return")
	})
	return c
}

func TestElectionFailover(t *testing.T) {
	srv := natstest.Start(t)
	ref := &referee{}
	cands := map[string]*candidate{}
	for _, id := range []string{"eu/a", "us/b", "ap/c"} {
		cands[id] = startCandidate(t, srv.URL(), id, ref)
	}
	observer := dialT(t, "c1", natsTestConfig(srv.URL()))
	ctx := bg(t)

	first, term1 := ref.waitLeader(t)
	if l, ok, err := observer.Leader(ctx); err != nil || !ok || l.ID != first || l.Term != term1 || l.Since.IsZero() || !l.Expires.After(l.Since) {
		t.Fatalf("Leader = %+v ok=%v err=%v, want %s term %d", l, ok, err, first, term1)
	}

	// The leader stops cleanly: it releases the key, so a follower takes
	// over at its next poll.
	cands[first].cancel()
	if err := recv(t, cands[first].done, "Campaign return"); err != nil {
		t.Fatalf("Campaign after its ctx ended: %v", err)
	}
	cands[first].done <- nil // for the cleanup
	second, term2 := ref.waitLeader(t, first)

	// The next leader's transport dies without releasing: the last one
	// takes over once the record expires (TTL + skew).
	cands[second].tr.Close()
	if err := recv(t, cands[second].done, "Campaign return"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Campaign after Close: %v, want ErrClosed", err)
	}
	cands[second].done <- nil
	third, term3 := ref.waitLeader(t, first, second)

	if !(term1 < term2 && term2 < term3) {
		t.Errorf("terms %d, %d, %d: not increasing", term1, term2, term3)
	}
	if l, ok, err := observer.Leader(ctx); err != nil || !ok || l.ID != third || l.Term != term3 {
		t.Errorf("Leader = %+v ok=%v err=%v, want %s term %d", l, ok, err, third, term3)
	}
	// The survivor keeps renewing: it is still the leader two TTLs later.
	time.Sleep(2 * testElection.TTL)
	if id, term := ref.waitLeader(t); id != third || term != term3 {
		t.Errorf("leader %s term %d, want %s term %d still", id, term, third, term3)
	}
	ref.check(t)
}

// TestDeposedLeaderFenced: the election can be wrong for a moment; the
// head's compare-and-set is not.
func TestDeposedLeaderFenced(t *testing.T) {
	srv := natstest.Start(t)
	ref := &referee{}
	a := startCandidate(t, srv.URL(), "eu/a", ref)
	ctx := bg(t)
	if id, _ := ref.waitLeader(t); id != "eu/a" {
		t.Fatalf("leader %s", id)
	}
	rev1, err := a.tr.StoreTable(ctx, 0, 1, 1, [][]byte{[]byte("a's table")})
	if err != nil {
		t.Fatal(err)
	}
	b := startCandidate(t, srv.URL(), "us/b", ref)
	a.cancel()
	recv(t, a.done, "Campaign return")
	a.done <- nil
	if id, _ := ref.waitLeader(t, "eu/a"); id != "us/b" {
		t.Fatalf("leader %s", id)
	}

	// The new leader writes on the revision it read.
	_, rev, ok, err := b.tr.LatestTable(ctx)
	if err != nil || !ok || rev != rev1 {
		t.Fatalf("LatestTable rev %d ok=%v err=%v", rev, ok, err)
	}
	rev2, err := b.tr.StoreTable(ctx, rev, 2, 1, [][]byte{[]byte("b's table")})
	if err != nil {
		t.Fatal(err)
	}
	// The old leader, unaware, writes on its last revision: fenced.
	if _, err := a.tr.StoreTable(ctx, rev1, 1, 2, [][]byte{[]byte("a's late table")}); !errors.Is(err, ErrFenced) {
		t.Fatalf("deposed leader's StoreTable: %v, want ErrFenced", err)
	}
	head, rev, _, err := a.tr.LatestTable(ctx)
	if err != nil || string(head) != "b's table" || rev != rev2 {
		t.Fatalf("LatestTable = %q rev %d err=%v, want b's table rev %d", head, rev, err, rev2)
	}
	ref.check(t)
}

// TestElectionRecord: the stored record is the documented JSON, and
// records that are not are refused by Leader and left alone by Campaign.
func TestElectionRecord(t *testing.T) {
	srv := natstest.Start(t)
	tr := dialT(t, "c1", natsTestConfig(srv.URL()))
	ctx := bg(t)
	if _, ok, err := tr.Leader(ctx); ok || err != nil {
		t.Fatalf("Leader on an empty bucket: ok=%v err=%v", ok, err)
	}

	ref := &referee{}
	c := startCandidate(t, srv.URL(), "eu/a", ref)
	_, term := ref.waitLeader(t)
	e, err := tr.kv.Get(ctx, "c1.leader")
	if err != nil {
		t.Fatal(err)
	}
	r, err := protocol.ParseLeaderRecord(e.Value())
	if err != nil || r.Holder != "eu/a" || r.Term != term || r.ExpiresUS <= r.SinceUS {
		t.Fatalf("record %s: %+v, %v", e.Value(), r, err)
	}
	if !strings.HasPrefix(string(e.Value()), `{"v":1,"term":`) {
		t.Errorf("record %s: not the documented encoding", e.Value())
	}
	c.cancel()
	recv(t, c.done, "Campaign return")
	c.done <- nil

	// A foreign value in the key: Leader reports it, Campaign does not
	// take the key (it cannot know the next term).
	if _, err := tr.kv.Put(ctx, "c1.leader", []byte(`{"v":1,"term":0,"holder":""}`)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := tr.Leader(ctx); err == nil || !strings.Contains(err.Error(), "term 0") {
		t.Fatalf("Leader on an invalid record: %v", err)
	}
	ref2 := &referee{}
	startCandidate(t, srv.URL(), "us/b", ref2)
	time.Sleep(3 * testElection.Poll)
	ref2.mu.Lock()
	if ref2.leader != "" {
		t.Errorf("elected over an invalid record: %v", ref2.history)
	}
	ref2.mu.Unlock()

	for _, bad := range []string{``, `[]`, `{"v":2,"term":1,"holder":"x","since_us":1,"expires_us":2}`, `{"v":1,"term":1,"holder":"x\u0000","since_us":1,"expires_us":2}`, `{"v":1,"term":1,"holder":"x","since_us":0,"expires_us":2}`} {
		if _, err := protocol.ParseLeaderRecord([]byte(bad)); err == nil {
			t.Errorf("ParseLeaderRecord(%s): nil error", bad)
		}
	}
}

func TestElectionConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		give ElectionConfig
		want []string
	}{
		{name: "defaults from TTL", give: ElectionConfig{ID: "eu/a"}},
		{name: "default config", give: func() ElectionConfig { c := DefaultElectionConfig(); c.ID = "eu/a"; return c }()},
		{name: "explicit", give: ElectionConfig{ID: "eu/a", TTL: time.Second, Renew: 500 * time.Millisecond, Poll: time.Second}},
		{
			name: "everything wrong",
			give: ElectionConfig{TTL: time.Millisecond, Renew: time.Second, Poll: -1},
			want: []string{"election.id: empty", "election.ttl: 1ms", "election.renew: 1s", "election.poll: -1ns"},
		},
		{name: "renew above half the TTL", give: ElectionConfig{ID: "x", TTL: time.Second, Renew: 600 * time.Millisecond}, want: []string{"election.renew"}},
		{name: "unprintable ID", give: ElectionConfig{ID: "a\nb"}, want: []string{"election.id"}},
		{name: "long ID", give: ElectionConfig{ID: strings.Repeat("x", 257)}, want: []string{"election.id: 257 bytes"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkErrs(t, "Validate()", tt.give.Validate(), tt.want)
		})
	}

	// Campaign refuses a bad configuration at once.
	srv := natstest.Start(t)
	tr := dialT(t, "c1", natsTestConfig(srv.URL()))
	if err := tr.Campaign(bg(t), ElectionConfig{}, 0, nil, nil); err == nil || !strings.Contains(err.Error(), "election.id") {
		t.Errorf("Campaign without ID: %v", err)
	}
	if err := tr.Campaign(bg(t), ElectionConfig{ID: "x"}, -time.Second, nil, nil); err == nil || !strings.Contains(err.Error(), "max skew") {
		t.Errorf("Campaign with negative skew: %v", err)
	}
}

// TestNATSKV: the election's port over JetStream KV answers with the
// port's sentinels, still wrapping jetstream's.
func TestNATSKV(t *testing.T) {
	srv := natstest.Start(t)
	tr := dialT(t, "c1", natsTestConfig(srv.URL()))
	ctx := bg(t)
	var kv protocol.KV = natsKV{tr.kv}
	if _, _, err := kv.Get(ctx, "c1.leader"); !errors.Is(err, protocol.ErrNotFound) || !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("Get of an absent key: %v", err)
	}
	rev, err := kv.Create(ctx, "c1.leader", []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, "c1.leader", []byte("b")); !errors.Is(err, protocol.ErrConflict) {
		t.Fatalf("Create of a present key: %v", err)
	}
	if _, err := kv.Update(ctx, "c1.leader", []byte("b"), rev+7); !errors.Is(err, protocol.ErrConflict) {
		t.Fatalf("Update at a wrong revision: %v", err)
	}
	rev2, err := kv.Update(ctx, "c1.leader", []byte("b"), rev)
	if err != nil || rev2 <= rev {
		t.Fatalf("Update at its revision: rev %d, %v", rev2, err)
	}
	if v, r, err := kv.Get(ctx, "c1.leader"); err != nil || string(v) != "b" || r != rev2 {
		t.Fatalf("Get = %q rev %d, %v; want b rev %d", v, r, err, rev2)
	}
}
