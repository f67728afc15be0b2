package postgres

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// execEach runs a no-transaction migration one statement at a time:
// PostgreSQL runs a string of several statements as one implicit
// transaction, in which CREATE INDEX CONCURRENTLY is refused. A statement
// ends with a line (not a comment) ending in ";". Such a file may hold no dollar quotes
// (no function bodies or DO blocks), which makes that rule exact.
func execEach(ctx context.Context, conn *pgconn.PgConn, text string) ([]*pgconn.Result, error) {
	statements, err := splitStatements(text)
	if err != nil {
		return nil, err
	}
	var results []*pgconn.Result
	for _, statement := range statements {
		r, err := conn.Exec(ctx, statement).ReadAll()
		if err != nil {
			return nil, err
		}
		results = append(results, r...)
	}
	return results, nil
}

func splitStatements(text string) ([]string, error) {
	if strings.Contains(text, "$$") {
		return nil, errors.New("a no-transaction migration may not hold dollar quotes: its statements are split at lines ending in ;")
	}
	var out []string
	var current strings.Builder
	for line := range strings.Lines(text) {
		current.WriteString(line)
		trimmed := strings.TrimSpace(line)
		if strings.HasSuffix(trimmed, ";") && !strings.HasPrefix(trimmed, "--") {
			out = append(out, current.String())
			current.Reset()
		}
	}
	if rest := current.String(); hasSQL(rest) {
		out = append(out, rest)
	}
	return out, nil
}

// hasSQL reports whether text holds more than blank lines and comments.
func hasSQL(text string) bool {
	for line := range strings.Lines(text) {
		if trimmed := strings.TrimSpace(line); trimmed != "" && !strings.HasPrefix(trimmed, "--") {
			return true
		}
	}
	return false
}
