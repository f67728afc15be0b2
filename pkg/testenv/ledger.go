package testenv

import (
	"context"
	"testing"

	"github.com/settle/settle/pkg/postgres"
)

// SettleOutbox runs everything in db's outbox through the ledger, one
// event per batch, as a worker without an RPC would (no chain evidence).
func SettleOutbox(t testing.TB, db *postgres.DB) {
	t.Helper()
	ctx := context.Background()
	for {
		claimed, err := db.ClaimOutbox(ctx, 50, 0, postgres.TaskEventsMax)
		if err != nil {
			t.Fatalf("claim outbox: %v", err)
		}
		if len(claimed) == 0 {
			return
		}
		for _, c := range claimed {
			if _, err := db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: c.Event}}, postgres.LedgerOptions{}); err != nil {
				t.Fatalf("apply %s: %v", c.Event.ID, err)
			}
		}
	}
}

// RequireInvariants fails t unless every invariant holds on db, every
// accepted event terminal included.
func RequireInvariants(t testing.TB, db *postgres.DB) {
	t.Helper()
	findings, _, err := db.CheckInvariants(context.Background(), postgres.InvariantOptions{RequireTerminal: true})
	if err != nil {
		t.Fatalf("check invariants: %v", err)
	}
	if len(findings) == 0 {
		t.Fatal("no invariant was checked")
	}
	for _, f := range findings {
		if f.Violations != 0 {
			t.Errorf("invariant %q: %d violations: %s", f.Invariant, f.Violations, f.Sample)
		}
	}
}
