package agent

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/meridian-quota/meridian/rebalance"
	"github.com/meridian-quota/meridian/region"
)

// Duration is a time.Duration written in YAML as a Go duration string.
type Duration = region.Duration

// Config is the agent's one YAML file. DefaultConfig documents each
// default; LoadConfig reads, defaults and validates it.
type Config struct {
	// Region and Agent name this agent; Regions lists every region. An
	// agent without a cluster section is standalone: its region is the
	// only one (Regions may be left out; listing several is a load error)
	// and holds the whole of every budget.
	Region  string   `yaml:"region"`
	Agent   string   `yaml:"agent"`
	Regions []string `yaml:"regions"`
	// SafeFraction is the part of every global budget set aside as the
	// regions' floors, split equally: what a region runs every key at
	// before its first table, once its lease lapses, and for keys the table
	// does not name. 0 means the default: 1 standalone (the one region
	// holds 100 % of every limit), else cluster.coordinator.safe_fraction
	// or the coordinator's default, 0.1. Standalone it must be in (0, 1]: a
	// smaller part suits independent deployments splitting one budget by
	// hand. In a cluster it must be in (0, 1), agree with
	// cluster.coordinator.safe_fraction when both are set, and be the same
	// in every agent and the coordinator.
	SafeFraction float64 `yaml:"safe_fraction"`
	// Policy is the policy file, or a directory of envoyproxy/ratelimit
	// files (relative to the config file); PolicyOptions say how a
	// directory is read. Either is reloaded when its content changes.
	Policy        string        `yaml:"policy"`
	PolicyOptions PolicyOptions `yaml:"policy_options"`
	// Listen addresses: GRPC serves Envoy RLS v3 and gRPC health; HTTP the
	// JSON API, /healthz, /readyz and /metrics.
	GRPC string `yaml:"grpc"`
	HTTP string `yaml:"http"`
	// Redis is this region's Redis.
	Redis RedisConfig `yaml:"redis"`
	// Interval is Δ, the report interval (the coordinator's).
	Interval Duration `yaml:"interval"`
	// Agents is the number of agents configured in the region. The agents
	// of a region share its Redis, so they enforce one budget however many
	// there are; but failure_mode local decides in each agent's memory, at
	// the region's limit divided by max(agents, live agents). Standalone
	// there is no membership to count the live ones: several agents on one
	// Redis must say how many share it here, or a Redis outage admits that
	// many times the limit.
	Agents int `yaml:"agents"`
	// Auth guards the decision APIs (RLS and /v1/*); health probes stay
	// open.
	Auth AuthConfig `yaml:"auth"`
	// TLS serves both listeners over TLS; with a client CA, only clients
	// presenting a certificate it signed are served (mTLS).
	TLS TLSConfig `yaml:"tls"`
	// ResponseHeaders adds RateLimit-Policy, RateLimit (HeadersDraft) and,
	// when over, Retry-After to RLS responses for Envoy to pass on.
	ResponseHeaders bool `yaml:"response_headers"`
	// Tracing exports OpenTelemetry spans over OTLP when an endpoint is set.
	Tracing TracingConfig `yaml:"tracing"`
	// Breaker guards the store: see BreakerConfig.
	Breaker BreakerConfig `yaml:"breaker"`
	// ReloadEvery is how often the policy file is checked for changes
	// (SIGHUP reloads at once); 0 turns polling off.
	ReloadEvery Duration `yaml:"reload_every"`
	// Cluster joins the agent to its cluster (NATS, memberlist, the
	// coordinator); absent, the agent runs standalone.
	Cluster ClusterConfig `yaml:"cluster"`
	// ReserveMaxWait is the booking horizon: the longest POST /v1/reserve
	// may book ahead (max_wait_ms above it is refused) and the node's
	// region.Config.MaxReserveWait. In a cluster it must not exceed
	// cluster.coordinator.fence: a booking acts when its wait ends, and
	// the fence is all that separates a cut share from the increase it
	// pays for (ARCHITECTURE.md invariant 4).
	ReserveMaxWait Duration `yaml:"reserve_max_wait"`
	// DrainDelay is how long the agent keeps serving after SIGTERM (or its
	// Run's context ending) with readiness failing — /readyz 503, the gRPC
	// health service NOT_SERVING — before it closes its listeners, so that
	// load balancers and gateways stop sending it requests before it stops
	// answering them. A second SIGTERM or interrupt ends the wait. 0: close
	// at once.
	DrainDelay Duration `yaml:"drain_delay"`
}

