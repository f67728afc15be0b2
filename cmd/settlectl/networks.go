package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"

	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

func init() {
	register("networks", "networks add --name N --chain-id ID --native CODE --decimals D | list [--json]", runNetworks)
	register("assets", "assets add --network N --asset CODE [--contract 0x...] --decimals D | list [--network N] [--json]", runAssets)
}

const (
	networksUsage = "networks add --name N --chain-id ID --native CODE --decimals D | networks list [--json]"
	assetsUsage   = "assets add --network N --asset CODE [--contract 0x...] --decimals D | assets list [--network N] [--json]"
	// decimalsUnset marks a --decimals the operator did not give: 0 is a
	// real answer (a token without fractions), so it cannot be the default.
	decimalsUnset = -1
)

func runNetworks(ctx context.Context, args []string, out io.Writer) error {
	if err := groupHelp("networks", args); err != nil {
		return err
	}
	if len(args) == 0 {
		return fmt.Errorf("%w: %s", config.ErrUsage, networksUsage)
	}
	switch args[0] {
	case "add":
		return networksAdd(ctx, args[1:], out)
	case "list":
		return networksList(ctx, args[1:], out)
	}
	return fmt.Errorf("%w: unknown subcommand %q; %s", config.ErrUsage, args[0], networksUsage)
}

func networksAdd(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("networks add", flag.ContinueOnError)
	name := fs.String("name", "", "network name, e.g. BASE_SEPOLIA")
	chainID := fs.Int64("chain-id", 0, "what the network's RPC answers to eth_chainId")
	native := fs.String("native", "", "ledger code of the network's own coin, e.g. ETH")
	decimals := fs.Int64("decimals", decimalsUnset, "the native coin's decimals on this network (0..18)")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	if *decimals == decimalsUnset {
		return fmt.Errorf("%w: --decimals is required (%s)", config.ErrUsage, networksUsage)
	}
	if err := payment.CheckNetwork(*name, *chainID, *native, *decimals); err != nil {
		return fmt.Errorf("%w: %w", config.ErrUsage, err)
	}
	db, err := openDB(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	added, err := db.AddNetwork(ctx, postgres.NewNetwork{Name: *name, ChainID: *chainID, Native: *native, Decimals: int(*decimals)})
	if err != nil {
		return err
	}
	if added {
		fmt.Fprintf(out, "network %s (chain id %d, native %s with %d decimals) added; running processes see it within REGISTRY_REFRESH\n", *name, *chainID, *native, *decimals)
	} else {
		fmt.Fprintf(out, "network %s exists as given\n", *name)
	}
	return nil
}

func networksList(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("networks list", flag.ContinueOnError)
	jsonOut := fs.Bool("json", false, "print JSON")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	registry, err := readRegistry(ctx)
	if err != nil {
		return err
	}
	networks := registry.Networks()
	if *jsonOut {
		rows := make([]map[string]any, 0, len(networks))
		for _, n := range networks {
			rows = append(rows, map[string]any{"name": n.Name, "chain_id": n.ChainID, "native": n.Native})
		}
		return writeJSON(out, rows)
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tCHAIN ID\tNATIVE")
	for _, n := range networks {
		chainID := "-" // carried over from round one; settlectl networks add sets it
		if n.ChainID != 0 {
			chainID = fmt.Sprint(n.ChainID)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\n", n.Name, chainID, dash(n.Native))
	}
	return w.Flush()
}

func runAssets(ctx context.Context, args []string, out io.Writer) error {
	if err := groupHelp("assets", args); err != nil {
		return err
	}
	if len(args) == 0 {
		return fmt.Errorf("%w: %s", config.ErrUsage, assetsUsage)
	}
	switch args[0] {
	case "add":
		return assetsAdd(ctx, args[1:], out)
	case "list":
		return assetsList(ctx, args[1:], out)
	}
	return fmt.Errorf("%w: unknown subcommand %q; %s", config.ErrUsage, args[0], assetsUsage)
}

func assetsAdd(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("assets add", flag.ContinueOnError)
	network := fs.String("network", "", "network the asset is listed on, e.g. BASE_MAINNET")
	code := fs.String("asset", "", "ledger asset code, e.g. USDC (one balance on every network)")
	contract := fs.String("contract", "", "token contract (0x + 40 hex); omit for the network's native coin")
	decimals := fs.Int64("decimals", decimalsUnset, "the asset's decimals on this network (0..18)")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	if *decimals == decimalsUnset {
		return fmt.Errorf("%w: --decimals is required (%s)", config.ErrUsage, assetsUsage)
	}
	listing, err := payment.CheckListing(*network, *code, *contract, *decimals)
	if err != nil {
		return fmt.Errorf("%w: %w", config.ErrUsage, err)
	}
	db, err := openDB(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	added, err := db.AddAsset(ctx, listing)
	if errors.Is(err, payment.ErrUnknownNetwork) {
		return fmt.Errorf("%w: %w (settlectl networks add first)", config.ErrUsage, err)
	}
	if err != nil {
		return err
	}
	where := "as the native coin"
	if !listing.Native() {
		where = "at " + listing.Contract
	}
	if added {
		fmt.Fprintf(out, "%s listed on %s %s with %d decimals; running processes see it within REGISTRY_REFRESH\n", listing.Code, listing.Network, where, listing.Decimals)
	} else {
		fmt.Fprintf(out, "%s is listed on %s %s as given\n", listing.Code, listing.Network, where)
	}
	return nil
}

func assetsList(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("assets list", flag.ContinueOnError)
	network := fs.String("network", "", "only this network's listings")
	jsonOut := fs.Bool("json", false, "print JSON")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	registry, err := readRegistry(ctx)
	if err != nil {
		return err
	}
	if *network != "" && !slices.ContainsFunc(registry.Networks(), func(n payment.Network) bool { return n.Name == *network }) {
		// An empty list would read as "nothing listed there".
		return fmt.Errorf("%w: %w %q (settlectl networks list names them)", config.ErrUsage, payment.ErrUnknownNetwork, *network)
	}
	var listings []payment.Asset
	for _, a := range registry.All() {
		if *network == "" || a.Network == *network {
			listings = append(listings, a)
		}
	}
	if *jsonOut {
		rows := make([]map[string]any, 0, len(listings))
		for _, a := range listings {
			var contract any
			if !a.Native() {
				contract = a.Contract
			}
			rows = append(rows, map[string]any{"network": a.Network, "asset": a.Code, "contract": contract, "decimals": a.Decimals})
		}
		return writeJSON(out, rows)
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NETWORK\tASSET\tCONTRACT\tDECIMALS")
	for _, a := range listings {
		contract := "native"
		if !a.Native() {
			contract = a.Contract
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\n", a.Network, a.Code, contract, a.Decimals)
	}
	return w.Flush()
}

func readRegistry(ctx context.Context) (*payment.Registry, error) {
	db, err := openDB(ctx)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	return db.Assets(ctx)
}
