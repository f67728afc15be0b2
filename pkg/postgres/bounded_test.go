package postgres_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEveryTransactionIsBounded: every transaction begins through begin
// or bounded (idle_in_transaction_session_timeout), so a new one cannot
// leave a replica cut off mid-transaction holding its locks for hours.
// The ledger sets its own bound, and the migration lock's transaction
// waits for its migration on purpose.
func TestEveryTransactionIsBounded(t *testing.T) {
	unbounded := regexp.MustCompile(`pool\.Begin\(|pgx\.BeginFunc\(|pool\.BeginTx\(ctx, pgx\.TxOptions|BeginTxFunc\([^,]+, db\.pool, pgx\.TxOptions`)
	allowed := map[string]int{"migrate.go": 1, "db.go": 0}
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		text, err := os.ReadFile(file)
		require.NoError(t, err)
		found := len(unbounded.FindAll(text, -1))
		require.LessOrEqual(t, found, allowed[file], "%s begins a transaction without the idle bound (use db.begin or bounded)", file)
		require.False(t, strings.Contains(string(text), "Rollback(context.WithoutCancel("), "%s rolls back without a deadline (use rollbackDetached)", file)
	}
}
