package wire

import (
	"fmt"

	"github.com/meridian-quota/meridian/rebalance"
)

// Assembler joins chunks into whole reports, keyed by (region, agent,
// interval), and whole tables, keyed by (term, epoch). Chunks may arrive in
// any order. It holds at most maxPending partial sets (reports and tables
// together), each of at most lim.MaxChunks chunks and lim.MaxKeys keys;
// when a new set would exceed that the oldest partial set is dropped. A
// chunk whose Count disagrees with its set's, whose other fields disagree
// with the set's first chunk, or that would put the set above lim.MaxKeys
// is refused and its set dropped; a duplicate chunk is refused and its set
// kept. Dropped counts every set dropped before it completed. Every error
// wraps ErrInvalid.
//
// An Assembler is not safe for concurrent use.
type Assembler struct {
	lim     Limits
	limErr  error
	max     int
	seq     uint64
	pending map[setID]*partial
	dropped int64
}

type setID struct {
	kind          Kind
	region, agent string
	interval      int64
	term, epoch   uint64
}

// partial is a set of chunks still missing some.
type partial struct {
	seq    uint64
	count  int
	got    int
	nkeys  int
	first  int // index of the first chunk received, to compare the others to
	report []*ReportChunk
	table  []*TableChunk
}

// NewAssembler returns an Assembler bounded by lim and maxPending partial
// sets (at least 1). Invalid limits make every Add return their error.
func NewAssembler(lim Limits, maxPending int) *Assembler {
	return &Assembler{lim: lim, limErr: lim.Validate(), max: max(maxPending, 1), pending: map[setID]*partial{}}
}

// Dropped returns how many partial sets were dropped before they
// completed: evicted as the oldest when the Assembler was full, or refused
// for inconsistent chunks.
func (a *Assembler) Dropped() int64 { return a.dropped }

// Pending returns the number of partial sets held.
func (a *Assembler) Pending() int { return len(a.pending) }

// open returns the partial set id, creating it (and evicting the oldest
// when full) if needed.
func (a *Assembler) open(id setID, count, index int) *partial {
	if p := a.pending[id]; p != nil {
		return p
	}
	if len(a.pending) >= a.max {
		var oldest setID
		var seq uint64
		first := true
		for k, p := range a.pending {
			if first || p.seq < seq {
				oldest, seq, first = k, p.seq, false
			}
		}
		delete(a.pending, oldest)
		a.dropped++
	}
	a.seq++
	p := &partial{seq: a.seq, count: count, first: index}
	a.pending[id] = p
	return p
}

func (a *Assembler) drop(id setID) {
	delete(a.pending, id)
	a.dropped++
}

// checkIndex is checkChunk for a chunk handed in by the caller, whose
// index may be negative.
func (a *Assembler) checkIndex(index, count int) string {
	if index < 0 {
		return fmt.Sprintf("index %d negative", index)
	}
	return checkChunk(uint64(index), uint64(max(count, 0)), a.lim)
}

// addChunk files c, chunk index of a set of count chunks holding nkeys keys,
// in p, the partial set id, whose chunks of c's kind are slots. It returns
// done once the set is complete (and no longer pending); a chunk that
// contradicts the set is refused with an error that begins with where()
// and, unless it is a duplicate, drops the set.
func addChunk[C any](a *Assembler, id setID, p *partial, slots []*C, c *C, index, count, nkeys int, where func() string) (done bool, err error) {
	if count != p.count {
		a.drop(id)
		return false, invalidf("%s: count %d, but chunk %d says %d", where(), count, p.first, p.count)
	}
	if slots[index] != nil {
		return false, invalidf("%s: duplicate chunk", where())
	}
	if p.nkeys+nkeys > a.lim.MaxKeys {
		a.drop(id)
		return false, invalidf("%s: more than %d keys", where(), a.lim.MaxKeys)
	}
	slots[index] = c
	p.nkeys += nkeys
	p.got++
	if p.got < p.count {
		return false, nil
	}
	delete(a.pending, id)
	return true, nil
}

// AddReport adds one chunk and returns the whole report once its last
// chunk arrived (done), with the keys of every chunk in chunk order.
func (a *Assembler) AddReport(c *ReportChunk) (r *rebalance.Report, done bool, err error) {
	if a.limErr != nil {
		return nil, false, fmt.Errorf("wire: assembler: %w", a.limErr)
	}
	if c == nil {
		return nil, false, invalidf("report chunk: nil")
	}
	cr := &c.Report
	where := func() string {
		return fmt.Sprintf("report %q/%q interval %d chunk %d", cr.Region, cr.Agent, cr.Interval, c.Index)
	}
	if why := a.checkIndex(c.Index, c.Count); why != "" {
		return nil, false, invalidf("%s: %s", where(), why)
	}
	if err := checkReportChunk(cr, a.lim); err != nil {
		return nil, false, invalidf("%s: %v", where(), err)
	}
	id := setID{kind: KindReport, region: cr.Region, agent: cr.Agent, interval: cr.Interval}
	p := a.pending[id]
	if c.Count == 1 && p == nil {
		out := *cr
		return &out, true, nil
	}
	p = a.open(id, c.Count, c.Index)
	if p.report == nil {
		p.report = make([]*ReportChunk, c.Count)
	}
	// Every chunk carries the report's fields: they must agree with the
	// first chunk's (a chunk of another count is addChunk's to refuse).
	if f := p.report[p.first]; f != nil && c.Count == p.count &&
		(f.Sent != c.Sent || f.Report.Term != cr.Term || f.Report.Epoch != cr.Epoch || f.Report.PolicyVersion != cr.PolicyVersion || f.Report.Features != cr.Features || f.Report.Delta != cr.Delta) {
		a.drop(id)
		return nil, false, invalidf("%s: sent %d term %d epoch %d policy %q features %#x delta %t, but chunk %d says sent %d term %d epoch %d policy %q features %#x delta %t",
			where(), c.Sent, cr.Term, cr.Epoch, cr.PolicyVersion, cr.Features, cr.Delta, p.first, f.Sent, f.Report.Term, f.Report.Epoch, f.Report.PolicyVersion, f.Report.Features, f.Report.Delta)
	}
	if done, err := addChunk(a, id, p, p.report, c, c.Index, c.Count, len(cr.Keys), where); !done {
		return nil, false, err
	}
	out := *cr
	out.Keys = nil
	if p.nkeys > 0 {
		out.Keys = make([]rebalance.KeyDemand, 0, p.nkeys)
		for _, ch := range p.report {
			out.Keys = append(out.Keys, ch.Report.Keys...)
		}
	}
	return &out, true, nil
}

