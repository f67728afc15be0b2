package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

type grafanaPanel struct {
	ID         int                      `json:"id"`
	Type       string                   `json:"type"`
	Title      string                   `json:"title"`
	Datasource *grafanaDS               `json:"datasource"`
	GridPos    struct{ H, W, X, Y int } `json:"gridPos"`
	Targets    []struct {
		RefID        string     `json:"refId"`
		Expr         string     `json:"expr"`
		LegendFormat string     `json:"legendFormat"`
		Datasource   *grafanaDS `json:"datasource"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"`
}

type grafanaDS struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// grafanaVariables are Grafana's built-in range variables and the
// dashboard's own (network, instance, multi-valued regexes); a fixed value
// stands in for each when the expression is parsed.
var grafanaVariables = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h",
	"${network}", ".*", "$network", ".*", "${instance}", ".*", "$instance", ".*")

// grafanaTemplate is expr with its variables replaced.
func grafanaTemplate(expr string) string { return grafanaVariables.Replace(expr) }

func jsonUnmarshal(raw []byte, into any) error { return json.Unmarshal(raw, into) }

// dashboardDatasource is the dashboard's datasource variable: imported
// anywhere, the dashboard asks which Prometheus to use.
const dashboardDatasource = "${datasource}"

type grafanaVariable struct {
	Name       string     `json:"name"`
	Type       string     `json:"type"`
	Query      any        `json:"query"`
	Definition string     `json:"definition"`
	Datasource *grafanaDS `json:"datasource"`
	IncludeAll bool       `json:"includeAll"`
	Multi      bool       `json:"multi"`
	AllValue   string     `json:"allValue"`
}

var labelValuesQuery = regexp.MustCompile(`^label_values\((.+), *([a-z_]+)\)$`)

