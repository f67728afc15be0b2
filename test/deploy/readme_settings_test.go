package deploy

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// envReaders are config.Env's methods that read a setting (Reject only
// refuses one already read); config.Parse reads its second argument.
var envReaders = map[string]bool{
	"String": true, "Required": true, "Secret": true, "Duration": true, "DurationWithin": true,
	"Int": true, "Bool": true, "OneOf": true, "URL": true,
}

// readOutsideConfig are README rows read by other code than config.Env,
// with the directory whose source names them (so a rename shows here).
var readOutsideConfig = map[string]string{
	"GOGC":                        "pkg/procs",   // procs.TuneGC, through os.Getenv
	"OTEL_EXPORTER_OTLP_ENDPOINT": "pkg/tracing", // tracing.Begin, with the other OTEL_* settings
}

// settingRead is one config.Env read found in the source.
type settingRead struct {
	name string // a per-network name ends in <NETWORK>
	dir  string // package directory, slash-separated, relative to the root
	pos  string
	fn   string // the enclosing function (funcKey), "" at package level
}

// readmeSetting is one name of a row of README's settings table.
type readmeSetting struct {
	name   string
	usedBy map[string]bool // api, worker, scheduler, settlectl
	line   int
}

var (
	readmeName  = regexp.MustCompile("`([A-Z][A-Z0-9_]*(?:<NETWORK>)?)`")
	readmeProcs = regexp.MustCompile(`\b(all|api|worker|scheduler|settlectl)\b`)
)

// readmeSettings parses the rows of README's table under
// "| name | used by | default | meaning |".
func readmeSettings(readme string) ([]readmeSetting, error) {
	var out []readmeSetting
	in := false
	for i, line := range strings.Split(readme, "\n") {
		switch {
		case strings.HasPrefix(line, "| name | used by | default | meaning |"):
			if in || out != nil {
				return nil, fmt.Errorf("README.md:%d: a second settings table", i+1)
			}
			in = true
			continue
		case !in:
			continue
		case strings.HasPrefix(line, "|---"):
			continue
		case !strings.HasPrefix(line, "|"):
			in = false
			continue
		}
		cells := strings.Split(line, " | ")
		if len(cells) < 4 {
			return nil, fmt.Errorf("README.md:%d: a settings row without its four columns", i+1)
		}
		usedBy := map[string]bool{}
		for _, m := range readmeProcs.FindAllString(cells[1], -1) {
			if m == "all" {
				for _, b := range []string{"api", "worker", "scheduler", "settlectl"} {
					usedBy[b] = true
				}
				continue
			}
			usedBy[m] = true
		}
		names := readmeName.FindAllStringSubmatch(cells[0], -1)
		if len(names) == 0 || len(usedBy) == 0 {
			return nil, fmt.Errorf("README.md:%d: a settings row naming no setting or no process", i+1)
		}
		for _, m := range names {
			out = append(out, readmeSetting{name: m[1], usedBy: usedBy, line: i + 1})
		}
	}
	if out == nil {
		return nil, fmt.Errorf("README.md has no settings table")
	}
	return out, nil
}

