package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/config"
)

func TestReadDashboardPrometheus(t *testing.T) {
	for _, c := range []struct{ value, want, err string }{
		{"", "", ""},
		{"http://prometheus:9090", "http://prometheus:9090", ""},
		{"https://prom.example/sub/", "https://prom.example/sub/", ""},
		{"ftp://prometheus:9090", "", "ASYNQMON_PROMETHEUS_URL"},
		{"prometheus:9090", "", "ASYNQMON_PROMETHEUS_URL"},
		{"http://user:secret@prometheus:9090", "", "credentials"},
	} {
		m := map[string]string{}
		if c.value != "" {
			m["ASYNQMON_PROMETHEUS_URL"] = c.value
		}
		env := config.FromMap(m)
		require.Equal(t, c.want, readDashboardPrometheus(env), c.value)
		if c.err == "" {
			require.NoError(t, env.Err(), c.value)
		} else {
			require.ErrorContains(t, env.Err(), c.err, c.value)
			require.NotContains(t, env.Err().Error(), "secret", "the error never repeats the credentials")
		}
	}
}
