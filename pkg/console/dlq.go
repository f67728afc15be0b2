package console

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// dlqStates are the listing's filters.
var dlqStates = []string{"open", "resolved", "all"}

type dlqData struct {
	State   string
	States  []string
	Entries []postgres.DeadLetterView
	// NextAfter pages on: the last id shown, 0 when the page was short.
	NextAfter int64
}

func (c *Console) deadLetters(w http.ResponseWriter, r *http.Request) {
	query := r.URL.Query()
	d := dlqData{State: query.Get("state"), States: dlqStates}
	if d.State == "" {
		d.State = "open"
	}
	valid := false
	for _, s := range dlqStates {
		valid = valid || s == d.State
	}
	after, err := optionalID(query.Get("after"))
	if !valid || err != nil {
		c.fail(w, r, http.StatusBadRequest, "Filter by state open, resolved or all.")
		return
	}
	ctx, cancel := storeContext(r)
	defer cancel()
	if d.Entries, err = c.o.Store.DeadLetters(ctx, d.State, after, listMax); err != nil {
		c.storeFailed(w, r, err, "dead letters")
		return
	}
	if len(d.Entries) == listMax {
		d.NextAfter = d.Entries[len(d.Entries)-1].ID
	}
	c.render(w, r, http.StatusOK, "dlq", c.view(r, "dlq", "Dead letters", d))
}

func (c *Console) deadLetter(w http.ResponseWriter, r *http.Request) {
	id, ok := c.entryID(w, r, r.PathValue("id"))
	if !ok {
		return
	}
	ctx, cancel := storeContext(r)
	defer cancel()
	entry, err := c.o.Store.DeadLetter(ctx, id)
	if err != nil {
		c.storeFailed(w, r, err, "dead-letter entry with this id")
		return
	}
	c.render(w, r, http.StatusOK, "dlq_entry", c.view(r, "dlq", "Dead letter "+strconv.FormatInt(id, 10), entry))
}

// replay runs the admin API's replay: recorded, idempotent, never a
// second credit.
func (c *Console) replay(w http.ResponseWriter, r *http.Request, a actor) {
	id, ok := c.entryID(w, r, r.PathValue("id"))
	if !ok {
		return
	}
	ctx, cancel := storeContext(r)
	defer cancel()
	result, err := c.o.Store.ReplayDeadLetter(ctx, id, a.who, a.reason)
	if err != nil {
		c.storeFailed(w, r, err, "dead-letter entry with this id")
		return
	}
	redirect(w, r, Prefix+"dlq/"+strconv.FormatInt(id, 10), nil, "replay:"+string(result))
}

// discard runs the admin API's discard.
func (c *Console) discard(w http.ResponseWriter, r *http.Request, a actor) {
	id, ok := c.entryID(w, r, r.PathValue("id"))
	if !ok {
		return
	}
	ctx, cancel := storeContext(r)
	defer cancel()
	changed, err := c.o.Store.DiscardDeadLetter(ctx, id, a.who, a.reason)
	if err != nil {
		c.storeFailed(w, r, err, "dead-letter entry with this id")
		return
	}
	done := "discard:discarded"
	if !changed {
		done = "discard:already"
	}
	redirect(w, r, Prefix+"dlq/"+strconv.FormatInt(id, 10), nil, done)
}

type bulkData struct {
	Entries  []postgres.DeadLetterView
	Reason   string
	Operator string
	Results  []bulkResult
}

type bulkResult struct {
	ID      int64
	EventID string
	Result  string
	Failed  bool
}

// bulkReplay replays a selection in two steps: without confirm=yes it
// shows what would be replayed and asks; with it, it replays each entry
// through the same operation as one replay and shows each result.
func (c *Console) bulkReplay(w http.ResponseWriter, r *http.Request, a actor) {
	raw := r.PostForm["id"]
	if len(raw) == 0 {
		c.fail(w, r, http.StatusBadRequest, "Select at least one entry to replay.")
		return
	}
	if len(raw) > bulkMax {
		c.fail(w, r, http.StatusBadRequest, "Select at most "+strconv.Itoa(bulkMax)+" entries at once.")
		return
	}
	ids := make([]int64, 0, len(raw))
	seen := map[int64]bool{}
	for _, s := range raw {
		id, err := strconv.ParseInt(s, 10, 64)
		if err != nil || id <= 0 {
			c.fail(w, r, http.StatusBadRequest, "Entry ids are positive integers.")
			return
		}
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	ctx, cancel := storeContext(r)
	defer cancel()
	d := bulkData{Reason: a.reason, Operator: r.PostForm.Get("operator")}
	if r.PostForm.Get("confirm") != "yes" {
		for _, id := range ids {
			entry, err := c.o.Store.DeadLetter(ctx, id)
			if err != nil {
				c.storeFailed(w, r, err, "dead-letter entry "+strconv.FormatInt(id, 10))
				return
			}
			d.Entries = append(d.Entries, entry)
		}
		c.render(w, r, http.StatusOK, "bulk_confirm", c.view(r, "dlq", "Confirm replay", d))
		return
	}
	for _, id := range ids {
		result, err := c.o.Store.ReplayDeadLetter(ctx, id, a.who, a.reason)
		res := bulkResult{ID: id, Result: string(result)}
		if err != nil {
			res.Failed, res.Result = true, "Not replayed: the database is unavailable or failed; try again."
			if errors.Is(err, payment.ErrConflict) || errors.Is(err, payment.ErrNotFound) {
				res.Result = conflictText(err)
			}
		}
		if entry, err := c.o.Store.DeadLetter(ctx, id); err == nil {
			res.EventID = entry.Letter.EventID
		}
		d.Results = append(d.Results, res)
	}
	c.render(w, r, http.StatusOK, "bulk_done", c.view(r, "dlq", "Replayed", d))
}

func (c *Console) entryID(w http.ResponseWriter, r *http.Request, s string) (int64, bool) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		c.fail(w, r, http.StatusNotFound, "Dead-letter entries have positive integer ids.")
		return 0, false
	}
	return id, true
}

func optionalID(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, strconv.ErrSyntax
	}
	return n, nil
}
