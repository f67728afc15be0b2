package httpapi

import (
	"context"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/moralis"
	"github.com/settle/settle/pkg/payment"
)

// HeaderMoralisSignature carries "0x" + the Keccak-256 of
// JSON.stringify(body) + MORALIS_STREAM_SECRET.
const HeaderMoralisSignature = "X-Signature"

// webhookMoralis turns a Streams delivery into deposit events. Moralis
// sends each block unconfirmed and confirmed, in either order: both name
// the same transfers, so they are one event each (the second a
// duplicate), and the network's finality policy, not the flag, decides
// the credit. The test delivery of a new stream is answered 200.
func (s *Server) webhookMoralis(c echo.Context) error {
	body, err := s.readSigned(c, sourceMoralis, s.providerBodyMax, func(r *http.Request, body []byte) bool {
		return moralis.Verify(body, r.Header.Get(HeaderMoralisSignature), s.moralisSecrets...)
	})
	if err != nil {
		return err
	}
	payload, err := moralis.DecodeWithin(body, s.providerItems(moralis.ItemsMax))
	if err != nil {
		s.metrics.webhook(sourceMoralis, outcomeRejected, "malformed_json")
		return &apiError{status: http.StatusBadRequest, message: "not a Moralis Streams delivery", cause: err}
	}
	run := s.startIntake(c, providerMoralis)
	if payload.Test {
		logging.From(c.Request().Context()).Info().Str("stream", payload.StreamID).Msg("moralis test delivery")
		return c.JSON(http.StatusOK, run.Answer())
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), providerStoreTimeout)
	defer cancel()
	transfers, ignored, err := s.providerTransfers(ctx, func(r *payment.Registry) ([]payment.ReportedTransfer, []payment.Ignored) {
		return moralis.Transfers(payload, r, registryChains{r})
	})
	if err != nil {
		return storeError(err)
	}
	for _, i := range ignored {
		run.Ignore(i.Reason)
		switch i.Reason {
		case payment.IgnoreAmountOutOfRange:
			logging.From(ctx).Error().Int("candidate", i.Index).Msg("moralis transfer amount is out of range; not credited")
		case payment.IgnoreUnknownNetwork:
			logging.From(ctx).Warn().Int64("chain_id", payload.ChainID).Msg("moralis stream on a chain settle does not map; not credited")
		}
	}
	return storeTransfers(ctx, c, run, transfers)
}

// registryChains names a chain id's network from the networks table, as
// the registry read it (REGISTRY_REFRESH).
type registryChains struct{ registry *payment.Registry }

func (c registryChains) NetworkOf(id int64) (string, bool) {
	n, ok := c.registry.NetworkByChainID(id)
	return n.Name, ok
}
