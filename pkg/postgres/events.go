package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/tracing"
)

// insertRaceRetries bounds re-running the insert when a concurrent
// delivery of the same event committed between our snapshot and our
// insert (seen as "nothing inserted, nothing found").
const insertRaceRetries = 3

// Source names where an event came from.
type Source string

const (
	SourcePayments Source = "payments"
	SourceAlchemy  Source = "alchemy"
	SourceReorg    Source = "reorg"
)

// NewEvent is an accepted, validated event about to enter the outbox.
type NewEvent struct {
	Event     payment.Event
	Source    Source
	ToAddress string // lowercase; set for chain deposits whose recipient is known
	Related   string // the original of a compensation
	// SentAs are content hashes of the event as its sender wrote it,
	// when settle stores it otherwise (a post or void filled in from its
	// hold, a transfer index respelt): a row stored under one earlier, as
	// sent, is the same delivery, not a conflict. Nil: none.
	SentAs [][]byte
	// Hash is the content hash to store when it is not the event's own:
	// a post or void of an unknown hold is stored with amount 0 (the
	// ledger's mark) but its content keeps the amount it gave. Nil: the
	// event's own.
	Hash []byte
	// Block is the block a scanner pass found the transfer in: a rescan
	// job keeps its id only while a restart can read that block again.
	Block uint64
}

// sameContent tells whether the content stored under the event's id is
// this delivery's: its hash, or a hash of it as sent.
func (e NewEvent) sameContent(stored, hash []byte) bool {
	same := func(h []byte) bool { return bytes.Equal(stored, h) }
	return same(hash) || slices.ContainsFunc(e.SentAs, same)
}

// contentHash is the content hash stored for the event.
func (e NewEvent) contentHash() []byte {
	if e.Hash != nil {
		return e.Hash
	}
	return e.Event.Content().Hash()
}

// recipient is the stored to_address: the deposit's recipient the
// provider named, or where a hold (or its post) pays out.
func (e NewEvent) recipient() string {
	if e.ToAddress != "" {
		return e.ToAddress
	}
	return e.Event.ToAddress
}

// InsertEvent commits the event as pending and wakes the enqueuer in the
// same statement. It reports false for a redelivery with identical
// content, payment.ErrConflict for the same id with other content, and
// payment.ErrUnknownUser or ErrUnknownAsset when those do not exist.
func (db *DB) InsertEvent(ctx context.Context, e NewEvent) (inserted bool, err error) {
	ctx, span := startIngestSpan(ctx, e)
	defer func() { endIngestSpan(span, inserted, err) }()
	return insertEvent(ctx, db.pool, e)
}

func insertEvent(ctx context.Context, qr querier, e NewEvent) (bool, error) {
	ev := e.Event
	if e.Source == "" {
		e.Source = SourcePayments
	}
	hash := e.contentHash()
	stmt := q("insert_event")
	for range insertRaceRetries {
		var inserted int64
		var existing []byte
		var userExists, assetExists bool
		err := qr.QueryRow(ctx, stmt.text, ev.ID, string(ev.Type), ev.UserID, ev.Asset, ev.Amount.String(),
			nullable(ev.TxHash), hash, ev.TraceID, string(e.Source), nullable(e.recipient()), nullable(e.Related), nullable(ev.TransferIndex),
			nullable(ev.HoldID), nullable(ev.Network), nullable(tracing.Traceparent(ctx))).
			Scan(&inserted, &existing, &userExists, &assetExists)
		if err != nil {
			return false, classify(stmt.name, err)
		}
		switch {
		case inserted == 1:
			return true, nil
		case existing != nil && e.sameContent(existing, hash):
			return false, nil
		case existing != nil:
			return false, fmt.Errorf("event %s: %w: it was delivered before with other content", ev.ID, payment.ErrConflict)
		case !userExists:
			return false, fmt.Errorf("%w %d", payment.ErrUnknownUser, ev.UserID)
		case !assetExists:
			return false, fmt.Errorf("%w %q", payment.ErrUnknownAsset, ev.Asset)
		}
	}
	return false, payment.Retryable(stmt.name, errors.New("concurrent delivery of the same event kept racing"))
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// EventView is an event as the API shows it.
type EventView struct {
	ID          string
	Type        payment.EventType
	UserID      int64
	Asset       string
	Amount      decimal.Decimal
	Status      payment.Status
	RetryCount  int
	Generation  int
	TxHash      string
	TraceID     string
	Source      string
	Related     string
	Outcome     string
	Error       string
	ChainState  string
	BlockNumber *int64
	NextCheckAt *time.Time
	CheckCount  int
	CreatedAt   time.Time
	UpdatedAt   time.Time
}

// Event reads one event; payment.ErrNotFound if there is none.
func (db *DB) Event(ctx context.Context, id string) (EventView, error) {
	stmt := q("get_event")
	var scan eventScan
	err := db.pool.QueryRow(ctx, stmt.text, id).Scan(scan.dest()...)
	if errors.Is(err, pgx.ErrNoRows) {
		return EventView{}, fmt.Errorf("event %s: %w", id, payment.ErrNotFound)
	}
	if err != nil {
		return EventView{}, classify(stmt.name, err)
	}
	return scan.view(), nil
}

// eventScan receives get_event's columns, in its order; the page queries
// (pages.sql) select the same ones.
type eventScan struct {
	v                         EventView
	eventType, status, amount string
}

func (s *eventScan) dest() []any {
	v := &s.v
	return []any{&v.ID, &s.eventType, &v.UserID, &v.Asset, &s.amount, &s.status,
		&v.RetryCount, &v.Generation, &v.TxHash, &v.TraceID, &v.Source, &v.Related, &v.Outcome, &v.Error,
		&v.ChainState, &v.BlockNumber, &v.NextCheckAt, &v.CheckCount, &v.CreatedAt, &v.UpdatedAt}
}

func (s *eventScan) view() EventView {
	v := s.v
	v.Type, v.Status, v.Amount = payment.EventType(s.eventType), payment.Status(s.status), decimal.RequireFromString(s.amount)
	return v
}
