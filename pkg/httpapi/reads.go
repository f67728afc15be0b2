package httpapi

import (
	"net/http"
	"net/url"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/settle/settle/pkg/money"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// storedEventIDLengthMax is payment_events.event_id's bound; longer ids
// cannot exist, so they are a 404 without a query.
const storedEventIDLengthMax = 256

type balanceJSON struct {
	Asset   string `json:"asset"`
	Balance string `json:"balance"`
	// Held is the sum of the open holds; Available = Balance − Held.
	Held      string `json:"held"`
	Available string `json:"available"`
}

type balancesJSON struct {
	UserID   int64         `json:"user_id"`
	Balances []balanceJSON `json:"balances"`
}

func (s *Server) userBalances(c echo.Context) error {
	user, ok := positiveIntegerParam(c.Param("id"))
	if !ok {
		return newError(http.StatusBadRequest, "user id must be an integer above zero")
	}
	ctx, cancel := storeContext(c)
	defer cancel()
	exists, err := s.store.UserExists(ctx, user)
	if err != nil {
		return storeError(err)
	}
	if !exists {
		return unknownUserRead()
	}
	balances, err := s.store.Balances(ctx, user)
	if err != nil {
		return storeError(err)
	}
	out := balancesJSON{UserID: user, Balances: make([]balanceJSON, 0, len(balances))}
	for _, b := range balances {
		out.Balances = append(out.Balances, balanceJSON{Asset: b.Asset, Balance: money.Canonical(b.Balance),
			Held: money.Canonical(b.Held), Available: money.Canonical(b.Available)})
	}
	return c.JSON(http.StatusOK, out)
}

// finalityJSON shows a deposit's wait for its transaction to become
// final, so a waiting deposit is visibly waiting rather than stuck.
type finalityJSON struct {
	State       string     `json:"state"`
	NextCheckAt *time.Time `json:"next_check_at,omitempty"`
	CheckCount  int        `json:"check_count"`
	BlockNumber *int64     `json:"block_number,omitempty"`
}

type eventJSON struct {
	EventID        string        `json:"event_id"`
	EventType      string        `json:"event_type"`
	UserID         int64         `json:"user_id"`
	Asset          string        `json:"asset"`
	Amount         string        `json:"amount"`
	Status         string        `json:"status"`
	RetryCount     int           `json:"retry_count"`
	Outcome        string        `json:"outcome,omitempty"`
	TxHash         string        `json:"tx_hash,omitempty"`
	Source         string        `json:"source"`
	RelatedEventID string        `json:"related_event_id,omitempty"`
	TraceID        string        `json:"trace_id"`
	Finality       *finalityJSON `json:"finality,omitempty"`
	CreatedAt      time.Time     `json:"created_at"`
	UpdatedAt      time.Time     `json:"updated_at"`
}

// Finality states shown while a deposit has not reached the policy.
const (
	finalityAwaiting = "awaiting_finality"
)

func viewEvent(v postgres.EventView) eventJSON {
	out := eventJSON{
		EventID: v.ID, EventType: string(v.Type), UserID: v.UserID, Asset: v.Asset,
		Amount: money.Canonical(v.Amount), Status: string(v.Status), RetryCount: v.RetryCount,
		Outcome: v.Outcome, TxHash: v.TxHash, Source: v.Source, RelatedEventID: v.Related,
		TraceID: v.TraceID, CreatedAt: v.CreatedAt.UTC(), UpdatedAt: v.UpdatedAt.UTC(),
	}
	// The event's error text is internal (it may name hosts or SQL) and
	// stays out of the answer; outcome says how the event ended.
	state := v.ChainState
	if v.Status == payment.StatusAwaitingFinality {
		state = finalityAwaiting
	}
	if state != "" || v.NextCheckAt != nil {
		f := &finalityJSON{State: state, CheckCount: v.CheckCount, BlockNumber: v.BlockNumber}
		if v.NextCheckAt != nil {
			at := v.NextCheckAt.UTC()
			f.NextCheckAt = &at
		}
		out.Finality = f
	}
	return out
}

func (s *Server) event(c echo.Context) error {
	id := unescapeParam(c, c.Param("event_id"))
	// Ids are stored as printable UTF-8; anything else cannot exist, and
	// PostgreSQL would refuse a NUL or a bad byte sequence as an error.
	if id == "" || !utf8.ValidString(id) || !printable(id) || utf8.RuneCountInString(id) > storedEventIDLengthMax {
		return newError(http.StatusNotFound, "not found")
	}
	ctx, cancel := storeContext(c)
	defer cancel()
	v, err := s.store.Event(ctx, id)
	if err != nil {
		return storeError(err)
	}
	return c.JSON(http.StatusOK, viewEvent(v))
}

// unescapeParam undoes percent-encoding echo leaves in a parameter when
// the path held an escaped slash (an event id may contain "/").
func unescapeParam(c echo.Context, value string) string {
	if c.Request().URL.RawPath == "" {
		return value
	}
	if unescaped, err := url.PathUnescape(value); err == nil {
		return unescaped
	}
	return value
}