// maxDrainDelay bounds DrainDelay: the wait must end well inside any
// termination grace period.
const maxDrainDelay = 5 * time.Minute

// AuthConfig lists the bearer tokens callers must present
// ("authorization: Bearer <token>" on gRPC metadata and HTTP; the scheme
// is case-insensitive, RFC 7235). Tokens are at least 16 characters. Tokens are
// read from a file (one per line, # comments) and/or an environment
// variable (comma-separated), never from this file, and never logged. No
// tokens: no authentication.
type AuthConfig struct {
	TokensFile string `yaml:"tokens_file"`
	TokensEnv  string `yaml:"tokens_env"`
}

// DefaultConfig returns the defaults LoadConfig fills in.
func DefaultConfig() Config {
	return Config{
		GRPC:     "127.0.0.1:8081",          // Envoy's rate_limit_service points here
		HTTP:     "127.0.0.1:8080",          // JSON API, health, metrics
		Interval: Duration(5 * time.Second), // the coordinator's default Δ
		Agents:   1,                         // one agent per region unless told
		// A changed policy file is picked up within a second.
		ReloadEvery: Duration(time.Second),
		// A few failures in a row, not one blip, open the breaker; while
		// open it probes Redis again every second.
		Breaker: BreakerConfig{Failures: 5, Cooldown: Duration(time.Second)},
		// One decision in a hundred traced: enough to see latency, cheap.
		Tracing: TracingConfig{Sample: 0.01},
		// The coordinator's default fence: the longest a booking may wait
		// and still act before an increase it could overlap.
		ReserveMaxWait: Duration(rebalance.DefaultConfig().Fence),
		// Long enough for an endpoint removal to reach the gateways (a
		// few seconds in Kubernetes), short against the default 30 s
		// termination grace period.
		DrainDelay: Duration(5 * time.Second),
		Redis: RedisConfig{
			// Type single at DefaultRedisAddr: an empty Type and Addr mean
			// that, so a file that names a cluster or sentinel need not
			// clear them.
			Prefix:  "meridian:",
			Timeout: Duration(5 * time.Millisecond), // a decision must not wait on a slow Redis
			// One call in flight: an agent's callers are remote, so their
			// decisions arrive spread out, and a second lane only halves
			// each batch. One lane sends half the script calls for the same
			// decisions (measured at 64 callers: about a fifth less CPU per
			// decision in the agent and in Redis, 5 % more decisions/s).
			Lanes: 1,
			// The exact state; "packed" only while agents of an older
			// release share the Redis.
			WriteFormat: "value",
			// A state loss is counted and alerted on; running every key at
			// the safe share for a burst window is the operator's choice.
			OnStateLoss: "count",
		},
	}
}

// ErrConfig wraps every configuration error.
var ErrConfig = errors.New("agent: invalid config")

// LoadConfig reads the YAML file at path over the defaults and validates
// it, reporting every problem with its field; unknown fields are errors.
// Relative paths in it are resolved against the file's directory.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if c.Policy != "" && !filepath.IsAbs(c.Policy) {
		c.Policy = filepath.Join(filepath.Dir(path), c.Policy)
	}
	cl := &c.Cluster
	for _, f := range []*string{&c.Auth.TokensFile, &c.TLS.CertFile, &c.TLS.KeyFile, &c.TLS.ClientCAFile,
		&cl.NATS.CredsFile, &cl.NATS.NKeySeedFile, &cl.NATS.PasswordFile, &cl.NATS.TokenFile, &cl.NATS.CAFile,
		&cl.NATS.CertFile, &cl.NATS.KeyFile, &cl.Members.KeyFile, &cl.Coordinator.SignKeyFile, &cl.Coordinator.VerifyKeysFile,
		&c.Redis.PasswordFile, &c.Redis.TLS.CAFile, &c.Redis.TLS.CertFile, &c.Redis.TLS.KeyFile} {
		if *f != "" && !filepath.IsAbs(*f) {
			*f = filepath.Join(filepath.Dir(path), *f)
		}
	}
	return c, nil
}

