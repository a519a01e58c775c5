package wire

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/rebalance"
)

// Field numbers, as in wire.proto.
const (
	// Envelope
	fEnvVersion   = 1
	fEnvCluster   = 2
	fEnvKind      = 3
	fEnvBody      = 4
	fEnvSignature = 5

	// Report
	fRepRegion   = 1
	fRepAgent    = 2
	fRepInterval = 3
	fRepTerm     = 4
	fRepEpoch    = 5
	fRepPolicy   = 6
	fRepSent     = 7
	fRepIndex    = 8
	fRepCount    = 9
	fRepKeys     = 10
	fRepFeatures = 11
	fRepDelta    = 12

	// KeyDemand
	fKdKey         = 1
	fKdOffered     = 2
	fKdOfferedCost = 3
	fKdAdmitted    = 4
	fKdDenied      = 5

	// Ack
	fAckRegion = 1
	fAckAgent  = 2
	fAckTerm   = 3
	fAckEpoch  = 4
	fAckSent   = 5
	fAckFenceT = 6
	fAckFenceE = 7
	fAckStore  = 8

	// Table
	fTabTerm   = 1
	fTabEpoch  = 2
	fTabIndex  = 3
	fTabCount  = 4
	fTabHeader = 5
	fTabKeys   = 6
	fTabDelta  = 7

	// TableDelta
	fDelBaseTerm  = 1
	fDelBaseEpoch = 2
	fDelDigest    = 3
	fDelChanged   = 4
	fDelRemoved   = 5
	fDelInBase    = 6
	fDelPatched   = 7

	// RowPatch: its shares and bursts are fKsShares and fKsBursts.
	fPatIndex = 1
	fPatStep  = 2

	// TableHeader
	fHdrIssued    = 1
	fHdrEffective = 2
	fHdrPolicy    = 3
	fHdrRegions   = 4
	fHdrLeases    = 5
	fHdrAgents    = 6
	fHdrFeatures  = 7
	fHdrResync    = 8
	fHdrBlind     = 9

	// AgentList
	fAgentNames = 1

	// KeyShares
	fKsKey      = 1
	fKsVersion  = 2
	fKsShares   = 3
	fKsBursts   = 4
	fKsRate     = 5
	fKsPeriod   = 6
	fKsInterval = 7
	fKsBurst    = 8
)

// Bounds a table must meet for region.Node.Apply to accept it.
const (
	maxVersion = 1 << 60        // a row's Version
	ppm        = 1_000_000      // Σ shares of a row
	maxPeriod  = 1<<63/1000 - 1 // µs: the period must convert to a time.Duration
	chunkWords = 2 * (1 + 4)    // index and count, fixed32 with a one-byte tag
	sigField   = 2 + SignatureSize
)

// Every field number used is below 16, so every tag is one byte.

// tag is a field's one-byte tag (every field number is below 16).
func tag(num protowire.Number, typ protowire.Type) byte { return byte(num)<<3 | byte(typ) }

func sv(v uint64) int { return protowire.SizeVarint(v) }

// Sizes of optional fields: nothing for the zero value (proto3).
func sizeU(v uint64) int {
	if v == 0 {
		return 0
	}
	return 1 + sv(v)
}
func sizeI(v int64) int { return sizeU(uint64(v)) }
func sizeS(v int64) int { return sizeU(protowire.EncodeZigZag(v)) }
func sizeStr(s string) int {
	if s == "" {
		return 0
	}
	return 1 + sv(uint64(len(s))) + len(s)
}

// sizeElem is a repeated string or message element, always written.
func sizeElem(n int) int { return 1 + sv(uint64(n)) + n }

func appendU(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(append(b, tag(num, protowire.VarintType)), v)
}
func appendI(b []byte, num protowire.Number, v int64) []byte { return appendU(b, num, uint64(v)) }
func appendS(b []byte, num protowire.Number, v int64) []byte {
	return appendU(b, num, protowire.EncodeZigZag(v))
}
func appendStr(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	return appendElem(b, num, s)
}
func appendElem(b []byte, num protowire.Number, s string) []byte {
	b = append(b, tag(num, protowire.BytesType))
	return protowire.AppendString(b, s)
}
func appendLen(b []byte, num protowire.Number, n int) []byte {
	b = append(b, tag(num, protowire.BytesType))
	return protowire.AppendVarint(b, uint64(n))
}
func appendFixed(b []byte, num protowire.Number, v int) []byte {
	return protowire.AppendFixed32(append(b, tag(num, protowire.Fixed32Type)), uint32(v))
}

