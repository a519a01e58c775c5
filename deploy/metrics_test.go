package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
	"go.yaml.in/yaml/v3"

	"github.com/meridian-quota/meridian/internal/natstest"
	"github.com/meridian-quota/meridian/internal/testenv"
)

// The monitoring files this test checks, relative to deploy/.
const (
	metricsAlertsFile     = "prometheus/alerts.yml"
	metricsPrometheusFile = "prometheus/prometheus.yml"
	metricsDashboardFile  = "grafana/dashboards/meridian.json"
	metricsDatasourceFile = "grafana/provisioning/datasources/prometheus.yaml"
	metricsProviderFile   = "grafana/provisioning/dashboards/meridian.yaml"
)

// metricsScrapeLabels are added to every series by the scrape (job,
// instance, and the target's region from prometheus.yml); exported_region
// is an agent's own region label renamed by Prometheus because the target
// has one. A running agent does not expose them.
var metricsScrapeLabels = map[string]bool{"job": true, "instance": true, "region": true, "exported_region": true}

// metricsSynthetic are series Prometheus itself writes for each target.
var metricsSynthetic = map[string]bool{"up": true}

func metricsParser() parser.Parser { return parser.NewParser(parser.Options{}) }

// metricsGrafanaVars replaces Grafana's interval macros so that a panel's
// query parses as PromQL; $region and $instance only appear inside label
// matcher strings, where they parse as they are.
var metricsGrafanaVars = strings.NewReplacer("$__rate_interval", "1m", "${__rate_interval}", "1m",
	"$__interval", "1m", "${__interval}", "1m", "$__range", "1h", "${__range}", "1h")

// metricsSelector is one vector selector of an expression: the metric name
// and its label matchers, __name__ excluded.
type metricsSelector struct {
	name     string
	matchers []*labels.Matcher
	where    string // the panel or alert it is in
}

// metricsSelectors parses expr and returns its vector selectors.
func metricsSelectors(expr, where string) ([]metricsSelector, error) {
	e, err := metricsParser().ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	var out []metricsSelector
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		s := metricsSelector{name: vs.Name, where: where}
		for _, m := range vs.LabelMatchers {
			if m.Name == labels.MetricName {
				if m.Type == labels.MatchEqual {
					s.name = m.Value
				}
				continue
			}
			s.matchers = append(s.matchers, m)
		}
		out = append(out, s)
		return nil
	})
	return out, nil
}

// metricsAlertRules reads alerts.yml with Prometheus's own rule loader
// (what `promtool check rules` runs) and fails on any error.
func metricsAlertRules(t *testing.T) *rulefmt.RuleGroups {
	t.Helper()
	groups, errs := rulefmt.ParseFile(metricsAlertsFile, false, model.UTF8Validation, metricsParser(), slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Errorf("rulefmt: %v", err)
	}
	if len(errs) > 0 || groups == nil {
		t.FailNow()
	}
	return groups
}

// TestMetricsAlertRules: alerts.yml loads as Prometheus loads it, every
// expression parses, and every alert has a for, a known severity, a
// summary and a description; names are unique.
func TestMetricsAlertRules(t *testing.T) {
	groups := metricsAlertRules(t)
	// rulefmt cannot tell `for: 0s` from no `for`: read the keys.
	var raw struct {
		Groups []struct {
			Rules []map[string]any `yaml:"rules"`
		} `yaml:"groups"`
	}
	data, err := os.ReadFile(metricsAlertsFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	for _, g := range raw.Groups {
		for _, r := range g.Rules {
			if _, ok := r["for"]; !ok {
				t.Errorf("alert %v: no for:", r["alert"])
			}
		}
	}
	seen := map[string]bool{}
	n := 0
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("group %s: a recording rule %q; this file holds alerts only", g.Name, r.Record)
				continue
			}
			n++
			if seen[r.Alert] {
				t.Errorf("alert %s defined twice", r.Alert)
			}
			seen[r.Alert] = true
			if _, err := metricsParser().ParseExpr(r.Expr); err != nil {
				t.Errorf("alert %s: expr: %v", r.Alert, err)
			}
			if s := r.Labels["severity"]; !slices.Contains([]string{"critical", "warning", "info"}, s) {
				t.Errorf("alert %s: severity %q, want critical, warning or info", r.Alert, s)
			}
			for _, a := range []string{"summary", "description"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("alert %s: no %s", r.Alert, a)
				}
			}
		}
	}
	// The alerts the runbook names must all be there.
	for _, a := range []string{"MeridianFallbackDecisions", "MeridianLeaseLapsed", "MeridianTableStale", "MeridianNoCoordinator",
		"MeridianStoreLatencyHigh", "MeridianShareSumAboveBudget", "MeridianForgedTables"} {
		if !seen[a] {
			t.Errorf("alert %s missing", a)
		}
	}
	t.Logf("%d alerts in %d groups", n, len(groups.Groups))
}

