package gossip

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/hashicorp/memberlist"
)

// Membership profiles: which of memberlist's default configurations
// MemberConfig.Profile starts from.
const (
	// ProfileWAN suits members spread across regions: memberlist's
	// DefaultWANConfig (5 s probes, 3 s probe timeout, slower suspicion).
	ProfileWAN = "wan"
	// ProfileLAN suits members on one network: memberlist's
	// DefaultLANConfig (1 s probes, 500 ms probe timeout).
	ProfileLAN = "lan"
	// ProfileLocal suits members on one host (tests, the demo):
	// memberlist's DefaultLocalConfig with faster probes and gossip.
	ProfileLocal = "local"
)

// Limits on Meta fields, in bytes. The node name (region "/" agent) rides
// in every gossip message about the node and the encoded Role and Version
// must fit memberlist.MetaMaxSize; these bounds keep both small.
const (
	maxMetaField = 128
)

// MemberConfig configures membership (StartMembers). DefaultMemberConfig
// documents each default. A MemberConfig holds no secret itself: KeyFile
// and KeyEnv name where the keys are, and neither errors nor logs ever
// contain key material.
type MemberConfig struct {
	// Profile is the memberlist configuration the timings start from:
	// ProfileWAN, ProfileLAN or ProfileLocal.
	Profile string `yaml:"profile"`
	// Bind is the IP:port gossip listens on, TCP and UDP; 0.0.0.0 binds
	// every interface and port 0 picks a free port (tests).
	Bind string `yaml:"bind"`
	// Advertise is the IP:port other members reach this one at (behind
	// NAT, a Kubernetes pod IP, a cross-region address). Empty: the bind
	// address, or a private address of this host when bound to 0.0.0.0.
	Advertise string `yaml:"advertise"`
	// Join lists seed members (host:port, names resolved at each try).
	// StartMembers joins them in the background, retrying with backoff
	// until at least one answers or its context ends; see RejoinInterval.
	Join []string `yaml:"join"`
	// KeyFile is the gossip keyring: one standard-base64 key per line (16,
	// 24 or 32 bytes: AES-128, -192 or -256), the first line the primary
	// key that encrypts; every listed key decrypts. Blank lines and lines
	// starting with # are ignored. Members.ReloadKeys re-reads it.
	KeyFile string `yaml:"key_file"`
	// KeyEnv names an environment variable holding the keys instead,
	// separated by commas or newlines, the first the primary.
	KeyEnv string `yaml:"key_env"`
	// AllowPlaintext permits running with neither KeyFile nor KeyEnv:
	// gossip unencrypted and unauthenticated (the demo, tests). Keys, when
	// given, are used regardless.
	AllowPlaintext bool `yaml:"allow_plaintext"`

	// Overrides of the profile's timings; zero keeps the profile's value.

	// ProbeInterval is the time between failure-detection probes.
	ProbeInterval time.Duration `yaml:"probe_interval"`
	// ProbeTimeout is how long a probe waits for an ack: about the
	// 99th-percentile RTT; below ProbeInterval.
	ProbeTimeout time.Duration `yaml:"probe_timeout"`
	// GossipInterval is the time between gossip rounds.
	GossipInterval time.Duration `yaml:"gossip_interval"`
	// PushPullInterval is the time between full state syncs with a random
	// member.
	PushPullInterval time.Duration `yaml:"push_pull_interval"`
	// SuspicionMult scales how long a suspect member has to refute before
	// it is declared dead (SuspicionMult · log10(N) · ProbeInterval).
	SuspicionMult int `yaml:"suspicion_mult"`
	// RejoinInterval is how often, once joined, a member re-joins the
	// seeds that are not live members: memberlist alone never heals a
	// partition whose sides have declared each other dead. Zero: the
	// profile's PushPullInterval; negative: never.
	RejoinInterval time.Duration `yaml:"rejoin_interval"`
}

// DefaultMemberConfig returns the production defaults. It does not
// validate as is: a key (KeyFile or KeyEnv) or AllowPlaintext is required,
// so that an unencrypted cluster is always somebody's explicit choice.
func DefaultMemberConfig() MemberConfig {
	return MemberConfig{
		Profile:   ProfileWAN,     // one cluster spans the regions: cross-region RTTs
		Bind:      "0.0.0.0:7946", // memberlist's customary port, every interface
		Advertise: "",             // the bound (or a private) address; set it behind NAT
		// Join: none — a cluster of one until seeds are given.
		// Timing overrides: none — the profile's values.
	}
}

