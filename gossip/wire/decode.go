package wire

import (
	"crypto/ed25519"
	"fmt"
	"math"
	"time"

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
// share one copy of its body. It never retains b. Safe for concurrent use.
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
	for off := 0; off < len(b); {
		f, n, why := readField(b[off:])
		if why != "" {
			return Message{}, invalidf("envelope at byte %d: %s", off, why)
		}
		switch f.num {
		case fEnvVersion:
			why = seen.once(f, protowire.VarintType)
			version = f.v
		case fEnvCluster:
			why = seen.once(f, protowire.BytesType)
			clu = f.b
		case fEnvKind:
			why = seen.once(f, protowire.VarintType)
			kind = f.v
		case fEnvBody:
			why = seen.once(f, protowire.BytesType)
			body = f.b
		case fEnvSignature:
			why = seen.once(f, protowire.BytesType)
			sig, signed = f.b, off
		}
		if why != "" {
			return Message{}, invalidf("envelope at byte %d: %s", off, why)
		}
		off += n
		after = after || (signed >= 0 && off < len(b))
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

// readField reads the field at the start of b and returns it with its
// length in bytes, or why it cannot be read.
func readField(b []byte) (f field, n int, why string) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 {
		return f, 0, "tag: " + protowire.ParseError(n).Error()
	}
	f.num, f.typ = num, typ
	var m int
	switch typ {
	case protowire.VarintType:
		f.v, m = protowire.ConsumeVarint(b[n:])
	case protowire.Fixed32Type:
		var v uint32
		v, m = protowire.ConsumeFixed32(b[n:])
		f.v = uint64(v)
	case protowire.BytesType:
		f.b, m = protowire.ConsumeBytes(b[n:])
	default:
		m = protowire.ConsumeFieldValue(num, typ, b[n:])
	}
	if m < 0 {
		return f, 0, fmt.Sprintf("field %d: %v", num, protowire.ParseError(m))
	}
	return f, n + m, ""
}

// fieldSet records the singular fields seen in one message.
type fieldSet uint32

// once checks that f, a known singular field, has wire type typ and was
// not seen before.
func (s *fieldSet) once(f field, typ protowire.Type) string {
	if why := wantType(f, typ); why != "" {
		return why
	}
	bit := fieldSet(1) << f.num
	if *s&bit != 0 {
		return fmt.Sprintf("field %d given twice", f.num)
	}
	*s |= bit
	return ""
}

func wantType(f field, typ protowire.Type) string {
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
		nkeys                 int
	)
	// Pass 1: the singular fields, and how many keys there are.
	for off := 0; off < len(body); {
		f, n, why := readField(body[off:])
		if why == "" {
			switch f.num {
			case fRepRegion:
				why = seen.once(f, protowire.BytesType)
				region = f.b
			case fRepAgent:
				why = seen.once(f, protowire.BytesType)
				agent = f.b
			case fRepInterval:
				why = seen.once(f, protowire.VarintType)
				r.Interval = protowire.DecodeZigZag(f.v)
			case fRepTerm:
				why = seen.once(f, protowire.VarintType)
				r.Term = f.v
			case fRepEpoch:
				why = seen.once(f, protowire.VarintType)
				r.Epoch = f.v
			case fRepPolicy:
				why = seen.once(f, protowire.BytesType)
				policy = f.b
			case fRepSent:
				why = seen.once(f, protowire.VarintType)
				c.Sent = protowire.DecodeZigZag(f.v)
			case fRepIndex:
				why = seen.once(f, protowire.Fixed32Type)
				index = f.v
			case fRepCount:
				why = seen.once(f, protowire.Fixed32Type)
				count = f.v
			case fRepKeys:
				why = wantType(f, protowire.BytesType)
				nkeys++
			}
		}
		if why != "" {
			return nil, invalidf("report at byte %d: %s", off, why)
		}
		off += n
	}
	if why := checkChunk(index, count, lim); why != "" {
		return nil, invalidf("report chunk: %s", why)
	}
	c.Index, c.Count = int(index), int(count)
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
	// Pass 2: the keys. Their names are substrings of one copy of the body.
	r.Keys = make([]rebalance.KeyDemand, nkeys)
	str := string(body)
	i := 0
	for off := 0; off < len(body); {
		f, n, _ := readField(body[off:])
		if f.num == fRepKeys {
			base := off + n - len(f.b)
			if why := readKeyDemand(&r.Keys[i], f.b, str[base:base+len(f.b)], lim); why != "" {
				return nil, invalidf("report chunk %d key %d: %s", index, i, why)
			}
			i++
		}
		off += n
	}
	return c, nil
}

