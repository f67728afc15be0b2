// Package devenv runs throwaway PostgreSQL and Redis servers from the
// system's binaries: for the test harness, for `go tool task run`, and for
// the chaos soak, which stops, pauses and restarts them.
package devenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// startTimeout bounds how long a server may take to accept connections.
const startTimeout = 30 * time.Second

// FreePort asks the kernel for a free TCP port on loopback.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// PostgresBinDir finds the directory holding initdb and postgres: the
// SETTLE_PG_BIN setting, else the newest /usr/lib/postgresql/N/bin (N ≥ 15),
// else pg_config --bindir.
func PostgresBinDir() (string, error) {
	if dir := os.Getenv("SETTLE_PG_BIN"); dir != "" {
		return dir, nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	type candidate struct {
		version int
		dir     string
	}
	var found []candidate
	for _, m := range matches {
		dir := filepath.Dir(m)
		version, err := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
		if err == nil && version >= 15 {
			found = append(found, candidate{version, dir})
		}
	}
	sort.Slice(found, func(i, j int) bool { return found[i].version > found[j].version })
	if len(found) > 0 {
		return found[0].dir, nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	return "", errors.New("PostgreSQL 15+ server binaries not found (install Debian's postgresql package, or set SETTLE_PG_BIN)")
}

// serverUser is who the servers run as: PostgreSQL refuses to run as root,
// so root hands them to the postgres account.
type serverUser struct {
	credential *syscall.Credential
	uid, gid   int
}

func lookupServerUser() (*serverUser, error) {
	if os.Geteuid() != 0 {
		return &serverUser{uid: os.Geteuid(), gid: os.Getegid()}, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root needs a postgres account to run the server: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &serverUser{credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, uid: uid, gid: gid}, nil
}

func (u *serverUser) own(paths ...string) error {
	for _, p := range paths {
		if err := os.Chown(p, u.uid, u.gid); err != nil {
			return err
		}
	}
	return nil
}

// process is a server child in its own process group, so that stopping,
// pausing or killing reaches every process it forked.
type process struct {
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

func (p *process) start(cmd *exec.Cmd) error {
	cmd.SysProcAttr = mergeAttr(cmd.SysProcAttr)
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	return nil
}

func mergeAttr(attr *syscall.SysProcAttr) *syscall.SysProcAttr {
	if attr == nil {
		attr = &syscall.SysProcAttr{}
	}
	attr.Setpgid = true
	// The servers die with us even if we are killed.
	attr.Pdeathsig = syscall.SIGKILL
	return attr
}

func (p *process) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// signalGroup sends sig to the process, its process group, and every
// descendant: PostgreSQL backends call setsid and leave the group, so the
// group alone would let them run on while the postmaster is stopped.
func (p *process) signalGroup(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return errors.New("not started")
	}
	pid := p.cmd.Process.Pid
	err := syscall.Kill(-pid, sig)
	for _, child := range Descendants(pid) {
		_ = syscall.Kill(child, sig)
	}
	return err
}

// Descendants lists the live descendants of pid, from /proc.
func Descendants(pid int) []int {
	parents := map[int][]int{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		text := string(data)
		end := strings.LastIndexByte(text, ')')
		if end < 0 {
			continue
		}
		fields := strings.Fields(text[end+1:])
		if len(fields) < 2 {
			continue
		}
		child, err1 := strconv.Atoi(strings.Fields(text)[0])
		parent, err2 := strconv.Atoi(fields[1])
		if err1 == nil && err2 == nil {
			parents[parent] = append(parents[parent], child)
		}
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 && len(out) < 100_000 {
		next := queue[0]
		queue = queue[1:]
		for _, c := range parents[next] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// stop asks politely with sig, then kills the group after grace.
func (p *process) stop(sig syscall.Signal, grace time.Duration) {
	if !p.running() {
		return
	}
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	_ = p.signalGroup(syscall.SIGCONT) // a paused server cannot stop
	_ = p.signalGroup(sig)
	select {
	case <-done:
	case <-time.After(grace):
		_ = p.signalGroup(syscall.SIGKILL)
		<-done
	}
}

// ErrPortTaken: something already answers on the port a server was to
// listen on.
var ErrPortTaken = errors.New("already taken by another server")

// refuseTaken fails when something already answers on addr: a server
// started there would exit at once for want of its port, and waiting for
// the port would take that other server for ours (a dev stack then runs
// on someone else's database).
func refuseTaken(what, addr string) error {
	conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return nil
	}
	conn.Close()
	return fmt.Errorf("cannot start %s: %s is %w", what, addr, ErrPortTaken)
}

func waitTCP(ctx context.Context, addr string, done <-chan struct{}) error {
	for {
		conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			conn.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not accept connections: %w", addr, ctx.Err())
		case <-done:
			return fmt.Errorf("server for %s exited during start", addr)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func tail(path string, lines int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// pid is the server's process id (0 if not running); its process group
// has the same id, since servers start in their own group.
func (p *process) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Process supervises one child in its own process group that dies with
// its parent: the one supervisor of settle's dev and test tooling (the
// servers here, settle's binaries under `settlectl dev` and the test
// harness). Stopping, pausing or killing reaches everything it forked.
type Process struct{ p process }

// Start runs cmd under supervision; its SysProcAttr gains a process group
// and the parent-death signal.
func (x *Process) Start(cmd *exec.Cmd) error { return x.p.start(cmd) }

// Running reports whether the child is alive.
func (x *Process) Running() bool { return x.p.running() }

// Signal sends sig to the child's group and every descendant.
func (x *Process) Signal(sig syscall.Signal) error { return x.p.signalGroup(sig) }

// Stop asks with sig, kills after grace, and returns the exit code (-1
// when it was never started or died of a signal).
func (x *Process) Stop(sig syscall.Signal, grace time.Duration) int {
	x.p.stop(sig, grace)
	return x.ExitCode()
}

// Kill ends the child and its group with SIGKILL and waits for it.
func (x *Process) Kill() { x.p.stop(syscall.SIGKILL, time.Second) }

// Pid is the child's process id (0 before Start).
func (x *Process) Pid() int { return x.p.pid() }

// Done is closed once the child has exited; nil before Start.
func (x *Process) Done() <-chan struct{} {
	x.p.mu.Lock()
	defer x.p.mu.Unlock()
	return x.p.done
}

// ExitCode is the exit code of a child that has exited, else -1.
func (x *Process) ExitCode() int {
	x.p.mu.Lock()
	cmd, done := x.p.cmd, x.p.done
	x.p.mu.Unlock()
	if cmd == nil {
		return -1
	}
	select {
	case <-done: // Wait has set ProcessState
		return cmd.ProcessState.ExitCode()
	default:
		return -1
	}
}
