package httpapi

import (
	_ "embed"
	"fmt"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"
	"go.yaml.in/yaml/v3"
)

// openAPISpec describes the whole HTTP API. A test keeps its paths and
// methods equal to the registered routes, and New refuses a contributed
// route the spec does not describe.
//
//go:embed openapi.yaml
var openAPISpec []byte

// OpenAPISpec returns the embedded OpenAPI 3 document.
func OpenAPISpec() []byte { return append([]byte(nil), openAPISpec...) }

func serveSpec(c echo.Context) error {
	return c.Blob(http.StatusOK, "application/yaml", openAPISpec)
}

// specOperations are the spec's operations: path → method → whether it
// is a plug-in route (registered through Options, not by New itself).
type specOperations map[string]map[string]bool

var httpMethods = []string{"get", "put", "post", "delete", "patch", "head", "options", "trace"}

func loadSpec() (specOperations, error) {
	var doc struct {
		Paths map[string]map[string]yaml.Node `yaml:"paths"`
	}
	if err := yaml.Unmarshal(openAPISpec, &doc); err != nil {
		return nil, fmt.Errorf("httpapi: openapi.yaml: %w", err)
	}
	out := specOperations{}
	for path, item := range doc.Paths {
		for _, method := range httpMethods {
			node, ok := item[method]
			if !ok {
				continue
			}
			var op struct {
				Plugin bool `yaml:"x-settle-plugin"`
			}
			if err := node.Decode(&op); err != nil {
				return nil, fmt.Errorf("httpapi: openapi.yaml %s %s: %w", method, path, err)
			}
			if out[path] == nil {
				out[path] = map[string]bool{}
			}
			out[path][strings.ToUpper(method)] = op.Plugin
		}
	}
	return out, nil
}

// plugin reports whether the spec describes method and echo path as a
// plug-in route.
func (s specOperations) plugin(method, echoPath string) bool {
	isPlugin, ok := s[SpecPath(echoPath)][method]
	return ok && isPlugin
}

// SpecPath turns an echo route path into its OpenAPI form:
// "/v1/users/:id/balances" → "/v1/users/{id}/balances", and a trailing
// "*" (a mount) → "{path}".
func SpecPath(echoPath string) string {
	segments := strings.Split(echoPath, "/")
	for i, seg := range segments {
		switch {
		case strings.HasPrefix(seg, ":"):
			segments[i] = "{" + seg[1:] + "}"
		case seg == "*":
			segments[i] = "{path}"
		}
	}
	return strings.Join(segments, "/")
}
