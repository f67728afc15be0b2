// Package deploy checks the deployment and observability files (Dockerfile,
// compose.yaml, deploy/k8s, configs/prometheus, configs/grafana) against the
// Go source: the settings each binary reads, the metrics it exports, the
// ports it listens on. No Docker engine, cluster or database is needed.
package deploy

import (
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/test/deploy/deployenv"
)

const modulePath = "github.com/settle/settle"

// binaries are the long-running settle binaries and their listen port.
var binaries = map[string]struct {
	addrSetting string
	port        int
}{
	"api":       {"HTTP_ADDR", 8080},
	"worker":    {"METRICS_ADDR", 9091},
	"scheduler": {"METRICS_ADDR", 9092},
}

// contractRequired are the settings CONTRACT.md makes required, on top of
// what the source scan finds.
var contractRequired = map[string][]string{
	"api":       {"DATABASE_URL", "WEBHOOK_SECRET", "ADMIN_TOKEN", "API_TOKEN"},
	"worker":    {"DATABASE_URL"},
	"scheduler": {"DATABASE_URL"},
}

// secretLengthMin is CONTRACT.md's bound for the api's secrets.
const secretLengthMin = 32

var secretSettings = []string{"WEBHOOK_SECRET", "ADMIN_TOKEN", "API_TOKEN"}

// repoRoot is the module root, two levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(root, "go.mod"))
	require.NoError(t, err, "the module root holds go.mod")
	return root
}

// localPackages walks the module-local imports of the package in dir
// (relative to root) and returns each package's directory and build info.
func localPackages(t *testing.T, root, dir string) map[string]*build.Package {
	t.Helper()
	out := map[string]*build.Package{}
	queue := []string{dir}
	for len(queue) > 0 {
		d := queue[0]
		queue = queue[1:]
		if _, seen := out[d]; seen {
			continue
		}
		pkg, err := build.Default.ImportDir(filepath.Join(root, d), 0)
		require.NoError(t, err, "package %s", d)
		out[d] = pkg
		for _, imp := range pkg.Imports {
			if rel, ok := strings.CutPrefix(imp, modulePath+"/"); ok {
				queue = append(queue, filepath.FromSlash(rel))
			}
		}
	}
	return out
}

// binarySource is what one binary's code says about its settings.
type binarySource struct {
	// literals are every upper-case string literal in the binary's code:
	// a setting it reads appears among them, however it is read.
	literals map[string]bool
	// required are the names passed to config's Required or Secret.
	required map[string]bool
}

var (
	sourceMu    sync.Mutex
	sourceCache = map[string]binarySource{}
)

var settingName = regexp.MustCompile(`^[A-Z][A-Z0-9_]*[A-Z0-9]$`)

// sourceOf scans cmd/<binary> and the module packages it imports.
func sourceOf(t *testing.T, binary string) binarySource {
	t.Helper()
	sourceMu.Lock()
	defer sourceMu.Unlock()
	if s, ok := sourceCache[binary]; ok {
		return s
	}
	root := repoRoot(t)
	s := binarySource{literals: map[string]bool{}, required: map[string]bool{}}
	fset := token.NewFileSet()
	for dir, pkg := range localPackages(t, root, filepath.Join("cmd", binary)) {
		for _, name := range pkg.GoFiles {
			file, err := parser.ParseFile(fset, filepath.Join(root, dir, name), nil, parser.SkipObjectResolution)
			require.NoError(t, err)
			ast.Inspect(file, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.BasicLit:
					if v, ok := stringLit(n); ok && settingName.MatchString(v) {
						s.literals[v] = true
					}
				case *ast.CallExpr:
					sel, ok := n.Fun.(*ast.SelectorExpr)
					if !ok || len(n.Args) == 0 || (sel.Sel.Name != "Required" && sel.Sel.Name != "Secret") {
						return true
					}
					if v, ok := stringLit(n.Args[0]); ok && settingName.MatchString(v) {
						s.required[v] = true
					}
				}
				return true
			})
		}
	}
	require.NotEmpty(t, s.literals, "cmd/%s reads no settings?", binary)
	sourceCache[binary] = s
	return s
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	v, err := strconv.Unquote(lit.Value)
	return v, err == nil
}

// requiredSettings is what the binary refuses to start without.
func requiredSettings(t *testing.T, binary string) []string {
	set := map[string]bool{}
	for name := range sourceOf(t, binary).required {
		set[name] = true
	}
	for _, name := range contractRequired[binary] {
		set[name] = true
	}
	return sortedKeys(set)
}

