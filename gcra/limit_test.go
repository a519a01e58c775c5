package gcra_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/gcra"
)

func TestLimitConstructors(t *testing.T) {
	tests := []struct {
		name       string
		l          gcra.Limit
		wantT      int64
		wantBurst  int64
		wantRate   int64
		wantPeriod time.Duration
		wantString string
	}{
		{"PerSecond(5,3)", gcra.PerSecond(5, 3), 200_000, 3, 5, time.Second, "5/1s burst 3 (T=200000µs)"},
		// 10⁶/3 = 333333.3…µs rounds up, never down: the limit never admits faster.
		{"PerSecond(3,1)", gcra.PerSecond(3, 1), 333_334, 1, 3, time.Second, "3/1s burst 1 (T=333334µs)"},
		{"PerSecond(10,6)", gcra.PerSecond(10, 6), 100_000, 6, 10, time.Second, "10/1s burst 6 (T=100000µs)"},
		{"PerSecond(1e6,1)", gcra.PerSecond(1_000_000, 1), 1, 1, 1_000_000, time.Second, "1000000/1s burst 1 (T=1µs)"},
		{"PerMinute(100,10)", gcra.PerMinute(100, 10), 600_000, 10, 100, time.Minute, "100/1m0s burst 10 (T=600000µs)"},
		{"PerMinute(7,1)", gcra.PerMinute(7, 1), 8_571_429, 1, 7, time.Minute, "7/1m0s burst 1 (T=8571429µs)"},
		{"PerHour(7,2)", gcra.PerHour(7, 2), 514_285_715, 2, 7, time.Hour, "7/1h0m0s burst 2 (T=514285715µs)"},
		{"New(1000,24h,1000)", gcra.New(1000, 24*time.Hour, 1000), 86_400_000, 1000, 1000, 24 * time.Hour, "1000/24h0m0s burst 1000 (T=86400000µs)"},
		{"New(3,9µs,2)", gcra.New(3, 9*time.Microsecond, 2), 3, 2, 3, 9 * time.Microsecond, "3/9µs burst 2 (T=3µs)"},
		{"FromInterval(1000,10)", gcra.FromInterval(1000, 10), 1000, 10, 0, 0, "T=1000µs burst 10"},
		{"zero", gcra.Limit{}, 0, 0, 0, 0, "zero (deny all)"},
		{"FromInterval(0,0)", gcra.FromInterval(0, 0), 0, 0, 0, 0, "zero (deny all)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := tt.l
			if got := l.IntervalMicros(); got != tt.wantT {
				t.Errorf("IntervalMicros() = %d, want %d", got, tt.wantT)
			}
			if got := l.Interval(); got != time.Duration(tt.wantT)*time.Microsecond {
				t.Errorf("Interval() = %v, want %dµs", got, tt.wantT)
			}
			if got := l.Burst(); got != tt.wantBurst {
				t.Errorf("Burst() = %d, want %d", got, tt.wantBurst)
			}
			if got := l.Window(); got != time.Duration(tt.wantT*tt.wantBurst)*time.Microsecond {
				t.Errorf("Window() = %v, want %d·%dµs", got, tt.wantBurst, tt.wantT)
			}
			if r, p := l.Rate(); r != tt.wantRate || p != tt.wantPeriod {
				t.Errorf("Rate() = %d, %v; want %d, %v", r, p, tt.wantRate, tt.wantPeriod)
			}
			if got := l.String(); got != tt.wantString {
				t.Errorf("String() = %q, want %q", got, tt.wantString)
			}
			if err := l.Validate(); err != nil {
				t.Errorf("Validate() = %v, want nil", err)
			}
			if got, want := l.IsZero(), tt.wantT == 0; got != want {
				t.Errorf("IsZero() = %v, want %v", got, want)
			}
		})
	}
	// Rounding up: T·rate ≥ period and (T−1)·rate < period.
	for _, rate := range []int64{1, 3, 7, 9, 11, 13, 999, 1001, 4999, 70_000, 999_999} {
		l := gcra.PerSecond(rate, 1)
		T := l.IntervalMicros()
		if T*rate < 1_000_000 || (T-1)*rate >= 1_000_000 {
			t.Errorf("PerSecond(%d): T = %dµs is not 10⁶/%d rounded up", rate, T, rate)
		}
	}
	// Limits are comparable values.
	if gcra.PerSecond(5, 3) != gcra.PerSecond(5, 3) || gcra.PerSecond(5, 3) == gcra.PerSecond(5, 4) {
		t.Errorf("Limit equality is not by value")
	}
}

