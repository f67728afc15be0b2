package deployenv

import (
	"path/filepath"
	"strings"
	"testing"
)

// Verify runs every value compose.yaml and deploy/k8s give binary through
// read (the binary's own settings code): each must be accepted and read.
// Then the same check on the broken example deployment must report every
// problem in wantBroken, so a check that sees nothing fails too.
func Verify(t *testing.T, binary string, read Reader, wantBroken []string) {
	t.Helper()
	root, err := Root()
	if err != nil {
		t.Fatal(err)
	}
	problems, deployments, err := Problems(root, binary, read)
	if err != nil {
		t.Fatal(err)
	}
	if deployments < 2 {
		t.Fatalf("found %d deployments of %s; compose.yaml and deploy/k8s each have one", deployments, binary)
	}
	if len(problems) > 0 {
		t.Fatalf("deployment settings %s refuses or ignores:\n%s", binary, strings.Join(problems, "\n"))
	}

	problems, _, err = Problems(filepath.Join(root, "test/deploy/deployenv/testdata/broken"), binary, read)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(problems, "\n")
	for _, want := range wantBroken {
		if !strings.Contains(all, want) {
			t.Errorf("no problem of the broken deployment mentions %q; found:\n%s", want, all)
		}
	}
}
