package wire

import (
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/meridian-quota/meridian/rebalance"
)

// Delta tables. A table the coordinator encodes from a base (the table it
// stored before) may carry, in its head, only the rows that changed since
// that base: the head then holds the header and a Delta and no rows, and
// chunks 1 … Count-1 hold every row of the whole table as before. A
// reader that holds the base patches it with the delta (Patch) and reads
// nothing else; any other reader — one on another base, a fresh one, a
// reader of the previous minor version, which skips the unknown field —
// fetches the chunks and assembles the whole table. Both ways give the
// same table: the delta names the digest of the whole table's rows, and
// both Patch and the Assembler check it.

// DigestSize is the bytes of a table digest (SHA-256).
const DigestSize = sha256.Size

// Delta is the change a delta table makes to its base table (BaseTerm,
// BaseEpoch): Changed rows replace the base's rows of the same key or are
// added, Removed keys leave the table (explicit tombstones), every other
// row is the base's. Digest is TableDigest of the whole table's rows.
// Changed is sorted by key and distinct, Removed too, and no key is in
// both.
type Delta struct {
	BaseTerm, BaseEpoch uint64
	Digest              [DigestSize]byte
	Changed             []rebalance.KeyShares
	Removed             []string
	// InBase: the table stores no chunks of its own. Its rows are the
	// base's — chunks 1 … Count-1 stored under the base's term and epoch,
	// whose head carries none — with this delta applied (EncodeTableOn,
	// PatchRows).
	InBase bool
	// Patched rows replace base rows that keep their key and budget, each
	// named by its place among the base's rows (FeatureRowPatches): sorted
	// by Index and distinct; a base row patched is neither in Changed nor
	// in Removed.
	Patched []RowPatch
}

// RowPatch is a changed row of a delta's base named by its place among the
// base's rows (in key order): the row keeps its key and budget, its
// version becomes the base row's plus Step, its shares and bursts these.
// It costs the bus its version step, shares and bursts, where the whole
// row also carries its key and budget.
type RowPatch struct {
	Index  int
	Step   int64
	Shares []uint32
	Bursts []int64
}

// ErrBase is wrapped by Patch's error when the delta does not apply to
// the table given as its base: another (term, epoch), other regions, a
// removed key the base lacks, or a result whose digest is not the one the
// delta names. The reader then reads the whole table from its chunks.
// errors.Is(err, ErrInvalid) holds for it too.
var ErrBase error = &kindError{"wire: delta on another base"}

// TableDigest returns the SHA-256 of rows as a table's chunks encode them
// (each row's KeyShares field, tag and length included, in order), so a
// table's digest depends on its rows only, not on how they are chunked.
func TableDigest(rows []rebalance.KeyShares) [DigestSize]byte {
	h := sha256.New()
	var buf []byte
	for i := range rows {
		buf = appendKeyShares(buf[:0], fTabKeys, &rows[i])
		h.Write(buf)
	}
	var d [DigestSize]byte
	h.Sum(d[:0])
	return d
}

// sameRow reports whether a and b encode to the same bytes.
func sameRow(a, b *rebalance.KeyShares) bool {
	return a.Key == b.Key && a.Version == b.Version && a.Budget == b.Budget &&
		slices.Equal(a.Shares, b.Shares) && slices.Equal(a.Bursts, b.Bursts)
}

// diff returns the delta that turns base's rows into t's (digest unset),
// with a changed row that keeps its key and budget as a RowPatch when
// patches is set.
func diff(base, t *rebalance.Table, patches bool) *Delta {
	d := &Delta{BaseTerm: base.Term, BaseEpoch: base.Epoch}
	b, n := base.Keys, t.Keys
	i, j := 0, 0
	for i < len(b) || j < len(n) {
		switch {
		case j == len(n) || i < len(b) && b[i].Key < n[j].Key:
			d.Removed = append(d.Removed, b[i].Key)
			i++
		case i == len(b) || n[j].Key < b[i].Key:
			d.Changed = append(d.Changed, n[j])
			j++
		default:
			switch {
			case sameRow(&b[i], &n[j]):
			case patches && b[i].Budget == n[j].Budget:
				// Both versions are at most 2^60 (checkRow): the step fits.
				d.Patched = append(d.Patched, RowPatch{Index: i, Step: int64(n[j].Version) - int64(b[i].Version),
					Shares: n[j].Shares, Bursts: n[j].Bursts})
			default:
				d.Changed = append(d.Changed, n[j])
			}
			i, j = i+1, j+1
		}
	}
	return d
}

