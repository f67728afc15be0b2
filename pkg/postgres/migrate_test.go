package postgres_test

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// TestSessionsUseCustomPlans: the migrations make custom plans the
// database's default, so a statement planned while a table was small does
// not keep scanning it as it grows.
func TestSessionsUseCustomPlans(t *testing.T) {
	conn, err := pgx.Connect(context.Background(), testenv.DatabaseURL(t))
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var mode string
	require.NoError(t, conn.QueryRow(context.Background(), "SHOW plan_cache_mode").Scan(&mode))
	require.Equal(t, "force_custom_plan", mode)
}

func TestMigrateIsIdempotent(t *testing.T) {
	db := testenv.DB(t) // already migrated from the template
	ctx := context.Background()
	applied, err := db.Migrate(ctx)
	require.NoError(t, err)
	require.Empty(t, applied, "a second run applies nothing")
	current, err := db.SchemaCurrent(ctx)
	require.NoError(t, err)
	require.True(t, current)
	version, err := db.SchemaVersion(ctx)
	require.NoError(t, err)
	require.Equal(t, postgres.LatestSchemaVersion(), version)

	registry, err := db.Assets(ctx)
	require.NoError(t, err)
	for code, decimals := range map[string]int{"ETH": 18, "USDC": 6, "USDT": 6, "WBTC": 8, "DAI": 18, "WETH": 18} {
		a, ok := registry.Listing("ETH_MAINNET", code)
		require.True(t, ok, code)
		require.Equal(t, decimals, a.Decimals, code)
		require.Equal(t, "ETH_MAINNET", a.Network)
	}
	usdc, ok := registry.ByContract("ETH_MAINNET", "0xA0b86991c6218b36c1d19d4a2e9eB0cE3606eB48")
	require.True(t, ok)
	require.Equal(t, "USDC", usdc.Code)
}

