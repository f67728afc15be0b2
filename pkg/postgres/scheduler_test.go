package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/testenv"
)

// TestClaimPeriodOnTheDatabaseClock: a period is claimed once, by its
// start on the database's clock; a changed interval claims its own
// current period at once, and a daily job's period starts at its time of
// day.
func TestClaimPeriodOnTheDatabaseClock(t *testing.T) {
	db := testenv.DB(t)
	ctx := context.Background()
	const every = time.Hour
	start, won, err := db.ClaimPeriod(ctx, "j", every, 0, "a")
	require.NoError(t, err)
	require.True(t, won)
	require.False(t, start.After(time.Now()), "a start is never in the future")
	require.Equal(t, start.Truncate(every), start, "periods start at multiples of the period")
	again, won, err := db.ClaimPeriod(ctx, "j", every, 0, "b")
	require.NoError(t, err)
	require.False(t, won, "the period is taken")
	require.Equal(t, start, again, "the lost claim names the period")

	later, won, err := db.ClaimPeriod(ctx, "j", time.Minute, 0, "b")
	require.NoError(t, err)
	require.Equal(t, later.After(start), won, "a shorter interval's current period is new unless it is the hour's first minute")

	daily, won, err := db.ClaimPeriod(ctx, "d", 24*time.Hour, 3*time.Hour, "a")
	require.NoError(t, err)
	require.True(t, won)
	require.Equal(t, 3*time.Hour, daily.UTC().Sub(daily.UTC().Truncate(24*time.Hour)), "a daily job's period starts at its time of day")
}

func TestClaimPeriodRefusesABadPeriod(t *testing.T) {
	db := testenv.DB(t)
	for _, c := range []struct{ every, at time.Duration }{{0, 0}, {time.Nanosecond, 0}, {time.Hour, -time.Second}, {time.Hour, time.Hour}} {
		_, won, err := db.ClaimPeriod(context.Background(), "j", c.every, c.at, "a")
		require.Error(t, err, "every %s at %s", c.every, c.at)
		require.False(t, won)
	}
}

// TestSchedulerPeriodMigrationKeepsClaims: 0022 turns each job's last
// period number into the database time it was claimed at. A number from
// the future (a replica's fast clock, or a raised interval) no longer
// blocks the job; the period running at the migration is not run again.
func TestSchedulerPeriodMigrationKeepsClaims(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.EmptyDatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	_, err := db.MigrateTo(ctx, 21)
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	const every = time.Hour
	// Claimed this hour, by a replica whose clock ran a year fast.
	_, err = conn.Exec(ctx, `INSERT INTO scheduler_jobs (job, last_period, last_owner) VALUES ('recover_stale', $1, 'fast')`,
		time.Now().Add(365*24*time.Hour).UnixNano()/int64(every))
	require.NoError(t, err)
	_, err = db.MigrateTo(ctx, 22)
	require.NoError(t, err)

	var lastStart time.Time
	require.NoError(t, conn.QueryRow(ctx, `SELECT last_start FROM scheduler_jobs WHERE job = 'recover_stale'`).Scan(&lastStart))
	require.False(t, lastStart.After(time.Now()), "the stored start is never in the future")
	_, won, err := db.ClaimPeriod(ctx, "recover_stale", every, 0, "right")
	require.NoError(t, err)
	require.False(t, won, "the hour claimed before the migration is not run again")
	_, won, err = db.ClaimPeriod(ctx, "recover_stale", time.Millisecond, 0, "right")
	require.NoError(t, err)
	require.True(t, won, "the next period runs: the future number blocks nothing")
}
