//go:build !fuzzing

package finality_test

import (
	"testing"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// TestETHDepositOfAUserWithoutAddresses: a user who registered no address
// on the network has an ETH deposit checked for its value only, as before
// addresses existed, but never on an address another user registered; a
// user with addresses still needs the transaction to pay one of them.
func TestETHDepositOfAUserWithoutAddresses(t *testing.T) {
	f := newInternalFixture(t, false)
	_, err := f.db.CreateUser(f.ctx, 2)
	require.NoError(t, err)
	free, stranger := f.ch.Accounts()[2].Address, f.ch.Accounts()[3].Address
	send := func(to, eth string) string {
		tx, err := f.ch.SendETH(f.ctx, 0, to, decimal.RequireFromString(eth).Shift(18).BigInt())
		require.NoError(t, err)
		return tx.Hash
	}
	deposit := func(id string, user int64, hash, eth string) {
		e := payment.Event{ID: id, Type: payment.Deposit, UserID: user, Asset: "ETH", Amount: decimal.RequireFromString(eth),
			TxHash: hash, TraceID: "trace-" + id, Network: payment.DefaultNetwork}
		inserted, err := f.db.InsertEvent(f.ctx, postgres.NewEvent{Event: e, Source: postgres.SourcePayments})
		require.NoError(t, err)
		require.True(t, inserted)
	}
	deposit("no-addresses", 2, send(free, "0.5"), "0.5")
	deposit("another-users-address", 2, send(f.to, "0.25"), "0.25")
	deposit("wrong-value", 2, send(free, "0.125"), "0.375")
	deposit("has-addresses", 1, send(stranger, "0.0625"), "0.0625")
	credits := f.checkAll(4)

	require.Len(t, credits, 1)
	require.Equal(t, []string{payment.TransferNative}, credits["no-addresses"].Chain.Transfers)
	_, err = f.db.ApplyBatch(f.ctx, []postgres.LedgerItem{*credits["no-addresses"]}, postgres.LedgerOptions{})
	require.NoError(t, err)
	status, _ := f.state("no-addresses")
	require.Equal(t, "confirmed/success", status)
	for id, want := range map[string]string{
		"another-users-address": "the transaction pays " + f.to + ", which is not a deposit address of the user",
		"wrong-value":           "the transaction carries 125000000000000000 base units, the deposit says 375000000000000000",
		"has-addresses":         "the transaction pays " + stranger + ", which is not a deposit address of the user",
	} {
		status, reason := f.state(id)
		require.Equal(t, "failed/mismatch", status, id)
		require.Equal(t, want, reason, id)
	}
	testenv.RequireInvariants(t, f.db)
}
