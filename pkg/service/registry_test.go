package service

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Every long-running binary's registry says which build it is.
func TestRegistryBuildInfo(t *testing.T) {
	families, err := Registry().Gather()
	require.NoError(t, err)
	names := map[string]bool{}
	for _, f := range families {
		names[f.GetName()] = true
	}
	require.True(t, names["settle_build_info"], "settle_build_info missing")
	require.True(t, names["go_goroutines"], "the Go collector")
}
