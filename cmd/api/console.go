package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/console"
	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/postgres"
)

// consoleSettings configure the operator console at /admin/console/.
type consoleSettings struct {
	// readOnlyToken (ADMIN_READONLY_TOKEN) may look, not act; "" for none.
	readOnlyToken string
	// traceURL (TRACE_UI_URL) links an event's trace id out, e.g.
	// https://jaeger.example/trace/{trace_id}.
	traceURL string
}

func readConsole(env *config.Env, adminToken, apiToken string) consoleSettings {
	var s consoleSettings
	s.readOnlyToken = config.Parse(env, "ADMIN_READONLY_TOKEN", "", func(v string) (string, error) {
		switch {
		case len(v) < httpapi.SecretLengthMin:
			return "", fmt.Errorf("must be at least %d characters, got %d", httpapi.SecretLengthMin, len(v))
		case config.WeakSecret(v) != "":
			return "", fmt.Errorf("%s: generate one with `openssl rand -hex 32`", config.WeakSecret(v))
		case v == adminToken || v == apiToken:
			// Otherwise a look-only credential could act, or an
			// integrator's read token open the console.
			return "", errors.New("must differ from ADMIN_TOKEN and API_TOKEN")
		}
		return v, nil
	})
	s.traceURL = env.URL("TRACE_UI_URL", "", "http", "https")
	if s.traceURL != "" && !strings.Contains(s.traceURL, console.TracePlaceholder) {
		env.Reject("TRACE_UI_URL", errors.New("must contain "+console.TracePlaceholder+", where the trace id goes"))
	}
	return s
}

// consoleMount builds the console on the api's database, chain and Redis
// (the breakers of the enabled networks, as the workers share them).
func consoleMount(s settings, db *postgres.DB, rdb redis.UniversalClient, rechecker httpapi.Chain, rescans *serverRescans) (httpapi.Mount, error) {
	o := console.Options{
		Store: db, AdminToken: s.adminToken, ReadOnlyToken: s.console.readOnlyToken, TraceURL: s.console.traceURL,
		Breakers: breakerStates{rdb: rdb, names: s.chain.NetworkNames()}, Rescans: rescans,
	}
	if rechecker != nil {
		o.Chain = rechecker
	}
	c, err := console.New(o)
	if err != nil {
		return httpapi.Mount{}, err
	}
	return c.Mount(), nil
}

// breakerStates reads each enabled network's breaker from Redis.
type breakerStates struct {
	rdb   redis.UniversalClient
	names []string
}

func (b breakerStates) BreakerStates(ctx context.Context) ([]console.Breaker, error) {
	out := make([]console.Breaker, 0, len(b.names))
	for _, name := range b.names {
		state, err := chain.ReadBreakerState(ctx, b.rdb, name)
		if err != nil {
			return nil, err
		}
		out = append(out, console.Breaker{Name: name, State: state})
	}
	return out, nil
}

// serverRescans hands the console POST /admin/rescan's own operation. The
// server mounts the console, so it is set once the server is built,
// before anything is served.
type serverRescans struct{ server *httpapi.Server }

func (r *serverRescans) StartRescan(ctx context.Context, network string, from, to uint64, operator string) (string, error) {
	return r.server.StartRescan(ctx, network, from, to, operator)
}