// deltaCanBase reports whether t may be encoded as a delta on base: a
// published table of the same regions, before t.
func deltaCanBase(base, t *rebalance.Table) bool {
	return base != nil && !base.Shadow && len(t.Keys) > 0 && slices.Equal(base.Regions, t.Regions) &&
		(base.Term < t.Term || base.Term == t.Term && base.Epoch < t.Epoch)
}

func deltaSize(d *Delta) int {
	n := sizeU(d.BaseTerm) + sizeU(d.BaseEpoch) + sizeElem(DigestSize)
	for i := range d.Changed {
		n += sizeElem(keySharesSize(&d.Changed[i]))
	}
	for _, k := range d.Removed {
		n += sizeElem(len(k))
	}
	if d.InBase {
		n += 2
	}
	for i := range d.Patched {
		n += sizeElem(rowPatchSize(&d.Patched[i]))
	}
	return n
}

func rowPatchSize(p *RowPatch) int {
	return sizeU(uint64(p.Index)) + sizeS(p.Step) + sizePacked(packed(p.Shares)) + sizePacked(packed(p.Bursts))
}

func appendDelta(b []byte, d *Delta, size int) []byte {
	b = appendLen(b, fTabDelta, size)
	b = appendU(b, fDelBaseTerm, d.BaseTerm)
	b = appendU(b, fDelBaseEpoch, d.BaseEpoch)
	b = appendLen(b, fDelDigest, DigestSize)
	b = append(b, d.Digest[:]...)
	for i := range d.Changed {
		b = appendKeyShares(b, fDelChanged, &d.Changed[i])
	}
	for _, k := range d.Removed {
		b = appendElem(b, fDelRemoved, k)
	}
	if d.InBase {
		b = appendU(b, fDelInBase, 1)
	}
	for i := range d.Patched {
		p := &d.Patched[i]
		b = appendLen(b, fDelPatched, rowPatchSize(p))
		b = appendU(b, fPatIndex, uint64(p.Index))
		b = appendS(b, fPatStep, p.Step)
		b = appendPacked(b, fKsShares, p.Shares)
		b = appendPacked(b, fKsBursts, p.Bursts)
	}
	return b
}

// EncodeTableFrom is EncodeTable for a table that follows base, the table
// the coordinator stored before it (nil: none). When base is a table of
// the same regions before t and a head with the rows that changed since
// base is smaller than all of EncodeTable's messages — by enough that,
// with one reader per region, the bus carries fewer bytes although the
// delta's chunks are one message more to store — chunk 0 carries
// the header and a Delta on base and no rows, and chunks 1 … n every row
// of t; otherwise the encoding is EncodeTable's. base is trusted: it must
// be a table the caller encoded before (its rows are compared, not
// checked).
func EncodeTableFrom(cluster string, t, base *rebalance.Table, key ed25519.PrivateKey, maxMessage int) ([][]byte, error) {
	return encodeTableFrom(cluster, t, base, key, maxMessage, false, 0)
}

// EncodeTableBase is EncodeTableFrom with no rows in chunk 0, so that the
// table's chunks 1 … n hold every row and a later table can be encoded as
// a delta on it alone (EncodeTableOn): the table a coordinator stores as
// the base of the heads that follow. A table with no rows is one message,
// as EncodeTableFrom makes it, and is no such base. reads is the feature
// bits every agent t names has reported: with FeatureRowPatches the
// head's delta carries row patches (Delta.Patched), which a reader
// without it cannot patch (it reads the chunks instead).
func EncodeTableBase(cluster string, t, base *rebalance.Table, key ed25519.PrivateKey, maxMessage int, reads uint32) ([][]byte, error) {
	return encodeTableFrom(cluster, t, base, key, maxMessage, true, reads)
}

