package console

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

var txHashPattern = regexp.MustCompile(`^0x[0-9a-fA-F]{64}$`)

type searchData struct {
	Query   string
	Kind    string // "", "user", "tx", "event"
	Events  []postgres.EventView
	Partial bool
	// EventMatch is set when a user-id search is also an event id.
	EventMatch bool
}

// events searches by event id, user id or transaction hash; an empty
// search shows the newest events.
func (c *Console) events(w http.ResponseWriter, r *http.Request) {
	query := strings.TrimSpace(r.URL.Query().Get("q"))
	if utf8.RuneCountInString(query) > searchMax || !utf8.ValidString(query) {
		c.fail(w, r, http.StatusBadRequest, "The search is longer than "+strconv.Itoa(searchMax)+" characters.")
		return
	}
	ctx, cancel := storeContext(r)
	defer cancel()
	d := searchData{Query: query}
	var err error
	switch user, userErr := strconv.ParseInt(query, 10, 64); {
	case query == "":
		d.Events, err = c.o.Store.RecentEvents(ctx, listMax)
	case txHashPattern.MatchString(query):
		d.Kind = "tx"
		var found postgres.TxEvents
		found, err = c.o.Store.EventsOfTx(ctx, strings.ToLower(query))
		d.Events, d.Partial = found.Events, found.Partial
	case userErr == nil && user > 0:
		d.Kind = "user"
		if d.Events, err = c.o.Store.UserEvents(ctx, user, listMax); err == nil {
			d.EventMatch, err = c.eventExists(ctx, query)
		}
	default:
		d.Kind = "event"
		var found bool
		if found, err = c.eventExists(ctx, query); err == nil && found {
			http.Redirect(w, r, Prefix+"event?id="+url.QueryEscape(query), http.StatusSeeOther)
			return
		}
	}
	if err != nil {
		c.storeFailed(w, r, err, "events")
		return
	}
	c.render(w, r, http.StatusOK, "events", c.view(r, "events", "Events", d))
}

