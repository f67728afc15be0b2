package deployenv

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/settle/settle/pkg/config"
)

// Scenario is one set of operator-supplied values.
type Scenario struct {
	Name string
	Vars map[string]string
}

// Scenarios: only what must be supplied (every other setting keeps the
// file's own value or default), then every optional setting set too.
func Scenarios() []Scenario {
	full := map[string]string{}
	for k, v := range Secrets {
		full[k] = v
	}
	for k, v := range Optional {
		full[k] = v
	}
	return []Scenario{{"required values only", Secrets}, {"every optional setting set", full}}
}

// GoRuntimeSettings are read by the Go runtime of every binary, not by
// settle's settings code.
var GoRuntimeSettings = map[string]bool{"GOMEMLIMIT": true, "GOGC": true, "GOMAXPROCS": true, "GODEBUG": true}

// Reader runs a binary's own settings code for the given arguments.
type Reader func(env *config.Env, args []string)

// Problems runs read over every deployment of binary in root's
// compose.yaml and deploy/k8s under every scenario. A problem is a setting
// the reader refused, or a setting the deployment sets that the reader
// never looked up in any scenario (a typo, or a setting of another
// binary).
func Problems(root, binary string, read Reader) (problems []string, deployments int, err error) {
	type source struct {
		set  map[string]bool
		read map[string]bool
	}
	sources := map[string]*source{}
	for _, sc := range Scenarios() {
		compose, err := Compose(root, sc.Vars)
		if err != nil {
			return nil, 0, fmt.Errorf("%s: %w", sc.Name, err)
		}
		k8s, err := K8s(root, sc.Vars)
		if err != nil {
			return nil, 0, fmt.Errorf("%s: %w", sc.Name, err)
		}
		for _, p := range append(compose, k8s...) {
			if p.Binary != binary {
				continue
			}
			src := sources[p.Source]
			if src == nil {
				src = &source{set: map[string]bool{}, read: map[string]bool{}}
				sources[p.Source] = src
			}
			for k := range p.Env {
				src.set[k] = true
			}
			env := config.FromLookup(func(name string) (string, bool) {
				src.read[name] = true
				v, ok := p.Env[name]
				return v, ok
			})
			read(env, p.Args)
			for _, e := range env.Errs() {
				problems = append(problems, fmt.Sprintf("%s (%s): %v", p.Source, sc.Name, e))
			}
		}
	}
	for name, src := range sources {
		for k := range src.set {
			if !src.read[k] && !GoRuntimeSettings[k] {
				problems = append(problems, fmt.Sprintf("%s sets %s, which %s never reads", name, k, binary))
			}
		}
	}
	sort.Strings(problems)
	return problems, len(sources), nil
}

// Root is the module root (the directory holding go.mod) above the
// working directory.
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above %s", strings.TrimSpace(dir))
		}
		dir = parent
	}
}
