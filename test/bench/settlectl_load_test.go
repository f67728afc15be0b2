package bench

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/settle/settle/pkg/testenv"
	"github.com/settle/settle/test/harness"
)

// TestSettlectlLoadReportsCPUPerEvent runs the operator's tool as an
// operator would against a running system: `settlectl load --rate` with
// the processes named by pid, after an idle window, and reads its report:
// idle CPU and CPU and wake-ups per event for each process, the
// invariants passing.
func TestSettlectlLoadReportsCPUPerEvent(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole system")
	}
	s := harness.NewStack(t)
	s.Env["LOG_LEVEL"] = "warn"
	api, worker, scheduler := s.StartAPI(nil), s.StartWorker(nil), s.StartScheduler(nil)
	pg, rds := testenv.Postgres(t), testenv.Redis(t)
	if pg == nil || rds == nil {
		t.Skip("needs the harness's own PostgreSQL and Redis")
	}
	bin := filepath.Join(t.TempDir(), "settlectl")
	build := exec.Command("go", "build", "-tags", "dev", "-o", bin, "github.com/settle/settle/cmd/settlectl")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build settlectl -tags dev: %v\n%s", err, out)
	}
	pids := "api=" + strconv.Itoa(api.Pid()) + ",worker=" + strconv.Itoa(worker.Pid()) + ",scheduler=" + strconv.Itoa(scheduler.Pid()) +
		",postgres=" + strconv.Itoa(pg.Pid()) + ",redis=" + strconv.Itoa(rds.Pid())
	cmd := exec.Command(bin, "load", "--api", api.URL(), "--events", "200", "--rate", "100", "--concurrency", "8",
		"--users", "10", "--assets", "ETH", "--pids", pids, "--idle", "2s", "--quiet", "--seed", "7")
	cmd.Env = testenv.Env(s.Env)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("settlectl load: %v\n%s", err, out)
	}
	text := string(out)
	t.Logf("settlectl load:\n%s", text)
	for _, want := range []string{"idle CPU over 2.", "CPU per terminal event over", "invariants: PASS"} {
		if !strings.Contains(text, want) {
			t.Fatalf("no %q in the report:\n%s", want, text)
		}
	}
	perEvent := regexp.MustCompile(`(?m)^  cpu (\S+)\s+([0-9.]+) ms/event .* ([0-9.]+) wake-ups/event$`)
	seen := map[string]bool{}
	for _, m := range perEvent.FindAllStringSubmatch(text, -1) {
		seen[m[1]] = true
		if m[1] == "total" {
			if v, _ := strconv.ParseFloat(m[2], 64); v <= 0 {
				t.Fatalf("total CPU per event %s:\n%s", m[2], text)
			}
		}
	}
	for _, name := range []string{"api", "worker", "scheduler", "postgres", "redis", "total"} {
		if !seen[name] {
			t.Fatalf("no per-event line for %s:\n%s", name, text)
		}
	}
	// A pid that is not running is refused before anything is sent.
	bad := exec.Command(bin, "load", "--api", api.URL(), "--events", "1", "--pids", "api=999999999")
	bad.Env = cmd.Env
	if out, err := bad.CombinedOutput(); err == nil || !strings.Contains(string(out), "api") {
		t.Fatalf("a missing pid was not refused: %v\n%s", err, out)
	}
}