// TestLimitRoundingLoss checks the 1 % rule: rate per period is refused
// when the rounded-up T admits period/T < 0.99·rate.
func TestLimitRoundingLoss(t *testing.T) {
	tests := []struct {
		rate      int64
		period    time.Duration
		wantValid bool
		why       string
	}{
		{1_000_000, time.Second, true, "T = 1µs exactly"},
		{600_000, time.Second, false, "T = ceil(1.67) = 2µs admits 500000/s: 16.7 % lost"},
		{300_000, time.Second, false, "T = ceil(3.33) = 4µs admits 250000/s: 16.7 % lost"},
		{500_000, time.Second, true, "T = 2µs exactly"},
		{505_050, time.Second, true, "T = 2µs admits 500000 ≥ 0.99·505050 = 499999.5"},
		{505_051, time.Second, false, "T = 2µs admits 500000 < 0.99·505051 = 500000.49"},
		{990_000, time.Second, false, "T = 2µs admits half"},
		{100_000, time.Second, true, "T = 10µs exactly"},
		{99_999, time.Second, false, "T = ceil(10.0001) = 11µs admits 90909: 9.1 % lost"},
		{99_000, time.Second, false, "T = ceil(10.10) = 11µs admits 90909 < 98010"},
		{10_000, time.Second, true, "T = 100µs exactly"},
		{9_901, time.Second, true, "T = ceil(100.999) = 101µs admits 9900.99 ≥ 9801.99"},
		{100, 99 * time.Microsecond, true, "T = 1µs admits 99 per 99µs: exactly 1 % lost"},
		{100, 98 * time.Microsecond, false, "T = 1µs admits 98 per 98µs: 2 % lost"},
		{101, 100 * time.Microsecond, true, "T = 1µs admits 100 of 101: 0.99 % lost"},
		{1 << 62, time.Second, false, "T = 1µs: almost everything lost, and no overflow"},
		{math.MaxInt64, time.Hour, false, "T = 1µs: no overflow in T·rate·99"},
	}
	for _, tt := range tests {
		l := gcra.New(tt.rate, tt.period, 1)
		err := l.Validate()
		if (err == nil) != tt.wantValid {
			t.Errorf("New(%d, %v, 1) [T=%dµs]: Validate() = %v, want valid=%v (%s)", tt.rate, tt.period, l.IntervalMicros(), err, tt.wantValid, tt.why)
		}
		if err != nil && !strings.Contains(err.Error(), "more than 1% below the rate") {
			t.Errorf("New(%d, %v, 1): error %q does not name the rounding loss", tt.rate, tt.period, err)
		}
		s := gcra.Steady(l)
		if s.Valid() != tt.wantValid {
			t.Errorf("New(%d, %v, 1): Schedule.Valid() = %v, want %v", tt.rate, tt.period, s.Valid(), tt.wantValid)
		}
	}
	// Brute force: for every rate up to 20000 per second and a few periods,
	// valid ⇔ 100·period ≥ 99·T·rate with T = ceil(period/rate).
	for _, period := range []int64{1_000_000, 1000, 60_000_000} {
		for rate := int64(1); rate <= 20_000; rate++ {
			T := (period + rate - 1) / rate
			want := 100*period >= 99*T*rate
			l := gcra.New(rate, time.Duration(period)*time.Microsecond, 1)
			if l.IntervalMicros() != T {
				t.Fatalf("rate %d per %dµs: T = %d, want %d", rate, period, l.IntervalMicros(), T)
			}
			if got := l.Validate() == nil; got != want {
				t.Fatalf("rate %d per %dµs (T=%d): valid = %v, want %v", rate, period, T, got, want)
			}
		}
	}
}

// joined returns the errors joined inside a Validate error.
func joined(t *testing.T, err error) []error {
	t.Helper()
	for e := err; e != nil; e = errors.Unwrap(e) {
		j, ok := e.(interface{ Unwrap() []error })
		if !ok {
			continue
		}
		parts := j.Unwrap()
		// Schedule.Validate wraps ErrInvalidLimit and the joined problems.
		if len(parts) == 2 && parts[0] == gcra.ErrInvalidLimit {
			return joined(t, parts[1])
		}
		return parts
	}
	return []error{err}
}

