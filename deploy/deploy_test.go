// Package deploy_test checks the deployment examples under deploy/ — the
// Dockerfile, the compose topology, the NATS, agent and Envoy configs, the
// Kubernetes manifests — against the code they deploy. There is no Docker
// here: TestComposeTopologyNative runs the compose topology as native
// processes instead (redis-server, nats-server, the meridian binary), from
// the same files with only addresses and secret paths rewritten.
//
// Paths are relative to this directory, where go test runs.
package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3" // resolves the router's @type
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/meridian-quota/meridian/internal/testenv"
	"github.com/meridian-quota/meridian/region"
	"github.com/meridian-quota/meridian/region/agent"
)

// The files under test, relative to deploy/.
const (
	policyFile     = "policy.yaml"
	composeFile    = "compose/compose.yaml"
	envoyFile      = "envoy/envoy.yaml"
	dockerfileFile = "docker/Dockerfile"
	k8sBaseDir     = "kubernetes/base"
	k8sOverlaysDir = "kubernetes/overlays"
	repoRoot       = ".."
)

// The fixed layout of issue 8: three regions, two agents each, one
// cluster.
var (
	regions     = []string{"eu", "us", "ap"}
	clusterName = "meridian"
	// coordinatorRegion is where the KV bucket and the candidates live.
	coordinatorRegion = "eu"
)

// ---------------------------------------------------------------------
// Every YAML and JSON file parses

