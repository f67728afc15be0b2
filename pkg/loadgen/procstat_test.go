package loadgen

import (
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestTreeSwitches: a process that sleeps and wakes a hundred times is
// seen switching at least that often.
func TestTreeSwitches(t *testing.T) {
	cmd := exec.Command("sh", "-c", "i=0; while [ $i -lt 100 ]; do sleep 0.01; i=$((i+1)); done; sleep 30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	before := TreeSwitches(cmd.Process.Pid)
	// Each sleep is a child: its own switches leave with it, the shell's
	// wait for it stays (at least one switch per child).
	time.Sleep(3 * time.Second)
	if d := TreeSwitches(cmd.Process.Pid) - before; d < 50 {
		t.Fatalf("%v context switches over 100 sleeps", d)
	}
}

func TestParsePids(t *testing.T) {
	got, err := ParsePids("api=12, worker=34,worker=35,")
	if err != nil {
		t.Fatal(err)
	}
	want := []Proc{{"api", 12}, {"worker", 34}, {"worker", 35}}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	for _, bad := range []string{"api", "api=", "=12", "api=x", "api=-1", "api=0"} {
		if _, err := ParsePids(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestParseStatHead(t *testing.T) {
	pid, comm, ppid, ok := parseStatHead("4242 (we ird) (name)) S 17 4242 4242 0 -1 4194560 ...")
	if !ok || pid != 4242 || comm != "we ird) (name)" || ppid != 17 {
		t.Fatalf("got %d %q %d %v", pid, comm, ppid, ok)
	}
	for _, bad := range []string{"", "12 (x", "x (y) S 1", "12 (y) S"} {
		if _, _, _, ok := parseStatHead(bad); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}

// TestParseStatCPU: busy leaves out idle, iowait and guest (already in
// user); steal is its own column; a short or foreign line gives what it has.
func TestParseStatCPU(t *testing.T) {
	for _, c := range []struct {
		line        string
		busy, steal float64
	}{
		{"cpu  100 2 30 900 40 5 6 70 8 0\ncpu0 1 2 3", 1.43, 0.7},
		{"cpu  100 2 30 900", 1.32, 0},        // an old kernel: no steal column
		{"cpu  100 x 30 900 40 5 6 70", 1, 0}, // stops at what it cannot read
		{"cpu0 100 2 30 900 40 5 6 70", 0, 0}, // not the machine's line
		{"", 0, 0},
	} {
		busy, steal := parseStatCPU(c.line)
		if !near(busy, c.busy) || !near(steal, c.steal) {
			t.Errorf("%q: busy %v steal %v, want %v %v", c.line, busy, steal, c.busy, c.steal)
		}
	}
	// The window's steal, and its line in the text.
	u := CPUBetween(CPUSample{At: time.Unix(0, 0), Steal: 1}, CPUSample{At: time.Unix(10, 0), Steal: 3.5}, 0)
	if !near(u.StealSeconds, 2.5) || !near(u.StealCorePercent, 25) || !strings.Contains(u.Text(), "cpu steal            25.00% of a core") {
		t.Fatalf("steal %+v\n%s", u, u.Text())
	}
	if live, _ := machineCPU(); live <= 0 {
		t.Fatalf("this machine's /proc/stat gave busy %v", live)
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

func FuzzParseStatCPU(f *testing.F) {
	f.Add("cpu  100 2 30 900 40 5 6 70 8 0")
	f.Add("cpu 1 -1 1e308 NaN")
	f.Add("cpu 18446744073709551615 18446744073709551615 1 1 1 18446744073709551615")
	f.Add("cpu\t1 2 3 4 5 6 7 8 9 10 11 12")
	f.Fuzz(func(t *testing.T, line string) {
		busy, steal := parseStatCPU(line)
		if !(busy >= 0 && steal >= 0) || math.IsInf(busy, 0) || math.IsInf(steal, 0) {
			t.Fatalf("busy %v steal %v from %q", busy, steal, line)
		}
	})
}

func FuzzParsePids(f *testing.F) {
	f.Add("api=1,worker=2")
	f.Add("a==1,,b=99999999999999999999")
	f.Fuzz(func(t *testing.T, spec string) {
		procs, err := ParsePids(spec)
		if err != nil {
			return
		}
		if len(procs) > ProcsMax {
			t.Fatalf("%d processes", len(procs))
		}
		for _, p := range procs {
			if p.Name == "" || p.Pid <= 0 {
				t.Fatalf("bad %+v from %q", p, spec)
			}
		}
	})
}

func FuzzParseStatHead(f *testing.F) {
	f.Add("1 (init) S 0 1 1 0 -1")
	f.Add("2 ()) S 1")
	f.Fuzz(func(t *testing.T, stat string) {
		if _, comm, _, ok := parseStatHead(stat); ok && !strings.Contains(stat, "("+comm+")") {
			t.Fatalf("comm %q not in %q", comm, stat)
		}
		_, _ = statFields(stat)
	})
}

// TestTreeCPU spawns a shell whose child burns CPU: the tree's CPU grows
// by about what the child used, a lone process's does not, and once the
// child is reaped its CPU stays in the tree's total.
func TestTreeCPU(t *testing.T) {
	dir := t.TempDir()
	// A uniquely named copy of sh, so MatchProcs finds exactly this one.
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	data, err := os.ReadFile(sh)
	if err != nil {
		t.Fatal(err)
	}
	probe := filepath.Join(dir, "lgprobe")
	if err := os.WriteFile(probe, data, 0o755); err != nil {
		t.Fatal(err)
	}
	// The child spins for a second or so of CPU, then the parent waits idle.
	cmd := exec.Command(probe, "-c", `sh -c 'i=0; while [ $i -lt 1000000 ]; do i=$((i+1)); done'; sleep 30`)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	procs, err := MatchProcs([]string{"lgprobe"})
	if err != nil || len(procs) != 1 || procs[0].Pid != cmd.Process.Pid {
		t.Fatalf("MatchProcs: %v %v (want pid %d)", procs, err, cmd.Process.Pid)
	}
	if _, err := MatchProcs([]string{"no-such-process-xyz"}); err == nil {
		t.Fatal("a missing process matched")
	}
	before, err := SampleCPU(procs)
	if err != nil {
		t.Fatal(err)
	}
	// Wait until the spinning child has ended and been reaped (the only
	// descendant left is sleep): its CPU must still be in the total.
	deadline := time.Now().Add(30 * time.Second)
	for spinning(cmd.Process.Pid) {
		if time.Now().After(deadline) {
			t.Fatal("the spinning child never ended")
		}
		time.Sleep(100 * time.Millisecond)
	}
	after, err := SampleCPU(procs)
	if err != nil {
		t.Fatal(err)
	}
	u := CPUBetween(before, after, 10)
	if u.Seconds["lgprobe"] < 0.2 {
		t.Fatalf("the tree's CPU did not keep the reaped child's: %+v", u)
	}
	if own, _ := ProcessCPUSeconds(cmd.Process.Pid, false); own > 0.1 {
		t.Fatalf("the parent itself used %.2f s: the test measures the wrong thing", own)
	}
	// The spinning child took its switches with it: counted from zero.
	if u.Switches["lgprobe"] < 0 || u.SwitchesPerEvent[CPUTotal] != u.Switches["lgprobe"]/10 {
		t.Fatalf("context switches wrong: %+v", u)
	}
	if u.MsPerEvent["lgprobe"] != 1000*u.Seconds["lgprobe"]/10 || u.CorePercent["lgprobe"] <= 0 {
		t.Fatalf("per event / per core figures wrong: %+v", u)
	}
}

// spinning reports whether pid still has a child other than sleep.
func spinning(pid int) bool {
	for _, c := range Descendants(pid) {
		data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(c), "comm"))
		if err == nil && strings.TrimSpace(string(data)) != "sleep" {
			return true
		}
	}
	return false
}
