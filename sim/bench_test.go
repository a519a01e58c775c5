package sim

import (
	"testing"
	"time"
)

// BenchmarkSimulate runs steady-skew under ewma at 5 s for one seed and
// reports simulated decisions per second on one core.
func BenchmarkSimulate(b *testing.B) {
	sc, err := Builtin("steady-skew")
	if err != nil {
		b.Fatal(err)
	}
	var decisions int64
	start := time.Now()
	for b.Loop() {
		r, err := NewRun(sc, "ewma", 5*time.Second, 1, nil)
		if err != nil {
			b.Fatal(err)
		}
		res, err := r.Simulate()
		if err != nil {
			b.Fatal(err)
		}
		decisions += res.Requests
	}
	b.ReportMetric(float64(decisions)/time.Since(start).Seconds(), "decisions/s")
}
