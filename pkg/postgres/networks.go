package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/settle/settle/pkg/payment"
)

// Assets reads the registry: networks and every listing of a code on one.
func (db *DB) Assets(ctx context.Context) (*payment.Registry, error) {
	var networks []payment.Network
	var assets []payment.Asset
	err := pgx.BeginTxFunc(ctx, db.pool, bounded(pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}), func(tx pgx.Tx) error {
		stmt := q("list_networks")
		rows, err := tx.Query(ctx, stmt.text)
		if err != nil {
			return classify(stmt.name, err)
		}
		networks, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (payment.Network, error) {
			var n payment.Network
			return n, row.Scan(&n.Name, &n.ChainID, &n.Native)
		})
		if err != nil {
			return classify(stmt.name, err)
		}
		stmt = q("list_network_assets")
		if rows, err = tx.Query(ctx, stmt.text); err != nil {
			return classify(stmt.name, err)
		}
		assets, err = pgx.CollectRows(rows, scanListing)
		return classify(stmt.name, err)
	})
	if err != nil {
		return nil, classify("read registry", err)
	}
	return payment.NewRegistry(assets, networks...), nil
}

func scanListing(row pgx.CollectableRow) (payment.Asset, error) {
	var a payment.Asset
	var decimals int16
	err := row.Scan(&a.Code, &a.Network, &a.Contract, &decimals)
	a.Decimals = int(decimals)
	return a, err
}

// NewNetwork is what an operator adds: a chain and its own coin.
type NewNetwork struct {
	Name     string
	ChainID  int64
	Native   string // ledger code of the native coin
	Decimals int    // the native coin's decimals on this network
}

// AddNetwork adds a network with its native coin's listing. Adding one
// that exists exactly as given is not an error (added false); a name or
// chain id already used otherwise is payment.ErrConflict.
func (db *DB) AddNetwork(ctx context.Context, n NewNetwork) (added bool, err error) {
	err = pgx.BeginTxFunc(ctx, db.pool, bounded(pgx.TxOptions{}), func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, q("lock_registry").text); err != nil {
			return classify("lock registry", err)
		}
		stmt := q("get_network")
		rows, err := tx.Query(ctx, stmt.text, n.Name, n.ChainID)
		if err != nil {
			return classify(stmt.name, err)
		}
		existing, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (payment.Network, error) {
			var e payment.Network
			return e, row.Scan(&e.Name, &e.ChainID, &e.Native)
		})
		if err != nil {
			return classify(stmt.name, err)
		}
		// The name and the chain id may each match a row: every row must
		// be this very network.
		for _, e := range existing {
			if e.Name != n.Name {
				return fmt.Errorf("%w: chain id %d is network %s", payment.ErrConflict, n.ChainID, e.Name)
			}
			if e.ChainID != n.ChainID || e.Native != n.Native {
				return fmt.Errorf("%w: network %s exists with chain id %d and native %q", payment.ErrConflict, e.Name, e.ChainID, e.Native)
			}
		}
		if len(existing) > 0 {
			// The same network again: make sure its native listing is there.
			return db.addListing(ctx, tx, payment.Asset{Code: n.Native, Network: n.Name, Decimals: n.Decimals}, nil)
		}
		// The network first: the native code's first listing may name it.
		if _, err := tx.Exec(ctx, q("insert_network").text, n.Name, n.ChainID, ""); err != nil {
			return classify("insert_network", err)
		}
		added = true
		if err := db.addListing(ctx, tx, payment.Asset{Code: n.Native, Network: n.Name, Decimals: n.Decimals}, nil); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, q("set_network_native").text, n.Name, n.Native); err != nil {
			return classify("set_network_native", err)
		}
		return nil
	})
	return added, classifyTx("add network", err)
}

// AddAsset lists code on a network: a token by its contract, or the
// network's own coin without one. The same listing again is not an error
// (added false); another code at that contract, or this code with other
// facts there, is payment.ErrConflict; an unknown network is
// payment.ErrUnknownNetwork.
func (db *DB) AddAsset(ctx context.Context, a payment.Asset) (added bool, err error) {
	err = pgx.BeginTxFunc(ctx, db.pool, bounded(pgx.TxOptions{}), func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, q("lock_registry").text); err != nil {
			return classify("lock registry", err)
		}
		var name string
		var chainID int64
		var native string
		err := tx.QueryRow(ctx, q("get_network").text, a.Network, 0).Scan(&name, &chainID, &native)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w %q", payment.ErrUnknownNetwork, a.Network)
		}
		if err != nil {
			return classify("get_network", err)
		}
		if a.Native() && native != "" && native != a.Code {
			return fmt.Errorf("%w: the native coin of %s is %s", payment.ErrConflict, a.Network, native)
		}
		return db.addListing(ctx, tx, a, &added)
	})
	return added, classifyTx("add asset", err)
}

