//go:build !fuzzing

package chain

import (
	"fmt"
	"math/big"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/chain/devchain"
)

// TestContractTransferLogs: every Transfer of the contracts, whoever
// received it, from a real dev chain; an answer over the caller's cap and
// each provider's refusal of a too-wide range are ErrLogsLimit, the same
// question over fewer blocks is answered, and refusals never open the
// breaker (they are answers, not outages).
func TestContractTransferLogs(t *testing.T) {
	ctx := testContext(t)
	ch := startChain(t)
	token, _, err := ch.DeployToken(ctx, 0)
	require.NoError(t, err)
	var first, last uint64
	const transfers = 4
	for i := range transfers {
		tx, err := ch.TransferToken(ctx, 0, token, fmt.Sprintf("0x%040x", 0x1000+i), big.NewInt(int64(i+1)))
		require.NoError(t, err)
		if i == 0 {
			first = tx.BlockNumber
		}
		last = tx.BlockNumber
	}
	require.Greater(t, last, first, "the transfers span several blocks")

	client, err := Dial(ctx, ch.URL(), ClientOptions{})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	logs, err := client.ContractTransferLogs(ctx, first, last, []string{token}, 100)
	require.NoError(t, err)
	require.Len(t, logs, transfers, "every recipient, registered or not")
	for i, l := range logs {
		require.Equal(t, fmt.Sprintf("0x%040x", 0x1000+i), l.To)
		require.Equal(t, int64(i+1), l.Value.Int64())
	}
	_, err = client.ContractTransferLogs(ctx, first, last, []string{token}, transfers-1)
	require.ErrorIs(t, err, ErrLogsLimit, "an answer over the cap")
	logs, err = client.ContractTransferLogs(ctx, first, last, []string{token}, transfers)
	require.NoError(t, err, "an answer at the cap")
	require.Len(t, logs, transfers)
	_, err = client.ContractTransferLogs(ctx, first, last, []string{token}, 0)
	require.Error(t, err, "no cap is refused")

	for name, limit := range map[string]devchain.LogsLimit{
		"infura": devchain.InfuraTooManyResults, "alchemy": devchain.AlchemyResponseSize, "quicknode": devchain.QuickNodeRange,
	} {
		t.Run(name, func(t *testing.T) {
			limit.BlocksMax = 1
			p, err := devchain.NewLogsLimitProxy(ch.URL(), limit)
			require.NoError(t, err)
			t.Cleanup(func() { _ = p.Close() })
			client, err := Dial(ctx, p.URL(), ClientOptions{})
			require.NoError(t, err)
			t.Cleanup(client.Close)
			// More refusals than the breaker's error budget: it stays closed.
			for range 3 * BreakerErrorsMaxDefault {
				_, err = client.ContractTransferLogs(ctx, first, last, []string{token}, 100)
				require.ErrorIs(t, err, ErrLogsLimit)
				_, err = client.TransferLogs(ctx, first, last, []string{token}, []string{fmt.Sprintf("0x%040x", 0x1000)})
				require.ErrorIs(t, err, ErrLogsLimit, "the recipient-filtered query too")
			}
			require.Contains(t, err.Error(), limit.Message[:20], "the node's words say why")
			logs, err := client.ContractTransferLogs(ctx, first, first, []string{token}, 100)
			require.NoError(t, err, "one block is answered; the breaker is closed")
			require.Len(t, logs, 1)
			require.Equal(t, int64(6*BreakerErrorsMaxDefault), p.Refused())
		})
	}
}
