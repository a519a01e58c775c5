package wire

import (
	"crypto/ed25519"
	"fmt"
	"math"
	"strings"
	"time"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/rebalance"
)

// Decode reads and validates one message of cluster from b:
//
//   - the envelope: at most lim.MaxMessage bytes, Version, the cluster
//     (ErrCluster for another), a known kind;
//   - a table's signature (the last field; ErrSignature unless one of keys
//     verifies it — with no keys every table is refused);
//   - the body: every count and length against lim before anything is
//     allocated for it, names non-empty and at most lim.MaxName bytes, key
//     names at most lim.MaxKeyLen, Index < Count ≤ lim.MaxChunks, a table's
//     header in chunk 0 only, and what region.Node.Apply and the
//     coordinator rely on: non-negative demand; regions sorted and distinct
//     with one lease and one sorted agent list each; times in [0, 2^52) µs;
//     rows sorted by key and distinct, each with one share per region when
//     the header is known (one to lim.MaxRegions otherwise), shares of at
//     most 10⁶ ppm summing to at most 10⁶ (unless lim.AllowOvercommit),
//     Bursts empty or one non-negative burst per share, a valid budget and
//     a version of at most 2^60.
//
// Unknown fields are skipped; a known field of the wrong wire type, a
// singular field given twice, or a packed field in unpacked form is
// refused. Every error wraps ErrInvalid and says where and why. Decode
// allocates at most a small multiple of len(b); the key names of one chunk
// share one string holding the names alone. It never retains b. Safe for
// concurrent use.
func Decode(cluster string, b []byte, lim Limits, keys []ed25519.PublicKey) (Message, error) {
	if err := lim.Validate(); err != nil {
		return Message{}, fmt.Errorf("wire: decode: %w", err)
	}
	if len(b) > lim.MaxMessage {
		return Message{}, invalidf("message of %d bytes, above the limit of %d", len(b), lim.MaxMessage)
	}
	var (
		seen           fieldSet
		version, kind  uint64
		clu, body, sig []byte
		signed         = -1 // offset of the signature field
		after          bool // a field follows the signature
	)
	fr := fieldReader{msg: b}
	for fr.next() {
		after = after || signed >= 0
		switch f := &fr.f; f.num {
		case fEnvVersion:
			fr.why = seen.u64(f, &version)
		case fEnvCluster:
			fr.why = seen.bytes(f, &clu)
		case fEnvKind:
			fr.why = seen.u64(f, &kind)
		case fEnvBody:
			fr.why = seen.bytes(f, &body)
		case fEnvSignature:
			fr.why = seen.bytes(f, &sig)
			signed = fr.off
		}
	}
	if fr.why != "" {
		return Message{}, invalidf("envelope at byte %d: %s", fr.off, fr.why)
	}
	if version != Version {
		return Message{}, invalidf("version %d, this decoder reads version %d", version, Version)
	}
	if string(clu) != cluster {
		if len(clu) > lim.MaxName {
			return Message{}, fmt.Errorf("%w: a cluster name of %d bytes, this is %q", ErrCluster, len(clu), cluster)
		}
		return Message{}, fmt.Errorf("%w: message for %q, this is %q", ErrCluster, clu, cluster)
	}
	switch kind {
	case uint64(KindReport):
		c, err := decodeReport(body, lim)
		if err != nil {
			return Message{}, err
		}
		return Message{Kind: KindReport, Report: c}, nil
	case uint64(KindAck):
		a, err := decodeAck(body, lim)
		if err != nil {
			return Message{}, err
		}
		return Message{Kind: KindAck, Ack: a}, nil
	case uint64(KindTable):
		if after {
			return Message{}, fmt.Errorf("%w: table: fields after the signature", ErrSignature)
		}
		if err := verify(b, signed, sig, keys); err != nil {
			return Message{}, err
		}
		t, err := decodeTable(body, lim)
		if err != nil {
			return Message{}, err
		}
		return Message{Kind: KindTable, Table: t}, nil
	}
	return Message{}, invalidf("unknown kind %d", kind)
}

