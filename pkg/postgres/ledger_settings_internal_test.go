package postgres

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLedgerSettingsFollowTheOptions: the remembered text is only reused
// for the same timeouts.
func TestLedgerSettingsFollowTheOptions(t *testing.T) {
	a := LedgerOptions{LockTimeout: 2 * time.Second, StatementTimeout: 5 * time.Second}
	b := LedgerOptions{LockTimeout: 300 * time.Millisecond, StatementTimeout: 5 * time.Second}
	for range 2 {
		textA := ledgerSettings(a)
		require.Contains(t, textA, "set_config('lock_timeout', '2000ms', true)")
		require.Contains(t, textA, "set_config('statement_timeout', '5000ms', true)")
		require.Contains(t, textA, "force_generic_plan")
		textB := ledgerSettings(b)
		require.Contains(t, textB, "set_config('lock_timeout', '300ms', true)")
		require.Equal(t, textB, ledgerSettings(b))
	}
}