// settingReads finds every config.Env read under cmd/ and pkg/ (test
// files aside). A name is a string literal, a constant, a concatenation
// (whose non-constant part is a network's name) or a call of a function
// returning such an expression (finality.RPCSetting).
func settingReads(root string) ([]settingRead, []string, *sourceIndex, error) {
	fset := token.NewFileSet()
	pkgs := map[string]*pkgSrc{} // by directory
	idx := &sourceIndex{pkgs: pkgs, methods: map[string][]funcRef{}}
	for _, top := range []string{"cmd", "pkg"} {
		err := filepath.WalkDir(filepath.Join(root, top), func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, filepath.Dir(p))
			dir := filepath.ToSlash(rel)
			ps := pkgs[dir]
			if ps == nil {
				ps = &pkgSrc{consts: map[string]ast.Expr{}, funcs: map[string]*ast.FuncDecl{}, funcFile: map[string]string{}}
				pkgs[dir] = ps
			}
			ps.files = append(ps.files, f)
			ps.paths = append(ps.paths, p)
			for _, decl := range f.Decls {
				switch decl := decl.(type) {
				case *ast.GenDecl:
					if decl.Tok != token.CONST {
						continue
					}
					for _, spec := range decl.Specs {
						vs := spec.(*ast.ValueSpec)
						for i, n := range vs.Names {
							if i < len(vs.Values) {
								ps.consts[n.Name] = vs.Values[i]
							}
						}
					}
				case *ast.FuncDecl:
					if decl.Recv == nil {
						ps.funcs[decl.Name.Name] = decl
						ps.funcFile[decl.Name.Name] = p
					} else {
						idx.methods[decl.Name.Name] = append(idx.methods[decl.Name.Name], funcRef{dir: dir, decl: decl, file: p})
					}
				}
			}
			return nil
		})
		if err != nil {
			return nil, nil, nil, err
		}
	}

	var reads []settingRead
	var unresolved []string
	for dir, ps := range pkgs {
		for _, f := range ps.files {
			imports := importsOf(f) // local name -> directory
			// resolve evaluates a name expression in package dir; params
			// are a function's parameters (a network's name).
			var resolve func(e ast.Expr, dir string, imports map[string]string, params map[string]bool) (string, bool)
			resolve = func(e ast.Expr, dir string, imports map[string]string, params map[string]bool) (string, bool) {
				switch e := e.(type) {
				case *ast.BasicLit:
					return stringLit(e)
				case *ast.ParenExpr:
					return resolve(e.X, dir, imports, params)
				case *ast.BinaryExpr:
					if e.Op != token.ADD {
						return "", false
					}
					l, ok1 := resolve(e.X, dir, imports, params)
					r, ok2 := resolve(e.Y, dir, imports, params)
					return l + r, ok1 && ok2
				case *ast.Ident:
					if params[e.Name] {
						return "<NETWORK>", true
					}
					if c, ok := pkgs[dir].consts[e.Name]; ok {
						return resolve(c, dir, imports, nil)
					}
					// A variable: a network's name (a name must start
					// with a constant, checked by the caller).
					return "<NETWORK>", true
				case *ast.SelectorExpr:
					x, ok := e.X.(*ast.Ident)
					if !ok || pkgs[imports[x.Name]] == nil {
						return "<NETWORK>", true // a field: as a variable
					}
					target := imports[x.Name]
					c, ok := pkgs[target].consts[e.Sel.Name]
					if !ok {
						return "", false
					}
					return resolve(c, target, fileImports(pkgs[target].files, e.Sel.Name), nil)
				case *ast.CallExpr:
					var fn *ast.FuncDecl
					fdir := dir
					switch f := e.Fun.(type) {
					case *ast.Ident:
						fn = pkgs[dir].funcs[f.Name]
					case *ast.SelectorExpr:
						if x, ok := f.X.(*ast.Ident); ok && pkgs[imports[x.Name]] != nil {
							fdir = imports[x.Name]
							fn = pkgs[fdir].funcs[f.Sel.Name]
						}
					}
					if fn == nil || len(fn.Body.List) != 1 {
						return "", false
					}
					ret, ok := fn.Body.List[0].(*ast.ReturnStmt)
					if !ok || len(ret.Results) != 1 {
						return "", false
					}
					ps := map[string]bool{}
					for _, field := range fn.Type.Params.List {
						for _, n := range field.Names {
							ps[n.Name] = true
						}
					}
					return resolve(ret.Results[0], fdir, fileImports(pkgs[fdir].files, fn.Name.Name), ps)
				}
				return "", false
			}
			for _, decl := range f.Decls {
				fn := packageLevel(dir)
				if fd, ok := decl.(*ast.FuncDecl); ok {
					fn = funcKey(dir, fd)
				}
				ast.Inspect(decl, func(n ast.Node) bool {
					if where, ok := envNotNamedEnv(n); ok {
						pos := fset.Position(n.Pos())
						rel, _ := filepath.Rel(root, pos.Filename)
						unresolved = append(unresolved, fmt.Sprintf("%s:%d (a *config.Env not named env: %s)", filepath.ToSlash(rel), pos.Line, where))
					}
					call, ok := n.(*ast.CallExpr)
					if !ok {
						return true
					}
					var nameArg ast.Expr
					fun := call.Fun
					if ix, ok := fun.(*ast.IndexExpr); ok { // config.Parse[T]
						fun = ix.X
					}
					sel, ok := fun.(*ast.SelectorExpr)
					if !ok {
						return true
					}
					x, _ := sel.X.(*ast.Ident)
					switch {
					case x != nil && x.Name == "config" && sel.Sel.Name == "Parse" && len(call.Args) >= 2:
						nameArg = call.Args[1]
					case x != nil && x.Name == "env" && envReaders[sel.Sel.Name] && len(call.Args) >= 1:
						nameArg = call.Args[0]
					default:
						return true
					}
					pos := fset.Position(call.Pos())
					relPos, _ := filepath.Rel(root, pos.Filename)
					where := fmt.Sprintf("%s:%d", filepath.ToSlash(relPos), pos.Line)
					name, ok := resolve(nameArg, dir, imports, nil)
					if !ok || !regexp.MustCompile(`^[A-Z][A-Z0-9_]*(<NETWORK>)?$`).MatchString(name) {
						unresolved = append(unresolved, where)
						return true
					}
					reads = append(reads, settingRead{name: name, dir: dir, pos: where, fn: fn})
					return true
				})
			}
		}
	}
	sort.Slice(reads, func(i, j int) bool { return reads[i].pos < reads[j].pos })
	return reads, unresolved, idx, nil
}

