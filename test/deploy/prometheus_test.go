package deploy

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

var promql = parser.NewParser(parser.Options{})

// checkPromQL parses expr and checks that every selector names a series a
// settle binary exports, with labels that series can carry (or one of
// extraLabels, added by the scrape). It returns the series names used.
func checkPromQL(t *testing.T, where, expr string, extraLabels ...string) []string {
	t.Helper()
	parsed, err := promql.ParseExpr(expr)
	require.NoError(t, err, "%s: %s", where, expr)
	known := exportedSeries(t)
	var names []string
	parser.Inspect(parsed, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == model.MetricNameLabel && m.Type == labels.MatchEqual {
				name = m.Value
			}
		}
		require.NotEmpty(t, name, "%s: selector %s names no metric", where, vs)
		s, ok := known[name]
		require.True(t, ok, "%s: %s is not exported by any settle binary (expr %s)", where, name, expr)
		if s.labels != nil {
			for _, m := range vs.LabelMatchers {
				if m.Name == model.MetricNameLabel {
					continue
				}
				require.True(t, s.labels[m.Name] || slicesContains(extraLabels, m.Name), "%s: %s has no label %q (it has %v)", where, name, m.Name, sortedKeys(s.labels))
			}
		}
		names = append(names, name)
		return nil
	})
	return names
}

// TestAlertRules parses alerts.yml with Prometheus' own rule parser
// (the check promtool runs) and checks every metric it names against the
// code, and that the alerts the operations issue asks for are there.
func TestAlertRules(t *testing.T) {
	root := repoRoot(t)
	file := filepath.Join(root, "configs", "prometheus", "alerts.yml")
	groups, errs := rulefmt.ParseFile(file, false, model.UTF8Validation, promql, slog.New(slog.DiscardHandler))
	require.Empty(t, errs, "alerts.yml does not parse")
	require.NotEmpty(t, groups.Groups)

	used := map[string]bool{}
	alertNames := map[string]bool{}
	for _, g := range groups.Groups {
		require.NotEmpty(t, g.Rules, "group %s is empty", g.Name)
		for _, r := range g.Rules {
			require.NotEmpty(t, r.Alert, "group %s: only alerting rules belong here", g.Name)
			require.False(t, alertNames[r.Alert], "alert %s is defined twice", r.Alert)
			alertNames[r.Alert] = true
			require.Contains(t, []string{"critical", "warning"}, r.Labels["severity"], "alert %s needs severity critical or warning", r.Alert)
			require.NotEmpty(t, r.Annotations["summary"], "alert %s needs a summary", r.Alert)
			for _, name := range checkPromQL(t, "alert "+r.Alert, r.Expr) {
				used[name] = true
			}
			if keepsNetwork(t, r.Alert, r.Expr) {
				for _, a := range []string{"summary", "description"} {
					if a == "summary" || r.Annotations[a] != "" {
						require.Contains(t, r.Annotations[a], "{{ $labels.network }}", "alert %s: its %s names the network", r.Alert, a)
					}
				}
			}
		}
	}

	// The seed's alerts and issue 6's, by the metric each must watch.
	for _, name := range []string{
		"settle_reconcile_runs_total",       // balance check not running
		"settle_chain_rpc_errors_total",     // RPC errors
		"settle_task_retries_total",         // retry/success ratio
		"settle_tasks_total",                //   "
		"settle_queue_depth",                // queue depth
		"settle_chain_breaker_state",        // breaker open
		"settle_dlq_writes_total",           // DLQ growth
		"settle_dlq_fallback_entries",       // DLQ fallback not empty
		"settle_api_http_requests_total",    // webhook 5xx ratio
		"settle_reconcile_mismatches_total", // reconciliation mismatch
		"settle_event_latency_seconds_bucket",
		"settle_alert_delivery_failures_total",
		"settle_zombie_events",
	} {
		require.True(t, used[name], "no alert watches %s", name)
	}
}

