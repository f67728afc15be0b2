package postgres

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSplitStatements(t *testing.T) {
	got, err := splitStatements("-- settle:no-transaction\n-- a comment;\nBEGIN;\nALTER TABLE t\n    ADD COLUMN c int;\n\nCREATE INDEX CONCURRENTLY i ON t (c);\n-- trailing comment\n")
	require.NoError(t, err)
	require.Equal(t, []string{
		"-- settle:no-transaction\n-- a comment;\nBEGIN;\n",
		"ALTER TABLE t\n    ADD COLUMN c int;\n",
		"\nCREATE INDEX CONCURRENTLY i ON t (c);\n",
	}, got)

	_, err = splitStatements("DO $$ BEGIN END; $$;\n")
	require.Error(t, err, "a dollar quote could hold a line ending in ;")
}

// Every no-transaction migration this binary carries splits cleanly.
func TestNoTransactionMigrationsSplit(t *testing.T) {
	migrations, err := loadMigrations()
	require.NoError(t, err)
	for _, m := range migrations {
		if !strings.Contains(m.text, noTransactionDirective) {
			continue
		}
		statements, err := splitStatements(m.text)
		require.NoError(t, err, m.name)
		require.NotEmpty(t, statements, m.name)
	}
}