// envFixed is the bytes of an envelope around a body, without the body's
// length prefix and the body itself.
func envFixed(cluster string, signed bool) int {
	n := 2 + sizeElem(len(cluster)) + 2 + 1
	if signed {
		n += sigField
	}
	return n
}

func envSize(fixed, body int) int { return fixed + sv(uint64(body)) + body }

func appendEnvHead(b []byte, cluster string, kind Kind, body int) []byte {
	b = append(b, tag(fEnvVersion, protowire.VarintType), Version)
	b = appendElem(b, fEnvCluster, cluster)
	b = append(b, tag(fEnvKind, protowire.VarintType), byte(kind))
	return appendLen(b, fEnvBody, body)
}

// chunk is one planned message: keys [start, end) and the body's size.
type chunk struct{ start, end, body int }

// plan splits n entries (sized by entry) into chunks of at most maxMessage
// bytes each: env is the envelope's fixed bytes, fixed the body's bytes
// every chunk has, first the extra body bytes of chunk 0 (a table's
// header). It calls emit, unless nil, for each chunk in order and returns
// the bytes of all the messages and how many there are.
func plan(maxMessage, env, fixed, first, n int, entry func(int) int, emit func(chunk)) (bytes, messages int, err error) {
	if maxMessage < MinMessage {
		return 0, 0, fmt.Errorf("maxMessage %d: below the minimum of %d bytes", maxMessage, MinMessage)
	}
	fits := func(body int) bool { return envSize(env, body) <= maxMessage }
	body := fixed + first
	if !fits(body) {
		return 0, 0, fmt.Errorf("header of %d bytes does not fit in a %d-byte message", envSize(env, body), maxMessage)
	}
	if emit == nil {
		emit = func(chunk) {}
	}
	start := 0
	for i := range n {
		e := entry(i)
		if fits(body + e) {
			body += e
			continue
		}
		if !fits(fixed + e) {
			return 0, 0, fmt.Errorf("key %d: %d bytes encoded, which do not fit in a %d-byte message", i, e, maxMessage)
		}
		if i > start || (messages == 0 && first > 0) {
			emit(chunk{start, i, body})
			bytes, messages = bytes+envSize(env, body), messages+1
		}
		start, body = i, fixed+e
	}
	emit(chunk{start, n, body})
	return bytes + envSize(env, body), messages + 1, nil
}

// --- reports ---

func reportFixed(r *rebalance.Report, sent int64) int {
	return sizeStr(r.Region) + sizeStr(r.Agent) + sizeS(r.Interval) + sizeU(r.Term) + sizeU(r.Epoch) +
		sizeStr(r.PolicyVersion) + sizeS(sent) + chunkWords + sizeU(uint64(r.Features)) + sizeU(b2u(r.Delta))
}

func keyDemandSize(k *rebalance.KeyDemand) int {
	return sizeStr(k.Key) + sizeI(k.Offered) + sizeI(k.OfferedCost) + sizeI(k.Admitted) + sizeI(k.Denied)
}

// planReport plans EncodeReport's messages (see plan).
func planReport(cluster string, r *rebalance.Report, sent int64, maxMessage int, emit func(chunk)) (bytes, messages int, err error) {
	return plan(maxMessage, envFixed(cluster, false), reportFixed(r, sent), 0, len(r.Keys),
		func(i int) int { return sizeElem(keyDemandSize(&r.Keys[i])) }, emit)
}

// ReportSize returns the bytes and number of messages EncodeReport
// produces for the same arguments, without allocating: (0, 0) when the
// report cannot be split into messages of maxMessage bytes. It does not
// check the report's content (EncodeReport does).
func ReportSize(cluster string, r *rebalance.Report, sent int64, maxMessage int) (bytes, messages int) {
	bytes, messages, err := planReport(cluster, r, sent, maxMessage, nil)
	if err != nil {
		return 0, 0
	}
	return bytes, messages
}

