package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meridian-quota/meridian/gossip"
)

// TestKeys: what `meridian keys` prints loads with the agent's own loaders,
// and the verify key is the signing key's.
func TestKeys(t *testing.T) {
	var out bytes.Buffer
	if err := runKeys(context.Background(), nil, &out, &out); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		name, val, ok := strings.Cut(line, " ")
		if !ok {
			t.Fatalf("line %q: want NAME VALUE", line)
		}
		files[name] = filepath.Join(dir, name)
		if err := os.WriteFile(files[name], []byte(val+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	sign, err := gossip.LoadSignKey(files["coordinator-sign-key"], "")
	if err != nil {
		t.Fatal(err)
	}
	verify, err := gossip.LoadVerifyKeys(files["coordinator-verify-key"], "")
	if err != nil {
		t.Fatal(err)
	}
	if len(verify) != 1 || !verify[0].Equal(sign.Public()) {
		t.Error("the verify key is not the signing key's public key")
	}
	mc := gossip.DefaultMemberConfig()
	mc.Bind, mc.KeyFile = "127.0.0.1:0", files["gossip-key"]
	if err := mc.Validate(); err != nil {
		t.Errorf("the gossip key does not load: %v", err)
	}
}

// TestKeysNATSUsersBadInput: every mistake in --nats-dir's flags is named,
// and nothing is written; a second run refuses to replace the passwords
// running agents use.
func TestKeysNATSUsersBadInput(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--agents", "eu/eu-1"}, "need --nats-dir"},
		{[]string{"--nats-dir", dir, "--agents", "eu/eu-1"}, "needs --cluster"},
		{[]string{"--nats-dir", dir, "--cluster", "c"}, "needs --agents"},
		{[]string{"--nats-dir", dir, "--cluster", "c", "--agents", "eu-1"}, `"eu-1": want region/agent`},
		{[]string{"--nats-dir", dir, "--cluster", "c", "--agents", "eu/eu-1,eu/eu-1"}, "eu/eu-1 listed twice"},
		{[]string{"--nats-dir", dir, "--cluster", "c", "--agents", "eu/eu-1", "--candidates", "us/us-1"}, "us/us-1 is not in --agents"},
		{[]string{"--nats-dir", dir, "--cluster", "c", "--agents", "eu/eu.1"}, "agent: \"eu.1\""},
		{[]string{"--nats-dir", dir, "--cluster", "c.d", "--agents", "eu/eu-1"}, "cluster: \"c.d\""},
		{[]string{"--nats-dir", dir, "--cluster", "c", "--agents", "eu/eu-1", "--bcrypt-cost", "3"}, "--bcrypt-cost 3: want 4 to 31"},
	} {
		var out bytes.Buffer
		err := runKeys(context.Background(), c.args, &out, &out)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error naming %q", c.args, err, c.want)
		}
		if out.Len() > 0 {
			t.Errorf("%v: printed %q on an error", c.args, out.String())
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) > 0 {
		t.Fatalf("bad flags wrote %d files", len(ents))
	}
	args := []string{"--nats-dir", dir, "--cluster", "c", "--agents", "eu/eu-1,us/us-1", "--bcrypt-cost", "4"}
	if err := runKeys(context.Background(), args, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(filepath.Join(dir, "nats-eu.eu-1.password"))
	if err != nil {
		t.Fatal(err)
	}
	if err := runKeys(context.Background(), args, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("second run: %v, want a refusal to overwrite", err)
	}
	after, _ := os.ReadFile(filepath.Join(dir, "nats-eu.eu-1.password"))
	if !bytes.Equal(before, after) {
		t.Error("the second run replaced eu-1's password")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 3 {
		t.Errorf("%d files after the refused run, want the first run's 3", len(ents))
	}
}
