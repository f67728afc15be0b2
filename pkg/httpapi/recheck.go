package httpapi

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

const (
	// recheckTimeout bounds a recheck: a few RPC calls (each under
	// ETH_RPC_TIMEOUT) and two short transactions, under the server's
	// write timeout.
	recheckTimeout = 20 * time.Second
	// operatorLengthMax bounds the name a caller gives for the record.
	operatorLengthMax = payment.OperatorLengthMax
	// operatorDefault names a caller who gives no name.
	operatorDefault = "admin-api"
)

// Chain asks the chain again about failed deposits
// (*finality.Rechecker); nil when the api has no RPC on any network.
type Chain interface {
	Recheck(ctx context.Context, eventID, who string) (postgres.Recheck, error)
	// HasRPC tells whether a network's chain can be asked
	// (RPC_URL_<NETWORK>): a network without one takes a provider's
	// reorg report as the evidence.
	HasRPC(network string) bool
}

// errNoRPC answers a recheck the api cannot make.
var errNoRPC = errors.New("the api has no ETH_RPC_URL, so it cannot ask the chain; set ETH_RPC_URL (and DEPOSIT_FINALITY as the worker has it) or run settlectl events recheck where it is set")

type recheckJSON struct {
	postgres.RecheckView
	TraceID string `json:"trace_id"`
}

// adminRecheck asks the chain again about a failed deposit; see
// finality.Rechecker.Recheck. Every recheck is recorded, and a second one
// of a reopened deposit answers not_applicable.
func (s *Server) adminRecheck(c echo.Context) error {
	id := unescapeParam(c, c.Param("event_id"))
	if id == "" || !utf8.ValidString(id) || !printable(id) || utf8.RuneCountInString(id) > storedEventIDLengthMax {
		return newError(http.StatusNotFound, "not found")
	}
	body, err := readBody(c, adminBodyMax)
	if err != nil {
		return bodyError(err)
	}
	name, err := parseRecheckBody(body)
	if err != nil {
		return newError(http.StatusBadRequest, err.Error())
	}
	who := name + " @" + ClientIP(c.Request().Context()).String()
	ctx, cancel := context.WithTimeout(c.Request().Context(), recheckTimeout)
	defer cancel()
	if s.chain == nil {
		// An unknown event is a 404 here too; a known one cannot be
		// rechecked by this api.
		if _, err := s.store.Event(ctx, id); err != nil {
			return storeError(err)
		}
		return fail(payment.ErrConflict, errNoRPC.Error())
	}
	r, err := s.chain.Recheck(ctx, id, who)
	if errors.Is(err, payment.ErrUnavailable) && r.ID != 0 {
		return &apiError{status: http.StatusServiceUnavailable, kind: err,
			message: "the chain cannot be asked now; the recheck is recorded, nothing changed; retry later", cause: err}
	}
	if err != nil {
		return storeError(err)
	}
	logging.From(c.Request().Context()).Info().Str(logging.FieldEventID, id).Str("result", string(r.Result)).
		Str("chain_state", r.ChainState).Str("requested_by", who).Msg("deposit rechecked")
	view := r.View()
	view.EventID = id
	return c.JSON(http.StatusOK, recheckJSON{RecheckView: view, TraceID: TraceID(c.Request().Context())})
}

// parseRecheckBody reads the optional body {"operator": "<name>"}: empty,
// {} or a printable name of at most operatorLengthMax characters, which
// defaults to operatorDefault.
func parseRecheckBody(body []byte) (string, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return operatorDefault, nil
	}
	fields, err := decodeObject(body)
	if err != nil {
		return "", errors.New("malformed JSON: " + err.Error())
	}
	for key := range fields {
		if key != "operator" {
			return "", errors.New("unknown field " + strconv.Quote(truncate(key)) + `; the body is empty or {"operator": "<name>"}`)
		}
	}
	raw, ok := fields["operator"]
	if !ok {
		return operatorDefault, nil
	}
	name, ok := jsonString(raw)
	name = strings.TrimSpace(name)
	if !ok || !printable(name) || utf8.RuneCountInString(name) > operatorLengthMax {
		return "", errors.New("operator must be a printable string of at most " + strconv.Itoa(operatorLengthMax) + " characters")
	}
	if name == "" {
		return operatorDefault, nil
	}
	return name, nil
}
