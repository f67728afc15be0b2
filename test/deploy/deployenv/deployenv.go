// Package deployenv reads the environment compose.yaml and deploy/k8s give
// each settle process, so that tests can run those values through the
// binaries' own settings readers. Values an operator must supply (secrets,
// .env) come from the caller.
package deployenv

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Process is one settle binary as a deployment file runs it.
type Process struct {
	Source string // "compose.yaml service api", "deploy/k8s/api.yaml settle-api/api"
	Binary string // api, worker, scheduler
	Args   []string
	Env    map[string]string
	// Secrets names the settings that came from a Secret (k8s); their
	// values are the caller's.
	Secrets []string
}

// Secrets are valid, strong stand-ins for what an operator puts in .env or
// the Secret; they are not in any deployment file.
var Secrets = map[string]string{
	"WEBHOOK_SECRET":         "3f1c9a7e5b2d48e6a0c4f9b17d3e2a5c8b6f0d4e9a1c7b3f5e2d8a6c4b0f9e1d",
	"API_TOKEN":              "9b4e2f7a1c6d3e8f0a5b9c2d7e4f1a6b3c8d5e0f7a2b9c4d1e6f3a8b5c0d7e2f",
	"ADMIN_TOKEN":            "c7d2e9f4a1b6c3d8e5f0a7b2c9d4e1f6a3b8c5d0e7f2a9b4c1d6e3f8a5b0c7d2",
	"POSTGRES_PASSWORD":      "pg-7e3a9c1f5b2d8e4a6c0f",
	"GRAFANA_ADMIN_PASSWORD": "gf-2b8d4f6a0c3e9b1d7f5a",
	"DATABASE_URL":           "postgres://settle:pg-7e3a9c1f5b2d8e4a6c0f@postgres.internal:5432/settle?sslmode=require",
	"REDIS_URL":              "redis://:rd-5c1e7a3f9b2d@redis.internal:6379/0",
	"ETH_RPC_URL":            "https://eth-node.internal/rpc",
}

// Optional are example values of the settings a deployment leaves empty
// unless the operator opts in, so that their readers run too.
var Optional = map[string]string{
	"ALCHEMY_SIGNING_KEY":   "whsec_a8f3c1e7b5d9024f6e1a3c8b",
	"ALERT_WEBHOOK_URL":     "https://alerts.internal/settle",
	"NOTIFY_WEBHOOK_URL":    "https://notify.internal/settle",
	"NOTIFY_WEBHOOK_SECRET": "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=",
	"ETH_RPC_URL":           "https://eth-node.internal/rpc",
	"DEPOSIT_FINALITY":      "finalized",
	"NETWORKS":              "ETH_MAINNET",
}

// settleBinaries are the commands a deployment may run.
var settleBinaries = map[string]bool{"api": true, "worker": true, "scheduler": true}