type pkgSrc struct {
	files    []*ast.File
	paths    []string // of files, in order
	consts   map[string]ast.Expr
	funcs    map[string]*ast.FuncDecl
	funcFile map[string]string
}

type funcRef struct {
	dir  string
	decl *ast.FuncDecl
	file string
}

// sourceIndex is every package under cmd/ and pkg/, parsed.
type sourceIndex struct {
	pkgs    map[string]*pkgSrc
	methods map[string][]funcRef // by method name
}

// packageLevel stands for a package's variable initialisers.
func packageLevel(dir string) string { return dir + ".(package level)" }

// envNotNamedEnv finds a *config.Env parameter or field, or a variable
// set from config.From..., named other than env: the scan above finds
// reads by that name.
func envNotNamedEnv(n ast.Node) (string, bool) {
	isConfig := func(e ast.Expr, name string) bool {
		sel, ok := e.(*ast.SelectorExpr)
		if !ok {
			return false
		}
		x, ok := sel.X.(*ast.Ident)
		return ok && x.Name == "config" && strings.HasPrefix(sel.Sel.Name, name)
	}
	switch n := n.(type) {
	case *ast.Field:
		if star, ok := n.Type.(*ast.StarExpr); ok && isConfig(star.X, "Env") {
			for _, name := range n.Names {
				if name.Name != "env" {
					return name.Name, true
				}
			}
		}
	case *ast.AssignStmt:
		for i, rhs := range n.Rhs {
			call, ok := rhs.(*ast.CallExpr)
			if !ok || !isConfig(call.Fun, "From") || i >= len(n.Lhs) {
				continue
			}
			if id, ok := n.Lhs[i].(*ast.Ident); !ok || id.Name != "env" {
				return fmt.Sprint(n.Lhs[i]), true
			}
		}
	}
	return "", false
}

func funcKey(dir string, decl *ast.FuncDecl) string {
	if decl.Recv == nil && decl.Name.Name != "init" { // a package may have several inits
		return dir + "." + decl.Name.Name
	}
	return fmt.Sprintf("%s.(%s at %d)", dir, decl.Name.Name, decl.Pos())
}

