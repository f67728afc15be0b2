// Package sql embeds settle's migrations: numbered, forward-only SQL files
// applied in order by `api migrate` and `settlectl migrate`.
package sql

import "embed"

// Migrations holds migrations/NNNN_name.sql.
//
//go:embed migrations/*.sql
var Migrations embed.FS