// verify checks a table's signature: the last field of the envelope,
// over every byte before it.
func verify(b []byte, signed int, sig []byte, keys []ed25519.PublicKey) error {
	switch {
	case signed < 0:
		return fmt.Errorf("%w: table: not signed", ErrSignature)
	case len(sig) != SignatureSize:
		return fmt.Errorf("%w: table: signature of %d bytes, want %d", ErrSignature, len(sig), SignatureSize)
	case len(keys) == 0:
		return fmt.Errorf("%w: table: no trusted keys to verify it with", ErrSignature)
	}
	for _, k := range keys {
		// ed25519.Verify panics on a key of the wrong length: such a key
		// verifies nothing.
		if len(k) == ed25519.PublicKeySize && ed25519.Verify(k, b[:signed], sig) {
			return nil
		}
	}
	return fmt.Errorf("%w: table: none of %d trusted keys verifies it", ErrSignature, len(keys))
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// field is one field read from a message: v holds a varint or fixed32, b
// the bytes of a length-delimited field.
type field struct {
	num protowire.Number
	typ protowire.Type
	v   uint64
	b   []byte
}

// fieldReader reads the fields of msg in order, as a bufio.Scanner reads
// lines: each call of next reads one into f and reports whether it could.
// It stops at the end of msg, at a field that cannot be read, or once the
// caller set why, the reason it refuses f. Then why says what went wrong
// with the field at offset off ("" at the end of msg).
type fieldReader struct {
	msg      []byte
	f        field
	off, end int // where f is in msg
	why      string
}

func (r *fieldReader) next() bool {
	if r.why != "" || r.end >= len(r.msg) {
		return false
	}
	r.off = r.end
	b := r.msg[r.off:]
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 {
		r.why = "tag: " + protowire.ParseError(n).Error()
		return false
	}
	r.f = field{num: num, typ: typ}
	var m int
	switch typ {
	case protowire.VarintType:
		r.f.v, m = protowire.ConsumeVarint(b[n:])
	case protowire.Fixed32Type:
		var v uint32
		v, m = protowire.ConsumeFixed32(b[n:])
		r.f.v = uint64(v)
	case protowire.BytesType:
		r.f.b, m = protowire.ConsumeBytes(b[n:])
	default:
		m = protowire.ConsumeFieldValue(num, typ, b[n:])
	}
	if m < 0 {
		r.why = fmt.Sprintf("field %d: %v", num, protowire.ParseError(m))
		return false
	}
	r.end = r.off + n + m
	return true
}

// in returns the bytes of f as a substring of s, msg as a string.
func (r *fieldReader) in(s string) string { return s[r.end-len(r.f.b) : r.end] }

// fieldSet records the singular fields seen in one message.
type fieldSet uint32

// once checks that f, a known singular field, has wire type typ and was
// not seen before.
func (s *fieldSet) once(f *field, typ protowire.Type) string {
	bit := fieldSet(1) << f.num
	if f.typ != typ || *s&bit != 0 {
		return s.refuse(f, typ)
	}
	*s |= bit
	return ""
}

// refuse says why once refuses f.
func (s *fieldSet) refuse(f *field, typ protowire.Type) string {
	if why := wantType(f, typ); why != "" {
		return why
	}
	return fmt.Sprintf("field %d given twice", f.num)
}

// setOnce stores v, the value of f, in *p if f passes s.once.
func setOnce[T any](s *fieldSet, f *field, typ protowire.Type, p *T, v T) string {
	why := s.once(f, typ)
	if why == "" {
		*p = v
	}
	return why
}

// Each of these reads a singular field of one type into *p (see once).
func (s *fieldSet) u64(f *field, p *uint64) string {
	return setOnce(s, f, protowire.VarintType, p, f.v)
}
func (s *fieldSet) i64(f *field, p *int64) string {
	return setOnce(s, f, protowire.VarintType, p, int64(f.v))
}
func (s *fieldSet) zigzag(f *field, p *int64) string {
	return setOnce(s, f, protowire.VarintType, p, protowire.DecodeZigZag(f.v))
}
func (s *fieldSet) fixed32(f *field, p *uint64) string {
	return setOnce(s, f, protowire.Fixed32Type, p, f.v)
}
func (s *fieldSet) bytes(f *field, p *[]byte) string {
	return setOnce(s, f, protowire.BytesType, p, f.b)
}

// str is bytes for a field read as the substring v (see fieldReader.in).
func (s *fieldSet) str(f *field, v string, p *string) string {
	return setOnce(s, f, protowire.BytesType, p, v)
}

func wantType(f *field, typ protowire.Type) string {
	if f.typ != typ {
		return fmt.Sprintf("field %d: wire type %d, want %d", f.num, f.typ, typ)
	}
	return ""
}

// name checks a region, agent or policy name read from the wire and copies
// it.
func name(b []byte, max int, empty bool) (string, string) {
	switch {
	case len(b) == 0 && !empty:
		return "", "empty name"
	case len(b) > max:
		return "", fmt.Sprintf("name of %d bytes, above the limit of %d", len(b), max)
	}
	return string(b), ""
}

func checkChunk(index, count uint64, lim Limits) string {
	switch {
	case count == 0:
		return "count 0 (missing)"
	case count > uint64(lim.MaxChunks):
		return fmt.Sprintf("count %d, above the limit of %d chunks", count, lim.MaxChunks)
	case index >= count:
		return fmt.Sprintf("index %d, not below count %d", index, count)
	}
	return ""
}

// --- reports ---

func decodeReport(body []byte, lim Limits) (*ReportChunk, error) {
	c := &ReportChunk{}
	r := &c.Report
	var (
		seen                  fieldSet
		region, agent, policy []byte
		index, count          uint64
		features, delta       uint64
		nkeys                 int
	)
	// Pass 1: the singular fields, and how many keys there are.
	fr := fieldReader{msg: body}
	for fr.next() {
		switch f := &fr.f; f.num {
		case fRepRegion:
			fr.why = seen.bytes(f, &region)
		case fRepAgent:
			fr.why = seen.bytes(f, &agent)
		case fRepInterval:
			fr.why = seen.zigzag(f, &r.Interval)
		case fRepTerm:
			fr.why = seen.u64(f, &r.Term)
		case fRepEpoch:
			fr.why = seen.u64(f, &r.Epoch)
		case fRepPolicy:
			fr.why = seen.bytes(f, &policy)
		case fRepSent:
			fr.why = seen.zigzag(f, &c.Sent)
		case fRepIndex:
			fr.why = seen.fixed32(f, &index)
		case fRepCount:
			fr.why = seen.fixed32(f, &count)
		case fRepKeys:
			fr.why = wantType(f, protowire.BytesType)
			nkeys++
		case fRepFeatures:
			if fr.why = seen.u64(f, &features); fr.why == "" && features > math.MaxUint32 {
				fr.why = fmt.Sprintf("features %d: above 2^32-1", features)
			}
		case fRepDelta:
			if fr.why = seen.u64(f, &delta); fr.why == "" && delta > 1 {
				fr.why = fmt.Sprintf("delta %d: not a bool", delta)
			}
		}
	}
	if fr.why != "" {
		return nil, invalidf("report at byte %d: %s", fr.off, fr.why)
	}
	if why := checkChunk(index, count, lim); why != "" {
		return nil, invalidf("report chunk: %s", why)
	}
	c.Index, c.Count = int(index), int(count)
	r.Features, r.Delta = uint32(features), delta == 1
	var why string
	if r.Region, why = name(region, lim.MaxName, false); why != "" {
		return nil, invalidf("report chunk %d: region: %s", index, why)
	}
	if r.Agent, why = name(agent, lim.MaxName, false); why != "" {
		return nil, invalidf("report chunk %d: agent: %s", index, why)
	}
	if r.PolicyVersion, why = name(policy, lim.MaxName, true); why != "" {
		return nil, invalidf("report chunk %d: policy version: %s", index, why)
	}
	if nkeys > lim.MaxKeys {
		return nil, invalidf("report chunk %d: %d keys, above the limit of %d", index, nkeys, lim.MaxKeys)
	}
	if nkeys == 0 {
		return c, nil
	}
	// Pass 2: the keys, read from one copy of the body; then their names
	// move to a string of their own (compactKeys).
	r.Keys = make([]rebalance.KeyDemand, nkeys)
	str := transient(body)
	i := 0
	for fr = (fieldReader{msg: body}); fr.next(); {
		if f := &fr.f; f.num == fRepKeys {
			if why := readKeyDemand(&r.Keys[i], f.b, fr.in(str), lim); why != "" {
				return nil, invalidf("report chunk %d key %d: %s", index, i, why)
			}
			i++
		}
	}
	compactKeys(r.Keys, func(k *rebalance.KeyDemand) *string { return &k.Key })
	return c, nil
}

// readKeyDemand reads one KeyDemand from b; s is b as a string.
func readKeyDemand(k *rebalance.KeyDemand, b []byte, s string, lim Limits) string {
	var seen fieldSet
	fr := fieldReader{msg: b}
	for fr.next() {
		switch f := &fr.f; f.num {
		case fKdKey:
			fr.why = seen.str(f, fr.in(s), &k.Key)
		case fKdOffered:
			fr.why = seen.i64(f, &k.Offered)
		case fKdOfferedCost:
			fr.why = seen.i64(f, &k.OfferedCost)
		case fKdAdmitted:
			fr.why = seen.i64(f, &k.Admitted)
		case fKdDenied:
			fr.why = seen.i64(f, &k.Denied)
		}
	}
	if fr.why != "" {
		return fr.why
	}
	return badDemand(k, lim.MaxKeyLen)
}

// --- acks ---

func decodeAck(body []byte, lim Limits) (*Ack, error) {
	a := &Ack{}
	var (
		seen          fieldSet
		region, agent []byte
	)
	fr := fieldReader{msg: body}
	for fr.next() {
		switch f := &fr.f; f.num {
		case fAckRegion:
			fr.why = seen.bytes(f, &region)
		case fAckAgent:
			fr.why = seen.bytes(f, &agent)
		case fAckTerm:
			fr.why = seen.u64(f, &a.Term)
		case fAckEpoch:
			fr.why = seen.u64(f, &a.Epoch)
		case fAckSent:
			fr.why = seen.zigzag(f, &a.Sent)
		case fAckFenceT:
			fr.why = seen.u64(f, &a.Fence.Term)
		case fAckFenceE:
			fr.why = seen.u64(f, &a.Fence.Epoch)
		case fAckStore:
			fr.why = seen.u64(f, &a.Store)
		}
	}
	if fr.why != "" {
		return nil, invalidf("ack at byte %d: %s", fr.off, fr.why)
	}
	var why string
	if a.Region, why = name(region, lim.MaxName, false); why != "" {
		return nil, invalidf("ack: region: %s", why)
	}
	if a.Agent, why = name(agent, lim.MaxName, false); why != "" {
		return nil, invalidf("ack: agent: %s", why)
	}
	if a.Store == 0 && !a.Fence.IsZero() {
		return nil, invalidf("ack: a fence (term %d, epoch %d) with no store identity", a.Fence.Term, a.Fence.Epoch)
	}
	return a, nil
}

// --- tables ---

// terminators counts the varints in a packed field: the bytes that end
// one (an upper bound on what a malformed field holds).
func terminators(b []byte) int {
	n := 0
	for _, c := range b {
		if c < 0x80 {
			n++
		}
	}
	return n
}

func decodeTable(body []byte, lim Limits) (*TableChunk, error) {
	c := &TableChunk{}
	var (
		seen            fieldSet
		index, count    uint64
		header, delta   []byte
		hasHeader       bool
		hasDelta        bool
		nkeys           int
		nshares, nburst int
	)
	// Pass 1: the singular fields, how many rows, shares and bursts.
	fr := fieldReader{msg: body}
	for fr.next() {
		switch f := &fr.f; f.num {
		case fTabTerm:
			fr.why = seen.u64(f, &c.Term)
		case fTabEpoch:
			fr.why = seen.u64(f, &c.Epoch)
		case fTabIndex:
			fr.why = seen.fixed32(f, &index)
		case fTabCount:
			fr.why = seen.fixed32(f, &count)
		case fTabHeader:
			fr.why = seen.bytes(f, &header)
			hasHeader = true
		case fTabDelta:
			fr.why = seen.bytes(f, &delta)
			hasDelta = true
		case fTabKeys:
			if fr.why = wantType(f, protowire.BytesType); fr.why == "" {
				nkeys++
				s, b := countPacked(f.b)
				nshares += s
				nburst += b
			}
		}
	}
	if fr.why != "" {
		return nil, invalidf("table at byte %d: %s", fr.off, fr.why)
	}
	if why := checkChunk(index, count, lim); why != "" {
		return nil, invalidf("table chunk: %s", why)
	}
	c.Index, c.Count = int(index), int(count)
	switch {
	case index == 0 && !hasHeader:
		return nil, invalidf("table chunk 0: no header")
	case index > 0 && hasHeader:
		return nil, invalidf("table chunk %d: a header outside chunk 0", index)
	case hasDelta && index > 0:
		return nil, invalidf("table chunk %d: a delta outside chunk 0", index)
	case hasDelta && nkeys > 0:
		return nil, invalidf("table chunk 0: a delta head with %d rows (a delta head carries none)", nkeys)
	case hasDelta && count < 2:
		return nil, invalidf("table chunk 0: a delta head of a table of %d chunk (its rows are in chunks 1 and on)", count)
	case nkeys > lim.MaxKeys:
		return nil, invalidf("table chunk %d: %d keys, above the limit of %d", index, nkeys, lim.MaxKeys)
	}
	regions := -1
	if hasHeader {
		h, err := decodeHeader(header, lim)
		if err != nil {
			return nil, err
		}
		h.Term, h.Epoch = c.Term, c.Epoch
		c.Header, regions = h, len(h.Regions)
	}
	if hasDelta {
		d, err := decodeDelta(delta, regions, lim)
		if err != nil {
			return nil, err
		}
		if d.BaseTerm > c.Term || d.BaseTerm == c.Term && d.BaseEpoch >= c.Epoch {
			return nil, invalidf("table chunk 0: table %d.%d is a delta on %d.%d, which does not precede it", c.Term, c.Epoch, d.BaseTerm, d.BaseEpoch)
		}
		c.Delta = d
	}
	if nkeys == 0 {
		return c, nil
	}
	// Pass 2: the rows, read from one copy of the body (their names then
	// move to a string of their own: compactKeys), their shares and bursts
	// slices of two arrays.
	c.Keys = make([]rebalance.KeyShares, nkeys)
	a := arena{shares: make([]uint32, nshares)}
	if nburst > 0 {
		a.bursts = make([]int64, nburst)
	}
	str := transient(body)
	i := 0
	for fr = (fieldReader{msg: body}); fr.next(); {
		f := &fr.f
		if f.num != fTabKeys {
			continue
		}
		ks := &c.Keys[i]
		if why := readKeyShares(ks, f.b, fr.in(str), &a, lim); why != "" {
			return nil, invalidf("table chunk %d key %d: %s", index, i, why)
		}
		if err := checkRow(ks, regions, lim); err != nil {
			return nil, invalidf("table chunk %d key %d: %v", index, i, err)
		}
		if i > 0 && c.Keys[i-1].Key >= ks.Key {
			return nil, invalidf("table chunk %d key %d: keys not sorted and distinct", index, i)
		}
		i++
	}
	compactKeys(c.Keys, func(ks *rebalance.KeyShares) *string { return &ks.Key })
	return c, nil
}

// transient is body as a string without a copy, for reading names out of
// it: every name read from it leaves decoding through compactKeys, which
// copies them, and nothing else holds it past the decode. (A copy of the
// body per chunk was what the names used to keep alive.)
func transient(body []byte) string {
	return unsafe.String(unsafe.SliceData(body), len(body))
}

// compactKeys moves the names of rows, substrings of the body they were
// decoded from (transient), into one string of their own. Whatever keeps a name —
// a node's row, the coordinator's key, a reader's base — then keeps the
// names alone, not the whole body with every row's shares, bursts and
// budget: a region node's rows keep the names of the first table that
// listed their keys for as long as the keys stay, and 300,000 keys × 10
// regions in the simulator held 1.06 GB of table bodies that way.
func compactKeys[T any](rows []T, key func(*T) *string) {
	n := 0
	for i := range rows {
		n += len(*key(&rows[i]))
	}
	var b strings.Builder
	b.Grow(n)
	for i := range rows {
		b.WriteString(*key(&rows[i]))
	}
	names := b.String()
	for i := range rows {
		k := key(&rows[i])
		l := len(*k)
		*k, names = names[:l], names[l:]
	}
}

// countPacked counts (an upper bound on) the shares and bursts of a row.
// It reads leniently: the second pass reports what is malformed.
func countPacked(b []byte) (shares, bursts int) {
	for fr := (fieldReader{msg: b}); fr.next(); {
		if f := &fr.f; f.typ == protowire.BytesType {
			switch f.num {
			case fKsShares:
				shares += terminators(f.b)
			case fKsBursts:
				bursts += terminators(f.b)
			}
		}
	}
	return shares, bursts
}

// arena hands out the shares and bursts of one chunk's rows.
type arena struct {
	shares []uint32
	bursts []int64
}

// readSharesOrBursts reads f, a row's or a row patch's packed shares
// (fKsShares) or bursts (fKsBursts), once, from the arena.
func (a *arena) readSharesOrBursts(f *field, seen *fieldSet, lim Limits, shares *[]uint32, bursts *[]int64) (why string) {
	if why = seen.once(f, protowire.BytesType); why != "" {
		return why
	}
	if f.num == fKsShares {
		*shares, why = readPacked(f.b, "shares", lim.MaxRegions, &a.shares, toShare)
	} else {
		*bursts, why = readPacked(f.b, "bursts", lim.MaxRegions, &a.bursts, toBurst)
	}
	return why
}

func readKeyShares(ks *rebalance.KeyShares, b []byte, s string, a *arena, lim Limits) string {
	var (
		seen                          fieldSet
		rate, period, interval, burst int64
	)
	fr := fieldReader{msg: b}
	for fr.next() {
		switch f := &fr.f; f.num {
		case fKsKey:
			fr.why = seen.str(f, fr.in(s), &ks.Key)
		case fKsVersion:
			fr.why = seen.u64(f, &ks.Version)
		case fKsShares, fKsBursts:
			fr.why = a.readSharesOrBursts(f, &seen, lim, &ks.Shares, &ks.Bursts)
		case fKsRate:
			fr.why = seen.i64(f, &rate)
		case fKsPeriod:
			fr.why = seen.i64(f, &period)
		case fKsInterval:
			fr.why = seen.i64(f, &interval)
		case fKsBurst:
			fr.why = seen.i64(f, &burst)
		}
	}
	if fr.why != "" {
		return fr.why
	}
	if rate != 0 || period != 0 {
		switch {
		case interval != 0:
			return fmt.Sprintf("budget has both a rate (%d per %dµs) and an interval (%dµs)", rate, period, interval)
		case period < 0 || period > maxPeriod:
			return fmt.Sprintf("budget period %dµs outside [0, %d]", period, maxPeriod)
		}
		ks.Budget = gcra.New(rate, time.Duration(period)*time.Microsecond, burst)
	} else {
		ks.Budget = gcra.FromInterval(interval, burst)
	}
	return ""
}

// readPacked reads the varints of b, a packed field named what of at most
// max values, into the next values of *pool (which holds at least
// terminators(b) of them), each converted by conv, which may refuse value
// i with a reason. It returns nil for no values.
func readPacked[T any](b []byte, what string, max int, pool *[]T, conv func(i int, v uint64) (T, string)) ([]T, string) {
	n := terminators(b)
	if n > max {
		return nil, fmt.Sprintf("%s has %d entries, above the limit of %d regions", what, n, max)
	}
	if n > len(*pool) {
		return nil, what + ": malformed packed field" // cannot happen: pass 1 counted them
	}
	out := (*pool)[:n:n]
	*pool = (*pool)[n:]
	for i := range out {
		v, m := protowire.ConsumeVarint(b)
		if m < 0 {
			return nil, fmt.Sprintf("%s: %v", what, protowire.ParseError(m))
		}
		var why string
		if out[i], why = conv(i, v); why != "" {
			return nil, why
		}
		b = b[m:]
	}
	if len(b) != 0 {
		return nil, what + ": a truncated varint"
	}
	if n == 0 {
		return nil, ""
	}
	return out, ""
}

// Conversions for readPacked.
func toShare(i int, v uint64) (uint32, string) {
	if v > math.MaxUint32 {
		return 0, fmt.Sprintf("share %d of region %d above 2^32", v, i)
	}
	return uint32(v), ""
}
func toBurst(_ int, v uint64) (int64, string) { return int64(v), "" }
func toLease(_ int, v uint64) (int64, string) { return protowire.DecodeZigZag(v), "" }

func decodeHeader(b []byte, lim Limits) (*rebalance.Table, error) {
	t := &rebalance.Table{}
	var (
		seen     fieldSet
		leases   []byte
		features uint64
	)
	fr := fieldReader{msg: b}
	for fr.next() {
		switch f := &fr.f; f.num {
		case fHdrIssued:
			fr.why = seen.zigzag(f, &t.Issued)
		case fHdrEffective:
			fr.why = seen.zigzag(f, &t.Effective)
		case fHdrPolicy:
			if fr.why = seen.once(f, protowire.BytesType); fr.why == "" {
				t.PolicyVersion, fr.why = name(f.b, lim.MaxName, true)
			}
		case fHdrRegions:
			if fr.why = wantType(f, protowire.BytesType); fr.why == "" {
				if len(t.Regions) == lim.MaxRegions {
					fr.why = fmt.Sprintf("more than %d regions", lim.MaxRegions)
					break
				}
				var r string
				if r, fr.why = name(f.b, lim.MaxName, false); fr.why == "" {
					t.Regions = append(t.Regions, r)
				}
			}
		case fHdrLeases:
			fr.why = seen.bytes(f, &leases)
		case fHdrFeatures:
			if fr.why = seen.u64(f, &features); fr.why == "" && features > math.MaxUint32 {
				fr.why = fmt.Sprintf("features %d: above 2^32-1", features)
			}
			t.Features = uint32(features)
		case fHdrBlind:
			fr.why = seen.zigzag(f, &t.BlindUntil)
		case fHdrResync:
			fr.why = addAgentList(f, lim, &t.Resync, "resync")
		case fHdrAgents:
			fr.why = addAgentList(f, lim, &t.Agents, "agent")
		}
	}
	if fr.why != "" {
		return nil, invalidf("table chunk 0 header at byte %d: %s", fr.off, fr.why)
	}
	// The leases, in a pool of their own (readPacked refuses more than
	// MaxRegions before using it).
	pool := make([]int64, min(terminators(leases), lim.MaxRegions))
	var why string
	if t.Leases, why = readPacked(leases, "leases", lim.MaxRegions, &pool, toLease); why != "" {
		return nil, invalidf("table chunk 0 header: %s", why)
	}
	if err := checkHeader(t, lim); err != nil {
		return nil, invalidf("table chunk 0 header: %v", err)
	}
	return t, nil
}

// readAgents reads one region's AgentList.
// addAgentList appends the AgentList in field f to lists (what names
// them in an error), at most lim.MaxRegions of them.
func addAgentList(f *field, lim Limits, lists *[][]string, what string) string {
	if why := wantType(f, protowire.BytesType); why != "" {
		return why
	}
	if len(*lists) == lim.MaxRegions {
		return fmt.Sprintf("more than %d %s lists", lim.MaxRegions, what)
	}
	names, why := readAgents(f.b, lim)
	if why == "" {
		*lists = append(*lists, names)
	}
	return why
}

func readAgents(b []byte, lim Limits) ([]string, string) {
	var names []string
	fr := fieldReader{msg: b}
	for fr.next() {
		f := &fr.f
		if f.num != fAgentNames {
			continue
		}
		if fr.why = wantType(f, protowire.BytesType); fr.why != "" {
			break
		}
		if len(names) == lim.MaxAgents {
			return nil, fmt.Sprintf("more than %d agents in a region", lim.MaxAgents)
		}
		var a string
		if a, fr.why = name(f.b, lim.MaxName, false); fr.why == "" {
			names = append(names, a)
		}
	}
	if fr.why != "" {
		return nil, "agents: " + fr.why
	}
	return names, ""
}