// reachable are the functions a binary may run: from main and every init
// of the packages it is built from (files: those its build includes),
// following every reference to a function of the module (a call or a
// function value) and, for a method, every method of that name. It
// over-approximates (a method named like another is followed too) but
// never leaves a called function out.
func (idx *sourceIndex) reachable(files map[string]bool) map[string]bool {
	seen := map[string]bool{}
	var queue []funcRef
	push := func(r funcRef) {
		if !files[r.file] {
			return
		}
		if k := funcKey(r.dir, r.decl); !seen[k] {
			seen[k] = true
			queue = append(queue, r)
		}
	}
	var roots []ast.Node
	var rootDirs []string
	for dir, ps := range idx.pkgs {
		for i, f := range ps.files {
			if !files[ps.paths[i]] {
				continue
			}
			for _, decl := range f.Decls {
				switch decl := decl.(type) {
				case *ast.FuncDecl:
					if decl.Recv == nil && (decl.Name.Name == "init" || decl.Name.Name == "main" && strings.HasPrefix(dir, "cmd/")) {
						push(funcRef{dir: dir, decl: decl, file: ps.paths[i]})
					}
				case *ast.GenDecl:
					if decl.Tok == token.VAR {
						roots, rootDirs = append(roots, decl), append(rootDirs, dir)
						seen[packageLevel(dir)] = true
					}
				}
			}
		}
	}
	visit := func(n ast.Node, dir string) {
		var imports map[string]string
		for _, f := range idx.pkgs[dir].files {
			if f.Pos() <= n.Pos() && n.End() <= f.End() {
				imports = importsOf(f)
			}
		}
		ast.Inspect(n, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.Ident:
				if decl, ok := idx.pkgs[dir].funcs[n.Name]; ok {
					push(funcRef{dir: dir, decl: decl, file: idx.pkgs[dir].funcFile[n.Name]})
				}
			case *ast.SelectorExpr:
				if x, ok := n.X.(*ast.Ident); ok && idx.pkgs[imports[x.Name]] != nil {
					target := imports[x.Name]
					if decl, ok := idx.pkgs[target].funcs[n.Sel.Name]; ok {
						push(funcRef{dir: target, decl: decl, file: idx.pkgs[target].funcFile[n.Sel.Name]})
					}
					return false
				}
				for _, m := range idx.methods[n.Sel.Name] {
					push(m)
				}
			}
			return true
		})
	}
	for i, n := range roots {
		visit(n, rootDirs[i])
	}
	for len(queue) > 0 {
		r := queue[0]
		queue = queue[1:]
		visit(r.decl, r.dir)
	}
	return seen
}

// importsOf are a file's module imports by local name.
func importsOf(f *ast.File) map[string]string {
	out := map[string]string{}
	for _, imp := range f.Imports {
		path := strings.Trim(imp.Path.Value, `"`)
		if rel, ok := strings.CutPrefix(path, modulePath+"/"); ok {
			local := rel[strings.LastIndex(rel, "/")+1:]
			if imp.Name != nil {
				local = imp.Name.Name
			}
			out[local] = rel
		}
	}
	return out
}

// fileImports are the module imports of the file of pkg declaring name
// (a constant or a function).
func fileImports(files []*ast.File, name string) map[string]string {
	for _, f := range files {
		for _, decl := range f.Decls {
			switch decl := decl.(type) {
			case *ast.FuncDecl:
				if decl.Name.Name == name {
					return importsOf(f)
				}
			case *ast.GenDecl:
				for _, spec := range decl.Specs {
					if vs, ok := spec.(*ast.ValueSpec); ok {
						for _, n := range vs.Names {
							if n.Name == name {
								return importsOf(f)
							}
						}
					}
				}
			}
		}
	}
	return nil
}

// readmeSettingsProblems compares README's settings table with the reads
// in the source: a read setting the table lacks, a row nobody reads, and
// a row whose processes are not the binaries that may read it (binaryFns:
// the functions each binary may run, reachable).
func readmeSettingsProblems(readme string, reads []settingRead, binaryFns map[string]map[string]bool, root string) ([]string, error) {
	rows, err := readmeSettings(readme)
	if err != nil {
		return nil, err
	}
	documented := map[string]bool{}
	for _, r := range rows {
		documented[r.name] = true
	}
	var problems []string
	readBy := map[string]map[string]bool{} // name -> binaries
	for _, r := range reads {
		if !documented[r.name] {
			problems = append(problems, fmt.Sprintf("%s reads %s, which README's settings table lacks", r.pos, r.name))
		}
		if readBy[r.name] == nil {
			readBy[r.name] = map[string]bool{}
		}
		for b, fns := range binaryFns {
			if fns[r.fn] {
				readBy[r.name][b] = true
			}
		}
	}
	for _, row := range rows {
		if dir, ok := readOutsideConfig[row.name]; ok {
			if !sourceNames(root, dir, row.name) {
				problems = append(problems, fmt.Sprintf("README.md:%d: %s is said to be read in %s, whose source does not name it", row.line, row.name, dir))
			}
			continue
		}
		if readBy[row.name] == nil {
			problems = append(problems, fmt.Sprintf("README.md:%d: %s is read by nobody under cmd/ or pkg/", row.line, row.name))
			continue
		}
		for _, b := range sortedKeys(binaryFns) {
			switch {
			case row.usedBy[b] && !readBy[row.name][b]:
				problems = append(problems, fmt.Sprintf("README.md:%d: %s is said to be used by %s, whose code never reads it", row.line, row.name, b))
			case !row.usedBy[b] && readBy[row.name][b]:
				problems = append(problems, fmt.Sprintf("README.md:%d: %s is read by %s, which its row does not name", row.line, row.name, b))
			}
		}
	}
	sort.Strings(problems)
	return problems, nil
}