// ParseConfig is LoadConfig on bytes. Unknown fields and values of the
// wrong type are reported together with every problem Validate finds in
// the rest of the file (a misspelt field hides nothing), each with its
// line as go-yaml names it: "line 7: redis.timeout: 0s: must be in …".
func ParseConfig(data []byte) (*Config, error) {
	c := DefaultConfig()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var errs []error
	if err := dec.Decode(&c); err != nil {
		var te *yaml.TypeError
		switch {
		case errors.Is(err, io.EOF):
			return nil, fmt.Errorf("%w: empty file", ErrConfig)
		case !errors.As(err, &te):
			return nil, fmt.Errorf("%w: %v", ErrConfig, err) // a syntax error: nothing was decoded
		}
		// go-yaml decodes every other field before it returns the
		// unknown ones ("line 5: field x not found in type agent.Config").
		for _, msg := range te.Errors {
			errs = append(errs, errors.New(msg))
		}
	}
	if !c.Cluster.Enabled() && len(c.Regions) == 0 && c.Region != "" {
		c.Regions = []string{c.Region} // standalone: the one region
	}
	if err := c.validate(true); err != nil {
		var doc yaml.Node
		_ = yaml.Unmarshal(data, &doc) // it decoded above, so it parses
		errs = append(errs, region.FieldLines(&doc, err, ErrConfig)...)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrConfig, errors.Join(errs...))
	}
	return &c, nil
}

// Validate reports every problem with c.
func (c *Config) Validate() error { return c.validate(false) }

// validate is Validate; loaded adds the checks of a file that runs on its
// own (a program that wires its own Control, like meridian demo, may build
// a multi-region Config without a cluster section).
func (c *Config) validate(loaded bool) error {
	var errs []error
	bad := func(field, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, a...)))
	}
	if c.Region == "" {
		bad("region", "empty")
	}
	if c.Agent == "" {
		bad("agent", "empty")
	}
	if !slices.Contains(c.Regions, c.Region) {
		bad("regions", "%q does not list region %q", c.Regions, c.Region)
	} else if loaded && !c.Cluster.Enabled() && len(c.Regions) > 1 {
		bad("regions", "%q: %d regions without a cluster section: a standalone agent holds the whole of every budget in its region, so each region would admit the full limit; "+
			"add a cluster section to share the budgets between the regions, or list only %q", c.Regions, len(c.Regions), c.Region)
	}
	c.validateSafeFraction(bad)
	if c.Policy == "" {
		bad("policy", "empty: the policy file is required")
	}
	if c.GRPC == "" && c.HTTP == "" {
		bad("grpc, http", "both empty: the agent would serve nothing")
	}
	c.Redis.validate(bad)
	if t := time.Duration(c.Redis.Timeout); t <= 0 || t > 10*time.Second {
		bad("redis.timeout", "%s: must be in (0, 10s]", t)
	}
	if c.Redis.Lanes < 1 || c.Redis.Lanes > 256 {
		bad("redis.lanes", "%d: must be in [1, 256]", c.Redis.Lanes)
	}
	if f := c.Redis.WriteFormat; f != "value" && f != "value12" && f != "packed" {
		bad("redis.write_format", "%q: want value, value12 or packed", f)
	}
	if m := c.Redis.OnStateLoss; m != "" && m != "count" && m != "conservative" {
		bad("redis.on_state_loss", "%q: want count or conservative", m)
	}
	if iv := time.Duration(c.Interval); iv < 100*time.Millisecond || iv > 10*time.Minute {
		bad("interval", "%s: must be in [100ms, 10m]", iv)
	}
	if c.Agents < 1 {
		bad("agents", "%d: must be at least 1", c.Agents)
	}
	if c.Breaker.Failures < 1 {
		bad("breaker.failures", "%d: must be at least 1", c.Breaker.Failures)
	}
	if c.Breaker.Cooldown <= 0 {
		bad("breaker.cooldown", "%s: must be positive", c.Breaker.Cooldown.D())
	}
	if c.Tracing.Sample < 0 || c.Tracing.Sample > 1 {
		bad("tracing.sample", "%v: must be in [0, 1]", c.Tracing.Sample)
	}
	if c.ReloadEvery < 0 {
		bad("reload_every", "%s: must not be negative", time.Duration(c.ReloadEvery))
	}
	if d := c.DrainDelay.D(); d < 0 || d > maxDrainDelay {
		bad("drain_delay", "%s: must be in [0s, %s]", d, maxDrainDelay)
	}
	if w := c.ReserveMaxWait.D(); w < 0 || w > maxReserveWait {
		bad("reserve_max_wait", "%s: must be in [0s, %s]", w, maxReserveWait)
	} else if f := c.Cluster.fence(); c.Cluster.Enabled() && w > f {
		bad("reserve_max_wait", "%s: above cluster.coordinator.fence (%s): a booking would act after the increase the fence holds back; lower it or raise the fence", w, f)
	}
	c.Cluster.validate(bad)
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrConfig, errors.Join(errs...))
}