// EncodeReport encodes r, sent at sent (the agent's store clock, µs), as
// one or more messages of at most maxMessage bytes each (at least
// MinMessage), each carrying every field of r and a run of its keys, in
// order. The cluster, region and agent must not be empty, keys must have a
// name of at most gcra.MaxKeyLen bytes and non-negative demand. The same
// arguments always give the same bytes.
func EncodeReport(cluster string, r *rebalance.Report, sent int64, maxMessage int) ([][]byte, error) {
	if err := checkReport(cluster, r); err != nil {
		return nil, fmt.Errorf("wire: encode report: %w", err)
	}
	var chunks []chunk
	total, n, err := planReport(cluster, r, sent, maxMessage, func(c chunk) { chunks = append(chunks, c) })
	if err != nil {
		return nil, fmt.Errorf("wire: encode report: %w", err)
	}
	buf := make([]byte, 0, total)
	out := make([][]byte, n)
	for ci, c := range chunks {
		s := len(buf)
		buf = appendEnvHead(buf, cluster, KindReport, c.body)
		buf = appendStr(buf, fRepRegion, r.Region)
		buf = appendStr(buf, fRepAgent, r.Agent)
		buf = appendS(buf, fRepInterval, r.Interval)
		buf = appendU(buf, fRepTerm, r.Term)
		buf = appendU(buf, fRepEpoch, r.Epoch)
		buf = appendStr(buf, fRepPolicy, r.PolicyVersion)
		buf = appendS(buf, fRepSent, sent)
		buf = appendFixed(buf, fRepIndex, ci)
		buf = appendFixed(buf, fRepCount, n)
		buf = appendU(buf, fRepFeatures, uint64(r.Features))
		buf = appendU(buf, fRepDelta, b2u(r.Delta))
		for i := c.start; i < c.end; i++ {
			k := &r.Keys[i]
			buf = appendLen(buf, fRepKeys, keyDemandSize(k))
			buf = appendStr(buf, fKdKey, k.Key)
			buf = appendI(buf, fKdOffered, k.Offered)
			buf = appendI(buf, fKdOfferedCost, k.OfferedCost)
			buf = appendI(buf, fKdAdmitted, k.Admitted)
			buf = appendI(buf, fKdDenied, k.Denied)
		}
		out[ci] = buf[s:len(buf):len(buf)]
	}
	return out, nil
}

func checkReport(cluster string, r *rebalance.Report) error {
	switch {
	case r == nil:
		return errors.New("nil report")
	case cluster == "":
		return errors.New("empty cluster name")
	case r.Region == "" || r.Agent == "":
		return fmt.Errorf("region %q agent %q: names must not be empty", r.Region, r.Agent)
	}
	return checkDemands(r.Keys, gcra.MaxKeyLen)
}

// checkDemands checks every key of a report (see badDemand).
func checkDemands(keys []rebalance.KeyDemand, maxKeyLen int) error {
	for i := range keys {
		if why := badDemand(&keys[i], maxKeyLen); why != "" {
			return fmt.Errorf("key %d: %s", i, why)
		}
	}
	return nil
}

// badDemand says what is wrong with one key of a report ("" if nothing):
// a name outside [1, maxKeyLen] bytes or negative demand.
func badDemand(k *rebalance.KeyDemand, maxKeyLen int) string {
	switch {
	case k.Key == "" || len(k.Key) > maxKeyLen:
		return fmt.Sprintf("key name of %d bytes outside [1, %d]", len(k.Key), maxKeyLen)
	case k.Offered < 0 || k.OfferedCost < 0 || k.Admitted < 0 || k.Denied < 0:
		return fmt.Sprintf("negative demand %+v", k.Demand)
	}
	return ""
}

// --- acks ---

func ackBody(a *Ack) int {
	return sizeStr(a.Region) + sizeStr(a.Agent) + sizeU(a.Term) + sizeU(a.Epoch) + sizeS(a.Sent) +
		sizeU(a.Fence.Term) + sizeU(a.Fence.Epoch) + sizeU(a.Store)
}

// AckSize returns the bytes EncodeAck produces for the same arguments.
func AckSize(cluster string, a Ack) int { return envSize(envFixed(cluster, false), ackBody(&a)) }