func checkReportChunk(r *rebalance.Report, lim Limits) error {
	if why := badName(r.Region, lim.MaxName); why != "" {
		return fmt.Errorf("region: %s", why)
	}
	if why := badName(r.Agent, lim.MaxName); why != "" {
		return fmt.Errorf("agent: %s", why)
	}
	if len(r.PolicyVersion) > lim.MaxName {
		return fmt.Errorf("policy version of %d bytes, above the limit of %d", len(r.PolicyVersion), lim.MaxName)
	}
	if len(r.Keys) > lim.MaxKeys {
		return fmt.Errorf("%d keys, above the limit of %d", len(r.Keys), lim.MaxKeys)
	}
	return checkDemands(r.Keys, lim.MaxKeyLen)
}

// AddTable adds one chunk and returns the whole table once its last chunk
// arrived (done): the header's fields and the rows of every chunk in chunk
// order. The whole table is checked as Decode checks a chunk with its
// header: one lease and one agent list per region, regions sorted and
// distinct, every row with one share per region, keys sorted and distinct
// across chunks.
func (a *Assembler) AddTable(c *TableChunk) (t *rebalance.Table, done bool, err error) {
	if a.limErr != nil {
		return nil, false, fmt.Errorf("wire: assembler: %w", a.limErr)
	}
	if c == nil {
		return nil, false, invalidf("table chunk: nil")
	}
	where := func() string { return fmt.Sprintf("table term %d epoch %d chunk %d", c.Term, c.Epoch, c.Index) }
	if why := a.checkIndex(c.Index, c.Count); why != "" {
		return nil, false, invalidf("%s: %s", where(), why)
	}
	switch {
	case c.Index == 0 && c.Header == nil:
		return nil, false, invalidf("%s: no header", where())
	case c.Index > 0 && c.Header != nil:
		return nil, false, invalidf("%s: a header outside chunk 0", where())
	case c.Header != nil && (c.Header.Term != c.Term || c.Header.Epoch != c.Epoch):
		return nil, false, invalidf("%s: header says term %d epoch %d", where(), c.Header.Term, c.Header.Epoch)
	case len(c.Keys) > a.lim.MaxKeys:
		return nil, false, invalidf("%s: %d keys, above the limit of %d", where(), len(c.Keys), a.lim.MaxKeys)
	case c.Delta != nil && c.Delta.InBase:
		return nil, false, invalidf("%s: a head whose rows are its base's (PatchRows reads it), not chunks of its own", where())
	}
	id := setID{kind: KindTable, term: c.Term, epoch: c.Epoch}
	p := a.pending[id]
	if c.Count == 1 && p == nil {
		t, err := joinTable([]*TableChunk{c}, a.lim)
		return t, err == nil, err
	}
	p = a.open(id, c.Count, c.Index)
	if p.table == nil {
		p.table = make([]*TableChunk, c.Count)
	}
	if done, err := addChunk(a, id, p, p.table, c, c.Index, c.Count, len(c.Keys), where); !done {
		return nil, false, err
	}
	t, err = joinTable(p.table, a.lim)
	if err != nil {
		a.dropped++
	}
	return t, err == nil, err
}

// joinTable checks and joins a complete set of table chunks.
func joinTable(chunks []*TableChunk, lim Limits) (*rebalance.Table, error) {
	h := chunks[0].Header
	if err := checkHeader(h, lim); err != nil {
		return nil, invalidf("table term %d epoch %d header: %v", h.Term, h.Epoch, err)
	}
	if h.Shadow {
		return nil, invalidf("table term %d epoch %d header: a shadow table", h.Term, h.Epoch)
	}
	t := *h
	n := 0
	var prev *rebalance.KeyShares
	for ci, c := range chunks {
		for i := range c.Keys {
			ks := &c.Keys[i]
			if err := checkRow(ks, len(t.Regions), lim); err != nil {
				return nil, invalidf("table term %d epoch %d chunk %d key %d: %v", t.Term, t.Epoch, ci, i, err)
			}
			if prev != nil && prev.Key >= ks.Key {
				return nil, invalidf("table term %d epoch %d chunk %d key %d: keys not sorted and distinct", t.Term, t.Epoch, ci, i)
			}
			prev = ks
		}
		n += len(c.Keys)
	}
	switch {
	case n == 0:
		t.Keys = nil
	case len(chunks) == 1:
		t.Keys = chunks[0].Keys
	default:
		t.Keys = make([]rebalance.KeyShares, 0, n)
		for _, c := range chunks {
			t.Keys = append(t.Keys, c.Keys...)
		}
	}
	// Patch checks the same digest: both ways to a delta table agree.
	if d := chunks[0].Delta; d != nil && TableDigest(t.Keys) != d.Digest {
		return nil, invalidf("table term %d epoch %d: %v", t.Term, t.Epoch, errDigest)
	}
	return &t, nil
}
