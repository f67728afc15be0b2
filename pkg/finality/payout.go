package finality

import (
	"context"

	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/payment"
)

// payout describes a withdrawal_post as the chain should confirm it: its
// transaction pays the hold's amount of the asset (the post carries both,
// taken from its hold at ingest) to the hold's to_address, as native value
// or as a Transfer log of the token. A hold without a to_address may pay
// anyone: then only the amount, status and finality are checked.
func (g *Gate) payout(e payment.Event, toAddress string) (chain.Deposit, string, error) {
	asset, units, err := g.baseUnits(e)
	if err != nil {
		return chain.Deposit{}, "", err
	}
	d := chain.Deposit{TxHash: e.TxHash, Token: asset.Contract, Amount: units}
	if toAddress != "" {
		d.Recipients = []string{toAddress}
	} else {
		d.Owner = anyRecipient{}
	}
	return d, asset.Network, nil
}

// anyRecipient accepts whichever address the chain shows.
type anyRecipient struct{}

func (anyRecipient) Owned(_ context.Context, addresses []string) ([]string, error) {
	return addresses, nil
}
