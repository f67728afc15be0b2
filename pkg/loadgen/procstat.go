package loadgen

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat CPU times (100 on
// every Linux this runs on).
const clockTicks = 100

// Process-table bounds.
const (
	// descendantsMax bounds one walk of a process tree.
	descendantsMax = 100_000
	// ProcsMax bounds the processes one run is told about.
	ProcsMax = 64
)

// Proc is a process whose CPU a run measures: the process and every live
// descendant (a PostgreSQL postmaster and its backends), plus what it
// collected from children already reaped (backends that ended).
type Proc struct {
	Name string
	Pid  int
}

// ParsePids reads "name=pid,name=pid". A name given twice sums its
// processes (two workers under one name).
func ParsePids(spec string) ([]Proc, error) {
	var out []Proc
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, pidText, ok := strings.Cut(item, "=")
		pid, err := strconv.Atoi(pidText)
		if !ok || name == "" || err != nil || pid <= 0 {
			return nil, fmt.Errorf("%q is not name=pid", item)
		}
		out = append(out, Proc{Name: name, Pid: pid})
	}
	if len(out) > ProcsMax {
		return nil, fmt.Errorf("at most %d processes", ProcsMax)
	}
	return out, nil
}

// MatchProcs finds, for each command name (as /proc/<pid>/comm spells
// it, e.g. "api", "postgres", "redis-server"), the one process of that
// name whose parent has another name: the postmaster, not its backends.
// A name that matches no process, or more than one (two PostgreSQL
// clusters on one machine), is an error: name the pids instead.
func MatchProcs(names []string) ([]Proc, error) {
	comms := map[int]string{}
	parents := map[int]int{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		pid, comm, ppid, ok := parseStatHead(string(data))
		if ok {
			comms[pid], parents[pid] = comm, ppid
		}
	}
	self := os.Getpid()
	var out []Proc
	var problems []string
	for _, name := range names {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		var found []int
		for pid, comm := range comms {
			if comm == name && comms[parents[pid]] != name && pid != self {
				found = append(found, pid)
			}
		}
		sort.Ints(found)
		switch len(found) {
		case 0:
			problems = append(problems, fmt.Sprintf("no process named %q", name))
		case 1:
			out = append(out, Proc{Name: name, Pid: found[0]})
		default:
			problems = append(problems, fmt.Sprintf("%d processes named %q (pids %v): name them with --pids", len(found), name, found))
		}
	}
	if len(problems) > 0 {
		return out, errors.New(strings.Join(problems, "; "))
	}
	return out, nil
}

// parseStatHead reads pid, command name and parent pid of one
// /proc/<pid>/stat; the name may hold spaces and parentheses.
func parseStatHead(stat string) (pid int, comm string, ppid int, ok bool) {
	open, end := strings.IndexByte(stat, '('), strings.LastIndexByte(stat, ')')
	if open < 0 || end < open {
		return 0, "", 0, false
	}
	rest := strings.Fields(stat[end+1:])
	if len(rest) < 2 {
		return 0, "", 0, false
	}
	pid, err1 := strconv.Atoi(strings.TrimSpace(stat[:open]))
	ppid, err2 := strconv.Atoi(rest[1])
	return pid, stat[open+1 : end], ppid, err1 == nil && err2 == nil
}

// statFields splits /proc/<pid>/stat into its fields, numbered from 1 as
// proc(5) numbers them (fields[0] is field 1).
func statFields(stat string) ([]string, error) {
	end := strings.LastIndexByte(stat, ')')
	if end < 0 {
		return nil, fmt.Errorf("malformed stat %q", stat)
	}
	rest := strings.Fields(stat[end+1:])
	if len(rest) < 15 {
		return nil, fmt.Errorf("malformed stat %q", stat)
	}
	return append([]string{"pid", "comm"}, rest...), nil
}

// ProcessCPUSeconds is utime+stime of pid, plus cutime+cstime when
// withReaped (the CPU of its children already waited for).
func ProcessCPUSeconds(pid int, withReaped bool) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	fields, err := statFields(string(data))
	if err != nil {
		return 0, err
	}
	last := 15
	if withReaped {
		last = 17
	}
	sum := 0.0
	for i := 14; i <= last; i++ {
		v, err := strconv.ParseFloat(fields[i-1], 64)
		if err != nil {
			return 0, err
		}
		sum += v
	}
	return sum / clockTicks, nil
}

