package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"
)

// Reconciliation bounds.
const (
	HotPathWindowDefault     = 10 * time.Minute
	ReconcileChunkDefault    = 1000
	reconcileSampleMax       = 10
	hotPathMismatchReportMax = 100
)

// Mismatch is a balance that disagrees with its journal.
type Mismatch struct {
	UserID                    int64
	Asset                     string
	Balance, Initial, Journal decimal.Decimal
}

func (m Mismatch) String() string {
	return fmt.Sprintf("user %d %s: balance %s, expected %s + %s = %s", m.UserID, m.Asset, m.Balance, m.Initial, m.Journal, m.Initial.Add(m.Journal))
}

func scanMismatch(rows pgx.CollectableRow) (Mismatch, error) {
	var m Mismatch
	var b, i, j string
	if err := rows.Scan(&m.UserID, &m.Asset, &b, &i, &j); err != nil {
		return m, err
	}
	m.Balance, m.Initial, m.Journal = decimal.RequireFromString(b), decimal.RequireFromString(i), decimal.RequireFromString(j)
	return m, nil
}

// HotPathCheck compares, in one REPEATABLE READ snapshot begun with BEGIN
// ISOLATION LEVEL REPEATABLE READ (not a session setting, which PgBouncer's
// transaction pooling would drop), every balance touched within window
// with initial_balance + SUM(journal). It returns how many it checked.
func (db *DB) HotPathCheck(ctx context.Context, window time.Duration) (int, []Mismatch, error) {
	tx, err := db.pool.BeginTx(ctx, bounded(pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}))
	if err != nil {
		return 0, nil, classify("hot path check", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	interval := fmt.Sprintf("%d milliseconds", window.Milliseconds())
	stmt := q("hot_path_checked")
	var checked int
	if err := tx.QueryRow(ctx, stmt.text, interval).Scan(&checked); err != nil {
		return 0, nil, classify(stmt.name, err)
	}
	stmt = q("hot_path_mismatches")
	rows, err := tx.Query(ctx, stmt.text, interval, hotPathMismatchReportMax)
	if err != nil {
		return 0, nil, classify(stmt.name, err)
	}
	mismatches, err := pgx.CollectRows(rows, scanMismatch)
	if err != nil {
		return 0, nil, classify(stmt.name, err)
	}
	return checked, mismatches, nil
}

// ReconcilePass is the state of a full reconciliation pass. Two runs may
// advance one pass at once (the scheduler's and settlectl's, or two
// replicas'): each chunk counts for the run that recorded it first only.
type ReconcilePass struct {
	ID         int64
	Checked    int64      // recorded by this call
	Mismatches int64      // recorded by this call
	Found      []Mismatch // recorded by this call
	Finished   bool       // this call recorded the pass's end
	Resumed    bool
	// Overtaken counts the chunks this call read but another run of the
	// pass recorded first (this call counted none of them).
	Overtaken int
	// The pass as stored after this call: totals over every run of it, and
	// whether it is over, here or in another run.
	PassChecked, PassMismatches int64
	PassDone                    bool
}

// ErrNothingToReconcile: the last pass finished within the interval.
var ErrNothingToReconcile = errors.New("last full reconciliation is recent")

// ReconcileFull walks every balance in (user_id, asset) order in chunks,
// each chunk on its own REPEATABLE READ snapshot, saving the cursor after
// each, until the pass is done, maxChunks chunks ran, or ctx ends. An
// unfinished pass is resumed; a new one starts only when the last one
// finished more than every ago (every = 0: start one now regardless).
func (db *DB) ReconcileFull(ctx context.Context, every time.Duration, chunk, maxChunks int) (ReconcilePass, error) {
	var pass ReconcilePass
	if chunk <= 0 {
		chunk = ReconcileChunkDefault
	}
	id, cursorUser, cursorAsset, resumed, err := db.openPass(ctx, every)
	if err != nil {
		return pass, err
	}
	pass.ID, pass.Resumed = id, resumed
	for n := 0; n < maxChunks && ctx.Err() == nil; n++ {
		found, lastUser, lastAsset, seen, err := db.reconcileChunk(ctx, cursorUser, cursorAsset, chunk)
		if err != nil {
			return pass, err
		}
		done := seen < chunk
		nextUser, nextAsset := cursorUser, cursorAsset
		if seen > 0 {
			nextUser, nextAsset = lastUser, lastAsset
		}
		sample := make([]string, 0, reconcileSampleMax)
		for i, m := range found {
			if i < reconcileSampleMax {
				sample = append(sample, m.String())
			}
		}
		stmt := q("reconcile_advance")
		err = db.pool.QueryRow(ctx, stmt.text, id, nextUser, nextAsset, seen, len(found), strings.Join(sample, "; "), done,
			cursorUser, cursorAsset).Scan(&pass.PassChecked, &pass.PassMismatches)
		if errors.Is(err, pgx.ErrNoRows) {
			// Another run recorded this chunk (or ended the pass): count
			// nothing of it and go on from where that run got to.
			pass.Overtaken++
			stmt = q("reconcile_pass")
			if err := db.pool.QueryRow(ctx, stmt.text, id).Scan(&cursorUser, &cursorAsset, &pass.PassChecked, &pass.PassMismatches, &pass.PassDone); err != nil {
				return pass, classify(stmt.name, err)
			}
			if pass.PassDone {
				return pass, nil
			}
			continue
		}
		if err != nil {
			return pass, classify(stmt.name, err)
		}
		cursorUser, cursorAsset = nextUser, nextAsset
		pass.Checked += int64(seen)
		pass.Mismatches += int64(len(found))
		pass.Found = append(pass.Found, found...)
		if done {
			pass.Finished, pass.PassDone = true, true
			return pass, nil
		}
	}
	return pass, ctx.Err()
}

// openPass resumes the open pass or starts a new one when it is due.
func (db *DB) openPass(ctx context.Context, every time.Duration) (int64, int64, string, bool, error) {
	tx, err := db.begin(ctx)
	if err != nil {
		return 0, 0, "", false, classify("reconcile open pass", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	stmt := q("reconcile_lock")
	if _, err := tx.Exec(ctx, stmt.text); err != nil {
		return 0, 0, "", false, classify(stmt.name, err)
	}
	var id, cursorUser, checked, mismatches int64
	var cursorAsset string
	var started time.Time
	stmt = q("reconcile_open_run")
	err = tx.QueryRow(ctx, stmt.text).Scan(&id, &cursorUser, &cursorAsset, &checked, &mismatches, &started)
	switch {
	case err == nil && every > 0:
		return id, cursorUser, cursorAsset, true, classify("reconcile open pass", tx.Commit(ctx))
	case err != nil && !errors.Is(err, pgx.ErrNoRows):
		return 0, 0, "", false, classify(stmt.name, err)
	}
	if every > 0 {
		stmt = q("reconcile_last_finished")
		var last time.Time
		if err := tx.QueryRow(ctx, stmt.text).Scan(&last); err != nil {
			return 0, 0, "", false, classify(stmt.name, err)
		}
		if time.Since(last) < every {
			return 0, 0, "", false, ErrNothingToReconcile
		}
	}
	stmt = q("reconcile_start")
	if err := tx.QueryRow(ctx, stmt.text).Scan(&id, &started); err != nil {
		return 0, 0, "", false, classify(stmt.name, err)
	}
	return id, 0, "", false, classify("reconcile open pass", tx.Commit(ctx))
}

func (db *DB) reconcileChunk(ctx context.Context, afterUser int64, afterAsset string, chunk int) ([]Mismatch, int64, string, int, error) {
	tx, err := db.pool.BeginTx(ctx, bounded(pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}))
	if err != nil {
		return nil, 0, "", 0, classify("reconcile chunk", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	stmt := q("reconcile_chunk")
	rows, err := tx.Query(ctx, stmt.text, afterUser, afterAsset, chunk)
	if err != nil {
		return nil, 0, "", 0, classify(stmt.name, err)
	}
	all, err := pgx.CollectRows(rows, scanMismatch)
	if err != nil {
		return nil, 0, "", 0, classify(stmt.name, err)
	}
	var bad []Mismatch
	for _, m := range all {
		if !m.Balance.Equal(m.Initial.Add(m.Journal)) {
			bad = append(bad, m)
		}
	}
	if len(all) == 0 {
		return nil, afterUser, afterAsset, 0, nil
	}
	last := all[len(all)-1]
	return bad, last.UserID, last.Asset, len(all), nil
}

// UnreportedMismatches are mismatches recorded in a full pass that no
// scheduler has counted or alerted on yet.
type UnreportedMismatches struct {
	Pass       int64
	Mismatches int64
	Sample     string // the first of these mismatches, whoever found them
}

// ReportMismatches hands report every pass's mismatches not reported yet
// and marks them reported, in one transaction, so each reaches one caller
// once whichever run recorded it (settlectl reconcile records without
// reporting). report runs before the COMMIT: a COMMIT that fails, or
// whose answer is lost, has them reported again by the next call rather
// than never.
func (db *DB) ReportMismatches(ctx context.Context, report func([]UnreportedMismatches)) error {
	tx, err := db.begin(ctx)
	if err != nil {
		return classify("reconcile report", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	stmt := q("reconcile_unreported")
	rows, err := tx.Query(ctx, stmt.text)
	if err != nil {
		return classify(stmt.name, err)
	}
	unreported, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (UnreportedMismatches, error) {
		var u UnreportedMismatches
		err := row.Scan(&u.Pass, &u.Mismatches, &u.Sample)
		return u, err
	})
	if err != nil {
		return classify(stmt.name, err)
	}
	if len(unreported) == 0 {
		return nil
	}
	ids := make([]int64, len(unreported))
	for i, u := range unreported {
		ids[i] = u.Pass
	}
	stmt = q("reconcile_mark_reported")
	if _, err := tx.Exec(ctx, stmt.text, ids); err != nil {
		return classify(stmt.name, err)
	}
	report(unreported)
	return classify("reconcile report", tx.Commit(ctx))
}
