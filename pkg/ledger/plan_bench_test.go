package ledger_test

import (
	"testing"

	"github.com/settle/settle/pkg/ledger"
	"github.com/settle/settle/pkg/payment"
)

// BenchmarkPlanOneDeposit is the worker's planning of one deposit, as at
// a trickle (one event a transaction): its CPU and allocations per event.
func BenchmarkPlanOneDeposit(b *testing.B) {
	events := claimed([]ev{{id: "dep-1", typ: payment.Deposit, user: 1, amount: "1.5"}})
	b.ReportAllocs()
	for b.Loop() {
		w := ledger.Plan(ledger.Snapshot{
			Events: events, Replays: map[string]payment.Outcome{},
			Balances: accounts(map[string]string{"1/ETH": "10"}), Held: accounts(map[string]string{"1/ETH": "0"}),
		})
		if len(w.Confirms) != 1 || len(w.Notifications) != 1 {
			b.Fatalf("planned %+v", w)
		}
	}
}
