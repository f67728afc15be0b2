// Package bench measures settle end to end: throughput, latency, CPU
// milliseconds per event summed over every process (ours, PostgreSQL,
// Redis) and peak memory, next to pgbench runs of the same SQL and of the
// seed design's per-event SQL. See BENCHMARKS.md for the commands.
package bench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/settle/settle/pkg/devenv"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat CPU times (100 on
// every Linux this runs on).
const clockTicks = 100

// cpuSeconds reads utime+stime of pid, plus cutime+cstime when withChildren
// (the CPU of children already reaped, e.g. PostgreSQL backends that ended).
func cpuSeconds(pid int, withChildren bool) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	fields, err := statFields(string(data))
	if err != nil {
		return 0, err
	}
	sum := 0.0
	last := 15
	if withChildren {
		last = 17
	}
	for i := 14; i <= last; i++ {
		v, err := strconv.ParseFloat(fields[i-1], 64)
		if err != nil {
			return 0, err
		}
		sum += v
	}
	return sum / clockTicks, nil
}

// statFields splits /proc/<pid>/stat; the command name (field 2) may hold
// spaces and parentheses, so split after its closing parenthesis.
func statFields(stat string) ([]string, error) {
	end := strings.LastIndexByte(stat, ')')
	if end < 0 {
		return nil, fmt.Errorf("malformed stat %q", stat)
	}
	rest := strings.Fields(stat[end+1:])
	// rest[0] is field 3 (state); prepend placeholders for fields 1 and 2.
	return append([]string{"pid", "comm"}, rest...), nil
}

// treeCPUSeconds sums the CPU of a server and every live descendant (a
// PostgreSQL postmaster and its backends, which leave its process group),
// plus what the server collected from children already gone.
func treeCPUSeconds(pid int) (float64, error) {
	total, err := cpuSeconds(pid, true)
	if err != nil {
		return 0, err
	}
	for _, child := range devenv.Descendants(pid) {
		if v, err := cpuSeconds(child, false); err == nil {
			total += v
		}
	}
	return total, nil
}

// peakRSSMiB reads VmHWM, the process's peak resident set.
func peakRSSMiB(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			f := strings.Fields(line)
			if len(f) >= 2 {
				kb, _ := strconv.ParseFloat(f[1], 64)
				return kb / 1024
			}
		}
	}
	return 0
}

// selfCPUSeconds is this process's own CPU (the load generator).
func selfCPUSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
}

// machineBusySeconds is the CPU time every process on the machine used
// (from /proc/stat), to tell how much the rest of the machine took.
func machineBusySeconds() float64 {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line := strings.SplitN(string(data), "\n", 2)[0]
	f := strings.Fields(line)
	busy := 0.0
	for i, v := range f[1:] {
		n, _ := strconv.ParseFloat(v, 64)
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		if i >= 7 { // steal, guest: not ours
			break
		}
		busy += n
	}
	return busy / clockTicks
}