// TestGrafanaProvisioning checks the datasource and dashboard provider
// files, and that the provider reads the folder compose.yaml mounts.
func TestGrafanaProvisioning(t *testing.T) {
	root := repoRoot(t)
	dir := filepath.Join(root, "configs", "grafana", "provisioning")

	var ds struct {
		APIVersion  int `yaml:"apiVersion"`
		Datasources []struct {
			Name, UID, Type, Access, URL string
			IsDefault                    bool           `yaml:"isDefault"`
			Editable                     bool           `yaml:"editable"`
			JSONData                     map[string]any `yaml:"jsonData"`
		} `yaml:"datasources"`
	}
	decodeStrict(t, filepath.Join(dir, "datasources", "prometheus.yml"), &ds)
	require.Equal(t, 1, ds.APIVersion)
	require.Len(t, ds.Datasources, 1)
	require.Equal(t, "prometheus", ds.Datasources[0].Type)
	require.Equal(t, "http://prometheus:9090", ds.Datasources[0].URL, "the compose service prometheus")
	require.Equal(t, grafanaDatasourceUID, ds.Datasources[0].UID)

	var providers struct {
		APIVersion int `yaml:"apiVersion"`
		Providers  []struct {
			Name, Folder, Type    string
			DisableDeletion       bool `yaml:"disableDeletion"`
			AllowUIUpdates        bool `yaml:"allowUiUpdates"`
			UpdateIntervalSeconds int  `yaml:"updateIntervalSeconds"`
			Options               struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	decodeStrict(t, filepath.Join(dir, "dashboards", "settle.yml"), &providers)
	require.Len(t, providers.Providers, 1)
	require.Equal(t, "file", providers.Providers[0].Type)

	// The provider's path is where compose mounts configs/grafana/dashboards.
	mountedAt := ""
	for _, v := range loadCompose(t).Services["grafana"].Volumes {
		if src, rest, _ := strings.Cut(v, ":"); src == "./configs/grafana/dashboards" {
			mountedAt, _, _ = strings.Cut(rest, ":")
		}
	}
	require.Equal(t, mountedAt, providers.Providers[0].Options.Path, "the dashboard provider reads the mounted folder")
}

const grafanaDatasourceUID = "settle-prometheus"

func decodeStrict(t *testing.T, file string, into any) {
	t.Helper()
	f, err := os.Open(file)
	require.NoError(t, err)
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(into), file)
}

// TestGrafanaDashboard checks the dashboard JSON: unique panel ids, panels
// that do not overlap, every query on the provisioned datasource, and
// every query naming only metrics settle exports; and that it shows what
// an operator needs.
func TestGrafanaDashboard(t *testing.T) {
	root := repoRoot(t)
	matches, err := filepath.Glob(filepath.Join(root, "configs", "grafana", "dashboards", "*.json"))
	require.NoError(t, err)
	require.NotEmpty(t, matches)
	used := map[string]bool{}
	for _, file := range matches {
		raw, err := os.ReadFile(file)
		require.NoError(t, err)
		var dash struct {
			UID        string         `json:"uid"`
			Title      string         `json:"title"`
			Panels     []grafanaPanel `json:"panels"`
			Templating struct {
				List []grafanaVariable `json:"list"`
			} `json:"templating"`
		}
		require.NoError(t, json.Unmarshal(raw, &dash), file)
		require.NotEmpty(t, dash.UID, file)
		require.NotEmpty(t, dash.Title, file)
		require.NotContains(t, string(raw), grafanaDatasourceUID, "%s: no hard-coded datasource uid (it breaks on import); use %s", file, dashboardDatasource)

		// The variables: the datasource, then network and instance, each
		// a label_values query of an exported series on that datasource.
		vars := map[string]grafanaVariable{}
		for _, v := range dash.Templating.List {
			vars[v.Name] = v
		}
		require.Equal(t, "datasource", vars["datasource"].Type, "%s: a datasource variable", file)
		require.Equal(t, "prometheus", vars["datasource"].Query, "%s: the datasource variable lists Prometheus datasources", file)
		for _, name := range []string{"network", "instance"} {
			v, ok := vars[name]
			require.True(t, ok, "%s: no %s variable", file, name)
			require.Equal(t, "query", v.Type, "%s: variable %s", file, name)
			require.NotNil(t, v.Datasource, "%s: variable %s", file, name)
			require.Equal(t, dashboardDatasource, v.Datasource.UID, "%s: variable %s queries another datasource", file, name)
			require.True(t, v.IncludeAll && v.Multi && v.AllValue == ".*", "%s: variable %s: multi-valued with All as .*", file, name)
			m := labelValuesQuery.FindStringSubmatch(v.Definition)
			require.NotNil(t, m, "%s: variable %s: label_values(series, label)", file, name)
			require.Equal(t, name, m[2], "%s: variable %s reads another label", file, name)
			checkPromQL(t, "variable "+name, m[1])
			series := exportedSeries(t)
			for _, metric := range checkPromQL(t, "variable "+name, m[1]) {
				if s := series[metric]; s.labels != nil {
					require.True(t, s.labels[name], "%s: variable %s: %s has no label %s", file, name, metric, name)
				}
			}
		}
		varUsed := map[string]bool{}

		ids := map[int]bool{}
		var cells []grafanaPanel
		var walk func(ps []grafanaPanel)
		walk = func(ps []grafanaPanel) {
			for _, p := range ps {
				require.False(t, ids[p.ID], "%s: panel id %d twice", file, p.ID)
				ids[p.ID] = true
				require.NotEmpty(t, p.Title, "%s: panel %d has no title", file, p.ID)
				require.Positive(t, p.GridPos.W, "%s: panel %q has no gridPos", file, p.Title)
				require.LessOrEqual(t, p.GridPos.X+p.GridPos.W, 24, "%s: panel %q is wider than the grid", file, p.Title)
				cells = append(cells, p)
				walk(p.Panels)
				if p.Type == "row" {
					continue
				}
				require.NotEmpty(t, p.Targets, "%s: panel %q has no query", file, p.Title)
				if p.Datasource != nil {
					require.Equal(t, dashboardDatasource, p.Datasource.UID, "%s: panel %q uses another datasource", file, p.Title)
				}
				for _, tg := range p.Targets {
					require.False(t, tg.Datasource == nil && p.Datasource == nil, "%s: panel %q has no datasource", file, p.Title)
					if tg.Datasource != nil {
						require.Equal(t, dashboardDatasource, tg.Datasource.UID, "%s: panel %q query %s uses another datasource", file, p.Title, tg.RefID)
					}
					// Every query follows the instance picker.
					require.Contains(t, tg.Expr, `instance=~"$instance"`, "%s: panel %q query %s ignores $instance", file, p.Title, tg.RefID)
					for _, name := range []string{"network", "instance"} {
						varUsed[name] = varUsed[name] || strings.Contains(tg.Expr, "$"+name)
					}
					for _, name := range checkPromQL(t, "panel "+p.Title, grafanaVariables.Replace(tg.Expr)) {
						used[name] = true
					}
					followsNetwork(t, file, p.Title, tg.Expr)
				}
			}
		}
		walk(dash.Panels)
		require.True(t, varUsed["network"], "%s: no panel uses $network", file)
		require.True(t, varUsed["instance"], "%s: no panel uses $instance", file)
		for i, a := range cells {
			for _, b := range cells[i+1:] {
				overlap := a.GridPos.X < b.GridPos.X+b.GridPos.W && b.GridPos.X < a.GridPos.X+a.GridPos.W &&
					a.GridPos.Y < b.GridPos.Y+b.GridPos.H && b.GridPos.Y < a.GridPos.Y+a.GridPos.H
				require.False(t, overlap, "%s: panels %q and %q overlap", file, a.Title, b.Title)
			}
		}
	}
	// What an on-call engineer looks for beyond the alerts' metrics
	// (TestGrafanaShowsAlertMetrics checks those).
	for _, name := range []string{
		"settle_tasks_total",                  // throughput by outcome
		"settle_event_latency_seconds_bucket", // latency percentiles
		"settle_queue_depth",
		"settle_dlq_writes_total", // by sink
		"settle_chain_breaker_state",
		"settle_api_http_requests_total", // webhook status codes
		"settle_reconcile_runs_total",
		"settle_reconcile_mismatches_total",
		"process_resident_memory_bytes",
		"go_goroutines",
		"settle_scan_passes_total", // errors, lease losses, restarted rescans
		"settle_internal_transfer_check_untraceable",
		"settle_recovery_requeued_total",
		"settle_recovery_dead_lettered_total",
		"settle_cleanup_deleted_rows_total",
		"settle_provider_deliveries_total", // a provider's deliveries refused
		"settle_redis_up",
		"settle_alerts_dropped_total",
	} {
		require.True(t, used[name], "the dashboard shows nothing of %s", name)
	}
}

// networkPicked stands in for $network when a query is checked for it.
const networkPicked = "NETWORK_PICKED"

// followsNetwork: every selector of a series with a network label (the
// chain's, the gate's, the scanner's, the backlog's) follows the network
// picker, so picking a network shows that network's chain alone.
func followsNetwork(t *testing.T, file, title, expr string) {
	t.Helper()
	picked := strings.NewReplacer("${network}", networkPicked, "$network", networkPicked).Replace(expr)
	parsed, err := promql.ParseExpr(grafanaVariables.Replace(picked))
	require.NoError(t, err, "%s: panel %q: %s", file, title, expr)
	known := exportedSeries(t)
	parser.Inspect(parsed, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok || !known[vs.Name].labels["network"] {
			return nil
		}
		follows := false
		for _, m := range vs.LabelMatchers {
			follows = follows || (m.Name == "network" && m.Type == labels.MatchRegexp && m.Value == networkPicked)
		}
		require.True(t, follows, "%s: panel %q: %s ignores $network (network=~\"$network\")", file, title, vs.Name)
		return nil
	})
}

