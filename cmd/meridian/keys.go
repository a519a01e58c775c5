package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/crypto/bcrypt"

	"github.com/meridian-quota/meridian/gossip"
)

const keysSynopsis = `
Make a cluster's secrets and print them, one per line, for files the agents'
config names (cluster.coordinator.sign_key_file, verify_keys_file and
cluster.members.key_file) or their environment variables:

  coordinator-sign-key  <base64>   the Ed25519 seed coordinators sign tables with (candidates only)
  coordinator-verify-key <base64>  its public key, which every agent verifies tables with
  gossip-key            <base64>   a 32-byte memberlist keyring key (AES-256)

With --nats-dir it also makes one NATS user per agent, so that no agent can
publish a report or an acknowledgement as another (nor write the table
bucket unless it is a candidate). It writes into that directory, refusing
to overwrite a file:

  nats-<region>.<agent>.password   the agent's password (cluster.nats.password_file; user <region>.<agent>)
  nats-users.conf                  for nats-server: MERIDIAN_USERS, the users with bcrypt
                                   password hashes and each one's permissions, to include
                                   and name in an account: users: $MERIDIAN_USERS

  meridian keys
  meridian keys --nats-dir secrets --cluster meridian --agents eu/eu-1,eu/eu-2,us/us-1 --candidates eu/eu-1,eu/eu-2`

// natsBcryptCost is the cost `nats server passwd` uses.
const natsBcryptCost = 11

