package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// TestDepositAddressOneOwnerOnEveryNetwork: an EVM address is one key on
// every network, so once a user holds it on one network no other user
// can take it on another; its own user can register it anywhere.
func TestDepositAddressOneOwnerOnEveryNetwork(t *testing.T) {
	db := testenv.DB(t)
	ctx := context.Background()
	for _, id := range []int64{1, 2} {
		_, err := db.CreateUser(ctx, id)
		require.NoError(t, err)
	}
	addr := "0x" + strings.Repeat("5a", 20)
	added, err := db.AddDepositAddress(ctx, "ETH_MAINNET", addr, 1)
	require.NoError(t, err)
	require.True(t, added)
	added, err = db.AddDepositAddress(ctx, "BASE_MAINNET", addr, 1)
	require.NoError(t, err)
	require.True(t, added, "the same user on another network")
	added, err = db.AddDepositAddress(ctx, "BASE_MAINNET", addr, 1)
	require.NoError(t, err)
	require.False(t, added, "registered already")

	_, err = db.AddDepositAddress(ctx, "ARB_MAINNET", addr, 2)
	require.ErrorIs(t, err, payment.ErrConflict, "another user's address on another network")
	require.ErrorContains(t, err, "registered to another user on")
	_, err = db.AddDepositAddress(ctx, "ETH_MAINNET", addr, 2)
	require.ErrorIs(t, err, payment.ErrConflict)
	owners, err := db.DepositAddressOwners(ctx, "ARB_MAINNET", []string{addr})
	require.NoError(t, err)
	require.Empty(t, owners)
}

// Two users racing for one fresh address on two networks, each from its
// own connection: exactly one gets it, on every network.
func TestDepositAddressRaceAcrossNetworks(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	setup := testenv.OpenDB(t, dsn)
	ctx := context.Background()
	for _, id := range []int64{1, 2} {
		_, err := setup.CreateUser(ctx, id)
		require.NoError(t, err)
	}
	dbs := []*postgres.DB{testenv.OpenDB(t, dsn), testenv.OpenDB(t, dsn)}
	networks := []string{"ETH_MAINNET", "BASE_MAINNET"}
	for round := range 20 {
		addr := fmt.Sprintf("0x%040x", round+1)
		var wg sync.WaitGroup
		errs := make([]error, 2)
		start := make(chan struct{})
		for i := range 2 {
			wg.Go(func() {
				<-start
				_, errs[i] = dbs[i].AddDepositAddress(ctx, networks[i], addr, int64(i+1))
			})
		}
		close(start)
		wg.Wait()
		won := 0
		for _, err := range errs {
			if err == nil {
				won++
			} else {
				require.True(t, errors.Is(err, payment.ErrConflict), "%v", err)
			}
		}
		require.Equal(t, 1, won, "round %d: %v", round, errs)
		owners := map[int64]bool{}
		for _, network := range networks {
			found, err := setup.DepositAddressOwners(ctx, network, []string{addr})
			require.NoError(t, err)
			for _, user := range found {
				owners[user] = true
			}
		}
		require.Len(t, owners, 1, "round %d: one owner on every network", round)
	}
}
