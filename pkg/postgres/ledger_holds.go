package postgres

import (
	"slices"
	"sort"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/ledger"
	"github.com/settle/settle/pkg/payment"
)

// The holds rows ApplyBatch reads and writes; the hold rules are in
// pkg/ledger.

func queueOpenHolds(batch *pgx.Batch, holds []ledger.Hold) {
	n := len(holds)
	ids, users, assets, amounts, networks, tos := make([]string, n), make([]int64, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	for i, h := range holds {
		ids[i], users[i], assets[i], amounts[i], networks[i], tos[i] = h.ID, h.User, h.Asset, h.Amount.String(), h.Network, h.ToAddress
	}
	batch.Queue(q("ledger_open_holds").text, ids, users, assets, amounts, networks, tos)
}

func queueResolveHolds(batch *pgx.Batch, resolutions []ledger.HoldResolution) {
	resolutions = slices.Clone(resolutions)
	sort.Slice(resolutions, func(i, j int) bool { return resolutions[i].HoldID < resolutions[j].HoldID })
	n := len(resolutions)
	ids, statuses, by := make([]string, n), make([]string, n), make([]string, n)
	for i, r := range resolutions {
		ids[i], statuses[i], by[i] = r.HoldID, string(r.Status), r.By
	}
	batch.Queue(q("ledger_resolve_holds").text, ids, statuses, by)
}

func readHoldEvents(br pgx.BatchResults) (map[string]payment.Status, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]payment.Status{}
	for rows.Next() {
		var id, status string
		if err := rows.Scan(&id, &status); err != nil {
			return nil, err
		}
		out[id] = payment.Status(status)
	}
	return out, rows.Err()
}

func readHolds(br pgx.BatchResults) (map[string]*ledger.Hold, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]*ledger.Hold{}
	for rows.Next() {
		var h ledger.Hold
		var amount, status string
		if err := rows.Scan(&h.ID, &h.User, &h.Asset, &amount, &status, &h.Network, &h.ToAddress); err != nil {
			return nil, err
		}
		h.Amount, h.Status = decimal.RequireFromString(amount), payment.HoldStatus(status)
		out[h.ID] = &h
	}
	return out, rows.Err()
}
