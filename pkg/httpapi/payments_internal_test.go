package httpapi

import (
	"testing"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
)

// TestContentAsSent: the hashes of a post's or void's content as its
// sender wrote it, which a row stored before its hold was stored under
// (with the amount it gave, or 0 by a version that did not keep it);
// none when nothing is stored otherwise, or when the content as sent was
// refused (so no row can hold it).
func TestContentAsSent(t *testing.T) {
	registry := payment.NewRegistry([]payment.Asset{
		{Code: "ETH", Network: payment.DefaultNetwork, Decimals: 18},
		{Code: "WBTC", Network: payment.DefaultNetwork, Contract: "0x2260fac5e5542a773aa44fbcfedf7c193bc2c599", Decimals: 8},
		{Code: "DAI", Network: "BASE_MAINNET", Contract: "0x50c5725949a6f0c72e6c4a641f24049a917db0cb", Decimals: 18},
	})
	filled := payment.Event{ID: "v-1", Type: payment.WithdrawalVoid, UserID: 7, Asset: "DAI", Amount: decimal.RequireFromString("1.5"),
		HoldID: "h-1", Network: "BASE_MAINNET", ToAddress: "0x00000000000000000000000000000000000000ab"}
	sent := paymentRequest{eventID: "v-1", eventType: payment.WithdrawalVoid, userID: 7, asset: "ETH", holdID: "h-1"}

	want := payment.Content{Type: payment.WithdrawalVoid, UserID: 7, Asset: "ETH", HoldID: "h-1", Network: payment.DefaultNetwork}
	require.Equal(t, [][]byte{want.Hash()}, contentAsSent(sent, filled, true, registry), "no amount: stored with 0")
	sent.amount, sent.amountGiven = "1.50", true
	given := want
	given.Amount = decimal.RequireFromString("1.5")
	require.Equal(t, [][]byte{given.Hash(), want.Hash()}, contentAsSent(sent, filled, true, registry), "an amount given: in its content, or 0")

	sent.asset, sent.amount = "WBTC", "1.123456789"
	require.Nil(t, contentAsSent(sent, filled, true, registry), "too precise for WBTC: refused as sent, never stored so")
	require.Nil(t, contentAsSent(sent, filled, false, registry), "not filled in, index as sent")

	deposit := payment.Event{ID: "d-1", Type: payment.Deposit, UserID: 7, Asset: "ETH", Amount: decimal.RequireFromString("1"),
		TxHash: "0x" + "ab", TransferIndex: "trace:call_0", Network: payment.DefaultNetwork}
	index := deposit
	index.TransferIndex = "trace:CALL_0"
	require.Equal(t, [][]byte{index.Content().Hash()}, contentAsSent(paymentRequest{transferIndexSent: "trace:CALL_0"}, deposit, false, registry))
}
