package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"

	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/config"
)

func init() {
	register("env", "env [--out .env] [--rpc URL] [--finality finalized|confirmations:N|none] [--force]: write docker compose's .env with random secrets", runEnv)
}

// Sizes of the generated secrets, in random bytes.
const (
	envTokenBytes    = 32 // 64 hex characters
	envPasswordBytes = 24
	envNotifyBytes   = 32
)

// runEnv writes the .env compose.yaml reads its secrets from: every
// secret random, the file private (0600), an existing file kept unless
// --force. Deposits are checked against the chain by default, which needs
// --rpc; only an explicit --finality none writes a file without one.
func runEnv(_ context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("env", flag.ContinueOnError)
	path := fs.String("out", ".env", "file to write")
	// Not the flag's default: -h prints defaults, and the URL holds the
	// provider's API key.
	rpc := fs.String("rpc", "", "Ethereum JSON-RPC endpoint (http/https; default $ETH_RPC_URL)")
	finality := fs.String("finality", "finalized", "DEPOSIT_FINALITY: finalized, confirmations:N, or none (trusts every deposit: a trial only)")
	force := fs.Bool("force", false, "overwrite an existing file")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	if *rpc == "" {
		*rpc = os.Getenv("ETH_RPC_URL")
	}
	policy, err := chain.ParsePolicy(*finality)
	if err != nil {
		return fmt.Errorf("%w: --finality: %w", config.ErrUsage, err)
	}
	switch {
	case *rpc == "" && policy.Kind() != chain.None:
		return fmt.Errorf("%w: deposits are checked against the chain (--finality %s): give --rpc https://... (or ETH_RPC_URL), or --finality none for a trial that credits every deposit unchecked", config.ErrUsage, policy)
	case *rpc != "":
		if u, err := url.Parse(*rpc); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("%w: --rpc must be an http:// or https:// URL", config.ErrUsage)
		}
		if strings.ContainsAny(*rpc, "\n\"'$` ") {
			return fmt.Errorf("%w: --rpc holds characters a .env line cannot carry", config.ErrUsage)
		}
	}
	values, err := envValues(*rpc, policy.String())
	if err != nil {
		return err
	}
	flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
	if *force {
		flags = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	}
	f, err := os.OpenFile(*path, flags, 0o600)
	if errors.Is(err, os.ErrExist) {
		return fmt.Errorf("%s exists: kept as it is (--force replaces it, and every secret in it)", *path)
	}
	if err != nil {
		return err
	}
	if _, err := io.WriteString(f, values); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	// O_CREATE's mode is masked by the umask; a replaced file keeps its own.
	if err := os.Chmod(*path, 0o600); err != nil {
		return err
	}
	fmt.Fprintf(out, "wrote %s (secrets generated; keep it out of version control)\n", *path)
	return nil
}

func envValues(rpc, finality string) (string, error) {
	token := func(n int) (string, error) {
		b := make([]byte, n)
		if _, err := rand.Read(b); err != nil {
			return "", err
		}
		return hex.EncodeToString(b), nil
	}
	var lines []string
	for _, s := range []struct {
		name  string
		bytes int
	}{
		{"WEBHOOK_SECRET", envTokenBytes}, {"API_TOKEN", envTokenBytes}, {"ADMIN_TOKEN", envTokenBytes},
		{"POSTGRES_PASSWORD", envPasswordBytes}, {"GRAFANA_ADMIN_PASSWORD", envPasswordBytes},
	} {
		v, err := token(s.bytes)
		if err != nil {
			return "", err
		}
		lines = append(lines, s.name+"="+v)
	}
	key := make([]byte, envNotifyBytes)
	if _, err := rand.Read(key); err != nil {
		return "", err
	}
	return "# docker compose reads this file (settlectl env wrote it). Never commit it.\n" +
		strings.Join(lines, "\n") + "\n" +
		"# Give this key to the receiver of NOTIFY_WEBHOOK_URL (Standard Webhooks signatures).\n" +
		"NOTIFY_WEBHOOK_SECRET=whsec_" + base64.StdEncoding.EncodeToString(key) + "\n" +
		"NOTIFY_WEBHOOK_URL=\nALERT_WEBHOOK_URL=\nALCHEMY_SIGNING_KEY=\n" +
		"ETH_RPC_URL=" + rpc + "\n" +
		"DEPOSIT_FINALITY=" + finality + "\n" +
		"# The enabled networks; ETH_RPC_URL is ETH_MAINNET's endpoint. A second one, e.g.\n" +
		"# NETWORKS=ETH_MAINNET,BASE_MAINNET with RPC_URL_BASE_MAINNET=https://... (and the\n" +
		"# RPC_URL_BASE_MAINNET lines of compose.yaml uncommented).\n" +
		"NETWORKS=ETH_MAINNET\n", nil
}
