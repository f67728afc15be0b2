package postgres_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

func TestAddNetwork(t *testing.T) {
	db := testenv.DB(t)
	ctx := context.Background()
	devnet := postgres.NewNetwork{Name: "DEVNET", ChainID: 31337, Native: "DEV", Decimals: 12}

	added, err := db.AddNetwork(ctx, devnet)
	require.NoError(t, err)
	require.True(t, added)
	added, err = db.AddNetwork(ctx, devnet)
	require.NoError(t, err)
	require.False(t, added, "the same network again is no addition and no error")

	registry, err := db.Assets(ctx)
	require.NoError(t, err)
	n, ok := registry.NetworkByChainID(31337)
	require.True(t, ok)
	require.Equal(t, payment.Network{Name: "DEVNET", ChainID: 31337, Native: "DEV"}, n)
	native, ok := registry.Native("DEVNET")
	require.True(t, ok)
	require.Equal(t, payment.Asset{Code: "DEV", Network: "DEVNET", Decimals: 12}, native)
	require.True(t, registry.Known("DEV"), "a new native code is a ledger asset")

	for name, other := range map[string]postgres.NewNetwork{
		"name taken, other chain id":   {Name: "DEVNET", ChainID: 31338, Native: "DEV", Decimals: 12},
		"name taken, other native":     {Name: "DEVNET", ChainID: 31337, Native: "ETH", Decimals: 18},
		"name taken, other decimals":   {Name: "DEVNET", ChainID: 31337, Native: "DEV", Decimals: 18},
		"chain id taken":               {Name: "MAINNET_FORK", ChainID: 1, Native: "ETH", Decimals: 18},
		"seeded network, ETH 6 places": {Name: "BASE_MAINNET", ChainID: 8453, Native: "ETH", Decimals: 6},
	} {
		added, err := db.AddNetwork(ctx, other)
		require.ErrorIs(t, err, payment.ErrConflict, name)
		require.False(t, added, name)
	}
	added, err = db.AddNetwork(ctx, postgres.NewNetwork{Name: "BASE_MAINNET", ChainID: 8453, Native: "ETH", Decimals: 18})
	require.NoError(t, err, "a seeded network as it is")
	require.False(t, added)

	registry, err = db.Assets(ctx)
	require.NoError(t, err)
	_, ok = registry.Network("MAINNET_FORK")
	require.False(t, ok, "a refused network leaves nothing behind")
}

func TestAddAsset(t *testing.T) {
	db := testenv.DB(t)
	ctx := context.Background()
	base := payment.Asset{Code: "NEWT", Network: "BASE_MAINNET", Contract: "0x5fbdb2315678afecb367f032d93f642f64180aa3", Decimals: 6}
	eth := payment.Asset{Code: "NEWT", Network: "ETH_MAINNET", Contract: "0x5fbdb2315678afecb367f032d93f642f64180aa3", Decimals: 18}

	added, err := db.AddAsset(ctx, base)
	require.NoError(t, err)
	require.True(t, added)
	added, err = db.AddAsset(ctx, base)
	require.NoError(t, err)
	require.False(t, added)
	added, err = db.AddAsset(ctx, eth)
	require.NoError(t, err)
	require.True(t, added, "the same code (and address) on another network, with its own decimals")

	for name, other := range map[string]payment.Asset{
		"other decimals":                 {Code: "NEWT", Network: "BASE_MAINNET", Contract: base.Contract, Decimals: 18},
		"other contract":                 {Code: "NEWT", Network: "BASE_MAINNET", Contract: "0x" + "ab" + base.Contract[4:], Decimals: 6},
		"another code at the contract":   {Code: "OTHER", Network: "BASE_MAINNET", Contract: base.Contract, Decimals: 6},
		"USDC's contract, another code":  {Code: "USDX", Network: "BASE_MAINNET", Contract: "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913", Decimals: 6},
		"a second native coin":           {Code: "WEI", Network: "BASE_MAINNET", Decimals: 18},
		"the native coin as a token too": {Code: "ETH", Network: "BASE_MAINNET", Contract: "0x" + "cd" + base.Contract[4:], Decimals: 18},
	} {
		added, err := db.AddAsset(ctx, other)
		require.ErrorIs(t, err, payment.ErrConflict, name)
		require.False(t, added, name)
	}
	added, err = db.AddAsset(ctx, payment.Asset{Code: "NEWT", Network: "NOWHERE", Contract: base.Contract, Decimals: 6})
	require.ErrorIs(t, err, payment.ErrUnknownNetwork)
	require.ErrorIs(t, err, payment.ErrInvalid, "an unknown network is the operator's input")
	require.False(t, added)

	registry, err := db.Assets(ctx)
	require.NoError(t, err)
	for _, want := range []payment.Asset{base, eth} {
		got, ok := registry.ByContract(want.Network, want.Contract)
		require.True(t, ok, want.Network)
		require.Equal(t, want, got)
	}
	precision, ok := registry.Precision("NEWT")
	require.True(t, ok)
	require.Equal(t, 18, precision, "the ledger holds a code at its finest listing")
	for _, code := range []string{"OTHER", "USDX", "WEI"} {
		require.False(t, registry.Known(code), "a refused listing adds no ledger code: %s", code)
	}
}

