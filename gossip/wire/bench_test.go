package wire_test

import (
	"testing"

	"github.com/meridian-quota/meridian/gossip/wire"
)

// The benchmarks report bytes/key: encoded bytes per key of the set.

func BenchmarkEncodeTable10k(b *testing.B) {
	tb := testTable(10_000, 40, "ap-south", "eu-west", "us-east")
	n, _ := wire.TableSize(cluster, tb, wire.DefaultMaxMessage)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := wire.EncodeTable(cluster, tb, testKey, wire.DefaultMaxMessage); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n)/10_000, "bytes/key")
}

func BenchmarkDecodeTable10k(b *testing.B) {
	tb := testTable(10_000, 40, "ap-south", "eu-west", "us-east")
	msgs, err := wire.EncodeTable(cluster, tb, testKey, wire.DefaultMaxMessage)
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	for _, m := range msgs {
		n += len(m)
	}
	lim := wire.DefaultLimits()
	b.ReportAllocs()
	for b.Loop() {
		a := wire.NewAssembler(lim, 1)
		for _, m := range msgs {
			msg, err := wire.Decode(cluster, m, lim, trusted)
			if err != nil {
				b.Fatal(err)
			}
			if _, _, err := a.AddTable(msg.Table); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(n)/10_000, "bytes/key")
}

func BenchmarkEncodeReport10k(b *testing.B) {
	r := testReport(10_000, 40)
	n, _ := wire.ReportSize(cluster, r, 1, wire.DefaultMaxMessage)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := wire.EncodeReport(cluster, r, 1, wire.DefaultMaxMessage); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n)/10_000, "bytes/key")
}

func BenchmarkDecodeReport10k(b *testing.B) {
	r := testReport(10_000, 40)
	msgs, err := wire.EncodeReport(cluster, r, 1, wire.DefaultMaxMessage)
	if err != nil {
		b.Fatal(err)
	}
	lim := wire.DefaultLimits()
	b.ReportAllocs()
	for b.Loop() {
		a := wire.NewAssembler(lim, 1)
		for _, m := range msgs {
			msg, err := wire.Decode(cluster, m, lim, nil)
			if err != nil {
				b.Fatal(err)
			}
			if _, _, err := a.AddReport(msg.Report); err != nil {
				b.Fatal(err)
			}
		}
	}
}

func BenchmarkTableSize10k(b *testing.B) {
	tb := testTable(10_000, 40, "ap-south", "eu-west", "us-east")
	b.ReportAllocs()
	for b.Loop() {
		wire.TableSize(cluster, tb, wire.DefaultMaxMessage)
	}
}

func BenchmarkReportSize10k(b *testing.B) {
	r := testReport(10_000, 40)
	b.ReportAllocs()
	for b.Loop() {
		wire.ReportSize(cluster, r, 1, wire.DefaultMaxMessage)
	}
}
