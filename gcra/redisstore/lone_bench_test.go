package redisstore

import (
	"context"
	"strconv"
	"testing"

	"github.com/meridian-quota/meridian/gcra"
)

// BenchmarkLoneCaller shows that batching costs a lone caller nothing: one
// goroutine deciding through the Store, against the same script with the
// same arguments run by a plain EVALSHA (script.Run) with no lanes, pooling
// or batching in between.
//
//	go test -run '^$' -bench BenchmarkLoneCaller -benchmem ./gcra/redisstore/
func BenchmarkLoneCaller(b *testing.B) {
	s, _ := newTestStore(b)
	ctx := context.Background()
	sch := gcra.Steady(gcra.PerSecond(1000, 100))
	key := func(i int) gcra.Key { return gcra.Key{Tag: strconv.Itoa(i % 10_000), Name: "b"} }
	b.Run("path=store", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, err := s.Decide(ctx, key(i), sch, 1); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("path=evalsha", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			k := s.RedisKey(key(i))
			batch := appendSchedule(appendInt(appendInt(nil, 1), 1), &sch, false)
			batch = appendInt(batch, opWord(opDecide, 1, 1))
			v, err := script.Run(ctx, s.c, []string{k}, "", batch).Result()
			if err != nil {
				b.Fatal(err)
			}
			if _, err := replyInts(v, 4, nil); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}
