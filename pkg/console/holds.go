package console

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

type holdsData struct {
	User     string
	Status   string
	Statuses []payment.HoldStatus
	Holds    []postgres.Hold
}

// holds lists holds, newest first, by user and status.
func (c *Console) holds(w http.ResponseWriter, r *http.Request) {
	query := r.URL.Query()
	d := holdsData{User: strings.TrimSpace(query.Get("user")), Status: query.Get("status"), Statuses: payment.HoldStatuses}
	f := postgres.HoldFilter{Limit: listMax, Status: payment.HoldStatus(d.Status)}
	if d.User != "" {
		user, err := strconv.ParseInt(d.User, 10, 64)
		if err != nil || user <= 0 {
			c.fail(w, r, http.StatusBadRequest, "A user id is a positive integer.")
			return
		}
		f.UserID = user
	}
	if d.Status != "" && !f.Status.Valid() {
		c.fail(w, r, http.StatusBadRequest, "Filter by status open, posted or voided.")
		return
	}
	ctx, cancel := storeContext(r)
	defer cancel()
	var err error
	if d.Holds, err = c.o.Store.Holds(ctx, f); err != nil {
		c.storeFailed(w, r, err, "holds")
		return
	}
	c.render(w, r, http.StatusOK, "holds", c.view(r, "holds", "Holds", d))
}

// hold shows one hold; its events' stories are a click away.
func (c *Console) hold(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	if id == "" || len(id) > 256 {
		c.fail(w, r, http.StatusBadRequest, "Give a hold id (the withdrawal_hold's event id).")
		return
	}
	ctx, cancel := storeContext(r)
	defer cancel()
	h, err := c.o.Store.Hold(ctx, id)
	if err != nil {
		c.storeFailed(w, r, err, "hold with this id")
		return
	}
	c.render(w, r, http.StatusOK, "hold", c.view(r, "holds", "Hold "+h.ID, h))
}
