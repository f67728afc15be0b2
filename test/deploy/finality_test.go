package deploy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSchedulerGetsWorkersChainPolicy: the scheduler's chain scanner reads
// up to each network's finality head under DEPOSIT_FINALITY
// (cmd/scheduler/scan.go: finality.ReadSettings). A scheduler without the
// worker's DEPOSIT_FINALITY=confirmations:12 waits for the `finalized` tag
// — on a node without one (why one picks confirmations:N), forever.
func TestSchedulerGetsWorkersChainPolicy(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(repoRoot(t), "cmd", "scheduler", "scan.go"))
	require.NoError(t, err)
	require.Contains(t, string(src), "finality.ReadSettings(env", "premise: the scheduler reads DEPOSIT_FINALITY for its scanner")

	env := map[string]string{
		"POSTGRES_PASSWORD": strings.Repeat("p1", 16), "WEBHOOK_SECRET": strings.Repeat("w1", 20),
		"API_TOKEN": strings.Repeat("a1", 20), "ADMIN_TOKEN": strings.Repeat("d1", 20),
		"GRAFANA_ADMIN_PASSWORD": strings.Repeat("g1", 12), "ETH_RPC_URL": "https://rpc.test.invalid/v2/key",
		"DEPOSIT_FINALITY": "confirmations:12", "NETWORKS": "ETH_MAINNET,BASE_MAINNET",
	}
	cf := loadComposeWith(t, env)
	for _, name := range []string{"DEPOSIT_FINALITY", "NETWORKS", "ETH_RPC_URL"} {
		require.Equal(t, env[name], cf.Services["worker"].Environment[name], "compose.yaml worker %s", name)
		assert.Equal(t, env[name], cf.Services["scheduler"].Environment[name], "compose.yaml: the scheduler's scanner does not get .env's %s", name)
	}

	m := loadManifests(t, "")
	get := func(deployment, name string) *string {
		d := m.deployments[deployment]
		require.NotNil(t, d, deployment)
		return containerEnv(t, m, "Deployment "+deployment, d.Spec.Template.Spec.Containers[0])[name]
	}
	for _, name := range []string{"DEPOSIT_FINALITY", "NETWORKS"} {
		worker := get("settle-worker", name)
		require.NotNil(t, worker, "settle-worker %s", name)
		for _, other := range []string{"settle-scheduler", "settle-api"} {
			v := get(other, name)
			if assert.NotNil(t, v, "deploy/k8s: %s gets no %s (the worker's is %q)", other, name, *worker) {
				assert.Equal(t, *worker, *v, "deploy/k8s: %s's %s differs from the worker's", other, name)
			}
		}
	}
}

// TestMigrateJobOutlivesItsRuns: the Job's deadline covers the whole Job,
// retries included; it must leave each of backoffLimit+1 runs its
// MIGRATE_TIMEOUT (10m by default), or the deadline, not `api migrate`,
// ends a long migration, and no retry follows.
func TestMigrateJobOutlivesItsRuns(t *testing.T) {
	const migrateTimeout = 600 // seconds, cmd/api's migrateTimeoutDefault
	m := loadManifests(t, "")
	require.Len(t, m.jobs, 1)
	spec := m.jobs[0].Spec
	require.NotNil(t, spec.ActiveDeadlineSeconds)
	require.NotNil(t, spec.BackoffLimit)
	runs := int64(*spec.BackoffLimit) + 1
	assert.Greater(t, *spec.ActiveDeadlineSeconds, runs*migrateTimeout,
		"activeDeadlineSeconds %d leaves %d runs less than MIGRATE_TIMEOUT each", *spec.ActiveDeadlineSeconds, runs)
}
