package memstore_test

import (
	"context"
	"fmt"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gcra/memstore"
)

func Example() {
	var now int64 // a virtual clock, µs
	cfg := memstore.DefaultConfig()
	cfg.Clock = func() int64 { return now }
	s, err := memstore.New(cfg)
	if err != nil {
		panic(err)
	}
	sch := gcra.Steady(gcra.PerSecond(5, 3)) // one every 200ms, 3 back to back
	k := gcra.Key{Tag: "acme", Name: "api/tenant=acme"}

	// Through gcra.Store, on the store's clock.
	for range 4 {
		r, err := s.Decide(context.Background(), k, sch, 1)
		if err != nil {
			panic(err)
		}
		fmt.Println(r.Allowed, r.Remaining, r.RetryAfter)
	}

	// The hot path: intern once, then decide at an explicit now.
	h, err := s.Intern(k)
	if err != nil {
		panic(err)
	}
	for range 2 {
		r, err := s.DecideAt(h, 250_000, &sch, 1)
		if err != nil {
			panic(err)
		}
		fmt.Println(r.Allowed, r.Remaining, r.RetryAfter)
	}
	// Output:
	// true 2 0s
	// true 1 0s
	// true 0 0s
	// false 0 200ms
	// true 0 0s
	// false 0 150ms
}
