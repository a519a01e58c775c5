package memstore_test

import (
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gcra/memstore"
)

func BenchmarkDecideAt(b *testing.B) {
	s, _ := newStore(b, nil)
	h := intern(b, s, "bench")
	sch := gcra.Steady(gcra.PerSecond(1000, 10)) // T = 1000µs
	b.ReportAllocs()
	var now int64
	for b.Loop() {
		now += 500 // half the requests admitted
		if _, err := s.DecideAt(h, now, &sch, 1); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecideAtParallel(b *testing.B) {
	const nKeys = 1024
	s, _ := newStore(b, nil)
	hs := make([]memstore.Handle, nKeys)
	for i := range hs {
		hs[i] = intern(b, s, "tenant-"+strconv.Itoa(i))
	}
	sch := gcra.Steady(gcra.PerSecond(1000, 10))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := rand.IntN(nKeys)
		var now int64
		for pb.Next() {
			i = (i + 1) % nKeys
			now += 50
			if _, err := s.DecideAt(hs[i], now, &sch, 1); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
}

func BenchmarkDecideAllAt(b *testing.B) {
	s, _ := newStore(b, nil)
	hs := []memstore.Handle{intern(b, s, "tenant=acme"), intern(b, s, "tenant=acme/route=/search")}
	checks := []gcra.Check{
		{Schedule: gcra.Steady(gcra.PerSecond(1000, 10)), Cost: 1},
		{Schedule: gcra.Steady(gcra.PerMinute(30_000, 100)), Cost: 1},
	}
	out := make([]gcra.Result, len(checks))
	b.ReportAllocs()
	var now int64
	for b.Loop() {
		now += 500
		if _, err := s.DecideAllAt(now, hs, checks, out); err != nil {
			b.Fatal(err)
		}
	}
}
