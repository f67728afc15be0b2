package deploy

import (
	"flag"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	sigsyaml "sigs.k8s.io/yaml"
)

var updatePrometheusRule = flag.Bool("update-prometheusrule", false,
	"rewrite deploy/k8s/components/monitoring/prometheusrule.yaml from configs/prometheus/alerts.yml")

const (
	alertsFile     = "configs/prometheus/alerts.yml"
	alertsTestFile = "configs/prometheus/alerts_test.yml"
	// alertsLongTestFile holds the cases over days, evaluated every 10m.
	alertsLongTestFile = "configs/prometheus/alerts_long_test.yml"
	runbooksDir        = "docs/runbooks"
	monitoringDir      = "deploy/k8s/components/monitoring"
	prometheusRuleFile = monitoringDir + "/prometheusrule.yaml"
	// runbookURLPrefix is where the runbooks are published.
	runbookURLPrefix = "https://github.com/settle/settle/blob/main/" + runbooksDir + "/"
)

// alertRules parses alerts.yml with Prometheus' own parser.
func alertRules(t *testing.T) []rulefmt.Rule {
	t.Helper()
	groups, errs := rulefmt.ParseFile(filepath.Join(repoRoot(t), filepath.FromSlash(alertsFile)), false, model.UTF8Validation, promql, slog.New(slog.DiscardHandler))
	require.Empty(t, errs, "alerts.yml does not parse")
	var out []rulefmt.Rule
	for _, g := range groups.Groups {
		out = append(out, g.Rules...)
	}
	require.NotEmpty(t, out)
	return out
}

// TestAlertRunbooks: every alert's runbook_url names its own page in
// docs/runbooks, the page exists and says what it means, what to check and
// what to do, every page belongs to an alert, and every settle metric a
// page tells the operator to look at is one settle exports.
func TestAlertRunbooks(t *testing.T) {
	root := repoRoot(t)
	alerts := map[string]bool{}
	for _, r := range alertRules(t) {
		alerts[r.Alert] = true
		url := r.Annotations["runbook_url"]
		require.Equal(t, runbookURLPrefix+r.Alert+".md", url, "alert %s: runbook_url", r.Alert)
		page, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(runbooksDir), r.Alert+".md"))
		require.NoError(t, err, "alert %s has no runbook page", r.Alert)
		text := string(page)
		require.True(t, strings.HasPrefix(text, "# "+r.Alert+"\n"), "%s.md: title", r.Alert)
		for _, section := range []string{"## What it means", "## What to check", "## What to do"} {
			require.Contains(t, text, "\n"+section+"\n", "%s.md lacks %q", r.Alert, section)
		}
		// An alert that fires per network sends the operator to that one.
		if strings.Contains(r.Annotations["summary"], "$labels.network") {
			require.Contains(t, strings.Join(strings.Fields(text), " "), "the network named in the alert", "%s.md: which network", r.Alert)
		}
	}
	entries, err := os.ReadDir(filepath.Join(root, filepath.FromSlash(runbooksDir)))
	require.NoError(t, err)
	known := map[string]bool{}
	for name, s := range exportedSeries(t) {
		known[name], known[s.metric] = true, true
	}
	metricName := regexp.MustCompile(`\b(?:settle|asynq)_[a-z0-9_]*[a-z0-9]\b`)
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".md")
		require.True(t, ok, "%s: only markdown pages here", e.Name())
		raw, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(runbooksDir), e.Name()))
		require.NoError(t, err)
		if name == "README" {
			for a := range alerts {
				require.Contains(t, string(raw), "("+a+".md)", "README.md does not list %s", a)
			}
			continue
		}
		require.True(t, alerts[name], "%s is the page of no alert", e.Name())
		for _, m := range metricName.FindAllString(string(raw), -1) {
			require.True(t, known[m], "%s names %s, which no settle binary exports", e.Name(), m)
		}
	}
}