// TestNonTransactionalMigrationWaitsForTheLock: 0003 runs outside a
// transaction, yet under the migration lock like every other migration:
// while another migrator holds it, 0003 does not start.
func TestNonTransactionalMigrationWaitsForTheLock(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.EmptyDatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	_, err := db.MigrateTo(ctx, 2)
	require.NoError(t, err)
	other, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer other.Close(ctx)
	tx, err := other.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock(7301946551)`)
	require.NoError(t, err)

	done := make(chan []string, 1)
	go func() {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		applied, err := db.MigrateTo(ctx, 3)
		if err != nil {
			t.Error(err)
		}
		done <- applied
	}()
	indexExists := func() bool {
		var ok bool
		require.NoError(t, other.QueryRow(ctx, `SELECT to_regclass('processed_events_key_created') IS NOT NULL`).Scan(&ok))
		return ok
	}
	select {
	case <-done:
		t.Fatal("0003 ran while another migrator held the lock")
	case <-time.After(500 * time.Millisecond):
	}
	require.False(t, indexExists())
	require.NoError(t, tx.Commit(ctx))
	select {
	case applied := <-done:
		require.Equal(t, []string{"0003_processed_events_partition_prepare.sql"}, applied)
	case <-time.After(30 * time.Second):
		t.Fatal("0003 did not run once the lock was free")
	}
	require.True(t, indexExists())
}

// TestWaitingMigratorLetsTheIndexFinish: a migrator waiting for the lock
// must not be a transaction the holder's CREATE INDEX CONCURRENTLY waits
// for. Here each try holds its snapshot for 300 ms, so one is running when
// the index looks for older snapshots; a waiter that kept its transaction
// open between tries deadlocked the two (seen once in CI, through
// PgBouncer, on 0010).
func TestWaitingMigratorLetsTheIndexFinish(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.EmptyDatabaseURL(t)
	first := testenv.OpenDB(t, dsn)
	_, err := first.MigrateTo(ctx, 9)
	require.NoError(t, err)
	second := testenv.OpenDB(t, dsn)
	defer postgres.SetMigrationLockQuery(`SELECT pg_try_advisory_xact_lock($1) FROM pg_sleep(0.3)`)()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	results := make(chan []string, 2)
	for _, db := range []*postgres.DB{first, second} {
		go func() {
			applied, err := db.MigrateTo(ctx, 10)
			if err != nil {
				t.Error(err)
			}
			results <- applied
		}()
	}
	applied := append(<-results, <-results...)
	require.Equal(t, []string{"0010_paging_indexes.sql"}, applied, "0010 applied once, by one of them")
}

// TestConcurrentMigratorsThroughPgBouncer: two migrators race from an
// empty database through PgBouncer in transaction pooling; every
// migration is applied exactly once, and no pooled server connection is
// left holding the advisory lock.
func TestConcurrentMigratorsThroughPgBouncer(t *testing.T) {
	pg := testenv.Postgres(t)
	if pg == nil {
		t.Skip("needs the harness's own PostgreSQL (TEST_DATABASE_URL is set)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bouncer, err := devenv.StartPgBouncer(ctx, devenv.PgBouncerOptions{PostgresPort: pg.Port, DefaultPoolSize: 4})
	require.NoError(t, err)
	defer bouncer.Close()
	direct := testenv.EmptyDatabaseURL(t)
	u, err := url.Parse(direct)
	require.NoError(t, err)
	u.Host = fmt.Sprintf("127.0.0.1:%d", bouncer.Port)
	q := u.Query()
	q.Set("default_query_exec_mode", "cache_describe")
	u.RawQuery = q.Encode()

	const migrators = 2
	results := make(chan []string, migrators)
	for range migrators {
		go func() {
			db, err := postgres.Open(ctx, u.String(), postgres.Options{ConnsMax: 2})
			if err != nil {
				t.Error(err)
				results <- nil
				return
			}
			defer db.Close()
			applied, err := db.Migrate(ctx)
			if err != nil {
				t.Error(err)
			}
			results <- applied
		}()
	}
	seen := map[string]int{}
	for range migrators {
		for _, name := range <-results {
			seen[name]++
		}
	}
	var files int
	require.NoError(t, func() error {
		conn, err := pgx.Connect(ctx, direct)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		return conn.QueryRow(ctx, `SELECT count(*) FROM schema_migrations`).Scan(&files)
	}())
	require.Len(t, seen, files, "every migration applied")
	for name, n := range seen {
		require.Equal(t, 1, n, "%s applied once", name)
	}
	conn, err := pgx.Connect(ctx, direct)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var locks int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'`).Scan(&locks))
	require.Zero(t, locks, "no server connection keeps the migration lock")
}

// TestChainTransfersBackfillOnACreditedDatabase: 0007 backfills the
// claims of deposits credited before it into a table whose primary key is
// deferrable, which ON CONFLICT cannot arbitrate on. A round-one database
// with credited deposits must migrate, each transfer claimed once, by its
// earliest credit.
func TestChainTransfersBackfillOnACreditedDatabase(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.EmptyDatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	_, err := db.MigrateTo(ctx, 6)
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)

	_, err = conn.Exec(ctx, `INSERT INTO users (id) VALUES (1)`)
	require.NoError(t, err)
	tx := "0x" + "ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12"
	credit := func(id, asset string, at time.Time) {
		t.Helper()
		_, err := conn.Exec(ctx, `INSERT INTO payment_events (event_id, event_type, user_id, asset, amount, tx_hash, content_hash)
			VALUES ($1::text, 'deposit', 1, $2, 1, $3, sha256(convert_to($1::text, 'UTF8')))`, id, asset, tx)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, `UPDATE payment_events SET status = 'enqueued' WHERE event_id = $1`, id)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, `UPDATE payment_events SET status = 'confirmed', outcome = 'success' WHERE event_id = $1`, id)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, `UPDATE payment_events SET updated_at = $2 WHERE event_id = $1`, id, at)
		require.NoError(t, err)
	}
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	// One native transfer credited twice in round one (the later credit
	// is left for invariant 5 to report), and a token deposit that never
	// named its log.
	credit("late", "ETH", t0.Add(time.Minute))
	credit("early", "ETH", t0)
	credit("usdc", "USDC", t0)

	applied, err := db.MigrateTo(ctx, 7)
	require.NoError(t, err, "0007 on a database with credited deposits")
	require.Equal(t, []string{"0007_chain_transfers.sql"}, applied)
	claims := map[string]string{}
	rows, err := conn.Query(ctx, `SELECT transfer_index, event_id FROM chain_transfers WHERE tx_hash = $1`, tx)
	require.NoError(t, err)
	for rows.Next() {
		var index, id string
		require.NoError(t, rows.Scan(&index, &id))
		claims[index] = id
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[string]string{"native": "early", "unresolved:usdc": "usdc"}, claims)

	_, err = db.Migrate(ctx)
	require.NoError(t, err, "the migrations after 0007 on the same database")
}

