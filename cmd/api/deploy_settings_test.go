package main

import (
	"fmt"
	"path/filepath"
	"strings"
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
// api through its own settings code.
func TestDeployedSettings(t *testing.T) {
	root, err := deployenv.Root()
	if err != nil {
		t.Fatal(err)
	}
	problems, deployments, err := deployenv.Problems(root, "api", readDeployed)
	if err != nil {
		t.Fatal(err)
	}
	if deployments < 2 {
		t.Fatalf("found %d deployments of api; compose.yaml and deploy/k8s each have one", deployments)
	}
	if len(problems) > 0 {
		t.Fatalf("deployment settings api refuses or ignores:\n%s", strings.Join(problems, "\n"))
	}
}

// TestDeployedSettingsFindsMistakes: the same check on a deployment with
// bad values and a misspelt setting fails.
func TestDeployedSettingsFindsMistakes(t *testing.T) {
	root, err := deployenv.Root()
	if err != nil {
		t.Fatal(err)
	}
	problems, _, err := deployenv.Problems(filepath.Join(root, "test/deploy/deployenv/testdata/broken"), "api", readDeployed)
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

var wantBroken = []string{"compose.yaml service api (required values only): setting WEBHOOK_RATE_LIMIT"}
