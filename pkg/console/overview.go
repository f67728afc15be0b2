package console

import (
	"net/http"
	"slices"
	"time"

	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/postgres"
)

// backlogStatuses are the overview's columns, in the order events move.
var backlogStatuses = []string{"pending", "enqueued", "processing", "awaiting_finality", "failed"}

// networkRow is one network's live events by status.
type networkRow struct {
	Network string
	Counts  []int64 // by backlogStatuses
	Total   int64
}

type overviewData struct {
	Statuses      []string
	Networks      []networkRow
	Live          int64
	OldestPending time.Duration
	Awaiting      int64
	DLQOpen       int64
	DLQOldest     time.Duration
	// ScannerTable is false when chain_cursors does not exist.
	ScannerTable bool
	Cursors      []postgres.ScanCursor
	// BreakersShown is false when the console cannot read them.
	BreakersShown bool
	Breakers      []Breaker
	DeadLetters   []postgres.DeadLetterView
	Recent        []postgres.EventView
	// Problems are the parts that could not be read.
	Problems []string
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "overview", c.view(r, "overview", "Overview", c.readOverview(r)))
}

// overviewLive is the overview's live panel alone, which htmx refreshes.
func (c *Console) overviewLive(w http.ResponseWriter, r *http.Request) {
	c.renderTemplate(w, r, http.StatusOK, "overview", "live", c.view(r, "overview", "Overview", c.readOverview(r)))
}

// readOverview reads each part on its own: one that fails is named in
// Problems and the rest still shows.
func (c *Console) readOverview(r *http.Request) overviewData {
	ctx, cancel := storeContext(r)
	defer cancel()
	d := overviewData{Statuses: backlogStatuses}
	problem := func(part string, err error) {
		logging.From(r.Context()).Warn().Err(err).Str("part", part).Msg("console overview part unavailable")
		d.Problems = append(d.Problems, part)
	}
	if backlog, err := c.o.Store.Backlog(ctx, postgres.BacklogTimeoutDefault); err != nil {
		problem("backlog", err)
	} else {
		d.Networks, d.Live, d.Awaiting = backlogRows(backlog)
		d.OldestPending = backlog.OldestPending
	}
	if n, oldest, err := c.o.Store.OpenDeadLetters(ctx); err != nil {
		problem("dead letters", err)
	} else {
		d.DLQOpen, d.DLQOldest = n, oldest
	}
	if cursors, found, err := c.o.Store.ScanCursors(ctx); err != nil {
		problem("scanner cursors", err)
	} else {
		d.ScannerTable, d.Cursors = found, cursors
	}
	if c.o.Breakers != nil {
		if breakers, err := c.o.Breakers.BreakerStates(ctx); err != nil {
			problem("circuit breakers (Redis)", err)
		} else {
			d.BreakersShown, d.Breakers = true, breakers
		}
	}
	if letters, err := c.o.Store.DeadLetters(ctx, "open", 0, overviewRows); err != nil {
		problem("open dead letters", err)
	} else {
		d.DeadLetters = letters
	}
	if recent, err := c.o.Store.RecentEvents(ctx, overviewRows); err != nil {
		problem("recent events", err)
	} else {
		d.Recent = recent
	}
	return d
}

// backlogRows turns the backlog's (status, network) counts into one row
// per network.
func backlogRows(b postgres.Backlog) (rows []networkRow, live, awaiting int64) {
	byNetwork := map[string]*networkRow{}
	for _, count := range b.Counts {
		i := slices.Index(backlogStatuses, count.Status)
		if i < 0 {
			continue
		}
		row := byNetwork[count.Network]
		if row == nil {
			row = &networkRow{Network: count.Network, Counts: make([]int64, len(backlogStatuses))}
			byNetwork[count.Network] = row
		}
		row.Counts[i] += count.Events
		row.Total += count.Events
		if count.Status != "failed" {
			live += count.Events
		}
		if count.Status == "awaiting_finality" {
			awaiting += count.Events
		}
	}
	for _, row := range byNetwork {
		rows = append(rows, *row)
	}
	slices.SortFunc(rows, func(a, b networkRow) int {
		if a.Network < b.Network {
			return -1
		}
		if a.Network > b.Network {
			return 1
		}
		return 0
	})
	return rows, live, awaiting
}
