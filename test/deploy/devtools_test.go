package deploy

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/test/harness"
)

// devOnlyPackages may never be linked into a production binary: the
// simulated chain, throwaway servers, the test harness and the load tool.
var devOnlyPackages = []string{
	"github.com/ethereum/go-ethereum/ethclient/simulated",
	"github.com/settle/settle/pkg/chain/devchain",
	"github.com/settle/settle/pkg/devenv",
	"github.com/settle/settle/pkg/testenv",
	"github.com/settle/settle/pkg/loadgen",
	"github.com/settle/settle/test/harness",
}

// TestProductionBinariesLinkNoDevTooling: what the Dockerfile builds
// (no tags) depends on none of the development packages; settlectl's
// development commands come only with -tags dev.
func TestProductionBinariesLinkNoDevTooling(t *testing.T) {
	root := repoRoot(t)
	for _, tags := range []string{"", "dev"} {
		args := []string{"list", "-deps"}
		if tags != "" {
			args = append(args, "-tags", tags)
		}
		args = append(args, "./cmd/api", "./cmd/worker", "./cmd/scheduler", "./cmd/settlectl", "./deploy/healthcheck")
		cmd := exec.Command("go", args...)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		deps := map[string]bool{}
		for _, line := range strings.Split(string(out), "\n") {
			deps[strings.TrimSpace(line)] = true
		}
		for _, p := range devOnlyPackages {
			if tags == "" {
				require.False(t, deps[p], "a production binary links %s", p)
			}
		}
		if tags == "dev" {
			// The control: the dev build does link them, so the check sees.
			require.True(t, deps["github.com/settle/settle/pkg/chain/devchain"], "settlectl -tags dev links the simulated chain")
		}
	}

	// Without the tag, a development command says how to get it. The
	// package's settlectl is built without tags like the Dockerfile's: no
	// build of its own here.
	cmd := exec.Command(filepath.Join(harness.Binaries(t), "settlectl"), "dev")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "built without them (go build -tags dev ./cmd/settlectl)")
}
