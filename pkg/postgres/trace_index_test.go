package postgres_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// scannedInternal stores an internal transfer's deposit as the scanner
// made it before 0021: the id and the index in the trace walk's spelling.
func (f *fixture) scannedInternal(traceAddress string, tx string) string {
	f.t.Helper()
	index := "trace:" + traceAddress
	e := payment.Event{ID: "chain:ETH_MAINNET:" + tx + ":" + index, Type: payment.Deposit, UserID: 1, Asset: "ETH",
		Amount: dec("1"), TxHash: tx, TransferIndex: index, Network: "ETH_MAINNET", TraceID: "trace-" + traceAddress}
	inserted, err := f.db.InsertEvent(context.Background(), postgres.NewEvent{Event: e, Source: postgres.SourceScanner})
	require.NoError(f.t, err)
	require.True(f.t, inserted)
	return e.ID
}

func (f *fixture) eventIndex(id string) string {
	f.t.Helper()
	var index string
	require.NoError(f.t, f.sql.QueryRow(context.Background(), `SELECT transfer_index FROM payment_events WHERE event_id = $1`, id).Scan(&index))
	return index
}

// TestTraceIndexMigration: 0021 moves upper-case trace claims and the
// events that hold them to the lowercase spelling, leaves a claim whose
// lowercase twin exists (a double credit already made) for the invariant
// checker to report, and a rescan of a transfer credited before it meets
// its claim instead of crediting it again.
func TestTraceIndexMigration(t *testing.T) {
	ctx := context.Background()
	db, conn := migratedTo(t, 20)
	f := &fixture{t: t, db: db, sql: conn}

	credited := f.scannedInternal("CALL_0_1", txA)
	require.Equal(t, payment.OutcomeSuccess, f.applyChain([]string{"trace:CALL_0_1"}, f.claim(credited))[0].Outcome)
	waiting := f.scannedInternal("CALL_0_2", txA)
	// Before the fix, the scanner's and Alchemy's spellings of one frame
	// were both credited.
	upperTwin := f.scannedInternal("CALL_0", txB)
	require.Equal(t, payment.OutcomeSuccess, f.applyChain([]string{"trace:CALL_0"}, f.claim(upperTwin))[0].Outcome)
	lowerTwin := f.scannedInternal("call_0", txB)
	require.Equal(t, payment.OutcomeSuccess, f.applyChain([]string{"trace:call_0"}, f.claim(lowerTwin))[0].Outcome)
	require.True(t, dec("3").Equal(f.balance(1, "ETH")))

	applied, err := db.MigrateTo(ctx, 21)
	require.NoError(t, err)
	require.Equal(t, []string{"0021_trace_index_lowercase.sql"}, applied)

	require.Equal(t, "trace:call_0_1", f.claimOf(credited))
	require.Equal(t, "trace:call_0_1", f.eventIndex(credited))
	require.Equal(t, "trace:call_0_2", f.eventIndex(waiting), "not yet credited: it will claim in the one spelling")
	require.Equal(t, "trace:CALL_0", f.claimOf(upperTwin), "its twin holds the lowercase claim")
	require.Equal(t, "trace:CALL_0", f.eventIndex(upperTwin), "an event stays with its claim")
	require.Equal(t, "trace:call_0", f.claimOf(lowerTwin))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM payment_events WHERE event_id LIKE '%:trace:CALL_0_1'`), "event ids keep their text")

	// Today's checker reads tables of later migrations, which leave the
	// claims as they are.
	_, err = db.Migrate(ctx)
	require.NoError(t, err)
	require.Equal(t, "trace:CALL_0", f.claimOf(upperTwin))
	findings, _, err := db.CheckInvariants(ctx, postgres.InvariantOptions{})
	require.NoError(t, err)
	var spellings postgres.Finding
	for _, finding := range findings {
		if finding.Invariant == "no transfer is claimed under two spellings" {
			spellings = finding
		}
	}
	require.Equal(t, int64(1), spellings.Violations, "the double credit is a human's to settle")
	require.Contains(t, spellings.Sample, upperTwin)

	// The scanner passes over the credited transfer again, now deriving
	// the lowercase id: a new event, which meets the claim.
	rescanned := f.scannedInternal("call_0_1", txA)
	require.NotEqual(t, credited, rescanned)
	result := f.applyChain([]string{payment.TraceTransfer("CALL_0_1")}, f.claim(rescanned))[0]
	require.Equal(t, payment.StatusFailed, result.Status)
	require.Equal(t, payment.OutcomeDuplicateTransfer, result.Outcome)
	require.True(t, dec("3").Equal(f.balance(1, "ETH")), "no second credit")
}