func encodeTableFrom(cluster string, t, base *rebalance.Table, key ed25519.PrivateKey, maxMessage int, rowsOut bool, reads uint32) ([][]byte, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("wire: encode table: private key of %d bytes, want %d", len(key), ed25519.PrivateKeySize)
	}
	if err := checkTable(cluster, t); err != nil {
		return nil, fmt.Errorf("wire: encode table: %w", err)
	}
	var d *Delta
	if deltaCanBase(base, t) {
		d = diff(base, t, reads&FeatureRowPatches != 0)
	}
	hdr := headerSize(t)
	env := envFixed(cluster, true)
	var chunks []chunk
	emit := func(c chunk) { chunks = append(chunks, c) }
	total, n, err := 0, 0, error(nil)
	dsize := 0
	if d != nil {
		// A delta only where it is smaller than the whole table: a reader
		// on the base then reads less, any other reads the chunks as ever.
		dsize = deltaSize(d)
		head := tableFixed(t) + sizeElem(hdr) + sizeElem(dsize)
		whole, _, werr := planTable(cluster, t, hdr, maxMessage, nil)
		if werr != nil || envSize(env, head) >= whole || envSize(env, head) > maxMessage {
			d = nil
		} else {
			emit(chunk{0, 0, head})
			total, n, err = plan(maxMessage, env, tableFixed(t), 0, len(t.Keys),
				func(i int) int { return sizeElem(keySharesSize(&t.Keys[i])) }, emit)
			// What the bus carries: the coordinator puts every message
			// once and each region reads the head, or the whole table.
			// The delta's chunks cost one put more than the whole
			// table's, so it must save that much on the heads.
			readers := len(t.Regions)
			if err == nil && (readers+1)*envSize(env, head)+total >= (readers+1)*whole {
				d, chunks = nil, chunks[:0]
			} else {
				total, n = total+envSize(env, head), n+1
			}
		}
	}
	switch {
	case d == nil && rowsOut && len(t.Keys) > 0:
		head := tableFixed(t) + sizeElem(hdr)
		if envSize(env, head) > maxMessage {
			return nil, fmt.Errorf("wire: encode table: header of %d bytes does not fit in a %d-byte message", envSize(env, head), maxMessage)
		}
		emit(chunk{0, 0, head})
		total, n, err = plan(maxMessage, env, tableFixed(t), 0, len(t.Keys),
			func(i int) int { return sizeElem(keySharesSize(&t.Keys[i])) }, emit)
		total, n = total+envSize(env, head), n+1
	case d == nil:
		total, n, err = planTable(cluster, t, hdr, maxMessage, emit)
	}
	if err != nil {
		return nil, fmt.Errorf("wire: encode table: %w", err)
	}
	if d != nil {
		d.Digest = TableDigest(t.Keys)
	}
	return writeTable(cluster, t, key, hdr, d, dsize, chunks, total, n, n), nil
}

// EncodeTableOn encodes t as one message: a head carrying the header and
// a Delta on base whose rows are base's (Delta.InBase), and no chunks of
// its own. base must be a table the caller stored with EncodeTableBase in
// count messages (count ≥ 2), whose chunks are still stored; a reader
// holding base's rows patches them, any other fetches base's chunks 1 …
// count-1 and patches those (BaseRows, Patch). ok is false, with no error,
// when t cannot be such a delta (base is no table of t's regions before
// it, or has no rows) or the head would not fit in maxMessage; the caller
// then stores a new base, as it does when that costs the bus less.
//
// A reader of an earlier minor version, which skips the delta, reads the
// head as a table of count chunks under t's own term and epoch, finds none
// and applies nothing: a coordinator uses EncodeTableOn only once every
// agent its table names has reported FeatureInBase, and reads says which
// further features they all read (EncodeTableBase).
func EncodeTableOn(cluster string, t, base *rebalance.Table, count int, key ed25519.PrivateKey, maxMessage int, reads uint32) (head []byte, ok bool, err error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, false, fmt.Errorf("wire: encode table: private key of %d bytes, want %d", len(key), ed25519.PrivateKeySize)
	}
	if err := checkTable(cluster, t); err != nil {
		return nil, false, fmt.Errorf("wire: encode table: %w", err)
	}
	if !deltaCanBase(base, t) || len(base.Keys) == 0 || count < 2 || int64(count) > 1<<32-1 {
		return nil, false, nil
	}
	d := diff(base, t, reads&FeatureRowPatches != 0)
	d.InBase = true
	hdr, env := headerSize(t), envFixed(cluster, true)
	dsize := deltaSize(d)
	body := tableFixed(t) + sizeElem(hdr) + sizeElem(dsize)
	size := envSize(env, body)
	if size > maxMessage {
		return nil, false, nil
	}
	d.Digest = TableDigest(t.Keys)
	out := writeTable(cluster, t, key, hdr, d, dsize, []chunk{{0, 0, body}}, size, 1, count)
	return out[0], true, nil
}