// Operators running the same addition at once (two settlectl, an api
// request and a settlectl): one adds it, the others find it.
func TestAddAssetConcurrently(t *testing.T) {
	db := testenv.DB(t)
	ctx := context.Background()
	const callers = 8
	listing := payment.Asset{Code: "RACE", Network: "OPT_MAINNET", Contract: "0x1234567890123456789012345678901234567890", Decimals: 8}
	var wg sync.WaitGroup
	results := make(chan bool, callers)
	errs := make(chan error, callers)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			added, err := db.AddAsset(ctx, listing)
			results <- added
			errs <- err
		}()
	}
	wg.Wait()
	close(results)
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	additions := 0
	for added := range results {
		if added {
			additions++
		}
	}
	require.Equal(t, 1, additions)
}

// A kept registry sees an addition within its interval. A reload is
// bounded by the interval, so on a loaded machine one may time out: it
// is logged, and the next one must still see the addition.
func TestKeepRegistrySeesAdditions(t *testing.T) {
	db := testenv.DB(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	registry, err := db.Assets(ctx)
	require.NoError(t, err)
	const every = 200 * time.Millisecond
	done := make(chan struct{})
	go func() {
		defer close(done)
		db.KeepRegistry(ctx, registry, every, func(err error) { t.Logf("reload: %v", err) })
	}()
	defer func() { cancel(); <-done }() // no Logf after the test ends
	listing := payment.Asset{Code: "LATE", Network: "ARB_MAINNET", Contract: "0x0987654321098765432109876543210987654321", Decimals: 6}
	_, ok := registry.ByContract(listing.Network, listing.Contract)
	require.False(t, ok)
	_, err = db.AddAsset(ctx, listing)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, ok := registry.ByContract(listing.Network, listing.Contract)
		return ok
	}, 100*every, every/5, "the addition never reached the kept registry")
}

// TestKeepRegistryOnAFrozenDatabaseGoesOn: a PostgreSQL that stops
// answering mid-reload without a reset (a failover, a partition) fails
// the reload within its interval, and the next ones run, instead of
// holding the reloads until the kernel gives the socket up.
func TestKeepRegistryOnAFrozenDatabaseGoesOn(t *testing.T) {
	freezer, dsn := testenv.NewFreezer(t, testenv.DatabaseURL(t))
	db := testenv.OpenDB(t, dsn)
	ctx, cancel := context.WithCancel(context.Background())
	registry, err := db.Assets(ctx)
	require.NoError(t, err)
	const every = 100 * time.Millisecond
	var mu sync.Mutex
	failures := 0
	freezer.Freeze()
	defer freezer.Thaw() // before the pool's Close, which waits for the reload
	done := make(chan struct{})
	go func() {
		defer close(done)
		db.KeepRegistry(ctx, registry, every, func(error) { mu.Lock(); failures++; mu.Unlock() })
	}()
	defer func() { freezer.Thaw(); cancel(); <-done }()
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return failures >= 2 }, 50*every, every/5,
		"the registry's reload still waits on a frozen PostgreSQL")
}

