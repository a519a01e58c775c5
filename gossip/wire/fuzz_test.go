package wire_test

import (
	"crypto/ed25519"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/meridian-quota/meridian/gossip/wire"
)

// fuzzBase is the base the fuzzed delta heads are patched onto.
var fuzzBase = testTable(20, 10, "ap", "eu", "us")

// FuzzDecode: Decode never panics, every error wraps ErrInvalid, and what
// it accepts re-encodes to messages that decode to the same value. Each
// input is also tried as the unsigned prefix of a table, signed here with
// the trusted key, so that table bodies are explored past the signature.
//
//	go test -fuzz=FuzzDecode ./gossip/wire/
func FuzzDecode(f *testing.F) {
	reps, _ := wire.EncodeReport(cluster, testReport(30, 12), 99, wire.MinMessage)
	for _, b := range reps {
		f.Add(b)
	}
	ack, _ := wire.EncodeAck(cluster, wire.Ack{Region: "eu", Agent: "a1", Term: 2, Epoch: 9, Sent: -3})
	f.Add(ack)
	tabs, _ := wire.EncodeTable(cluster, testTable(20, 10, "ap", "eu", "us"), testKey, wire.MinMessage)
	for _, b := range tabs {
		f.Add(b)
		f.Add(b[:len(b)-2-ed25519.SignatureSize])
	}
	// A delta table from fuzzBase: its head, signed and unsigned.
	next := *fuzzBase
	next.Epoch++
	next.Keys = slices.Clone(fuzzBase.Keys[2:])
	next.Keys[3].Shares = []uint32{0, 500_000, 500_000}
	deltas, _ := wire.EncodeTableFrom(cluster, &next, fuzzBase, testKey, wire.MinMessage)
	f.Add(deltas[0])
	f.Add(deltas[0][:len(deltas[0])-2-ed25519.SignatureSize])
	// An in-base head on fuzzBase, stored as a base in 3 messages.
	if inBase, ok, _ := wire.EncodeTableOn(cluster, &next, fuzzBase, 3, testKey, wire.MinMessage, wire.FeatureInBase); ok {
		f.Add(inBase)
	}
	// The same with its changed row as a row patch.
	if inBase, ok, _ := wire.EncodeTableOn(cluster, &next, fuzzBase, 3, testKey, wire.MinMessage, wire.Features); ok {
		f.Add(inBase)
	}
	lim := wire.DefaultLimits()
	f.Fuzz(func(t *testing.T, b []byte) {
		checkDecode(t, b, lim)
		if len(b) < 1<<16 {
			signed := pb(append([]byte(nil), b...))
			checkDecode(t, signed.m(5, ed25519.Sign(testKey, b)), lim)
		}
	})
}

func checkDecode(t *testing.T, b []byte, lim wire.Limits) {
	m, err := wire.Decode(cluster, b, lim, trusted)
	if err != nil {
		if !errors.Is(err, wire.ErrInvalid) {
			t.Fatalf("%v does not wrap ErrInvalid", err)
		}
		return
	}
	a := wire.NewAssembler(lim, 2)
	switch m.Kind {
	case wire.KindReport:
		c := m.Report
		if _, _, err := a.AddReport(c); err != nil {
			t.Fatalf("Assembler refuses a decoded chunk: %v", err)
		}
		msgs, err := wire.EncodeReport(cluster, &c.Report, c.Sent, lim.MaxMessage)
		if err != nil {
			t.Fatalf("re-encode %+v: %v", c.Report, err)
		}
		got, _ := decodeAll(t, msgs, lim)
		if !equalReports(got, &c.Report) {
			t.Fatalf("re-encoded report differs:\n got %+v\nwant %+v", got, c.Report)
		}
	case wire.KindAck:
		enc, err := wire.EncodeAck(cluster, *m.Ack)
		if err != nil {
			t.Fatal(err)
		}
		m2, err := wire.Decode(cluster, enc, lim, nil)
		if err != nil || *m2.Ack != *m.Ack {
			t.Fatalf("re-encoded ack: %+v, %v; want %+v", m2.Ack, err, m.Ack)
		}
	case wire.KindTable:
		c := m.Table
		switch {
		case c.Delta != nil && c.Delta.InBase:
			if _, _, err := a.AddTable(c); !errors.Is(err, wire.ErrInvalid) {
				t.Fatalf("Assembler takes an in-base head: %v", err)
			}
		case c.Count == 1:
			if _, done, err := a.AddTable(c); err != nil || !done {
				t.Fatalf("Assembler refuses a decoded one-chunk table: %v", err)
			}
		default:
			if _, _, err := a.AddTable(c); err != nil {
				t.Fatalf("Assembler refuses a decoded chunk: %v", err)
			}
		}
		if c.Header == nil {
			return
		}
		if c.Delta != nil {
			// Patch onto a base: a table Decode would accept, or an error.
			p, err := wire.Patch(fuzzBase, c, lim)
			switch {
			case err != nil && !errors.Is(err, wire.ErrInvalid):
				t.Fatalf("Patch: %v does not wrap ErrInvalid", err)
			case err == nil:
				_, err := wire.EncodeTable(cluster, p, testKey, lim.MaxMessage)
				if err != nil && !strings.Contains(err.Error(), "fit") {
					t.Fatalf("a patched table does not encode: %v", err)
				}
			}
		}
		tb := *c.Header
		tb.Keys = c.Keys
		msgs, err := wire.EncodeTable(cluster, &tb, testKey, lim.MaxMessage)
		if err != nil {
			if strings.Contains(err.Error(), "fit") {
				return
			}
			t.Fatalf("re-encode: %v", err)
		}
		_, got := decodeAll(t, msgs, lim)
		want := tb
		if len(want.Keys) == 0 {
			want.Keys = nil
		}
		equalTables(t, got, &want)
	default:
		t.Fatalf("kind %v", m.Kind)
	}
}
