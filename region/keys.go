package region

import (
	"errors"
	"fmt"
	"hash/maphash"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/rebalance"
)

// entry is one interned key: its store key and its demand counters for the
// open report interval. Counters are added to under the shard's read lock
// and swapped out under its write lock (Tick), so no count is lost or
// counted twice, and recorders never serialize on each other.
type entry struct {
	name string
	key  gcra.Key

	offered, offeredCost, admitted, denied atomic.Int64

	// listed is the demand the key was last listed with in a report
	// (Config.ReportChange). Owned by the Tick goroutine, under the
	// shard's write lock, as are idle, dead and relist below.
	listed rebalance.Demand

	rare atomic.Pointer[entryRare] // what few keys use (rareOf)

	slot   uint32 // the key's offset within Config.ReportRefresh (FNV-1a of the name)
	idle   uint32 // empty reports in a row
	global bool   // reported to the coordinator (scope global)
	dead   bool   // evicted: recorders re-intern
	relist bool   // the next report lists the key again
}

// entryRare is the part of a key's entry that only some keys use, made on
// first use (rareOf): the deny cache of a key the store has denied, the
// local failure mode's state, used while the store fails, and the token
// prefetch of a rule with LeaseUnits. Kept in every entry they cost every
// key over 100 bytes; apart, and with the small fields packed, an entry is
// 136 bytes instead of 248 (BenchmarkNodeHeapPerKey: 248 B per key in
// demand for the entry, its name and its map slot, instead of 360).
type entryRare struct {
	deny  denyCache  // Config.DenyCache
	local gcra.State // guarded by Node.localMu
	lease leaseState // Rule.LeaseUnits
}

// rareOf returns e's rare part, making it on first use. Safe for
// concurrent use: of two first uses, one part is kept.
func (e *entry) rareOf() *entryRare {
	if r := e.rare.Load(); r != nil {
		return r
	}
	e.rare.CompareAndSwap(nil, &entryRare{})
	return e.rare.Load()
}

// localTAT is the TAT of e's local failure-mode state (0: none). Call it
// under Node.localMu.
func (e *entry) localTAT() int64 {
	if r := e.rare.Load(); r != nil {
		return r.local.TAT
	}
	return 0
}

const shardCount = 64

type shard struct {
	mu sync.RWMutex
	m  map[string]*entry
	_  [40]byte // keep shards on separate cache lines
}

// interner maps canonical key names to entries, without allocating on a
// hit, up to a cap.
type interner struct {
	seed   maphash.Seed
	shards [shardCount]shard
	n      atomic.Int64
	max    int64
}

func (in *interner) init(max int) {
	in.seed = maphash.MakeSeed()
	in.max = int64(max)
	for i := range in.shards {
		in.shards[i].m = map[string]*entry{}
	}
}

func (in *interner) shardOf(name []byte) *shard {
	return &in.shards[maphash.Bytes(in.seed, name)%shardCount]
}

// shardOfString is shardOf for a string (maphash.String equals
// maphash.Bytes of the same bytes).
func (in *interner) shardOfString(name string) *shard {
	return &in.shards[maphash.String(in.seed, name)%shardCount]
}

