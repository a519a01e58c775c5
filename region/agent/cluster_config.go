package agent

import (
	"math"
	"time"

	"github.com/meridian-quota/meridian/rebalance"
)

// ClusterConfig joins the agent to its cluster: NATS for reports, acks and
// tables, memberlist for liveness, and the coordinator election. The
// section is optional: without a name the agent runs standalone, its one
// region holding the whole of every budget (safe_fraction, default 1). Secrets (NATS credentials, the memberlist
// keyring, the coordinator's signing key) are named by file or
// environment variable, never written here, and never logged. cmd/meridian
// turns this into package gossip's configurations, which validate the rest.
type ClusterConfig struct {
	// Name namespaces NATS subjects, KV keys and every wire message.
	Name        string                   `yaml:"name"`
	NATS        ClusterNATSConfig        `yaml:"nats"`
	Members     ClusterMembersConfig     `yaml:"members"`
	Coordinator ClusterCoordinatorConfig `yaml:"coordinator"`
	Reports     ClusterReportsConfig     `yaml:"reports"`
}

// ClusterReportsConfig is what this agent's demand reports list once the
// coordinator reads delta reports (region.Config.ReportChange,
// ReportRefresh; 0: region.DefaultConfig's value).
type ClusterReportsConfig struct {
	// Change: a key is listed again when its offered cost in an interval
	// moved by more than this part of the larger since it was last listed
	// (default 0.2), in (0, 1).
	Change float64 `yaml:"change"`
	// Refresh: the longest a key with demand goes unlisted (default 2m); at
	// least the interval.
	Refresh Duration `yaml:"refresh"`
	// Full lists every key with demand in every report, as agents did
	// before delta reports (ten times the report bytes of a steady cluster).
	Full bool `yaml:"full"`
}

// ClusterNATSConfig is the NATS connection. At most one of creds_file,
// nkey_seed_file, user (with password_file or password_env) and token_file
// or token_env.
type ClusterNATSConfig struct {
	URLs         []string `yaml:"urls"`
	CredsFile    string   `yaml:"creds_file"`
	NKeySeedFile string   `yaml:"nkey_seed_file"`
	User         string   `yaml:"user"`
	PasswordFile string   `yaml:"password_file"`
	PasswordEnv  string   `yaml:"password_env"`
	TokenFile    string   `yaml:"token_file"`
	TokenEnv     string   `yaml:"token_env"`
	CAFile       string   `yaml:"ca_file"`
	CertFile     string   `yaml:"cert_file"`
	KeyFile      string   `yaml:"key_file"`
	// Bucket is the JetStream KV bucket holding the latest table and the
	// election; Replicas its replication (3 on a production cluster).
	Bucket   string `yaml:"bucket"`
	Replicas int    `yaml:"replicas"`
}

// ClusterMembersConfig is memberlist membership.
type ClusterMembersConfig struct {
	// Profile is wan (across regions, the default), lan or local.
	Profile   string   `yaml:"profile"`
	Bind      string   `yaml:"bind"`
	Advertise string   `yaml:"advertise"`
	Join      []string `yaml:"join"`
	// KeyFile / KeyEnv hold the gossip keyring (base64 keys, the first
	// primary). AllowPlaintext must be set to run without one.
	KeyFile        string `yaml:"key_file"`
	KeyEnv         string `yaml:"key_env"`
	AllowPlaintext bool   `yaml:"allow_plaintext"`
}

// ClusterCoordinatorConfig is the coordinator: who may be elected, how
// tables are signed and verified, and the rebalance core's settings.
type ClusterCoordinatorConfig struct {
	// Candidate makes this agent stand for coordinator; it then needs the
	// signing key (base64 Ed25519 seed, from SignKeyFile or SignKeyEnv).
	Candidate   bool   `yaml:"candidate"`
	SignKeyFile string `yaml:"sign_key_file"`
	SignKeyEnv  string `yaml:"sign_key_env"`
	// VerifyKeysFile / VerifyKeysEnv list the coordinator public keys
	// (base64, one per line or comma-separated) whose tables this agent
	// applies: required; two during a key rotation.
	VerifyKeysFile string `yaml:"verify_keys_file"`
	VerifyKeysEnv  string `yaml:"verify_keys_env"`
	// The rebalance core (0 or empty: rebalance.DefaultConfig's value).
	Lease      Duration `yaml:"lease"`
	MaxSkew    Duration `yaml:"max_skew"`
	Fence      Duration `yaml:"fence"`
	Strategy   string   `yaml:"strategy"`
	Hysteresis uint32   `yaml:"hysteresis_ppm"`
	// HysteresisNeed is rebalance.Config.HysteresisNeed: the smaller
	// threshold for a region short of its share.
	HysteresisNeed uint32  `yaml:"hysteresis_need_ppm"`
	SafeFraction   float64 `yaml:"safe_fraction"`
	// IdleSafeFraction is rebalance.Config.IdleSafeFraction, and the floor
	// every agent runs a key no table names at (0: the default, 1 %);
	// FloorWindow is rebalance.Config.FloorWindow (0: the default, 10 s).
	IdleSafeFraction float64  `yaml:"idle_safe_fraction"`
	FloorWindow      Duration `yaml:"floor_window"`
	// MaxAgentsPerRegion bounds the agents per region the coordinator
	// keeps that membership does not list (default 256).
	MaxAgentsPerRegion int `yaml:"max_agents_per_region"`
	// ElectionTTL: a silent coordinator is replaced this long after its
	// last renewal (default 3s).
	ElectionTTL Duration `yaml:"election_ttl"`
}

