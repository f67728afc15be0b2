package httpapi

import (
	"context"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/settle/settle/pkg/alchemy"
	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/payment"
)

// Every provider route's body limit (PROVIDER_BODY_MAX). One delivery
// carries a block's activity (for QuickNode's block_with_receipts the
// whole block), so it is allowed to be much larger than a payments
// webhook; the decoders' item bounds (alchemy.ActivitiesMax and the
// others) bound the work inside it, raised with the limit.
const (
	ProviderBodyMaxDefault = 4 << 20
	// ProviderBodyMaxFloor and ProviderBodyMaxCeiling bound the setting:
	// below 1 MiB a busy block's delivery never fits; above 256 MiB one
	// stranger's body is more memory than an api should reserve.
	ProviderBodyMaxFloor   = 1 << 20
	ProviderBodyMaxCeiling = 256 << 20
)

// providerItems scales a decoder's item bound (set for the default body
// limit) with the route's limit, so a raised limit is not refused by
// the item count instead.
func (s *Server) providerItems(base int) int {
	return max(base, int(int64(base)*s.providerBodyMax/ProviderBodyMaxDefault))
}

// webhookAlchemy turns an Address Activity delivery into deposit events.
// Unmatched activities are ignored and counted, and the answer is still
// 200 so the provider stops retrying; only an outage (503) asks for a
// redelivery, which is safe because every event id is derived from the
// transfer itself.
func (s *Server) webhookAlchemy(c echo.Context) error {
	body, err := s.readSigned(c, sourceAlchemy, s.providerBodyMax, func(r *http.Request, body []byte) bool {
		return alchemy.Verify(body, r.Header.Get(HeaderAlchemySignature), s.alchemyKeys...)
	})
	if err != nil {
		return err
	}
	payload, err := alchemy.DecodeWithin(body, s.providerItems(alchemy.ActivitiesMax))
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
