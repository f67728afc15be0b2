package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/labstack/echo/v4"
	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/alchemy"
	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/money"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// Limits of POST /webhook/payments (CONTRACT.md).
const (
	PaymentsBodyMax        = 65_536
	eventIDLengthMax       = 200
	assetDefault           = "ETH"
	HeaderSignature        = "X-Signature"
	HeaderAlchemySignature = "X-Alchemy-Signature"
)

// reservedEventIDPrefixes name events settle derives itself; a caller may
// not use them, or it could occupy the id of a future compensation, the
// credit giving one back, or an Alchemy deposit.
var reservedEventIDPrefixes = []string{"reorg:", payment.ReturnEventIDPrefix, alchemy.LegacyEventIDPrefix, payment.TransferEventIDPrefix}

// reasonInvalidAmount labels a rejected amount that is no JSON string.
const reasonInvalidAmount = "invalid_amount"

// rejection is a 400 with the reason it is counted under.
type rejection struct {
	reason  string
	message string
}

type paymentRequest struct {
	eventID   string
	eventType payment.EventType
	userID    int64
	amount    string
	asset     string
	txHash    string
	// transferIndex names the transfer of txHash a deposit claims;
	// transferIndexSent is it as the sender wrote it.
	transferIndex, transferIndexSent string
	// holdID is the hold a post or void resolves; network and toAddress
	// (lowercase) say where a hold pays out. amountGiven is false when a
	// post or void left its amount out (the hold's is taken).
	holdID      string
	network     string
	toAddress   string
	amountGiven bool
	assetGiven  bool
}

type webhookAnswer struct {
	Status  string `json:"status"`
	EventID string `json:"event_id"`
	TraceID string `json:"trace_id"`
}

// webhookPayments stores a signed event in the outbox as pending. The
// insert wakes the enqueuer itself (pg_notify in the same statement), so
// this handler never talks to the queue: once it answers 200 the event is
// committed, and before that nothing of it exists.
func (s *Server) webhookPayments(c echo.Context) error {
	// The signature covers the raw bytes and is checked before anything
	// reads them.
	body, err := s.readSigned(c, sourcePayments, PaymentsBodyMax, s.verifyPayments)
	if err != nil {
		return err
	}
	req, rejected := parsePayment(body)
	if rejected != nil {
		s.metrics.webhook(sourcePayments, outcomeRejected, rejected.reason)
		if rejected.reason == reasonInvalidAmount {
			// An amount that is no JSON string is an invalid amount, as
			// the contract's codes say, not just malformed input.
			return fail(payment.ErrBadAmount, rejected.message)
		}
		return newError(http.StatusBadRequest, rejected.message)
	}

	ctx, cancel := storeContext(c)
	defer cancel()
	var hold *postgres.HoldEvent
	unknownHold := false
	sent := req // before its hold fills it in
	if req.eventType.ResolvesHold() {
		h, found, answer := s.holdOf(ctx, &req)
		if answer != nil {
			s.metrics.webhook(sourcePayments, outcomeRejected, reasonOf(answer))
			return answer
		}
		if found {
			hold = &h
		}
		// An unknown hold's post or void is stored with amount 0 whatever
		// amount it gave: the ledger's mark that its hold id named no hold
		// when it was accepted, so a hold of that id arriving later is
		// never resolved by it.
		unknownHold = !found
	}
	if req.network == "" {
		req.network = payment.DefaultNetwork // an unknown hold's post or void
	}
	// A void of a stored hold, or its post naming no transaction, asks no
	// chain: the hold's network may have left NETWORKS since, and the
	// funds it reserves must still be released or paid. Nor does a post
	// or void naming no hold, whose network is only a placeholder.
	asksNoChain := unknownHold || hold != nil && (req.eventType == payment.WithdrawalVoid || req.txHash == "")
	if !s.networkEnabled(req.network) && !asksNoChain {
		s.metrics.webhook(sourcePayments, outcomeRejected, CodeInvalidRequest)
		return newError(http.StatusBadRequest, "network "+req.network+" is not enabled here (NETWORKS)")
	}
	registry, err := s.assets.get(ctx)
	if err == nil {
		if _, known := registry.Listing(req.network, req.asset); !known {
			registry, err = s.assets.refreshForMiss(ctx)
		}
	}
	if err != nil {
		answer := storeError(err)
		s.metrics.webhook(sourcePayments, outcomeRejected, reasonOf(answer))
		return answer
	}
	var asset payment.Asset
	var amount, given decimal.Decimal
	if unknownHold {
		switch {
		case !registry.Known(req.asset):
			err = fmt.Errorf("%w %q", payment.ErrUnknownAsset, req.asset)
		case req.amountGiven:
			// Still an amount the asset could carry, or a 400 as ever.
			_, given, err = registry.ParseAmount(req.network, req.asset, req.amount)
		}
		asset = payment.Asset{Code: req.asset, Network: req.network}
	} else {
		// Precision is the network's own for the asset.
		asset, amount, err = registry.ParseAmount(req.network, req.asset, req.amount)
	}
	switch {
	case errors.Is(err, payment.ErrUnknownAsset) && registry.Known(req.asset):
		s.metrics.webhook(sourcePayments, outcomeRejected, CodeUnknownAsset)
		return fail(err, "asset "+req.asset+" is not listed on network "+req.network)
	case errors.Is(err, payment.ErrUnknownAsset):
		s.metrics.webhook(sourcePayments, outcomeRejected, CodeUnknownAsset)
		return fail(err, "")
	case err != nil:
		s.metrics.webhook(sourcePayments, outcomeRejected, CodeInvalidAmount)
		return fail(err, "invalid amount: "+amountProblem(err))
	}
	if hold != nil {
		if err := checkHoldAmount(req, *hold, amount); err != nil {
			s.metrics.webhook(sourcePayments, outcomeRejected, CodeInvalidAmount)
			return fail(payment.ErrBadAmount, "invalid amount: "+err.Error())
		}
		amount = hold.Amount
	}

	traceID := TraceID(c.Request().Context())
	event := payment.Event{
		ID: req.eventID, Type: req.eventType, UserID: req.userID,
		Asset: asset.Code, Amount: amount, TxHash: req.txHash, TransferIndex: req.transferIndex, TraceID: traceID,
		HoldID: req.holdID, Network: req.network, ToAddress: req.toAddress,
	}
	stored := postgres.NewEvent{Event: event, Source: postgres.SourcePayments, SentAs: contentAsSent(sent, event, hold != nil, registry)}
	if unknownHold && req.amountGiven {
		// Its content keeps the amount it gave, so the same id with
		// another amount is a conflict; one stored before it did is
		// still this delivery.
		var before []byte
		stored.Hash, before = givenAmountHashes(event.Content(), given)
		stored.SentAs = append(stored.SentAs, before)
	}
	inserted, err := s.store.InsertEvent(ctx, stored)
	if err != nil {
		answer := storeError(err)
		switch answer.status {
		case http.StatusConflict:
			s.metrics.webhook(sourcePayments, outcomeConflict, "")
			answer.message = "event_id was delivered before with different content"
		case http.StatusServiceUnavailable:
			s.metrics.webhook(sourcePayments, outcomeRejected, "unavailable")
		default:
			s.metrics.webhook(sourcePayments, outcomeRejected, reasonOf(answer))
		}
		return answer
	}
	status := outcomeAccepted
	if !inserted {
		status = outcomeDuplicate
	}
	s.metrics.webhook(sourcePayments, status, "")
	logging.From(c.Request().Context()).Info().Str(logging.FieldEventID, req.eventID).
		Str("event_type", string(req.eventType)).Int64(logging.FieldUserID, req.userID).
		Str("asset", asset.Code).Str("result", status).Msg("payment webhook")
	return c.JSON(http.StatusOK, webhookAnswer{Status: status, EventID: req.eventID, TraceID: traceID})
}