// TreeCPUSeconds sums pid, every live descendant, and the children pid
// already reaped. A backend that ends between two samples moves from the
// live sum to the reaped one, so the total never goes back.
func TreeCPUSeconds(pid int) (float64, error) {
	total, err := ProcessCPUSeconds(pid, true)
	if err != nil {
		return 0, err
	}
	for _, child := range Descendants(pid) {
		if v, err := ProcessCPUSeconds(child, false); err == nil {
			total += v
		}
	}
	return total, nil
}

// Descendants lists the live descendants of pid, from /proc.
func Descendants(pid int) []int {
	children := map[int][]int{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		if child, _, parent, ok := parseStatHead(string(data)); ok {
			children[parent] = append(children[parent], child)
		}
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 && len(out) < descendantsMax {
		next := queue[0]
		queue = queue[1:]
		for _, c := range children[next] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// TreeSwitches sums the context switches (voluntary and not) of every
// thread of pid and of its live descendants: each is a wake-up of a
// thread. Threads and processes that ended take theirs with them, so for
// short-lived backends this is a lower bound.
func TreeSwitches(pid int) float64 {
	total := 0.0
	for _, p := range append([]int{pid}, Descendants(pid)...) {
		threads, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/[0-9]*/status", p))
		for _, path := range threads {
			data, err := os.ReadFile(path)
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(data), "\n") {
				if strings.HasPrefix(line, "voluntary_ctxt_switches:") || strings.HasPrefix(line, "nonvoluntary_ctxt_switches:") {
					if f := strings.Fields(line); len(f) == 2 {
						n, _ := strconv.ParseFloat(f[1], 64)
						total += n
					}
				}
			}
		}
	}
	return total
}

// PeakRSSMiB is VmHWM, the process's peak resident set.
func PeakRSSMiB(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			if f := strings.Fields(line); len(f) >= 2 {
				kb, _ := strconv.ParseFloat(f[1], 64)
				return kb / 1024
			}
		}
	}
	return 0
}

// SelfCPUSeconds is this process's own CPU (the load generator).
func SelfCPUSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
}

// MachineBusySeconds is the CPU time every process on the machine used
// (from /proc/stat), to tell how much the rest of the machine took.
func MachineBusySeconds() float64 {
	busy, _ := machineCPU()
	return busy
}

// machineCPU is the machine's busy and stolen CPU seconds so far.
func machineCPU() (busy, steal float64) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	return parseStatCPU(string(data))
}

// parseStatCPU reads the "cpu" line of /proc/stat: busy is user, nice,
// system, irq and softirq; steal is the time the hypervisor ran something
// else while a vCPU of this machine had work. A line it cannot read, or
// one from a kernel without a steal column, gives what it has.
func parseStatCPU(data string) (busy, steal float64) {
	f := strings.Fields(strings.SplitN(data, "\n", 2)[0])
	if len(f) == 0 || f[0] != "cpu" {
		return 0, 0
	}
	// Up to steal: the guest columns after it are already in user.
	for i, v := range f[1:min(len(f), 9)] {
		// The kernel writes clock ticks as unsigned integers.
		ticks, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			break
		}
		n := float64(ticks) / clockTicks
		switch i {
		case 3, 4: // idle, iowait
		case 7:
			steal = n
		default:
			busy += n
		}
	}
	return busy, steal
}

// Names the CPU sample gives besides the processes.
const (
	CPULoadGenerator = "load-generator"
	CPUMachine       = "machine"
	CPUTotal         = "total"
)

// CPUSample is the CPU seconds each named process (summed per name) had
// used at one instant, the load generator's own and the machine's.
type CPUSample struct {
	At      time.Time
	Seconds map[string]float64
	// Switches is each name's context switches (TreeSwitches).
	Switches map[string]float64
	// Steal is the machine's stolen CPU seconds (parseStatCPU).
	Steal float64
}

// SampleCPU reads every process's CPU. A process that is gone is an
// error: its CPU would silently drop out of the total.
func SampleCPU(procs []Proc) (CPUSample, error) {
	busy, steal := machineCPU()
	s := CPUSample{At: time.Now(), Seconds: map[string]float64{
		CPULoadGenerator: SelfCPUSeconds(), CPUMachine: busy,
	}, Switches: map[string]float64{}, Steal: steal}
	for _, p := range procs {
		v, err := TreeCPUSeconds(p.Pid)
		if err != nil {
			return s, fmt.Errorf("cpu of %s (pid %d): %w", p.Name, p.Pid, err)
		}
		s.Seconds[p.Name] += v
		s.Switches[p.Name] += TreeSwitches(p.Pid)
	}
	return s, nil
}

