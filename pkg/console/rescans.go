package console

import (
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

type rescansData struct {
	// Table is false when rescan_jobs does not exist (no scanner in this
	// schema); CanStart when the console has a way to start a job.
	Table    bool
	CanStart bool
	Jobs     []rescanJob
	Networks []string
}

// rescanJob is a job with its progress.
type rescanJob struct {
	postgres.RescanJob
	Done  uint64 // blocks scanned
	Total uint64 // blocks in the range, 0 while a backfill's end is open
}

func (c *Console) rescans(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := storeContext(r)
	defer cancel()
	jobs, found, err := c.o.Store.RescanJobs(ctx, listMax)
	if err != nil {
		c.storeFailed(w, r, err, "rescan jobs")
		return
	}
	d := rescansData{Table: found, CanStart: c.o.Rescans != nil}
	if d.Networks, err = c.o.Store.Networks(ctx); err != nil {
		c.storeFailed(w, r, err, "networks")
		return
	}
	for _, j := range jobs {
		job := rescanJob{RescanJob: j}
		if j.NextBlock > j.FromBlock {
			job.Done = j.NextBlock - j.FromBlock
		}
		if j.ToBlock != nil && *j.ToBlock+1 >= j.FromBlock {
			job.Total = *j.ToBlock + 1 - j.FromBlock
			job.Done = min(job.Done, job.Total)
		}
		d.Jobs = append(d.Jobs, job)
	}
	c.render(w, r, http.StatusOK, "rescans", c.view(r, "rescans", "Rescans", d))
}

// startRescan starts a rescan through the admin API's operation; the
// range and network rules (RESCAN_BLOCKS_MAX) are that operation's.
func (c *Console) startRescan(w http.ResponseWriter, r *http.Request, a actor) {
	if c.o.Rescans == nil {
		c.fail(w, r, http.StatusConflict, "This api cannot start rescans; use POST /admin/rescan or settlectl rescan.")
		return
	}
	network := strings.TrimSpace(r.PostForm.Get("network"))
	from, errFrom := strconv.ParseUint(strings.TrimSpace(r.PostForm.Get("from_block")), 10, 64)
	to, errTo := strconv.ParseUint(strings.TrimSpace(r.PostForm.Get("to_block")), 10, 64)
	if network == "" || errFrom != nil || errTo != nil {
		c.fail(w, r, http.StatusBadRequest, "Give a network and a block range: two non-negative integers.")
		return
	}
	ctx, cancel := storeContext(r)
	defer cancel()
	id, err := c.o.Rescans.StartRescan(ctx, network, from, to, a.who+": "+a.reason)
	if errors.Is(err, payment.ErrInvalid) {
		// The operation's refusals are written for the operator.
		c.fail(w, r, http.StatusBadRequest, "Refused: "+err.Error()+".")
		return
	}
	if err != nil {
		c.storeFailed(w, r, err, "rescan")
		return
	}
	logging.From(r.Context()).Info().Str("rescan_id", id).Str("network", network).Uint64("from_block", from).
		Uint64("to_block", to).Str("requested_by", a.who).Str("reason", a.reason).Msg("rescan started from the console")
	redirect(w, r, Prefix+"rescans", nil, "rescan:started")
}

// cancelRescan ends a running job through the operation settlectl and
// POST /admin/rescan/{id}/cancel use; the job's error records who and why.
func (c *Console) cancelRescan(w http.ResponseWriter, r *http.Request, a actor) {
	id := r.PathValue("id")
	ctx, cancel := storeContext(r)
	defer cancel()
	if err := c.o.Store.CancelRescan(ctx, id, a.who, a.reason); err != nil {
		c.storeFailed(w, r, err, "rescan job with this id")
		return
	}
	logging.From(r.Context()).Info().Str("rescan_id", id).Str("cancelled_by", a.who).Str("reason", a.reason).
		Msg("rescan cancelled from the console")
	redirect(w, r, Prefix+"rescans", nil, "rescan:cancelled")
}