// EncodeAck encodes a as one message. The cluster, region and agent must
// not be empty.
func EncodeAck(cluster string, a Ack) ([]byte, error) {
	if cluster == "" || a.Region == "" || a.Agent == "" {
		return nil, fmt.Errorf("wire: encode ack: cluster %q region %q agent %q: names must not be empty", cluster, a.Region, a.Agent)
	}
	if a.Store == 0 && !a.Fence.IsZero() {
		return nil, fmt.Errorf("wire: encode ack: a fence (term %d, epoch %d) needs the store identity that holds it", a.Fence.Term, a.Fence.Epoch)
	}
	body := ackBody(&a)
	b := make([]byte, 0, envSize(envFixed(cluster, false), body))
	b = appendEnvHead(b, cluster, KindAck, body)
	b = appendStr(b, fAckRegion, a.Region)
	b = appendStr(b, fAckAgent, a.Agent)
	b = appendU(b, fAckTerm, a.Term)
	b = appendU(b, fAckEpoch, a.Epoch)
	b = appendS(b, fAckSent, a.Sent)
	b = appendU(b, fAckFenceT, a.Fence.Term)
	b = appendU(b, fAckFenceE, a.Fence.Epoch)
	b = appendU(b, fAckStore, a.Store)
	return b, nil
}

// --- tables ---

// budgetFields is how a budget is written: (rate, period µs, burst) for a
// limit built from a rate, (interval µs, burst) for one built from its
// interval, nothing for the zero limit.
func budgetFields(l gcra.Limit) (rate, period, interval, burst int64) {
	r, p := l.Rate()
	if r != 0 || p != 0 {
		return r, int64(p / time.Microsecond), 0, l.Burst()
	}
	return 0, 0, l.IntervalMicros(), l.Burst()
}

// packed is the bytes of v as the varints of a packed field.
func packed[T uint32 | int64](v []T) int {
	n := 0
	for _, x := range v {
		n += sv(uint64(x))
	}
	return n
}

// packedS64 is packed for zigzag varints.
func packedS64(v []int64) int {
	n := 0
	for _, x := range v {
		n += sv(protowire.EncodeZigZag(x))
	}
	return n
}

func sizePacked(n int) int {
	if n == 0 {
		return 0
	}
	return sizeElem(n)
}

func keySharesSize(ks *rebalance.KeyShares) int {
	rate, period, interval, burst := budgetFields(ks.Budget)
	return sizeStr(ks.Key) + sizeU(ks.Version) + sizePacked(packed(ks.Shares)) + sizePacked(packed(ks.Bursts)) +
		sizeI(rate) + sizeI(period) + sizeI(interval) + sizeI(burst)
}

func agentListSize(names []string) int {
	n := 0
	for _, a := range names {
		n += sizeElem(len(a))
	}
	return n
}

