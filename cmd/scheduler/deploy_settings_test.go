package main

import (
	"fmt"
	"testing"

	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/test/deploy/deployenv"
)

// readDeployed is what scheduler does with a deployment's arguments and
// environment before it starts.
var readDeployed deployenv.Reader = func(env *config.Env, args []string) {
	if len(args) > 0 {
		env.Reject("command", fmt.Errorf("scheduler takes no arguments, got %q", args))
	}
	readSettings(env)
}

// TestDeployedSettings runs every value compose.yaml and deploy/k8s give
// scheduler through its own settings code, and the same check on a broken
// deployment, which must fail.
func TestDeployedSettings(t *testing.T) {
	deployenv.Verify(t, "scheduler", readDeployed, wantBroken)
}

var wantBroken = []string{"compose.yaml service scheduler (required values only): setting POLL_INTERVAL"}
