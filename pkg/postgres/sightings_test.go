package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// TestSightingsKeptAndDeleted: a sighting's block must be a block hash;
// a removal sticks, whatever is reported of the block after it; sightings
// older than the retention go with the transfer reports, newer ones stay.
func TestSightingsKeptAndDeleted(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(ctx) })

	tr := payment.Transfer{Network: "ETH_MAINNET", TxHash: fmt.Sprintf("0x%064x", 1), Index: "3"}
	sight := func(block string, removed bool) error {
		_, err := db.SightTransfer(ctx, postgres.Sighting{Transfer: tr, BlockHash: block, Removed: removed, Reporter: "alchemy", Reason: "test"})
		return err
	}
	require.Error(t, sight("0xABC", false), "not a block hash")
	old, kept := fmt.Sprintf("0x%064x", 0xb1), fmt.Sprintf("0x%064x", 0xb2)
	require.NoError(t, sight(old, true))
	require.NoError(t, sight(old, false))
	require.NoError(t, sight(kept, false))
	s, err := db.EventSightings(ctx, tr.EventID())
	require.NoError(t, err)
	require.Len(t, s, 2)
	require.Equal(t, old, s[0].BlockHash)
	require.True(t, s[0].Removed, "a removal sticks")
	require.NotNil(t, s[0].RemovedAt)
	require.False(t, s[1].Removed)

	_, err = conn.Exec(ctx, `UPDATE transfer_sightings SET first_at = now() - interval '10 days' WHERE block_hash = $1`, old)
	require.NoError(t, err)
	n, err := db.DeleteOldReports(ctx, 7*24*time.Hour, 1)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	s, err = db.EventSightings(ctx, tr.EventID())
	require.NoError(t, err)
	require.Len(t, s, 1)
	require.Equal(t, kept, s[0].BlockHash)
}
