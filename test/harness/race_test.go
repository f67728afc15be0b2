package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// racerEnv names the racer binary (and its argument) to the child test.
const (
	racerEnv    = "SETTLE_HARNESS_RACER"
	racerArgEnv = "SETTLE_HARNESS_RACER_ARG"
	// racerKillEnv makes the child SIGKILL the racer before the cleanup,
	// as the chaos soak does.
	racerKillEnv = "SETTLE_HARNESS_RACER_KILL"
)

// TestRaceReportFailsTheTest runs a test that starts a process with a data
// race through the harness, in a child test process: the child must fail
// and name the process. The same child with a race-free process passes,
// so the check is not failing everything.
func TestRaceReportFailsTheTest(t *testing.T) {
	dir := t.TempDir()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-race", "-o", dir+"/", "./test/harness/testdata/racer")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build racer: %v\n%s", err, out)
	}
	racer := filepath.Join(dir, "racer")

	for _, tc := range []struct {
		arg      string
		kill     bool
		wantFail bool
	}{{arg: "race", wantFail: true}, {arg: "race", kill: true, wantFail: true}, {arg: "calm", wantFail: false}} {
		child := exec.Command(os.Args[0], "-test.run=^TestRacerChild$", "-test.v", "-test.count=1")
		child.Env = append(os.Environ(), racerEnv+"="+racer, racerArgEnv+"="+tc.arg)
		if tc.kill {
			child.Env = append(child.Env, racerKillEnv+"=1")
		}
		out, err := child.CombinedOutput()
		failed := err != nil
		if failed != tc.wantFail {
			t.Fatalf("racer %s (kill %v): child test failed=%v, want %v:\n%s", tc.arg, tc.kill, failed, tc.wantFail, out)
		}
		if !tc.wantFail {
			continue
		}
		for _, want := range []string{"racer-0: the race detector reported a data race", raceWarning, "--- FAIL: TestRacerChild"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("racer %s: child output lacks %q:\n%s", tc.arg, want, out)
			}
		}
	}
}

// TestRacerChild is TestRaceReportFailsTheTest's child: it starts the racer
// through a Stack and leaves it to the Stack's cleanup.
func TestRacerChild(t *testing.T) {
	racer := os.Getenv(racerEnv)
	if racer == "" {
		t.Skip("run by TestRaceReportFailsTheTest")
	}
	s := newStack(t)
	p := s.newProc("racer-0", racer, "UNUSED_ADDR", nil, os.Getenv(racerArgEnv))
	p.Start()
	s.WaitFor("the racer to start", 30*time.Second, func() bool { return strings.Contains(p.Logs(), "ready") })
	if os.Getenv(racerKillEnv) != "" {
		p.Kill()
	}
}

func TestRaceReport(t *testing.T) {
	out := "starting\n==================\nWARNING: DATA RACE\nWrite at 0x1 by goroutine 7:\n  main.race()\n==================\nready\n"
	report, ok := raceReport(out)
	if !ok || !strings.HasPrefix(report, raceWarning) || !strings.Contains(report, "main.race()") || strings.Contains(report, "ready") {
		t.Fatalf("report %q, %v", report, ok)
	}
	if _, ok := raceReport("all fine\n"); ok {
		t.Fatal("a report found in clean output")
	}
}

func TestRaceBinaries(t *testing.T) {
	for _, tc := range []struct {
		race, ci string
		want     bool
	}{{"", "", false}, {"", "true", true}, {"1", "", true}, {"0", "true", false}, {"true", "", true}} {
		t.Setenv(raceBinariesVar, tc.race)
		t.Setenv("CI", tc.ci)
		if got := RaceBinaries(); got != tc.want {
			t.Errorf("%s=%q CI=%q: %v, want %v", raceBinariesVar, tc.race, tc.ci, got, tc.want)
		}
	}
}
