package gcra

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"time"
)

// MaxWindow caps how far ahead of now a key's theoretical arrival time may
// run: Burst·T for every limit, and Burst·T + maxWait for reservations. It
// is 2^51 µs, about 71 years, so that every instant the core computes —
// now (below MaxTime, 2^52 µs) plus a window, plus a cost — stays an exact
// integer below 2^53 in the Redis script's Lua doubles. A yearly quota fits
// with room to spare; what it bounds in practice is a tiny share of a slow
// limit, whose region may hold one event per T_r = T·10⁶/share: see
// rebalance.MinShare.
const MaxWindow = time.Duration(1<<51) * time.Microsecond

// MaxBurst is the largest Burst a limit may have (2^39 − 1, about 5.5·10¹¹
// events): the Redis store packs a request's cost, capped at 2^39, beside
// the check's other fields in one exact integer.
const MaxBurst = int64(1)<<39 - 1

// MaxWindowMicros is MaxWindow in microseconds.
const MaxWindowMicros = int64(MaxWindow / time.Microsecond)

// MaxTAT bounds every TAT a store keeps or a conversion yields:
// MaxTime + MaxWindow − 1. A written TAT is at most now + MaxWindow; a
// conversion that would carry a key's debt beyond MaxTAT saturates there,
// where the key is blocked for longer than any window lasts anyway.
const MaxTAT = MaxTime + MaxWindowMicros - 1

// Never is the RetryAfter of a request that can never be admitted under its
// limit (cost above Burst, or the zero limit). It is the largest Duration, so
// a caller that sleeps for it or turns it into a Retry-After header does not
// come back.
const Never time.Duration = math.MaxInt64

// maxLossPPM is the largest share of the configured rate the rounding of T
// up to whole microseconds may lose: 1 %.
const maxLossPPM = 10_000

// Limit is a GCRA limit: one event every T microseconds (the emission
// interval) with Burst events admitted back to back after idle.
//
// A Limit built with PerSecond, PerMinute, PerHour or New keeps its rate and
// period for display; FromInterval builds one from T directly (regional
// limits). T is Period/Rate rounded up to whole microseconds, so a limit never
// admits faster than configured.
//
// The zero Limit is valid and denies every request without writing state.
// Any other limit must pass Validate; stores reject invalid limits with an
// error. Limit is a small comparable value, safe to copy and share.
type Limit struct {
	rate   int64
	period time.Duration
	burst  int64
	t      int64 // emission interval, µs
	ok     bool  // passes Validate and is not the zero limit
}

// PerSecond is rate events per second with the given burst.
func PerSecond(rate, burst int64) Limit { return New(rate, time.Second, burst) }

// PerMinute is rate events per minute with the given burst.
func PerMinute(rate, burst int64) Limit { return New(rate, time.Minute, burst) }

// PerHour is rate events per hour with the given burst.
func PerHour(rate, burst int64) Limit { return New(rate, time.Hour, burst) }

// New is rate events per period with the given burst. Call Validate to learn
// whether the combination is usable; an invalid limit is refused by stores.
func New(rate int64, period time.Duration, burst int64) Limit {
	l := Limit{rate: rate, period: period, burst: burst}
	if rate > 0 && period > 0 {
		p := int64(period / time.Microsecond)
		l.t = p / rate
		if p%rate != 0 {
			l.t++
		}
	}
	l.ok = l.validate() == nil && !l.IsZero()
	return l
}

// FromInterval is one event every intervalMicros microseconds with the given
// burst. FromInterval(0, 0) is the zero limit.
func FromInterval(intervalMicros, burst int64) Limit {
	// The fast form of validate for a limit with no rate or period:
	// usable iff T ≥ 1, Burst ≥ 1 and Burst·T within MaxWindow.
	ok := intervalMicros > 0 && burst > 0 && burst <= MaxBurst && !windowExceeds(burst, intervalMicros)
	return Limit{t: intervalMicros, burst: burst, ok: ok}
}

// IsZero reports whether l is the zero limit, which denies every request.
func (l Limit) IsZero() bool { return l.t == 0 && l.burst == 0 && l.rate == 0 && l.period == 0 }