// BaseRows returns the base table an InBase delta head names, as far as
// its chunks give it: term, epoch and the rows of chunks 1 … count-1 of
// table (term, epoch), decoded in order (none of them a head), under the
// head's regions — what Patch takes as the base. Every error wraps
// ErrInvalid: a chunk of another table, out of order, with a header, or
// rows out of order or unfit for regions.
func BaseRows(term, epoch uint64, count int, regions []string, chunks []*TableChunk, lim Limits) (*rebalance.Table, error) {
	if count < 2 || len(chunks) != count-1 {
		return nil, invalidf("base table %d.%d: %d chunks for a count of %d", term, epoch, len(chunks), count)
	}
	n := 0
	for i, c := range chunks {
		switch {
		case c == nil || c.Term != term || c.Epoch != epoch:
			return nil, invalidf("base table %d.%d chunk %d: of another table", term, epoch, i+1)
		case c.Index != i+1 || c.Count != count:
			return nil, invalidf("base table %d.%d: chunk %d of %d where chunk %d of %d was due", term, epoch, c.Index, c.Count, i+1, count)
		case c.Header != nil || c.Delta != nil:
			return nil, invalidf("base table %d.%d chunk %d: a head", term, epoch, i+1)
		}
		n += len(c.Keys)
	}
	if n > lim.MaxKeys {
		return nil, invalidf("base table %d.%d: %d keys, above the limit of %d", term, epoch, n, lim.MaxKeys)
	}
	t := &rebalance.Table{Term: term, Epoch: epoch, Regions: regions, Keys: make([]rebalance.KeyShares, 0, n)}
	for _, c := range chunks {
		for i := range c.Keys {
			ks := &c.Keys[i]
			if err := checkRow(ks, len(regions), lim); err != nil {
				return nil, invalidf("base table %d.%d key %q: %v", term, epoch, ks.Key, err)
			}
			if k := len(t.Keys); k > 0 && t.Keys[k-1].Key >= ks.Key {
				return nil, invalidf("base table %d.%d key %q: keys not sorted and distinct", term, epoch, ks.Key)
			}
			t.Keys = append(t.Keys, *ks)
		}
	}
	return t, nil
}

// writeTable writes the planned chunks of t (chunk 0 with delta d, unless
// nil) and signs each.
func writeTable(cluster string, t *rebalance.Table, key ed25519.PrivateKey, hdr int, d *Delta, dsize int, chunks []chunk, total, n, count int) [][]byte {
	buf := make([]byte, 0, total)
	out := make([][]byte, n)
	for ci, c := range chunks {
		s := len(buf)
		buf = appendEnvHead(buf, cluster, KindTable, c.body)
		buf = appendU(buf, fTabTerm, t.Term)
		buf = appendU(buf, fTabEpoch, t.Epoch)
		buf = appendFixed(buf, fTabIndex, ci)
		buf = appendFixed(buf, fTabCount, count)
		if ci == 0 {
			buf = appendLen(buf, fTabHeader, hdr)
			buf = appendHeader(buf, t)
			if d != nil {
				buf = appendDelta(buf, d, dsize)
			}
		}
		for i := c.start; i < c.end; i++ {
			buf = appendKeyShares(buf, fTabKeys, &t.Keys[i])
		}
		sig := ed25519.Sign(key, buf[s:])
		buf = append(buf, tag(fEnvSignature, protowire.BytesType), SignatureSize)
		buf = append(buf, sig...)
		out[ci] = buf[s:len(buf):len(buf)]
	}
	return out
}