// TestPrometheusConfig checks prometheus.yml: its rule files exist, and it
// scrapes each settle service of compose.yaml on the port that service
// listens on.
func TestPrometheusConfig(t *testing.T) {
	root := repoRoot(t)
	dir := filepath.Join(root, "configs", "prometheus")
	raw, err := os.ReadFile(filepath.Join(dir, "prometheus.yml"))
	require.NoError(t, err)
	var cfg struct {
		Global    map[string]any `yaml:"global"`
		RuleFiles []string       `yaml:"rule_files"`
		Alerting  struct {
			Alertmanagers []struct {
				StaticConfigs []struct {
					Targets []string `yaml:"targets"`
				} `yaml:"static_configs"`
			} `yaml:"alertmanagers"`
		} `yaml:"alerting"`
		ScrapeConfigs []struct {
			JobName      string `yaml:"job_name"`
			MetricsPath  string `yaml:"metrics_path"`
			HonorLabels  bool   `yaml:"honor_labels"`
			DNSSDConfigs []struct {
				Names []string `yaml:"names"`
				Type  string   `yaml:"type"`
				Port  int      `yaml:"port"`
			} `yaml:"dns_sd_configs"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(raw)))
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(&cfg))

	require.Contains(t, cfg.RuleFiles, "alerts.yml")
	for _, f := range cfg.RuleFiles {
		require.FileExists(t, filepath.Join(dir, f), "rule file %s", f)
	}

	compose := loadCompose(t)
	// Alerts go to the compose service alertmanager.
	var alertmanagers []string
	for _, am := range cfg.Alerting.Alertmanagers {
		for _, sc := range am.StaticConfigs {
			alertmanagers = append(alertmanagers, sc.Targets...)
		}
	}
	require.Equal(t, []string{"alertmanager:9093"}, alertmanagers, "Prometheus sends its alerts to compose's alertmanager")
	_, ok := compose.Services["alertmanager"]
	require.True(t, ok, "compose.yaml has no alertmanager service")

	// service -> port scraped, and whether labels are honoured.
	scraped := map[string]int{}
	honor := map[string]bool{}
	jobs := map[string]bool{}
	for _, sc := range cfg.ScrapeConfigs {
		require.False(t, jobs[sc.JobName], "scrape job %s twice", sc.JobName)
		jobs[sc.JobName] = true
		require.Contains(t, []string{"", "/metrics"}, sc.MetricsPath, "job %s", sc.JobName)
		for _, d := range sc.DNSSDConfigs {
			require.Equal(t, "A", d.Type, "job %s", sc.JobName)
			for _, n := range d.Names {
				_, ok := compose.Services[n]
				require.True(t, ok, "job %s scrapes %s, which compose.yaml does not define", sc.JobName, n)
				scraped[n] = d.Port
				honor[n] = sc.HonorLabels
			}
		}
	}
	for _, svc := range []string{"api", "worker", "scheduler"} {
		require.Equal(t, binaries[svc].port, scraped[svc], "prometheus.yml must scrape %s on its port", svc)
		require.Equal(t, binaries[svc].port, composeListenPort(t, compose, svc), "compose's %s listens elsewhere", svc)
	}
	// The scheduler's job metrics have a `job` label of their own, and
	// alerts.yml selects on it: the scrape must keep it.
	require.True(t, honor["scheduler"], "the scheduler must be scraped with honor_labels: true")
}

// keepsNetwork checks that an alert on a series with a network label (the
// chain's, the backlog's, the scanner's, the gate's) never aggregates the
// label away: every aggregation over such a series groups by network, so
// one alert fires per network and can name it. It reports whether the
// alert watches such a series.
func keepsNetwork(t *testing.T, alert, expr string) bool {
	t.Helper()
	parsed, err := promql.ParseExpr(expr)
	require.NoError(t, err)
	known := exportedSeries(t)
	networked := func(n parser.Node) bool {
		found := false
		parser.Inspect(n, func(node parser.Node, _ []parser.Node) error {
			if vs, ok := node.(*parser.VectorSelector); ok && known[vs.Name].labels["network"] {
				found = true
			}
			return nil
		})
		return found
	}
	parser.Inspect(parsed, func(node parser.Node, _ []parser.Node) error {
		if agg, ok := node.(*parser.AggregateExpr); ok && networked(agg.Expr) {
			require.True(t, !agg.Without && slicesContains(agg.Grouping, "network"),
				"alert %s: %s aggregates the network away; group by (network)", alert, agg)
		}
		return nil
	})
	return networked(parsed)
}