// Validate reports every problem with c at once, each with its field
// (members.bind, members.key_file, …). It reads KeyFile or KeyEnv to check
// the keys; no error ever quotes a key.
func (c *MemberConfig) Validate() error {
	var errs []error
	bad := func(field, format string, a ...any) {
		errs = append(errs, fmt.Errorf("members.%s: %s", field, fmt.Sprintf(format, a...)))
	}
	var base *memberlist.Config
	switch c.Profile {
	case ProfileWAN, ProfileLAN, ProfileLocal:
		base = profileConfig(c.Profile)
	default:
		bad("profile", "%q: want %q, %q or %q", c.Profile, ProfileWAN, ProfileLAN, ProfileLocal)
		base = profileConfig(ProfileWAN)
	}
	if _, _, err := parseBind(c.Bind); err != nil {
		bad("bind", "%q: %v", c.Bind, err)
	}
	if c.Advertise != "" {
		if _, _, err := parseAdvertise(c.Advertise); err != nil {
			bad("advertise", "%q: %v", c.Advertise, err)
		}
	}
	for i, s := range c.Join {
		if err := checkSeed(s); err != nil {
			bad(fmt.Sprintf("join[%d]", i), "%q: %v", s, err)
		}
	}
	if _, err := c.loadKeys(); err != nil {
		errs = append(errs, err)
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{
		{"probe_interval", c.ProbeInterval},
		{"probe_timeout", c.ProbeTimeout},
		{"gossip_interval", c.GossipInterval},
		{"push_pull_interval", c.PushPullInterval},
	} {
		if d.v < 0 {
			bad(d.field, "%s: must not be negative (0 keeps the profile's)", d.v)
		}
	}
	if c.SuspicionMult < 0 {
		bad("suspicion_mult", "%d: must not be negative (0 keeps the profile's)", c.SuspicionMult)
	}
	c.applyTimings(base)
	if base.ProbeTimeout >= base.ProbeInterval && c.ProbeTimeout >= 0 && c.ProbeInterval >= 0 {
		bad("probe_timeout", "%s: must be below probe_interval %s", base.ProbeTimeout, base.ProbeInterval)
	}
	return errors.Join(errs...)
}

// profileConfig returns memberlist's configuration for a profile with
// Meridian's overrides, each with its reason. Fields set per member
// (name, addresses, delegates, keyring, logger) are filled in by
// StartMembers.
func profileConfig(profile string) *memberlist.Config {
	var mc *memberlist.Config
	switch profile {
	case ProfileLAN:
		// memberlist's LAN values fit the agents of one region.
		mc = memberlist.DefaultLANConfig()
	case ProfileLocal:
		mc = memberlist.DefaultLocalConfig()
		// Loopback: detect a stopped member in about a second instead of
		// several, so tests and the demo converge in milliseconds.
		mc.ProbeInterval = 100 * time.Millisecond
		// Loopback RTT is microseconds; must stay below ProbeInterval.
		mc.ProbeTimeout = 50 * time.Millisecond
		// Spread joins, leaves and metadata within tens of milliseconds.
		mc.GossipInterval = 20 * time.Millisecond
		// A full state sync every second, not every 15: when two members
		// join through a third at once, the third's broadcast of one can be
		// spent before it knows the other, and only a push/pull introduces
		// them (seen in CI: the two saw each other only after 15 s).
		mc.PushPullInterval = time.Second
	default:
		// Members span regions: memberlist's WAN values (5 s probes, 3 s
		// probe timeout) tolerate cross-region RTT and loss.
		mc = memberlist.DefaultWANConfig()
	}
	// Every profile: an agent restarted under the same region and agent
	// name with a new address (a rescheduled Kubernetes pod) takes its
	// name back once its old self is declared dead, instead of being
	// refused as a conflict until the dead entry is reaped
	// (GossipToTheDeadTime, 15–60 s). Two live members never share a name
	// this way: only a dead one can be reclaimed.
	mc.DeadNodeReclaimTime = mc.ProbeInterval
	return mc
}

// applyTimings copies c's non-zero timing overrides onto mc.
func (c *MemberConfig) applyTimings(mc *memberlist.Config) {
	if c.ProbeInterval > 0 {
		mc.ProbeInterval = c.ProbeInterval
	}
	if c.ProbeTimeout > 0 {
		mc.ProbeTimeout = c.ProbeTimeout
	}
	if c.GossipInterval > 0 {
		mc.GossipInterval = c.GossipInterval
	}
	if c.PushPullInterval > 0 {
		mc.PushPullInterval = c.PushPullInterval
	}
	if c.SuspicionMult > 0 {
		mc.SuspicionMult = c.SuspicionMult
	}
}

// parseBind parses Bind: an IP (empty means 0.0.0.0) and a port in
// [0, 65535].
func parseBind(s string) (string, int, error) {
	host, port, err := splitAddr(s)
	if err != nil {
		return "", 0, err
	}
	if host == "" {
		host = "0.0.0.0"
	}
	if net.ParseIP(host) == nil {
		return "", 0, errors.New("host must be an IP address (0.0.0.0 for every interface)")
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return "", 0, errors.New("port must be a number in [0, 65535]")
	}
	return host, int(p), nil
}

// parseAdvertise parses Advertise: a specific IP and a port in [1, 65535].
func parseAdvertise(s string) (string, int, error) {
	host, port, err := splitAddr(s)
	if err != nil {
		return "", 0, err
	}
	ip := net.ParseIP(host)
	if ip == nil || ip.IsUnspecified() {
		return "", 0, errors.New("host must be a specific IP address")
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return "", 0, errors.New("port must be a number in [1, 65535]")
	}
	return host, int(p), nil
}

// checkSeed checks one Join entry: a non-empty host and a port in
// [1, 65535].
func checkSeed(s string) error {
	host, port, err := splitAddr(s)
	if err != nil {
		return err
	}
	if host == "" {
		return errors.New("empty host")
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return errors.New("port must be a number in [1, 65535]")
	}
	return nil
}

// splitAddr is net.SplitHostPort with its error reduced to the reason
// (the caller quotes the address once).
func splitAddr(s string) (host, port string, err error) {
	host, port, err = net.SplitHostPort(s)
	if err != nil {
		var ae *net.AddrError
		if errors.As(err, &ae) {
			return "", "", errors.New(ae.Err)
		}
		return "", "", err
	}
	return host, port, nil
}

// loadKeys reads the keyring from KeyFile or KeyEnv: nil without error
// when neither is set and AllowPlaintext permits it. Errors name the field
// and the line (or position) of a bad key, never its content.
func (c *MemberConfig) loadKeys() ([][]byte, error) {
	switch {
	case c.KeyFile != "" && c.KeyEnv != "":
		return nil, errors.New("members.key_file, members.key_env: set one, not both")
	case c.KeyFile != "":
		data, err := os.ReadFile(c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("members.key_file: %w", err)
		}
		keys, err := parseKeys(data, false)
		if err != nil {
			return nil, fmt.Errorf("members.key_file: %s: %w", c.KeyFile, err)
		}
		return keys, nil
	case c.KeyEnv != "":
		v, ok := os.LookupEnv(c.KeyEnv)
		if !ok {
			return nil, fmt.Errorf("members.key_env: $%s is not set", c.KeyEnv)
		}
		keys, err := parseKeys([]byte(v), true)
		if err != nil {
			return nil, fmt.Errorf("members.key_env: $%s: %w", c.KeyEnv, err)
		}
		return keys, nil
	case c.AllowPlaintext:
		return nil, nil
	default:
		return nil, errors.New("members.key_file: no gossip key: set key_file or key_env (or allow_plaintext for a demo)")
	}
}

// parseKeys parses a keyring: one base64 key per line (or per comma when
// commas is set), blank entries and # comments ignored, at least one key,
// no key twice. Errors give the entry's position and the problem only.
func parseKeys(data []byte, commas bool) ([][]byte, error) {
	var (
		keys [][]byte
		errs []error
	)
	where := "line"
	if commas {
		where = "key"
	}
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		entries := []string{sc.Text()}
		if commas {
			entries = strings.Split(sc.Text(), ",")
		}
		for _, e := range entries {
			n++
			e = strings.TrimSpace(e)
			if e == "" || strings.HasPrefix(e, "#") {
				continue
			}
			k, err := decodeKey(e)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s %d: %w", where, n, err))
				continue
			}
			if i := indexKey(keys, k); i >= 0 {
				errs = append(errs, fmt.Errorf("%s %d: the same key as an earlier %s", where, n, where))
				continue
			}
			keys = append(keys, k)
		}
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, errors.New("unreadable (a line over 1 MiB?)"))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if len(keys) == 0 {
		return nil, errors.New("no keys")
	}
	return keys, nil
}