// decodeDelta reads a Delta of a table of the given regions.
func decodeDelta(b []byte, regions int, lim Limits) (*Delta, error) {
	d := &Delta{}
	var (
		seen            fieldSet
		digest          []byte
		nrows, nremoved int
		npatched        int
		nshares, nburst int
		inBase          uint64
	)
	fr := fieldReader{msg: b}
	for fr.next() {
		switch f := &fr.f; f.num {
		case fDelBaseTerm:
			fr.why = seen.u64(f, &d.BaseTerm)
		case fDelBaseEpoch:
			fr.why = seen.u64(f, &d.BaseEpoch)
		case fDelDigest:
			fr.why = seen.bytes(f, &digest)
		case fDelChanged, fDelPatched:
			// A whole row or a patch: both carry shares and bursts as
			// fields 3 and 4, counted here to size the arena.
			if fr.why = wantType(f, protowire.BytesType); fr.why == "" {
				if f.num == fDelChanged {
					nrows++
				} else {
					npatched++
				}
				s, bu := countPacked(f.b)
				nshares += s
				nburst += bu
			}
		case fDelRemoved:
			if fr.why = wantType(f, protowire.BytesType); fr.why == "" {
				nremoved++
			}
		case fDelInBase:
			if fr.why = seen.u64(f, &inBase); fr.why == "" && inBase > 1 {
				fr.why = fmt.Sprintf("in_base %d: a bool is 0 or 1", inBase)
			}
		}
	}
	if fr.why != "" {
		return nil, invalidf("table chunk 0 delta at byte %d: %s", fr.off, fr.why)
	}
	switch {
	case len(digest) != DigestSize:
		return nil, invalidf("table chunk 0 delta: digest of %d bytes, want %d", len(digest), DigestSize)
	case nrows+nremoved+npatched > lim.MaxKeys:
		return nil, invalidf("table chunk 0 delta: %d keys, above the limit of %d", nrows+nremoved+npatched, lim.MaxKeys)
	}
	copy(d.Digest[:], digest)
	d.InBase = inBase == 1
	if nrows > 0 {
		d.Changed = make([]rebalance.KeyShares, 0, nrows)
	}
	if nremoved > 0 {
		d.Removed = make([]string, 0, nremoved)
	}
	if npatched > 0 {
		d.Patched = make([]RowPatch, 0, npatched)
	}
	a := arena{shares: make([]uint32, nshares), bursts: make([]int64, nburst)}
	str := string(b)
	for fr = (fieldReader{msg: b}); fr.next(); {
		f := &fr.f
		switch f.num {
		case fDelChanged:
			i := len(d.Changed)
			d.Changed = append(d.Changed, rebalance.KeyShares{})
			ks := &d.Changed[i]
			if why := readKeyShares(ks, f.b, fr.in(str), &a, lim); why != "" {
				return nil, invalidf("table chunk 0 delta changed key %d: %s", i, why)
			}
			if err := checkRow(ks, regions, lim); err != nil {
				return nil, invalidf("table chunk 0 delta changed key %d: %v", i, err)
			}
			if i > 0 && d.Changed[i-1].Key >= ks.Key {
				return nil, invalidf("table chunk 0 delta changed key %d: keys not sorted and distinct", i)
			}
		case fDelRemoved:
			i := len(d.Removed)
			k := fr.in(str)
			if len(k) == 0 || len(k) > lim.MaxKeyLen {
				return nil, invalidf("table chunk 0 delta removed key %d: name of %d bytes outside [1, %d]", i, len(k), lim.MaxKeyLen)
			}
			if i > 0 && d.Removed[i-1] >= k {
				return nil, invalidf("table chunk 0 delta removed key %d: keys not sorted and distinct", i)
			}
			d.Removed = append(d.Removed, k)
		case fDelPatched:
			i := len(d.Patched)
			d.Patched = append(d.Patched, RowPatch{})
			p := &d.Patched[i]
			if why := readRowPatch(p, f.b, regions, &a, lim); why != "" {
				return nil, invalidf("table chunk 0 delta patched row %d: %s", i, why)
			}
			if i > 0 && d.Patched[i-1].Index >= p.Index {
				return nil, invalidf("table chunk 0 delta patched row %d: index %d after %d: not sorted and distinct", i, p.Index, d.Patched[i-1].Index)
			}
		}
	}
	for i, j := 0, 0; i < len(d.Changed) && j < len(d.Removed); {
		switch c, r := d.Changed[i].Key, d.Removed[j]; {
		case c == r:
			return nil, invalidf("table chunk 0 delta: key %q both changed and removed", c)
		case c < r:
			i++
		default:
			j++
		}
	}
	return d, nil
}

