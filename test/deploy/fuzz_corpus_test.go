package deploy

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// fuzzTarget finds the fuzz targets the Taskfile's fuzz task runs.
var fuzzTarget = regexp.MustCompile(`(?m)^func (Fuzz[A-Za-z0-9_]*)\(`)

// fuzzCorpusHeader opens every file of Go's corpus format.
const fuzzCorpusHeader = "go test fuzz v1\n"

// TestEveryFuzzTargetHasCorpus: each fuzz target under cmd, pkg and test
// has a committed seed corpus (testdata/fuzz/<target>) of well-formed
// entries, so a short CI fuzz run starts from real inputs.
func TestEveryFuzzTargetHasCorpus(t *testing.T) {
	root := repoRoot(t)
	targets := 0
	for _, top := range []string{"cmd", "pkg", "test"} {
		err := filepath.WalkDir(filepath.Join(root, top), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
				return nil
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range fuzzTarget.FindAllSubmatch(src, -1) {
				targets++
				name := string(m[1])
				rel, _ := filepath.Rel(root, path)
				corpus := filepath.Join(filepath.Dir(path), "testdata", "fuzz", name)
				entries, err := os.ReadDir(corpus)
				if err != nil || len(entries) == 0 {
					t.Errorf("%s: %s has no seed corpus in %s", rel, name, corpus)
					continue
				}
				for _, e := range entries {
					data, err := os.ReadFile(filepath.Join(corpus, e.Name()))
					if err != nil || !strings.HasPrefix(string(data), fuzzCorpusHeader) {
						t.Errorf("%s/%s is not a Go fuzz corpus entry", corpus, e.Name())
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if targets == 0 {
		t.Fatal("no fuzz targets found: the search is broken")
	}
}