// Compose reads compose.yaml under root with vars as compose's variables
// (the .env file and the shell), interpolated as compose does.
func Compose(root string, vars map[string]string) ([]Process, error) {
	raw, err := os.ReadFile(filepath.Join(root, "compose.yaml"))
	if err != nil {
		return nil, err
	}
	var doc struct {
		Services map[string]map[string]any `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("compose.yaml: %w", err)
	}
	var out []Process
	for _, name := range sortedKeys(doc.Services) {
		svc := doc.Services[name]
		command, err := stringList(svc["command"])
		if err != nil {
			return nil, fmt.Errorf("compose.yaml service %s command: %w", name, err)
		}
		if len(command) == 0 || !settleBinaries[path.Base(command[0])] {
			continue
		}
		p := Process{Source: "compose.yaml service " + name, Binary: path.Base(command[0]), Env: map[string]string{}}
		for _, a := range command[1:] {
			v, err := Interpolate(a, vars)
			if err != nil {
				return nil, fmt.Errorf("%s command: %w", p.Source, err)
			}
			p.Args = append(p.Args, v)
		}
		files, err := stringList(svc["env_file"])
		if err != nil {
			return nil, fmt.Errorf("%s env_file: %w", p.Source, err)
		}
		for _, f := range files {
			if err := readEnvFile(filepath.Join(root, f), vars, p.Env); err != nil {
				return nil, fmt.Errorf("%s env_file: %w", p.Source, err)
			}
		}
		env, err := environment(svc["environment"])
		if err != nil {
			return nil, fmt.Errorf("%s environment: %w", p.Source, err)
		}
		for k, v := range env {
			if p.Env[k], err = Interpolate(v, vars); err != nil {
				return nil, fmt.Errorf("%s environment %s: %w", p.Source, k, err)
			}
		}
		out = append(out, p)
	}
	return out, nil
}

// readEnvFile reads a compose env_file; the project's .env is vars (the
// caller's stand-in), never a file of the checkout.
func readEnvFile(file string, vars, into map[string]string) error {
	if filepath.Base(file) == ".env" {
		for k, v := range vars {
			into[k] = v
		}
		return nil
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return fmt.Errorf("%s: line %q is not NAME=value", file, line)
		}
		into[strings.TrimSpace(k)] = v
	}
	return nil
}

func environment(v any) (map[string]string, error) {
	out := map[string]string{}
	switch env := v.(type) {
	case nil:
	case map[string]any:
		for k, val := range env {
			switch val := val.(type) {
			case nil:
				out[k] = ""
			case string:
				out[k] = val
			default:
				// compose stringifies numbers and booleans
				out[k] = fmt.Sprint(val)
			}
		}
	case []any:
		for _, item := range env {
			s, ok := item.(string)
			if !ok {
				return nil, fmt.Errorf("entry %v is not a string", item)
			}
			k, val, _ := strings.Cut(s, "=")
			out[k] = val
		}
	default:
		return nil, fmt.Errorf("neither a map nor a list: %T", v)
	}
	return out, nil
}

func stringList(v any) ([]string, error) {
	switch v := v.(type) {
	case nil:
		return nil, nil
	case string:
		return strings.Fields(v), nil
	case []any:
		var out []string
		for _, item := range v {
			switch item := item.(type) {
			case string:
				out = append(out, item)
			case map[string]any: // env_file: [{path: ..., required: ...}]
				p, _ := item["path"].(string)
				out = append(out, p)
			default:
				return nil, fmt.Errorf("entry %v is not a string", item)
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("neither a string nor a list: %T", v)
}

var variable = regexp.MustCompile(`\$(?:\$|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))`)

// Interpolate expands compose's ${VAR}, $VAR, ${VAR:-default},
// ${VAR-default}, ${VAR:?message}, ${VAR?message} and $$.
func Interpolate(s string, vars map[string]string) (string, error) {
	var err error
	out := variable.ReplaceAllStringFunc(s, func(m string) string {
		if m == "$$" {
			return "$"
		}
		sub := variable.FindStringSubmatch(m)
		name, op, arg := sub[1], sub[2], sub[3]
		if name == "" {
			name = sub[4]
		}
		v, set := vars[name]
		switch op {
		case ":-":
			if v == "" {
				return arg
			}
		case "-":
			if !set {
				return arg
			}
		case ":?", "?":
			if !set || (op == ":?" && v == "") {
				err = errors.Join(err, fmt.Errorf("variable %s is required: %s", name, arg))
			}
		}
		return v
	})
	return out, err
}

// K8s reads deploy/k8s/*.yaml under root: every Deployment's and Job's
// settle container with its env (literal values, ConfigMap values by
// envFrom and configMapKeyRef) and, for secretKeyRef, secrets[key] (an
// optional key missing from secrets is left unset, a required one is an
// error).
func K8s(root string, secrets map[string]string) ([]Process, error) {
	files, err := filepath.Glob(filepath.Join(root, "deploy", "k8s", "*.yaml"))
	if err != nil {
		return nil, err
	}
	configMaps := map[string]map[string]string{}
	type workload struct {
		file string
		obj  k8sObject
	}
	var workloads []workload
	for _, file := range files {
		raw, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		dec := yaml.NewDecoder(bytes.NewReader(raw))
		for {
			var obj k8sObject
			if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("%s: %w", file, err)
			}
			switch obj.Kind {
			case "ConfigMap":
				configMaps[obj.Metadata.Name] = obj.Data
			case "Deployment", "Job", "StatefulSet", "DaemonSet":
				workloads = append(workloads, workload{file, obj})
			}
		}
	}
	var out []Process
	for _, w := range workloads {
		rel, _ := filepath.Rel(root, w.file)
		for _, c := range w.obj.Spec.Template.Spec.Containers {
			command := append(append([]string{}, c.Command...), c.Args...)
			if len(command) == 0 || !settleBinaries[path.Base(command[0])] {
				continue
			}
			p := Process{Source: fmt.Sprintf("%s %s/%s", rel, w.obj.Metadata.Name, c.Name), Binary: path.Base(command[0]), Args: command[1:], Env: map[string]string{}}
			for _, from := range c.EnvFrom {
				switch {
				case from.ConfigMapRef != nil:
					data, ok := configMaps[from.ConfigMapRef.Name]
					if !ok {
						return nil, fmt.Errorf("%s: envFrom names ConfigMap %s, which no file defines", p.Source, from.ConfigMapRef.Name)
					}
					for k, v := range data {
						p.Env[k] = v
					}
				case from.SecretRef != nil:
					return nil, fmt.Errorf("%s: envFrom secretRef is not read by this test; name each key", p.Source)
				}
			}
			for _, e := range c.Env {
				switch {
				case e.ValueFrom == nil:
					p.Env[e.Name] = e.Value
				case e.ValueFrom.SecretKeyRef != nil:
					ref := e.ValueFrom.SecretKeyRef
					v, ok := secrets[ref.Key]
					if !ok {
						if ref.Optional {
							continue
						}
						return nil, fmt.Errorf("%s: %s needs secret key %s, which the caller did not supply", p.Source, e.Name, ref.Key)
					}
					p.Env[e.Name] = v
					p.Secrets = append(p.Secrets, e.Name)
				case e.ValueFrom.ConfigMapKeyRef != nil:
					ref := e.ValueFrom.ConfigMapKeyRef
					v, ok := configMaps[ref.Name][ref.Key]
					if !ok && !ref.Optional {
						return nil, fmt.Errorf("%s: %s names ConfigMap key %s/%s, which is not defined", p.Source, e.Name, ref.Name, ref.Key)
					}
					if ok {
						p.Env[e.Name] = v
					}
				}
			}
			out = append(out, p)
		}
	}
	return out, nil
}

type k8sObject struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"`
	Spec struct {
		Template struct {
			Spec struct {
				Containers []k8sContainer `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type k8sContainer struct {
	Name    string   `yaml:"name"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	EnvFrom []struct {
		ConfigMapRef *struct {
			Name string `yaml:"name"`
		} `yaml:"configMapRef"`
		SecretRef *struct {
			Name string `yaml:"name"`
		} `yaml:"secretRef"`
	} `yaml:"envFrom"`
	Env []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			SecretKeyRef    *keyRef `yaml:"secretKeyRef"`
			ConfigMapKeyRef *keyRef `yaml:"configMapKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
}

type keyRef struct {
	Name     string `yaml:"name"`
	Key      string `yaml:"key"`
	Optional bool   `yaml:"optional"`
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
