package postgres_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

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
		a, ok := registry.ByCode(code)
		require.True(t, ok, code)
		require.Equal(t, decimals, a.Decimals, code)
		require.Equal(t, "ETH_MAINNET", a.Network)
	}
	usdc, ok := registry.ByContract("ETH_MAINNET", "0xA0b86991c6218b36c1d19d4a2e9eB0cE3606eB48")
	require.True(t, ok)
	require.Equal(t, "USDC", usdc.Code)
}
