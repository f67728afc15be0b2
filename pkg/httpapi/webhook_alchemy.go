package httpapi

import (
	"context"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/settle/settle/pkg/alchemy"
	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/payment"
)

// AlchemyBodyMax bounds an Alchemy delivery. One payload carries every
// activity of a block for the webhook's addresses, so it is allowed to be
// much larger than a payments webhook; alchemy.ActivitiesMax bounds the
// work inside it. Every provider route has this limit.
const AlchemyBodyMax = 4 << 20

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
	ctx, cancel := context.WithTimeout(c.Request().Context(), providerStoreTimeout)
	defer cancel()
	transfers, ignored, err := s.providerTransfers(ctx, func(r *payment.Registry) ([]payment.ReportedTransfer, []payment.Ignored) {
		return alchemy.Transfers(payload, r)
	})
	if err != nil {
		return storeError(err)
	}
	run := s.startIntake(c, providerAlchemy)
	for _, i := range ignored {
		run.Ignore(i.Reason)
		if i.Reason == payment.IgnoreAmountOutOfRange {
			// A real transfer we cannot represent: a human must look.
			logging.From(ctx).Error().Str("webhook_event", payload.ID).Int("activity", i.Index).Msg("alchemy transfer amount is out of range; not credited")
		}
	}
	return storeTransfers(ctx, c, run, transfers)
}