// addListing inserts a listing unless it exists as given. The code is
// made a ledger asset first if it is new (migration 0012's trigger may
// list it on its network on the way).
func (db *DB) addListing(ctx context.Context, tx pgx.Tx, a payment.Asset, added *bool) error {
	stmt := q("find_network_listing")
	rows, err := tx.Query(ctx, stmt.text, a.Network, a.Code, a.Contract)
	if err != nil {
		return classify(stmt.name, err)
	}
	existing, err := pgx.CollectRows(rows, scanListing)
	if err != nil {
		return classify(stmt.name, err)
	}
	// The code and the contract may each match a row: every row must be
	// this very listing.
	for _, e := range existing {
		if e != a {
			return fmt.Errorf("%w: %s is listed on %s with contract %q and %d decimals", payment.ErrConflict,
				e.Code, e.Network, e.Contract, e.Decimals)
		}
	}
	if len(existing) > 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, q("insert_asset_code").text, a.Code, a.Network, a.Contract, a.Decimals); err != nil {
		return classify("insert_asset_code", err)
	}
	var exists bool
	if err := tx.QueryRow(ctx, q("code_exists").text, a.Code).Scan(&exists); err != nil {
		return classify("code_exists", err)
	}
	if !exists {
		return fmt.Errorf("%w: code %s could not become a ledger asset (assets lists its contract on %s under another code)", payment.ErrConflict, a.Code, a.Network)
	}
	if _, err := tx.Exec(ctx, q("insert_network_asset").text, a.Network, a.Code, a.Contract, a.Decimals); err != nil {
		return classify("insert_network_asset", err)
	}
	if added != nil {
		*added = true
	}
	return nil
}

// registryLoadTimeout bounds one reload of KeepRegistry (its interval,
// if shorter). The caller's context has no deadline: a PostgreSQL that
// stops answering mid-call without a reset held the reloads until the
// kernel gave the socket up, many minutes later.
const registryLoadTimeout = 10 * time.Second

// KeepRegistry reloads reg from the tables every interval until ctx ends,
// so that a network or asset an operator adds reaches a running process
// within REGISTRY_REFRESH. A failed reload keeps the registry as it was.
func (db *DB) KeepRegistry(ctx context.Context, reg *payment.Registry, every time.Duration, failed func(error)) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		loadCtx, cancel := context.WithTimeout(ctx, min(every, registryLoadTimeout))
		fresh, err := db.Assets(loadCtx)
		cancel()
		if err != nil {
			if ctx.Err() == nil && failed != nil {
				failed(err)
			}
			continue
		}
		reg.Replace(fresh)
	}
}

// Reports of the networks a worker has an RPC on.
const (
	// RPCReportEvery is how often a worker reports its RPCs.
	RPCReportEvery = 5 * time.Minute
	// RPCReportMaxAge is how long a report counts: a network stays one
	// whose chain decides while no worker runs (an outage, a deploy),
	// and stops being one a day after the last worker with its RPC.
	RPCReportMaxAge = 24 * time.Hour
)

// ReportRPCs records that this worker can ask the chain of networks.
func (db *DB) ReportRPCs(ctx context.Context, networks []string) error {
	if len(networks) == 0 {
		return nil
	}
	stmt := q("report_rpcs")
	_, err := db.pool.Exec(ctx, stmt.text, networks)
	return classify(stmt.name, err)
}

// ReportedRPCs are the networks a worker reported an RPC on within
// RPCReportMaxAge.
func (db *DB) ReportedRPCs(ctx context.Context) (map[string]bool, error) {
	stmt := q("reported_rpcs")
	rows, err := db.pool.Query(ctx, stmt.text, interval(RPCReportMaxAge))
	if err != nil {
		return nil, classify(stmt.name, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, classify(stmt.name, err)
	}
	out := make(map[string]bool, len(names))
	for _, n := range names {
		out[n] = true
	}
	return out, nil
}

// KeepReportingRPCs reports networks now and every RPCReportEvery until
// ctx ends; a failed report is retried at the next tick.
func (db *DB) KeepReportingRPCs(ctx context.Context, networks []string, failed func(error)) {
	if len(networks) == 0 {
		return
	}
	t := time.NewTicker(RPCReportEvery)
	defer t.Stop()
	for {
		reportCtx, cancel := context.WithTimeout(ctx, registryLoadTimeout)
		err := db.ReportRPCs(reportCtx, networks)
		cancel()
		if err != nil && ctx.Err() == nil && failed != nil {
			failed(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