func TestFilesParse(t *testing.T) {
	var yamlFiles, jsonFiles int
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		switch filepath.Ext(p) {
		case ".yaml", ".yml":
			yamlFiles++
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			dec := yaml.NewDecoder(bytes.NewReader(data))
			docs := 0
			for {
				var v any
				err := dec.Decode(&v)
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Errorf("%s: document %d: %v", p, docs+1, err)
					docs = -1
					break
				}
				docs++
			}
			if docs == 0 {
				t.Errorf("%s: no YAML document", p)
			}
		case ".json":
			jsonFiles++
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			var v any
			if err := json.Unmarshal(data, &v); err != nil {
				t.Errorf("%s: %v", p, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if yamlFiles < 20 {
		t.Errorf("found %d YAML files under deploy/; the layout has more", yamlFiles)
	}
	t.Logf("%d YAML and %d JSON files parse", yamlFiles, jsonFiles)
}

// ---------------------------------------------------------------------
// Every agent config loads, and the configs agree

// agentConfigFiles returns the compose agent configs and the Kubernetes
// overlays' per-pod configs.
func agentConfigFiles(t *testing.T) (compose, k8s []string) {
	t.Helper()
	compose, err := filepath.Glob("compose/agents/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	k8s, err = filepath.Glob(k8sOverlaysDir + "/*/agents/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(compose) != 2*len(regions) || len(k8s) != 2*len(regions) {
		t.Fatalf("want %d compose and %d Kubernetes agent configs, found %v and %v", 2*len(regions), 2*len(regions), compose, k8s)
	}
	return compose, k8s
}

func loadAgentConfig(t *testing.T, p string) *agent.Config {
	t.Helper()
	cfg, err := agent.LoadConfig(p)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return cfg
}

func TestAgentConfigs(t *testing.T) {
	compose, k8s := agentConfigFiles(t)
	for _, set := range []struct {
		name  string
		files []string
	}{{"compose", compose}, {"kubernetes", k8s}} {
		ids := map[string]string{}
		for _, p := range set.files {
			// LoadConfig reads no secret and no policy: it checks the
			// shape; the cluster's own validation (which reads the key
			// files) runs in TestComposeTopologyNative.
			cfg, err := agent.LoadConfig(p)
			if err != nil {
				t.Errorf("%v", err)
				continue
			}
			id := cfg.Region + "/" + cfg.Agent
			if prev, ok := ids[id]; ok {
				t.Errorf("%s: agent %s again (first in %s): agent ids must be unique in the %s cluster", p, id, prev, set.name)
			}
			ids[id] = p
			if !slices.Equal(cfg.Regions, regions) {
				t.Errorf("%s: regions %v, want %v", p, cfg.Regions, regions)
			}
			if !strings.Contains(p, "/"+cfg.Region+"/") && !strings.Contains(filepath.Base(p), "-"+cfg.Region+"-") {
				t.Errorf("%s: region %s does not match the file's place", p, cfg.Region)
			}
			cl := cfg.Cluster
			if cl.Name != clusterName {
				t.Errorf("%s: cluster.name %q, want %q", p, cl.Name, clusterName)
			}
			if cl.NATS.Bucket != clusterName {
				t.Errorf("%s: cluster.nats.bucket %q, want %q", p, cl.NATS.Bucket, clusterName)
			}
			candidate := cfg.Region == coordinatorRegion
			if cl.Coordinator.Candidate != candidate {
				t.Errorf("%s: coordinator.candidate %v: only %s's agents stand (the bucket lives there)", p, cl.Coordinator.Candidate, coordinatorRegion)
			}
			if wantUser := cfg.Region + "." + cfg.Agent; cl.NATS.User != wantUser {
				t.Errorf("%s: cluster.nats.user %q, want %q (each agent its own user, which may publish only as that agent)", p, cl.NATS.User, wantUser)
			}
			if cfg.Agents != 2 {
				t.Errorf("%s: agents %d, want 2 per region", p, cfg.Agents)
			}
			if !cfg.ResponseHeaders {
				t.Errorf("%s: response_headers off: Envoy is set to pass on the agent's RateLimit fields", p)
			}
		}
	}
}

func TestPolicyCopiesMatch(t *testing.T) {
	want := loadPolicy(t, policyFile)
	got := loadPolicy(t, filepath.Join(k8sBaseDir, "policy.yaml"))
	if got.Version() != want.Version() {
		t.Errorf("%s/policy.yaml (version %s) differs from %s (version %s): copy it again", k8sBaseDir, got.Version(), policyFile, want.Version())
	}
}

func loadPolicy(t *testing.T, p string) *region.Policy {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := region.ParsePolicy(data)
	if err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	return pol
}

// ---------------------------------------------------------------------
// The compose file

// compose is the part of compose.yaml the tests read. yaml.v3 resolves
// the file's anchors and merge keys.
type compose struct {
	Services map[string]composeService `yaml:"services"`
	Secrets  map[string]struct {
		File string `yaml:"file"`
	} `yaml:"secrets"`
}

type composeService struct {
	Image     string   `yaml:"image"`
	Command   []string `yaml:"command"`
	Volumes   []string `yaml:"volumes"`
	Secrets   []string `yaml:"secrets"`
	DependsOn []string `yaml:"depends_on"`
}

// mount is one bind mount of a service: host source (relative to
// compose/) and container target.
type mount struct{ source, target string }

func (s composeService) mounts() []mount {
	var out []mount
	for _, v := range s.Volumes {
		f := strings.Split(v, ":")
		if len(f) < 2 || !strings.HasPrefix(f[0], ".") {
			continue // a named volume
		}
		out = append(out, mount{f[0], f[1]})
	}
	return out
}

// source returns the host path (relative to deploy/) mounted at target.
func (s composeService) source(target string) (string, bool) {
	for _, m := range s.mounts() {
		if m.target == target {
			return filepath.Join("compose", m.source), true
		}
	}
	return "", false
}

func loadCompose(t *testing.T) *compose {
	t.Helper()
	data, err := os.ReadFile(composeFile)
	if err != nil {
		t.Fatal(err)
	}
	var c compose
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatalf("%s: %v", composeFile, err)
	}
	return &c
}

// agentServices returns the compose agent services, eu's first (they
// start first), each region's in order.
func agentServices(c *compose) []string {
	var out []string
	for _, r := range regions {
		for _, n := range []string{"1", "2"} {
			if _, ok := c.Services["agent-"+r+"-"+n]; ok {
				out = append(out, "agent-"+r+"-"+n)
			}
		}
	}
	return out
}

// secretDir is where compose mounts a service's secrets.
const secretDir = "/run/secrets/"

func TestComposeFile(t *testing.T) {
	c := loadCompose(t)
	want := []string{"envoy", "prometheus", "grafana"}
	for _, r := range regions {
		want = append(want, "redis-"+r, "nats-"+r, "agent-"+r+"-1", "agent-"+r+"-2")
	}
	for _, name := range want {
		if _, ok := c.Services[name]; !ok {
			t.Errorf("%s: no service %s (the names are fixed: other files use them)", composeFile, name)
		}
	}
	configPath := dockerCmdConfig(t)
	readme, err := os.ReadFile("compose/secrets/README.md")
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range c.Secrets {
		if !strings.HasPrefix(s.File, "./secrets/") {
			t.Errorf("secret %s: file %s is not under ./secrets/", name, s.File)
		}
		if !bytes.Contains(readme, []byte("`"+path.Base(s.File)+"`")) || !bytes.Contains(readme, []byte("`"+name+"`")) {
			t.Errorf("secret %s (%s) is not in compose/secrets/README.md", name, s.File)
		}
	}
	// Every bind mount's source exists (secrets are not mounts).
	for name, s := range c.Services {
		for _, m := range s.mounts() {
			if _, err := os.Stat(filepath.Join("compose", m.source)); err != nil {
				t.Errorf("service %s mounts %s: %v", name, m.source, err)
			}
		}
		for _, sec := range s.Secrets {
			if _, ok := c.Secrets[sec]; !ok {
				t.Errorf("service %s uses secret %s, which compose.yaml does not define", name, sec)
			}
		}
	}
	agents := agentServices(c)
	for _, svc := range agents {
		s := c.Services[svc]
		src, ok := s.source(configPath)
		if !ok {
			t.Errorf("service %s mounts nothing at %s, the image's --config", svc, configPath)
			continue
		}
		if want := "compose/agents/" + svc + ".yaml"; src != want {
			t.Errorf("service %s mounts %s as its config, want %s", svc, src, want)
		}
		cfg := loadAgentConfig(t, src)
		r := cfg.Region
		if svc != "agent-"+r+"-"+strings.TrimPrefix(cfg.Agent, r+"-") {
			t.Errorf("service %s runs agent %s/%s", svc, r, cfg.Agent)
		}
		if p, ok := s.source(cfg.Policy); !ok || filepath.Clean(p) != policyFile {
			t.Errorf("service %s: policy %s is not deploy/%s mounted (got %q)", svc, cfg.Policy, policyFile, p)
		}
		if want := "redis-" + r + ":6379"; cfg.Redis.Addr != want {
			t.Errorf("service %s: redis.addr %s, want %s", svc, cfg.Redis.Addr, want)
		}
		if want := []string{"nats://nats-" + r + ":4222"}; !slices.Equal(cfg.Cluster.NATS.URLs, want) {
			t.Errorf("service %s: nats urls %v, want %v (its region's server)", svc, cfg.Cluster.NATS.URLs, want)
		}
		if !slices.Contains(s.DependsOn, "redis-"+r) || !slices.Contains(s.DependsOn, "nats-"+r) {
			t.Errorf("service %s: depends_on %v lacks its region's redis and nats", svc, s.DependsOn)
		}
		if r != coordinatorRegion && !slices.Contains(s.DependsOn, "agent-"+coordinatorRegion+"-1") {
			t.Errorf("service %s: should start after %s's agents (they create the bucket)", svc, coordinatorRegion)
		}
		var wantJoin []string
		for _, o := range agents {
			if o != svc {
				wantJoin = append(wantJoin, o+":"+portOf(t, cfg.Cluster.Members.Bind))
			}
		}
		if got := slices.Sorted(slices.Values(cfg.Cluster.Members.Join)); !slices.Equal(got, slices.Sorted(slices.Values(wantJoin))) {
			t.Errorf("service %s: members.join %v, want every other agent %v", svc, got, wantJoin)
		}
		// Every secret the config names is one the service mounts.
		cc := cfg.Cluster
		for _, f := range []string{cc.NATS.PasswordFile, cc.Members.KeyFile, cc.Coordinator.SignKeyFile, cc.Coordinator.VerifyKeysFile} {
			if f == "" {
				continue
			}
			name, ok := strings.CutPrefix(f, secretDir)
			if !ok || !slices.Contains(s.Secrets, name) {
				t.Errorf("service %s: %s is not one of its secrets %v", svc, f, s.Secrets)
			}
		}
		if !cc.Coordinator.Candidate && slices.Contains(s.Secrets, "coordinator_sign_key") {
			t.Errorf("service %s is no candidate but gets the signing key", svc)
		}
	}
}

// portOf returns the port of host:port.
func portOf(t *testing.T, hostport string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(hostport)
	if err != nil {
		t.Fatalf("%q: %v", hostport, err)
	}
	return p
}

// ---------------------------------------------------------------------
// NATS configs

// natsRoot lays out a NATS service's files as its container sees them,
// under root: the region's config at the path compose mounts it and
// each secret at /run/secrets/<name>. It returns the config's path.
func natsRoot(t *testing.T, c *compose, svc, root string, secretFiles map[string]string) string {
	t.Helper()
	s := c.Services[svc]
	cfgTarget := ""
	for i, a := range s.Command {
		if a == "--config" && i+1 < len(s.Command) {
			cfgTarget = s.Command[i+1]
		}
	}
	src, ok := s.source(cfgTarget)
	if cfgTarget == "" || !ok {
		t.Fatalf("service %s: no --config in %v mounted from the repository", svc, s.Command)
	}
	if want := "compose/nats/" + strings.TrimPrefix(svc, "nats-") + ".conf"; src != want {
		t.Fatalf("service %s mounts %s, want %s", svc, src, want)
	}
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(root, cfgTarget)
	writeFile(t, dst, data)
	for _, name := range s.Secrets {
		writeFile(t, filepath.Join(root, secretDir, name), []byte(secretFiles[name]))
	}
	return dst
}

func writeFile(t *testing.T, p string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// composeAgents lists compose's agents as region/agent, from their
// configs, and which are candidates.
func composeAgents(t *testing.T) (agents, candidates []string) {
	t.Helper()
	files, _ := agentConfigFiles(t)
	for _, p := range files {
		cfg, err := agent.LoadConfig(p)
		if err != nil {
			t.Fatal(err)
		}
		id := cfg.Region + "/" + cfg.Agent
		agents = append(agents, id)
		if cfg.Cluster.Coordinator.Candidate {
			candidates = append(candidates, id)
		}
	}
	slices.Sort(agents)
	slices.Sort(candidates)
	return agents, candidates
}

// TestNATSConfigs loads each region's nats-server config, with the users
// `meridian keys --nats-dir` makes for compose's agents, through
// nats-server's own parser.
func TestNATSConfigs(t *testing.T) {
	c := loadCompose(t)
	tmp := t.TempDir()
	files, _ := makeSecrets(t, c, buildMeridian(t, tmp, "deploy-test"), filepath.Join(tmp, "secrets"))
	secrets := map[string]string{"nats_users": mustRead(t, files["nats_users"])}
	agents, candidates := composeAgents(t)
	type userView struct {
		User, Account      string
		Publish, Subscribe []string
	}
	var first []userView
	for _, r := range regions {
		svc := "nats-" + r
		p := natsRoot(t, c, svc, t.TempDir(), secrets)
		// nats-server's own parser and option checks (the embedded
		// version; TestComposeTopologyNative runs the machine's binary).
		opts, err := server.ProcessConfigFile(p)
		if err != nil {
			t.Errorf("%s: %v", svc, err)
			continue
		}
		if opts.ServerName != svc {
			t.Errorf("%s: server_name %q", svc, opts.ServerName)
		}
		if opts.Cluster.Name != r || opts.Gateway.Name != r {
			t.Errorf("%s: cluster %q, gateway %q: both must be the region's name", svc, opts.Cluster.Name, opts.Gateway.Name)
		}
		var gws []string
		for _, g := range opts.Gateway.Gateways {
			gws = append(gws, g.Name)
			for _, u := range g.URLs {
				if u.Hostname() != "nats-"+g.Name {
					t.Errorf("%s: gateway %s at %s, want nats-%s", svc, g.Name, u, g.Name)
				}
			}
		}
		others := slices.DeleteFunc(slices.Clone(regions), func(x string) bool { return x == r })
		if !slices.Equal(slices.Sorted(slices.Values(gws)), slices.Sorted(slices.Values(others))) {
			t.Errorf("%s: gateways to %v, want %v", svc, gws, others)
		}
		if !opts.JetStream || opts.SystemAccount == "" {
			t.Errorf("%s: JetStream %v, system account %q: clustered JetStream needs both", svc, opts.JetStream, opts.SystemAccount)
		}
		if len(opts.Routes) == 0 {
			t.Errorf("%s: no routes: nats-server refuses clustered JetStream without one", svc)
		}
		var users []userView
		for _, u := range opts.Users {
			v := userView{User: u.Username}
			if u.Account != nil {
				v.Account = u.Account.Name
			}
			if u.Permissions != nil && u.Permissions.Publish != nil {
				v.Publish = u.Permissions.Publish.Allow
			}
			if u.Permissions != nil && u.Permissions.Subscribe != nil {
				v.Subscribe = u.Permissions.Subscribe.Allow
			}
			users = append(users, v)
		}
		sort.Slice(users, func(i, j int) bool { return users[i].User < users[j].User })
		var names []string
		for _, u := range users {
			names = append(names, strings.Replace(u.User, ".", "/", 1))
			id := strings.Replace(u.User, ".", "/", 1)
			own := "meridian." + clusterName + ".report." + u.User
			for _, subj := range u.Publish {
				if strings.Contains(subj, ".report.") && subj != own || strings.Contains(subj, ".ack.") && subj != "meridian."+clusterName+".ack."+u.User {
					t.Errorf("%s: user %s may publish on %s: reports and acks only on its own subjects", svc, u.User, subj)
				}
			}
			if !slices.Contains(u.Publish, own) {
				t.Errorf("%s: user %s may not publish its own reports (%s)", svc, u.User, own)
			}
			writes := slices.Contains(u.Publish, "$KV."+clusterName+"."+clusterName+".>")
			if cand := slices.Contains(candidates, id); writes != cand {
				t.Errorf("%s: user %s writes the bucket %v, is a candidate %v: only candidates may", svc, u.User, writes, cand)
			}
			for _, subj := range u.Publish {
				if strings.Contains(subj, "STREAM.DELETE") || strings.Contains(subj, "STREAM.UPDATE") || strings.Contains(subj, ">") && strings.HasPrefix(subj, "$JS.API.STREAM") {
					t.Errorf("%s: user %s may publish on %s: no agent deletes or reconfigures streams", svc, u.User, subj)
				}
			}
		}
		if !slices.Equal(names, agents) {
			t.Errorf("%s: NATS users %v, want one per compose agent %v", svc, names, agents)
		}
		if first == nil {
			first = users
		} else if fmt.Sprint(users) != fmt.Sprint(first) {
			t.Errorf("%s: users %+v differ from nats-%s's %+v: a supercluster's servers declare the same accounts", svc, users, regions[0], first)
		}
	}
}

// ---------------------------------------------------------------------
// Envoy's descriptors are the policy's

// loadEnvoy parses envoy.yaml into Envoy's own bootstrap proto (unknown
// fields and wrong types are errors) and runs its validation rules.
func loadEnvoy(t *testing.T) *bootstrapv3.Bootstrap {
	t.Helper()
	data, err := os.ReadFile(envoyFile)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("%s: %v", envoyFile, err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatalf("%s: %v", envoyFile, err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		t.Fatalf("%s: not an Envoy v3 bootstrap: %v", envoyFile, err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("%s: %v", envoyFile, err)
	}
	return &b
}

// envoyRateLimit is the ratelimit filter of the listener that has one,
// and that listener's routes.
type envoyRateLimit struct {
	filter *ratelimitv3.RateLimit
	vhosts []*routev3.VirtualHost
}

func findRateLimit(t *testing.T, b *bootstrapv3.Bootstrap) envoyRateLimit {
	t.Helper()
	var found []envoyRateLimit
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				var hcm hcmv3.HttpConnectionManager
				if f.GetTypedConfig() == nil || f.GetTypedConfig().UnmarshalTo(&hcm) != nil {
					continue
				}
				for _, hf := range hcm.GetHttpFilters() {
					var rl ratelimitv3.RateLimit
					if hf.GetTypedConfig() != nil && hf.GetTypedConfig().UnmarshalTo(&rl) == nil {
						found = append(found, envoyRateLimit{filter: &rl, vhosts: hcm.GetRouteConfig().GetVirtualHosts()})
					}
				}
			}
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s: %d ratelimit filters, want 1", envoyFile, len(found))
	}
	return found[0]
}

// routeFor returns the first route of the virtual hosts that matches a
// request for path with headers, as Envoy picks it (prefix and path
// matches, header presence matchers; anything else is an error so the
// test is taught first).
func routeFor(t *testing.T, vhosts []*routev3.VirtualHost, reqPath string, headers map[string]string) (*routev3.VirtualHost, *routev3.Route) {
	t.Helper()
	for _, vh := range vhosts {
		for _, r := range vh.GetRoutes() {
			m := r.GetMatch()
			var ok bool
			switch p := m.GetPathSpecifier().(type) {
			case *routev3.RouteMatch_Prefix:
				ok = strings.HasPrefix(reqPath, p.Prefix)
			case *routev3.RouteMatch_Path:
				ok = reqPath == p.Path
			default:
				t.Fatalf("%s: route %v: path matcher %T not understood by this test", envoyFile, r.GetName(), p)
			}
			for _, h := range m.GetHeaders() {
				pm, isPresent := h.GetHeaderMatchSpecifier().(*routev3.HeaderMatcher_PresentMatch)
				if !isPresent {
					t.Fatalf("%s: header matcher %v not understood by this test", envoyFile, h)
				}
				_, has := headers[h.GetName()]
				if has != (pm.PresentMatch != h.GetInvertMatch()) {
					ok = false
				}
			}
			if ok {
				return vh, r
			}
		}
	}
	return nil, nil
}

// descriptors returns the descriptors Envoy sends for a request that
// takes route r in vh: one per rate_limits entry of the route whose
// actions all produce an entry (an absent header skips the entry, as
// Envoy does). Virtual-host rate limits and actions this test does not
// understand fail it, so it is taught before the config relies on them.
func descriptors(t *testing.T, vh *routev3.VirtualHost, r *routev3.Route, headers map[string]string) [][]region.Entry {
	t.Helper()
	if len(vh.GetRateLimits()) > 0 {
		t.Fatalf("%s: virtual host %s: rate_limits on a virtual host are not understood by this test", envoyFile, vh.GetName())
	}
	var out [][]region.Entry
next:
	for _, rl := range r.GetRoute().GetRateLimits() {
		var entries []region.Entry
		for _, a := range rl.GetActions() {
			switch x := a.GetActionSpecifier().(type) {
			case *routev3.RateLimit_Action_RequestHeaders_:
				v, ok := headers[x.RequestHeaders.GetHeaderName()]
				if !ok {
					continue next
				}
				entries = append(entries, region.Entry{Key: x.RequestHeaders.GetDescriptorKey(), Value: v})
			case *routev3.RateLimit_Action_GenericKey_:
				k := x.GenericKey.GetDescriptorKey()
				if k == "" {
					k = "generic_key"
				}
				entries = append(entries, region.Entry{Key: k, Value: x.GenericKey.GetDescriptorValue()})
			default:
				t.Fatalf("%s: rate limit action %T not understood by this test", envoyFile, x)
			}
		}
		out = append(out, entries)
	}
	return out
}

func TestEnvoyMatchesPolicy(t *testing.T) {
	b := loadEnvoy(t)
	pol := loadPolicy(t, policyFile)
	rl := findRateLimit(t, b)
	f := rl.filter

	domains := map[string]bool{}
	for _, r := range pol.Rules() {
		domains[r.Domain] = true
	}
	if !domains[f.GetDomain()] {
		t.Errorf("ratelimit domain %q is not a domain of %s (%v)", f.GetDomain(), policyFile, domains)
	}

	// The rate limit service: a cluster that exists, speaks HTTP/2 and
	// is eu's agents on their gRPC port.
	svcCluster := f.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName()
	if f.GetRateLimitService().GetTransportApiVersion().String() != "V3" {
		t.Errorf("rate_limit_service.transport_api_version %v, want V3", f.GetRateLimitService().GetTransportApiVersion())
	}
	var cl *clusterv3.Cluster
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() == svcCluster {
			cl = c
		}
	}
	if cl == nil {
		t.Fatalf("the ratelimit filter's cluster %q is not among Envoy's clusters", svcCluster)
	}
	var po httpv3.HttpProtocolOptions
	if a := cl.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]; a == nil || a.UnmarshalTo(&po) != nil ||
		po.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		t.Errorf("cluster %s does not speak HTTP/2 (gRPC needs it)", svcCluster)
	}
	c := loadCompose(t)
	var want, got []string
	var redisTimeout time.Duration
	for _, svc := range agentServices(c) {
		if !strings.HasPrefix(svc, "agent-"+coordinatorRegion+"-") {
			continue
		}
		cfg := loadAgentConfig(t, "compose/agents/"+svc+".yaml")
		want = append(want, svc+":"+portOf(t, cfg.GRPC))
		redisTimeout = max(redisTimeout, time.Duration(cfg.Redis.Timeout))
		if cfg.ResponseHeaders == (f.GetEnableXRatelimitHeaders() != ratelimitv3.RateLimit_OFF) {
			t.Errorf("enable_x_ratelimit_headers %v with the agent's response_headers %v: want exactly one source of rate limit headers", f.GetEnableXRatelimitHeaders(), cfg.ResponseHeaders)
		}
	}
	for _, le := range cl.GetLoadAssignment().GetEndpoints() {
		for _, e := range le.GetLbEndpoints() {
			sa := e.GetEndpoint().GetAddress().GetSocketAddress()
			got = append(got, fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue()))
		}
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("cluster %s endpoints %v, want %s's agents %v", svcCluster, got, coordinatorRegion, want)
	}
	if to := f.GetTimeout().AsDuration(); to <= redisTimeout || to > 50*time.Millisecond {
		t.Errorf("ratelimit timeout %v: want above the agents' Redis timeout %v (their failure modes answer first) and at most 50ms", to, redisTimeout)
	}

	// Every route that proxies is limited, and every descriptor it can
	// produce resolves to a limit of the domain.
	headers := map[string]string{"x-tenant": "acme"}
	routes := 0
	for _, vh := range rl.vhosts {
		for _, r := range vh.GetRoutes() {
			if r.GetRoute() == nil {
				continue
			}
			routes++
			descs := descriptors(t, vh, r, headers)
			if len(descs) == 0 {
				t.Errorf("route %v proxies with no rate limit", r.GetMatch())
			}
			for _, lim := range r.GetRoute().GetRateLimits() {
				if lim.GetStage().GetValue() != f.GetStage() {
					t.Errorf("route %v: rate limit stage %d, the filter's %d: never sent", r.GetMatch(), lim.GetStage().GetValue(), f.GetStage())
				}
			}
			for _, d := range descs {
				if pol.Match(f.GetDomain(), d) == nil {
					t.Errorf("route %v: descriptor %v matches no limit of domain %q in %s", r.GetMatch(), d, f.GetDomain(), policyFile)
				}
			}
		}
	}
	if routes == 0 {
		t.Errorf("%s: no route proxies anywhere", envoyFile)
	}
	// A request without a tenant is refused, not passed unlimited.
	if _, r := routeFor(t, rl.vhosts, "/search", nil); r == nil || r.GetDirectResponse() == nil {
		t.Errorf("a request without x-tenant reaches route %v", r.GetMatch())
	}
}

// ---------------------------------------------------------------------
// The Dockerfile builds the binary as go build does

// dockerInstr is one Dockerfile instruction, continuation lines joined.
type dockerInstr struct {
	line  int
	cmd   string // upper case
	args  string
	stage int // index of the FROM it follows
}

func parseDockerfile(t *testing.T) []dockerInstr {
	t.Helper()
	f, err := os.Open(dockerfileFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		out   []dockerInstr
		cur   strings.Builder
		start int
		stage = -1
	)
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if cur.Len() == 0 && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if cur.Len() == 0 {
			start = n
		}
		if strings.HasPrefix(line, "#") {
			continue // a comment inside a continued instruction
		}
		if s, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(line)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		cmd = strings.ToUpper(cmd)
		if cmd == "FROM" {
			stage++
		}
		out = append(out, dockerInstr{line: start, cmd: cmd, args: strings.TrimSpace(args), stage: stage})
		cur.Reset()
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// shellWords splits a shell command line into words: single and double
// quotes group, nothing is expanded.
func shellWords(s string) ([]string, error) {
	var (
		out   []string
		w     strings.Builder
		in    bool
		quote rune
	)
	for _, c := range s {
		switch {
		case quote != 0 && c == quote:
			quote = 0
		case quote != 0:
			w.WriteRune(c)
		case c == '"' || c == '\'':
			quote, in = c, true
		case c == ' ' || c == '\t':
			if in {
				out = append(out, w.String())
				w.Reset()
				in = false
			}
		default:
			w.WriteRune(c)
			in = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote", quote)
	}
	if in {
		out = append(out, w.String())
	}
	return out, nil
}

// dockerBuild is the Dockerfile's go build: its environment, its
// arguments after `go`, and the Dockerfile's stages.
type dockerBuild struct {
	env, args []string
	out       string // -o
	instrs    []dockerInstr
	buildAt   int // index in instrs
}

func parseDockerBuild(t *testing.T) dockerBuild {
	t.Helper()
	instrs := parseDockerfile(t)
	for i, in := range instrs {
		if in.cmd != "RUN" || !strings.Contains(in.args, "go build") {
			continue
		}
		words, err := shellWords(in.args)
		if err != nil {
			t.Fatalf("%s:%d: %v", dockerfileFile, in.line, err)
		}
		for len(words) > 0 && strings.HasPrefix(words[0], "--mount=") {
			words = words[1:]
		}
		b := dockerBuild{instrs: instrs, buildAt: i}
		for len(words) > 0 && strings.Contains(words[0], "=") && !strings.HasPrefix(words[0], "-") {
			b.env = append(b.env, words[0])
			words = words[1:]
		}
		if len(words) < 2 || words[0] != "go" || words[1] != "build" {
			t.Fatalf("%s:%d: the build is not one `go build` command: %q", dockerfileFile, in.line, in.args)
		}
		b.args = words[1:]
		for j, a := range b.args {
			if a == "-o" && j+1 < len(b.args) {
				b.out = b.args[j+1]
			}
		}
		return b
	}
	t.Fatalf("%s: no RUN … go build", dockerfileFile)
	return dockerBuild{}
}

// jsonArgs parses an exec-form instruction argument (["a", "b"]).
func jsonArgs(t *testing.T, in dockerInstr) []string {
	t.Helper()
	var out []string
	if err := json.Unmarshal([]byte(in.args), &out); err != nil {
		t.Fatalf("%s:%d: %s not in exec form: %v", dockerfileFile, in.line, in.cmd, err)
	}
	return out
}

// dockerCmdConfig is the --config of the image's CMD: where compose and
// Kubernetes must mount the agent config.
func dockerCmdConfig(t *testing.T) string {
	t.Helper()
	var cmd []string
	for _, in := range parseDockerfile(t) {
		if in.cmd == "CMD" {
			cmd = jsonArgs(t, in)
		}
	}
	if len(cmd) != 2 || cmd[0] != "--config" {
		t.Fatalf("%s: CMD %q, want [--config PATH]", dockerfileFile, cmd)
	}
	return cmd[1]
}

func TestDockerfile(t *testing.T) {
	b := parseDockerBuild(t)
	if !slices.Contains(b.env, "CGO_ENABLED=0") {
		t.Errorf("go build env %v: want CGO_ENABLED=0 (the final image has no libc)", b.env)
	}
	if !slices.Contains(b.args, "-trimpath") {
		t.Errorf("go build %v: want -trimpath", b.args)
	}
	if b.args[len(b.args)-1] != "./cmd/meridian" {
		t.Errorf("go build %v: want ./cmd/meridian last", b.args)
	}
	ldflags := ""
	for j, a := range b.args {
		if a == "-ldflags" && j+1 < len(b.args) {
			ldflags = b.args[j+1]
		}
	}
	if !strings.Contains(ldflags, "-X main.version=${VERSION}") {
		t.Errorf("go build -ldflags %q: want -X main.version=${VERSION}", ldflags)
	}
	buildStage := b.instrs[b.buildAt].stage
	hasVersionArg := false
	for _, in := range b.instrs[:b.buildAt] {
		if in.stage == buildStage && in.cmd == "ARG" && strings.HasPrefix(in.args, "VERSION") {
			hasVersionArg = true
		}
	}
	if !hasVersionArg {
		t.Errorf("no ARG VERSION in the build stage before the go build")
	}

	// The builder copies every directory the binary is built from.
	copied := map[string]bool{}
	var final []dockerInstr
	for _, in := range b.instrs {
		if in.cmd == "COPY" && in.stage == buildStage {
			f := strings.Fields(in.args)
			for _, src := range f[:max(len(f)-1, 0)] {
				copied[strings.TrimSuffix(src, "/")] = true
			}
		}
		if in.stage == b.instrs[len(b.instrs)-1].stage {
			final = append(final, in)
		}
	}
	for _, dir := range moduleDirs(t) {
		if !copied[dir] {
			t.Errorf("cmd/meridian imports packages under %s/, which the Dockerfile does not COPY", dir)
		}
	}
	if !copied["go.mod"] || !copied["go.sum"] {
		t.Errorf("the build stage does not copy go.mod and go.sum")
	}

	// The final image: distroless (or scratch), non-root, `meridian agent`.
	var user string
	var entry []string
	var copiedBin string
	for _, in := range final {
		switch in.cmd {
		case "FROM":
			if !strings.HasPrefix(in.args, "gcr.io/distroless/static") && in.args != "scratch" {
				t.Errorf("final stage FROM %s: want distroless static or scratch", in.args)
			}
		case "USER":
			user = in.args
		case "ENTRYPOINT":
			entry = jsonArgs(t, in)
		case "COPY":
			if f := strings.Fields(in.args); len(f) == 3 && strings.HasPrefix(f[0], "--from=") && f[1] == b.out {
				copiedBin = f[2]
			}
		}
	}
	uid, _, _ := strings.Cut(user, ":")
	if n, err := strconv.Atoi(uid); (err != nil && uid != "nonroot") || (err == nil && n == 0) || user == "" {
		t.Errorf("final stage USER %q: want a non-root user (65532, distroless's nonroot)", user)
	}
	if len(entry) != 2 || entry[0] != copiedBin || entry[1] != "agent" {
		t.Errorf("ENTRYPOINT %q: want [%s agent] (the binary copied from %s)", entry, copiedBin, b.out)
	}

	// main.version exists, as a string variable -X can set.
	if !hasStringVar(t, filepath.Join(repoRoot, "cmd", "meridian"), "main", "version") {
		t.Errorf("cmd/meridian has no package-level string variable main.version for -X to set")
	}

	// The ARG GO_VERSION is go.mod's.
	gomod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	for _, in := range b.instrs {
		if in.cmd == "ARG" && strings.HasPrefix(in.args, "GO_VERSION=") && goVersion != nil && strings.TrimPrefix(in.args, "GO_VERSION=") != string(goVersion[1]) {
			t.Errorf("ARG %s, but go.mod says go %s", in.args, goVersion[1])
		}
	}
}

// moduleDirs returns the top-level directories of the module packages
// cmd/meridian is built from.
func moduleDirs(t *testing.T) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "./cmd/meridian")
	cmd.Dir = repoRoot
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const module = "github.com/meridian-quota/meridian/"
	dirs := map[string]bool{}
	for _, l := range strings.Fields(string(out)) {
		if rest, ok := strings.CutPrefix(l, module); ok {
			dir, _, _ := strings.Cut(rest, "/")
			dirs[dir] = true
		}
	}
	return slices.Sorted(func(yield func(string) bool) {
		for d := range dirs {
			if !yield(d) {
				return
			}
		}
	})
}

// hasStringVar reports whether package pkg in dir declares a
// package-level variable name of type string (explicit, or a string
// literal's).
func hasStringVar(t *testing.T, dir, pkg, name string) bool {
	t.Helper()
	fset := token.NewFileSet()
	matches, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range matches {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		if f.Name.Name != pkg {
			continue
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, s := range gd.Specs {
				vs := s.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if n.Name != name {
						continue
					}
					if id, ok := vs.Type.(*ast.Ident); ok && id.Name == "string" {
						return true
					}
					if vs.Type == nil && i < len(vs.Values) {
						if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
							return true
						}
					}
				}
			}
		}
	}
	return false
}

// ---------------------------------------------------------------------
// Kubernetes

// k8sDocs returns every document of the YAML files in dir, decoded.
func k8sDocs(t *testing.T, dir string) []map[string]any {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, p := range files {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		for {
			var doc any
			if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			if m, ok := doc.(map[string]any); ok && m["kind"] != nil {
				out = append(out, m) // a resource (JSON patches are lists)
			}
		}
	}
	return out
}

// dig walks m along keys (map keys, or list indexes as ints).
func dig(m any, keys ...any) any {
	for _, k := range keys {
		switch k := k.(type) {
		case string:
			mm, ok := m.(map[string]any)
			if !ok {
				return nil
			}
			m = mm[k]
		case int:
			l, ok := m.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			m = l[k]
		}
	}
	return m
}

func TestKubernetes(t *testing.T) {
	// Every file a kustomization names exists.
	kusts, err := filepath.Glob("kubernetes/*/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	more, _ := filepath.Glob(k8sOverlaysDir + "/*/kustomization.yaml")
	kusts = append(kusts, more...)
	if len(kusts) != 1+len(regions) {
		t.Fatalf("kustomizations %v: want the base and one overlay per region", kusts)
	}
	for _, k := range kusts {
		var kz map[string]any
		data, _ := os.ReadFile(k)
		if err := yaml.Unmarshal(data, &kz); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		var refs []string
		for _, r := range asList(kz["resources"]) {
			refs = append(refs, fmt.Sprint(r))
		}
		for _, g := range asList(kz["configMapGenerator"]) {
			for _, f := range asList(dig(g, "files")) {
				refs = append(refs, fmt.Sprint(f))
			}
		}
		for _, p := range asList(kz["patches"]) {
			if s, ok := dig(p, "path").(string); ok {
				refs = append(refs, s)
			}
		}
		for _, r := range refs {
			if _, err := os.Stat(filepath.Join(filepath.Dir(k), r)); err != nil {
				t.Errorf("%s names %s: %v", k, r, err)
			}
		}
	}

	base := k8sDocs(t, k8sBaseDir)
	var sts map[string]any
	kinds := map[string]bool{}
	for _, d := range base {
		kinds[fmt.Sprint(d["kind"])] = true
		if d["kind"] == "StatefulSet" {
			sts = d
		}
	}
	for _, k := range []string{"StatefulSet", "Service", "PodDisruptionBudget", "NetworkPolicy", "ServiceMonitor"} {
		if !kinds[k] {
			t.Errorf("%s: no %s", k8sBaseDir, k)
		}
	}
	if sts == nil {
		t.FailNow()
	}
	replicas, _ := dig(sts, "spec", "replicas").(int)
	ctr := dig(sts, "spec", "template", "spec", "containers", 0)
	if got := fmt.Sprint(dig(ctr, "readinessProbe", "httpGet", "path")); got != "/readyz" {
		t.Errorf("readiness probe %s, want /readyz", got)
	}
	if got := fmt.Sprint(dig(ctr, "livenessProbe", "httpGet", "path")); got != "/healthz" {
		t.Errorf("liveness probe %s, want /healthz", got)
	}
	// Termination (issue 17, defect 9): a preStop sleep, then the agent's
	// drain_delay, then in-flight requests and the last report, all within
	// the grace period.
	preStop, _ := dig(ctr, "lifecycle", "preStop", "sleep", "seconds").(int)
	grace, _ := dig(sts, "spec", "template", "spec", "terminationGracePeriodSeconds").(int)
	drain := agent.DefaultConfig().DrainDelay.D()
	if preStop < 1 {
		t.Errorf("the agent container has no preStop sleep (lifecycle.preStop.sleep.seconds %v)", dig(ctr, "lifecycle"))
	}
	if need := time.Duration(preStop)*time.Second + drain + 10*time.Second; time.Duration(grace)*time.Second < need {
		t.Errorf("terminationGracePeriodSeconds %d: below the preStop sleep (%ds) + drain_delay (%s) + 10 s for in-flight requests and the last report", grace, preStop, drain)
	}
	if dig(sts, "spec", "template", "spec", "securityContext", "runAsNonRoot") != true || dig(ctr, "securityContext", "readOnlyRootFilesystem") != true {
		t.Errorf("the agent must run non-root on a read-only root filesystem")
	}
	// Mount paths of the base, plus eu's signing key patch.
	mounts := map[string]bool{}
	for _, m := range asList(dig(ctr, "volumeMounts")) {
		mounts[fmt.Sprint(dig(m, "mountPath"))] = true
	}
	args := fmt.Sprint(dig(ctr, "args"))
	if !strings.Contains(args, "$(POD_NAME)") {
		t.Errorf("container args %s: each pod must read its own config", args)
	}

	advertise := map[string]string{} // advertise address → config
	var configs []*agent.Config
	for _, r := range regions {
		dir := filepath.Join(k8sOverlaysDir, r)
		files, _ := filepath.Glob(filepath.Join(dir, "agents", "*.yaml"))
		if len(files) != replicas {
			t.Errorf("%s: %d agent configs for %d replicas", dir, len(files), replicas)
		}
		lbIPs := map[string]string{} // pod → loadBalancerIP
		for _, d := range k8sDocs(t, dir) {
			if d["kind"] == "Service" && dig(d, "spec", "type") == "LoadBalancer" {
				lbIPs[fmt.Sprint(dig(d, "spec", "selector", "statefulset.kubernetes.io/pod-name"))] = fmt.Sprint(dig(d, "spec", "loadBalancerIP"))
			}
		}
		for i := range replicas {
			pod := fmt.Sprintf("meridian-agent-%d", i)
			p := filepath.Join(dir, "agents", pod+".yaml")
			cfg := loadAgentConfig(t, p)
			configs = append(configs, cfg)
			if cfg.Region != r || cfg.Agent != fmt.Sprintf("%s-%d", r, i) || cfg.Agents != replicas {
				t.Errorf("%s: region %s agent %s agents %d, want %s, %s-%d, %d", p, cfg.Region, cfg.Agent, cfg.Agents, r, r, i, replicas)
			}
			adv := cfg.Cluster.Members.Advertise
			if host, _, _ := net.SplitHostPort(adv); host != lbIPs[pod] {
				t.Errorf("%s: advertise %s, but pod %s's gossip LoadBalancer is %s", p, adv, pod, lbIPs[pod])
			}
			advertise[adv] = p
			// Every file the config names is mounted.
			cc := cfg.Cluster
			for _, f := range []string{cfg.Policy, cc.NATS.PasswordFile, cc.Members.KeyFile, cc.Coordinator.SignKeyFile, cc.Coordinator.VerifyKeysFile} {
				if f == "" {
					continue
				}
				dirOf := filepath.Dir(f)
				if !mounts[dirOf] && !(r == coordinatorRegion && dirOf == "/etc/meridian/secrets/coordinator-sign") {
					t.Errorf("%s: %s is in no volume the StatefulSet mounts", p, f)
				}
			}
		}
	}
	for _, cfg := range configs {
		var want []string
		for a := range advertise {
			if a != cfg.Cluster.Members.Advertise {
				want = append(want, a)
			}
		}
		slices.Sort(want)
		if got := slices.Sorted(slices.Values(cfg.Cluster.Members.Join)); !slices.Equal(got, want) {
			t.Errorf("agent %s/%s joins %v, want every other agent %v", cfg.Region, cfg.Agent, got, want)
		}
	}
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

// ---------------------------------------------------------------------
// The compose topology, natively

// natsMinVersion is the oldest nats-server Meridian supports.
var natsMinVersion = [2]int{2, 9}

// topology maps each compose service's container ports to the loopback
// addresses this run gives them, allocating on first use.
type topology struct {
	t     *testing.T
	addrs map[string]map[int]string // service → container port → 127.0.0.1:port
	// secrets maps a compose secret name to the file made for it.
	secrets map[string]string
	c       *compose
	used    map[int]bool // ports handed out
}

func (tp *topology) addr(service string, port int) string {
	m := tp.addrs[service]
	if m == nil {
		if _, ok := tp.c.Services[service]; !ok {
			tp.t.Fatalf("address of %s:%d: no such compose service", service, port)
		}
		m = map[int]string{}
		tp.addrs[service] = m
	}
	if a, ok := m[port]; ok {
		return a
	}
	a := fmt.Sprintf("127.0.0.1:%d", tp.freePort())
	m[port] = a
	return a
}

// freePort returns a loopback port free for TCP and UDP a moment ago
// (memberlist binds both), below the kernel's ephemeral range where it
// can: a port from that range can be taken, between this choice and the
// process binding it, by any outgoing connection of the other processes
// here (NATS gateways and routes, agents' clients).
func (tp *topology) freePort() int {
	tp.t.Helper()
	lo, hi := 20000, 32767
	if data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(data)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n-1 < hi {
				hi = n - 1
			}
		}
	}
	for range 1000 {
		port := 0 // the kernel's choice, when the range below is too small
		if hi-lo > 1000 {
			port = lo + int(randUint32(tp.t)%uint32(hi-lo))
		}
		if tp.used[port] {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		port = l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port))
		l.Close()
		if err == nil {
			u.Close()
			tp.used[port] = true
			return port
		}
	}
	tp.t.Fatal("no loopback port free for TCP and UDP")
	return 0
}

func randUint32(t *testing.T) uint32 {
	var b [4]byte
	if _, err := crand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

var (
	urlAddrRe  = regexp.MustCompile(`nats://([A-Za-z0-9.-]+):(\d+)`)
	bindAddrRe = regexp.MustCompile(`\b0\.0\.0\.0:(\d+)`)
)

// rewrite maps one string of service svc's config from the compose
// network to this run: "0.0.0.0:P" → svc's address for P, "host:P" and
// "nats://host:P" for a compose service → its address, a compose secret's
// path → its file, a bind mount's target → its source. Anything else is
// returned unchanged.
func (tp *topology) rewrite(svc, s string) string {
	if name, ok := strings.CutPrefix(s, secretDir); ok {
		if !slices.Contains(tp.c.Services[svc].Secrets, name) {
			tp.t.Fatalf("service %s names secret %s, which it does not mount", svc, s)
		}
		return tp.secrets[name]
	}
	if src, ok := tp.c.Services[svc].source(s); ok {
		abs, err := filepath.Abs(src)
		if err != nil {
			tp.t.Fatal(err)
		}
		return abs
	}
	s = bindAddrRe.ReplaceAllStringFunc(s, func(m string) string {
		p, _ := strconv.Atoi(bindAddrRe.FindStringSubmatch(m)[1])
		return tp.addr(svc, p)
	})
	s = urlAddrRe.ReplaceAllStringFunc(s, func(m string) string {
		sm := urlAddrRe.FindStringSubmatch(m)
		p, _ := strconv.Atoi(sm[2])
		return "nats://" + tp.addr(sm[1], p)
	})
	if host, port, err := net.SplitHostPort(s); err == nil {
		if _, ok := tp.c.Services[host]; ok {
			p, _ := strconv.Atoi(port)
			return tp.addr(host, p)
		}
	}
	return s
}

// rewriteYAML rewrites every scalar value (not keys) of an agent config.
func (tp *topology) rewriteYAML(svc string, data []byte) []byte {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		tp.t.Fatal(err)
	}
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		n.HeadComment, n.LineComment, n.FootComment = "", "", "" // prose, not config
		if n.Kind == yaml.MappingNode {
			for i := 0; i < len(n.Content); i += 2 {
				k := n.Content[i]
				k.HeadComment, k.LineComment, k.FootComment = "", "", ""
			}
		}
		switch n.Kind {
		case yaml.MappingNode:
			for i := 1; i < len(n.Content); i += 2 {
				walk(n.Content[i])
			}
		case yaml.ScalarNode:
			n.Value = tp.rewrite(svc, n.Value)
		default:
			for _, c := range n.Content {
				walk(c)
			}
		}
	}
	walk(&doc)
	out, err := yaml.Marshal(&doc)
	if err != nil {
		tp.t.Fatal(err)
	}
	return out
}

