package httpapi_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/quicknode"
)

// bigQuickNodeLogs is a logs delivery of one block: the USDC transfer of
// quickNodeLogs and, before it, n Transfer logs of a contract not listed,
// as a busy block holds them.
func bigQuickNodeLogs(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"data":[[`)
	for i := range n {
		fmt.Fprintf(&b, `{"address":"0x00000000000000000000000000000000000000aa","topics":[%q,"0x0000000000000000000000009999999999999999999999999999999999999999","0x000000000000000000000000%s"],"data":"0x%064x","blockNumber":"0x10","transactionHash":"0x%064x","logIndex":"0x%x","removed":false},`,
			quicknode.TransferTopic, alchemyRecipient[2:], 1, i+1, i)
	}
	fmt.Fprintf(&b, `{"address":%q,"topics":[%q,"0x0000000000000000000000009999999999999999999999999999999999999999","0x000000000000000000000000%s"],"data":"0x%064x","blockNumber":"0x10","transactionHash":%q,"logIndex":"0x1","removed":false}]],"metadata":{"network":"ethereum-mainnet","dataset":"logs","blocks_reorged":null}}`,
		usdcContract, quicknode.TransferTopic, alchemyRecipient[2:], 1_500_000, alchemyTx)
	return []byte(b.String())
}

// A block's delivery over the default limit, with more items than the
// default bound, is a 413 by default and is taken whole once
// PROVIDER_BODY_MAX is raised: neither the bytes nor the item count
// refuse it then.
func TestRaisedProviderBodyMaxTakesABusyBlock(t *testing.T) {
	body := bigQuickNodeLogs(30_000)
	require.Greater(t, len(body), httpapi.ProviderBodyMaxDefault)
	require.Greater(t, 30_000, quicknode.ItemsMax)

	def := providerHarness(t)
	requireCode(t, def.postQuickNode(body, fixedNow, true), http.StatusRequestEntityTooLarge, httpapi.CodeBodyTooLarge)

	h := newHarness(t, harnessOptions{change: func(o *httpapi.Options) {
		o.QuickNodeTokens = []string{quickNodeToken}
		o.ProviderBodyMax = 16 << 20
		o.UnverifiedBytesMax = 32 << 20
	}})
	h.createUser(7)
	require.Equal(t, http.StatusCreated, h.addAddress(7, "ETH_MAINNET", alchemyRecipient).status)
	r := h.postQuickNode(body, fixedNow, true)
	require.Equal(t, http.StatusOK, r.status, "%.300s", r.raw)
	require.Equal(t, 1.0, r.body["accepted"], "%.300s", r.raw)
	e, err := h.db.Event(context.Background(), "chain:ETH_MAINNET:"+alchemyTx+":1")
	require.NoError(t, err)
	require.Equal(t, "1.5", e.Amount.String())

	over := []byte(`{"data":[],"metadata":{"network":"ethereum-mainnet","dataset":"logs","pad":"` + strings.Repeat("x", 16<<20) + `"}}`)
	requireCode(t, h.postQuickNode(over, fixedNow, true), http.StatusRequestEntityTooLarge, httpapi.CodeBodyTooLarge)
}