// TestAlertRulesPromtool runs promtool's own checks: the rules load, and
// the unit tests in alerts_test.yml and alerts_long_test.yml pass. Every
// alert has a case where it fires and one where it stays quiet.
func TestAlertRulesPromtool(t *testing.T) {
	root := repoRoot(t)
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool is missing (Debian's prometheus package; .ci/run installs it)")
		}
		t.Skip("promtool is missing (apt-get install prometheus)")
	}
	for _, args := range [][]string{
		{"check", "rules", filepath.FromSlash(alertsFile)},
		{"test", "rules", filepath.FromSlash(alertsTestFile), filepath.FromSlash(alertsLongTestFile)},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
	}

	var tests struct {
		RuleFiles []string `yaml:"rule_files"`
		Tests     []struct {
			Name       string `yaml:"name"`
			AlertTests []struct {
				AlertName string `yaml:"alertname"`
				ExpAlerts []struct {
					ExpLabels map[string]string `yaml:"exp_labels"`
				} `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, file := range []string{alertsTestFile, alertsLongTestFile} {
		raw, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(file)))
		require.NoError(t, err)
		tests.Tests = nil
		require.NoError(t, yaml.Unmarshal(raw, &tests))
		require.Equal(t, []string{"alerts.yml"}, tests.RuleFiles, file)
		for _, tc := range tests.Tests {
			for _, at := range tc.AlertTests {
				if len(at.ExpAlerts) == 0 {
					quiet[at.AlertName] = true
				} else {
					fires[at.AlertName] = true
				}
			}
		}
	}
	for _, r := range alertRules(t) {
		require.True(t, fires[r.Alert], "no promtool case where %s fires", r.Alert)
		require.True(t, quiet[r.Alert], "no promtool case where %s stays quiet", r.Alert)
	}
}

// TestNewMetricsWatched: the backlog gauges back alerts, and the dashboard
// shows the backlog, asynq's own queue series and the build of each process.
func TestNewMetricsWatched(t *testing.T) {
	used := map[string]bool{}
	for _, r := range alertRules(t) {
		for _, name := range checkPromQL(t, "alert "+r.Alert, r.Expr) {
			used[name] = true
		}
	}
	for _, name := range []string{"settle_backlog_events", "settle_backlog_oldest_pending_seconds", "settle_job_last_success_timestamp_seconds"} {
		require.True(t, used[name], "no alert watches %s", name)
	}
	shown := dashboardMetrics(t)
	for _, name := range []string{"settle_backlog_events", "settle_backlog_oldest_pending_seconds", "settle_build_info", "asynq_queue_size"} {
		require.True(t, shown[name], "the dashboard shows nothing of %s", name)
	}
}

// generatedPrometheusRule is the PrometheusRule holding alerts.yml's
// groups: the file's own text from `groups:` on, indented under spec.
func generatedPrometheusRule(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), filepath.FromSlash(alertsFile)))
	require.NoError(t, err)
	text := string(raw)
	at := strings.Index(text, "\ngroups:\n")
	require.Positive(t, at, "alerts.yml has no top-level groups:")
	var b strings.Builder
	b.WriteString(`# GENERATED from configs/prometheus/alerts.yml; do not edit. Regenerate:
#   go test ./test/deploy -run TestPrometheusRule -update-prometheusrule
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: settle
  namespace: settle
spec:
`)
	for _, line := range strings.Split(strings.TrimRight(text[at+1:], "\n"), "\n") {
		if line == "" {
			b.WriteString("\n")
			continue
		}
		b.WriteString("  " + line + "\n")
	}
	return b.String()
}

// TestPrometheusRule: the PrometheusRule is alerts.yml, kept in step, and
// decodes strictly into the operator's type with rules Prometheus accepts.
func TestPrometheusRule(t *testing.T) {
	path := filepath.Join(repoRoot(t), filepath.FromSlash(prometheusRuleFile))
	want := generatedPrometheusRule(t)
	if *updatePrometheusRule {
		require.NoError(t, os.WriteFile(path, []byte(want), 0o644))
	}
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, want, string(got), "%s is stale: run go test ./test/deploy -run TestPrometheusRule -update-prometheusrule", prometheusRuleFile)

	var rule monitoringv1.PrometheusRule
	require.NoError(t, sigsyaml.UnmarshalStrict(got, &rule))
	// The same groups, rule by rule, as Prometheus reads alerts.yml.
	var fromOperator []string
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			fromOperator = append(fromOperator, r.Alert+": "+r.Expr.String())
		}
	}
	var fromFile []string
	for _, r := range alertRules(t) {
		fromFile = append(fromFile, r.Alert+": "+r.Expr)
	}
	require.Equal(t, fromFile, fromOperator)
}

// rendered is one object of a kustomize build.
type rendered struct {
	kind, name, namespace string
	yaml                  []byte
}

// kustomizeBuild renders dir the way `kubectl kustomize` does.
func kustomizeBuild(t *testing.T, dir string) []rendered {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	resources, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join(repoRoot(t), filepath.FromSlash(dir)))
	require.NoError(t, err, "kustomize build %s", dir)
	var out []rendered
	for _, r := range resources.Resources() {
		raw, err := r.AsYAML()
		require.NoError(t, err)
		out = append(out, rendered{kind: r.GetKind(), name: r.GetName(), namespace: r.GetNamespace(), yaml: raw})
	}
	require.NotEmpty(t, out, dir)
	return out
}

// monitoringKinds are the Prometheus Operator kinds, decoded strictly into
// the operator's own API types (monitoring.coreos.com/v1, from which its
// CRD schemas are generated), so a misspelt or misplaced field fails.
var monitoringKinds = map[string]func() any{
	"ServiceMonitor": func() any { return &monitoringv1.ServiceMonitor{} },
	"PrometheusRule": func() any { return &monitoringv1.PrometheusRule{} },
}

// validate decodes a rendered object strictly into its API type.
func validate(t *testing.T, dir string, r rendered) any {
	t.Helper()
	var head metav1.TypeMeta
	require.NoError(t, sigsyaml.Unmarshal(r.yaml, &head))
	var obj any
	if kind, ok := k8sKinds[r.kind]; ok {
		require.Equal(t, kind.apiVersion, head.APIVersion, "%s: %s %s", dir, r.kind, r.name)
		obj = kind.object()
	} else if mk, ok := monitoringKinds[r.kind]; ok {
		require.Equal(t, monitoringv1.SchemeGroupVersion.String(), head.APIVersion, "%s: %s %s", dir, r.kind, r.name)
		obj = mk()
	} else {
		t.Fatalf("%s renders a %s (%s), which is not expected", dir, r.kind, r.name)
	}
	require.NoError(t, sigsyaml.UnmarshalStrict(r.yaml, obj), "%s: %s %s", dir, r.kind, r.name)
	return obj
}

var durationPattern = regexp.MustCompile(`^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$`)

// TestKustomizeBuild renders the base and the monitoring overlay with
// kustomize's Go module (what `kubectl kustomize` runs) and validates
// every object: Kubernetes kinds against their API types, the operator's
// kinds against theirs plus the fields the operator needs (the CRD's
// required fields and patterns for what settle sets). Each ServiceMonitor
// selects one settle Service on a port it has, and names the job the alert
// rules select on.
func TestKustomizeBuild(t *testing.T) {
	base := kustomizeBuild(t, k8sDir)
	for _, r := range base {
		validate(t, k8sDir, r)
		_, operator := monitoringKinds[r.kind]
		require.False(t, operator, "the base must not need the operator's CRDs (%s %s): that is the component's", r.kind, r.name)
	}

	dir := "deploy/k8s-monitoring"
	objs := kustomizeBuild(t, dir)
	require.Len(t, objs, len(base)+4, "the overlay is the base plus three ServiceMonitors and a PrometheusRule")
	services := map[string]*corev1.Service{}
	var monitors []*monitoringv1.ServiceMonitor
	rules := 0
	for _, r := range objs {
		obj := validate(t, dir, r)
		switch o := obj.(type) {
		case *corev1.Service:
			services[o.Name] = o
		case *monitoringv1.ServiceMonitor:
			require.Equal(t, "settle", o.Namespace, "ServiceMonitor %s", o.Name)
			monitors = append(monitors, o)
		case *monitoringv1.PrometheusRule:
			require.Equal(t, "settle", o.Namespace, "PrometheusRule %s", o.Name)
			for _, g := range o.Spec.Groups {
				require.NotEmpty(t, g.Name)
				for _, rule := range g.Rules {
					require.NotEmpty(t, rule.Alert, "group %s: only alerting rules", g.Name)
					_, err := promql.ParseExpr(rule.Expr.String())
					require.NoError(t, err, "rule %s", rule.Alert)
					if rule.For != nil {
						require.Regexp(t, durationPattern, string(*rule.For), "rule %s: for", rule.Alert)
					}
					rules++
				}
			}
		}
	}
	require.Equal(t, len(alertRules(t)), rules, "the PrometheusRule holds every alert")

	jobs := map[string]bool{}
	for _, m := range monitors {
		sel, err := metav1.LabelSelectorAsSelector(&m.Spec.Selector)
		require.NoError(t, err)
		require.False(t, sel.Empty(), "ServiceMonitor %s selects every Service", m.Name)
		var matched []*corev1.Service
		for _, s := range services {
			if sel.Matches(labels.Set(s.Labels)) {
				matched = append(matched, s)
			}
		}
		require.Len(t, matched, 1, "ServiceMonitor %s must select one Service", m.Name)
		svc := matched[0]
		require.Len(t, m.Spec.Endpoints, 1, "ServiceMonitor %s", m.Name)
		ep := m.Spec.Endpoints[0]
		require.NotEmpty(t, ep.Port, "ServiceMonitor %s: a named port", m.Name)
		hasPort := false
		for _, p := range svc.Spec.Ports {
			hasPort = hasPort || p.Name == ep.Port
		}
		require.True(t, hasPort, "ServiceMonitor %s scrapes port %q, which Service %s lacks", m.Name, ep.Port, svc.Name)
		require.Equal(t, "/metrics", ep.Path, "ServiceMonitor %s", m.Name)
		require.Regexp(t, durationPattern, string(ep.Interval), "ServiceMonitor %s interval", m.Name)
		job := ""
		for _, rl := range ep.RelabelConfigs {
			if rl.TargetLabel == "job" && rl.Replacement != nil {
				job = *rl.Replacement
			}
		}
		component := svc.Labels["app.kubernetes.io/component"]
		require.Equal(t, "settle-"+component, job, "ServiceMonitor %s: the job alerts.yml selects on", m.Name)
		jobs[component] = true
		if component == "scheduler" {
			require.True(t, ep.HonorLabels, "the scheduler must be scraped with honorLabels, as in prometheus.yml")
		}
	}
	got := sortedKeys(jobs)
	sort.Strings(got)
	require.Equal(t, []string{"api", "scheduler", "worker"}, got, "a ServiceMonitor per binary")
}

// TestComponentKustomization: the component is a kustomize Component that
// lists exactly the manifests beside it.
func TestComponentKustomization(t *testing.T) {
	dir := filepath.Join(repoRoot(t), filepath.FromSlash(monitoringDir))
	var k struct {
		APIVersion string   `yaml:"apiVersion"`
		Kind       string   `yaml:"kind"`
		Resources  []string `yaml:"resources"`
		Labels     []any    `yaml:"labels"`
	}
	decodeStrict(t, filepath.Join(dir, "kustomization.yaml"), &k)
	require.Equal(t, "kustomize.config.k8s.io/v1alpha1", k.APIVersion)
	require.Equal(t, "Component", k.Kind)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var files []string
	for _, e := range entries {
		if e.Name() != "kustomization.yaml" && strings.HasSuffix(e.Name(), ".yaml") {
			files = append(files, e.Name())
		}
	}
	listed := append([]string(nil), k.Resources...)
	sort.Strings(listed)
	require.Equal(t, files, listed)
}

// dashboardMetrics are the series the Grafana dashboards' panels query.
func dashboardMetrics(t *testing.T) map[string]bool {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(repoRoot(t), "configs", "grafana", "dashboards", "*.json"))
	require.NoError(t, err)
	used := map[string]bool{}
	for _, file := range matches {
		raw, err := os.ReadFile(file)
		require.NoError(t, err)
		var dash struct {
			Panels []grafanaPanel `json:"panels"`
		}
		require.NoError(t, jsonUnmarshal(raw, &dash))
		var walk func([]grafanaPanel)
		walk = func(ps []grafanaPanel) {
			for _, p := range ps {
				walk(p.Panels)
				for _, tg := range p.Targets {
					for _, name := range checkPromQL(t, "panel "+p.Title, grafanaTemplate(tg.Expr)) {
						used[name] = true
					}
				}
			}
		}
		walk(dash.Panels)
	}
	return used
}

// TestAlertmanager checks compose's Alertmanager: local port, its config
// mounted, and a config whose routes name receivers it defines.
func TestAlertmanager(t *testing.T) {
	root := repoRoot(t)
	svc, ok := loadCompose(t).Services["alertmanager"]
	require.True(t, ok, "compose.yaml has no alertmanager service")
	require.Regexp(t, `^prom/alertmanager:v[0-9.]+$`, svc.Image, "pin a version")
	require.Contains(t, svc.Ports, "127.0.0.1:9093:9093")
	require.Contains(t, svc.Volumes, "./configs/alertmanager:/etc/alertmanager:ro")
	require.Contains(t, svc.Command, "--config.file=/etc/alertmanager/alertmanager.yml")

	type route struct {
		Receiver       string   `yaml:"receiver"`
		GroupBy        []string `yaml:"group_by"`
		GroupWait      string   `yaml:"group_wait"`
		GroupInterval  string   `yaml:"group_interval"`
		RepeatInterval string   `yaml:"repeat_interval"`
		Matchers       []string `yaml:"matchers"`
		Routes         []route  `yaml:"routes"`
	}
	var cfg struct {
		Route        route `yaml:"route"`
		InhibitRules []struct {
			SourceMatchers []string `yaml:"source_matchers"`
			TargetMatchers []string `yaml:"target_matchers"`
			Equal          []string `yaml:"equal"`
		} `yaml:"inhibit_rules"`
		Receivers []struct {
			Name           string `yaml:"name"`
			WebhookConfigs []struct {
				URL          string `yaml:"url"`
				SendResolved bool   `yaml:"send_resolved"`
			} `yaml:"webhook_configs"`
		} `yaml:"receivers"`
	}
	decodeStrict(t, filepath.Join(root, "configs", "alertmanager", "alertmanager.yml"), &cfg)
	receivers := map[string]bool{}
	for _, r := range cfg.Receivers {
		receivers[r.Name] = true
		for _, w := range r.WebhookConfigs {
			require.Regexp(t, `^https?://`, w.URL, "receiver %s", r.Name)
		}
	}
	var walk func(route)
	walk = func(r route) {
		require.True(t, receivers[r.Receiver], "a route sends to receiver %q, which is not defined", r.Receiver)
		for _, m := range r.Matchers {
			_, err := promql.ParseMetricSelector("{" + m + "}")
			require.NoError(t, err, "matcher %s", m)
		}
		for _, c := range r.Routes {
			walk(c)
		}
	}
	require.NotEmpty(t, cfg.Route.Receiver, "the root route needs a receiver")
	walk(cfg.Route)
	// Grouping and inhibition use labels the alerts carry.
	alertLabels := map[string]bool{"alertname": true, "severity": true}
	for _, r := range alertRules(t) {
		for l := range r.Labels {
			alertLabels[l] = true
		}
		for _, name := range checkPromQL(t, "alert "+r.Alert, r.Expr) {
			if s := exportedSeries(t)[name]; s.labels != nil {
				for l := range s.labels {
					alertLabels[l] = true
				}
			}
		}
	}
	for _, l := range cfg.Route.GroupBy {
		require.True(t, alertLabels[l], "group_by %s: no alert carries it", l)
	}
}