// checkEnv checks one container's environment against its binary: every
// name is read by the binary, every required setting is set, the secrets
// are long enough and the tokens differ. values may be nil where a value is
// not known (a Secret reference).
func checkEnv(t *testing.T, where, binary string, env map[string]*string, required []string) {
	t.Helper()
	src := sourceOf(t, binary)
	for _, name := range sortedKeys(env) {
		require.True(t, src.literals[name] || deployenv.GoRuntimeSettings[name], "%s sets %s, which %s never reads (drifted from the code?)", where, name, binary)
	}
	for _, name := range required {
		v, ok := env[name]
		require.True(t, ok, "%s does not set %s, which %s requires", where, name, binary)
		if v != nil {
			require.NotEmpty(t, strings.TrimSpace(*v), "%s sets %s empty, which %s requires", where, name, binary)
		}
	}
	for _, name := range secretSettings {
		if v := env[name]; v != nil && slicesContains(required, name) {
			require.GreaterOrEqual(t, len(*v), secretLengthMin, "%s: %s must have at least %d characters", where, name, secretLengthMin)
		}
	}
	if a, b := env["API_TOKEN"], env["ADMIN_TOKEN"]; a != nil && b != nil {
		require.NotEqual(t, *a, *b, "%s: API_TOKEN must differ from ADMIN_TOKEN", where)
	}
}

func slicesContains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// series is one exported time series name and the labels it may carry.
type series struct {
	metric string
	// labels is nil when the scan could not tell (any label is accepted).
	labels map[string]bool
}

var (
	exportedOnce sync.Once
	exported     map[string]series
	exportedErr  error
)

// targetLabels are added by Prometheus to every scraped series.
var targetLabels = []string{"job", "instance"}

// wrappedLabels are added by a wrapping registerer to every series whose
// name has the prefix: pkg/finality registers each network's chain client
// and finality checker through prometheus.WrapRegistererWith with the
// network's name (TestChainMetricsWrappedByNetwork keeps this honest).
var wrappedLabels = map[string][]string{"settle_chain_": {"network"}}

// exportedSeries is every series name a settle binary can export: the
// prometheus collectors declared in cmd/ and pkg/ (found by their Opts
// literals, histograms and summaries with their suffixes), the Go and
// process collectors every binary registers, and Prometheus' own `up`.
func exportedSeries(t *testing.T) map[string]series {
	t.Helper()
	exportedOnce.Do(func() { exported, exportedErr = scanExported(repoRoot(t)) })
	require.NoError(t, exportedErr)
	return exported
}

func scanExported(root string) (map[string]series, error) {
	out := map[string]series{}
	add := func(name, kind string, labels map[string]bool) {
		with := func(extra ...string) map[string]bool {
			if labels == nil {
				return nil
			}
			m := map[string]bool{}
			for l := range labels {
				m[l] = true
			}
			for prefix, wrapped := range wrappedLabels {
				if strings.HasPrefix(name, prefix) {
					extra = append(extra, wrapped...)
				}
			}
			for _, l := range append(extra, targetLabels...) {
				m[l] = true
			}
			return m
		}
		switch kind {
		case "histogram":
			out[name+"_bucket"] = series{name, with("le")}
			out[name+"_sum"] = series{name, with()}
			out[name+"_count"] = series{name, with()}
		case "summary":
			out[name] = series{name, with("quantile")}
			out[name+"_sum"] = series{name, with()}
			out[name+"_count"] = series{name, with()}
		default:
			out[name] = series{name, with()}
		}
	}

	fset := token.NewFileSet()
	for _, top := range []string{"cmd", "pkg"} {
		err := filepath.WalkDir(filepath.Join(root, top), func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && d.Name() == "testdata" {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return nil
			}
			file, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			scanCollectors(file, add)
			return nil
		})
		if err != nil {
			return nil, err
		}
	}

	// asynq's queue collector (the scheduler registers it): its series
	// are declared with prometheus.NewDesc in its own package.
	if err := scanDescPackage(root, asynqMetricsPackage, add); err != nil {
		return nil, err
	}
	// The connection pool's collector declares its series the same way.
	if err := scanDescPackage(root, "github.com/settle/settle/pkg/postgres", add); err != nil {
		return nil, err
	}

	// The standard collectors, as every binary registers them.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	families, err := reg.Gather()
	if err != nil {
		return nil, err
	}
	for _, f := range families {
		labels := map[string]bool{}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = true
			}
		}
		kind := "counter"
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM:
			kind = "histogram"
		case dto.MetricType_SUMMARY:
			kind = "summary"
		}
		add(f.GetName(), kind, labels)
	}
	add("up", "gauge", map[string]bool{})
	return out, nil
}

// scanCollectors finds prometheus.{Counter,Gauge,Histogram,Summary}Opts
// literals; when one is the first argument of a New...Vec call with a
// literal label list, the labels are recorded too.
func scanCollectors(file *ast.File, add func(name, kind string, labels map[string]bool)) {
	seen := map[*ast.CompositeLit]bool{}
	ast.Inspect(file, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) == 0 {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || !strings.HasPrefix(sel.Sel.Name, "New") {
			return true
		}
		lit, name, kind := optsLiteral(call.Args[0])
		if lit == nil {
			return true
		}
		seen[lit] = true
		if name == "" {
			return true
		}
		var labels map[string]bool
		switch sel.Sel.Name {
		case "NewCounter", "NewGauge", "NewHistogram", "NewSummary":
			labels = map[string]bool{}
		case "NewCounterVec", "NewGaugeVec", "NewHistogramVec", "NewSummaryVec":
			if len(call.Args) < 2 {
				break
			}
			if list, ok := call.Args[1].(*ast.CompositeLit); ok {
				labels = map[string]bool{}
				for _, e := range list.Elts {
					v, ok := stringLit(e)
					if !ok {
						labels = nil
						break
					}
					labels[v] = true
				}
			}
		}
		add(name, kind, labels)
		return true
	})
	// Opts built apart from the call: the name is known, the labels not.
	ast.Inspect(file, func(n ast.Node) bool {
		lit, ok := n.(*ast.CompositeLit)
		if !ok || seen[lit] {
			return true
		}
		if _, name, kind := optsLiteral(lit); name != "" {
			add(name, kind, nil)
		}
		return true
	})
}

