package main

import (
	"bytes"
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/gossip"
	"github.com/meridian-quota/meridian/internal/testenv"
	"github.com/meridian-quota/meridian/sim"
)

// TestDemo runs `meridian demo` shortened — embedded NATS, three regions
// on in-memory stores, memberlist on loopback, no outside service — with
// the coordinator killed part-way: the run completes, a successor takes
// over under a new term, and the summary scores the live cluster beside
// the simulator.
func TestDemo(t *testing.T) {
	testenv.SkipShort(t, "runs a cluster for 10 s")
	var out, errb bytes.Buffer
	err := runDemo(context.Background(), []string{"--duration", "10s", "--interval", "1s", "--lease", "4s",
		"--rate", "400", "--keys", "8", "--view", "plain", "--kill", "coordinator@3s"}, &out, &errb)
	if err != nil {
		t.Fatalf("demo: %v\n%s\n%s", err, out.String(), errb.String())
	}
	s := out.String()
	for _, want := range []string{"killed", "(the coordinator)", "Scored against the oracle", "sim predicts",
		"OA_budget", "control bytes per key·region·s"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	terms := map[string]bool{}
	for _, m := range regexp.MustCompile(`coordinator \S+ \(term (\d+)\)`).FindAllStringSubmatch(s, -1) {
		terms[m[1]] = true
	}
	if !terms["1"] || len(terms) < 2 {
		t.Errorf("want term 1 and a successor's term in the live view, saw terms %v:\n%s", terms, s)
	}
	if regexp.MustCompile(`(?m)^  \S+\s+up\s+0/0 `).MatchString(s[strings.Index(s, "t=  3s"):]) {
		t.Errorf("a live region still had no table 3 s in:\n%s", s)
	}
}

func TestDemoFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--kill", "coordinator"},
		{"--kill", "region:mars@5s"},
		{"--kill", "coordinator@2m"},
		{"--duration", "1s"},
		{"--interval", "50ms"},
		{"--lease", "1s"},
		{"--view", "fancy"},
		{"--rate", "0"},
	} {
		var out, errb bytes.Buffer
		if err := runDemo(context.Background(), args, &out, &errb); !errors.Is(err, errUsage) || errb.Len() == 0 {
			t.Errorf("demo %v: err = %v, stderr %q; want a usage error explained on stderr", args, err, errb.String())
		}
	}
}

// TestSimElectsAsProduction: the simulator times its coordinator election
// as production's default does (sim cannot import gossip, so this test
// holds the two equal): the demo's prediction of a failover depends on it.
func TestSimElectsAsProduction(t *testing.T) {
	if got, want := sim.ElectionTTL, gossip.DefaultLoopConfig("c", "eu", "eu-1", "eu").Election.TTL; got != want {
		t.Errorf("sim.ElectionTTL %v, gossip.DefaultLoopConfig's Election.TTL %v: want equal", got, want)
	}
}

// TestDemoScenarioFollowsTheLiveCoordinator: the prediction's first
// coordinator is the live one, and killing it loses its region in the
// simulator as the demo's kill loses the region's only agent.
func TestDemoScenarioFollowsTheLiveCoordinator(t *testing.T) {
	o := demoOpts{duration: time.Minute, interval: 2 * time.Second, lease: 10 * time.Second, strategy: "ewma", seed: 1, rate: 1200, keys: 20, kill: "coordinator@25s"}
	sc, err := demoScenario(o, "ap")
	if err != nil {
		t.Fatal(err)
	}
	if sc.Coordinator.Region != "ap" || len(sc.Coordinator.Failovers) != 0 {
		t.Errorf("coordinator %+v, want ap with no failover of the role alone", sc.Coordinator)
	}
	if rl := sc.Faults.RegionLoss; len(rl) != 1 || rl[0].Region != "ap" || rl[0].At.D() != 25*time.Second || rl[0].For.D() != 35*time.Second {
		t.Errorf("region loss %+v, want ap from 25s to the end", rl)
	}
}
