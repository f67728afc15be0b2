package postgres

// QueryText is a named statement's SQL, for tests that EXPLAIN it.
func QueryText(name string) string { return q(name).text }