// TestMetricsPrometheusConfig: prometheus.yml scrapes the six compose
// agents on 8080 with their region, every 5 s, and loads alerts.yml from
// where compose mounts it.
func TestMetricsPrometheusConfig(t *testing.T) {
	var cfg struct {
		Global struct {
			ScrapeInterval     string `yaml:"scrape_interval"`
			EvaluationInterval string `yaml:"evaluation_interval"`
		} `yaml:"global"`
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string          `yaml:"targets"`
				Labels  map[string]string `yaml:"labels"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	data, err := os.ReadFile(metricsPrometheusFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Global.ScrapeInterval != "5s" || cfg.Global.EvaluationInterval != "5s" {
		t.Errorf("scrape_interval %q, evaluation_interval %q; want 5s", cfg.Global.ScrapeInterval, cfg.Global.EvaluationInterval)
	}
	if !slices.Contains(cfg.RuleFiles, "/etc/prometheus/alerts.yml") {
		t.Errorf("rule_files %q do not load /etc/prometheus/alerts.yml", cfg.RuleFiles)
	}
	got := map[string]string{} // target → region
	for _, sc := range cfg.ScrapeConfigs {
		if sc.JobName != "meridian-agent" {
			continue
		}
		for _, st := range sc.StaticConfigs {
			for _, tg := range st.Targets {
				got[tg] = st.Labels["region"]
			}
		}
	}
	want := map[string]string{}
	for _, r := range []string{"eu", "us", "ap"} {
		for _, i := range []string{"1", "2"} {
			want["agent-"+r+"-"+i+":8080"] = r
		}
	}
	if !maps.Equal(got, want) {
		t.Errorf("job meridian-agent scrapes %v, want %v", got, want)
	}
	// The alerts' job matchers name this job.
	for _, g := range metricsAlertRules(t).Groups {
		for _, r := range g.Rules {
			sels, _ := metricsSelectors(r.Expr, r.Alert)
			for _, s := range sels {
				for _, m := range s.matchers {
					if m.Name == "job" && !m.Matches("meridian-agent") {
						t.Errorf("alert %s selects job %s", r.Alert, m)
					}
				}
			}
		}
	}
}

// metricsDashboard is the part of a Grafana dashboard the tests read.
type metricsDashboard struct {
	UID           string         `json:"uid"`
	SchemaVersion int            `json:"schemaVersion"`
	Panels        []metricsPanel `json:"panels"`
	Templating    struct {
		List []struct {
			Name       string            `json:"name"`
			Datasource map[string]string `json:"datasource"`
			Definition string            `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

type metricsPanel struct {
	ID         int               `json:"id"`
	Type       string            `json:"type"`
	Title      string            `json:"title"`
	Datasource map[string]string `json:"datasource"`
	GridPos    struct{ H, W, X, Y int }
	Targets    []struct {
		Expr       string            `json:"expr"`
		Datasource map[string]string `json:"datasource"`
	} `json:"targets"`
	Panels []metricsPanel `json:"panels"` // a collapsed row's
}

// metricsLabelValues matches a Grafana label_values(selector, label)
// variable query.
var metricsLabelValues = regexp.MustCompile(`^label_values\((.+),\s*[A-Za-z_][A-Za-z0-9_]*\)$`)

// metricsDashboardSelectors reads the dashboard and returns the selectors
// of every panel query and variable query, failing on anything that does
// not parse or does not use the provisioned datasource.
func metricsDashboardSelectors(t *testing.T) []metricsSelector {
	t.Helper()
	data, err := os.ReadFile(metricsDashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d metricsDashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", metricsDashboardFile, err)
	}
	if d.UID == "" || d.SchemaVersion < 36 {
		t.Errorf("dashboard uid %q, schemaVersion %d; want a uid and schemaVersion ≥ 36", d.UID, d.SchemaVersion)
	}
	if bytes.Contains(data, []byte("DS_PROMETHEUS")) {
		t.Errorf("the dashboard names ${DS_PROMETHEUS}: it must use the provisioned uid prometheus")
	}
	checkDS := func(where string, ds map[string]string) {
		if ds["uid"] != "prometheus" || ds["type"] != "prometheus" {
			t.Errorf("%s: datasource %v, want {type: prometheus, uid: prometheus}", where, ds)
		}
	}
	var sels []metricsSelector
	add := func(where, expr string) {
		s, err := metricsSelectors(metricsGrafanaVars.Replace(expr), where)
		if err != nil {
			t.Errorf("%s: %q: %v", where, expr, err)
		}
		sels = append(sels, s...)
	}
	ids := map[int]bool{}
	var walk func(ps []metricsPanel)
	walk = func(ps []metricsPanel) {
		for _, p := range ps {
			where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
			if ids[p.ID] {
				t.Errorf("%s: id used twice", where)
			}
			ids[p.ID] = true
			if p.GridPos.W < 1 || p.GridPos.X+p.GridPos.W > 24 {
				t.Errorf("%s: gridPos x %d w %d outside the 24 columns", where, p.GridPos.X, p.GridPos.W)
			}
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			checkDS(where, p.Datasource)
			if len(p.Targets) == 0 {
				t.Errorf("%s: no queries", where)
			}
			for _, tg := range p.Targets {
				checkDS(where, tg.Datasource)
				add(where, tg.Expr)
			}
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		where := "variable " + v.Name
		checkDS(where, v.Datasource)
		if m := metricsLabelValues.FindStringSubmatch(v.Definition); m != nil {
			add(where, m[1])
		}
	}
	return sels
}

// TestMetricsDashboard: the dashboard is valid JSON with unique panel
// ids, every query parses as PromQL and uses the provisioned datasource,
// and the provisioning files point where compose mounts things.
func TestMetricsDashboard(t *testing.T) {
	sels := metricsDashboardSelectors(t)
	if len(sels) < 20 {
		t.Errorf("only %d selectors in the dashboard's queries: is the extraction broken?", len(sels))
	}
	var ds struct {
		Datasources []struct {
			UID, Type, URL string
		} `yaml:"datasources"`
	}
	var prov struct {
		Providers []struct {
			Type    string
			Options struct{ Path string }
		} `yaml:"providers"`
	}
	for _, f := range []struct {
		path string
		v    any
	}{{metricsDatasourceFile, &ds}, {metricsProviderFile, &prov}} {
		data, err := os.ReadFile(f.path)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(data, f.v); err != nil {
			t.Fatalf("%s: %v", f.path, err)
		}
	}
	if len(ds.Datasources) != 1 || ds.Datasources[0].UID != "prometheus" || ds.Datasources[0].Type != "prometheus" ||
		ds.Datasources[0].URL != "http://prometheus:9090" {
		t.Errorf("datasources %+v, want one prometheus, uid prometheus, at http://prometheus:9090", ds.Datasources)
	}
	if len(prov.Providers) != 1 || prov.Providers[0].Type != "file" || prov.Providers[0].Options.Path != "/var/lib/grafana/dashboards" {
		t.Errorf("dashboard providers %+v, want one file provider on /var/lib/grafana/dashboards", prov.Providers)
	}
}

// TestMetricsDashboardShowsAlertedSeries: every metric an alert selects
// is also queried by a dashboard panel, so the on-call who is paged can
// see the series that fired (e.g. each failure mode of
// MeridianFallbackDecisions on "Fallback decisions by mode"). up is
// Prometheus's own and has no panel.
func TestMetricsDashboardShowsAlertedSeries(t *testing.T) {
	onDashboard := map[string]bool{}
	for _, s := range metricsDashboardSelectors(t) {
		onDashboard[s.name] = true
	}
	var missing []string
	for _, g := range metricsAlertRules(t).Groups {
		for _, r := range g.Rules {
			sels, err := metricsSelectors(r.Expr, r.Alert)
			if err != nil {
				t.Fatalf("alert %s: %v", r.Alert, err)
			}
			for _, s := range sels {
				if !metricsSynthetic[s.name] && !onDashboard[s.name] {
					missing = append(missing, fmt.Sprintf("%s (alert %s)", s.name, r.Alert))
				}
			}
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		t.Errorf("%d metrics the alerts select are on no dashboard panel:\n  %s", len(missing), strings.Join(slices.Compact(missing), "\n  "))
	}
}

// metricsExposition is what an agent's /metrics serves: family types by
// name (from # TYPE lines) and every sample's labels by sample name.
type metricsExposition struct {
	types   map[string]string
	samples map[string][]labels.Labels
}

func metricsParseExposition(t *testing.T, body []byte) metricsExposition {
	t.Helper()
	ex := metricsExposition{types: map[string]string{}, samples: map[string][]labels.Labels{}}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			ex.types[f[2]] = f[3]
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			t.Fatalf("/metrics: bad line %q", line)
		}
		ls, err := metricsParser().ParseMetric(line[:i])
		if err != nil {
			t.Fatalf("/metrics: %q: %v", line, err)
		}
		name := ls.Get(labels.MetricName)
		ex.samples[name] = append(ex.samples[name], ls)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return ex
}

// check returns why s names nothing ex exposes, or "".
func (ex metricsExposition) check(s metricsSelector) string {
	if metricsSynthetic[s.name] {
		return ""
	}
	if s.name == "" {
		return "a selector without a metric name"
	}
	if _, ok := ex.types[s.name]; !ok {
		family := ""
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if f, ok := strings.CutSuffix(s.name, suf); ok {
				if typ := ex.types[f]; typ == "histogram" || typ == "summary" {
					family = f
				}
			}
		}
		if family == "" {
			return "not exposed"
		}
	}
	// Label matchers on the agent's own labels must select a series.
	var own []*labels.Matcher
	for _, m := range s.matchers {
		if !metricsScrapeLabels[m.Name] {
			own = append(own, m)
		}
	}
	if len(own) == 0 {
		return ""
	}
	for _, ls := range ex.samples[s.name] {
		if func() bool {
			for _, m := range own {
				if !m.Matches(ls.Get(m.Name)) {
					return false
				}
			}
			return true
		}() {
			return ""
		}
	}
	return fmt.Sprintf("no exposed series matches %v", own)
}

// metricsFreePort returns a loopback port that was free a moment ago.
func metricsFreePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// metricsBuild builds cmd/meridian into a temporary directory.
func metricsBuild(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go not on PATH: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "meridian")
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(goBin, "build", "-o", bin, "./cmd/meridian")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/meridian: %v\n%s", err, out)
	}
	return bin
}