// decodeKey decodes one standard base64 key, padded or not, and checks
// its size. Its errors never quote the input.
func decodeKey(s string) ([]byte, error) {
	k, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		k, err = base64.RawStdEncoding.DecodeString(s)
	}
	if err != nil {
		return nil, errors.New("not standard base64")
	}
	if err := memberlist.ValidateKey(k); err != nil {
		return nil, fmt.Errorf("key is %d bytes; want 16, 24 or 32", len(k))
	}
	return k, nil
}

// indexKey is the index of k in keys, or -1.
func indexKey(keys [][]byte, k []byte) int {
	for i, x := range keys {
		if bytes.Equal(x, k) {
			return i
		}
	}
	return -1
}

// Validate reports every problem with m: Region and Agent non-empty,
// Region without "/" (the node name is Region "/" Agent), every field at
// most 128 bytes of printable UTF-8.
func (m Meta) Validate() error {
	var errs []error
	for _, f := range []struct {
		name, v  string
		required bool
	}{
		{"region", m.Region, true},
		{"agent", m.Agent, true},
		{"role", m.Role, false},
		{"version", m.Version, false},
	} {
		switch {
		case f.v == "" && f.required:
			errs = append(errs, fmt.Errorf("meta.%s: empty", f.name))
		case len(f.v) > maxMetaField:
			errs = append(errs, fmt.Errorf("meta.%s: %d bytes; at most %d", f.name, len(f.v), maxMetaField))
		case !printableField(f.v):
			errs = append(errs, fmt.Errorf("meta.%s: %q: not printable UTF-8", f.name, f.v))
		}
	}
	if strings.Contains(m.Region, "/") {
		errs = append(errs, fmt.Errorf("meta.region: %q: must not contain \"/\"", m.Region))
	}
	return errors.Join(errs...)
}

// printableField reports whether s is valid UTF-8 without control characters.
func printableField(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}
