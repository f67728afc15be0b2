package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"
)

// NetworkFlow is what one asset moved on one network: the confirmed
// credits and debits there. Balances are per asset, fungible across
// networks, so conservation holds per asset; its flows say where.
type NetworkFlow struct {
	Network         string
	Credits, Debits decimal.Decimal
}

// Net is credits less debits: what the network brought the asset's
// balances on the whole.
func (f NetworkFlow) Net() decimal.Decimal { return f.Credits.Sub(f.Debits) }

// attachNetworkFlows reads the flows per (asset, network) on tx's
// snapshot into each asset's sheet.
func attachNetworkFlows(ctx context.Context, tx pgx.Tx, sheet []Conservation) error {
	stmt := q("inv_conservation_networks")
	rows, err := tx.Query(ctx, stmt.text)
	if err != nil {
		return classify(stmt.name, err)
	}
	defer rows.Close()
	byAsset := make(map[string]int, len(sheet))
	for i, c := range sheet {
		byAsset[c.Asset] = i
	}
	for rows.Next() {
		var asset, credits, debits string
		var f NetworkFlow
		if err := rows.Scan(&asset, &f.Network, &credits, &debits); err != nil {
			return classify(stmt.name, err)
		}
		f.Credits, f.Debits = decimal.RequireFromString(credits), decimal.RequireFromString(debits)
		// Every event's asset is a row of assets (a foreign key), and the
		// sheet lists every row of assets.
		i, ok := byAsset[asset]
		if !ok {
			return fmt.Errorf("%s: flows of asset %s, which the conservation sheet does not list", stmt.name, asset)
		}
		sheet[i].Networks = append(sheet[i].Networks, f)
	}
	return classify(stmt.name, rows.Err())
}
