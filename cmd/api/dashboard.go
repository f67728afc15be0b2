package main

import (
	"errors"
	"net/url"

	"github.com/settle/settle/pkg/config"
)

// readDashboardPrometheus reads ASYNQMON_PROMETHEUS_URL. asynqmon writes
// the address into its page, so credentials in it are refused.
func readDashboardPrometheus(env *config.Env) string {
	v := env.URL("ASYNQMON_PROMETHEUS_URL", "", "http", "https")
	if v == "" {
		return ""
	}
	if u, err := url.Parse(v); err == nil && u.User != nil {
		env.Reject("ASYNQMON_PROMETHEUS_URL", errors.New("must not carry credentials (asynqmon shows the address in its page)"))
		return ""
	}
	return v
}