// readRowPatch reads one RowPatch of a table of the given regions: an
// index below the most rows a table may have, one share per region, no
// bursts or one per region (the values are checked, with the row they
// make, by Patch).
func readRowPatch(p *RowPatch, b []byte, regions int, a *arena, lim Limits) string {
	var (
		seen  fieldSet
		index uint64
	)
	fr := fieldReader{msg: b}
	for fr.next() {
		switch f := &fr.f; f.num {
		case fPatIndex:
			fr.why = seen.u64(f, &index)
		case fPatStep:
			fr.why = seen.zigzag(f, &p.Step)
		case fKsShares, fKsBursts:
			fr.why = a.readSharesOrBursts(f, &seen, lim, &p.Shares, &p.Bursts)
		}
	}
	switch {
	case fr.why != "":
		return fmt.Sprintf("at byte %d: %s", fr.off, fr.why)
	case index >= uint64(lim.MaxKeys):
		return fmt.Sprintf("index %d: a table has at most %d rows", index, lim.MaxKeys)
	case regions >= 0 && len(p.Shares) != regions:
		return fmt.Sprintf("shares has %d entries for %d regions", len(p.Shares), regions)
	case len(p.Bursts) != 0 && len(p.Bursts) != len(p.Shares):
		return fmt.Sprintf("bursts has %d entries for %d shares", len(p.Bursts), len(p.Shares))
	}
	p.Index = int(index)
	return ""
}

// patchRow returns base row ks with p applied, copied out of the message
// p was decoded from, or why it cannot be.
func patchRow(ks rebalance.KeyShares, p *RowPatch, regions int, lim Limits) (rebalance.KeyShares, error) {
	// The base row's version is at most 2^60 (checkRow): with the step
	// bounded first, the sum cannot overflow.
	v := int64(ks.Version) + max(min(p.Step, 1<<61), -(1<<61))
	if v < 0 || v > maxVersion {
		return ks, fmt.Errorf("version %d stepped by %d leaves [0, 2^60]", ks.Version, p.Step)
	}
	ks.Version = uint64(v)
	ks.Shares = slices.Clone(p.Shares)
	ks.Bursts = slices.Clone(p.Bursts)
	return ks, checkRow(&ks, regions, lim)
}

