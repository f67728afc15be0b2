package httpapi_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
)

// TestWorkersRPCDecidesReorgReports: the api here has no RPC settings,
// but a worker reported one on ETH_MAINNET (network_rpc_reports): a
// provider's reorg report is then a reason for that chain to decide, not
// evidence, and the deposit is not reversed on the report's word. A
// report older than a day no longer counts: the report is evidence again.
func TestWorkersRPCDecidesReorgReports(t *testing.T) {
	for _, c := range []struct {
		name       string
		reportedAt string
		reversed   bool
	}{
		{"reported", "now()", false},
		{"reported long ago", "now() - interval '25 hours'", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := providerHarness(t)
			execSQL(t, h.dsn, `INSERT INTO network_rpc_reports (network, reported_at) VALUES ('ETH_MAINNET', `+c.reportedAt+`)`)
			h.createUser(7)
			require.Equal(t, http.StatusCreated, h.addAddress(7, "ETH_MAINNET", alchemyRecipient).status)
			id := "chain:ETH_MAINNET:" + alchemyTx + ":1"

			r := h.postQuickNode(quickNodeLogs("0x1", false), fixedNow, false)
			require.Equal(t, 1.0, r.body["accepted"], "%s", r.raw)
			r = h.do(http.MethodPost, "/webhook/quicknode", quickNodeLogs("0x1", true),
				signedQuickNode("nonce-reorg", fixedNow.Add(-time.Second), quickNodeLogs("0x1", true)))
			require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
			e, err := h.db.Event(context.Background(), id)
			require.NoError(t, err)
			if c.reversed {
				require.Equal(t, 1.0, r.body["reversed"], "%s", r.raw)
				require.Equal(t, payment.StatusFailed, e.Status)
				return
			}
			require.Equal(t, 0.0, r.body["reversed"], "%s", r.raw)
			require.Equal(t, 1.0, r.body["rechecked"], "%s", r.raw)
			require.NotEqual(t, payment.StatusFailed, e.Status, "reversed on the report's word though a worker can ask the chain")
		})
	}
}