// TestNetworksMigrationKeepsHandAddedAssets: round one listed assets with
// one INSERT INTO assets, so an operator may have added Polygon's coin
// under another code, or POL as the ERC-20 it is on Ethereum. 0012 must
// migrate both databases, and Polygon must end with one native coin.
func TestNetworksMigrationKeepsHandAddedAssets(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name, insert, native string
	}{
		{"polygon's coin listed as MATIC", `INSERT INTO assets (code, network, contract_address, decimals) VALUES ('MATIC', 'MATIC_MAINNET', NULL, 18)`, "MATIC"},
		{"POL listed as an Ethereum token", `INSERT INTO assets (code, network, contract_address, decimals) VALUES ('POL', 'ETH_MAINNET', '0x455e53cbb86018ac2b8092fdcd39d8444affc3f6', 18)`, "POL"},
		{"nothing added", ``, "POL"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dsn := testenv.EmptyDatabaseURL(t)
			db := testenv.OpenDB(t, dsn)
			_, err := db.MigrateTo(ctx, 11)
			require.NoError(t, err)
			conn, err := pgx.Connect(ctx, dsn)
			require.NoError(t, err)
			defer conn.Close(ctx)
			if c.insert != "" {
				_, err = conn.Exec(ctx, c.insert)
				require.NoError(t, err)
			}
			_, err = db.MigrateTo(ctx, 12)
			require.NoError(t, err, "0012 on a database with a hand-added asset")

			var native string
			require.NoError(t, conn.QueryRow(ctx, `SELECT native_asset FROM networks WHERE name = 'MATIC_MAINNET'`).Scan(&native))
			require.Equal(t, c.native, native, "the network's native coin")
			var listed string
			require.NoError(t, conn.QueryRow(ctx, `SELECT asset FROM network_assets WHERE network = 'MATIC_MAINNET' AND contract_address IS NULL`).Scan(&listed),
				"Polygon's native coin is listed on it")
			require.Equal(t, c.native, listed)

			_, err = db.Migrate(ctx)
			require.NoError(t, err, "the migrations after 0012")
		})
	}
}

// TestMigrationLockOutlastsAnIdleBound: a database (or role) whose
// default idle_in_transaction_session_timeout is shorter than an index
// build must not end the lock's transaction of a migration outside a
// transaction mid-build: the lock would go to another migrator while the
// build runs, and the version would not be recorded. Here 0003's index
// waits 1.5 s for an older snapshot, five times the database's bound.
func TestMigrationLockOutlastsAnIdleBound(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.EmptyDatabaseURL(t)
	admin, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, `DO $$ BEGIN
		EXECUTE format('ALTER DATABASE %I SET idle_in_transaction_session_timeout = %L', current_database(), '300ms');
	END $$`)
	require.NoError(t, err)
	db := testenv.OpenDB(t, dsn) // its sessions take the database's bound
	_, err = db.MigrateTo(ctx, 2)
	require.NoError(t, err)

	old, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer old.Close(ctx)
	snapshot, err := old.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	_, err = snapshot.Exec(ctx, `SET LOCAL idle_in_transaction_session_timeout = 0`)
	require.NoError(t, err)
	_, err = snapshot.Exec(ctx, `SELECT 1`)
	require.NoError(t, err)
	released := make(chan error, 1)
	go func() {
		time.Sleep(1500 * time.Millisecond)
		released <- snapshot.Commit(ctx)
	}()
	defer func() { require.NoError(t, <-released) }()

	migrateCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	applied, err := db.MigrateTo(migrateCtx, 3)
	require.NoError(t, err)
	require.Equal(t, []string{"0003_processed_events_partition_prepare.sql"}, applied)
}