// dashboardTarget is one query of a dashboard panel.
type dashboardTarget struct {
	file, panel, expr, legend string
}

// dashboardTargets is every query of every dashboard.
func dashboardTargets(t *testing.T) []dashboardTarget {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(repoRoot(t), "configs", "grafana", "dashboards", "*.json"))
	require.NoError(t, err)
	require.NotEmpty(t, matches)
	var out []dashboardTarget
	var walk func(file string, ps []grafanaPanel)
	walk = func(file string, ps []grafanaPanel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				out = append(out, dashboardTarget{filepath.Base(file), p.Title, tg.Expr, tg.LegendFormat})
			}
			walk(file, p.Panels)
		}
	}
	for _, file := range matches {
		raw, err := os.ReadFile(file)
		require.NoError(t, err)
		var dash struct {
			Panels []grafanaPanel `json:"panels"`
		}
		require.NoError(t, json.Unmarshal(raw, &dash), file)
		walk(file, dash.Panels)
	}
	return out
}

// TestGrafanaShowsAlertMetrics: every series an alert rule reads is on a
// dashboard, so the on-call engineer an alert wakes can see how it got
// there. The bounds' own gauges (an interval, a timeout) count too: a
// panel shows the bound next to the value it holds.
func TestGrafanaShowsAlertMetrics(t *testing.T) {
	shown := map[string]bool{}
	for _, tg := range dashboardTargets(t) {
		for _, name := range checkPromQL(t, tg.file+": panel "+tg.panel, grafanaTemplate(tg.expr)) {
			shown[name] = true
		}
	}
	for _, r := range alertRules(t) {
		for _, name := range checkPromQL(t, "alert "+r.Alert, r.Expr) {
			require.True(t, shown[name], "alert %s reads %s, which no dashboard panel shows", r.Alert, name)
		}
	}
}

