package buildinfo

import (
	"runtime/debug"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

func TestResolve(t *testing.T) {
	bi := &debug.BuildInfo{
		Main:     debug.Module{Version: "(devel)"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123abcd"}, {Key: "vcs.modified", Value: "true"}},
	}
	// Stamped values win.
	require.Equal(t, Info{"1.2.3", "feedface"}, resolve("1.2.3", "feedface", bi))
	// Unstamped: the toolchain's revision; "(devel)" is no version.
	require.Equal(t, Info{Unknown, "0123abcd"}, resolve("", "", bi))
	// A module version from `go install ...@v1.0.0`.
	require.Equal(t, Info{"v1.0.0", Unknown}, resolve("", "", &debug.BuildInfo{Main: debug.Module{Version: "v1.0.0"}}))
	// Nothing known at all.
	require.Equal(t, Info{Unknown, Unknown}, resolve("", "", nil))
	require.Equal(t, "1.2.3 (feedface)", Info{"1.2.3", "feedface"}.String())
}

func TestCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collector(Info{"1.2.3", "feedface"}))
	families, err := reg.Gather()
	require.NoError(t, err)
	require.Len(t, families, 1)
	require.Equal(t, "settle_build_info", families[0].GetName())
	require.Len(t, families[0].GetMetric(), 1)
	m := families[0].GetMetric()[0]
	require.Equal(t, 1.0, m.GetGauge().GetValue())
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	require.Equal(t, map[string]string{"version": "1.2.3", "revision": "feedface"}, labels)

	// The process's own registers as well.
	require.NoError(t, prometheus.NewRegistry().Register(Collector()))
}