func headerSize(t *rebalance.Table) int {
	n := sizeS(t.Issued) + sizeS(t.Effective) + sizeStr(t.PolicyVersion) + sizePacked(packedS64(t.Leases))
	for _, r := range t.Regions {
		n += sizeElem(len(r))
	}
	for _, a := range t.Agents {
		n += sizeElem(agentListSize(a))
	}
	for _, a := range t.Resync {
		n += sizeElem(agentListSize(a))
	}
	return n + sizeU(uint64(t.Features)) + sizeS(t.BlindUntil)
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

func tableFixed(t *rebalance.Table) int { return sizeU(t.Term) + sizeU(t.Epoch) + chunkWords }

// planTable plans EncodeTable's messages (see plan); hdr is
// headerSize(t).
func planTable(cluster string, t *rebalance.Table, hdr, maxMessage int, emit func(chunk)) (bytes, messages int, err error) {
	return plan(maxMessage, envFixed(cluster, true), tableFixed(t), sizeElem(hdr), len(t.Keys),
		func(i int) int { return sizeElem(keySharesSize(&t.Keys[i])) }, emit)
}

// TableSize returns the bytes (a 64-byte signature per message included)
// and number of messages EncodeTable produces for the same arguments,
// without allocating: (0, 0) when the table cannot be split into messages
// of maxMessage bytes. It does not check the table's content (EncodeTable
// does).
func TableSize(cluster string, t *rebalance.Table, maxMessage int) (bytes, messages int) {
	bytes, messages, err := planTable(cluster, t, headerSize(t), maxMessage, nil)
	if err != nil {
		return 0, 0
	}
	return bytes, messages
}

// EncodeTable encodes t as one or more messages of at most maxMessage
// bytes each (at least MinMessage), each signed with key: chunk 0 carries
// every field but Keys, and every chunk a run of the rows, in order. The
// table must be one region.Node.Apply accepts structurally and that
// Decode and the Assembler accept under any Limits large enough for it (see
// Decode): rows whose shares sum above 10⁶ are encoded, and refused by
// receivers without Limits.AllowOvercommit. A shadow table is never
// published and is refused. The same arguments always give the same
// bytes (Ed25519 signatures are deterministic).
func EncodeTable(cluster string, t *rebalance.Table, key ed25519.PrivateKey, maxMessage int) ([][]byte, error) {
	return EncodeTableFrom(cluster, t, nil, key, maxMessage)
}

func appendHeader(b []byte, t *rebalance.Table) []byte {
	b = appendS(b, fHdrIssued, t.Issued)
	b = appendS(b, fHdrEffective, t.Effective)
	b = appendStr(b, fHdrPolicy, t.PolicyVersion)
	for _, r := range t.Regions {
		b = appendElem(b, fHdrRegions, r)
	}
	if n := packedS64(t.Leases); n > 0 {
		b = appendLen(b, fHdrLeases, n)
		for _, l := range t.Leases {
			b = protowire.AppendVarint(b, protowire.EncodeZigZag(l))
		}
	}
	for _, names := range t.Agents {
		b = appendLen(b, fHdrAgents, agentListSize(names))
		for _, a := range names {
			b = appendElem(b, fAgentNames, a)
		}
	}
	for _, names := range t.Resync {
		b = appendLen(b, fHdrResync, agentListSize(names))
		for _, a := range names {
			b = appendElem(b, fAgentNames, a)
		}
	}
	b = appendU(b, fHdrFeatures, uint64(t.Features))
	return appendS(b, fHdrBlind, t.BlindUntil)
}

// appendPacked appends v as a packed field of varints (nothing when
// empty).
func appendPacked[T uint32 | int64](b []byte, num protowire.Number, v []T) []byte {
	if n := packed(v); n > 0 {
		b = appendLen(b, num, n)
		for _, x := range v {
			b = protowire.AppendVarint(b, uint64(x))
		}
	}
	return b
}

// appendKeyShares appends ks as field num (a table's keys, a delta's
// changed rows).
func appendKeyShares(b []byte, num protowire.Number, ks *rebalance.KeyShares) []byte {
	b = appendLen(b, num, keySharesSize(ks))
	b = appendStr(b, fKsKey, ks.Key)
	b = appendU(b, fKsVersion, ks.Version)
	b = appendPacked(b, fKsShares, ks.Shares)
	b = appendPacked(b, fKsBursts, ks.Bursts)
	rate, period, interval, burst := budgetFields(ks.Budget)
	b = appendI(b, fKsRate, rate)
	b = appendI(b, fKsPeriod, period)
	b = appendI(b, fKsInterval, interval)
	return appendI(b, fKsBurst, burst)
}

func checkTable(cluster string, t *rebalance.Table) error {
	switch {
	case t == nil:
		return errors.New("nil table")
	case cluster == "":
		return errors.New("empty cluster name")
	case t.Shadow:
		return errors.New("a shadow table is for display only, never published")
	}
	if err := checkHeader(t, noLimits); err != nil {
		return err
	}
	for i := range t.Keys {
		if err := checkRow(&t.Keys[i], len(t.Regions), noLimits); err != nil {
			return fmt.Errorf("key %d: %w", i, err)
		}
		if i > 0 && t.Keys[i-1].Key >= t.Keys[i].Key {
			return fmt.Errorf("key %d: keys not sorted and distinct", i)
		}
	}
	return nil
}

// noLimits is what the encoders check against: only what every receiver
// needs (names of keys up to gcra.MaxKeyLen; overcommitted rows are left to
// the receiver's Limits).
var noLimits = Limits{MaxMessage: 1 << 30, MaxKeys: 1 << 30, MaxKeyLen: gcra.MaxKeyLen, MaxRegions: 1 << 30,
	MaxAgents: 1 << 30, MaxChunks: 1 << 30, MaxName: 1 << 30, AllowOvercommit: true}

// badName says what is wrong with a region or agent name ("" if nothing).
func badName(s string, max int) string {
	switch {
	case s == "":
		return "empty name"
	case len(s) > max:
		return fmt.Sprintf("name of %d bytes, above the limit of %d", len(s), max)
	}
	return ""
}

// checkHeader checks every field of a table but Keys.
func checkHeader(t *rebalance.Table, lim Limits) error {
	nr := len(t.Regions)
	switch {
	case nr == 0:
		return errors.New("no regions")
	case nr > lim.MaxRegions:
		return fmt.Errorf("%d regions, above the limit of %d", nr, lim.MaxRegions)
	case len(t.Leases) != nr:
		return fmt.Errorf("%d leases for %d regions", len(t.Leases), nr)
	case len(t.Agents) != nr:
		return fmt.Errorf("%d agent lists for %d regions", len(t.Agents), nr)
	case len(t.Resync) != 0 && len(t.Resync) != nr:
		return fmt.Errorf("%d resync lists for %d regions", len(t.Resync), nr)
	case t.Issued < 0 || t.Issued >= gcra.MaxTime || t.Effective < 0 || t.Effective >= gcra.MaxTime:
		return fmt.Errorf("issued %dµs or effective %dµs outside [0, 2^52)", t.Issued, t.Effective)
	case t.BlindUntil < 0 || t.BlindUntil >= gcra.MaxTime:
		return fmt.Errorf("blind until %dµs outside [0, 2^52)", t.BlindUntil)
	case len(t.PolicyVersion) > lim.MaxName:
		return fmt.Errorf("policy version of %d bytes, above the limit of %d", len(t.PolicyVersion), lim.MaxName)
	}
	for i, r := range t.Regions {
		if why := badName(r, lim.MaxName); why != "" {
			return fmt.Errorf("region %d: %s", i, why)
		}
		if i > 0 && t.Regions[i-1] >= r {
			return fmt.Errorf("region %d: regions not sorted and distinct", i)
		}
		if l := t.Leases[i]; l < 0 || l >= gcra.MaxTime {
			return fmt.Errorf("region %d: lease %dµs outside [0, 2^52)", i, l)
		}
		if i < len(t.Resync) {
			if err := checkAgents(t.Resync[i], lim); err != nil {
				return fmt.Errorf("region %d: resync: %w", i, err)
			}
		}
		if err := checkAgents(t.Agents[i], lim); err != nil {
			return fmt.Errorf("region %d: %w", i, err)
		}
	}
	return nil
}

func checkAgents(names []string, lim Limits) error {
	if len(names) > lim.MaxAgents {
		return fmt.Errorf("%d agents, above the limit of %d", len(names), lim.MaxAgents)
	}
	for j, a := range names {
		if why := badName(a, lim.MaxName); why != "" {
			return fmt.Errorf("agent %d: %s", j, why)
		}
		if j > 0 && names[j-1] >= a {
			return fmt.Errorf("agent %d: agents not sorted and distinct", j)
		}
	}
	return nil
}

// checkRow checks one row of a table of the given number of regions (any
// number from 1 to lim.MaxRegions when regions < 0).
func checkRow(ks *rebalance.KeyShares, regions int, lim Limits) error {
	if ks.Key == "" || len(ks.Key) > lim.MaxKeyLen {
		return fmt.Errorf("key name of %d bytes outside [1, %d]", len(ks.Key), lim.MaxKeyLen)
	}
	n := len(ks.Shares)
	switch {
	case regions >= 0 && n != regions:
		return fmt.Errorf("shares has %d entries for %d regions", n, regions)
	case n == 0:
		return errors.New("no shares")
	case n > lim.MaxRegions:
		return fmt.Errorf("shares has %d entries, above the limit of %d regions", n, lim.MaxRegions)
	case len(ks.Bursts) != 0 && len(ks.Bursts) != n:
		return fmt.Errorf("bursts has %d entries for %d shares", len(ks.Bursts), n)
	case ks.Version > maxVersion:
		return fmt.Errorf("version %d above 2^60", ks.Version)
	}
	var sum uint64
	for r, s := range ks.Shares {
		if s > ppm {
			return fmt.Errorf("share %d of region %d above 1000000 ppm", s, r)
		}
		sum += uint64(s)
	}
	if sum > ppm && !lim.AllowOvercommit {
		return fmt.Errorf("shares sum to %d ppm, above 1000000", sum)
	}
	for r, b := range ks.Bursts {
		if b < 0 {
			return fmt.Errorf("burst %d of region %d: negative", b, r)
		}
	}
	if err := ks.Budget.Validate(); err != nil {
		return fmt.Errorf("budget: %w", err)
	}
	return nil
}