var legendLabel = regexp.MustCompile(`{{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*}}`)

// TestGrafanaLegendLabels: a legend names only labels its query keeps; a
// label aggregated away prints as nothing, and the series cannot be told
// apart.
func TestGrafanaLegendLabels(t *testing.T) {
	for _, tg := range dashboardTargets(t) {
		if tg.legend == "" {
			continue
		}
		parsed, err := promql.ParseExpr(grafanaTemplate(tg.expr))
		require.NoError(t, err, "%s: panel %q: %s", tg.file, tg.panel, tg.expr)
		kept, known := outputLabels(t, parsed)
		if !known {
			continue
		}
		for _, m := range legendLabel.FindAllStringSubmatch(tg.legend, -1) {
			require.True(t, kept[m[1]], "%s: panel %q: legend %q names %s, which %s does not keep (it keeps %v)",
				tg.file, tg.panel, tg.legend, m[1], tg.expr, sortedKeys(kept))
		}
	}
}

// outputLabels is the labels the result of node can carry, and false
// when that cannot be told (without, label_replace, group_left, ...).
func outputLabels(t *testing.T, node parser.Node) (map[string]bool, bool) {
	t.Helper()
	set := func(names ...string) map[string]bool {
		m := map[string]bool{}
		for _, n := range names {
			m[n] = true
		}
		return m
	}
	switch n := node.(type) {
	case *parser.ParenExpr:
		return outputLabels(t, n.Expr)
	case *parser.StepInvariantExpr:
		return outputLabels(t, n.Expr)
	case *parser.UnaryExpr:
		return outputLabels(t, n.Expr)
	case *parser.SubqueryExpr:
		return outputLabels(t, n.Expr)
	case *parser.MatrixSelector:
		return outputLabels(t, n.VectorSelector)
	case *parser.NumberLiteral, *parser.StringLiteral:
		return set(), true
	case *parser.VectorSelector:
		s, ok := exportedSeries(t)[n.Name]
		if !ok || s.labels == nil {
			return nil, false
		}
		return s.labels, true
	case *parser.AggregateExpr:
		switch n.Op {
		case parser.TOPK, parser.BOTTOMK, parser.COUNT_VALUES, parser.LIMITK, parser.LIMIT_RATIO:
			return nil, false
		}
		if n.Without {
			return nil, false
		}
		return set(n.Grouping...), true
	case *parser.Call:
		switch n.Func.Name {
		case "time", "vector", "scalar", "pi":
			return set(), true
		case "histogram_quantile":
			in, ok := outputLabels(t, n.Args[1])
			if !ok {
				return nil, false
			}
			out := set()
			for l := range in {
				if l != "le" {
					out[l] = true
				}
			}
			return out, true
		case "label_replace", "label_join", "absent", "absent_over_time", "sort_by_label", "sort_by_label_desc":
			return nil, false
		}
		for _, a := range n.Args {
			if a.Type() == parser.ValueTypeVector || a.Type() == parser.ValueTypeMatrix {
				return outputLabels(t, a)
			}
		}
		return nil, false
	case *parser.BinaryExpr:
		lt, rt := n.LHS.Type(), n.RHS.Type()
		switch {
		case lt == parser.ValueTypeScalar && rt == parser.ValueTypeScalar:
			return set(), true
		case lt == parser.ValueTypeScalar:
			return outputLabels(t, n.RHS)
		case rt == parser.ValueTypeScalar:
			return outputLabels(t, n.LHS)
		}
		vm := n.VectorMatching
		switch n.Op {
		case parser.LAND, parser.LUNLESS:
			return outputLabels(t, n.LHS)
		case parser.LOR:
			// A series of either side: only the labels both keep.
			l, lok := outputLabels(t, n.LHS)
			r, rok := outputLabels(t, n.RHS)
			if !lok || !rok {
				return nil, false
			}
			out := set()
			for k := range l {
				if r[k] {
					out[k] = true
				}
			}
			return out, true
		}
		if vm != nil && vm.Card != parser.CardOneToOne {
			return nil, false
		}
		if vm != nil && vm.On {
			return set(vm.MatchingLabels...), true
		}
		l, ok := outputLabels(t, n.LHS)
		if !ok {
			return nil, false
		}
		out := set()
		for k := range l {
			out[k] = true
		}
		if vm != nil {
			for _, k := range vm.MatchingLabels {
				delete(out, k)
			}
		}
		return out, true
	}
	return nil, false
}