// validateSafeFraction checks safe_fraction for the agent's mode.
func (c *Config) validateSafeFraction(bad func(field, format string, a ...any)) {
	f := c.SafeFraction
	switch {
	case f == 0:
	case math.IsNaN(f) || f < 0 || f > 1:
		bad("safe_fraction", "%v: must be in (0, 1]", f)
	case !c.Cluster.Enabled():
	case f == 1:
		bad("safe_fraction", "1: in a cluster the floors would be the whole budget and the coordinator could move nothing; must be below 1")
	case c.Cluster.Coordinator.SafeFraction != 0 && c.Cluster.Coordinator.SafeFraction != f:
		bad("safe_fraction", "%v differs from cluster.coordinator.safe_fraction %v: the node's floors and the coordinator's must agree; set one of them",
			f, c.Cluster.Coordinator.SafeFraction)
	}
}

// ResolvedSafeFraction is the safe fraction the agent's node (and, in a
// cluster, its coordinator) runs with: safe_fraction when set; else, in a
// cluster, cluster.coordinator.safe_fraction when set or the coordinator's
// default (rebalance.DefaultConfig, 0.1); else 1 (standalone: the one
// region holds every budget whole; region.StandaloneConfig).
func (c *Config) ResolvedSafeFraction() float64 {
	switch {
	case c.SafeFraction > 0:
		return c.SafeFraction
	case !c.Cluster.Enabled():
		return 1
	case c.Cluster.Coordinator.SafeFraction > 0:
		return c.Cluster.Coordinator.SafeFraction
	}
	return rebalance.DefaultConfig().SafeFraction
}

// ResolvedIdleSafeFraction is the idle floors' fraction the agent's node
// and its coordinator run with in a cluster:
// cluster.coordinator.idle_safe_fraction when set, else the coordinator's
// default (rebalance.DefaultConfig, 0.01); never above the safe fraction.
func (c *Config) ResolvedIdleSafeFraction() float64 {
	f := rebalance.DefaultConfig().IdleSafeFraction
	if c.Cluster.Coordinator.IdleSafeFraction > 0 {
		f = c.Cluster.Coordinator.IdleSafeFraction
	}
	return min(f, c.ResolvedSafeFraction())
}

// NodeConfig is the region node's configuration from the agent's: region,
// agent and regions, Δ, agents, the booking horizon (reserve_max_wait),
// OneSlot on a Redis Cluster, the safe fraction (ResolvedSafeFraction:
// standalone, region.StandaloneConfig's whole budget unless safe_fraction
// says otherwise) and, in a cluster, the coordinator's max_skew and the
// reports section. The node
// and the coordinator must agree on Δ, the floors and the skew bound.
func (c *Config) NodeConfig() region.Config {
	n := region.DefaultConfig(c.Region, c.Agent, c.Regions...)
	if !c.Cluster.Enabled() {
		n = region.StandaloneConfig(c.Region, c.Agent)
		n.Regions = c.Regions
	}
	n.SafeFraction = c.ResolvedSafeFraction()
	if c.Cluster.Enabled() {
		n.IdleSafeFraction = c.ResolvedIdleSafeFraction()
	}
	n.Interval = c.Interval.D()
	n.Agents = c.Agents
	n.MaxReserveWait = c.ReserveMaxWait.D()    // validated against the fence in a cluster
	n.OneSlot = c.Redis.Kind() == RedisCluster // a composite's keys must share a slot
	if c.Cluster.Enabled() {
		n.MaxSkew = rebalance.DefaultConfig().MaxSkew
		if s := c.Cluster.Coordinator.MaxSkew.D(); s > 0 {
			n.MaxSkew = s
		}
		r := c.Cluster.Reports
		if r.Change > 0 {
			n.ReportChange = r.Change
		}
		if r.Refresh > 0 {
			n.ReportRefresh = r.Refresh.D()
		}
		if r.Full {
			n.ReportChange = 0
		}
	}
	return n
}