func (c *Console) eventExists(ctx context.Context, id string) (bool, error) {
	_, err := c.o.Store.Event(ctx, id)
	if errors.Is(err, payment.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

type storyData struct {
	postgres.Story
	// Recheckable: a failed deposit with a transaction and an outcome a
	// recheck may reverse.
	Recheckable bool
	// ChainAsked: the api can ask the chain (it has an RPC).
	ChainAsked bool
	// OpenDeadLetters are the story's dead letters not yet resolved.
	OpenDeadLetters int
	// Timeline is the story in time order, from every timestamp stored.
	Timeline []step
}

// step is one dated fact of an event's story.
type step struct {
	At   time.Time
	What string
}

// event shows an event's whole story.
func (c *Console) event(w http.ResponseWriter, r *http.Request) {
	story, ok := c.readStory(w, r)
	if !ok {
		return
	}
	c.render(w, r, http.StatusOK, "event", c.view(r, "events", "Event "+story.Event.ID, story))
}

// eventStatus is the story's status panel alone, which htmx refreshes
// while the event is live.
func (c *Console) eventStatus(w http.ResponseWriter, r *http.Request) {
	story, ok := c.readStory(w, r)
	if !ok {
		return
	}
	c.renderTemplate(w, r, http.StatusOK, "event", "status", c.view(r, "events", "", story))
}

func (c *Console) readStory(w http.ResponseWriter, r *http.Request) (storyData, bool) {
	id := r.URL.Query().Get("id")
	if id == "" || len(id) > 256 || !utf8.ValidString(id) {
		c.fail(w, r, http.StatusBadRequest, "Give an event id: search for it on the Events page.")
		return storyData{}, false
	}
	ctx, cancel := storeContext(r)
	defer cancel()
	story, err := c.o.Store.EventStory(ctx, id)
	if err != nil {
		c.storeFailed(w, r, err, "event with this id")
		return storyData{}, false
	}
	d := storyData{Story: story, ChainAsked: c.o.Chain != nil}
	e := story.Event
	d.Recheckable = e.Type.Credit() && e.TxHash != "" && e.Status == payment.StatusFailed &&
		containsOutcome(payment.RecheckOutcomes, e.Outcome)
	for _, l := range story.DeadLetters {
		if l.Resolution == "" {
			d.OpenDeadLetters++
		}
	}
	d.Timeline = timeline(story)
	return d, true
}

func containsOutcome(outcomes []payment.Outcome, outcome string) bool {
	for _, o := range outcomes {
		if string(o) == outcome {
			return true
		}
	}
	return false
}

// recheck asks the chain again about a failed deposit: the admin API's
// operation, recorded with who asked and why.
func (c *Console) recheck(w http.ResponseWriter, r *http.Request, a actor) {
	id := r.PostForm.Get("id")
	if id == "" || len(id) > 256 {
		c.fail(w, r, http.StatusBadRequest, "Give an event id.")
		return
	}
	if c.o.Chain == nil {
		c.fail(w, r, http.StatusConflict, "This api has no RPC endpoint, so it cannot ask the chain. Set the RPC settings on the api, or run settlectl events recheck where they are set.")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), recheckTimeout)
	defer cancel()
	result, err := c.o.Chain.Recheck(ctx, id, a.who+": "+a.reason)
	if errors.Is(err, payment.ErrUnavailable) && result.ID != 0 {
		c.fail(w, r, http.StatusServiceUnavailable, "The chain cannot be asked now; the recheck is recorded and nothing changed. Try again later.")
		return
	}
	if err != nil {
		c.storeFailed(w, r, err, "event with this id")
		return
	}
	logging.From(r.Context()).Info().Str(logging.FieldEventID, id).Str("result", string(result.Result)).
		Str("requested_by", a.who).Msg("deposit rechecked from the console")
	redirect(w, r, Prefix+"event", url.Values{"id": {id}}, "recheck:"+string(result.Result))
}

// timeline orders what the tables say happened to an event. There is no
// status log: each step is a timestamp some row keeps.
func timeline(s postgres.Story) []step {
	var steps []step
	add := func(at *time.Time, what string) {
		if at != nil && !at.IsZero() {
			steps = append(steps, step{At: *at, What: what})
		}
	}
	e := s.Event
	add(&e.CreatedAt, "accepted from "+e.Source+" as pending")
	if e.ReceiptSeenAt != nil {
		what := "receipt seen on chain"
		if e.BlockNumber != nil {
			what += " in block " + strconv.FormatInt(*e.BlockNumber, 10)
		}
		add(e.ReceiptSeenAt, what)
	}
	add(e.AbsentSince, "receipt missing (reorg evidence being gathered)")
	add(e.ReopenedAt, "reopened: back to the outbox")
	if p := s.Processed; p != nil {
		add(&p.CreatedAt, "claimed by the ledger (idempotency record)")
		if p.Outcome != "pending" {
			add(&p.UpdatedAt, "ledger outcome: "+p.Outcome)
		}
	}
	for _, j := range s.Journal {
		add(&j.CreatedAt, "journal: "+j.EventType+" "+j.Amount.String()+" "+j.Asset)
	}
	if c := s.Claim; c != nil {
		add(&c.CreatedAt, "claimed on-chain transfer "+c.TransferIndex+" of "+c.TxHash)
	}
	for _, r := range s.Reports {
		add(&r.FirstAt, "reported by "+r.Reporter)
	}
	for _, l := range s.DeadLetters {
		add(&l.Letter.CreatedAt, "dead letter #"+strconv.FormatInt(l.ID, 10)+" ("+string(l.Letter.Source)+"): "+l.Letter.Error)
		if l.Resolution != "" {
			add(l.ResolvedAt, "dead letter #"+strconv.FormatInt(l.ID, 10)+" "+l.Resolution+" by "+l.ResolvedBy+reasonSuffix(l.Reason))
		}
	}
	for _, r := range s.Rechecks {
		add(&r.CreatedAt, "recheck by "+r.RequestedBy+": "+string(r.Result)+" (chain: "+r.ChainState+")")
	}
	for _, n := range s.Notifications {
		add(&n.CreatedAt, "notification "+n.Kind+" queued")
		add(n.DeliveredAt, "notification "+n.Kind+" delivered")
	}
	if h := s.Hold; h != nil && h.ID == e.ID {
		add(&h.CreatedAt, "hold opened")
		add(h.ResolvedAt, "hold "+string(h.Status)+" by "+h.ResolvedBy)
	}
	add(&e.UpdatedAt, "last change: now "+string(e.Status)+outcomeSuffix(e.Outcome))
	slices.SortStableFunc(steps, func(a, b step) int { return a.At.Compare(b.At) })
	return steps
}

func reasonSuffix(reason string) string {
	if reason == "" {
		return ""
	}
	return ": " + reason
}

func outcomeSuffix(outcome string) string {
	if outcome == "" {
		return ""
	}
	return " (" + outcome + ")"
}