// readKeyDemand reads one KeyDemand from b; s is b as a string.
func readKeyDemand(k *rebalance.KeyDemand, b []byte, s string, lim Limits) string {
	var seen fieldSet
	for off := 0; off < len(b); {
		f, n, why := readField(b[off:])
		if why == "" {
			switch f.num {
			case fKdKey:
				if why = seen.once(f, protowire.BytesType); why == "" {
					k.Key = s[off+n-len(f.b) : off+n]
				}
			case fKdOffered:
				why = seen.once(f, protowire.VarintType)
				k.Offered = int64(f.v)
			case fKdOfferedCost:
				why = seen.once(f, protowire.VarintType)
				k.OfferedCost = int64(f.v)
			case fKdAdmitted:
				why = seen.once(f, protowire.VarintType)
				k.Admitted = int64(f.v)
			case fKdDenied:
				why = seen.once(f, protowire.VarintType)
				k.Denied = int64(f.v)
			}
		}
		if why != "" {
			return why
		}
		off += n
	}
	switch {
	case k.Key == "" || len(k.Key) > lim.MaxKeyLen:
		return fmt.Sprintf("key name of %d bytes outside [1, %d]", len(k.Key), lim.MaxKeyLen)
	case k.Offered < 0 || k.OfferedCost < 0 || k.Admitted < 0 || k.Denied < 0:
		return fmt.Sprintf("negative demand %+v", k.Demand)
	}
	return ""
}

// --- acks ---

