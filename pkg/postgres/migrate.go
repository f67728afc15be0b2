package postgres

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	settlesql "github.com/settle/settle/sql"
)

// migrationLockID serialises concurrent migrators. The lock is always
// transaction-scoped (released by COMMIT or ROLLBACK, never left on a
// pooled server connection), so it is safe behind PgBouncer's
// transaction pooling, where a session lock could be taken on one server
// connection and its unlock sent to another.
const migrationLockID = 7_301_946_551

// migrationLockPoll is how often a migrator waiting for another asks for
// the lock again.
const migrationLockPoll = 100 * time.Millisecond

// noTransactionDirective marks a migration that must run outside a
// transaction (CREATE INDEX CONCURRENTLY and the like).
const noTransactionDirective = "-- settle:no-transaction"

type migration struct {
	version int
	name    string
	text    string
}

func loadMigrations() ([]migration, error) {
	files, err := fs.Glob(settlesql.Migrations, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var out []migration
	seen := map[int]string{}
	for _, file := range files {
		base := path.Base(file)
		number, _, ok := strings.Cut(base, "_")
		version, err := strconv.Atoi(number)
		if !ok || err != nil || version <= 0 {
			return nil, fmt.Errorf("migration %s: name must be NNNN_description.sql", base)
		}
		if other, dup := seen[version]; dup {
			return nil, fmt.Errorf("migrations %s and %s share version %d", other, base, version)
		}
		seen[version] = base
		text, err := fs.ReadFile(settlesql.Migrations, file)
		if err != nil {
			return nil, err
		}
		out = append(out, migration{version: version, name: base, text: string(text)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}

// LatestSchemaVersion is the newest migration this binary carries.
func LatestSchemaVersion() int {
	migrations, err := loadMigrations()
	if err != nil || len(migrations) == 0 {
		return 0
	}
	return migrations[len(migrations)-1].version
}

// Migrate applies every pending migration, each in its own transaction
// under an advisory lock, and reports the versions it applied. Running it
// again is a no-op. A database newer than the binary is an error: the
// binary would not understand it.
func (db *DB) Migrate(ctx context.Context) ([]string, error) {
	return db.MigrateTo(ctx, LatestSchemaVersion())
}

// MigrateTo applies pending migrations up to version (tests of a
// migration populate the schema before it, then run it).
func (db *DB) MigrateTo(ctx context.Context, version int) ([]string, error) {
	migrations, err := loadMigrations()
	if err != nil {
		return nil, err
	}
	// Under the lock too: two concurrent CREATE TABLE IF NOT EXISTS can
	// both try to create it, and one fails.
	err = func() error {
		tx, err := db.beginLocked(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version integer PRIMARY KEY,
			name text NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}()
	if err != nil {
		return nil, fmt.Errorf("create schema_migrations: %w", err)
	}
	current, err := db.SchemaVersion(ctx)
	if err != nil {
		return nil, err
	}
	if latest := LatestSchemaVersion(); current > latest {
		return nil, fmt.Errorf("database schema version %d is newer than this binary's %d", current, latest)
	}
	var applied []string
	for _, m := range migrations {
		if m.version > version {
			break
		}
		done, err := db.applyMigration(ctx, m)
		if err != nil {
			return applied, fmt.Errorf("migration %s: %w", m.name, err)
		}
		if done {
			applied = append(applied, m.name)
		}
	}
	return applied, nil
}

func (db *DB) applyMigration(ctx context.Context, m migration) (bool, error) {
	if strings.Contains(m.text, noTransactionDirective) {
		return db.applyMigrationOutsideTransaction(ctx, m)
	}
	tx, err := db.beginLocked(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE version = $1)`, m.version).Scan(&exists); err != nil {
		return false, err
	}
	if exists {
		return false, nil
	}
	// Simple protocol: a migration file holds many statements.
	if _, err := tx.Conn().PgConn().Exec(ctx, m.text).ReadAll(); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, m.version, m.name); err != nil {
		return false, err
	}
	return true, tx.Commit(ctx)
}

// applyMigrationOutsideTransaction runs a migration whose statements cannot
// run in a transaction, under the same lock as every other migration: a
// transaction on one connection takes the transaction-scoped lock, checks
// the version again, and stays open while a second connection runs the
// statements; it then records the version and commits, which releases
// the lock. CREATE INDEX CONCURRENTLY waits for every transaction holding
// a snapshot, so the lock's transaction speaks the simple protocol, whose
// portals end with their statement: an extended-protocol portal would
// keep its snapshot until the next statement, and the two connections
// would wait for each other. Such a file must still be re-runnable (IF NOT EXISTS everywhere): a
// crash can leave it half applied, and the next migrator runs it again.
func (db *DB) applyMigrationOutsideTransaction(ctx context.Context, m migration) (bool, error) {
	tx, err := db.beginLocked(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	simple := pgx.QueryExecModeSimpleProtocol
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE version = $1)`, simple, m.version).Scan(&exists); err != nil {
		return false, err
	}
	if exists {
		return false, nil
	}
	if db.pool.Config().MaxConns < 2 {
		return false, errors.New("a migration outside a transaction needs a pool of at least two connections")
	}
	// The lock's transaction idles while the other connection builds the
	// index, for as long as that takes: a database's or role's
	// idle_in_transaction_session_timeout would end it mid-build, freeing
	// the lock for another migrator while the build still runs.
	if _, err := tx.Exec(ctx, `SET LOCAL idle_in_transaction_session_timeout = 0`, simple); err != nil {
		return false, err
	}
	conn, err := db.pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	// A dedicated connection, closed after: the pool keeps no extra idle
	// connection for a one-off job.
	raw := conn.Hijack()
	_, err = execEach(ctx, raw.PgConn(), m.text)
	_ = raw.Close(ctx)
	if err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, simple, m.version, m.name); err != nil {
		return false, err
	}
	return true, tx.Commit(ctx)
}

// migrationLockQuery is one try for the lock (a variable so a test can
// make each try hold its snapshot longer).
var migrationLockQuery = `SELECT pg_try_advisory_xact_lock($1)`

// beginLocked opens a transaction holding the migration lock. A try that
// fails ends its transaction before the next: CREATE INDEX CONCURRENTLY,
// run by the migrator holding the lock, waits for the end of every
// transaction whose snapshot was older than its own when it looked, and a
// try running at that moment is one. Kept open to try again, that
// transaction would wait for the lock while the index waited for it, and
// neither migrator would finish. Waiting inside pg_advisory_xact_lock
// would hold a snapshot the whole time, so the lock is polled. The try
// uses the simple protocol, so no portal keeps its snapshot after it.
func (db *DB) beginLocked(ctx context.Context) (pgx.Tx, error) {
	for {
		tx, err := db.pool.Begin(ctx)
		if err != nil {
			return nil, fmt.Errorf("migration lock: %w", err)
		}
		var locked bool
		err = tx.QueryRow(ctx, migrationLockQuery, pgx.QueryExecModeSimpleProtocol, int64(migrationLockID)).Scan(&locked)
		if err == nil && locked {
			return tx, nil
		}
		_ = tx.Rollback(ctx)
		if err != nil {
			return nil, fmt.Errorf("migration lock: %w", err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for another migrator: %w", ctx.Err())
		case <-time.After(migrationLockPoll):
		}
	}
}

// SchemaVersion is the newest applied migration, 0 on an empty database.
func (db *DB) SchemaVersion(ctx context.Context) (int, error) {
	var version int
	err := db.pool.QueryRow(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&version)
	if err != nil {
		if isUndefinedTable(err) {
			return 0, nil
		}
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	return version, nil
}

// SchemaCurrent reports whether every migration this binary carries is
// applied; /readyz refuses traffic until it is.
func (db *DB) SchemaCurrent(ctx context.Context) (bool, error) {
	version, err := db.SchemaVersion(ctx)
	if err != nil {
		return false, err
	}
	return version >= LatestSchemaVersion(), nil
}
