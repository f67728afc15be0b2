package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/finality"
	"github.com/settle/settle/pkg/postgres"
)

// rescanBlocksMaxDefault is the api's RESCAN_BLOCKS_MAX default
// (httpapi.RescanBlocksMaxDefault; settlectl links no echo).
const rescanBlocksMaxDefault = 100_000

func init() {
	register("rescan", "rescan --network N --from B --to B [--operator NAME] [--reason WHY] | rescan status ID | rescan cancel ID --reason WHY [--operator NAME]", runRescan)
}

// runRescan schedules a rescan the way POST /admin/rescan does, or shows
// a job's progress; the scheduler runs it.
func runRescan(ctx context.Context, args []string, out io.Writer) error {
	if len(args) > 0 && args[0] == "status" {
		rest, err := parseFlags(flag.NewFlagSet("rescan status", flag.ContinueOnError), args[1:], "ID")
		if err != nil {
			return err
		}
		db, err := openDB(ctx)
		if err != nil {
			return err
		}
		defer db.Close()
		job, err := db.Rescan(ctx, rest[0])
		if err != nil {
			return err
		}
		return writeJSON(out, rescanOutput(job))
	}
	if len(args) > 0 && args[0] == "cancel" {
		return cancelRescan(ctx, args[1:], out)
	}
	fs := flag.NewFlagSet("rescan", flag.ContinueOnError)
	network := fs.String("network", "", "network name, e.g. ETH_MAINNET")
	from := fs.Int64("from", -1, "first block")
	to := fs.Int64("to", -1, "last block")
	who := fs.String("operator", "", "who asks (default: your login name)")
	reason := fs.String("reason", "", "why, recorded with the job")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := checkOperatorReason(*who, *reason); err != nil {
		return err
	}
	env := config.FromOS()
	blocksMax := env.Int("RESCAN_BLOCKS_MAX", rescanBlocksMaxDefault, 1, 10_000_000)
	enabled := slices.Contains(finality.ReadNetworks(env), *network)
	if err := env.Err(); err != nil {
		return fmt.Errorf("%w: %w", config.ErrUsage, err)
	}
	switch {
	case *network == "":
		return fmt.Errorf("%w: --network is required", config.ErrUsage)
	case *from < 0 || *to < 0:
		return fmt.Errorf("%w: --from and --to are block numbers from 0", config.ErrUsage)
	case *to < *from:
		return fmt.Errorf("%w: --to is below --from", config.ErrUsage)
	case *to-*from >= int64(blocksMax):
		return fmt.Errorf("%w: a rescan covers at most %d blocks (RESCAN_BLOCKS_MAX); split the range", config.ErrUsage, blocksMax)
	}
	db, err := openDB(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	registry, err := db.Assets(ctx)
	if err != nil {
		return err
	}
	known := false
	for _, a := range registry.All() {
		known = known || a.Network == *network
	}
	if !known || !enabled {
		return fmt.Errorf("%w: network %s is not an enabled network (NETWORKS)", config.ErrUsage, *network)
	}
	asker := operator(*who)
	if r := strings.TrimSpace(*reason); r != "" {
		asker += ": " + r
	}
	job, err := db.CreateRescan(ctx, "rescan_"+uuid.NewString(), *network, uint64(*from), uint64(*to), asker)
	if err != nil {
		return err
	}
	return writeJSON(out, rescanOutput(job))
}

// cancelRescan ends a running job (one waiting for a range typed above
// the head, say): failed, its error naming who cancelled it and why.
// Deposits its passes stored stay; the rest of its range is not scanned.
func cancelRescan(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("rescan cancel", flag.ContinueOnError)
	who := fs.String("operator", "", "who cancels (default: your login name)")
	reason := fs.String("reason", "", "why (required)")
	rest, err := parseFlags(fs, args, "ID")
	if err != nil {
		return err
	}
	why := strings.TrimSpace(*reason)
	if why == "" {
		return fmt.Errorf("%w: cancel needs --reason", config.ErrUsage)
	}
	if err := checkOperatorReason(*who, why); err != nil {
		return err
	}
	db, err := openDB(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := db.CancelRescan(ctx, rest[0], operator(*who), why); err != nil {
		return err
	}
	job, err := db.Rescan(ctx, rest[0])
	if err != nil {
		return err
	}
	return writeJSON(out, rescanOutput(job))
}

// rescanOutput is GET /admin/rescan/{id}'s shape.
func rescanOutput(j postgres.RescanJob) map[string]any {
	out := map[string]any{
		"id": j.ID, "network": j.Network, "from_block": j.FromBlock, "to_block": j.ToBlock, "next_block": j.NextBlock,
		"blocks_done": j.NextBlock - j.FromBlock, "status": j.Status, "found": j.Found, "requested_by": j.RequestedBy, "operator": j.Operator,
		"created_at": j.CreatedAt, "updated_at": j.UpdatedAt, "restarts": j.Restarts,
	}
	if j.LastRestartAt != nil {
		out["last_restart_at"] = *j.LastRestartAt
		out["last_restart_reason"] = j.LastRestartReason
	}
	if j.Address != "" {
		out["address"] = j.Address
	}
	if j.Error != "" {
		out["error"] = j.Error
	}
	if j.WaitingHead != nil {
		out["waiting_head"] = *j.WaitingHead
	}
	return out
}