// contentAsSent are the content hashes of an event as its sender wrote
// it, where settle stores it otherwise; nil where it does not. A post or void
// that arrived before its hold was stored as sent (asset as given or
// ETH, the default network, amount 0, no recipient) and its
// redelivery, once the hold exists, is filled in from the hold. A
// transfer index stored before its spelling was canonical was stored as
// sent too. Both are the same delivery, so both hashes answer it.
func contentAsSent(sent paymentRequest, stored payment.Event, filled bool, registry *payment.Registry) [][]byte {
	if !filled && sent.transferIndexSent == stored.TransferIndex {
		return nil
	}
	c := stored.Content()
	c.TransferIndex = sent.transferIndexSent
	if !filled {
		return [][]byte{c.Hash()}
	}
	// Stored before its hold: amount 0, with the amount it gave in its
	// content (or, stored before that counted, without).
	c.Asset, c.Network, c.ToAddress, c.Amount = sent.asset, payment.DefaultNetwork, "", decimal.Zero
	if !sent.amountGiven {
		return [][]byte{c.Hash()}
	}
	_, given, err := registry.ParseAmount(payment.DefaultNetwork, sent.asset, sent.amount)
	if err != nil {
		return nil // refused as sent: nothing was stored so
	}
	hash, before := givenAmountHashes(c, given)
	return [][]byte{hash, before}
}

// givenAmountHashes are the hashes of a post or void of an unknown hold
// that gave an amount: its content with that amount, as stored, and with
// amount 0, as stored before the amount it gave counted.
func givenAmountHashes(c payment.Content, given decimal.Decimal) (stored, before []byte) {
	c.Amount = decimal.Zero
	before = c.Hash()
	c.Amount = given
	return c.Hash(), before
}

