package devenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// PgBouncerOptions configure a throwaway PgBouncer in front of one
// PostgreSQL server.
type PgBouncerOptions struct {
	// Dir holds the configuration, the user list and the log; empty means
	// a temp dir that Close removes.
	Dir string
	// Port to listen on; 0 picks a free one.
	Port int
	// PostgresHost and PostgresPort name the server every database name
	// is forwarded to (a wildcard [databases] entry).
	PostgresHost string
	PostgresPort int
	// PoolMode is session, transaction or statement; empty means
	// transaction, the mode settle is meant to run behind.
	PoolMode string
	// DefaultPoolSize bounds server connections per (database, user);
	// 0 means 20.
	DefaultPoolSize int
	// MaxClientConn bounds client connections; 0 means 2000.
	MaxClientConn int
	// Users may connect without a password (auth_type trust); empty means
	// just "postgres".
	Users []string
	// Settings are extra [pgbouncer] settings, written after the defaults.
	Settings map[string]string
}

// PgBouncer is a pgbouncer child process from Debian's package.
type PgBouncer struct {
	Port    int
	Dir     string
	temp    bool
	owner   *serverUser
	options PgBouncerOptions
	proc    process
}

// PgBouncerPath finds the pgbouncer binary: on PATH, else where Debian
// puts it (/usr/sbin is not on every user's PATH).
func PgBouncerPath() (string, error) {
	if path, err := exec.LookPath("pgbouncer"); err == nil {
		return path, nil
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", errors.New("pgbouncer not found (install Debian's pgbouncer package; .ci/run does)")
}

var pgBouncerVersionPattern = regexp.MustCompile(`PgBouncer (\d+)\.(\d+)`)

// PgBouncerVersion is the installed pgbouncer's major and minor version.
func PgBouncerVersion() (major, minor int, err error) {
	path, err := PgBouncerPath()
	if err != nil {
		return 0, 0, err
	}
	out, err := exec.Command(path, "--version").CombinedOutput()
	if err != nil {
		return 0, 0, fmt.Errorf("pgbouncer --version: %w: %s", err, out)
	}
	m := pgBouncerVersionPattern.FindStringSubmatch(string(out))
	if m == nil {
		return 0, 0, fmt.Errorf("pgbouncer --version: no version in %q", out)
	}
	major, _ = strconv.Atoi(m[1])
	minor, _ = strconv.Atoi(m[2])
	return major, minor, nil
}

// StartPgBouncer writes a configuration and starts pgbouncer. It refuses
// to run as root, so root hands it to the postgres account, like the
// PostgreSQL server.
func StartPgBouncer(ctx context.Context, opts PgBouncerOptions) (*PgBouncer, error) {
	if opts.PostgresPort == 0 {
		return nil, errors.New("pgbouncer: the PostgreSQL port is required")
	}
	if opts.PostgresHost == "" {
		opts.PostgresHost = "127.0.0.1"
	}
	if opts.PoolMode == "" {
		opts.PoolMode = "transaction"
	}
	if opts.DefaultPoolSize == 0 {
		opts.DefaultPoolSize = 20
	}
	if opts.MaxClientConn == 0 {
		opts.MaxClientConn = 2000
	}
	if len(opts.Users) == 0 {
		opts.Users = []string{"postgres"}
	}
	owner, err := lookupServerUser()
	if err != nil {
		return nil, err
	}
	b := &PgBouncer{Port: opts.Port, Dir: opts.Dir, owner: owner, options: opts}
	if b.Dir, b.temp, err = workDir(b.Dir, "settle-pgbouncer-"); err != nil {
		return nil, err
	}
	// pgbouncer runs as the server account and writes its log here.
	if err := os.Chmod(b.Dir, 0o755); err != nil {
		return nil, err
	}
	if err := owner.own(b.Dir); err != nil {
		return nil, err
	}
	if b.Port == 0 {
		if b.Port, err = FreePort(); err != nil {
			return nil, err
		}
	}
	if err := b.writeConfig(); err != nil {
		b.cleanup()
		return nil, err
	}
	if err := b.Start(ctx); err != nil {
		b.cleanup()
		return nil, err
	}
	return b, nil
}

func (b *PgBouncer) configPath() string { return filepath.Join(b.Dir, "pgbouncer.ini") }
func (b *PgBouncer) logPath() string    { return filepath.Join(b.Dir, "pgbouncer.log") }

func (b *PgBouncer) writeConfig() error {
	o := b.options
	var users strings.Builder
	for _, u := range o.Users {
		fmt.Fprintf(&users, "%q \"\"\n", u)
	}
	userlist := filepath.Join(b.Dir, "userlist.txt")
	settings := [][2]string{
		{"listen_addr", "127.0.0.1"},
		{"listen_port", strconv.Itoa(b.Port)},
		// No Unix socket: the default directory is not ours to write.
		{"unix_socket_dir", ""},
		{"auth_type", "trust"},
		{"auth_file", userlist},
		{"admin_users", strings.Join(o.Users, ",")},
		{"pool_mode", o.PoolMode},
		{"default_pool_size", strconv.Itoa(o.DefaultPoolSize)},
		{"max_client_conn", strconv.Itoa(o.MaxClientConn)},
		{"logfile", b.logPath()},
		{"pidfile", filepath.Join(b.Dir, "pgbouncer.pid")},
		// Clients that send extra_float_digits at startup (psql, some
		// drivers) would otherwise be refused.
		{"ignore_startup_parameters", "extra_float_digits"},
	}
	extra := make([]string, 0, len(o.Settings))
	for name := range o.Settings {
		extra = append(extra, name)
	}
	sort.Strings(extra)
	for _, name := range extra {
		settings = append(settings, [2]string{name, o.Settings[name]})
	}
	var ini strings.Builder
	fmt.Fprintf(&ini, "[databases]\n* = host=%s port=%d\n\n[pgbouncer]\n", o.PostgresHost, o.PostgresPort)
	for _, kv := range settings {
		fmt.Fprintf(&ini, "%s = %s\n", kv[0], kv[1])
	}
	for path, text := range map[string]string{userlist: users.String(), b.configPath(): ini.String()} {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			return err
		}
		if err := b.owner.own(path); err != nil {
			return err
		}
	}
	return nil
}

// Start runs pgbouncer (again) and waits until it accepts connections.
func (b *PgBouncer) Start(ctx context.Context) error {
	if b.proc.running() {
		return nil
	}
	path, err := PgBouncerPath()
	if err != nil {
		return err
	}
	cmd := exec.Command(path, b.configPath())
	// Its own log file has the details; early failures go to stderr.
	early, err := os.OpenFile(filepath.Join(b.Dir, "pgbouncer.stderr"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer early.Close()
	cmd.Stdout, cmd.Stderr = early, early
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: b.owner.credential}
	if err := b.proc.start(cmd); err != nil {
		return fmt.Errorf("start pgbouncer: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	if err := waitTCP(ctx, b.Addr(), b.proc.done); err != nil {
		b.proc.stop(syscall.SIGKILL, time.Second)
		return fmt.Errorf("%w\n%s\n%s", err, tail(filepath.Join(b.Dir, "pgbouncer.stderr"), 20), tail(b.logPath(), 20))
	}
	return nil
}

// Addr is host:port.
func (b *PgBouncer) Addr() string { return fmt.Sprintf("127.0.0.1:%d", b.Port) }

// URL is a DSN for database db as user through pgbouncer; query is
// appended as is (pgx settings such as default_query_exec_mode).
func (b *PgBouncer) URL(user, db, query string) string {
	u := fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", user, b.Addr(), db)
	if query != "" {
		u += "&" + query
	}
	return u
}

// Log is what pgbouncer logged so far.
func (b *PgBouncer) Log() string {
	data, _ := os.ReadFile(b.logPath())
	return string(data)
}

// Stop shuts pgbouncer down (SIGTERM: immediate shutdown; SIGINT would
// wait for every client to go away) and waits for it.
func (b *PgBouncer) Stop() { b.proc.stop(syscall.SIGTERM, 10*time.Second) }

// Close stops pgbouncer and removes a temp dir.
func (b *PgBouncer) Close() {
	b.Stop()
	b.cleanup()
}

func (b *PgBouncer) cleanup() {
	if b.temp {
		_ = os.RemoveAll(b.Dir)
	}
}
