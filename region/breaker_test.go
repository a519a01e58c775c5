package region

import (
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// A breakerStep is one call to a BreakerPolicy at an instant: "allow", or
// the outcome of a call ("ok", "fail", "ignore") with its probe flag.
type breakerStep struct {
	at    int64
	op    string
	probe bool

	wantOK, wantProbe      bool // allow
	wantOpened, wantClosed bool // done
	wantOpen               bool // Open() after the step
}

func (s breakerStep) run(p *BreakerPolicy) string {
	switch s.op {
	case "allow":
		if ok, probe := p.Allow(s.at); ok != s.wantOK || probe != s.wantProbe {
			return fmt.Sprintf("Allow = %v, %v, want %v, %v", ok, probe, s.wantOK, s.wantProbe)
		}
	default:
		o := map[string]BreakerOutcome{"ok": BreakerSucceeded, "fail": BreakerFailed, "ignore": BreakerIgnored}[s.op]
		if opened, closed := p.Done(s.at, s.probe, o); opened != s.wantOpened || closed != s.wantClosed {
			return fmt.Sprintf("Done = opened %v, closed %v, want %v, %v", opened, closed, s.wantOpened, s.wantClosed)
		}
	}
	if p.Open() != s.wantOpen {
		return fmt.Sprintf("Open() = %v, want %v", p.Open(), s.wantOpen)
	}
	return ""
}

// Step constructors for the timelines below: t is the instant in µs.
func allowed(t int64, open bool) breakerStep {
	return breakerStep{at: t, op: "allow", wantOK: true, wantOpen: open}
}
func probes(t int64) breakerStep {
	return breakerStep{at: t, op: "allow", wantOK: true, wantProbe: true, wantOpen: true}
}
func refused(t int64) breakerStep { return breakerStep{at: t, op: "allow", wantOpen: true} }
func done(t int64, op string, probe, open bool) breakerStep {
	return breakerStep{at: t, op: op, probe: probe, wantOpen: open}
}
func opens(t int64) breakerStep {
	return breakerStep{at: t, op: "fail", wantOpened: true, wantOpen: true}
}
func closes(t int64) breakerStep {
	return breakerStep{at: t, op: "ok", probe: true, wantClosed: true}
}

// Timelines on explicit instants (µs) for Failures 3 and Cooldown 100 µs,
// one per transition.
func TestBreakerPolicyTimelines(t *testing.T) {
	const c = 100 // cooldown, µs
	tests := []struct {
		name  string
		steps []breakerStep
	}{
		{"three failures in a row open it", []breakerStep{
			allowed(0, false), done(1, "fail", false, false),
			allowed(2, false), done(3, "fail", false, false),
			allowed(4, false), opens(5),
			refused(6),
		}},
		{"a success breaks the run", []breakerStep{
			done(1, "fail", false, false), done(2, "fail", false, false),
			done(3, "ok", false, false),
			done(4, "fail", false, false), done(5, "fail", false, false),
			opens(6),
		}},
		{"an ignored outcome neither breaks the run nor counts", []breakerStep{
			done(1, "fail", false, false), done(2, "ignore", false, false),
			done(3, "fail", false, false), done(4, "ignore", false, false),
			opens(5),
		}},
		{"open refuses for the cooldown, then one call probes; its success closes it", []breakerStep{
			done(0, "fail", false, false), done(0, "fail", false, false), opens(10),
			refused(11), refused(10 + c - 1),
			probes(10 + c),
			refused(10 + c), refused(10 + 2*c - 1), // one probe at a time
			closes(10 + 2*c - 1),
			allowed(10+2*c, false), allowed(10+2*c, false),
		}},
		{"a probe's failure reopens it for another cooldown from the failure", []breakerStep{
			done(0, "fail", false, false), done(0, "fail", false, false), opens(0),
			probes(c), done(c+50, "fail", true, true),
			refused(c + 50), refused(2*c + 49),
			probes(2*c + 50), closes(2*c + 51),
		}},
		{"after a probe's ignored outcome the next call probes at once", []breakerStep{
			done(0, "fail", false, false), done(0, "fail", false, false), opens(0),
			probes(c), done(c+1, "ignore", true, true),
			probes(c + 1), closes(c + 2),
		}},
		{"closing resets the run", []breakerStep{
			done(0, "fail", false, false), done(0, "fail", false, false), opens(0),
			probes(c), closes(c),
			done(c+1, "fail", false, false), done(c+2, "fail", false, false), opens(c + 3),
		}},
		// Regression: the agent's Breaker kept a probe outstanding until its
		// call reported, so a call hanging past its timeout held the breaker
		// open for ever.
		{"a probe unreported for a cooldown lets the next call probe", []breakerStep{
			done(0, "fail", false, false), done(0, "fail", false, false), opens(0),
			probes(c), refused(2*c - 1),
			probes(2 * c), refused(3*c - 1),
			closes(3*c - 1),                // the second probe's success
			done(3*c, "fail", true, false), // the first, late: counted while closed
			allowed(3*c, false),
		}},
		{"a late report of an abandoned probe still counts as a probe's", []breakerStep{
			done(0, "fail", false, false), done(0, "fail", false, false), opens(0),
			probes(c), probes(2 * c),
			done(2*c+1, "fail", true, true), // the first probe fails: reopened at 2c+1
			refused(3 * c), probes(3*c + 1),
		}},
		// Regression: a call let through while the breaker was closed and
		// ending after it opened closed it again at once (its success), and
		// an ignored one cleared the outstanding probe, letting a second
		// probe through.
		{"while open, only probes' outcomes count", []breakerStep{
			done(0, "fail", false, false), done(0, "fail", false, false), opens(0),
			done(1, "ok", false, true), refused(2),
			done(3, "fail", false, true), probes(c),
			done(c+1, "ignore", false, true), refused(c + 1),
			done(c+2, "ok", false, true), refused(c + 2),
			closes(c + 3),
		}},
		{"time going back counts as the largest instant seen", []breakerStep{
			done(0, "fail", false, false), done(0, "fail", false, false), opens(1000),
			refused(1000 + c - 1), refused(0), // still open: 0 counts as 1000+c-1
			probes(1000 + c), done(5, "fail", true, true), // reopened at 1000+c, not 5
			refused(1000 + 2*c - 1), probes(1000 + 2*c),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := NewBreakerPolicy(3, c*time.Microsecond)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range tt.steps {
				if msg := s.run(p); msg != "" {
					t.Fatalf("step %d (%s at %d µs): %s", i, s.op, s.at, msg)
				}
			}
		})
	}
}

func TestNewBreakerPolicy(t *testing.T) {
	for _, tt := range []struct {
		failures int
		cooldown time.Duration
		wantErr  bool
		wantUS   int64
	}{
		{1, time.Second, false, 1_000_000},
		{5, time.Nanosecond, false, 1}, // rounded up: never a zero cooldown
		{5, 1500 * time.Nanosecond, false, 2},
		{0, time.Second, true, 0},
		{1, 0, true, 0},
		{1, -time.Second, true, 0},
	} {
		p, err := NewBreakerPolicy(tt.failures, tt.cooldown)
		if (err != nil) != tt.wantErr {
			t.Errorf("NewBreakerPolicy(%d, %s): error %v, want error %v", tt.failures, tt.cooldown, err, tt.wantErr)
			continue
		}
		if err == nil && p.cooldown != tt.wantUS {
			t.Errorf("NewBreakerPolicy(%d, %s): cooldown %d µs, want %d", tt.failures, tt.cooldown, p.cooldown, tt.wantUS)
		}
	}
}

// refBreaker is the rule of BreakerPolicy's doc comment as a three-state
// machine, written apart from it.
type refBreaker struct {
	failures int
	cooldown int64
	now      int64

	state    string // "closed", "open", "half-open" (a probe outstanding)
	run      int    // closed: failures in a row
	openedAt int64  // open, half-open
	probeAt  int64  // half-open
}

func (m *refBreaker) at(t int64) { m.now = max(m.now, t) }

func (m *refBreaker) allow(t int64) (ok, probe bool) {
	m.at(t)
	switch {
	case m.state == "closed":
		return true, false
	case m.state == "open" && m.now >= m.openedAt+m.cooldown,
		m.state == "half-open" && m.now >= m.probeAt+m.cooldown:
		m.state, m.probeAt = "half-open", m.now
		return true, true
	}
	return false, false
}

func (m *refBreaker) done(t int64, probe bool, o BreakerOutcome) {
	m.at(t)
	switch {
	case m.state == "closed" && o == BreakerSucceeded:
		m.run = 0
	case m.state == "closed" && o == BreakerFailed:
		if m.run++; m.run == m.failures {
			m.state, m.openedAt = "open", m.now
		}
	case m.state == "closed", !probe:
	case o == BreakerSucceeded:
		m.state, m.run = "closed", 0
	case o == BreakerFailed:
		m.state, m.openedAt = "open", m.now
	default:
		m.state = "open"
	}
}

// call is a call a breaker let through and that has not reported yet.
type call struct{ probe bool }

// BreakerPolicy agrees with refBreaker over random sequences of time
// steps (some backwards), calls, and outcomes reported in any order or
// never.
func TestBreakerPolicyMatchesModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		failures := rapid.IntRange(1, 4).Draw(t, "failures")
		cooldown := rapid.Int64Range(1, 5).Draw(t, "cooldown")
		p, err := NewBreakerPolicy(failures, time.Duration(cooldown)*time.Microsecond)
		if err != nil {
			t.Fatal(err)
		}
		m := &refBreaker{failures: failures, cooldown: cooldown, state: "closed"}
		var now int64
		var pending []call
		t.Repeat(map[string]func(*rapid.T){
			"advance": func(t *rapid.T) {
				now += rapid.Int64Range(-2, 2*cooldown+1).Draw(t, "dt")
			},
			"allow": func(t *rapid.T) {
				ok, probe := p.Allow(now)
				wantOK, wantProbe := m.allow(now)
				if ok != wantOK || probe != wantProbe {
					t.Fatalf("Allow(%d) = %v, %v, model %v, %v (model %+v)", now, ok, probe, wantOK, wantProbe, *m)
				}
				if ok {
					pending = append(pending, call{probe})
				}
			},
			"done": func(t *rapid.T) {
				if len(pending) == 0 {
					return // no call outstanding: nothing to report (a no-op step)
				}
				i := rapid.IntRange(0, len(pending)-1).Draw(t, "call")
				c := pending[i]
				pending = append(pending[:i], pending[i+1:]...)
				o := rapid.SampledFrom([]BreakerOutcome{BreakerSucceeded, BreakerFailed, BreakerIgnored}).Draw(t, "outcome")
				wasClosed := m.state == "closed"
				m.done(now, c.probe, o)
				opened, closed := p.Done(now, c.probe, o)
				if opened != (wasClosed && m.state != "closed") || closed != (!wasClosed && m.state == "closed") {
					t.Fatalf("Done(%d, %v, %d) = opened %v, closed %v; model went from closed=%v to %s", now, c.probe, o, opened, closed, wasClosed, m.state)
				}
			},
			"": func(t *rapid.T) {
				if p.Open() != (m.state != "closed") {
					t.Fatalf("Open() = %v, model %s", p.Open(), m.state)
				}
			},
		})
	})
}
