package main

import (
	"bytes"
	"context"
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
