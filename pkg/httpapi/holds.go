package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/labstack/echo/v4"
	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

var (
	addressPattern = regexp.MustCompile(`^0x[0-9a-fA-F]{40}$`)
	networkPattern = regexp.MustCompile(`^[A-Z][A-Z0-9_]{0,63}$`)
)

// parseHoldFields reads the network (default ETH_MAINNET but for a post
// or void, whose hold says it), the optional to_address of a hold, post
// or void, and a post's or void's hold_id, which only they take. A post
// or void may repeat its hold's asset, network and to_address, and holdOf
// refuses one that says otherwise, so a sender's mistake is not silently
// dropped.
func parseHoldFields(fields map[string]json.RawMessage, req *paymentRequest) *rejection {
	raw, present := fields["hold_id"]
	present = present && !isJSONNull(raw)
	switch {
	case present && !req.eventType.ResolvesHold():
		return &rejection{"invalid_hold_id", "hold_id is taken only by withdrawal_post and withdrawal_void"}
	case !present && req.eventType.ResolvesHold():
		return &rejection{"missing_field", "hold_id is required"}
	case present:
		id, ok := jsonString(raw)
		if !ok || utf8.RuneCountInString(id) < 1 || utf8.RuneCountInString(id) > eventIDLengthMax || !printable(id) {
			return &rejection{"invalid_hold_id", "hold_id must be a string of 1 to 200 printable characters"}
		}
		req.holdID = id
	}
	if req.txHash != "" && (req.eventType == payment.WithdrawalHold || req.eventType == payment.WithdrawalVoid) {
		return &rejection{"invalid_tx_hash", "tx_hash is taken by withdrawal_post, not by " + string(req.eventType)}
	}
	if !req.eventType.ResolvesHold() {
		req.network = payment.DefaultNetwork
	}
	if raw, ok := fields["network"]; ok && !isJSONNull(raw) {
		network, ok := jsonString(raw)
		if !ok || !networkPattern.MatchString(network) {
			return &rejection{"invalid_network", "network must be a network name such as ETH_MAINNET"}
		}
		req.network = network
	}
	if req.eventType != payment.WithdrawalHold && !req.eventType.ResolvesHold() {
		return nil
	}
	if raw, ok := fields["to_address"]; ok && !isJSONNull(raw) {
		address, ok := jsonString(raw)
		if !ok || !addressPattern.MatchString(address) {
			return &rejection{"invalid_to_address", "to_address must be 0x followed by 40 hex digits"}
		}
		req.toAddress = strings.ToLower(address)
	}
	return nil
}

// errUnknownHold: a post or void names a hold_id no withdrawal_hold was
// ever accepted under. (A hold of another user, or one refused for
// insufficient funds, is accepted and ends failed/unknown_hold.)
// holdOf reads the hold a post or void names, and fills in what the event
// takes from it: asset, network, recipient, and the amount when none was
// given. The read is by primary key, before the insert.
//
// A hold id that names no hold is not refused: the post or void is stored
// as its sender wrote it (with amount 0 when it gave none) and ends failed
// with outcome unknown_hold, like a post of another user's hold, so the
// sender learns nothing about which ids exist. found is false then.
func (s *Server) holdOf(ctx context.Context, req *paymentRequest) (_ postgres.HoldEvent, found bool, _ *apiError) {
	h, found, err := s.store.HoldEventOf(ctx, req.holdID)
	if err != nil {
		return postgres.HoldEvent{}, false, storeError(err)
	}
	if !found {
		// Its network is a placeholder, and it pays out nowhere.
		req.network, req.toAddress = "", ""
		return postgres.HoldEvent{}, false, nil
	}
	if field := unlikeHold(*req, h); field != "" && h.UserID == req.userID {
		// Only the owner is told, as for the amount.
		return postgres.HoldEvent{}, false, newError(http.StatusBadRequest, field+" must be the hold's (or be left out)")
	}
	req.asset, req.network, req.toAddress = h.Asset, h.Network, h.ToAddress
	if !req.amountGiven {
		req.amount = h.Amount.String()
	}
	return h, true, nil
}

// unlikeHold names the first field a post or void gave that differs
// from its hold's, or "".
func unlikeHold(req paymentRequest, h postgres.HoldEvent) string {
	switch {
	case req.assetGiven && req.asset != h.Asset:
		return "asset"
	case req.network != "" && req.network != h.Network:
		return "network"
	case req.toAddress != "" && req.toAddress != h.ToAddress:
		return "to_address"
	}
	return ""
}

// checkHoldAmount: an amount given on a post or void must equal its
// hold's. Only the owner is told; another user's post ends unknown_hold
// and learns nothing of the hold.
func checkHoldAmount(req paymentRequest, h postgres.HoldEvent, amount decimal.Decimal) error {
	if req.amountGiven && h.UserID == req.userID && !amount.Equal(h.Amount) {
		return errHoldAmount
	}
	return nil
}

var errHoldAmount = errors.New("amount must equal the hold's amount (or be left out)")

// hold answers GET /v1/holds/{hold_id}.
func (s *Server) hold(c echo.Context) error {
	id := unescapeParam(c, c.Param("hold_id"))
	if id == "" || !utf8.ValidString(id) || !printable(id) || utf8.RuneCountInString(id) > storedEventIDLengthMax {
		return newError(http.StatusNotFound, "not found")
	}
	ctx, cancel := storeContext(c)
	defer cancel()
	h, err := s.store.Hold(ctx, id)
	if err != nil {
		return storeError(err)
	}
	return c.JSON(http.StatusOK, h.View())
}