// sourceNames tells whether a non-test Go file in dir holds name.
func sourceNames(root, dir, name string) bool {
	files, _ := filepath.Glob(filepath.Join(root, dir, "*.go"))
	for _, p := range files {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), `"`+name+`"`) {
			return true
		}
	}
	return false
}

func readmeFixture(t *testing.T) (readme string, reads []settingRead, binaryFns map[string]map[string]bool, root string) {
	t.Helper()
	root = repoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	reads, unresolved, idx, err := settingReads(root)
	require.NoError(t, err)
	require.Empty(t, unresolved, "setting reads whose name this test cannot work out: use a literal or a constant")
	require.NotEmpty(t, reads)
	binaryFns = map[string]map[string]bool{}
	for _, bin := range []string{"api", "worker", "scheduler", "settlectl"} {
		files := map[string]bool{}
		for dir, pkg := range localPackages(t, root, filepath.Join("cmd", bin)) {
			for _, name := range pkg.GoFiles {
				files[filepath.Join(root, dir, name)] = true
			}
		}
		binaryFns[bin] = idx.reachable(files)
		require.NotEmpty(t, binaryFns[bin], bin)
	}
	return string(b), reads, binaryFns, root
}

// TestReadmeSettingsTableMatchesSource: operators configure settle from
// README's settings table, so every setting read under cmd/ or pkg/ has a
// row there, every row names a setting something reads, and a row's
// processes are ones whose code can read it.
func TestReadmeSettingsTableMatchesSource(t *testing.T) {
	readme, reads, binaryFns, root := readmeFixture(t)
	problems, err := readmeSettingsProblems(readme, reads, binaryFns, root)
	require.NoError(t, err)
	require.Empty(t, problems)
	names := map[string]bool{}
	for _, r := range reads {
		names[r.name] = true
	}
	t.Logf("%d reads of %d settings", len(reads), len(names))
}

// TestReadmeSettingsCheckFails: the check above finds a row removed, a
// row nobody reads, a process that does not read its row and one that
// reads a row not naming it.
func TestReadmeSettingsCheckFails(t *testing.T) {
	readme, reads, binaryFns, root := readmeFixture(t)
	var removed []string
	for _, line := range strings.Split(readme, "\n") {
		if strings.HasPrefix(line, "| `WORKER_CONCURRENCY` |") {
			continue
		}
		removed = append(removed, line)
		if strings.HasPrefix(line, "| `HTTP_ADDR` |") {
			removed = append(removed, "| `HTTP_ADRR` | api | `:8080` | a typo |", "| `SCAN_TRACES_MAX` | worker | `1` | nobody's |")
		}
	}
	text := strings.Join(removed, "\n")
	text = strings.Replace(text, "| `WORKER_POLL_INTERVAL` | worker |", "| `WORKER_POLL_INTERVAL` | worker, api |", 1)
	text = strings.Replace(text, "| `METRICS_ADDR` | worker, scheduler |", "| `METRICS_ADDR` | worker |", 1)
	problems, err := readmeSettingsProblems(text, reads, binaryFns, root)
	require.NoError(t, err)
	joined := strings.Join(problems, "\n")
	require.Contains(t, joined, "cmd/worker/main.go:53 reads WORKER_CONCURRENCY, which README's settings table lacks")
	require.Contains(t, joined, "HTTP_ADRR is read by nobody under cmd/ or pkg/")
	require.Contains(t, joined, "SCAN_TRACES_MAX is read by nobody")
	require.Contains(t, joined, "WORKER_POLL_INTERVAL is said to be used by api, whose code never reads it")
	require.Contains(t, joined, "METRICS_ADDR is read by scheduler, which its row does not name")
	require.Len(t, problems, 5, joined)
}