func TestLimitValidate(t *testing.T) {
	mw := gcra.MaxWindowMicros
	tests := []struct {
		name string
		l    gcra.Limit
		want []string // one fragment per expected problem, in order
	}{
		{"zero limit", gcra.Limit{}, nil},
		{"window exactly MaxWindow", gcra.FromInterval(1<<13, mw>>13), nil},
		{"burst exactly MaxBurst", gcra.FromInterval(1, gcra.MaxBurst), nil},
		{"MaxWindow from whole powers of two", gcra.FromInterval(1<<20, 1<<31), nil},
		{"one per year, burst one", gcra.New(1, 365*24*time.Hour, 1), nil},
		{"FromInterval half window", gcra.FromInterval(1<<13, mw>>14), nil},
		{"rate 0", gcra.PerSecond(0, 1), []string{"rate 0: must be at least 1"}},
		{"rate and burst", gcra.PerSecond(0, 0), []string{"rate 0: must be at least 1", "burst 0: must be at least 1"}},
		{"negative everything", gcra.New(-5, -time.Second, -1), []string{
			"rate -5: must be at least 1", "period -1s: must be at least 1µs", "burst -1: must be at least 1"}},
		{"sub-µs period", gcra.New(5, 500*time.Nanosecond, 1), []string{"period 500ns: must be at least 1µs"}},
		{"fractional period", gcra.New(1, 1500*time.Nanosecond, 1), []string{"period 1.5µs: must be a whole number of microseconds"}},
		{"interval 0", gcra.FromInterval(0, 1), []string{"interval 0µs: must be at least 1µs"}},
		{"negative interval and burst", gcra.FromInterval(-3, -1), []string{
			"interval -3µs: must be at least 1µs", "burst -1: must be at least 1"}},
		{"burst 0 only", gcra.FromInterval(10, 0), []string{"burst 0: must be at least 1"}},
		{"window 1µs too long", gcra.FromInterval(mw>>12+1, 1<<12), []string{"exceeds the maximum window of 2^51 µs"}},
		{"burst above MaxBurst", gcra.FromInterval(1, gcra.MaxBurst+1), []string{"burst 549755813888: above the maximum 2^39−1"}},
		{"window too long (PerSecond)", gcra.PerSecond(1, 2_251_799_814), []string{"burst 2251799814 × interval 1000000µs: exceeds the maximum window"}},
		{"window too long (PerHour)", gcra.PerHour(1, 625_500), []string{"exceeds the maximum window"}},
		{"huge burst", gcra.FromInterval(2, math.MaxInt64), []string{"above the maximum 2^39−1"}},
		{"loss and burst", gcra.PerSecond(600_000, 0), []string{
			"interval rounds up to 2µs", "burst 0: must be at least 1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.l.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				if s := gcra.Steady(tt.l); !s.Valid() || s.Validate() != nil {
					t.Errorf("Steady schedule of a valid limit is invalid: %v", s.Validate())
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want %d problems %q", len(tt.want), tt.want)
			}
			if !strings.HasPrefix(err.Error(), "gcra: invalid limit ") {
				t.Errorf("error %q does not start with \"gcra: invalid limit \"", err)
			}
			parts := joined(t, err)
			if len(parts) != len(tt.want) {
				t.Fatalf("%d problems reported, want %d: %v", len(parts), len(tt.want), err)
			}
			for i, frag := range tt.want {
				if !strings.Contains(parts[i].Error(), frag) {
					t.Errorf("problem %d = %q, want it to contain %q", i, parts[i], frag)
				}
			}
			// A store would refuse it; Decide treats it as the zero limit.
			if s := gcra.Steady(tt.l); s.Valid() || s.Validate() == nil {
				t.Errorf("Steady schedule of an invalid limit passes validation")
			}
		})
	}
}

func TestScheduleValidate(t *testing.T) {
	good := gcra.PerSecond(5, 3)
	bad := gcra.PerSecond(0, 1)
	tests := []struct {
		name string
		s    gcra.Schedule
		want []string
	}{
		{"steady", gcra.Steady(good), nil},
		{"steady zero", gcra.Steady(gcra.Limit{}), nil},
		{"change", gcra.Change(gcra.Version{Limit: good, Epoch: 1, Effective: 5}, gcra.Version{Limit: gcra.Limit{}, Epoch: 2, Effective: 5}), nil},
		{"previous ignored without HasPrevious", gcra.Schedule{Current: gcra.Version{Limit: good}, Previous: gcra.Version{Limit: bad, Effective: 10}}, nil},
		{"bad current", gcra.Steady(bad), []string{"current limit"}},
		{"everything wrong", gcra.Change(
			gcra.Version{Limit: bad, Epoch: 1, Effective: 10},
			gcra.Version{Limit: gcra.FromInterval(0, 1), Epoch: 2, Effective: 9}),
			[]string{"current limit", "previous limit", "previous limit effective at 10µs, after the current one (9µs)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.s.Validate()
			if tt.s.Valid() != (err == nil) {
				t.Errorf("Valid() = %v disagrees with Validate() = %v", tt.s.Valid(), err)
			}
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v", err)
				}
				return
			}
			if !errors.Is(err, gcra.ErrInvalidLimit) {
				t.Fatalf("Validate() = %v, want ErrInvalidLimit", err)
			}
			parts := joined(t, err)
			if len(parts) != len(tt.want) {
				t.Fatalf("%d problems, want %d: %v", len(parts), len(tt.want), err)
			}
			for i, frag := range tt.want {
				if !strings.Contains(parts[i].Error(), frag) {
					t.Errorf("problem %d = %q, want %q", i, parts[i], frag)
				}
			}
		})
	}
}