// Patch returns the table a delta head (chunk 0 of a delta table, as
// Decode returned it) makes of base, the whole table the reader holds:
// the head's header with base's rows, changed and removed as the delta
// says. It fails, wrapping ErrBase, when the delta is on another table or
// the result's digest is not the delta's; then the chunks hold the table.
// base is trusted (a table the reader assembled or patched before); the
// result shares base's unchanged rows, and no table is modified. A base
// that is the head's own table (the same term and epoch: the head read
// again) yields its rows under the head's header, digest checked.
func Patch(base *rebalance.Table, head *TableChunk, lim Limits) (*rebalance.Table, error) {
	if err := lim.Validate(); err != nil {
		return nil, fmt.Errorf("wire: patch: %w", err)
	}
	if head == nil || head.Index != 0 || head.Header == nil || head.Delta == nil {
		return nil, invalidf("patch: not the head of a delta table")
	}
	d, h := head.Delta, head.Header
	if base != nil && base.Term == head.Term && base.Epoch == head.Epoch {
		// The head of the table the reader holds, read again (a resync):
		// its rows if they have the digest the head names.
		if !slices.Equal(base.Regions, h.Regions) || TableDigest(base.Keys) != d.Digest {
			return nil, fmt.Errorf("%w: table %d.%d read again does not have the digest its delta names", ErrBase, head.Term, head.Epoch)
		}
		t := *h
		t.Keys = base.Keys
		return &t, nil
	}
	switch {
	case base == nil:
		return nil, fmt.Errorf("%w: table %d.%d is a delta on %d.%d; no base held", ErrBase, head.Term, head.Epoch, d.BaseTerm, d.BaseEpoch)
	case base.Term != d.BaseTerm || base.Epoch != d.BaseEpoch:
		return nil, fmt.Errorf("%w: table %d.%d is a delta on %d.%d; %d.%d held", ErrBase, head.Term, head.Epoch, d.BaseTerm, d.BaseEpoch, base.Term, base.Epoch)
	case !slices.Equal(base.Regions, h.Regions):
		return nil, fmt.Errorf("%w: table %d.%d names regions %v, its base %v", ErrBase, head.Term, head.Epoch, h.Regions, base.Regions)
	case h.Shadow:
		return nil, invalidf("patch: table term %d epoch %d header: a shadow table", h.Term, h.Epoch)
	}
	rows := make([]rebalance.KeyShares, 0, len(base.Keys)+len(d.Changed)-len(d.Removed))
	b, c, r, p := base.Keys, d.Changed, d.Removed, d.Patched
	bi := 0 // b[bi] is the next base row
	// patched: whether the next patch names b[bi], which then must be
	// neither removed nor replaced whole.
	patched := func() bool { return len(p) > 0 && p[0].Index == bi }
	for bi < len(b) || len(c) > 0 {
		switch {
		case len(r) > 0 && (bi == len(b) || r[0] < b[bi].Key):
			return nil, fmt.Errorf("%w: table %d.%d removes %q, which its base lacks", ErrBase, head.Term, head.Epoch, r[0])
		case bi < len(b) && len(r) > 0 && b[bi].Key == r[0]:
			if patched() {
				return nil, fmt.Errorf("%w: table %d.%d both removes and patches %q", ErrBase, head.Term, head.Epoch, r[0])
			}
			bi, r = bi+1, r[1:]
		case len(c) == 0 || bi < len(b) && b[bi].Key < c[0].Key:
			row := b[bi]
			if patched() {
				var err error
				if row, err = patchRow(row, &p[0], len(h.Regions), lim); err != nil {
					return nil, fmt.Errorf("%w: table %d.%d patches row %d (%q) of %d.%d: %v", ErrBase, head.Term, head.Epoch, bi, b[bi].Key, base.Term, base.Epoch, err)
				}
				p = p[1:]
			}
			rows, bi = append(rows, row), bi+1
		default:
			if bi < len(b) && b[bi].Key == c[0].Key {
				if patched() {
					return nil, fmt.Errorf("%w: table %d.%d both changes and patches %q", ErrBase, head.Term, head.Epoch, c[0].Key)
				}
				bi++
			}
			rows, c = append(rows, cloneRow(c[0])), c[1:]
		}
	}
	if len(r) > 0 {
		return nil, fmt.Errorf("%w: table %d.%d removes %q, which its base lacks", ErrBase, head.Term, head.Epoch, r[0])
	}
	if len(p) > 0 {
		return nil, fmt.Errorf("%w: table %d.%d patches row %d; its base %d.%d has %d", ErrBase, head.Term, head.Epoch, p[0].Index, base.Term, base.Epoch, len(b))
	}
	if len(rows) > lim.MaxKeys {
		return nil, invalidf("patch: table term %d epoch %d: %d keys, above the limit of %d", h.Term, h.Epoch, len(rows), lim.MaxKeys)
	}
	if TableDigest(rows) != d.Digest {
		return nil, fmt.Errorf("%w: table %d.%d patched from %d.%d does not have the digest its delta names", ErrBase, head.Term, head.Epoch, base.Term, base.Epoch)
	}
	t := *h
	t.Keys = rows
	if len(rows) == 0 {
		t.Keys = nil
	}
	return &t, nil
}

// cloneRow copies a row out of the message it was decoded from, so a
// table patched again and again does not keep every delta head alive.
func cloneRow(ks rebalance.KeyShares) rebalance.KeyShares {
	ks.Key = strings.Clone(ks.Key)
	ks.Shares = slices.Clone(ks.Shares)
	ks.Bursts = slices.Clone(ks.Bursts)
	return ks
}

// errDigest is joinTable's refusal of a delta table whose chunks do not
// hold the rows its delta's digest names.
var errDigest = errors.New("the rows do not have the digest the delta names")

// IsDeltaHead reports whether b, a table head this package encoded, is a
// delta head (its chunk 0 carries a Delta): it parses b's fields without
// verifying its signature, for an encoder weighing its own output.
func IsDeltaHead(b []byte) bool {
	env := fieldReader{msg: b}
	for env.next() {
		if env.f.num != fEnvBody {
			continue
		}
		body := fieldReader{msg: env.f.b}
		for body.next() {
			if body.f.num == fTabDelta {
				return true
			}
		}
		return false
	}
	return false
}
