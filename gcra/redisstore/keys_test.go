package redisstore

import (
	"encoding/base64"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/meridian-quota/meridian/gcra"
)

// newOfflineStore returns a store on a client that is never used: RedisKey
// and keySlot need no server.
func newOfflineStore(t *testing.T, prefix string) *Store {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = c.Close() })
	cfg := DefaultConfig()
	cfg.Prefix = prefix
	s, err := New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestRedisKeyFormat(t *testing.T) {
	s := newOfflineStore(t, "p:")
	tests := []struct {
		giveTag, giveName string
		want              string
	}{
		{"", "n", "p:{}n"},
		{"acme", "route=/search", "p:{YWNtZQ}route=/search"},
		{"{", "n", "p:{ew}n"},
		{"}", "n", "p:{fQ}n"},
		{"{}", "n", "p:{e30}n"},
		{"}{", "n", "p:{fXs}n"},
		{"\xff\xfe\x00", "{x}", "p:{__4A}{x}"},
	}
	for _, tt := range tests {
		k := gcra.Key{Tag: tt.giveTag, Name: tt.giveName}
		got := s.RedisKey(k)
		if got != tt.want {
			t.Errorf("RedisKey(%q, %q) = %q, want %q", tt.giveTag, tt.giveName, got, tt.want)
		}
		enc := base64.RawURLEncoding.EncodeToString([]byte(tt.giveTag))
		if want := "p:{" + enc + "}" + tt.giveName; got != want {
			t.Errorf("RedisKey(%q, %q) = %q, want prefix+{base64url(tag)}+name = %q", tt.giveTag, tt.giveName, got, want)
		}
		if tt.giveTag != "" {
			// The hash tag is exactly the encoding, whatever braces the
			// tag or the name carry.
			if gs, ws := keySlot(got), crc16(enc)%numSlots; gs != ws {
				t.Errorf("key %q in slot %d, want the slot of its encoded tag %q: %d", got, gs, enc, ws)
			}
		}
	}
}

// TestRedisKeyInjective draws random byte tags and names, heavy in braces,
// and requires distinct keys for distinct (Tag, Name), a key that always
// hashes to the slot of its encoded tag, and keys that share a Tag sharing a
// slot.
func TestRedisKeyInjective(t *testing.T) {
	s := newOfflineStore(t, "inj:")
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 11))
	alphabet := []byte("{}{}{}ab=/\x00\xff")
	draw := func() string {
		b := make([]byte, r.IntN(7))
		for i := range b {
			if r.IntN(3) == 0 {
				b[i] = byte(r.Uint32())
			} else {
				b[i] = alphabet[r.IntN(len(alphabet))]
			}
		}
		return string(b)
	}
	seen := make(map[string]gcra.Key)
	slotOfTag := make(map[string]uint16)
	// Pairs that collide under a naive "{"+tag+"}"+name encoding.
	fixed := []gcra.Key{
		{Tag: "a}", Name: "b"}, {Tag: "a", Name: "}b"},
		{Tag: "", Name: "{a}b"}, {Tag: "{a", Name: "b"},
		{Tag: "a}{b", Name: "c"}, {Tag: "a", Name: "}{b}c"},
	}
	n := 20000
	if testing.Short() {
		n = 2000
	}
	for i := range n + len(fixed) {
		var k gcra.Key
		if i < len(fixed) {
			k = fixed[i]
		} else {
			k = gcra.Key{Tag: draw(), Name: draw()}
			if k.Name == "" {
				k.Name = "n"
			}
		}
		key := s.RedisKey(k)
		if prev, ok := seen[key]; ok && prev != k {
			t.Fatalf("keys %+v and %+v both map to %q", prev, k, key)
		}
		seen[key] = k
		if strings.ContainsAny(key[len("inj:")+1:strings.IndexByte(key, '}')], "{}") {
			t.Fatalf("key %q: hash tag of %+v contains a brace", key, k)
		}
		if k.Tag == "" {
			continue
		}
		slot := keySlot(key)
		if ws := crc16(base64.RawURLEncoding.EncodeToString([]byte(k.Tag))) % numSlots; slot != ws {
			t.Fatalf("key %q of %+v in slot %d, want %d (its encoded tag's)", key, k, slot, ws)
		}
		if prev, ok := slotOfTag[k.Tag]; ok && prev != slot {
			t.Fatalf("tag %q: keys in slots %d and %d", k.Tag, prev, slot)
		}
		slotOfTag[k.Tag] = slot
	}
	t.Logf("%d distinct keys, %d distinct non-empty tags", len(seen), len(slotOfTag))
}

// TestKeySlotVectors pins keySlot to values Redis documents or computes
// (CLUSTER KEYSLOT on Redis 7.0), including the hash-tag edge cases.
// TestCluster compares keySlot with a live cluster on random keys.
func TestKeySlotVectors(t *testing.T) {
	tests := []struct {
		give string
		want uint16
	}{
		{"", 0},
		{"123456789", 12739}, // CRC-16/XMODEM check value 0x31C3
		{"foo", 12182},
		{"{user1000}.following", 3443},
		{"{user1000}.followers", 3443},
		{"user1000", 3443},
		{"foo{}{bar}", 8363},    // empty first tag: the whole key is hashed
		{"foo{{bar}}zap", 4015}, // tag is "{bar"
		{"foo{bar}{zap}", 5061}, // first tag only: "bar"
		{"bar", 5061},
		{"{bar", 4015}, // no closing brace: the whole key (equal to the tag above)
	}
	for _, tt := range tests {
		if got := keySlot(tt.give); got != tt.want {
			t.Errorf("keySlot(%q) = %d, want %d", tt.give, got, tt.want)
		}
	}
}