// Interval returns the emission interval T.
func (l Limit) Interval() time.Duration { return time.Duration(l.t) * time.Microsecond }

// IntervalMicros returns the emission interval T in microseconds.
func (l Limit) IntervalMicros() int64 { return l.t }

// Burst returns the number of events admitted back to back after idle.
func (l Limit) Burst() int64 { return l.burst }

// Rate returns the configured rate and period; both are zero for a limit
// built with FromInterval.
func (l Limit) Rate() (events int64, period time.Duration) { return l.rate, l.period }

// Window returns Burst·T, how far ahead of now the TAT may run.
func (l Limit) Window() time.Duration { return time.Duration(l.burst*l.t) * time.Microsecond }

// usable reports whether l admits anything: valid and not zero.
func (l Limit) usable() bool { return l.ok }

// Validate reports every problem with l at once. The zero limit is valid.
func (l Limit) Validate() error {
	if err := l.validate(); err != nil {
		return fmt.Errorf("gcra: invalid limit %s: %w", l, err)
	}
	return nil
}

func (l Limit) validate() error {
	if l.IsZero() {
		return nil
	}
	var errs []error
	built := l.rate != 0 || l.period != 0
	if built {
		if l.rate <= 0 {
			errs = append(errs, fmt.Errorf("rate %d: must be at least 1 (use the zero Limit to deny everything)", l.rate))
		}
		switch {
		case l.period < time.Microsecond:
			errs = append(errs, fmt.Errorf("period %s: must be at least 1µs", l.period))
		case l.period%time.Microsecond != 0:
			errs = append(errs, fmt.Errorf("period %s: must be a whole number of microseconds", l.period))
		}
	}
	if l.t <= 0 {
		if !built || len(errs) == 0 {
			errs = append(errs, fmt.Errorf("interval %dµs: must be at least 1µs", l.t))
		}
	} else if built && l.rate > 0 && l.period >= time.Microsecond {
		// Rounding T up loses rate; refuse to lose more than 1 %:
		// period/(T·rate) < 0.99  ⇔  100·period < 99·T·rate.
		// T·rate < period + rate, so the product fits in 64 bits.
		p := uint64(l.period / time.Microsecond)
		hiP, loP := bits.Mul64(p, 100)
		hiR, loR := bits.Mul64(uint64(l.t)*uint64(l.rate), 99)
		if hiP < hiR || (hiP == hiR && loP < loR) {
			errs = append(errs, fmt.Errorf("rate %d per %s: interval rounds up to %dµs, which admits only %.6g per %s, more than 1%% below the rate; use a longer period",
				l.rate, l.period, l.t, float64(p)/float64(l.t), l.period))
		}
	}
	switch {
	case l.burst < 1:
		errs = append(errs, fmt.Errorf("burst %d: must be at least 1", l.burst))
	case l.burst > MaxBurst:
		errs = append(errs, fmt.Errorf("burst %d: above the maximum 2^39−1", l.burst))
	case l.t > 0 && windowExceeds(l.burst, l.t):
		errs = append(errs, fmt.Errorf("burst %d × interval %dµs: exceeds the maximum window of 2^51 µs (about 71 years)", l.burst, l.t))
	}
	return errors.Join(errs...)
}

// String formats l as "5/1s burst 3 (T=200000µs)", "T=1000µs burst 10" or
// "zero (deny all)".
func (l Limit) String() string {
	switch {
	case l.IsZero():
		return "zero (deny all)"
	case l.rate != 0 || l.period != 0:
		return fmt.Sprintf("%d/%s burst %d (T=%dµs)", l.rate, l.period, l.burst, l.t)
	default:
		return fmt.Sprintf("T=%dµs burst %d", l.t, l.burst)
	}
}

// windowExceeds reports whether burst·t > MaxWindowMicros, without a
// division (constructors run it for every limit they build).
func windowExceeds(burst, t int64) bool {
	hi, lo := bits.Mul64(uint64(burst), uint64(t))
	return hi != 0 || lo > uint64(MaxWindowMicros)
}
