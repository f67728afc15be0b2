package main

import (
	"fmt"
	"testing"

	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/test/deploy/deployenv"
)

// readDeployed is what api does with a deployment's arguments and
// environment before it starts.
var readDeployed deployenv.Reader = func(env *config.Env, args []string) {
	if command, _ := readArgs(args, env); command == "" {
		env.Reject("command", fmt.Errorf("api does not take %q", args))
	}
}

// TestDeployedSettings runs every value compose.yaml and deploy/k8s give
// api through its own settings code, and the same check on a broken
// deployment, which must fail.
func TestDeployedSettings(t *testing.T) {
	deployenv.Verify(t, "api", readDeployed, wantBroken)
}

var wantBroken = []string{"compose.yaml service api (required values only): setting WEBHOOK_RATE_LIMIT"}
