package region

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gcra/memstore"
	"github.com/meridian-quota/meridian/rebalance"
)

// TestNodeConcurrent decides from 64 goroutines while the main goroutine
// applies tables and ticks: under -race nothing races, and the reports add
// up exactly to what the deciders saw.
func TestNodeConcurrent(t *testing.T) {
	var clock atomic.Int64
	clock.Store(1_700_000_000_000_000)
	ms, err := memstore.New(memstore.Config{Clock: clock.Load, Shards: 16, MaxKeys: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig("eu", "eu-1", regions...)
	cfg.Interval = time.Millisecond // short intervals on the virtual clock: many reports
	n, err := NewNode(cfg, mustPolicy(t, testPolicy), ms)
	if err != nil {
		t.Fatal(err)
	}
	const workers, perWorker = 64, 400
	type tally struct{ offered, cost, admitted, denied int64 }
	tallies := make([]tally, workers)
	var wg sync.WaitGroup
	n.Tick(clock.Load())
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var d Decision
			tl := &tallies[w]
			for i := range perWorker {
				ten := fmt.Sprintf("t%d", (w+i)%7)
				r := req(int64(1+i%3), tenant(ten), tenant(ten, Entry{"route", "/search"}))
				now := clock.Add(50)
				if err := n.Decide(context.Background(), now, r, &d); err != nil {
					t.Error(err)
					return
				}
				for range d.Matches {
					tl.offered++
					tl.cost += r.Cost
					if d.Allowed {
						tl.admitted += r.Cost
					} else {
						tl.denied += r.Cost
					}
				}
			}
		}()
	}
	var reports []*rebalance.Report
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	epoch := uint64(1)
	keys := []string{}
	for i := range 7 {
		keys = append(keys, KeyName("api", []Entry{{"tenant", fmt.Sprintf("t%d", i)}}))
	}
loop:
	for {
		select {
		case <-done:
			break loop
		default:
		}
		now := clock.Load()
		share := uint32(200_000 + epoch%5*100_000)
		tb := table(1, epoch, now, now, epoch, share)
		for _, k := range keys {
			tb.Keys = append(tb.Keys, rebalance.KeyShares{Key: k, Budget: gcra.PerHour(100, 10),
				Shares: []uint32{share, rebalance.PPM - share}, Version: epoch})
		}
		if err := n.Apply(tb, now); err != nil {
			t.Fatal(err)
		}
		epoch++
		if rep := n.Tick(clock.Add(1000)); rep != nil {
			reports = append(reports, rep)
		}
	}
	if rep := n.Tick(clock.Add(10_000_000)); rep != nil {
		reports = append(reports, rep)
	}
	var want, got tally
	for _, tl := range tallies {
		want.offered += tl.offered
		want.cost += tl.cost
		want.admitted += tl.admitted
		want.denied += tl.denied
	}
	for _, rep := range reports {
		for _, k := range rep.Keys {
			got.offered += k.Offered
			got.cost += k.OfferedCost
			got.admitted += k.Admitted
			got.denied += k.Denied
		}
	}
	if got != want {
		t.Errorf("reports sum to %+v, deciders saw %+v", got, want)
	}
	if len(reports) < 3 || epoch < 3 {
		t.Errorf("only %d reports and %d tables during the run", len(reports), epoch)
	}
}
