package gcra_test

import (
	"testing"

	"github.com/meridian-quota/meridian/gcra"
)

// Sinks keep the compiler from discarding the benchmarked calls.
var (
	sinkState  gcra.State
	sinkResult gcra.Result
	sinkWrite  bool
)

// BenchmarkDecide is the hot path of every store: one key, a steady limit.
// Goal: under 50 ns/op and 0 allocs/op.
func BenchmarkDecide(b *testing.B) {
	sch := gcra.Steady(gcra.PerSecond(1000, 100))
	st := gcra.State{TAT: 1, Exists: true}
	now := int64(1_700_000_000_000_000)
	b.ReportAllocs()
	for b.Loop() {
		now += 700 // a little under the rate: admits and denies both occur
		next, write, r, _ := gcra.Decide(st, now, &sch, 1)
		if write {
			st = next
		}
		sinkResult, sinkWrite = r, write
	}
	sinkState = st
}

// BenchmarkDecideChange decides a key whose state was written under the
// previous limit of a schedule, so every call converts it.
func BenchmarkDecideChange(b *testing.B) {
	const ta = int64(1_700_000_000_000_000)
	sch := gcra.Change(
		gcra.Version{Limit: gcra.PerSecond(1000, 100), Epoch: 41, Effective: ta - 3_600_000_000},
		gcra.Version{Limit: gcra.PerSecond(700, 70), Epoch: 42, Effective: ta})
	st := gcra.State{TAT: ta + 40_000, Epoch: gcra.EpochTag(41), Exists: true}
	now := ta + 1
	b.ReportAllocs()
	for b.Loop() {
		next, write, r, _ := gcra.Decide(st, now, &sch, 1) // st stays under the previous epoch
		sinkState, sinkResult, sinkWrite = next, r, write
	}
}

// BenchmarkDecideAll decides a per-tenant and a per-user limit together.
func BenchmarkDecideAll(b *testing.B) {
	checks := []gcra.Check{
		{Key: gcra.Key{Tag: "t42", Name: "all"}, Schedule: gcra.Steady(gcra.PerSecond(1000, 200)), Cost: 1},
		{Key: gcra.Key{Tag: "t42", Name: "user:7"}, Schedule: gcra.Steady(gcra.PerSecond(50, 20)), Cost: 1},
	}
	states := make([]gcra.State, 2)
	next := make([]gcra.State, 2)
	out := make([]gcra.Result, 2)
	now := int64(1_700_000_000_000_000)
	b.ReportAllocs()
	for b.Loop() {
		now += 15_000 // a little faster than the user limit
		r, write, _ := gcra.DecideAll(now, checks, states, next, out)
		if write {
			copy(states, next)
		}
		sinkResult, sinkWrite = r, write
	}
}
