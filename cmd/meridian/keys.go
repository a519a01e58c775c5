package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"io"

	"github.com/meridian-quota/meridian/gossip"
)

const keysSynopsis = `
Make a cluster's secrets and print them, one per line, for files the agents'
config names (cluster.coordinator.sign_key_file, verify_keys_file and
cluster.members.key_file) or their environment variables:

  coordinator-sign-key  <base64>   the Ed25519 seed coordinators sign tables with (candidates only)
  coordinator-verify-key <base64>  its public key, which every agent verifies tables with
  gossip-key            <base64>   a 32-byte memberlist keyring key (AES-256)

  meridian keys`

func runKeys(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("keys", keysSynopsis, stdout, stderr)
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	gk := make([]byte, 32)
	if _, err := rand.Read(gk); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "coordinator-sign-key", gossip.EncodeKey(priv.Seed()))
	fmt.Fprintln(stdout, "coordinator-verify-key", gossip.EncodeKey(pub))
	fmt.Fprintln(stdout, "gossip-key", gossip.EncodeKey(gk))
	return nil
}
