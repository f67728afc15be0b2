package main

import (
	"fmt"
	"testing"

	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/test/deploy/deployenv"
)

// readDeployed is what worker does with a deployment's arguments and
// environment before it starts.
var readDeployed deployenv.Reader = func(env *config.Env, args []string) {
	if len(args) > 0 {
		env.Reject("command", fmt.Errorf("worker takes no arguments, got %q", args))
	}
	readSettings(env)
}

// TestDeployedSettings runs every value compose.yaml and deploy/k8s give
// worker through its own settings code, and the same check on a broken
// deployment, which must fail.
func TestDeployedSettings(t *testing.T) {
	deployenv.Verify(t, "worker", readDeployed, wantBroken)
}

var wantBroken = []string{
	"compose.yaml service worker (required values only): setting WORKER_CONCURRENCY",
	"compose.yaml service worker sets WORKER_CONCURENCY, which worker never reads",
	"deploy/k8s/broken.yaml broken-worker/worker (required values only): setting SHUTDOWN_TIMEOUT",
	"setting LEDGER_BATCH_MAX",
}