func decodeAck(body []byte, lim Limits) (*Ack, error) {
	a := &Ack{}
	var (
		seen          fieldSet
		region, agent []byte
	)
	for off := 0; off < len(body); {
		f, n, why := readField(body[off:])
		if why == "" {
			switch f.num {
			case fAckRegion:
				why = seen.once(f, protowire.BytesType)
				region = f.b
			case fAckAgent:
				why = seen.once(f, protowire.BytesType)
				agent = f.b
			case fAckTerm:
				why = seen.once(f, protowire.VarintType)
				a.Term = f.v
			case fAckEpoch:
				why = seen.once(f, protowire.VarintType)
				a.Epoch = f.v
			case fAckSent:
				why = seen.once(f, protowire.VarintType)
				a.Sent = protowire.DecodeZigZag(f.v)
			}
		}
		if why != "" {
			return nil, invalidf("ack at byte %d: %s", off, why)
		}
		off += n
	}
	var why string
	if a.Region, why = name(region, lim.MaxName, false); why != "" {
		return nil, invalidf("ack: region: %s", why)
	}
	if a.Agent, why = name(agent, lim.MaxName, false); why != "" {
		return nil, invalidf("ack: agent: %s", why)
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
		header          []byte
		hasHeader       bool
		nkeys           int
		nshares, nburst int
	)
	// Pass 1: the singular fields, how many rows, shares and bursts.
	for off := 0; off < len(body); {
		f, n, why := readField(body[off:])
		if why == "" {
			switch f.num {
			case fTabTerm:
				why = seen.once(f, protowire.VarintType)
				c.Term = f.v
			case fTabEpoch:
				why = seen.once(f, protowire.VarintType)
				c.Epoch = f.v
			case fTabIndex:
				why = seen.once(f, protowire.Fixed32Type)
				index = f.v
			case fTabCount:
				why = seen.once(f, protowire.Fixed32Type)
				count = f.v
			case fTabHeader:
				why = seen.once(f, protowire.BytesType)
				header, hasHeader = f.b, true
			case fTabKeys:
				if why = wantType(f, protowire.BytesType); why == "" {
					nkeys++
					s, b := countPacked(f.b)
					nshares += s
					nburst += b
				}
			}
		}
		if why != "" {
			return nil, invalidf("table at byte %d: %s", off, why)
		}
		off += n
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
	if nkeys == 0 {
		return c, nil
	}
	// Pass 2: the rows. Their names are substrings of one copy of the body,
	// their shares and bursts slices of two arrays.
	c.Keys = make([]rebalance.KeyShares, nkeys)
	a := arena{shares: make([]uint32, nshares)}
	if nburst > 0 {
		a.bursts = make([]int64, nburst)
	}
	str := string(body)
	i := 0
	for off := 0; off < len(body); {
		f, n, _ := readField(body[off:])
		if f.num == fTabKeys {
			base := off + n - len(f.b)
			ks := &c.Keys[i]
			if why := readKeyShares(ks, f.b, str[base:base+len(f.b)], &a, lim); why != "" {
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
		off += n
	}
	return c, nil
}

// countPacked counts (an upper bound on) the shares and bursts of a row.
// It reads leniently: the second pass reports what is malformed.
func countPacked(b []byte) (shares, bursts int) {
	for off := 0; off < len(b); {
		f, n, why := readField(b[off:])
		if why != "" {
			return
		}
		if f.typ == protowire.BytesType {
			switch f.num {
			case fKsShares:
				shares += terminators(f.b)
			case fKsBursts:
				bursts += terminators(f.b)
			}
		}
		off += n
	}
	return
}

// arena hands out the shares and bursts of one chunk's rows.
type arena struct {
	shares []uint32
	bursts []int64
}

func readKeyShares(ks *rebalance.KeyShares, b []byte, s string, a *arena, lim Limits) string {
	var (
		seen                          fieldSet
		rate, period, interval, burst int64
	)
	for off := 0; off < len(b); {
		f, n, why := readField(b[off:])
		if why == "" {
			switch f.num {
			case fKsKey:
				if why = seen.once(f, protowire.BytesType); why == "" {
					ks.Key = s[off+n-len(f.b) : off+n]
				}
			case fKsVersion:
				why = seen.once(f, protowire.VarintType)
				ks.Version = f.v
			case fKsShares:
				if why = seen.once(f, protowire.BytesType); why == "" {
					ks.Shares, why = a.readShares(f.b, lim.MaxRegions)
				}
			case fKsBursts:
				if why = seen.once(f, protowire.BytesType); why == "" {
					ks.Bursts, why = a.readBursts(f.b, lim.MaxRegions)
				}
			case fKsRate:
				why = seen.once(f, protowire.VarintType)
				rate = int64(f.v)
			case fKsPeriod:
				why = seen.once(f, protowire.VarintType)
				period = int64(f.v)
			case fKsInterval:
				why = seen.once(f, protowire.VarintType)
				interval = int64(f.v)
			case fKsBurst:
				why = seen.once(f, protowire.VarintType)
				burst = int64(f.v)
			}
		}
		if why != "" {
			return why
		}
		off += n
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

func (a *arena) readShares(b []byte, max int) ([]uint32, string) {
	n := terminators(b)
	if n > max {
		return nil, fmt.Sprintf("shares has %d entries, above the limit of %d regions", n, max)
	}
	if n > len(a.shares) {
		return nil, "shares: malformed packed field" // cannot happen: pass 1 counted them
	}
	out := a.shares[:n:n]
	a.shares = a.shares[n:]
	for i := range out {
		v, m := protowire.ConsumeVarint(b)
		if m < 0 {
			return nil, fmt.Sprintf("shares: %v", protowire.ParseError(m))
		}
		if v > math.MaxUint32 {
			return nil, fmt.Sprintf("share %d of region %d above 2^32", v, i)
		}
		out[i], b = uint32(v), b[m:]
	}
	if len(b) != 0 {
		return nil, "shares: a truncated varint"
	}
	return out, ""
}

func (a *arena) readBursts(b []byte, max int) ([]int64, string) {
	n := terminators(b)
	if n > max {
		return nil, fmt.Sprintf("bursts has %d entries, above the limit of %d regions", n, max)
	}
	if n > len(a.bursts) {
		return nil, "bursts: malformed packed field" // cannot happen: pass 1 counted them
	}
	out := a.bursts[:n:n]
	a.bursts = a.bursts[n:]
	for i := range out {
		v, m := protowire.ConsumeVarint(b)
		if m < 0 {
			return nil, fmt.Sprintf("bursts: %v", protowire.ParseError(m))
		}
		out[i], b = int64(v), b[m:]
	}
	if len(b) != 0 {
		return nil, "bursts: a truncated varint"
	}
	if n == 0 {
		return nil, ""
	}
	return out, ""
}

func decodeHeader(b []byte, lim Limits) (*rebalance.Table, error) {
	t := &rebalance.Table{}
	var (
		seen   fieldSet
		leases []byte
	)
	for off := 0; off < len(b); {
		f, n, why := readField(b[off:])
		if why == "" {
			switch f.num {
			case fHdrIssued:
				why = seen.once(f, protowire.VarintType)
				t.Issued = protowire.DecodeZigZag(f.v)
			case fHdrEffective:
				why = seen.once(f, protowire.VarintType)
				t.Effective = protowire.DecodeZigZag(f.v)
			case fHdrPolicy:
				if why = seen.once(f, protowire.BytesType); why == "" {
					t.PolicyVersion, why = name(f.b, lim.MaxName, true)
				}
			case fHdrRegions:
				if why = wantType(f, protowire.BytesType); why == "" {
					if len(t.Regions) == lim.MaxRegions {
						why = fmt.Sprintf("more than %d regions", lim.MaxRegions)
						break
					}
					var r string
					if r, why = name(f.b, lim.MaxName, false); why == "" {
						t.Regions = append(t.Regions, r)
					}
				}
			case fHdrLeases:
				why = seen.once(f, protowire.BytesType)
				leases = f.b
			case fHdrAgents:
				if why = wantType(f, protowire.BytesType); why == "" {
					if len(t.Agents) == lim.MaxRegions {
						why = fmt.Sprintf("more than %d agent lists", lim.MaxRegions)
						break
					}
					var names []string
					if names, why = readAgents(f.b, lim); why == "" {
						t.Agents = append(t.Agents, names)
					}
				}
			}
		}
		if why != "" {
			return nil, invalidf("table chunk 0 header at byte %d: %s", off, why)
		}
		off += n
	}
	if n := terminators(leases); n > 0 {
		if n > lim.MaxRegions {
			return nil, invalidf("table chunk 0 header: %d leases, above the limit of %d regions", n, lim.MaxRegions)
		}
		t.Leases = make([]int64, n)
		for i := range t.Leases {
			v, m := protowire.ConsumeVarint(leases)
			if m < 0 {
				return nil, invalidf("table chunk 0 header: leases: %v", protowire.ParseError(m))
			}
			t.Leases[i], leases = protowire.DecodeZigZag(v), leases[m:]
		}
	}
	if len(leases) != 0 {
		return nil, invalidf("table chunk 0 header: leases: a truncated varint")
	}
	if err := checkHeader(t, lim); err != nil {
		return nil, invalidf("table chunk 0 header: %v", err)
	}
	return t, nil
}

// readAgents reads one region's AgentList.
func readAgents(b []byte, lim Limits) ([]string, string) {
	var names []string
	for off := 0; off < len(b); {
		f, n, why := readField(b[off:])
		if why == "" && f.num == fAgentNames {
			if why = wantType(f, protowire.BytesType); why == "" {
				if len(names) == lim.MaxAgents {
					return nil, fmt.Sprintf("more than %d agents in a region", lim.MaxAgents)
				}
				var a string
				if a, why = name(f.b, lim.MaxName, false); why == "" {
					names = append(names, a)
				}
			}
		}
		if why != "" {
			return nil, "agents: " + why
		}
		off += n
	}
	return names, ""
}
