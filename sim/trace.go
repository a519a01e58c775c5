package sim

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// MaxTraceKeys bounds the distinct keys a trace may name.
const MaxTraceKeys = 1_000_000

// Trace is a validated trace file: lines "ts_us,key,region,cost" in
// non-decreasing time (an optional header line "ts_us,key,region,cost"
// first). Validation reads the whole file once, streaming; each run reads
// it again, streaming, so memory does not grow with its length.
type Trace struct {
	path    string
	keys    []string // sorted by offered cost, most first; ties by name
	index   map[string]int
	offered []int64 // per key, cost units
	regions map[string]int
	end     int64 // µs, the last timestamp + 1
	lines   int64
}

// OpenTrace validates the trace at path against sc's regions: every line
// well formed (integer µs ≥ 0, a non-empty key, a known region, an integer
// cost in [0, 2^32−1]) and in time order. The first problem is returned
// with its line number.
func OpenTrace(path string, sc *Scenario) (*Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readTrace(path, f, sc)
}

func readTrace(path string, r io.Reader, sc *Scenario) (*Trace, error) {
	t := &Trace{path: path, index: map[string]int{}, regions: map[string]int{}}
	for i, rg := range sc.Regions {
		t.regions[rg.Name] = i
	}
	var offered []int64
	var names []string
	err := scanTrace(r, t.regions, func(ln traceLine) error {
		k, ok := t.index[ln.key]
		if !ok {
			if len(names) >= MaxTraceKeys {
				return fmt.Errorf("more than %d distinct keys", MaxTraceKeys)
			}
			k = len(names)
			t.index[ln.key] = k
			names = append(names, ln.key)
			offered = append(offered, 0)
		}
		offered[k] += ln.cost
		t.end = ln.ts + 1
		t.lines++
		return nil
	})
	if err != nil {
		return nil, err
	}
	if t.lines == 0 {
		return nil, errors.New("trace: no lines")
	}
	if sc.Keys.Migrations != nil {
		return nil, errors.New("trace: the scenario's keys.migrations would move nothing: a trace gives each request's region itself (leave migrations out)")
	}
	// A run over the trace ends at its last second (NewRun); one that
	// ends within the warm-up would measure nothing and still print a
	// table of zeros and a recommendation.
	if end := (t.end + 999_999) / 1_000_000 * 1_000_000; end <= us(sc.Warmup) {
		return nil, fmt.Errorf("trace: its last line is at %s, so a run over it ends at %s, within the scenario's warm-up of %s: nothing would be measured (shorten warmup or give a longer trace)",
			time.Duration(t.end-1)*time.Microsecond, time.Duration(end)*time.Microsecond, sc.Warmup.D())
	}
	order := make([]int, len(names))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		if offered[a] != offered[b] {
			if offered[a] > offered[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(names[a], names[b])
	})
	t.keys = make([]string, len(order))
	t.offered = make([]int64, len(order))
	for rank, i := range order {
		t.keys[rank] = names[i]
		t.offered[rank] = offered[i]
		t.index[names[i]] = rank
	}
	return t, nil
}

type traceLine struct {
	ts     int64
	key    string
	region int
	cost   int64
}

// scanTrace calls f for each line of r, in order, after checking it.
func scanTrace(r io.Reader, regions map[string]int, f func(traceLine) error) error {
	p := newTraceParser(r, regions)
	for {
		ln, ok, err := p.next()
		if err != nil || !ok {
			return err
		}
		if err := f(ln); err != nil {
			return fmt.Errorf("trace line %d: %w", p.lineNo, err)
		}
	}
}

// traceParser reads and checks a trace line by line.
type traceParser struct {
	sc      *bufio.Scanner
	regions map[string]int
	lineNo  int64
	last    int64
}

func newTraceParser(r io.Reader, regions map[string]int) *traceParser {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 64*1024)
	return &traceParser{sc: sc, regions: regions, last: -1}
}

// next returns the next line; false at the end.
func (p *traceParser) next() (traceLine, bool, error) {
	for p.sc.Scan() {
		p.lineNo++
		line := strings.TrimSpace(p.sc.Text())
		if p.lineNo == 1 && line == "ts_us,key,region,cost" {
			continue
		}
		bad := func(format string, a ...any) (traceLine, bool, error) {
			return traceLine{}, false, fmt.Errorf("trace line %d: %s", p.lineNo, fmt.Sprintf(format, a...))
		}
		if line == "" {
			return bad("empty line")
		}
		parts := strings.Split(line, ",")
		if len(parts) != 4 {
			return bad("%d fields, want 4 (ts_us,key,region,cost)", len(parts))
		}
		ts, err := strconv.ParseInt(parts[0], 10, 64)
		if err != nil || ts < 0 || ts >= 1<<52 {
			return bad("timestamp %q: want integer µs in [0, 2^52)", parts[0])
		}
		if ts < p.last {
			return bad("timestamp %d before the previous line's %d: the trace must be in time order", ts, p.last)
		}
		p.last = ts
		if parts[1] == "" || len(parts[1]) > 256 {
			return bad("key of %d bytes: want 1 to 256", len(parts[1]))
		}
		ri, ok := p.regions[parts[2]]
		if !ok {
			return bad("region %q is not one of the scenario's", parts[2])
		}
		cost, err := strconv.ParseInt(parts[3], 10, 64)
		if err != nil || cost < 0 || cost > 1<<32-1 {
			return bad("cost %q: want an integer in [0, 2^32−1]", parts[3])
		}
		return traceLine{ts: ts, key: parts[1], region: ri, cost: cost}, true, nil
	}
	if err := p.sc.Err(); err != nil {
		return traceLine{}, false, fmt.Errorf("trace line %d: %w", p.lineNo+1, err)
	}
	return traceLine{}, false, nil
}

// traceReader streams a validated trace during a run.
type traceReader struct {
	f *os.File
	p *traceParser
}

func (t *Trace) open() (*traceReader, error) {
	f, err := os.Open(t.path)
	if err != nil {
		return nil, err
	}
	return &traceReader{f: f, p: newTraceParser(f, t.regions)}, nil
}

func (tr *traceReader) close() { tr.f.Close() }
