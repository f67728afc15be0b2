package httpapi_test

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/quicknode"
)

// TestQuickNodeGzipDeliveriesSideBySide: a gzip delivery reserves from the
// unverified budget what it has on the wire and what it has decompressed so
// far, not the route's whole 4 MiB limit up front. QuickNode sends every
// stream's deliveries from a few egress addresses, so with one stream per
// network, all compressed, a small delivery still being read must leave its
// client room for another stream's small delivery meanwhile, as two small
// plain deliveries have.
func TestQuickNodeGzipDeliveriesSideBySide(t *testing.T) {
	h := providerHarness(t)
	h.createUser(7)
	require.Equal(t, http.StatusCreated, h.addAddress(7, "ETH_MAINNET", alchemyRecipient).status)

	// A first compressed delivery whose body is still arriving.
	body := quickNodeLogs("0x2", false)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(body)
	_ = zw.Close()
	ts := strconv.FormatInt(fixedNow.Unix(), 10)
	u, err := url.Parse(h.url)
	require.NoError(t, err)
	conn, err := net.Dial("tcp", u.Host)
	require.NoError(t, err)
	defer conn.Close()
	_, err = fmt.Fprintf(conn, "POST /webhook/quicknode HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n%s: n1\r\n%s: %s\r\n%s: %s\r\n\r\n",
		u.Host, gz.Len(), httpapi.HeaderQuickNodeNonce, httpapi.HeaderQuickNodeTimestamp, ts,
		httpapi.HeaderQuickNodeSignature, quicknode.Sign("n1", ts, body, []byte(quickNodeToken)))
	require.NoError(t, err)
	_, err = conn.Write(gz.Bytes()[:gz.Len()/2])
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond) // the api has reserved and is reading

	// Another stream's small compressed delivery meanwhile.
	r := h.postQuickNode(quickNodeLogs("0x1", false), fixedNow, true)
	require.Equal(t, http.StatusOK, r.status, "a small compressed delivery refused while another small one is in flight: %s", r.raw)
	require.Equal(t, 1.0, r.body["accepted"], "%s", r.raw)

	// The first one, finished, is accepted too.
	_, err = conn.Write(gz.Bytes()[gz.Len()/2:])
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	status := make([]byte, len("HTTP/1.1 200"))
	_, err = io.ReadFull(conn, status)
	require.NoError(t, err)
	require.Equal(t, "HTTP/1.1 200", string(status))
}
