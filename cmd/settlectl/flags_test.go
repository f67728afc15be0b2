package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/testenv"
)

// TestSiblingFlagsRefused: a flag of another subcommand (`dlq list
// --reason x`, discard's --reason given to replay's sibling list) is a
// usage error naming it, never taken and ignored while the operator
// believes it took effect; every subcommand group is tried.
func TestSiblingFlagsRefused(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	for _, args := range [][]string{
		{"dlq", "list", "--reason", "x"},
		{"dlq", "list", "--operator", "ops"},
		{"dlq", "show", "7", "--reason", "x"},
		{"dlq", "show", "7", "--state", "all"},
		{"dlq", "replay", "7", "--state", "all"},
		{"dlq", "replay", "7", "--limit", "5"},
		{"dlq", "replay", "7", "--json"},
		{"dlq", "discard", "7", "--reason", "x", "--after", "3"},
		{"notifications", "list", "--operator", "ops"},
		{"notifications", "redeliver", "7", "--state", "failed"},
		{"notifications", "redeliver", "7", "--limit", "5"},
		{"notifications", "redeliver-failed", "--state", "failed"},
		{"notifications", "redeliver-failed", "--before", "9"},
		{"events", "rechecks", "e-1", "--operator", "ops"},
		{"holds", "show", "h-1", "--user", "7"},
		{"holds", "list", "--operator", "ops"},
		{"networks", "list", "--name", "X"},
		{"assets", "list", "--asset", "ETH"},
		{"assets", "add", "--network", "ETH_MAINNET", "--asset", "X", "--decimals", "6", "--json"},
		{"users", "create", "7", "--reason", "x"},
		{"addresses", "add", "--network", "ETH_MAINNET", "--address", "0xab12ab12ab12ab12ab12ab12ab12ab12ab12ab12", "--user", "7", "--json"},
		{"rescan", "status", "rescan-x", "--reason", "x"},
		{"rescan", "cancel", "rescan-x", "--reason", "x", "--network", "ETH_MAINNET"},
		{"rescan", "--network", "ETH_MAINNET", "--from", "1", "--to", "2", "--json"},
		{"reconcile", "--json"},
		{"check", "--chunk", "5"},
		{"migrate", "--force"},
		{"env", "--out", filepath.Join(t.TempDir(), ".env"), "--finality", "none", "--json"},
	} {
		name := strings.Join(args, " ")
		_, err := runCtl(t, dsn, args...)
		require.ErrorIs(t, err, config.ErrUsage, "settlectl %s", name)
		require.ErrorContains(t, err, "unknown flag --", "settlectl %s", name)
		var stderr bytes.Buffer
		require.Equal(t, 2, exitCode(&stderr, args[0], err))
		lines := strings.Split(stderr.String(), "\n")
		require.Contains(t, lines[0], "unknown flag", "settlectl %s", name)
		require.Contains(t, stderr.String(), "usage: settlectl "+args[0], "the subcommand's usage follows: settlectl %s", name)
	}
	// Each subcommand still takes its own flags.
	for _, args := range [][]string{
		{"dlq", "list", "--state", "all", "--after", "0", "--limit", "5", "--json"},
		{"dlq", "show", "1", "--json"}, // not found, but parsed
		{"notifications", "list", "--state", "failed", "--before", "9", "--limit", "5", "--json"},
		{"notifications", "redeliver-failed", "--limit", "5", "--operator", "ops"},
	} {
		_, err := runCtl(t, dsn, args...)
		require.NotErrorIs(t, err, config.ErrUsage, "settlectl %s", strings.Join(args, " "))
	}
}

// TestOperatorReasonBounded: --operator and --reason longer than the
// admin API takes are usage errors before anything is written.
func TestOperatorReasonBounded(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	longName := strings.Repeat("n", payment.OperatorLengthMax+1)
	longReason := strings.Repeat("é", payment.ReasonLengthMax+1)
	for _, args := range [][]string{
		{"dlq", "replay", "1", "--operator", longName},
		{"dlq", "replay", "1", "--reason", longReason},
		{"dlq", "discard", "1", "--reason", longReason},
		{"dlq", "discard", "1", "--reason", "x", "--operator", longName},
		{"notifications", "redeliver", "1", "--operator", longName},
		{"notifications", "redeliver-failed", "--operator", longName},
		{"events", "recheck", "e-1", "--operator", longName},
		{"rescan", "--network", "ETH_MAINNET", "--from", "1", "--to", "2", "--operator", longName},
		{"rescan", "--network", "ETH_MAINNET", "--from", "1", "--to", "2", "--reason", longReason},
		{"rescan", "cancel", "rescan-x", "--reason", longReason},
		{"rescan", "cancel", "rescan-x", "--reason", "x", "--operator", longName},
	} {
		name := strings.Join(args[:3], " ")
		t.Setenv("NETWORKS", "ETH_MAINNET")
		_, err := runCtl(t, dsn, args...)
		require.ErrorIs(t, err, config.ErrUsage, "settlectl %s", name)
		require.Regexp(t, `--(operator|reason) is \d+ characters; at most \d+`, err.Error(), "settlectl %s", name)
	}
	for _, args := range [][]string{
		{"dlq", "replay", "1", "--operator", "ann\x1b[2J"},
		{"dlq", "discard", "1", "--reason", "x", "--operator", "ann\nbob"},
		{"dlq", "discard", "1", "--reason", "red \x1b[31m"},
		{"events", "recheck", "e-1", "--operator", "ann\tbob"},
	} {
		name := strings.Join(args[:3], " ")
		_, err := runCtl(t, dsn, args...)
		require.ErrorIs(t, err, config.ErrUsage, "settlectl %s", name)
		require.Contains(t, err.Error(), "without control characters", "settlectl %s", name)
	}
	// At the bound, taken.
	_, err := runCtl(t, dsn, "rescan", "--network", "ETH_MAINNET", "--from", "1", "--to", "2",
		"--operator", strings.Repeat("n", payment.OperatorLengthMax), "--reason", strings.Repeat("é", payment.ReasonLengthMax))
	require.NoError(t, err)
}

// TestUnreachableDatabaseIsQuick: a DATABASE_URL nobody answers ends
// settlectl within seconds (the services' open waits a minute for a
// PostgreSQL still starting), exit 1, saying so without the URL.
func TestUnreachableDatabaseIsQuick(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "settlectl")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, url := range []string{
		"postgres://settleuser:hunter2@127.0.0.1:1/settledb", // a port nobody listens on
		"postgres://settleuser:hunter2@host.invalid:5432/settledb",
	} {
		cmd := exec.Command(bin, "check")
		cmd.Env = append(os.Environ(), "DATABASE_URL="+url)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		start := time.Now()
		_ = cmd.Run()
		took := time.Since(start)
		assert.Equal(t, 1, cmd.ProcessState.ExitCode(), "%s", stderr.String())
		assert.Less(t, took, 20*time.Second, "settlectl waited %s for an unreachable database", took)
		msg := stderr.String()
		assert.Contains(t, msg, "no connection to PostgreSQL (DATABASE_URL) within")
		assert.Equal(t, 1, strings.Count(msg, "\n"), "%q", msg)
		for _, piece := range []string{"hunter2", "settleuser", "settledb", "127.0.0.1", "host.invalid", ":1"} {
			assert.NotContains(t, msg, piece)
		}
		t.Logf("%s in %s", strings.TrimSpace(msg), took.Round(time.Millisecond))
	}
}