// CPUUse is what the told processes used between two samples.
type CPUUse struct {
	WindowSeconds float64 `json:"window_seconds"`
	// Seconds per process name, "total" (the told processes only: not the
	// load generator), "load-generator", and "other" (the rest of the
	// machine: what it took is why a shared machine's figures move).
	Seconds map[string]float64 `json:"cpu_seconds"`
	// MsPerEvent divides Seconds by the events (when given).
	MsPerEvent map[string]float64 `json:"cpu_ms_per_event,omitempty"`
	// CorePercent divides Seconds by the window: 100 is one core busy.
	CorePercent map[string]float64 `json:"core_percent"`
	// Switches counts the told processes' context switches (wake-ups of
	// their threads) per name and "total"; SwitchesPerEvent divides them
	// by the events. Unlike CPU time, a count hardly moves with the
	// machine's other load, as long as the rate stays a trickle.
	Switches         map[string]float64 `json:"context_switches"`
	SwitchesPerEvent map[string]float64 `json:"context_switches_per_event,omitempty"`
	// StealSeconds is the CPU the hypervisor took from the machine's
	// vCPUs in the window (StealCorePercent of one core). On a guest
	// whose kernel cannot tell steal apart, it lands in the processes'
	// own times instead, and "other" goes below zero: either way a
	// window with much of it measured the host as well as settle.
	StealSeconds     float64 `json:"steal_seconds"`
	StealCorePercent float64 `json:"steal_core_percent"`
}

// CPUBetween computes the use between before and after; events > 0 adds
// the per-event figures. A name missing from before (a process started
// in the window) counts from zero.
func CPUBetween(before, after CPUSample, events int) CPUUse {
	u := CPUUse{WindowSeconds: after.At.Sub(before.At).Seconds(), Seconds: map[string]float64{}, CorePercent: map[string]float64{}}
	total := 0.0
	for name, v := range after.Seconds {
		d := v - before.Seconds[name]
		u.Seconds[name] = d
		if name != CPUMachine && name != CPULoadGenerator {
			total += d
		}
	}
	u.Seconds[CPUTotal] = total
	u.Switches = map[string]float64{}
	for name, v := range after.Switches {
		// A thread or child that ended takes its count with it: never
		// below zero.
		d := max(v-before.Switches[name], 0)
		u.Switches[name] = d
		u.Switches[CPUTotal] += d
	}
	if events > 0 {
		u.SwitchesPerEvent = map[string]float64{}
		for name, v := range u.Switches {
			u.SwitchesPerEvent[name] = v / float64(events)
		}
	}
	u.Seconds["other"] = u.Seconds[CPUMachine] - total - u.Seconds[CPULoadGenerator]
	u.StealSeconds = max(after.Steal-before.Steal, 0)
	if u.WindowSeconds > 0 {
		u.StealCorePercent = 100 * u.StealSeconds / u.WindowSeconds
	}
	delete(u.Seconds, CPUMachine)
	if events > 0 {
		u.MsPerEvent = map[string]float64{}
	}
	for name, v := range u.Seconds {
		if u.WindowSeconds > 0 {
			u.CorePercent[name] = 100 * v / u.WindowSeconds
		}
		if events > 0 && name != "other" {
			u.MsPerEvent[name] = 1000 * v / float64(events)
		}
	}
	return u
}

// Text is the use as one line per name, the told processes first.
func (u CPUUse) Text() string {
	names := make([]string, 0, len(u.Seconds))
	for n := range u.Seconds {
		if n != CPUTotal && n != CPULoadGenerator && n != "other" {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	names = append(names, CPUTotal, CPULoadGenerator, "other")
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "  cpu %-15s", n)
		if u.MsPerEvent != nil && n != "other" {
			fmt.Fprintf(&b, " %7.3f ms/event", u.MsPerEvent[n])
		}
		fmt.Fprintf(&b, " %6.2f%% of a core  (%.2f s)", u.CorePercent[n], u.Seconds[n])
		if sw, ok := u.Switches[n]; ok {
			if u.SwitchesPerEvent != nil {
				fmt.Fprintf(&b, "  %.1f wake-ups/event", u.SwitchesPerEvent[n])
			} else if u.WindowSeconds > 0 {
				fmt.Fprintf(&b, "  %.1f wake-ups/s", sw/u.WindowSeconds)
			}
		}
		switch n {
		case CPULoadGenerator:
			b.WriteString("  not counted")
		case "other":
			b.WriteString("  the rest of the machine, not counted")
		}
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "  cpu %-15s %6.2f%% of a core  (%.2f s)  taken by the hypervisor from this machine's vCPUs, not counted\n",
		"steal", u.StealCorePercent, u.StealSeconds)
	return b.String()
}
