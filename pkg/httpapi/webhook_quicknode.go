package httpapi

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/settle/settle/pkg/intake"
	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/quicknode"
)

// Headers of a QuickNode Streams delivery.
const (
	HeaderQuickNodeSignature = "X-QN-Signature"
	HeaderQuickNodeNonce     = "X-QN-Nonce"
	HeaderQuickNodeTimestamp = "X-QN-Timestamp"
)

// errUnsupportedEncoding: a Content-Encoding other than gzip.
var errUnsupportedEncoding = errors.New("unsupported Content-Encoding")

// webhookQuickNode turns a Streams delivery (block_with_receipts,
// receipts or logs) into deposit events, like webhookAlchemy: verified
// first (over the uncompressed body, with a replay window), then decoded,
// then handed to the intake.
func (s *Server) webhookQuickNode(c echo.Context) error {
	stale := false
	body, err := s.readSignedDecoded(c, sourceQuickNode, s.providerBodyMax, gunzip, func(r *http.Request, body []byte) bool {
		timestamp := r.Header.Get(HeaderQuickNodeTimestamp)
		if !quicknode.Verify(r.Header.Get(HeaderQuickNodeNonce), timestamp, body, r.Header.Get(HeaderQuickNodeSignature), s.quickNodeTokens...) {
			return false
		}
		// Checked after the signature, so only QuickNode learns that a
		// signed delivery came too late.
		stale = !quicknode.Fresh(timestamp, s.now(), s.webhookMaxAge)
		return !stale
	})
	if err != nil {
		if stale {
			// Counted as a signature failure by readSigned.
			return fail(errSignature, "signature timestamp outside WEBHOOK_MAX_AGE")
		}
		return err
	}
	// An exact replay of a delivery handled already acts on nothing.
	r := c.Request()
	// Keyed by the bytes the signature covers, as it covers them (nonce
	// and timestamp run together): however a delivery's headers split
	// them, one signed message is one delivery.
	key := replayKey(sourceQuickNode, []byte(r.Header.Get(HeaderQuickNodeNonce)+r.Header.Get(HeaderQuickNodeTimestamp)), body)
	claim, state, err := s.quickNodeReplays.claimWaiting(r.Context(), key)
	switch {
	case err != nil:
		answer := newError(http.StatusServiceUnavailable, "cannot check the delivery for a replay, retry later")
		answer.cause = err
		return answer
	case state == replaySeen:
		s.metrics.webhook(sourceQuickNode, outcomeDuplicate, "replay")
		logging.From(r.Context()).Info().Msg("quicknode delivery replayed (same nonce, timestamp and body); only its new transfers are stored")
		return s.handleQuickNode(c, body, true)
	case state == replayInFlight:
		s.metrics.webhook(sourceQuickNode, outcomeRejected, "replay_in_flight")
		answer := newError(http.StatusServiceUnavailable, "the same delivery is being handled, retry later")
		answer.retryAfter = retryAfterBusy
		return answer
	}
	err = s.handleQuickNode(c, body, false)
	s.quickNodeReplays.settle(r.Context(), claim, err == nil && c.Response().Status < http.StatusMultipleChoices)
	return err
}

// replayAnswer is the answer to an exact replay, marked as one.
type replayAnswer struct {
	intake.Answer
	Replay bool `json:"replay,omitempty"`
}

// handleQuickNode decodes a verified delivery and hands it to the
// intake; replay: an exact copy of one handled already (intake's Replay).
func (s *Server) handleQuickNode(c echo.Context, body []byte, replay bool) error {
	payload, err := quicknode.DecodeWithin(body, s.providerItems(quicknode.ItemsMax))
	if err != nil {
		s.metrics.webhook(sourceQuickNode, outcomeRejected, "malformed_json")
		return &apiError{status: http.StatusBadRequest, message: "not a QuickNode Streams delivery", cause: err}
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), providerStoreTimeout)
	defer cancel()
	transfers, ignored, err := s.providerTransfers(ctx, func(r *payment.Registry) ([]payment.ReportedTransfer, []payment.Ignored) {
		return quicknode.Transfers(payload, r)
	})
	if err != nil {
		return storeError(err)
	}
	run := s.startIntake(c, providerQuickNode)
	if replay {
		run.Replay()
	}
	for _, i := range ignored {
		run.Ignore(i.Reason)
		switch i.Reason {
		case payment.IgnoreAmountOutOfRange:
			logging.From(ctx).Error().Int("candidate", i.Index).Msg("quicknode transfer amount is out of range; not credited")
		case payment.IgnoreUnknownNetwork:
			name, _ := quicknode.Network(payload.StreamNetwork)
			logging.From(ctx).Warn().Str("stream_network", payload.StreamNetwork).Str("network", name).
				Msg("quicknode stream on a network settle does not list (settlectl networks add, under the name logged); not credited")
		}
	}
	if !replay {
		return storeTransfers(ctx, c, run, transfers)
	}
	if err := run.Store(ctx, transfers); err != nil {
		return storeError(err)
	}
	return c.JSON(http.StatusOK, replayAnswer{Answer: run.Answer(), Replay: true})
}

// gunzip decodes a gzip body (QuickNode signs the uncompressed bytes).
// The output is read through a LimitReader into a buffer that grows with
// what decompresses, so a bomb costs at most limit+1 bytes before it is
// refused with errBodyTooLarge; each growth is reserved first through
// grow, so a small delivery holds a small share of the unverified budget.
func gunzip(r *http.Request, wire []byte, limit int64, grow func(n int64) bool) ([]byte, error) {
	switch encoding := strings.ToLower(strings.TrimSpace(r.Header.Get(echo.HeaderContentEncoding))); encoding {
	case "", "identity":
		return wire, nil
	case "gzip", "x-gzip":
	default:
		return nil, errUnsupportedEncoding
	}
	zr, err := gzip.NewReader(bytes.NewReader(wire))
	if err != nil {
		return nil, err
	}
	defer func() { _ = zr.Close() }()
	return readLimitedGrowing(io.LimitReader(zr, limit+1), limit, -1, grow)
}
