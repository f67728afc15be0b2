package finality

import (
	"context"
	"math/big"
	"testing"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
)

func TestPayoutDescribesThePaymentOut(t *testing.T) {
	g := &Gate{o: Options{Assets: payment.NewRegistry([]payment.Asset{
		{Code: "ETH", Network: "ETH_MAINNET", Decimals: 18},
		{Code: "USDC", Network: "ETH_MAINNET", Contract: "0xa0b86991c6218b36c1d19d4a2e9eb0ce3606eb48", Decimals: 6},
	})}}
	post := payment.Event{ID: "p", Type: payment.WithdrawalPost, UserID: 1, Asset: "USDC", Amount: decimal.RequireFromString("2.5"),
		TxHash: "0xab00000000000000000000000000000000000000000000000000000000000000"}
	d, network, err := g.payout(post, "0x00000000000000000000000000000000000000aa")
	require.NoError(t, err)
	require.Equal(t, "ETH_MAINNET", network)
	require.Equal(t, "0xa0b86991c6218b36c1d19d4a2e9eb0ce3606eb48", d.Token)
	require.Equal(t, big.NewInt(2_500_000), d.Amount)
	require.Equal(t, []string{"0x00000000000000000000000000000000000000aa"}, d.Recipients)
	require.Nil(t, d.Owner, "the hold's recipient, not the user's deposit addresses")

	// A hold without a recipient: any address the chain shows, amount
	// still checked.
	d, _, err = g.payout(post, "")
	require.NoError(t, err)
	require.Empty(t, d.Recipients)
	owned, err := d.Owner.Owned(context.Background(), []string{"0x01", "0x02"})
	require.NoError(t, err)
	require.Equal(t, []string{"0x01", "0x02"}, owned)

	native := post
	native.Asset, native.Amount = "ETH", decimal.RequireFromString("1")
	d, _, err = g.payout(native, "")
	require.NoError(t, err)
	require.Empty(t, d.Token)
	require.Equal(t, "1000000000000000000", d.Amount.String())

	unknown := post
	unknown.Asset = "DOGE"
	_, _, err = g.payout(unknown, "")
	require.ErrorIs(t, err, payment.ErrInvalid)
	precise := post
	precise.Amount = decimal.RequireFromString("0.0000001")
	_, _, err = g.payout(precise, "")
	require.ErrorIs(t, err, payment.ErrInvalid)
}