// CheckPolicy reports every problem with running policy p under c, with
// the limits' paths: on a Redis Cluster (redis.type cluster), a domain whose
// limits one request can combine without a hash tag; in a cluster of
// agents, a limit whose lease.ttl exceeds cluster.coordinator.fence (leased
// units are booked future too, ARCHITECTURE.md invariant 4). New checks the
// node's policy and Reload every policy it loads.
func (c *Config) CheckPolicy(p *region.Policy) error {
	var errs []error
	if c.Redis.Kind() == RedisCluster {
		if err := p.CheckOneSlot(); err != nil {
			errs = append(errs, fmt.Errorf("policy (redis.type cluster): %w", err))
		}
	}
	if c.Cluster.Enabled() {
		f := c.Cluster.fence()
		for _, r := range p.Rules() {
			if r.LeaseUnits > 0 && r.LeaseTTL > f {
				errs = append(errs, fmt.Errorf("policy: %s: lease.ttl %s above cluster.coordinator.fence (%s): leased units would be served after the increase the fence holds back",
					r.Path, r.LeaseTTL, f))
			}
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrConfig, errors.Join(errs...))
}

// TracingConfig configures span export. No endpoint: spans go nowhere (a
// no-op tracer, nothing recorded).
type TracingConfig struct {
	// OTLPEndpoint is the collector's OTLP/gRPC address, host:port.
	OTLPEndpoint string `yaml:"otlp_endpoint"`
	// Insecure sends spans without TLS (a collector on localhost).
	Insecure bool `yaml:"insecure"`
	// Sample is the fraction of decisions traced (default 0.01).
	Sample float64 `yaml:"sample"`
}

// TLSConfig names PEM files (relative to the config file).
type TLSConfig struct {
	CertFile     string `yaml:"cert_file"`
	KeyFile      string `yaml:"key_file"`
	ClientCAFile string `yaml:"client_ca_file"`
}

// Enabled reports whether TLS is configured.
func (t TLSConfig) Enabled() bool { return t.CertFile != "" || t.KeyFile != "" || t.ClientCAFile != "" }

// Load builds the server's TLS configuration (nil when not configured).
func (t TLSConfig) Load() (*tls.Config, error) {
	if !t.Enabled() {
		return nil, nil
	}
	if t.CertFile == "" || t.KeyFile == "" {
		return nil, fmt.Errorf("%w: tls: cert_file and key_file are both required", ErrConfig)
	}
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	c := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if t.ClientCAFile != "" {
		pem, err := os.ReadFile(t.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("tls.client_ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls.client_ca_file %s: no PEM certificate in it", t.ClientCAFile)
		}
		c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return c, nil
}

// Tokens reads the configured bearer tokens: the file's non-empty,
// non-comment lines and the environment variable's comma-separated values.
// An empty result means no authentication. A configured file or variable
// that yields no token is an error (a typo must not turn auth off).
func (a AuthConfig) Tokens() ([]string, error) {
	var out []string
	if a.TokensFile != "" {
		data, err := os.ReadFile(a.TokensFile)
		if err != nil {
			return nil, fmt.Errorf("auth.tokens_file: %w", err)
		}
		n := 0
		for _, line := range strings.Split(string(data), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			out = append(out, line)
			n++
		}
		if n == 0 {
			return nil, fmt.Errorf("auth.tokens_file %s: no tokens in it", a.TokensFile)
		}
	}
	if a.TokensEnv != "" {
		v, ok := os.LookupEnv(a.TokensEnv)
		if !ok || strings.TrimSpace(v) == "" {
			return nil, fmt.Errorf("auth.tokens_env: $%s is not set", a.TokensEnv)
		}
		for _, t := range strings.Split(v, ",") {
			if t = strings.TrimSpace(t); t != "" {
				out = append(out, t)
			}
		}
	}
	for _, t := range out {
		if len(t) < 16 {
			return nil, errors.New("auth: a token shorter than 16 characters (tokens are not shown)")
		}
	}
	return out, nil
}
