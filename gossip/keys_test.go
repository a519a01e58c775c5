package gossip

import (
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadKeys(t *testing.T) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	seed := EncodeKey(priv.Seed())
	for _, tt := range []struct {
		name, file, env, envVal string
		wantErr                 string // "" for success
	}{
		{name: "seed in a file", file: file("seed", "# the key\n"+seed+"\n")},
		{name: "private key in a file", file: file("priv", EncodeKey(priv)+"\n")},
		{name: "seed in env", env: "MERIDIAN_TEST_SIGN", envVal: seed},
		{name: "both", file: file("both", seed), env: "MERIDIAN_TEST_SIGN", envVal: seed, wantErr: "set one"},
		{name: "two keys", file: file("two", seed+"\n"+seed+"\n"), wantErr: "2 keys, want exactly one"},
		{name: "not base64", file: file("bad", "%%%\n"), wantErr: "not standard base64"},
		{name: "wrong size", file: file("short", EncodeKey([]byte("short"))), wantErr: "5 bytes"},
		{name: "empty file", file: file("empty", "\n# nothing\n"), wantErr: "holds no key"},
		{name: "unset env", env: "MERIDIAN_TEST_UNSET_KEY", wantErr: "is not set"},
		{name: "missing file", file: filepath.Join(dir, "nope"), wantErr: "no such file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.envVal != "" {
				t.Setenv(tt.env, tt.envVal)
			}
			k, err := LoadSignKey(tt.file, tt.env)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), seed) {
					t.Fatal("the error quotes the key")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !k.Equal(priv) {
				t.Fatal("loaded another key")
			}
		})
	}
	t.Setenv("MERIDIAN_TEST_VERIFY", EncodeKey(pub)+", "+EncodeKey(pub))
	keys, err := LoadVerifyKeys(file("verify", EncodeKey(pub)+"\n"), "MERIDIAN_TEST_VERIFY")
	if err != nil || len(keys) != 3 || !keys[0].Equal(pub) {
		t.Fatalf("LoadVerifyKeys = %d keys, %v", len(keys), err)
	}
	if _, err := LoadVerifyKeys(file("badverify", seed+"x\n"), ""); err == nil || !strings.Contains(err.Error(), "verify key 1 of file") {
		t.Fatalf("bad verify key: err = %v", err)
	}
	if _, err := LoadVerifyKeys("", ""); err == nil {
		t.Fatal("no verify keys accepted")
	}
}

func TestLoopConfigValidate(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	pub2, _, _ := ed25519.GenerateKey(rand.Reader)
	c := DefaultLoopConfig("prod", "eu", "eu-1", "eu", "us")
	c.Candidate, c.SignKey, c.VerifyKeys = true, priv, []ed25519.PublicKey{pub2}
	c.TickEvery = 0
	c.Region = "mars"
	err := c.Validate()
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{`region "mars" is not one of`, "signing key's public key is not among the verify keys", "tick 0s"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	ok := DefaultLoopConfig("prod", "eu", "eu-1", "eu", "us")
	ok.VerifyKeys = []ed25519.PublicKey{pub2}
	if err := ok.Validate(); err != nil {
		t.Errorf("a valid config: %v", err)
	}
}