// TestMetricsExposedAtStartup: every metric the alerts and the dashboard
// query is on a freshly started agent's /metrics, before any request — so
// no panel is empty and no alert is blind until traffic or a fault first
// creates a series. The agent joins a cluster (embedded NATS, the shared
// Redis under a prefix of its own, gossip on loopback, a coordinator
// candidate with keys made by `meridian keys`), so the cluster and
// coordinator series are there too.
func TestMetricsExposedAtStartup(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the agent: skipped under -short")
	}
	start := time.Now()
	// Everything the rules and panels select, with where it is used.
	var sels []metricsSelector
	for _, g := range metricsAlertRules(t).Groups {
		for _, r := range g.Rules {
			s, err := metricsSelectors(r.Expr, "alert "+r.Alert)
			if err != nil {
				t.Fatalf("alert %s: %v", r.Alert, err)
			}
			sels = append(sels, s...)
		}
	}
	sels = append(sels, metricsDashboardSelectors(t)...)

	// The shared Redis under a prefix of this test's own, deleted after:
	// a missing Redis skips the test loudly, or fails it when CI=true.
	rc := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	testenv.Cleanup(t, rc, prefix)
	nats := natstest.Start(t)
	bin := metricsBuild(t)
	t.Logf("built cmd/meridian in %v", time.Since(start).Round(time.Millisecond))

	dir := t.TempDir()
	out, err := exec.Command(bin, "keys").Output()
	if err != nil {
		t.Fatalf("meridian keys: %v", err)
	}
	keys := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			keys[f[0]] = f[1]
		}
	}
	for file, name := range map[string]string{"coordinator.key": "coordinator-sign-key",
		"coordinator.pub": "coordinator-verify-key", "gossip.keys": "gossip-key"} {
		if keys[name] == "" {
			t.Fatalf("meridian keys printed no %s:\n%s", name, out)
		}
		if err := os.WriteFile(filepath.Join(dir, file), []byte(keys[name]+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	const policy = `
domains:
  - domain: api
    hash_tag: tenant
    descriptors:
      - key: tenant
        rate_limit: {unit: second, requests_per_unit: 1000, burst: 200}
        descriptors:
          - key: route
            value: /search
            rate_limit: {unit: minute, requests_per_unit: 600, burst: 60, failure_mode: closed}
`
	if err := os.WriteFile(filepath.Join(dir, "policy.yaml"), []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	httpAddr := fmt.Sprintf("127.0.0.1:%d", metricsFreePort(t))
	config := fmt.Sprintf(`region: eu
agent: eu-1
regions: [eu, us, ap]
policy: policy.yaml
grpc: 127.0.0.1:%d
http: %s
interval: 1s
reload_every: 0s
redis: {addr: %q, prefix: %q, timeout: 250ms}
cluster:
  name: meridian
  nats: {urls: [%q], bucket: meridian}
  members: {profile: local, bind: "127.0.0.1:%d", key_file: gossip.keys}
  coordinator:
    candidate: true
    sign_key_file: coordinator.key
    verify_keys_file: coordinator.pub
`, metricsFreePort(t), httpAddr, rc.Options().Addr, prefix, nats.URL(), metricsFreePort(t))
	cfgPath := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}

	var logs bytes.Buffer
	cmd := exec.Command(bin, "agent", "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	t.Cleanup(stop)
	fail := func(format string, a ...any) {
		t.Helper()
		stop()
		t.Fatalf("%s\nagent output:\n%s", fmt.Sprintf(format, a...), logs.String())
	}

	client := &http.Client{Timeout: 2 * time.Second}
	get := func(path string) (int, []byte, error) {
		resp, err := client.Get("http://" + httpAddr + path)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, b, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		if code, _, err := get("/readyz"); err == nil && code == http.StatusOK {
			break
		}
		select {
		case err := <-exited:
			stopped = true
			fail("the agent exited before it was ready: %v", err)
		case <-ctx.Done():
			fail("the agent was not ready within 20 s")
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Logf("agent ready %v after the test started", time.Since(start).Round(time.Millisecond))
	code, body, err := get("/metrics")
	if err != nil || code != http.StatusOK {
		fail("GET /metrics: %d %v", code, err)
	}
	ex := metricsParseExposition(t, body)

	var missing []string
	seen := map[string]bool{}
	names := map[string]bool{}
	for _, s := range sels {
		names[s.name] = true
		if why := ex.check(s); why != "" {
			msg := fmt.Sprintf("%s (%s): %s", s.name, s.where, why)
			if !seen[msg] {
				seen[msg] = true
				missing = append(missing, msg)
			}
		}
	}
	if len(names) < 25 {
		t.Errorf("only %d metric names referenced: is the extraction broken?", len(names))
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		t.Errorf("%d selectors name series a fresh agent does not expose:\n  %s", len(missing), strings.Join(missing, "\n  "))
	}
	// The other way round: every Meridian family the agent exports is on
	// the dashboard or in an alert, or listed in metricsUnwatched with why —
	// so a new metric (a new failure mode's counter) cannot ship unwatched.
	var unwatched []string
	for name := range ex.types {
		if strings.HasPrefix(name, "meridian_") && !names[name] && !names[name+"_bucket"] && !names[name+"_count"] && metricsUnwatched[name] == "" {
			unwatched = append(unwatched, name)
		}
	}
	if len(unwatched) > 0 {
		slices.Sort(unwatched)
		t.Errorf("%d metrics a fresh agent exports are on no dashboard panel and in no alert (add one, or list it in metricsUnwatched with why):\n  %s",
			len(unwatched), strings.Join(unwatched, "\n  "))
	}
	for name := range metricsUnwatched {
		if names[name] {
			t.Errorf("metricsUnwatched lists %s, which the dashboard or an alert uses: drop it from the list", name)
		}
	}
	t.Logf("%d selectors over %d metric names checked against a fresh agent in %v", len(sels), len(names), time.Since(start).Round(time.Millisecond))
}

// metricsUnwatched are the Meridian metrics an agent exports that neither
// the dashboard nor an alert uses, each with the reason.
var metricsUnwatched = map[string]string{
	"meridian_breaker_opens_total":        "the breaker's state is on \"Breakers open\" and its rejections on \"Redis calls and errors\"",
	"meridian_cluster_table_term":         "gossip's copy of meridian_table_term, which the dashboard and MeridianNoTable use",
	"meridian_cluster_table_epoch":        "gossip's copy of meridian_table_epoch, which the dashboard uses",
	"meridian_lease_takes_total":          "lease tuning (lease.units), not health; lease hits are on \"Served without Redis\"",
	"meridian_lease_stranded_units_total": "lease tuning (lease.units), not health",
	"meridian_bad_requests_total":         "not watched yet: a malformed request is refused with an error and consumes nothing",
	"meridian_policy_reloads_total":       "MeridianPolicyReloadFailing watches meridian_policy_reload_failing, which stays 1 while a reload is rejected",
	"meridian_unauthenticated_total":      "not watched yet: a refused caller is answered Unauthenticated / 401 and consumes nothing",
	"meridian_cluster_table_deltas_total": "control-plane cost, not health: tables read as deltas (patched) or from chunks (missed); the bytes are on the control traffic panel",
}

// metricsAgent is the target labels of compose agent name (e.g. "eu-1").
func metricsAgent(name string) string {
	region, _, _ := strings.Cut(name, "-")
	return fmt.Sprintf(`job="meridian-agent", instance="agent-%s:8080", region=%q`, name, region)
}

// TestMetricsAlertExpressions evaluates every alert's expression with
// Prometheus's engine over synthetic series, as `promtool test rules`
// would: each fires for the agents in trouble and for no other. (for:
// holds it back; that is Prometheus's business, not the expression's.)
func TestMetricsAlertExpressions(t *testing.T) {
	exprs := map[string]string{}
	for _, g := range metricsAlertRules(t).Groups {
		for _, r := range g.Rules {
			exprs[r.Alert] = r.Expr
		}
	}
	a := metricsAgent
	cases := []struct {
		alert string
		load  string   // series, one a line, in promqltest's notation, 5 s apart from 0
		keys  []string // labels naming a firing series
		want  []string // firing series at 4m, by keys
	}{
		{"MeridianAgentDown", `
  up{` + a("eu-1") + `} 1x60
  up{` + a("eu-2") + `} 0x60`, []string{"instance"}, []string{"agent-eu-2:8080"}},
		{"MeridianFallbackDecisions", `
  meridian_fallback_open_total{` + a("eu-1") + `} 0x60
  meridian_fallback_closed_total{` + a("eu-1") + `} 0x60
  meridian_fallback_local_total{` + a("eu-1") + `} 0+10x60
  meridian_fallback_open_total{` + a("us-1") + `} 0x60
  meridian_fallback_closed_total{` + a("us-1") + `} 0+1x60
  meridian_fallback_local_total{` + a("us-1") + `} 0x60
  meridian_fallback_open_total{` + a("ap-1") + `} 7x60
  meridian_fallback_closed_total{` + a("ap-1") + `} 0x60
  meridian_fallback_local_total{` + a("ap-1") + `} 3x60
  meridian_fallback_error_total{` + a("eu-1") + `} 0x60
  meridian_fallback_error_total{` + a("us-1") + `} 0x60
  meridian_fallback_error_total{` + a("ap-1") + `} 0+2x60`, []string{"instance", "mode"},
			[]string{"agent-ap-1:8080 error", "agent-eu-1:8080 local", "agent-us-1:8080 closed"}},
		// eu-1: every call under 1 ms. eu-2: 5 % in (5 ms, 10 ms]. us-1:
		// 5 % in (25 ms, 50 ms].
		{"MeridianStoreLatencyHigh", metricsBuckets("eu-1", 100, 100, 100, 100, 100) + metricsBuckets("eu-2", 90, 95, 100, 100, 100) +
			metricsBuckets("us-1", 90, 95, 95, 95, 100), []string{"instance"}, []string{"agent-eu-2:8080", "agent-us-1:8080"}},
		{"MeridianStoreLatencyCritical", metricsBuckets("eu-1", 100, 100, 100, 100, 100) + metricsBuckets("eu-2", 90, 95, 100, 100, 100) +
			metricsBuckets("us-1", 90, 95, 95, 95, 100), []string{"instance"}, []string{"agent-us-1:8080"}},
		{"MeridianLeaseLapsed", `
  meridian_lease_lapsed{` + a("eu-1") + `} 0x60
  meridian_lease_lapsed{` + a("us-1") + `} 0x30 1x30`, []string{"instance"}, []string{"agent-us-1:8080"}},
		{"MeridianPolicyReloadFailing", `
  meridian_policy_reload_failing{` + a("eu-1") + `} 0x60
  meridian_policy_reload_failing{` + a("us-1") + `} 0x10 1x50
  meridian_policy_reload_failing{` + a("ap-1") + `} 0x50 1x10`, []string{"instance"}, []string{"agent-us-1:8080"}},
		{"MeridianTableStale", `
  meridian_table_age_seconds{` + a("eu-1") + `} 3x60
  meridian_table_age_seconds{` + a("us-1") + `} 0+1x60
  meridian_table_age_seconds{` + a("ap-1") + `} 0x60`, []string{"instance"}, []string{"agent-us-1:8080"}},
		// eu-1 is in a cluster without a table; ap-1 runs standalone (no
		// cluster series), us-1 has one.
		{"MeridianNoTable", `
  meridian_table_term{` + a("eu-1") + `} 0x60
  meridian_coordinator_leader{` + a("eu-1") + `} 0x60
  meridian_table_term{` + a("us-1") + `} 3x60
  meridian_coordinator_leader{` + a("us-1") + `} 1x60
  meridian_table_term{` + a("ap-1") + `} 0x60`, []string{"instance"}, []string{"agent-eu-1:8080"}},
		{"MeridianNoCoordinator", `
  meridian_coordinator_leader{` + a("eu-1") + `} 1x30 0x30
  meridian_coordinator_leader{` + a("us-1") + `} 0x60`, nil, []string{""}},
		{"MeridianMultipleCoordinators", `
  meridian_coordinator_leader{` + a("eu-1") + `} 1x60
  meridian_coordinator_leader{` + a("eu-2") + `} 0x30 1x30
  meridian_coordinator_leader{` + a("us-1") + `} 0x60`, nil, []string{""}},
		{"MeridianCoordinatorFlapping", `
  meridian_coordinator_term{` + a("eu-1") + `} 1x10 2x10 3x10 4x10 5x20
  meridian_coordinator_term{` + a("us-1") + `} 1x10 2x10 3x40`, nil, []string{""}},
		// The coordinator (on eu-1) measures each region's store clock: ap
		// stays 300 ms behind, us touched it once; the target's own region
		// label is kept, the gauge's renamed exported_region.
		{"MeridianClockSkew", `
  meridian_coordinator_clock_skew_seconds{` + a("eu-1") + `, exported_region="ap"} -0.3x60
  meridian_coordinator_clock_skew_seconds{` + a("eu-1") + `, exported_region="us"} 0.05x50 0.3x2 0.05x8
  meridian_coordinator_clock_skew_seconds{` + a("eu-1") + `, exported_region="eu"} 0x60`, []string{"exported_region"}, []string{"ap"}},
		{"MeridianCoordinatorFenced", `
  meridian_coordinator_fenced_total{` + a("eu-1") + `} 0x40 1x20
  meridian_coordinator_fenced_total{` + a("eu-2") + `} 0x60`, []string{"instance"}, []string{"agent-eu-1:8080"}},
		{"MeridianTableHeadOverwritten", `
  meridian_coordinator_heads_overwritten_total{` + a("eu-1") + `} 0x40 1x20
  meridian_coordinator_heads_overwritten_total{` + a("us-1") + `} 0x60`, []string{"instance"}, []string{"agent-eu-1:8080"}},
		{"MeridianShareSumAboveBudget", `
  meridian_coordinator_share_sum_max_ppm{` + a("eu-1") + `} 1000000x60
  meridian_coordinator_share_sum_max_ppm{` + a("eu-2") + `} 1000000x30 1000001x30
  meridian_coordinator_share_sum_max_ppm{` + a("us-1") + `} 0x60`, []string{"instance"}, []string{"agent-eu-2:8080"}},
		{"MeridianForgedTables", `
  meridian_cluster_invalid_messages_total{` + a("eu-1") + `, kind="table", reason="signature"} 0x30 1x30
  meridian_cluster_invalid_messages_total{` + a("eu-1") + `, kind="table", reason="malformed"} 0+1x60
  meridian_cluster_invalid_messages_total{` + a("us-1") + `, kind="table", reason="signature"} 0x60
  meridian_cluster_invalid_messages_total{` + a("us-1") + `, kind="report", reason="sender"} 0x30 1x30
  meridian_cluster_invalid_messages_total{` + a("ap-1") + `, kind="table", reason="replayed"} 0x30 1x30`,
			[]string{"instance", "kind"}, []string{"agent-ap-1:8080 table", "agent-eu-1:8080 table", "agent-us-1:8080 report"}},
		{"MeridianRedisStateLost", `
  meridian_redis_state_lost_total{` + a("eu-1") + `} 0x30 1x30
  meridian_redis_state_lost_total{` + a("us-1") + `} 0x60`,
			[]string{"instance"}, []string{"agent-eu-1:8080"}},
		{"MeridianRegionFenceFailing", `
  meridian_fence_raise_errors_total{` + a("eu-1") + `} 0+1x60
  meridian_fence_raise_errors_total{` + a("us-1") + `} 0x60`,
			[]string{"instance"}, []string{"agent-eu-1:8080"}},
		{"MeridianAgentBehindRegionFence", `
  meridian_fenced_total{` + a("eu-1") + `} 0x60
  meridian_fenced_total{` + a("us-1") + `} 0+7x60`,
			[]string{"instance"}, []string{"agent-us-1:8080"}},
		{"MeridianInvalidClusterMessages", `
  meridian_cluster_invalid_messages_total{` + a("eu-1") + `, kind="table", reason="signature"} 0+1x60
  meridian_cluster_invalid_messages_total{` + a("eu-1") + `, kind="report", reason="malformed"} 0+1x60
  meridian_cluster_invalid_messages_total{` + a("us-1") + `, kind="ack", reason="cluster"} 0x60
  meridian_cluster_invalid_messages_total{` + a("us-1") + `, kind="table", reason="unavailable"} 0+1x60`,
			[]string{"instance", "kind", "reason"}, []string{"agent-eu-1:8080 report malformed"}},
		{"MeridianClusterSendErrors", `
  meridian_cluster_send_errors_total{` + a("eu-1") + `, kind="report"} 0+1x60
  meridian_cluster_send_errors_total{` + a("eu-1") + `, kind="ack"} 0x60`, []string{"instance", "kind"}, []string{"agent-eu-1:8080 report"}},
	}
	tested := map[string]bool{}
	for _, c := range cases {
		t.Run(c.alert, func(t *testing.T) {
			expr, ok := exprs[c.alert]
			if !ok {
				t.Fatalf("no alert %s in %s", c.alert, metricsAlertsFile)
			}
			tested[c.alert] = true
			eng := promql.NewEngine(promql.EngineOpts{MaxSamples: 1e6, Timeout: 10 * time.Second})
			q, err := eng.NewInstantQuery(context.Background(), metricsLoad(t, c.load), nil, expr, time.Unix(0, 0).Add(4*time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			defer q.Close()
			res := q.Exec(context.Background())
			if res.Err != nil {
				t.Fatal(res.Err)
			}
			vec, err := res.Vector()
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, s := range vec {
				var parts []string
				for _, k := range c.keys {
					parts = append(parts, s.Metric.Get(k))
				}
				got = append(got, strings.Join(parts, " "))
			}
			slices.Sort(got)
			if !slices.Equal(got, c.want) {
				t.Errorf("fires for %q, want %q\nexpr: %s\nresult: %v", got, c.want, expr, vec)
			}
		})
	}
	for name := range exprs {
		if !tested[name] {
			t.Errorf("alert %s has no case here", name)
		}
	}
}

// metricsBuckets is a load body for agent's store latency
// histogram: of each 100 calls every 5 s, the cumulative counts at or
// below 1, 5, 10 and 25 ms and 50 ms (the rest above).
func metricsBuckets(agent string, le1, le5, le10, le25, le50 int) string {
	var b strings.Builder
	for _, c := range []struct {
		le string
		n  int
	}{{"0.001", le1}, {"0.005", le5}, {"0.01", le10}, {"0.025", le25}, {"0.05", le50}, {"+Inf", 100}} {
		fmt.Fprintf(&b, "\n  meridian_store_seconds_bucket{%s, le=%q} 0+%dx60", metricsAgent(agent), c.le, c.n)
	}
	return b.String()
}

// metricsLoad is an in-memory queryable holding the series of body, one
// a line in the notation of promqltest's load command (`name{labels}
// 0+10x60`), samples 5 s apart from time 0. (promqltest itself pulls in
// the TSDB, whose test dependencies do not resolve beside this module's.)
func metricsLoad(t *testing.T, body string) storage.Queryable {
	t.Helper()
	var series []storage.Series
	for _, line := range strings.Split(body, "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		ls, vals, err := metricsParser().ParseSeriesDesc(line)
		if err != nil {
			t.Fatalf("series %q: %v", line, err)
		}
		var samples []chunks.Sample
		for i, v := range vals {
			if !v.Omitted {
				samples = append(samples, metricsSample{t: int64(i) * 5000, f: v.Value})
			}
		}
		series = append(series, storage.NewListSeries(ls, samples))
	}
	return &storage.MockQueryable{MockQuerier: &storage.MockQuerier{
		SelectMockFunction: func(_ bool, _ *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
			out := &metricsSeriesSet{}
		next:
			for _, s := range series {
				for _, m := range ms {
					if !m.Matches(s.Labels().Get(m.Name)) {
						continue next
					}
				}
				out.series = append(out.series, s)
			}
			slices.SortFunc(out.series, func(a, b storage.Series) int { return labels.Compare(a.Labels(), b.Labels()) })
			return out
		},
	}}
}

// metricsSample is one float sample.
type metricsSample struct {
	t int64
	f float64
}

func (s metricsSample) T() int64                      { return s.t }
func (s metricsSample) ST() int64                     { return 0 }
func (s metricsSample) F() float64                    { return s.f }
func (s metricsSample) H() *histogram.Histogram       { return nil }
func (s metricsSample) FH() *histogram.FloatHistogram { return nil }
func (s metricsSample) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (s metricsSample) Copy() chunks.Sample           { return s }

// metricsSeriesSet iterates over a slice of series.
type metricsSeriesSet struct {
	series []storage.Series
	i      int
}

func (ss *metricsSeriesSet) Next() bool                        { ss.i++; return ss.i <= len(ss.series) }
func (ss *metricsSeriesSet) At() storage.Series                { return ss.series[ss.i-1] }
func (ss *metricsSeriesSet) Err() error                        { return nil }
func (ss *metricsSeriesSet) Warnings() annotations.Annotations { return nil }