var optsKinds = map[string]string{
	"CounterOpts": "counter", "GaugeOpts": "gauge", "HistogramOpts": "histogram", "SummaryOpts": "summary",
}

// optsLiteral reads Namespace, Subsystem and Name of an Opts literal.
func optsLiteral(e ast.Expr) (*ast.CompositeLit, string, string) {
	if u, ok := e.(*ast.UnaryExpr); ok && u.Op == token.AND {
		e = u.X
	}
	lit, ok := e.(*ast.CompositeLit)
	if !ok {
		return nil, "", ""
	}
	sel, ok := lit.Type.(*ast.SelectorExpr)
	if !ok {
		return nil, "", ""
	}
	kind, ok := optsKinds[sel.Sel.Name]
	if !ok {
		return nil, "", ""
	}
	var parts []string
	fields := map[string]string{}
	for _, el := range lit.Elts {
		kv, ok := el.(*ast.KeyValueExpr)
		if !ok {
			continue
		}
		key, ok := kv.Key.(*ast.Ident)
		if !ok {
			continue
		}
		if v, ok := stringLit(kv.Value); ok {
			fields[key.Name] = v
		}
	}
	if fields["Name"] == "" {
		return lit, "", ""
	}
	for _, f := range []string{"Namespace", "Subsystem", "Name"} {
		if fields[f] != "" {
			parts = append(parts, fields[f])
		}
	}
	return lit, strings.Join(parts, "_"), kind
}

// fileExists reports whether root/rel exists.
func fileExists(root, rel string) bool {
	_, err := os.Stat(filepath.Join(root, filepath.FromSlash(path.Clean(rel))))
	return err == nil
}

// asynqMetricsPackage is asynq's Prometheus collector.
const asynqMetricsPackage = "github.com/hibiken/asynq/x/metrics"

// scanDescPackage finds prometheus.NewDesc(prometheus.BuildFQName(ns, sub,
// name), help, []string{labels...}, ...) in an imported package's source,
// resolving ns, sub and name from string literals or the file's string
// constants. Const metrics have no kind: counters and gauges alike.
func scanDescPackage(root, importPath string, add func(name, kind string, labels map[string]bool)) error {
	pkg, err := build.Import(importPath, root, 0)
	if err != nil {
		return err
	}
	fset := token.NewFileSet()
	for _, name := range pkg.GoFiles {
		file, err := parser.ParseFile(fset, filepath.Join(pkg.Dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		consts := map[string]string{}
		for _, decl := range file.Decls {
			gen, ok := decl.(*ast.GenDecl)
			if !ok || gen.Tok != token.CONST {
				continue
			}
			for _, spec := range gen.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if i < len(vs.Values) {
						if v, ok := stringLit(vs.Values[i]); ok {
							consts[n.Name] = v
						}
					}
				}
			}
		}
		str := func(e ast.Expr) (string, bool) {
			if v, ok := stringLit(e); ok {
				return v, true
			}
			if id, ok := e.(*ast.Ident); ok {
				v, ok := consts[id.Name]
				return v, ok
			}
			return "", false
		}
		ast.Inspect(file, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) < 3 {
				return true
			}
			if sel, ok := call.Fun.(*ast.SelectorExpr); !ok || sel.Sel.Name != "NewDesc" {
				return true
			}
			var metric string
			if fq, ok := call.Args[0].(*ast.CallExpr); ok && len(fq.Args) == 3 {
				var parts []string
				for _, a := range fq.Args {
					v, ok := str(a)
					if !ok {
						return true
					}
					if v != "" {
						parts = append(parts, v)
					}
				}
				metric = strings.Join(parts, "_")
			} else if v, ok := str(call.Args[0]); ok {
				metric = v
			}
			if metric == "" {
				return true
			}
			var labels map[string]bool
			if list, ok := call.Args[2].(*ast.CompositeLit); ok {
				labels = map[string]bool{}
				for _, e := range list.Elts {
					v, ok := stringLit(e)
					if !ok {
						labels = nil
						break
					}
					labels[v] = true
				}
			} else if id, ok := call.Args[2].(*ast.Ident); ok && id.Name == "nil" {
				labels = map[string]bool{}
			}
			add(metric, "gauge", labels)
			return true
		})
	}
	return nil
}
