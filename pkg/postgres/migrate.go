package postgres

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	settlesql "github.com/settle/settle/sql"
)

// migrationLockID serialises concurrent migrators. The lock is
// transaction-scoped, so it is safe behind PgBouncer's transaction pooling.
const migrationLockID = 7_301_946_551

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
	if _, err := db.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version integer PRIMARY KEY,
		name text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
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
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrationLockID)); err != nil {
		return false, err
	}
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
// run in a transaction. Such a file must be written to be re-runnable (IF
// NOT EXISTS everywhere), since a crash can leave it half applied.
func (db *DB) applyMigrationOutsideTransaction(ctx context.Context, m migration) (bool, error) {
	var exists bool
	if err := db.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE version = $1)`, m.version).Scan(&exists); err != nil {
		return false, err
	}
	if exists {
		return false, nil
	}
	conn, err := db.pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Release()
	if _, err := execEach(ctx, conn.Conn().PgConn(), m.text); err != nil {
		return false, err
	}
	tag, err := conn.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2) ON CONFLICT DO NOTHING`, m.version, m.name)
	return err == nil && tag.RowsAffected() == 1, err
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