// fence is the coordinator's Fence: the configured one, else
// rebalance.DefaultConfig's.
func (c *ClusterConfig) fence() time.Duration {
	if c.Coordinator.Fence > 0 {
		return c.Coordinator.Fence.D()
	}
	return rebalance.DefaultConfig().Fence
}

// Enabled reports whether the agent joins a cluster.
func (c *ClusterConfig) Enabled() bool { return c.Name != "" }

// validate adds the section's shape errors; package gossip checks the rest
// when the agent starts.
func (c *ClusterConfig) validate(bad func(field, format string, a ...any)) {
	if !c.Enabled() {
		zero := ClusterConfig{}
		if c.NATS.Bucket != zero.NATS.Bucket || len(c.NATS.URLs) > 0 || c.Coordinator.Candidate || len(c.Members.Join) > 0 {
			bad("cluster.name", "empty, but the cluster section is filled in: name the cluster to join it")
		}
		return
	}
	if len(c.NATS.URLs) == 0 {
		bad("cluster.nats.urls", "empty: at least one NATS server URL")
	}
	if c.Coordinator.Candidate && c.Coordinator.SignKeyFile == "" && c.Coordinator.SignKeyEnv == "" {
		bad("cluster.coordinator", "candidate without sign_key_file or sign_key_env: its tables could not be signed")
	}
	if c.Coordinator.VerifyKeysFile == "" && c.Coordinator.VerifyKeysEnv == "" {
		bad("cluster.coordinator", "no verify_keys_file or verify_keys_env: every table would be refused")
	}
	if c.Members.Bind == "" {
		bad("cluster.members.bind", "empty: the memberlist address (host:port) is required")
	}
	if c.Members.KeyFile == "" && c.Members.KeyEnv == "" && !c.Members.AllowPlaintext {
		bad("cluster.members", "no key_file or key_env: gossip would be unencrypted (set allow_plaintext: true to accept that)")
	}
	for _, d := range []struct {
		name string
		v    Duration
	}{{"lease", c.Coordinator.Lease}, {"max_skew", c.Coordinator.MaxSkew}, {"fence", c.Coordinator.Fence}, {"election_ttl", c.Coordinator.ElectionTTL}} {
		if d.v < 0 {
			bad("cluster.coordinator."+d.name, "%s: must not be negative", time.Duration(d.v))
		}
	}
	if r := c.Reports.Change; !(r >= 0 && r < 1) {
		bad("cluster.reports.change", "%v: must be in (0, 1) (0: the default, 0.2)", r)
	}
	if c.Reports.Refresh < 0 {
		bad("cluster.reports.refresh", "%s: must not be negative", time.Duration(c.Reports.Refresh))
	}
	// rebalance.Config.Validate's rule, with the defaults a 0 stands for,
	// so that the file names the field.
	def := rebalance.DefaultConfig()
	fence, skew := time.Duration(c.Coordinator.Fence), time.Duration(c.Coordinator.MaxSkew)
	if fence == 0 {
		fence = def.Fence
	}
	if skew == 0 {
		skew = def.MaxSkew
	}
	if fence >= 0 && skew >= 0 && fence < 2*skew {
		bad("cluster.coordinator.fence", "%s: must be at least twice max_skew (%s): a store running ahead could start an increase before a store running behind has the decrease it pays for", fence, skew)
	}
	if f := c.Coordinator.SafeFraction; f < 0 || f >= 1 {
		bad("cluster.coordinator.safe_fraction", "%v: must be in [0, 1)", f)
	}
	if f := c.Coordinator.IdleSafeFraction; math.IsNaN(f) || f < 0 || f >= 1 {
		bad("cluster.coordinator.idle_safe_fraction", "%v: must be in [0, 1) (0: the default, %v)", f, rebalance.DefaultConfig().IdleSafeFraction)
	}
	if w := c.Coordinator.FloorWindow; w < 0 {
		bad("cluster.coordinator.floor_window", "%s: must not be negative (0: the default, %s)", time.Duration(w), rebalance.DefaultConfig().FloorWindow)
	}
	if n := c.Coordinator.MaxAgentsPerRegion; n < 0 {
		bad("cluster.coordinator.max_agents_per_region", "%d: must not be negative (0: the default, %d)", n, rebalance.DefaultConfig().MaxAgentsPerRegion)
	}
	if c.NATS.Replicas < 0 || c.NATS.Replicas > 5 {
		bad("cluster.nats.replicas", "%d: must be in [0, 5]", c.NATS.Replicas)
	}
}