func runKeys(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("keys", keysSynopsis, stdout, stderr)
	natsDir := fs.String("nats-dir", "", "write per-agent NATS passwords and nats-users.conf here")
	agents := fs.String("agents", "", "with --nats-dir: every agent, as region/agent, comma-separated")
	candidates := fs.String("candidates", "", "with --nats-dir: the coordinator candidates among --agents")
	cluster := fs.String("cluster", "", "with --nats-dir: the agents' cluster.name (required)")
	bucket := fs.String("bucket", gossip.DefaultNATSConfig().Bucket, "with --nats-dir: the agents' cluster.nats.bucket")
	cost := fs.Int("bcrypt-cost", natsBcryptCost, "with --nats-dir: the password hashes' bcrypt cost (nats-server checks one per connection: about 0.1 s at 11)")
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	if *cost < bcrypt.MinCost || *cost > bcrypt.MaxCost {
		return fmt.Errorf("meridian keys: --bcrypt-cost %d: want %d to %d", *cost, bcrypt.MinCost, bcrypt.MaxCost)
	}
	var users []natsUser
	if *natsDir != "" {
		var err error
		if users, err = natsUsers(*agents, *candidates, *cluster, *bucket); err != nil {
			return fmt.Errorf("meridian keys: %w", err)
		}
	} else if *agents != "" || *candidates != "" {
		return errors.New("meridian keys: --agents and --candidates need --nats-dir")
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	gk := make([]byte, 32)
	if _, err := rand.Read(gk); err != nil {
		return err
	}
	if *natsDir != "" {
		if err := writeNATSUsers(*natsDir, users, *cost, stderr); err != nil {
			return fmt.Errorf("meridian keys: %w", err)
		}
	}
	fmt.Fprintln(stdout, "coordinator-sign-key", gossip.EncodeKey(priv.Seed()))
	fmt.Fprintln(stdout, "coordinator-verify-key", gossip.EncodeKey(pub))
	fmt.Fprintln(stdout, "gossip-key", gossip.EncodeKey(gk))
	return nil
}

type natsUser struct {
	region, agent string
	perm          gossip.Permissions
}

// natsUsers parses --agents and --candidates.
func natsUsers(agents, candidates, cluster, bucket string) ([]natsUser, error) {
	split := func(flag, s string) ([][2]string, error) {
		var out [][2]string
		seen := map[[2]string]bool{}
		for _, f := range strings.Split(s, ",") {
			f = strings.TrimSpace(f)
			if f == "" {
				continue
			}
			r, a, ok := strings.Cut(f, "/")
			if !ok {
				return nil, fmt.Errorf("--%s: %q: want region/agent", flag, f)
			}
			k := [2]string{r, a}
			if seen[k] {
				return nil, fmt.Errorf("--%s: %s listed twice", flag, f)
			}
			seen[k] = true
			out = append(out, k)
		}
		return out, nil
	}
	if cluster == "" {
		return nil, errors.New("--nats-dir needs --cluster: the agents' cluster.name, which their subjects carry")
	}
	all, err := split("agents", agents)
	if err != nil {
		return nil, err
	}
	if len(all) == 0 {
		return nil, errors.New("--nats-dir needs --agents: the agents to make NATS users for")
	}
	cand, err := split("candidates", candidates)
	if err != nil {
		return nil, err
	}
	for _, c := range cand {
		if !slices.Contains(all, c) {
			return nil, fmt.Errorf("--candidates: %s/%s is not in --agents", c[0], c[1])
		}
	}
	users := make([]natsUser, 0, len(all))
	for _, a := range all {
		p, err := gossip.AgentPermissions(cluster, bucket, a[0], a[1], slices.Contains(cand, a))
		if err != nil {
			return nil, fmt.Errorf("--agents: %s/%s: %w", a[0], a[1], err)
		}
		users = append(users, natsUser{region: a[0], agent: a[1], perm: p})
	}
	return users, nil
}

// writeNATSUsers writes each user's password file and nats-users.conf
// into dir, creating each file exclusively: a second run must not replace
// the passwords running agents use. On an error it removes what it wrote.
func writeNATSUsers(dir string, users []natsUser, cost int, stderr io.Writer) (err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	var written []string
	defer func() {
		if err != nil {
			for _, p := range written {
				_ = os.Remove(p)
			}
		}
	}()
	create := func(name string, data []byte) error {
		p := filepath.Join(dir, name)
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			if errors.Is(err, os.ErrExist) {
				return fmt.Errorf("%s exists: remove it to make new NATS users (agents using it would be locked out)", p)
			}
			return err
		}
		written = append(written, p)
		if _, err := f.Write(data); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	var conf strings.Builder
	conf.WriteString("# NATS users of Meridian's agents, made by `meridian keys`: one per agent,\n")
	conf.WriteString("# each allowed to publish only its own reports and acks, read the table\n")
	conf.WriteString("# bucket and, for coordinator candidates, write it. Include this file and\n")
	conf.WriteString("# name the users in the agents' account:  users: $MERIDIAN_USERS\n")
	conf.WriteString("MERIDIAN_USERS: [\n")
	for _, u := range users {
		pw := make([]byte, 24)
		if _, err := rand.Read(pw); err != nil {
			return err
		}
		pass := base64.RawURLEncoding.EncodeToString(pw)
		hash, err := bcrypt.GenerateFromPassword([]byte(pass), cost)
		if err != nil {
			return err
		}
		name := gossip.NATSUser(u.region, u.agent)
		if err := create("nats-"+name+".password", []byte(pass+"\n")); err != nil {
			return err
		}
		fmt.Fprintf(&conf, "  {\n    user: %s\n    password: %s\n    permissions: {\n", strconv.Quote(name), strconv.Quote(string(hash)))
		fmt.Fprintf(&conf, "      publish: {allow: %s}\n", confList(u.perm.Publish))
		fmt.Fprintf(&conf, "      subscribe: {allow: %s}\n    }\n  }\n", confList(u.perm.Subscribe))
	}
	conf.WriteString("]\n")
	if err := create("nats-users.conf", []byte(conf.String())); err != nil {
		return err
	}
	for _, p := range written {
		fmt.Fprintln(stderr, "wrote", p)
	}
	return nil
}

func confList(subjects []string) string {
	q := make([]string, len(subjects))
	for i, s := range subjects {
		q[i] = strconv.Quote(s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}
