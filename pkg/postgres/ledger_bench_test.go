package postgres_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/loadgen"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// BenchmarkLedgerOneEvent applies deposits one transaction each, as the
// worker does at a trickle, and reports the CPU that PostgreSQL and this
// process spend per event: the ledger's share of the end-to-end figure,
// without the api, Redis and the queue. For before/after comparisons of
// the ledger's statements:
//
//	go test ./pkg/postgres -run '^$' -bench LedgerOneEvent -benchtime 3000x -count 6
func BenchmarkLedgerOneEvent(b *testing.B) {
	pg := testenv.Postgres(b)
	if pg == nil {
		b.Skip("needs the harness's own PostgreSQL to read its CPU (unset TEST_DATABASE_URL)")
	}
	ctx := context.Background()
	db := testenv.OpenDB(b, testenv.DatabaseURL(b))
	_, err := db.CreateUser(ctx, 1)
	require.NoError(b, err)
	require.NoError(b, db.SetInitialBalance(ctx, 1, "ETH", dec("0")))

	// One event more than b.N: the first, applied before the clock starts,
	// prepares the statements on the connection.
	n := b.N + 1
	tasks := make([]payment.Event, 0, n)
	for i := range n {
		e := payment.Event{ID: fmt.Sprintf("bench-%d", i), Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: dec("0.01"), TraceID: "t"}
		_, err := db.InsertEvent(ctx, postgres.NewEvent{Event: e, Source: postgres.SourcePayments})
		require.NoError(b, err)
	}
	for len(tasks) < n {
		claimed, err := db.ClaimOutbox(ctx, 1000, 0, 1)
		require.NoError(b, err)
		require.NotEmpty(b, claimed)
		for _, c := range claimed {
			tasks = append(tasks, c.Event)
		}
	}
	apply := func(task payment.Event) {
		results, err := db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: task}}, postgres.LedgerOptions{})
		if err != nil || results[0].Kind != postgres.Applied {
			b.Fatalf("event %s: %v %+v", task.ID, err, results)
		}
	}
	apply(tasks[0])
	procs := []loadgen.Proc{{Name: "postgres", Pid: pg.Pid()}}
	before, err := loadgen.SampleCPU(procs)
	require.NoError(b, err)
	selfBefore := loadgen.SelfCPUSeconds()
	b.ResetTimer()
	for _, task := range tasks[1:] {
		apply(task)
	}
	b.StopTimer()
	selfAfter := loadgen.SelfCPUSeconds()
	after, err := loadgen.SampleCPU(procs)
	require.NoError(b, err)
	use := loadgen.CPUBetween(before, after, b.N)
	b.ReportMetric(use.MsPerEvent["postgres"], "pg-cpu-ms/event")
	b.ReportMetric(use.SwitchesPerEvent["postgres"], "pg-wakeups/event")
	b.ReportMetric((selfAfter-selfBefore)*1000/float64(b.N), "go-cpu-ms/event")
}
