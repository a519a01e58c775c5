package agent

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/region"
)

// HeadersDraft is the revision of the IETF httpapi RateLimit header fields
// the agent emits: RateLimit-Policy: "<name>";q=<quota>;w=<window s> and
// RateLimit: "<name>";r=<remaining>;t=<seconds to reset>.
const HeadersDraft = "draft-ietf-httpapi-ratelimit-headers-09"

// headerFields returns the response header fields for a decision: the
// policy and counters of its most constraining limit (the one that denied,
// else the one with the least remaining), and Retry-After (RFC 9110, whole
// seconds rounded up) when denied. None when no limit applied.
func headerFields(d *region.Decision) [][2]string {
	var m *region.Match
	for i := range d.Matches {
		c := &d.Matches[i]
		if c.Rule.Shadow {
			continue
		}
		if m == nil || over(c) && !over(m) || over(c) == over(m) && c.Result.Remaining < m.Result.Remaining {
			m = c
		}
	}
	if m == nil {
		return nil
	}
	name := m.Rule.Name
	if name == "" {
		name = m.Rule.Path
	}
	events, period := m.Rule.Limit.Rate()
	if m.Rule.Limit.IsZero() {
		// requests_per_unit: 0: no events per the rule's unit (the zero
		// limit has no interval).
		_, period = zeroLimitUnit(m.Rule)
	} else if period <= 0 {
		events, period = int64(time.Second/max(m.Rule.Limit.Interval(), 1)), time.Second
	}
	reset := m.Result.ResetAfter
	if over(m) && m.Result.RetryAfter != gcra.Never {
		reset = m.Result.RetryAfter
	}
	out := [][2]string{
		{"RateLimit-Policy", fmt.Sprintf("%s;q=%d;w=%d", strconv.Quote(name), events, ceilSeconds(period))},
		{"RateLimit", fmt.Sprintf("%s;r=%d;t=%d", strconv.Quote(name), max(m.Result.Remaining, 0), ceilSeconds(reset))},
	}
	if over(m) && m.Result.RetryAfter != gcra.Never {
		out = append(out, [2]string{"Retry-After", strconv.FormatInt(max(ceilSeconds(m.Result.RetryAfter), 1), 10)})
	}
	return out
}

// ceilSeconds is d in whole seconds, rounded up.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(math.Ceil(d.Seconds()))
}
