package bench

import (
	"context"
	"crypto/ecdsa"
	"flag"
	"fmt"
	"math/big"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/rpc"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/chain/devchain"
	"github.com/settle/settle/pkg/loadgen"
	"github.com/settle/settle/pkg/scan"
	"github.com/settle/settle/pkg/testenv"
)

var (
	flagScanBlocks   = flag.Int("scan.blocks", 2000, "blocks of the simulated chain the scanner benchmark scans")
	flagScanTokenTxs = flag.Int("scan.token-txs", 10, "ERC-20 transfers per block (to random addresses, some registered)")
	flagScanNative   = flag.Int("scan.native-txs", 3, "native ETH transfers per block")
	flagScanDeposits = flag.Int("scan.deposit-every", 20, "one transfer in this many goes to a registered address")
	flagScanPass     = flag.Uint64("scan.blocks-max", scan.BlocksMaxDefault, "SCAN_BLOCKS_MAX of the benchmark's scanner")
	flagScanWindow   = flag.Int("scan.log-window", scan.LogWindowDefault, "SCAN_LOG_WINDOW of the benchmark's scanner (0: off, tokens always asked by recipient)")
	flagScanInFlight = flag.Int("scan.batches-in-flight", scan.BatchesInFlightDefault, "SCAN_BATCHES_IN_FLIGHT of the benchmark's scanner")
)

const (
	scanNetwork = "ETH_MAINNET"
	// scanSenders: dev accounts sending the traffic, one transaction each
	// per block at most (the pool keeps a few per account pending).
	scanSenders = 20
	// scanTokens: listed token contracts, as a mainnet deployment lists a
	// few stablecoins.
	scanTokens = 3
	// scanGasToken covers the dev token's transfer (about 25k gas).
	scanGasToken  = 60_000
	scanGasNative = 21_000
	// scanRegisteredMax is the largest address set; deposits go to the
	// first scanRegisteredMin so every sub-benchmark finds the same ones.
	scanRegisteredMax = 100_000
	scanRegisteredMin = 10_000
)

// scanChain is the simulated chain the sub-benchmarks share.
type scanChain struct {
	chain     *devchain.Chain
	tokens    []string
	addresses []string // registered candidates, the first scanRegisteredMin receive deposits
	head      uint64
	deposits  int // transfers to the first scanRegisteredMin addresses
}

// BenchmarkScan times the chain scanner's cursor passes over a simulated
// chain carrying token traffic (go-ethereum's simulated node over HTTP
// JSON-RPC, real PostgreSQL) with 10,000 and 100,000 registered addresses.
// Run it with -benchtime 1x: each iteration rescans the whole chain.
func BenchmarkScan(b *testing.B) {
	ctx := context.Background()
	start := time.Now()
	sc := buildScanChain(b, ctx)
	b.Logf("chain: %d blocks, %d token + %d native transfers per block over %d tokens, %d deposits to registered addresses; built in %s; load average %s",
		sc.head, *flagScanTokenTxs, *flagScanNative, scanTokens, sc.deposits, time.Since(start).Round(time.Second), loadAverage())
	// 100,000 first: compare.sh's summary shows the first benchmark line,
	// and issue 19's target is at 100,000.
	for _, n := range []int{scanRegisteredMax, scanRegisteredMin} {
		b.Run(fmt.Sprintf("addresses=%d", n), func(b *testing.B) { benchScan(b, ctx, sc, n) })
	}
}

