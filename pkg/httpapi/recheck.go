package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/task"
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

// errNoRPC answers a recheck neither the api nor a worker can make.
var errNoRPC = errors.New("the api has no ETH_RPC_URL and no worker reported an RPC for the event's network, so no one can ask the chain; set ETH_RPC_URL (or RPC_URL_<NETWORK>) on the workers or the api, or run settlectl events recheck where it is set")

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
	var r postgres.Recheck
	if s.chain != nil {
		r, err = s.chain.Recheck(ctx, id, who)
	} else {
		// No RPC here: an unknown event is a 404 all the same, and a
		// known one goes to the workers if one of them reported an RPC
		// on its network.
		target, targetErr := s.store.RecheckTarget(ctx, id)
		if targetErr != nil {
			return storeError(targetErr)
		}
		network := target.Event.Network
		if network == "" {
			network = payment.DefaultNetwork
		}
		if s.rechecks == nil || !s.reportedRPC(ctx, network) {
			return fail(payment.ErrConflict, errNoRPC.Error())
		}
		r, err = s.delegateRecheck(ctx, id, who)
		var answer *apiError
		if errors.As(err, &answer) {
			return answer
		}
	}
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

// reportedRPC tells whether a worker reported an RPC on network.
func (s *Server) reportedRPC(ctx context.Context, network string) bool {
	reported, _ := s.rpcReports.get(ctx) // unread: no report
	return reported[network]
}

// RecheckQueue hands a recheck to the workers (cmd/api: a task on the
// maintenance queue, and a wake-up); id names the request.
type RecheckQueue interface {
	Enqueue(ctx context.Context, id string, r task.RecheckTask) error
}

// recheckPoll is how often the api looks for the record of a recheck it
// handed to the workers.
const recheckPoll = 50 * time.Millisecond

// delegateRecheck hands the recheck to the workers and waits, within
// ctx, for its record, which is the answer. A worker that could not ask
// the chain records that too: ErrUnavailable with the record, as the
// api's own recheck answers it.
func (s *Server) delegateRecheck(ctx context.Context, id, who string) (postgres.Recheck, error) {
	before, err := s.store.LastRecheckID(ctx, id)
	if err != nil {
		return postgres.Recheck{}, storeError(err)
	}
	if err := s.rechecks.Enqueue(ctx, uuid.NewString(), task.RecheckTask{EventID: id, RequestedBy: who}); err != nil {
		answer := newError(http.StatusServiceUnavailable, "cannot hand the recheck to the workers now; nothing changed; retry later")
		answer.cause = err
		return postgres.Recheck{}, answer
	}
	t := time.NewTicker(recheckPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			answer := newError(http.StatusServiceUnavailable, "no worker answered the recheck within "+recheckTimeout.String()+
				"; it may still run and be recorded (settlectl events rechecks ID); retry later")
			answer.cause = ctx.Err()
			return postgres.Recheck{}, answer
		case <-t.C:
		}
		r, found, err := s.store.RecheckAfter(ctx, id, before, who)
		switch {
		case err != nil && ctx.Err() == nil:
			return postgres.Recheck{}, storeError(err)
		case !found:
			continue
		case r.ChainState == chainUnavailable:
			return r, fmt.Errorf("%w: the workers could not ask the chain: %s", payment.ErrUnavailable, r.Detail)
		}
		return r, nil
	}
}

// chainUnavailable is finality.ChainUnavailable: a recheck's record when
// the chain could not be asked.
const chainUnavailable = "unavailable"

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
