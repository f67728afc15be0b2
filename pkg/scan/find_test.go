package scan

import (
	"context"
	"fmt"
	"math/big"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/payment"
)

// countingRPC is a node that answers from a fixed chain and counts what
// it is asked; it stands for the RPC only (the money path is tested on a
// real chain and database in test/scanner_test.go).
type countingRPC struct {
	logs      []chain.TransferLog
	blocks    map[uint64][]chain.BlockTx
	statuses  map[string]uint64
	calls     map[string]int
	recipient int // most recipients one eth_getLogs carried
}

func (r *countingRPC) FinalityHead(context.Context, chain.Policy) (uint64, bool, error) {
	return 0, false, nil
}

func (r *countingRPC) TransferLogs(_ context.Context, from, to uint64, contracts, recipients []string) ([]chain.TransferLog, error) {
	r.calls[chain.MethodLogs]++
	r.recipient = max(r.recipient, len(recipients))
	var out []chain.TransferLog
	for _, l := range r.logs {
		if l.BlockNumber >= from && l.BlockNumber <= to && slices.Contains(contracts, l.Contract) && slices.Contains(recipients, l.To) {
			out = append(out, l)
		}
	}
	return out, nil
}

func (r *countingRPC) Blocks(_ context.Context, numbers []uint64) ([]chain.Block, error) {
	r.calls[chain.MethodBlock] += len(numbers)
	out := make([]chain.Block, len(numbers))
	for i, n := range numbers {
		out[i] = chain.Block{Number: n, Transactions: r.blocks[n]}
	}
	return out, nil
}

func (r *countingRPC) ReceiptStatuses(_ context.Context, hashes []string) (map[string]uint64, error) {
	r.calls[chain.MethodReceipt] += len(hashes)
	out := map[string]uint64{}
	for _, h := range hashes {
		out[h] = r.statuses[h]
	}
	return out, nil
}

func hash(n int) string { return fmt.Sprintf("0x%064x", n) }
func addr(n int) string { return fmt.Sprintf("0x%040x", n) }

// TestFindWith100000Addresses: 500 blocks and 100,000 registered
// addresses cost 100 eth_getLogs, 500 block reads and one receipt per
// native candidate: ≤ 3 calls per block (the target). Every deposit to a
// registered address is found once, with the webhooks' id and amount;
// transfers to others, zero values, reverted transactions and unlisted
// tokens are not.
func TestFindWith100000Addresses(t *testing.T) {
	const network, token, other = "ETH_MAINNET", "0x00000000000000000000000000000000000000aa", "0x00000000000000000000000000000000000000bb"
	registry := payment.NewRegistry([]payment.Asset{
		{Code: "ETH", Network: network, Decimals: 18},
		{Code: "USDC", Network: network, Contract: token, Decimals: 6},
	})
	const addresses = 100_000
	set := addressSet{owner: map[string]int64{}}
	for i := range addresses {
		a := addr(1_000_000 + i)
		set.sorted = append(set.sorted, a)
		set.owner[a] = int64(i + 1)
	}
	rpc := &countingRPC{blocks: map[uint64][]chain.BlockTx{}, statuses: map[string]uint64{}, calls: map[string]int{}}
	rpc.logs = []chain.TransferLog{
		{Transfer: chain.Transfer{Contract: token, To: addr(1_000_000 + 99_999), Value: big.NewInt(1_500_000), LogIndex: 7}, TxHash: hash(1), BlockNumber: 150},
		{Transfer: chain.Transfer{Contract: token, To: addr(5), Value: big.NewInt(1), LogIndex: 0}, TxHash: hash(2), BlockNumber: 151},
		{Transfer: chain.Transfer{Contract: other, To: addr(1_000_000), Value: big.NewInt(1), LogIndex: 0}, TxHash: hash(3), BlockNumber: 152},
		{Transfer: chain.Transfer{Contract: token, To: addr(1_000_000), Value: big.NewInt(0), LogIndex: 1}, TxHash: hash(4), BlockNumber: 152},
	}
	rpc.blocks[200] = []chain.BlockTx{
		{Hash: hash(10), To: addr(1_000_001), Value: big.NewInt(2_000_000_000_000_000_000)},
		{Hash: hash(11), To: addr(1_000_002), Value: big.NewInt(5)}, // reverted
		{Hash: hash(12), To: addr(9), Value: big.NewInt(5)},         // not ours
		{Hash: hash(13), To: addr(1_000_003), Value: big.NewInt(0)}, // a contract call
		{Hash: hash(14), To: "", Value: big.NewInt(5)},              // a creation
	}
	rpc.statuses[hash(10)], rpc.statuses[hash(11)] = 1, 0
	f := finder{network: network, rpc: rpc, registry: registry, addressesPerCall: AddressesPerCallDefault,
		count: func(string, int) {}, skipped: func(string, string) { t.Fatal("nothing is out of range here") }}

	events, err := f.find(context.Background(), span{101, 600}, set)
	require.NoError(t, err)
	var got []string
	for _, e := range events {
		got = append(got, fmt.Sprintf("%s %d %s %s %s", e.Event.ID, e.Event.UserID, e.Event.Asset, e.Event.Amount, e.ToAddress))
		require.Equal(t, network, e.Event.Network)
		require.Equal(t, payment.Deposit, e.Event.Type)
	}
	require.Equal(t, []string{
		"chain:ETH_MAINNET:" + hash(1) + ":7 100000 USDC 1.5 " + addr(1_099_999),
		"chain:ETH_MAINNET:" + hash(10) + ":native 2 ETH 2 " + addr(1_000_001),
	}, got)

	require.Equal(t, 100, rpc.calls[chain.MethodLogs])
	require.Equal(t, 500, rpc.calls[chain.MethodBlock])
	require.Equal(t, 2, rpc.calls[chain.MethodReceipt], "receipts only of native candidates")
	require.LessOrEqual(t, rpc.recipient, chain.ScanTopicsMax)
	perBlock := float64(rpc.calls[chain.MethodLogs]+rpc.calls[chain.MethodBlock]+rpc.calls[chain.MethodReceipt]+1) / 500
	require.LessOrEqual(t, perBlock, 3.0)
	t.Logf("%.3f RPC calls per block with %d addresses", perBlock, addresses)
}