func benchScan(b *testing.B, ctx context.Context, sc *scanChain, registered int) {
	dsn := testenv.DatabaseURL(b)
	db := testenv.OpenDB(b, dsn)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	for i, token := range sc.tokens {
		if _, err := conn.Exec(ctx, `INSERT INTO assets (code, network, contract_address, decimals) VALUES ($1, $2, $3, 6)`,
			fmt.Sprintf("TOK%d", i), scanNetwork, token); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := conn.Exec(ctx, `INSERT INTO users (id) SELECT generate_series(1, $1::bigint)`, registered); err != nil {
		b.Fatal(err)
	}
	rows := make([][]any, registered)
	for i := range registered {
		rows[i] = []any{scanNetwork, sc.addresses[i], int64(i + 1)}
	}
	if _, err := conn.CopyFrom(ctx, pgx.Identifier{"deposit_addresses"}, []string{"network", "address", "user_id"}, pgx.CopyFromRows(rows)); err != nil {
		b.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `ANALYZE deposit_addresses`); err != nil {
		b.Fatal(err)
	}

	var requests atomic.Int64
	httpClient := &http.Client{Transport: countingTransport{next: http.DefaultTransport, n: &requests}}
	client, err := chain.Dial(ctx, sc.chain.URL(), chain.ClientOptions{HTTPClient: httpClient, Registerer: prometheus.NewRegistry(), Logger: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	network := scan.Network{Name: scanNetwork, RPC: client, Policy: chain.FinalizedPolicy()}
	scanner := scan.New(scan.Options{
		Store: db, Owner: "bench", BlocksMax: *flagScanPass, Registerer: reg, Log: zerolog.Nop(), Networks: []scan.Network{network},
		LogWindow: uint64(max(*flagScanWindow, 0)), FilteredLogs: *flagScanWindow <= 0, BatchesInFlight: *flagScanInFlight,
	})

	pgPid := 0 // unknown under TEST_DATABASE_URL
	if pg := testenv.Postgres(b); pg != nil {
		pgPid = pg.Pid()
	}
	var blocks, found int
	var calls, httpCalls, selfCPU, pgCPU, busy float64
	var elapsed time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		// Every iteration stores what it finds: the same work each time.
		for _, stmt := range []string{`DELETE FROM payment_events`, `DELETE FROM chain_cursors`} {
			if _, err := conn.Exec(ctx, stmt); err != nil {
				b.Fatal(err)
			}
		}
		if err := db.InitScanCursor(ctx, scanNetwork, 1); err != nil {
			b.Fatal(err)
		}
		callsBefore, requestsBefore := scanCalls(b, reg), requests.Load()
		selfBefore, busyBefore, pgBefore := loadgen.SelfCPUSeconds(), loadgen.MachineBusySeconds(), treeCPU(pgPid)
		began := time.Now()
		b.StartTimer()
		for more := true; more; {
			if more, err = scanner.CursorPass(ctx, network); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		elapsed += time.Since(began)
		selfCPU += loadgen.SelfCPUSeconds() - selfBefore
		busy += loadgen.MachineBusySeconds() - busyBefore
		pgCPU += treeCPU(pgPid) - pgBefore
		calls += scanCalls(b, reg) - callsBefore
		httpCalls += float64(requests.Load() - requestsBefore)
		blocks += int(sc.head)
		var stored int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM payment_events WHERE source = 'scanner'`).Scan(&stored); err != nil {
			b.Fatal(err)
		}
		found += stored
	}
	if found != sc.deposits*b.N {
		b.Fatalf("the scanner stored %d deposits, the chain carries %d to registered addresses", found/b.N, sc.deposits)
	}
	perBlock := func(v float64) float64 { return v / float64(blocks) }
	b.ReportMetric(float64(blocks)/elapsed.Seconds(), "blocks/s")
	b.ReportMetric(perBlock(calls), "rpc_calls/block")
	b.ReportMetric(perBlock(httpCalls), "http_requests/block")
	b.ReportMetric(perBlock(selfCPU*1000), "bench-cpu-ms/block")
	if pgPid != 0 {
		b.ReportMetric(perBlock(pgCPU*1000), "pg-cpu-ms/block")
	}
	b.ReportMetric(perBlock(busy*1000), "machine-cpu-ms/block")
	b.ReportMetric(float64(found/b.N), "deposits")
	b.ReportMetric(0, "ns/op")
	b.Logf("addresses=%d, SCAN_LOG_WINDOW=%d (0: off), SCAN_BATCHES_IN_FLIGHT=%d: %d blocks in %s; the benchmark process holds the simulated node too (its CPU is node + scanner); load average %s",
		registered, *flagScanWindow, *flagScanInFlight, blocks, elapsed.Round(time.Millisecond), loadAverage())
}

// buildScanChain mines the chain: per block, token transfers from
// several senders over several listed tokens, mostly to addresses nobody
// registered, and native transfers; then finalizes it all.
func buildScanChain(b *testing.B, ctx context.Context) *scanChain {
	ch, err := devchain.Serve(ctx, devchain.Options{Manual: true, Accounts: scanSenders})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ch.Close() })
	sc := &scanChain{chain: ch}
	for range scanTokens {
		token, _, err := ch.DeployToken(ctx, 0)
		if err != nil {
			b.Fatal(err)
		}
		sc.tokens = append(sc.tokens, token)
	}
	rng := rand.New(rand.NewPCG(19, 15))
	randomAddress := func() string {
		var a [20]byte
		for i := range a {
			a[i] = byte(rng.UintN(256))
		}
		return strings.ToLower(common.BytesToAddress(a[:]).Hex())
	}
	seen := map[string]bool{}
	for len(sc.addresses) < scanRegisteredMax {
		if a := randomAddress(); !seen[a] {
			seen[a] = true
			sc.addresses = append(sc.addresses, a)
		}
	}

	rpcClient, err := rpc.DialContext(ctx, ch.URL())
	if err != nil {
		b.Fatal(err)
	}
	defer rpcClient.Close()
	keys := make([]*ecdsa.PrivateKey, scanSenders)
	nonces := make([]uint64, scanSenders)
	for i, acct := range ch.Accounts() {
		if keys[i], err = crypto.HexToECDSA(acct.PrivateKey); err != nil {
			b.Fatal(err)
		}
		var n hexutil.Uint64
		if err := rpcClient.CallContext(ctx, &n, "eth_getTransactionCount", acct.Address, "pending"); err != nil {
			b.Fatal(err)
		}
		nonces[i] = uint64(n)
	}
	signer := types.LatestSignerForChainID(big.NewInt(devchain.ChainID))
	tip, feeCap := big.NewInt(1e9), big.NewInt(100e9)
	recipient := func() string {
		if rng.IntN(*flagScanDeposits) == 0 {
			sc.deposits++
			return sc.addresses[rng.IntN(scanRegisteredMin)]
		}
		return randomAddress()
	}
	perBlock := *flagScanTokenTxs + *flagScanNative
	if perBlock > scanSenders {
		b.Fatalf("at most %d transactions per block (one per sender)", scanSenders)
	}
	for range *flagScanBlocks {
		elems := make([]rpc.BatchElem, 0, perBlock)
		for k := range perBlock {
			to := common.HexToAddress(recipient())
			tx := &types.DynamicFeeTx{ChainID: big.NewInt(devchain.ChainID), Nonce: nonces[k], GasTipCap: tip, GasFeeCap: feeCap}
			if k < *flagScanTokenTxs {
				token := common.HexToAddress(sc.tokens[rng.IntN(scanTokens)])
				tx.To, tx.Gas, tx.Data = &token, scanGasToken, tokenTransferCalldata(to, big.NewInt(int64(1+rng.IntN(1_000_000_000))))
			} else {
				tx.To, tx.Gas, tx.Value = &to, scanGasNative, big.NewInt(int64(1+rng.IntN(1_000_000_000)))
			}
			signed, err := types.SignNewTx(keys[k], signer, tx)
			if err != nil {
				b.Fatal(err)
			}
			raw, err := signed.MarshalBinary()
			if err != nil {
				b.Fatal(err)
			}
			nonces[k]++
			elems = append(elems, rpc.BatchElem{Method: "eth_sendRawTransaction", Args: []any{hexutil.Bytes(raw)}, Result: new(common.Hash)})
		}
		if err := rpcClient.BatchCallContext(ctx, elems); err != nil {
			b.Fatal(err)
		}
		for _, e := range elems {
			if e.Error != nil {
				b.Fatal(e.Error)
			}
		}
		if err := ch.CommitBlocks(ctx, 1); err != nil {
			b.Fatal(err)
		}
	}
	if sc.head, err = ch.Head(ctx); err != nil {
		b.Fatal(err)
	}
	// Every transaction must have been mined into the block it was sent
	// for: a dropped one would be a deposit nobody can find.
	var count hexutil.Uint
	if err := rpcClient.CallContext(ctx, &count, "eth_getBlockTransactionCountByNumber", hexutil.EncodeUint64(sc.head)); err != nil {
		b.Fatal(err)
	}
	if int(count) != perBlock {
		b.Fatalf("the last block holds %d transactions, want %d", count, perBlock)
	}
	if err := ch.FinalizeThrough(ctx, sc.head); err != nil {
		b.Fatal(err)
	}
	// FinalizeThrough sealed empty blocks up to the epoch boundary; the
	// scan covers them too.
	if sc.head, err = ch.Finalized(ctx); err != nil {
		b.Fatal(err)
	}
	return sc
}

// tokenTransferCalldata is transfer(to, value) of the dev token.
func tokenTransferCalldata(to common.Address, value *big.Int) []byte {
	data := []byte{0xa9, 0x05, 0x9c, 0xbb}
	data = append(data, common.LeftPadBytes(to.Bytes(), 32)...)
	return append(data, common.LeftPadBytes(value.Bytes(), 32)...)
}

// scanCalls sums settle_scan_rpc_calls_total: every JSON-RPC call the
// scanner made, each call of a batch counted (what a provider bills).
func scanCalls(b *testing.B, reg *prometheus.Registry) float64 {
	families, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	total := 0.0
	for _, f := range families {
		if f.GetName() == "settle_scan_rpc_calls_total" {
			for _, m := range f.GetMetric() {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}

func treeCPU(pid int) float64 {
	if pid == 0 {
		return 0
	}
	v, _ := loadgen.TreeCPUSeconds(pid)
	return v
}

func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// countingTransport counts HTTP requests (a batch is one).
type countingTransport struct {
	next http.RoundTripper
	n    *atomic.Int64
}

func (t countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	t.n.Add(1)
	return t.next.RoundTrip(r)
}
