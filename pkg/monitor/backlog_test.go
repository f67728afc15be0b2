package monitor_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/monitor"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// gauges reads the backlog series of reg as "status/network" -> value.
func gauges(t *testing.T, reg *prometheus.Registry) (map[string]float64, float64) {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	events := map[string]float64{}
	oldest := -1.0
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch f.GetName() {
			case "settle_backlog_events":
				l := map[string]string{}
				for _, p := range m.GetLabel() {
					l[p.GetName()] = p.GetValue()
				}
				events[l["status"]+"/"+l["network"]] = m.GetGauge().GetValue()
			case "settle_backlog_oldest_pending_seconds":
				oldest = m.GetGauge().GetValue()
			}
		}
	}
	return events, oldest
}

// TestBacklogGauges: the gauges follow PostgreSQL's backlog, past any
// queue depth cap, and a drained network reads 0 rather than vanishing.
func TestBacklogGauges(t *testing.T) {
	ctx := context.Background()
	db := testenv.DB(t)
	reg := prometheus.NewRegistry()
	b := monitor.NewBacklog(db, time.Second, reg)

	require.NoError(t, b.Refresh(ctx))
	events, oldest := gauges(t, reg)
	require.Empty(t, events, "no network seen yet")
	require.Zero(t, oldest)

	_, err := db.CreateUser(ctx, 1)
	require.NoError(t, err)
	for _, id := range []string{"a", "b", "c"} {
		inserted, err := db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: id, Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("1")}, Source: postgres.SourcePayments})
		require.NoError(t, err)
		require.True(t, inserted)
	}
	require.NoError(t, b.Refresh(ctx))
	events, _ = gauges(t, reg)
	require.Equal(t, map[string]float64{
		"pending/ETH_MAINNET": 3, "enqueued/ETH_MAINNET": 0, "processing/ETH_MAINNET": 0,
		"awaiting_finality/ETH_MAINNET": 0, "failed/ETH_MAINNET": 0,
	}, events)

	_, err = db.ClaimOutbox(ctx, 1000, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	require.NoError(t, b.Refresh(ctx))
	events, oldest = gauges(t, reg)
	require.Equal(t, 0.0, events["pending/ETH_MAINNET"], "drained, still exported")
	require.Equal(t, 3.0, events["enqueued/ETH_MAINNET"])
	require.Zero(t, oldest)
}

type failingBacklog struct{}

func (failingBacklog) Backlog(context.Context, time.Duration) (postgres.Backlog, error) {
	return postgres.Backlog{}, errors.New("down")
}

// A failed read is the job's error and leaves the gauges as they were.
func TestBacklogRefreshError(t *testing.T) {
	reg := prometheus.NewRegistry()
	b := monitor.NewBacklog(failingBacklog{}, time.Second, reg)
	require.EqualError(t, b.Refresh(context.Background()), "down")
	events, oldest := gauges(t, reg)
	require.Empty(t, events)
	require.Zero(t, oldest)
}
