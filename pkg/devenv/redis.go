package devenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// RedisOptions configure a throwaway server.
type RedisOptions struct {
	// Dir holds logs (and the append-only file when Durable); empty means
	// a temp dir that Close removes.
	Dir  string
	Port int
	// Durable turns on appendonly with fsync every second, as in
	// production. Off, a restart loses everything, which the chaos soak
	// uses on purpose.
	Durable bool
	// Databases is the number of logical databases (tests take one each).
	Databases int
	// Hz is redis-server's housekeeping frequency (--hz); 0 leaves
	// Redis's own default of 10.
	Hz int
}

// RedisHzDeployed is the --hz the dev stack (settlectl dev, `task run`)
// and the benchmarks run Redis with. Redis's housekeeping (expiring keys
// nobody reads, resizing tables) runs hz times a second whether or not
// anything changed: at its default of 10 it was most of an idle Redis's
// CPU. settle's Redis keeps no key that must vanish unread (a key is
// expired exactly when read, whatever hz), uses no blocking command whose
// timeout hz would coarsen, and holds nothing the outbox cannot rebuild,
// so at 2 the costs are an expired rate-limit counter's memory freed a
// little later and the append-only file's last second fsynced within
// about 1.5 s instead of 1.1 s.
const RedisHzDeployed = 2

// Redis is a redis-server child process.
type Redis struct {
	Port    int
	Dir     string
	temp    bool
	options RedisOptions
	proc    process
}

// workDir returns dir, created if missing, or a new temporary directory
// (temp true: the caller removes it) when dir is empty.
func workDir(dir, prefix string) (_ string, temp bool, err error) {
	if dir == "" {
		if dir, err = os.MkdirTemp("", prefix); err != nil {
			return "", false, err
		}
		temp = true
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", false, err
	}
	return dir, temp, nil
}

// RedisServerPath finds redis-server.
func RedisServerPath() (string, error) {
	if path, err := exec.LookPath("redis-server"); err == nil {
		return path, nil
	}
	return "", errors.New("redis-server not found (install Debian's redis-server package)")
}

// StartRedis starts a server and waits until it answers.
func StartRedis(ctx context.Context, opts RedisOptions) (*Redis, error) {
	r := &Redis{options: opts, Dir: opts.Dir, Port: opts.Port}
	var err error
	if r.Dir, r.temp, err = workDir(r.Dir, "settle-redis-"); err != nil {
		return nil, err
	}
	if r.Port == 0 {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		r.Port = port
	}
	if err := r.Start(ctx); err != nil {
		r.cleanup()
		return nil, err
	}
	return r, nil
}

// Start runs the server (again) and waits until it accepts connections.
func (r *Redis) Start(ctx context.Context) error {
	if r.proc.running() {
		return nil
	}
	path, err := RedisServerPath()
	if err != nil {
		return err
	}
	databases := r.options.Databases
	if databases <= 0 {
		databases = 16
	}
	args := []string{
		"--port", strconv.Itoa(r.Port), "--bind", "127.0.0.1",
		"--dir", r.Dir, "--databases", strconv.Itoa(databases),
		"--save", "", "--daemonize", "no",
		"--logfile", filepath.Join(r.Dir, "redis.log"),
	}
	if r.options.Hz > 0 {
		args = append(args, "--hz", strconv.Itoa(r.options.Hz))
	}
	if r.options.Durable {
		args = append(args, "--appendonly", "yes", "--appendfsync", "everysec")
	} else {
		args = append(args, "--appendonly", "no")
	}
	if err := refuseTaken("Redis", r.Addr()); err != nil {
		return err
	}
	cmd := exec.Command(path, args...)
	if err := r.proc.start(cmd); err != nil {
		return fmt.Errorf("start redis: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	if err := waitTCP(ctx, r.Addr(), r.proc.done); err != nil {
		r.proc.stop(syscall.SIGKILL, time.Second)
		return fmt.Errorf("%w\n%s", err, tail(filepath.Join(r.Dir, "redis.log"), 20))
	}
	return nil
}

// Addr is host:port.
func (r *Redis) Addr() string { return fmt.Sprintf("127.0.0.1:%d", r.Port) }

// URL names logical database db.
func (r *Redis) URL(db int) string { return fmt.Sprintf("redis://127.0.0.1:%d/%d", r.Port, db) }

// Stop shuts the server down; without Durable its data is gone.
func (r *Redis) Stop() { r.proc.stop(syscall.SIGTERM, 10*time.Second) }

// Kill ends it abruptly.
func (r *Redis) Kill() { r.proc.stop(syscall.SIGKILL, time.Second) }

// Pause and Resume freeze and continue the server.
func (r *Redis) Pause() error  { return r.proc.signalGroup(syscall.SIGSTOP) }
func (r *Redis) Resume() error { return r.proc.signalGroup(syscall.SIGCONT) }

// Close stops the server and removes a temp dir.
func (r *Redis) Close() {
	r.Stop()
	r.cleanup()
}

func (r *Redis) cleanup() {
	if r.temp {
		_ = os.RemoveAll(r.Dir)
	}
}

// Pid is the server's process id.
func (r *Redis) Pid() int { return r.proc.pid() }
