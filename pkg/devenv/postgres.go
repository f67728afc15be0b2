package devenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// PostgresOptions configure a throwaway server.
type PostgresOptions struct {
	// Dir holds the data directory and logs; empty means a new temp dir
	// that Stop removes. A Dir that already holds a cluster is reused.
	Dir string
	// Port to listen on; 0 picks a free one.
	Port int
	// Settings are extra -c name=value server settings.
	Settings map[string]string
}

// Postgres is a PostgreSQL server run from the system's binaries, with
// fsync and synchronous_commit on (the durability the numbers are
// measured with).
type Postgres struct {
	Port    int
	Dir     string
	binDir  string
	owner   *serverUser
	temp    bool
	options PostgresOptions
	proc    process
}

// StartPostgres initialises (if needed) and starts a server.
func StartPostgres(ctx context.Context, opts PostgresOptions) (*Postgres, error) {
	binDir, err := PostgresBinDir()
	if err != nil {
		return nil, err
	}
	owner, err := lookupServerUser()
	if err != nil {
		return nil, err
	}
	p := &Postgres{binDir: binDir, owner: owner, options: opts, Dir: opts.Dir, Port: opts.Port}
	if p.Dir, p.temp, err = workDir(p.Dir, "settle-pg-"); err != nil {
		return nil, err
	}
	// The server account must be able to reach its data directory.
	if err := os.Chmod(p.Dir, 0o755); err != nil {
		return nil, err
	}
	if p.Port == 0 {
		if p.Port, err = FreePort(); err != nil {
			return nil, err
		}
	}
	if err := p.initdb(ctx); err != nil {
		p.cleanup()
		return nil, err
	}
	if err := p.Start(ctx); err != nil {
		p.cleanup()
		return nil, err
	}
	return p, nil
}

func (p *Postgres) dataDir() string   { return filepath.Join(p.Dir, "data") }
func (p *Postgres) socketDir() string { return filepath.Join(p.Dir, "sock") }
func (p *Postgres) logPath() string   { return filepath.Join(p.Dir, "postgres.log") }

func (p *Postgres) initdb(ctx context.Context) error {
	if _, err := os.Stat(filepath.Join(p.dataDir(), "PG_VERSION")); err == nil {
		return nil
	}
	for _, d := range []string{p.dataDir(), p.socketDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
		if err := p.owner.own(d); err != nil {
			return err
		}
	}
	// --no-sync only skips flushing initdb's own files; the server itself
	// runs with fsync on.
	cmd := exec.CommandContext(ctx, filepath.Join(p.binDir, "initdb"),
		"-D", p.dataDir(), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.owner.credential}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %w: %s", err, out)
	}
	return nil
}

// Start runs the server (again, after Stop or Kill) and waits until it
// accepts connections.
func (p *Postgres) Start(ctx context.Context) error {
	if p.proc.running() {
		return nil
	}
	log, err := os.OpenFile(p.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	args := []string{
		"-D", p.dataDir(), "-p", strconv.Itoa(p.Port), "-k", p.socketDir(),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=on", "-c", "synchronous_commit=on",
		"-c", "max_connections=400",
		"-c", "shared_buffers=256MB",
	}
	for name, value := range p.options.Settings {
		args = append(args, "-c", name+"="+value)
	}
	if err := refuseTaken("PostgreSQL", fmt.Sprintf("127.0.0.1:%d", p.Port)); err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(p.binDir, "postgres"), args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.owner.credential}
	if err := p.proc.start(cmd); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	if err := p.waitReady(ctx); err != nil {
		p.proc.stop(syscall.SIGKILL, time.Second)
		return fmt.Errorf("%w\n%s", err, tail(p.logPath(), 20))
	}
	return nil
}

// waitReady waits until the server accepts a real session, not just TCP.
func (p *Postgres) waitReady(ctx context.Context) error {
	if err := waitTCP(ctx, fmt.Sprintf("127.0.0.1:%d", p.Port), p.proc.done); err != nil {
		return err
	}
	for {
		cmd := exec.CommandContext(ctx, filepath.Join(p.binDir, "pg_isready"), "-h", "127.0.0.1", "-p", strconv.Itoa(p.Port), "-q")
		if cmd.Run() == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("postgres on port %d not ready: %w", p.Port, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// URL is a DSN for database db as the superuser.
func (p *Postgres) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", p.Port, db)
}

// Stop shuts the server down (fast mode) and waits for it.
func (p *Postgres) Stop() { p.proc.stop(syscall.SIGINT, 20*time.Second) }

// Kill ends the server abruptly, like a power cut; Start recovers it.
func (p *Postgres) Kill() { p.proc.stop(syscall.SIGKILL, time.Second) }

// Pause freezes every server process (SIGSTOP): connections hang, nothing
// errors, exactly like a stalled database host.
func (p *Postgres) Pause() error { return p.proc.signalGroup(syscall.SIGSTOP) }

// Resume continues a paused server.
func (p *Postgres) Resume() error { return p.proc.signalGroup(syscall.SIGCONT) }

// Close stops the server and removes a temporary directory.
func (p *Postgres) Close() {
	p.Stop()
	p.cleanup()
}

func (p *Postgres) cleanup() {
	if p.temp {
		_ = os.RemoveAll(p.Dir)
	}
}

// BinDir is where initdb, postgres and pgbench were found.
func (p *Postgres) BinDir() string { return p.binDir }

// Pid is the postmaster's process id, which is also the process group of
// every backend (benchmarks sum their CPU).
func (p *Postgres) Pid() int { return p.proc.pid() }
