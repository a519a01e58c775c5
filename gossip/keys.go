package gossip

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strings"
)

// Coordinator keys are Ed25519, written as standard base64: a signing key
// as its 32-byte seed (or the 64-byte private key), a verify key as its
// 32-byte public key. Files hold one key per line (# comments); an
// environment variable holds them comma-separated. Errors name the file or
// variable and the line, never the key.

// LoadSignKey reads a coordinator's signing key from file or env (exactly
// one of them set).
func LoadSignKey(file, env string) (ed25519.PrivateKey, error) {
	vals, where, err := readKeys(file, env)
	if err != nil {
		return nil, err
	}
	if len(vals) != 1 {
		return nil, fmt.Errorf("gossip: signing key %s: %d keys, want exactly one", where, len(vals))
	}
	b, err := base64.StdEncoding.DecodeString(vals[0])
	if err != nil {
		return nil, fmt.Errorf("gossip: signing key %s: not standard base64", where)
	}
	switch len(b) {
	case ed25519.SeedSize:
		return ed25519.NewKeyFromSeed(b), nil
	case ed25519.PrivateKeySize:
		k := ed25519.PrivateKey(b)
		// The last 32 bytes must be the seed's public key.
		if !ed25519.NewKeyFromSeed(k.Seed()).Equal(k) {
			return nil, fmt.Errorf("gossip: signing key %s: the public half does not match the seed", where)
		}
		return k, nil
	}
	return nil, fmt.Errorf("gossip: signing key %s: %d bytes, want a %d-byte seed or a %d-byte private key", where, len(b), ed25519.SeedSize, ed25519.PrivateKeySize)
}

// LoadVerifyKeys reads the coordinator public keys whose tables are
// applied, from file and/or env; at least one is required.
func LoadVerifyKeys(file, env string) ([]ed25519.PublicKey, error) {
	var out []ed25519.PublicKey
	for _, src := range []struct{ file, env string }{{file, ""}, {"", env}} {
		if src.file == "" && src.env == "" {
			continue
		}
		vals, where, err := readKeys(src.file, src.env)
		if err != nil {
			return nil, err
		}
		for i, v := range vals {
			b, err := base64.StdEncoding.DecodeString(v)
			if err != nil || len(b) != ed25519.PublicKeySize {
				return nil, fmt.Errorf("gossip: verify key %d of %s: want %d bytes of standard base64", i+1, where, ed25519.PublicKeySize)
			}
			out = append(out, ed25519.PublicKey(b))
		}
	}
	if len(out) == 0 {
		return nil, errors.New("gossip: no coordinator verify keys: every table would be refused")
	}
	return out, nil
}

func readKeys(file, env string) (vals []string, where string, err error) {
	switch {
	case file != "" && env != "":
		return nil, "", fmt.Errorf("gossip: key in file %s and in $%s: set one", file, env)
	case file != "":
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, "", fmt.Errorf("gossip: key file: %w", err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
				vals = append(vals, line)
			}
		}
		where = "file " + file
	case env != "":
		v, ok := os.LookupEnv(env)
		if !ok {
			return nil, "", fmt.Errorf("gossip: key variable $%s is not set", env)
		}
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				vals = append(vals, p)
			}
		}
		where = "$" + env
	default:
		return nil, "", errors.New("gossip: no key file or variable named")
	}
	if len(vals) == 0 {
		return nil, "", fmt.Errorf("gossip: %s holds no key", where)
	}
	return vals, where, nil
}

// EncodeKey writes a key as these loaders read it.
func EncodeKey(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
