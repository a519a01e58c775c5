package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func runCmd(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestGCRATraceSeed(t *testing.T) {
	code, out, errs := runCmd(t, "gcra", "--limit", "5/s", "--burst", "3", "--arrivals", "0,0,0,0,250ms,250ms")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var verdicts, retries []string
	for _, line := range strings.Split(out, "\n")[2:] {
		f := strings.Fields(line)
		if len(f) == 7 {
			verdicts = append(verdicts, f[1])
			retries = append(retries, f[3])
		}
	}
	want := "allow allow allow deny allow deny"
	if got := strings.Join(verdicts, " "); got != want {
		t.Errorf("verdicts %q, want %q\n%s", got, want, out)
	}
	if retries[3] != "200ms" || retries[5] != "150ms" {
		t.Errorf("retry-after %v, want 200ms and 150ms\n%s", retries, out)
	}
	if !strings.Contains(out, "admitted 4 of 6") {
		t.Errorf("summary missing:\n%s", out)
	}
}

func TestGCRASaturationSeed000(t *testing.T) {
	// Seed 000: 10/s "burst 5" (Burst 6 here): 36 admitted in 3 s of
	// saturation, 7 within the first 100 ms.
	for _, tt := range []struct{ dur, want string }{{"3s", "admitted 36 of"}, {"100ms", "admitted 7 of"}} {
		code, out, errs := runCmd(t, "gcra", "--limit", "10/s", "--burst", "6", "--every", "1ms", "--for", tt.dur, "--quiet")
		if code != 0 || !strings.Contains(out, tt.want) {
			t.Errorf("--for %s: exit %d, output %q (stderr %q), want %q", tt.dur, code, out, errs, tt.want)
		}
	}
}

func TestGCRABadInput(t *testing.T) {
	tests := []struct {
		args    []string
		wantErr string
	}{
		{[]string{"--burst", "3", "--arrivals", "0"}, "--limit (or --interval) is required"},
		{[]string{"--limit", "5/s", "--arrivals", "0"}, "--burst 0: must be at least 1"},
		{[]string{"--limit", "5/fortnight", "--burst", "1", "--arrivals", "0"}, `period "fortnight"`},
		{[]string{"--limit", "600000/s", "--burst", "1", "--arrivals", "0"}, "more than 1% below the rate"},
		{[]string{"--limit", "5/s", "--burst", "1", "--arrivals", "1s,0"}, "before the previous arrival"},
		{[]string{"--limit", "5/s", "--burst", "1", "--arrivals", "soon"}, `item 1 "soon"`},
		{[]string{"--limit", "5/s", "--burst", "1", "--every", "1ns", "--for", "1h"}, "more than 10000000"},
		{[]string{"--limit", "5/s", "--burst", "1", "--arrivals", "0", "--cost", "-1"}, "--cost -1"},
	}
	for _, tt := range tests {
		code, _, errs := runCmd(t, append([]string{"gcra"}, tt.args...)...)
		if code == 0 || !strings.Contains(errs, tt.wantErr) {
			t.Errorf("gcra %v: exit %d, stderr %q, want it to mention %q", tt.args, code, errs, tt.wantErr)
		}
	}
}

func TestHelp(t *testing.T) {
	code, out, _ := runCmd(t, "--help")
	if code != 0 {
		t.Fatalf("--help exit %d", code)
	}
	for _, c := range commands {
		if !strings.Contains(out, "  "+c.name+" ") {
			t.Errorf("--help does not list %s:\n%s", c.name, out)
		}
		code, sub, _ := runCmd(t, c.name, "--help")
		if code != 0 || !strings.Contains(sub, "Usage: meridian "+c.name) {
			t.Errorf("%s --help: exit %d, output %q", c.name, code, sub)
		}
	}
	if code, _, errs := runCmd(t, "nope"); code != 2 || !strings.Contains(errs, `unknown command "nope"`) {
		t.Errorf("unknown command: exit %d, stderr %q", code, errs)
	}
}

func TestGCRAReviewedInputs(t *testing.T) {
	// A negative maxWait is an error, not a silent switch to plain decide.
	if code, _, errs := runCmd(t, "gcra", "--limit", "5/s", "--burst", "1", "--arrivals", "0", "--reserve", "-5s"); code == 0 || !strings.Contains(errs, "--reserve -5s") {
		t.Errorf("--reserve -5s: exit %d, stderr %q", code, errs)
	}
	// Offsets that would overflow, or lie beyond what the core can time,
	// are refused up front, not looped over.
	for _, args := range [][]string{
		{"--every", "2000000h", "--for", "2562047h47m16.854775807s"},
		{"--every", "1h", "--for", "2562047h"},
	} {
		code, _, errs := runCmd(t, append([]string{"gcra", "--limit", "5/s", "--burst", "1", "--quiet"}, args...)...)
		if code == 0 || !strings.Contains(errs, "142 years") {
			t.Errorf("%v: exit %d, stderr %q", args, code, errs)
		}
	}
}