// verifyPayments checks X-Signature (or X-Alchemy-Signature).
func (s *Server) verifyPayments(r *http.Request, body []byte) bool {
	signature := r.Header.Get(HeaderSignature)
	if signature == "" {
		signature = r.Header.Get(HeaderAlchemySignature)
	}
	return alchemy.Verify(body, signature, s.webhookSecret)
}

// amountProblem says what is wrong with an amount in the caller's terms,
// without echoing the amount back.
func amountProblem(err error) string {
	switch {
	case errors.Is(err, money.ErrPrecision):
		return "more fractional digits than the asset allows"
	case errors.Is(err, money.ErrNotPositive):
		return "must be greater than zero"
	case errors.Is(err, money.ErrTooLarge):
		return "must be below 10^20"
	}
	return "not a plain decimal string"
}

// parsePayment checks the body field by field; every refusal is a 400
// that says which field is wrong.
func parsePayment(body []byte) (paymentRequest, *rejection) {
	fields, err := decodeObject(body)
	if err != nil {
		return paymentRequest{}, &rejection{"malformed_json", "malformed JSON: " + err.Error()}
	}
	var req paymentRequest

	raw, ok := fields["event_id"]
	if !ok {
		return req, &rejection{"missing_field", "event_id is required"}
	}
	if req.eventID, ok = jsonString(raw); !ok {
		return req, &rejection{"invalid_event_id", "event_id must be a string"}
	}
	if n := utf8.RuneCountInString(req.eventID); n < 1 || n > eventIDLengthMax || !printable(req.eventID) {
		return req, &rejection{"invalid_event_id", "event_id must be 1 to 200 printable characters"}
	}
	for _, prefix := range reservedEventIDPrefixes {
		if strings.HasPrefix(req.eventID, prefix) {
			return req, &rejection{"invalid_event_id", "event_id may not start with " + prefix + " (reserved for settle's own events)"}
		}
	}

	if raw, ok = fields["event_type"]; !ok {
		return req, &rejection{"missing_field", "event_type is required"}
	}
	typeName, ok := jsonString(raw)
	if !ok {
		return req, &rejection{"invalid_event_type", "event_type must be a string"}
	}
	if req.eventType, ok = payment.ParseWebhookEventType(typeName); !ok {
		return req, &rejection{"invalid_event_type", "event_type must be one of deposit, airdrop, withdrawal, withdrawal_fee, withdrawal_hold, withdrawal_post, withdrawal_void"}
	}

	if raw, ok = fields["user_id"]; !ok {
		return req, &rejection{"missing_field", "user_id is required"}
	}
	if req.userID, ok = jsonPositiveInteger(raw); !ok {
		return req, &rejection{"invalid_user_id", "user_id must be a JSON integer above zero"}
	}

	// A post or void may leave its amount out: it is its hold's.
	raw, ok = fields["amount"]
	if ok && req.eventType.ResolvesHold() && isJSONNull(raw) {
		ok = false
	}
	switch {
	case !ok && !req.eventType.ResolvesHold():
		return req, &rejection{"missing_field", "amount is required"}
	case ok:
		if req.amount, ok = jsonString(raw); !ok {
			// A JSON number would have to pass through a float somewhere;
			// amounts travel as strings only.
			return req, &rejection{reasonInvalidAmount, "amount must be a JSON string holding a decimal, not a number"}
		}
		req.amountGiven = true
	}

	req.asset = assetDefault
	if raw, ok = fields["asset"]; ok && !isJSONNull(raw) {
		if req.asset, ok = jsonString(raw); !ok {
			return req, &rejection{"invalid_asset", "asset must be a string"}
		}
		req.assetGiven = true
	}

	if raw, ok = fields["tx_hash"]; ok && !isJSONNull(raw) {
		hash, ok := jsonString(raw)
		if !ok {
			return req, &rejection{"invalid_tx_hash", "tx_hash must be a string"}
		}
		if req.txHash, ok = alchemy.NormalizeTxHash(hash); !ok {
			return req, &rejection{"invalid_tx_hash", "tx_hash must be 0x followed by 64 hex digits"}
		}
	}

	if raw, ok = fields["transfer_index"]; ok && !isJSONNull(raw) {
		index, ok := jsonString(raw)
		if !ok {
			return req, &rejection{"invalid_transfer_index", "transfer_index must be a string"}
		}
		if req.txHash == "" || !req.eventType.Credit() {
			return req, &rejection{"invalid_transfer_index", "transfer_index names a transfer of tx_hash; only a deposit or airdrop with a tx_hash may have one"}
		}
		var err error
		req.transferIndexSent = index
		if req.transferIndex, err = payment.ParseTransferIndex(index); err != nil {
			return req, &rejection{"invalid_transfer_index", "transfer_index must be a decimal log index, \"native\" or \"trace:<address>\""}
		}
	}
	if rejected := parseHoldFields(fields, &req); rejected != nil {
		return req, rejected
	}
	return req, nil
}
