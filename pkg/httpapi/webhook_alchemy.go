package httpapi

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/settle/settle/pkg/alchemy"
	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// AlchemyBodyMax bounds an Alchemy delivery. One payload carries every
// activity of a block for the webhook's addresses, so it is allowed to be
// much larger than a payments webhook; alchemy.ActivitiesMax bounds the
// work inside it.
const AlchemyBodyMax = 4 << 20

// alchemyStoreTimeout bounds the storage work of one delivery, which may
// insert many events; it stays under the server's write timeout.
const alchemyStoreTimeout = 20 * time.Second

// Reasons an Alchemy activity is ignored after decoding (the decoder's
// own reasons are alchemy.Reason values).
const (
	reasonUnknownAddress    = "unknown_address"
	reasonConflict          = "conflict"
	reasonRemovedUnknown    = "removed_unknown"
	reasonRemovedNotDeposit = "removed_not_deposit"
	reasonRefused           = "refused_by_storage"
	reversalReason          = "alchemy reported the log as removed"
)

type alchemyAnswer struct {
	Status     string `json:"status"`
	Accepted   int    `json:"accepted"`
	Duplicates int    `json:"duplicates"`
	// Reopened counts duplicates of failed/reorged deposits sent back to
	// the ledger; Rechecked removed logs the chain decides about (with an
	// RPC), Reversed those the flag reversed (without one).
	Reopened  int    `json:"reopened"`
	Rechecked int    `json:"rechecked"`
	Reversed  int    `json:"reversed"`
	Ignored   int    `json:"ignored"`
	TraceID   string `json:"trace_id"`
}

// webhookAlchemy turns an Address Activity delivery into deposit events.
// Unmatched activities are ignored and counted, and the answer is still
// 200 so the provider stops retrying; only an outage (503) asks for a
// redelivery, which is safe because every event id is derived from the
// transfer itself.
func (s *Server) webhookAlchemy(c echo.Context) error {
	if len(s.alchemyKeys) == 0 {
		return newError(http.StatusNotFound, "not found")
	}
	body, err := s.readSigned(c, sourceAlchemy, AlchemyBodyMax, func(r *http.Request, body []byte) bool {
		return alchemy.Verify(body, r.Header.Get(HeaderAlchemySignature), s.alchemyKeys...)
	})
	if err != nil {
		return err
	}
	payload, err := alchemy.Decode(body)
	if err != nil {
		s.metrics.webhook(sourceAlchemy, outcomeRejected, "malformed_json")
		return &apiError{status: http.StatusBadRequest, message: "not an Alchemy webhook payload", cause: err}
	}
	log := logging.From(c.Request().Context())
	traceID := TraceID(c.Request().Context())

	ctx, cancel := context.WithTimeout(c.Request().Context(), alchemyStoreTimeout)
	defer cancel()
	registry, err := s.assets.get(ctx)
	if err != nil {
		return storeError(err)
	}
	transfers, ignored := alchemy.Transfers(payload, registry)
	answer := alchemyAnswer{Status: outcomeAccepted, Ignored: len(ignored), TraceID: traceID}
	for _, i := range ignored {
		s.metrics.webhook(sourceAlchemy, outcomeIgnored, string(i.Reason))
		if i.Reason == alchemy.ReasonAmountOutOfRange {
			// A real transfer we cannot represent: a human must look.
			log.Error().Str("webhook_event", payload.ID).Int("activity", i.Index).Msg("alchemy transfer amount is out of range; not credited")
		}
	}

	var recipients []string
	seen := map[string]bool{}
	for _, t := range transfers {
		if !t.Removed && !seen[t.ToAddress] {
			seen[t.ToAddress] = true
			recipients = append(recipients, t.ToAddress)
		}
	}
	owners := map[string]int64{}
	if len(recipients) > 0 {
		// The recipient's owner comes only from deposit_addresses on this
		// network: the provider knows addresses, never users.
		if owners, err = s.store.DepositAddressOwners(ctx, payload.Network, recipients); err != nil {
			return storeError(err)
		}
	}

	ignore := func(reason string) {
		answer.Ignored++
		s.metrics.webhook(sourceAlchemy, outcomeIgnored, reason)
	}
	for _, t := range transfers {
		if t.Removed {
			if err := s.alchemyRemoved(ctx, t, traceID, &answer, ignore); err != nil {
				return err
			}
			continue
		}
		user, ok := owners[t.ToAddress]
		if !ok {
			ignore(reasonUnknownAddress)
			continue
		}
		inserted, err := s.store.InsertEvent(ctx, postgres.NewEvent{
			Event: payment.Event{
				ID: t.EventID, Type: payment.Deposit, UserID: user, Asset: t.Asset.Code,
				Amount: t.Amount, TxHash: t.TxHash, TransferIndex: t.Index, TraceID: traceID,
			},
			Source:    postgres.SourceAlchemy,
			ToAddress: t.ToAddress,
		})
		switch {
		case errors.Is(err, payment.ErrConflict):
			// The same transfer reported with other content: never
			// overwrite a stored deposit; a human must look.
			ignore(reasonConflict)
			log.Error().Err(err).Str(logging.FieldEventID, t.EventID).Msg("alchemy transfer conflicts with the stored deposit")
		case errors.Is(err, payment.ErrInvalid):
			ignore(reasonRefused)
			log.Error().Err(err).Str(logging.FieldEventID, t.EventID).Msg("alchemy deposit refused by storage")
		case err != nil:
			return storeError(err)
		case inserted:
			answer.Accepted++
			s.metrics.webhook(sourceAlchemy, outcomeAccepted, "")
			log.Info().Str(logging.FieldEventID, t.EventID).Int64(logging.FieldUserID, user).
				Str("asset", t.Asset.Code).Msg("alchemy deposit")
		default:
			if err := s.alchemyAgain(ctx, t, &answer); err != nil {
				return err
			}
		}
	}
	return c.JSON(http.StatusOK, answer)
}
