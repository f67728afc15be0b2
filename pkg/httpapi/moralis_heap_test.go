package httpapi_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/testenv"
)

// TestMoralisUnsignedBodiesHeap: two unsigned 4 MiB bodies from one
// client (what its INGEST_UNVERIFIED_CLIENT_BYTES_MAX share of 8 MiB
// admits at once) posted to /webhook/moralis are refused 401, and checking
// their signature (Keccak-256 of the body's JavaScript serialisation)
// holds memory of the order of the bytes in flight, not a parse tree many
// times their size: the unverified budget bounds the api's memory only if
// the routes hold a small multiple of the bytes it admits (README: 64
// slow 4 MiB bodies grow the heap by ~30-35 MiB).
func TestMoralisUnsignedBodiesHeap(t *testing.T) {
	h := providerHarness(t)
	body := []byte("[" + strings.TrimSuffix(strings.Repeat("{},", httpapi.ProviderBodyMaxDefault/3), ",") + "]")
	require.LessOrEqual(t, len(body), httpapi.ProviderBodyMaxDefault)

	statuses := make([]int, 2)
	peak := testenv.PeakHeapGrowth(func() {
		var wg sync.WaitGroup
		for i := range statuses {
			wg.Add(1)
			go func() {
				defer wg.Done()
				statuses[i] = h.do(http.MethodPost, "/webhook/moralis", body,
					map[string]string{httpapi.HeaderMoralisSignature: "0x" + strings.Repeat("0", 64)}).status
			}()
		}
		wg.Wait()
	})
	for _, s := range statuses {
		require.Equal(t, http.StatusUnauthorized, s)
	}
	t.Logf("2 unsigned bodies of %d bytes: api live heap peaked at +%d MiB", len(body), peak>>20)
	require.Less(t, peak, uint64(64<<20),
		"8 MiB of unauthenticated bytes made the api hold %d MiB (INGEST_UNVERIFIED_BYTES_MAX admits 8x this at once)", peak>>20)
}
