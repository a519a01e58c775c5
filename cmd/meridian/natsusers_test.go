package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meridian-quota/meridian/internal/natstest"
)

// TestClusterPerAgentNATSUsers runs a cluster on a nats-server configured
// with the users `meridian keys --nats-dir` writes, included the way its
// nats-users.conf says: the cluster works under them (the candidate is
// elected, a non-candidate's reports move a budget to it, every agent
// reads tables), and the server itself refuses what an agent's user must
// not do — publish a report or an acknowledgement on another agent's
// subject, write the table bucket without being a candidate, read other
// agents' reports. Fails on 07d4fdf: `meridian keys` made no NATS users
// (deploy/ gave every non-candidate agent one shared user, allowed to
// publish any agent's reports).
func TestClusterPerAgentNATSUsers(t *testing.T) {
	name := fmt.Sprintf("t%d", time.Now().UnixNano()%1e9)
	bucket := "meridian-" + name
	dir := t.TempDir()
	agents := []string{"eu/eu-1", "us/us-1", "ap/ap-1"}
	args := []string{"--nats-dir", dir, "--cluster", name, "--bucket", bucket,
		"--agents", strings.Join(agents, ","), "--candidates", "eu/eu-1",
		// The embedded server checks a hash per connection; at the
		// default cost that takes seconds under -race on a busy machine,
		// past nats-server's 2 s authorization timeout.
		"--bcrypt-cost", "4"}
	if err := runKeys(context.Background(), args, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "server.conf")
	if err := os.WriteFile(conf, []byte("include nats-users.conf\naccounts {\n  MERIDIAN {\n    jetstream: enabled\n    users: $MERIDIAN_USERS\n  }\n}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := newTClusterOn(t, name, natstest.WithConfigFile(conf))
	c.natsUser = map[string][2]string{}
	for _, a := range agents {
		r, ag, _ := strings.Cut(a, "/")
		user := r + "." + ag
		c.natsUser[r] = [2]string{user, filepath.Join(dir, "nats-"+user+".password")}
	}
	c.candidates = map[string]bool{"eu": true}
	for _, r := range []string{"eu", "us", "ap"} { // eu creates the bucket: the others may not
		c.start(r)
	}
	if lead := c.leader(10*time.Second, ""); lead.name != "eu" {
		t.Fatalf("coordinator %s: only eu is a candidate", lead.name)
	}
	c.hold("us", "acme").end() // us-1's reports reach the coordinator and its tables reach us-1

	// us-1's own credentials, used as a hostile agent would.
	pass, err := os.ReadFile(c.natsUser["us"][1])
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 16)
	nc, err := nats.Connect(c.nats.URL(), nats.UserInfo("us.us-1", strings.TrimSpace(string(pass))),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	refused := func(what string, do func() error) {
		t.Helper()
		if err := do(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		_ = nc.FlushTimeout(5 * time.Second)
		select {
		case err := <-errs:
			if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				t.Fatalf("%s: %v, want a permissions violation", what, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the server accepted it", what)
		}
	}
	pre := "meridian." + name + "."
	refused("a report on ap-1's subject", func() error { return nc.Publish(pre+"report.ap.ap-1", []byte("x")) })
	refused("an ack on eu-1's subject", func() error { return nc.Publish(pre+"ack.eu.eu-1", []byte("x")) })
	refused("a write of the table head", func() error { return nc.Publish("$KV."+bucket+"."+name+".table.head", []byte("x")) })
	refused("a purge of the bucket", func() error { return nc.Publish("$JS.API.STREAM.PURGE.KV_"+bucket, nil) })
	refused("a subscription to every report", func() error {
		_, err := nc.Subscribe(pre+"report.*.*", func(*nats.Msg) {})
		return err
	})
	// What us-1 may do is not refused.
	if err := nc.Publish(pre+"report.us.us-1", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errs:
		t.Fatalf("a report on us-1's own subject: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	c.log.check(t)
}