// TestSeededRegistryIsTheContracts pins the networks and listings a new
// database starts with (CONTRACT.md, Networks): Alchemy's names, their
// chain ids, the native coins, USDC and USDT at their real contracts, and
// round one's Ethereum tokens (CONTRACT.md, Assets).
func TestSeededRegistryIsTheContracts(t *testing.T) {
	db := testenv.DB(t)
	registry, err := db.Assets(context.Background())
	require.NoError(t, err)

	require.Equal(t, []payment.Network{
		{Name: "ARB_MAINNET", ChainID: 42161, Native: "ETH"},
		{Name: "BASE_MAINNET", ChainID: 8453, Native: "ETH"},
		{Name: "BASE_SEPOLIA", ChainID: 84532, Native: "ETH"},
		{Name: "ETH_MAINNET", ChainID: 1, Native: "ETH"},
		{Name: "ETH_SEPOLIA", ChainID: 11155111, Native: "ETH"},
		{Name: "MATIC_MAINNET", ChainID: 137, Native: "POL"},
		{Name: "OPT_MAINNET", ChainID: 10, Native: "ETH"},
	}, registry.Networks())

	native := func(network, code string) payment.Asset {
		return payment.Asset{Code: code, Network: network, Decimals: 18}
	}
	token := func(network, code, contract string) payment.Asset {
		return payment.Asset{Code: code, Network: network, Contract: contract, Decimals: 6}
	}
	require.Equal(t, []payment.Asset{
		native("ARB_MAINNET", "ETH"),
		token("ARB_MAINNET", "USDC", "0xaf88d065e77c8cc2239327c5edb3a432268e5831"),
		token("ARB_MAINNET", "USDT", "0xfd086bc7cd5c481dcc9c85ebe478a1c0b69fcbb9"),
		native("BASE_MAINNET", "ETH"),
		token("BASE_MAINNET", "USDC", "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913"),
		token("BASE_MAINNET", "USDT", "0xfde4c96c8593536e31f229ea8f37b2ada2699bb2"),
		native("BASE_SEPOLIA", "ETH"),
		token("BASE_SEPOLIA", "USDC", "0x036cbd53842c5426634e7929541ec2318f3dcf7e"),
		{Code: "DAI", Network: "ETH_MAINNET", Contract: "0x6b175474e89094c44da98b954eedeac495271d0f", Decimals: 18},
		native("ETH_MAINNET", "ETH"),
		token("ETH_MAINNET", "USDC", "0xa0b86991c6218b36c1d19d4a2e9eb0ce3606eb48"),
		token("ETH_MAINNET", "USDT", "0xdac17f958d2ee523a2206206994597c13d831ec7"),
		{Code: "WBTC", Network: "ETH_MAINNET", Contract: "0x2260fac5e5542a773aa44fbcfedf7c193bc2c599", Decimals: 8},
		{Code: "WETH", Network: "ETH_MAINNET", Contract: "0xc02aaa39b223fe8d0a0e5c4f27ead9083c756cc2", Decimals: 18},
		native("ETH_SEPOLIA", "ETH"),
		token("ETH_SEPOLIA", "USDC", "0x1c7d4b196cb0c7b01d743fbc6116a902379c7238"),
		native("MATIC_MAINNET", "POL"),
		token("MATIC_MAINNET", "USDC", "0x3c499c542cef5e3811e1192ce70d8cc03d5c3359"),
		token("MATIC_MAINNET", "USDT", "0xc2132d05d31c914a87c6611c10748aeb04b58e8f"),
		native("OPT_MAINNET", "ETH"),
		token("OPT_MAINNET", "USDC", "0x0b2c639c533813f4aa9d7837caf62653d097ff85"),
		token("OPT_MAINNET", "USDT", "0x94b008aa00579c1307b0ef2c499ad98a8ce58e58"),
	}, registry.All())
}

// TestReportRPCs: a worker's report lists its RPC networks for the api;
// a report younger than a minute is not written again (replicas starting
// together), an older one is refreshed, and one older than
// RPCReportMaxAge no longer counts.
func TestReportRPCs(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	ctx := context.Background()
	reported, err := db.ReportedRPCs(ctx)
	require.NoError(t, err)
	require.Empty(t, reported)
	require.NoError(t, db.ReportRPCs(ctx, nil))

	require.NoError(t, db.ReportRPCs(ctx, []string{"ETH_MAINNET", "BASE_MAINNET"}))
	reported, err = db.ReportedRPCs(ctx)
	require.NoError(t, err)
	require.Equal(t, map[string]bool{"ETH_MAINNET": true, "BASE_MAINNET": true}, reported)

	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	at := func(network string) time.Time {
		var ts time.Time
		require.NoError(t, conn.QueryRow(ctx, `SELECT reported_at FROM network_rpc_reports WHERE network = $1`, network).Scan(&ts))
		return ts
	}
	first := at("ETH_MAINNET")
	require.NoError(t, db.ReportRPCs(ctx, []string{"ETH_MAINNET"}))
	require.Equal(t, first, at("ETH_MAINNET"), "a report younger than a minute is left alone")

	_, err = conn.Exec(ctx, `UPDATE network_rpc_reports SET reported_at = now() - $1::bigint * interval '1 millisecond'`,
		(postgres.RPCReportMaxAge + time.Minute).Milliseconds())
	require.NoError(t, err)
	reported, err = db.ReportedRPCs(ctx)
	require.NoError(t, err)
	require.Empty(t, reported, "a report older than RPCReportMaxAge does not count")
	require.NoError(t, db.ReportRPCs(ctx, []string{"ETH_MAINNET"}))
	reported, err = db.ReportedRPCs(ctx)
	require.NoError(t, err)
	require.Equal(t, map[string]bool{"ETH_MAINNET": true}, reported)
	require.Error(t, db.ReportRPCs(ctx, []string{"not a network"}))
}