// get returns the entry for name, creating it (with tag) unless the table
// is full; nil means full.
func (in *interner) get(name []byte, tag string, tagged, global bool) *entry {
	sh := in.shardOf(name)
	sh.mu.RLock()
	e := sh.m[string(name)]
	sh.mu.RUnlock()
	if e != nil && e.matches(tag, tagged, global) {
		return e
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.m[string(name)]; e != nil {
		if e.matches(tag, tagged, global) {
			return e
		}
		// A reload changed the key's hash tag or scope: retire the old
		// entry (its recorders follow to the new one) and intern afresh.
		e.dead = true
		delete(sh.m, e.name)
		in.n.Add(-1)
	}
	if in.n.Load() >= in.max {
		return nil
	}
	s := string(name)
	e = &entry{name: s, key: gcra.Key{Name: s}, global: global, slot: fnv32(s)}
	if tagged {
		e.key.Tag = tag
	}
	sh.m[s] = e
	in.n.Add(1)
	return e
}

// matches reports whether e was interned with this tag and scope.
func (e *entry) matches(tag string, tagged, global bool) bool {
	want := ""
	if tagged {
		want = tag
	}
	return e.key.Tag == want && e.global == global
}

// record adds one outcome to e's counters, following e to its replacement
// if Tick evicted it meanwhile, and returns the entry it counted in (nil
// if the table filled meanwhile).
func (in *interner) record(e *entry, cost int64, admitted bool) *entry {
	for {
		sh := in.shardOfString(e.name)
		sh.mu.RLock()
		if !e.dead {
			e.offered.Add(1)
			e.offeredCost.Add(cost)
			if admitted {
				e.admitted.Add(cost)
			} else {
				e.denied.Add(cost)
			}
			sh.mu.RUnlock()
			return e
		}
		sh.mu.RUnlock()
		ne := in.get([]byte(e.name), e.key.Tag, e.key.Tag != "", e.global)
		if ne == nil {
			return nil // the table filled meanwhile
		}
		e = ne
	}
}

// appendEscaped appends s with '%', '/', '=' and control bytes written as
// %XX, so that names joined with '/' and '=' stay injective.
func appendEscaped(b []byte, s string) []byte {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '%' || c == '/' || c == '=' || c < 0x20 || c == 0x7f {
			b = append(b, '%', hex[c>>4], hex[c&15])
			continue
		}
		b = append(b, c)
	}
	return b
}

// KeyName is the canonical name of the key a descriptor's entries form in a
// domain: "domain/k1=v1/k2=v2" with '%', '/', '=' and control bytes
// percent-escaped, so distinct descriptors never share a name. Reports,
// tables and the store use it.
func KeyName(domain string, entries []Entry) string {
	return string(appendKeyName(nil, domain, entries))
}

func appendKeyName(b []byte, domain string, entries []Entry) []byte {
	b = appendEscaped(b, domain)
	for _, e := range entries {
		b = append(b, '/')
		b = appendEscaped(b, e.Key)
		b = append(b, '=')
		b = appendEscaped(b, e.Value)
	}
	return b
}

// ParseKeyName is the inverse of KeyName: the domain and entries a
// canonical key name was made from. A name KeyName cannot produce is an
// error.
func ParseKeyName(name string) (domain string, entries []Entry, err error) {
	parts := strings.Split(name, "/")
	if domain, err = unescape(parts[0]); err != nil || domain == "" {
		return "", nil, fmt.Errorf("region: key name %q: bad domain", name)
	}
	if len(parts) == 1 {
		return "", nil, fmt.Errorf("region: key name %q: no entries", name)
	}
	for _, p := range parts[1:] {
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			return "", nil, fmt.Errorf("region: key name %q: entry %q lacks '='", name, p)
		}
		ek, err1 := unescape(k)
		ev, err2 := unescape(v)
		if err1 != nil || err2 != nil || ek == "" {
			return "", nil, fmt.Errorf("region: key name %q: bad entry %q", name, p)
		}
		entries = append(entries, Entry{Key: ek, Value: ev})
	}
	if KeyName(domain, entries) != name {
		return "", nil, fmt.Errorf("region: key name %q is not canonical", name)
	}
	return domain, entries, nil
}

func unescape(s string) (string, error) {
	if !strings.Contains(s, "%") {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", errors.New("truncated escape")
		}
		v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil {
			return "", err
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), nil
}

// fnv32 is the 32-bit FNV-1a hash of s: a key's refresh offset, the same
// in every process (the simulator's runs repeat exactly).
func fnv32(s string) uint32 {
	h := uint32(2166136261)
	for i := range len(s) {
		h = (h ^ uint32(s[i])) * 16777619
	}
	return h
}
