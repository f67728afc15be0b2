package httpapi

import (
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/settle/settle/pkg/money"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// Bounds of the paged reads (CONTRACT.md: limit default 100, max 1000).
const (
	pageLimitDefault = 100
	pageLimitMax     = postgres.PageSizeMax
	// cursorLengthMax bounds an `after` before it is decoded: the longest
	// cursor holds an event id of 256 four-byte characters.
	cursorLengthMax = 1500
)

// Cursor prefixes name the list and the version of the encoding, so a
// journal cursor given to the events list is refused.
const (
	eventCursorPrefix   = "e1:"
	journalCursorPrefix = "j1:"
)

// EncodeEventCursor is the opaque `next` of an events page.
func EncodeEventCursor(k postgres.EventKey) string {
	return base64.RawURLEncoding.EncodeToString([]byte(eventCursorPrefix + strconv.FormatUint(k.XID, 10) + ":" + k.EventID))
}

// DecodeEventCursor reads an events cursor; only what EncodeEventCursor
// writes is accepted.
func DecodeEventCursor(s string) (postgres.EventKey, bool) {
	xid, rest, ok := decodeCursor(s, eventCursorPrefix)
	if !ok || rest == "" || !utf8.ValidString(rest) || !printable(rest) || utf8.RuneCountInString(rest) > storedEventIDLengthMax {
		return postgres.EventKey{}, false
	}
	return postgres.EventKey{XID: xid, EventID: rest}, true
}

// EncodeJournalCursor is the opaque `next` of a journal page.
func EncodeJournalCursor(k postgres.JournalKey) string {
	return base64.RawURLEncoding.EncodeToString([]byte(journalCursorPrefix + strconv.FormatUint(k.XID, 10) + ":" + strconv.FormatInt(k.ID, 10)))
}

// DecodeJournalCursor reads a journal cursor; only what
// EncodeJournalCursor writes is accepted.
func DecodeJournalCursor(s string) (postgres.JournalKey, bool) {
	xid, rest, ok := decodeCursor(s, journalCursorPrefix)
	if !ok {
		return postgres.JournalKey{}, false
	}
	id, ok := positiveIntegerParam(rest)
	if !ok {
		return postgres.JournalKey{}, false
	}
	return postgres.JournalKey{XID: xid, ID: id}, true
}

// decodeCursor checks a cursor's shape and returns its transaction id
// (canonical decimal) and the rest.
func decodeCursor(s, prefix string) (uint64, string, bool) {
	if s == "" || len(s) > cursorLengthMax {
		return 0, "", false
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(s)
	// The decoder skips \r and \n even in strict mode: a cursor is only
	// the spelling settle gave out.
	if err != nil || base64.RawURLEncoding.EncodeToString(raw) != s {
		return 0, "", false
	}
	body, found := strings.CutPrefix(string(raw), prefix)
	if !found {
		return 0, "", false
	}
	digits, rest, found := strings.Cut(body, ":")
	if !found {
		return 0, "", false
	}
	xid, err := strconv.ParseUint(digits, 10, 64)
	if err != nil || strconv.FormatUint(xid, 10) != digits {
		return 0, "", false
	}
	return xid, rest, true
}

// pageQuery reads the paging parameters; every refusal is invalid_request.
type pageQuery struct {
	c echo.Context
}

// single is a query parameter given at most once ("" when absent).
func (p pageQuery) single(name string) (string, *apiError) {
	values := p.c.QueryParams()[name]
	switch len(values) {
	case 0:
		return "", nil
	case 1:
		return values[0], nil
	}
	return "", newError(http.StatusBadRequest, name+" may be given once")
}

func (p pageQuery) limit() (int, *apiError) {
	s, bad := p.single("limit")
	if bad != nil || s == "" {
		return pageLimitDefault, bad
	}
	n, ok := positiveIntegerParam(s)
	if !ok || n > pageLimitMax {
		return 0, newError(http.StatusBadRequest, "limit must be an integer from 1 to "+strconv.Itoa(pageLimitMax))
	}
	return int(n), nil
}

// A page's next is null at the end of the list, so a client that loops
// while next is set stops; resume keeps the end's place for a reader
// that polls later for what came since.
type eventsPageJSON struct {
	Events  []eventJSON `json:"events"`
	HasMore bool        `json:"has_more"`
	Next    *string     `json:"next"`
	Resume  *string     `json:"resume"`
}

// eventsPage is GET /v1/events.
func (s *Server) eventsPage(c echo.Context) error {
	p := pageQuery{c}
	var f postgres.EventFilter
	if v, bad := p.single("user_id"); bad != nil {
		return bad
	} else if v != "" {
		var ok bool
		if f.UserID, ok = positiveIntegerParam(v); !ok {
			return newError(http.StatusBadRequest, "user_id must be an integer above zero")
		}
	}
	if v, bad := p.single("status"); bad != nil {
		return bad
	} else if v != "" {
		if f.Status = payment.Status(v); !f.Status.Valid() {
			return newError(http.StatusBadRequest, "status must be one of pending, enqueued, processing, awaiting_finality, confirmed, failed")
		}
	}
	if v, bad := p.single("type"); bad != nil {
		return bad
	} else if v != "" {
		if f.Type = payment.EventType(v); !f.Type.Known() {
			return newError(http.StatusBadRequest, "type must be an event type")
		}
	}
	var after *postgres.EventKey
	if v, bad := p.single("after"); bad != nil {
		return bad
	} else if v != "" {
		key, ok := DecodeEventCursor(v)
		if !ok {
			return newError(http.StatusBadRequest, "after must be a next cursor of this list")
		}
		after = &key
	}
	limit, bad := p.limit()
	if bad != nil {
		return bad
	}

	ctx, cancel := storeContext(c)
	defer cancel()
	page, err := s.store.EventsPage(ctx, f, after, limit)
	if err != nil {
		return storeError(err)
	}
	out := eventsPageJSON{Events: make([]eventJSON, 0, len(page.Rows)), HasMore: page.HasMore}
	for _, v := range page.Rows {
		out.Events = append(out.Events, viewEvent(v))
	}
	if page.Next != nil {
		out.Next, out.Resume = cursors(EncodeEventCursor(*page.Next), page.HasMore)
	}
	return c.JSON(http.StatusOK, out)
}

type journalEntryJSON struct {
	ID            int64     `json:"id"`
	Asset         string    `json:"asset"`
	Amount        string    `json:"amount"`
	EventType     string    `json:"event_type"`
	SourceEventID string    `json:"source_event_id"`
	CreatedAt     time.Time `json:"created_at"`
	// Network is null for rows written before networks existed.
	Network *string `json:"network"`
}

type journalPageJSON struct {
	UserID  int64              `json:"user_id"`
	Entries []journalEntryJSON `json:"entries"`
	HasMore bool               `json:"has_more"`
	Next    *string            `json:"next"`
	Resume  *string            `json:"resume"`
}

// journalPage is GET /v1/users/{id}/journal: the user's balance_events.
func (s *Server) journalPage(c echo.Context) error {
	user, ok := positiveIntegerParam(c.Param("id"))
	if !ok {
		return newError(http.StatusBadRequest, "user id must be an integer above zero")
	}
	p := pageQuery{c}
	asset, bad := p.single("asset")
	if bad != nil {
		return bad
	}
	var after *postgres.JournalKey
	if v, bad := p.single("after"); bad != nil {
		return bad
	} else if v != "" {
		key, ok := DecodeJournalCursor(v)
		if !ok {
			return newError(http.StatusBadRequest, "after must be a next cursor of this list")
		}
		after = &key
	}
	limit, bad := p.limit()
	if bad != nil {
		return bad
	}

	ctx, cancel := storeContext(c)
	defer cancel()
	if asset != "" {
		registry, err := s.assets.get(ctx)
		if err != nil {
			return storeError(err)
		}
		if !registry.Known(asset) {
			return fail(payment.ErrUnknownAsset, "")
		}
	}
	exists, err := s.store.UserExists(ctx, user)
	if err != nil {
		return storeError(err)
	}
	if !exists {
		return unknownUserRead()
	}
	page, err := s.store.JournalPage(ctx, user, asset, after, limit)
	if err != nil {
		return storeError(err)
	}
	out := journalPageJSON{UserID: user, Entries: make([]journalEntryJSON, 0, len(page.Rows)), HasMore: page.HasMore}
	for _, e := range page.Rows {
		out.Entries = append(out.Entries, journalEntryJSON{
			ID: e.ID, Asset: e.Asset, Amount: money.Canonical(e.Amount), EventType: e.EventType,
			SourceEventID: e.SourceEventID, CreatedAt: e.CreatedAt.UTC(), Network: optional(e.Network),
		})
	}
	if page.Next != nil {
		out.Next, out.Resume = cursors(EncodeJournalCursor(*page.Next), page.HasMore)
	}
	return c.JSON(http.StatusOK, out)
}

// cursors answers a page's next (only while more can be read now) and
// resume (always).
func cursors(cursor string, more bool) (next, resume *string) {
	if more {
		return &cursor, &cursor
	}
	return nil, &cursor
}

// optional is a JSON null for "".
func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