// setYAML sets the scalar at path (mapping keys from the top) in a YAML
// document, failing the test if the path is not there.
func setYAML(t *testing.T, data []byte, value string, path ...string) []byte {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	n := doc.Content[0]
	for _, key := range path {
		var next *yaml.Node
		for i := 0; n.Kind == yaml.MappingNode && i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == key {
				next = n.Content[i+1]
			}
		}
		if next == nil {
			t.Fatalf("no %s in:\n%s", strings.Join(path, "."), data)
		}
		n = next
	}
	if n.Kind != yaml.ScalarNode {
		t.Fatalf("%s is not a scalar", strings.Join(path, "."))
	}
	n.Value = value
	out, err := yaml.Marshal(&doc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// leftovers fails if text still addresses a compose service (host:port)
// or binds 0.0.0.0: a field the rewrite missed.
func (tp *topology) leftovers(what, text string) {
	for name := range tp.c.Services {
		if regexp.MustCompile(`\b` + regexp.QuoteMeta(name) + `:\d`).MatchString(text) {
			tp.t.Fatalf("%s: still addresses %s after the rewrite:\n%s", what, name, text)
		}
	}
	if strings.Contains(text, "0.0.0.0") {
		tp.t.Fatalf("%s: still binds 0.0.0.0 after the rewrite:\n%s", what, text)
	}
}

// stripComments drops # comments from a NATS config (outside quotes).
func stripComments(conf string) string {
	var b strings.Builder
	for _, line := range strings.Split(conf, "\n") {
		inQuote := false
		for i, c := range line {
			if c == '"' {
				inQuote = !inQuote
			}
			if c == '#' && !inQuote {
				line = line[:i]
				break
			}
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

// proc is a supervised process: restarted when it exits before the test
// stops it, as compose's restart: unless-stopped does.
type proc struct {
	name, bin, log string
	args           []string
	dir            string

	mu       sync.Mutex
	cmd      *exec.Cmd
	restarts int
	exit     string // the last log line before the latest restart
	stopping bool
	done     chan struct{}
}

const maxRestarts = 20

func startProc(t *testing.T, name, dir, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, bin: bin, args: args, dir: dir, log: filepath.Join(dir, name+".log"), done: make(chan struct{})}
	first := make(chan error, 1)
	go p.run(first)
	if err := <-first; err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	return p
}

// stopAll stops procs at once (an agent's drain takes up to Δ).
func stopAll(procs []*proc) {
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.stop(10 * time.Second)
		}()
	}
	wg.Wait()
}

func (p *proc) run(first chan<- error) {
	defer close(p.done)
	for {
		logf, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err == nil {
			cmd := exec.Command(p.bin, p.args...)
			cmd.Dir = p.dir
			cmd.Stdout, cmd.Stderr = logf, logf
			setDeathSignal(cmd)
			p.mu.Lock()
			if p.stopping {
				p.mu.Unlock()
				logf.Close()
				return
			}
			err = cmd.Start()
			if err == nil {
				p.cmd = cmd
			}
			p.mu.Unlock()
			logf.Close()
		}
		if first != nil {
			first <- err
			first = nil
		}
		if err != nil {
			return
		}
		_ = p.cmd.Wait()
		p.mu.Lock()
		stop := p.stopping || p.restarts >= maxRestarts
		if !stop {
			p.restarts++
			p.exit = p.tail(1)
		}
		p.mu.Unlock()
		if stop {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// stop ends the process: SIGTERM, then SIGKILL after grace.
func (p *proc) stop(grace time.Duration) {
	p.mu.Lock()
	p.stopping = true
	cmd := p.cmd
	p.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		_ = cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-p.done:
	case <-time.After(grace):
		p.mu.Lock()
		cmd = p.cmd
		p.mu.Unlock()
		_ = cmd.Process.Kill()
		<-p.done
	}
}

func (p *proc) restartCount() (int, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.restarts, p.exit
}

// tail returns the last n lines of the process's log.
func (p *proc) tail(n int) string {
	data, err := os.ReadFile(p.log)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// poll calls check until it returns nil or the deadline passes, then
// fails the test with check's last error.
func poll(t *testing.T, what string, timeout time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func httpJSON(url string, v any) error {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// buildMeridian builds cmd/meridian with the Dockerfile's -ldflags
// (VERSION set) into dir. It keeps this environment's cgo setting and
// source paths instead of the Dockerfile's CGO_ENABLED=0 and -trimpath
// (which TestDockerfile checks): those change every package's build cache
// key, and would make this test compile the whole dependency tree again
// (minutes on two cores) rather than link what go vet and go build
// already compiled.
func buildMeridian(t *testing.T, dir, version string) string {
	t.Helper()
	b := parseDockerBuild(t)
	bin := filepath.Join(dir, "meridian")
	args := []string{"build"}
	for i := 1; i < len(b.args); i++ {
		switch a := b.args[i]; {
		case a == "-trimpath":
		case a == "-o" && i+1 < len(b.args):
			args = append(args, "-o", bin)
			i++
		default:
			args = append(args, strings.ReplaceAll(a, "${VERSION}", version))
		}
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = repoRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return bin
}

// makeSecrets writes a file for every compose secret, as
// compose/secrets/README.md makes them, into dir.
func makeSecrets(t *testing.T, c *compose, bin, dir string) (files map[string]string, natsPass map[string]string) {
	t.Helper()
	agents, candidates := composeAgents(t)
	cmd := exec.Command(bin, "keys", "--nats-dir", dir, "--cluster", clusterName,
		"--agents", strings.Join(agents, ","), "--candidates", strings.Join(candidates, ","))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("meridian keys: %v\n%s", err, stderr.Bytes())
	}
	keys := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if name, key, ok := strings.Cut(l, " "); ok {
			keys[name] = strings.TrimSpace(key)
		}
	}
	content := map[string]string{
		"gossip.keys":     keys["gossip-key"] + "\n",
		"coordinator.key": keys["coordinator-sign-key"] + "\n",
		"coordinator.pub": keys["coordinator-verify-key"] + "\n",
	}
	natsPass = map[string]string{}
	for _, a := range agents {
		user := strings.Replace(a, "/", ".", 1)
		natsPass[user] = strings.TrimSpace(mustRead(t, filepath.Join(dir, "nats-"+user+".password")))
	}
	files = map[string]string{}
	for name, s := range c.Secrets {
		base := path.Base(s.File)
		p := filepath.Join(dir, base)
		if data, ok := content[base]; ok && strings.TrimSpace(data) != "" {
			writeFile(t, p, []byte(data))
		} else if _, err := os.Stat(p); err != nil { // written by keys --nats-dir
			t.Fatalf("secret %s (%s): neither this test nor meridian keys made it", name, base)
		}
		files[name] = p
	}
	return files, natsPass
}

func randomHex(t *testing.T, n int) string {
	b := make([]byte, n)
	if _, err := crand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// natsServerVersion checks the nats-server binary is at least 2.9.
func natsServerVersion(t *testing.T, bin string) string {
	t.Helper()
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v", bin, err)
	}
	m := regexp.MustCompile(`v(\d+)\.(\d+)\.\S+`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("%s --version: %q", bin, out)
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	if major < natsMinVersion[0] || major == natsMinVersion[0] && minor < natsMinVersion[1] {
		t.Fatalf("nats-server %s: Meridian needs %d.%d or later", m[0], natsMinVersion[0], natsMinVersion[1])
	}
	return m[0]
}

// TestComposeTopologyNative runs compose.yaml's topology without Docker:
// per region a private redis-server and a nats-server from the region's
// compose NATS config (ports remapped, same cluster names, gateways,
// JetStream and users), and the six agents as `meridian agent`
// processes built as the Dockerfile builds them, from the compose agent
// configs with only addresses and secret paths rewritten, the secrets
// made with `meridian keys`. Agents that exit are restarted, as compose
// does. It checks that the bucket lands in eu, that one eu agent is
// elected coordinator, that every agent applies a table, and that Envoy's
// descriptors are decided through eu's and us's agents.
func TestComposeTopologyNative(t *testing.T) {
	testenv.SkipShort(t, "starts three Redis, three NATS servers and six agents")
	natsBin, err := exec.LookPath("nats-server")
	testenv.MustOrSkip(t, err, "nats-server not found")
	natsVersion := natsServerVersion(t, natsBin)
	began := time.Now()

	c := loadCompose(t)
	tmp := t.TempDir()
	bin := buildMeridian(t, tmp, "deploy-test")
	if out, err := exec.Command(bin, "version").Output(); err != nil || strings.TrimSpace(string(out)) != "meridian deploy-test" {
		t.Fatalf("meridian version: %q, %v: -X main.version did not take", out, err)
	}
	built := time.Since(began)
	secrets, natsPass := makeSecrets(t, c, bin, filepath.Join(tmp, "secrets"))
	tp := &topology{t: t, addrs: map[string]map[int]string{}, secrets: secrets, c: c, used: map[int]bool{}}

	// Agents stop first (they flush a last report over NATS), all at once.
	var natsProcs, agentProcs []*proc
	t.Cleanup(func() {
		stopAll(agentProcs)
		stopAll(natsProcs)
	})
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range append(natsProcs, agentProcs...) {
				n, _ := p.restartCount()
				t.Logf("--- %s (restarted %d times), last lines of %s:\n%s", p.name, n, p.log, p.tail(30))
			}
		}
	})

	// Redis: one private server per region; redis-R:6379 is its address.
	for _, r := range regions {
		srv := testenv.StartRedis(t)
		tp.addrs["redis-"+r] = map[int]string{6379: srv.Addr}
	}

	// NATS: each region's config as its container sees it, addresses
	// rewritten, JetStream's store in the service's root.
	storeRe := regexp.MustCompile(`(?m)^(\s*store_dir:\s*)(\S+)`)
	for _, r := range regions {
		svc := "nats-" + r
		root := filepath.Join(tmp, svc)
		cfgPath := natsRoot(t, c, svc, root, map[string]string{"nats_users": mustRead(t, secrets["nats_users"])})
		conf := stripComments(mustRead(t, cfgPath))
		conf = storeRe.ReplaceAllStringFunc(conf, func(m string) string {
			sm := storeRe.FindStringSubmatch(m)
			return sm[1] + filepath.Join(root, sm[2])
		})
		conf = tp.rewrite(svc, conf)
		tp.leftovers(cfgPath, conf)
		writeFile(t, cfgPath, []byte(conf))
		natsProcs = append(natsProcs, startProc(t, svc, root, natsBin, "--config", cfgPath))
	}
	// Ready: clients served, both gateways up, a JetStream meta leader.
	for _, r := range regions {
		mon := "http://" + tp.addr("nats-"+r, 8222)
		poll(t, "nats-"+r+" gateways and JetStream", 30*time.Second, func() error {
			var gw struct {
				Outbound map[string]any `json:"outbound_gateways"`
				Inbound  map[string]any `json:"inbound_gateways"`
			}
			if err := httpJSON(mon+"/gatewayz", &gw); err != nil {
				return err
			}
			if len(gw.Outbound) != len(regions)-1 || len(gw.Inbound) != len(regions)-1 {
				return fmt.Errorf("gateways out %d, in %d", len(gw.Outbound), len(gw.Inbound))
			}
			var js struct {
				Meta struct {
					Leader string `json:"leader"`
				} `json:"meta_cluster"`
			}
			if err := httpJSON(mon+"/jsz", &js); err != nil {
				return err
			}
			if js.Meta.Leader == "" {
				return errors.New("no JetStream meta leader")
			}
			return nil
		})
	}
	natsUp := time.Since(began)

	// The agents, eu's first, as compose orders them.
	configPath := dockerCmdConfig(t)
	entry := []string{"agent"}
	agents := agentServices(c)
	for _, svc := range agents {
		s := c.Services[svc]
		src, ok := s.source(configPath)
		if !ok {
			t.Fatalf("service %s mounts no config at %s", svc, configPath)
		}
		root := filepath.Join(tmp, svc)
		data := tp.rewriteYAML(svc, []byte(mustRead(t, src)))
		tp.leftovers(src, string(data))
		// The compose timeout (5 ms) is for Redis on its own host; here
		// three Redis, three NATS servers and six agents share the test
		// machine with the other packages' race tests, and a Redis call
		// past 5 ms hands the decisions to the failure modes (seen in CI).
		data = setYAML(t, data, "50ms", "redis", "timeout")
		p := filepath.Join(root, "agent.yaml")
		writeFile(t, p, data)
		loadAgentConfig(t, p)
		agentProcs = append(agentProcs, startProc(t, svc, root, bin, append(entry, "--config", p)...))
	}

	// One coordinator, in eu; every agent connected, seeing all six
	// members, and running a table of its term.
	var views map[string]agent.TableView
	poll(t, "coordinator elected and a table applied everywhere", 45*time.Second, func() error {
		views = map[string]agent.TableView{}
		leaders := 0
		for _, svc := range agents {
			var v agent.TableView
			if err := httpJSON("http://"+tp.addr(svc, 8080)+"/v1/table", &v); err != nil {
				return fmt.Errorf("%s: %w", svc, err)
			}
			cs := v.Cluster
			switch {
			case cs == nil:
				return fmt.Errorf("%s: no cluster view", svc)
			case !cs.Connected:
				return fmt.Errorf("%s: not connected to NATS", svc)
			case cs.Coordinator == "":
				return fmt.Errorf("%s: no coordinator", svc)
			case !v.HasTable || v.Term == 0:
				return fmt.Errorf("%s: no table applied (term %d)", svc, v.Term)
			}
			for _, r := range regions {
				if cs.Members[r] != 2 {
					return fmt.Errorf("%s: members %v, want 2 per region", svc, cs.Members)
				}
			}
			if cs.Leader {
				leaders++
			}
			views[svc] = v
		}
		if leaders != 1 {
			return fmt.Errorf("%d agents lead", leaders)
		}
		return nil
	})
	coord := views[agents[0]].Cluster.Coordinator
	for svc, v := range views {
		if v.Cluster.Coordinator != coord {
			t.Errorf("%s sees coordinator %s, %s sees %s", svc, v.Cluster.Coordinator, agents[0], coord)
		}
	}
	if !strings.HasPrefix(coord, coordinatorRegion+"/") {
		t.Errorf("coordinator %s is not in %s", coord, coordinatorRegion)
	}
	elected := time.Since(began)

	// The bucket is in eu's NATS cluster, and us-1's user may not
	// create streams (why it could not have landed elsewhere).
	checkBucket(t, tp.addr("nats-us", 4222), natsPass)

	// Decisions: the descriptors Envoy sends, through eu-1 and us-1.
	checkDecisions(t, tp, loadPolicy(t, policyFile))

	var restarts []string
	for _, p := range append(natsProcs, agentProcs...) {
		if n, exit := p.restartCount(); n > 0 {
			restarts = append(restarts, fmt.Sprintf("%s×%d (%s)", p.name, n, exit))
		}
	}
	t.Logf("nats-server %s; built in %v, NATS up at %v, coordinator %s elected and tables applied at %v, done at %v; restarts: %v",
		natsVersion, built.Round(time.Millisecond), natsUp.Round(time.Millisecond), coord, elected.Round(time.Millisecond),
		time.Since(began).Round(time.Millisecond), restarts)
}

func mustRead(t *testing.T, p string) string {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// checkBucket checks from region us that the KV bucket's stream is placed
// in eu, and that us-1's user cannot create a stream.
func checkBucket(t *testing.T, usAddr string, pass map[string]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, err := nats.Connect("nats://"+usAddr, nats.UserInfo("us.us-1", pass["us.us-1"]),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})) // the permission violation below is expected
	if err != nil {
		t.Fatalf("connect to nats-us as us.us-1: %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, "KV_"+clusterName)
	if err != nil {
		t.Fatalf("bucket %s: %v", clusterName, err)
	}
	if cl := st.CachedInfo().Cluster; cl == nil || cl.Name != coordinatorRegion {
		t.Errorf("bucket %s is placed in %+v, want NATS cluster %s", clusterName, cl, coordinatorRegion)
	}
	short, cancel2 := context.WithTimeout(ctx, 2*time.Second)
	defer cancel2()
	if _, err := js.CreateKeyValue(short, jetstream.KeyValueConfig{Bucket: "probe_" + randomHex(t, 4)}); err == nil {
		t.Errorf("user us.us-1 created a bucket: a non-eu agent could place the bucket outside eu")
	}
}

// checkDecisions asks eu-1 and us-1 for the decisions Envoy asks for, and
// checks that each region admits a tenant up to its share, then denies;
// that the search limit (the tighter one) denies first on /search; and
// that the agents send the RateLimit fields Envoy passes on.
func checkDecisions(t *testing.T, tp *topology, pol *region.Policy) {
	t.Helper()
	b := loadEnvoy(t)
	rl := findRateLimit(t, b)
	domain := rl.filter.GetDomain()
	request := func(reqPath, tenant string) *rlsv3.RateLimitRequest {
		vh, r := routeFor(t, rl.vhosts, reqPath, map[string]string{"x-tenant": tenant})
		if r == nil || r.GetRoute() == nil {
			t.Fatalf("no proxied route for %s", reqPath)
		}
		req := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: 1}
		for _, d := range descriptors(t, vh, r, map[string]string{"x-tenant": tenant}) {
			rd := &commonv3.RateLimitDescriptor{}
			for _, e := range d {
				rd.Entries = append(rd.Entries, &commonv3.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value})
			}
			req.Descriptors = append(req.Descriptors, rd)
		}
		return req
	}
	client := func(svc string) rlsv3.RateLimitServiceClient {
		conn, err := grpc.NewClient(tp.addr(svc, 8081), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return rlsv3.NewRateLimitServiceClient(conn)
	}
	// until sends req until a denial; it returns the admitted count and
	// the denial.
	until := func(c rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest) (int, *rlsv3.RateLimitResponse) {
		for admitted := 0; admitted < 1000; {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			resp, err := c.ShouldRateLimit(ctx, req)
			cancel()
			if err != nil {
				t.Fatalf("ShouldRateLimit: %v", err)
			}
			if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				return admitted, resp
			}
			if !hasHeader(resp, "RateLimit-Policy") {
				t.Fatalf("an OK answer without RateLimit-Policy: %v", resp)
			}
			admitted++
		}
		t.Fatalf("1000 requests admitted in a row for %v", req)
		return 0, nil
	}

	tenant := "t-" + randomHex(t, 4)
	tenantRule := pol.Match(domain, []region.Entry{{Key: "tenant", Value: tenant}})
	if tenantRule == nil {
		t.Fatalf("no tenant limit in the policy")
	}
	start := time.Now()
	total := 0
	for _, svc := range []string{"agent-eu-1", "agent-us-1"} {
		admitted, resp := until(client(svc), request("/", tenant))
		if admitted == 0 {
			t.Errorf("%s denied tenant %s's first request: each region holds at least its idle floor of a key no table names yet", svc, tenant)
		}
		st := resp.GetStatuses()
		if len(st) != 1 || st[0].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st[0].GetLimitRemaining() != 0 ||
			st[0].GetDurationUntilReset().AsDuration() <= 0 || st[0].GetCurrentLimit() == nil {
			t.Errorf("%s: denial %v: want one OVER_LIMIT status with the limit sold, nothing remaining, a retry-after", svc, st)
		}
		if !hasHeader(resp, "Retry-After") {
			t.Errorf("%s: a denial without Retry-After", svc)
		}
		total += admitted
		t.Logf("%s admitted %d of tenant %s's requests, then denied", svc, admitted, tenant)
	}
	// Whatever the shares, the regions together never admit more than the
	// global budget allows over the elapsed time.
	budget := tenantRule.Limit.Burst() + int64(time.Since(start)/tenantRule.Limit.Interval()) + 1
	if int64(total) > budget {
		t.Errorf("eu and us admitted %d of tenant %s's requests; the global limit %v allows %d", total, tenant, tenantRule.Limit, budget)
	}

	// /search: two descriptors, the tenant's and the tenant's search
	// limit; the search limit is the tighter and denies first — once the
	// coordinator's table names the keys. Before that each runs at the
	// idle floor (rebalance's idle floors), where every limit's burst is
	// about the one unit each region is owed and either may deny first;
	// so the check polls, with a deadline that only guards against hangs.
	tenant2 := "t-" + randomHex(t, 4)
	eu := client("agent-eu-1")
	var (
		admitted int
		st       []*rlsv3.RateLimitResponse_DescriptorStatus
	)
	deadline := time.Now().Add(60 * time.Second)
	for {
		var resp *rlsv3.RateLimitResponse
		admitted, resp = until(eu, request("/search", tenant2))
		st = resp.GetStatuses()
		if (admitted > 0 && len(st) == 2 && st[0].GetCode() == rlsv3.RateLimitResponse_OK && st[1].GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT) || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if admitted == 0 || len(st) != 2 || st[0].GetCode() != rlsv3.RateLimitResponse_OK || st[1].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("/search: admitted %d, then %v: want the search limit (second) over, the tenant's OK", admitted, st)
	}
}

func hasHeader(resp *rlsv3.RateLimitResponse, name string) bool {
	for _, h := range resp.GetResponseHeadersToAdd() {
		if strings.EqualFold(h.GetKey(), name) {
			return true
		}
	}
	return false
}
