package config_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/config"
)

func TestFromLookupSeesEveryRead(t *testing.T) {
	var read []string
	env := config.FromLookup(func(name string) (string, bool) {
		read = append(read, name)
		if name == "A" {
			return "5", true
		}
		return "", false
	})
	require.Equal(t, 5, env.Int("A", 1, 1, 10))
	require.Equal(t, "d", env.String("B", "d"))
	require.Equal(t, []string{"A", "B"}, read)
	require.NoError(t, env.Err())
}
