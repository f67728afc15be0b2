package main

import (
	"fmt"
	"path/filepath"
	"strings"
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
// worker through its own settings code.
func TestDeployedSettings(t *testing.T) {
	root, err := deployenv.Root()
	if err != nil {
		t.Fatal(err)
	}
	problems, deployments, err := deployenv.Problems(root, "worker", readDeployed)
	if err != nil {
		t.Fatal(err)
	}
	if deployments < 2 {
		t.Fatalf("found %d deployments of worker; compose.yaml and deploy/k8s each have one", deployments)
	}
	if len(problems) > 0 {
		t.Fatalf("deployment settings worker refuses or ignores:\n%s", strings.Join(problems, "\n"))
	}
}

// TestDeployedSettingsFindsMistakes: the same check on a deployment with
// bad values and a misspelt setting fails.
func TestDeployedSettingsFindsMistakes(t *testing.T) {
	root, err := deployenv.Root()
	if err != nil {
		t.Fatal(err)
	}
	problems, _, err := deployenv.Problems(filepath.Join(root, "test/deploy/deployenv/testdata/broken"), "worker", readDeployed)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(problems, "\n")
	for _, want := range wantBroken {
		if !strings.Contains(all, want) {
			t.Errorf("no problem mentions %q; found:\n%s", want, all)
		}
	}
}

var wantBroken = []string{
	"compose.yaml service worker (required values only): setting WORKER_CONCURRENCY",
	"compose.yaml service worker sets WORKER_CONCURENCY, which worker never reads",
	"deploy/k8s/broken.yaml broken-worker/worker (required values only): setting SHUTDOWN_TIMEOUT",
	"setting LEDGER_BATCH_MAX",
}
