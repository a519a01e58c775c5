package region

import (
	"fmt"
	"time"
)

// BreakerOutcome is what one call a BreakerPolicy let through says about
// the store's health.
type BreakerOutcome uint8

const (
	// BreakerSucceeded: the store answered the call.
	BreakerSucceeded BreakerOutcome = iota
	// BreakerFailed: the store failed (an error, a timeout) — the only
	// outcome that counts towards opening the breaker.
	BreakerFailed
	// BreakerIgnored: the call says nothing about the store — its caller
	// gave up, or the store refused the input or answered about one key's
	// data. It neither opens nor closes the breaker, nor breaks a run of
	// failures.
	BreakerIgnored
)

// BreakerPolicy is the circuit breaker's rule, with no clock and no I/O:
// the shell asks Allow before each store call and reports the call's
// outcome to Done, passing the instant of each (µs on any clock that does
// not go back; a reading below an earlier one counts as that one, as
// golang.org/x/time/rate clamps time going backwards).
//
// Closed, every call goes to the store; Failures store failures in a row
// (BreakerFailed, with no BreakerSucceeded between them) open it. Open, it
// refuses every call for Cooldown after it opened, then lets one call
// through, the probe (half-open): the probe's success closes the breaker,
// its failure opens it again for another Cooldown, and an ignored outcome
// lets the next call probe at once. A probe that has not reported after
// Cooldown is given up on and the next call probes too (a store call that
// hangs past its timeout, a caller that never reports, must not hold the
// breaker open for ever); its report, if it comes, still counts as a
// probe's. While open, only probes' outcomes count: a call let through
// before the breaker opened and ending after says nothing about the
// store's health since, and closing on it would cut the Cooldown short.
//
// The zero value is not usable: use NewBreakerPolicy. A BreakerPolicy is
// not safe for concurrent use: the agent's shell calls it under the lock
// that also keeps its metrics in step with its transitions, and the
// simulator drives it from one goroutine.
type BreakerPolicy struct {
	failures int   // failures in a row that open it, ≥ 1
	cooldown int64 // µs, ≥ 1

	last     int64 // the largest instant seen
	fails    int   // store failures in a row while closed
	open     bool
	openedAt int64 // when it last opened or reopened
	probing  bool  // a probe is outstanding, since probeAt
	probeAt  int64
}

// NewBreakerPolicy returns a closed breaker that opens after failures
// store failures in a row (at least 1) and stays open for cooldown
// (positive, rounded up to whole µs) before probing.
func NewBreakerPolicy(failures int, cooldown time.Duration) (*BreakerPolicy, error) {
	if failures < 1 || cooldown <= 0 {
		return nil, fmt.Errorf("region: breaker: failures %d must be ≥ 1 and cooldown %s positive", failures, cooldown)
	}
	us := int64(cooldown / time.Microsecond)
	if cooldown%time.Microsecond != 0 {
		us++
	}
	return &BreakerPolicy{failures: failures, cooldown: us}, nil
}

// clamp returns now, or the largest instant seen if now is below it.
func (p *BreakerPolicy) clamp(now int64) int64 {
	p.last = max(p.last, now)
	return p.last
}

// Allow reports whether a call may go to the store at now, and whether it
// is the probe; the caller must pass probe back to Done with the call's
// outcome.
func (p *BreakerPolicy) Allow(now int64) (ok, probe bool) {
	now = p.clamp(now)
	if !p.open {
		return true, false
	}
	if now-p.openedAt < p.cooldown || (p.probing && now-p.probeAt < p.cooldown) {
		return false, false
	}
	p.probing, p.probeAt = true, now
	return true, true
}

// Done records the outcome of a call Allow let through at now, probe as
// Allow returned it. opened reports that this outcome opened a closed
// breaker, closed that it closed an open one (a probe failing reopens an
// open breaker: neither).
func (p *BreakerPolicy) Done(now int64, probe bool, o BreakerOutcome) (opened, closed bool) {
	now = p.clamp(now)
	if !p.open {
		switch o {
		case BreakerSucceeded:
			p.fails = 0
		case BreakerFailed:
			p.fails++
			if p.fails >= p.failures {
				p.open, p.openedAt, p.probing = true, now, false
				return true, false
			}
		}
		return false, false
	}
	if !probe {
		return false, false
	}
	p.probing = false
	switch o {
	case BreakerSucceeded:
		p.open, p.fails = false, 0
		return false, true
	case BreakerFailed:
		p.openedAt = now
	}
	return false, false
}

// Open reports whether the breaker is open (half-open included).
func (p *BreakerPolicy) Open() bool { return p.open }
