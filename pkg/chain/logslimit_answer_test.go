package chain

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/ethereum/go-ethereum/rpc"
	"github.com/stretchr/testify/require"
)

// TestLogsLimitError: the providers' refusals are recognised by their
// words (in a JSON-RPC error or a non-2xx body); other errors with the
// same codes, rate limits and outages are not.
func TestLogsLimitError(t *testing.T) {
	body := func(code int, message string) []byte {
		return fmt.Appendf(nil, `{"jsonrpc":"2.0","id":1,"error":{"code":%d,"message":%q}}`, code, message)
	}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"infura", rpcError{-32005, "query returned more than 10000 results. Try with this block range [0xBDE5F8, 0x102DBCC]."}, true},
		{"infura live range", rpcError{-32602, "range 1000000 exceeds limit of 10000"}, true},
		{"infura timeout", rpcError{-32005, "query timeout exceeded"}, true},
		{"alchemy", rpcError{-32602, "Log response size exceeded. You can make eth_getLogs requests with up to a 2K block range"}, true},
		{"geth range limit", rpcError{-32602, "exceed maximum block range 1000"}, true},
		{"reth", rpcError{-32602, "query exceeds max results 20000, retry with the range 23879634-23879696"}, true},
		{"range too large", rpcError{-32603, "eth_getLogs range is too large, max is 1k blocks"}, true},
		{"blockpi", rpcError{-32602, "eth_getLogs is limited to 1024 block range. Please check the parameter requirements"}, true},
		{"free tier", rpcError{35, "ranges over 10000 blocks are not supported on freetier"}, true},
		{"quicknode 413", rpc.HTTPError{StatusCode: http.StatusRequestEntityTooLarge, Status: "413", Body: body(-32614, "eth_getLogs is limited to a 10,000 range")}, true},
		{"wrapped", fmt.Errorf("chain eth_getLogs: %w", rpcError{-32005, "query returned more than 10000 results"}), true},
		{"invalid params", rpcError{-32602, "invalid argument 0: hex string without 0x prefix"}, false},
		{"infura rate limit", rpcError{-32005, "daily request count exceeded, request rate limited"}, false},
		{"429 whatever it says", rpc.HTTPError{StatusCode: http.StatusTooManyRequests, Body: body(-32005, "query returned more than 10000 results")}, false},
		{"502", rpc.HTTPError{StatusCode: http.StatusBadGateway, Body: []byte("<html>bad gateway</html>")}, false},
		{"outage", errors.New("dial tcp: connection refused"), false},
		{"nil", nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			reason, ok := logsLimitError(c.err, nil)
			require.Equal(t, c.want, ok)
			if ok {
				require.NotEmpty(t, reason)
			}
		})
	}
	long := strings.Repeat("query returned more than 10000 results ", 100)
	reason, ok := logsLimitMessage(long)
	require.True(t, ok)
	require.LessOrEqual(t, len(reason), logsLimitReasonMax+len("…"), "a node's long message is cut")
}

type rpcError struct {
	code    int
	message string
}

func (e rpcError) Error() string  { return e.message }
func (e rpcError) ErrorCode() int { return e.code }

// FuzzLogsLimitAnswer: a provider's non-2xx answer never panics the
// reader; what it calls a limit names one of the known phrases and keeps
// the reason bounded and valid UTF-8.
func FuzzLogsLimitAnswer(f *testing.F) {
	f.Add(http.StatusRequestEntityTooLarge, []byte(`{"jsonrpc":"2.0","id":206,"error":{"code":-32614,"message":"eth_getLogs is limited to a 10,000 range"}}`))
	f.Add(http.StatusOK, []byte(`{"jsonrpc":"2.0","id":1,"error":{"code":-32005,"message":"query returned more than 10000 results"}}`))
	f.Add(http.StatusTooManyRequests, []byte(`{"error":{"code":429,"message":"Your app has exceeded its compute units per second capacity"}}`))
	f.Add(http.StatusBadGateway, []byte(`<html>bad gateway</html>`))
	f.Add(http.StatusOK, []byte(`{"error":null}`))
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		reason, ok := logsLimitHTTP(status, body, nil)
		if !ok {
			return
		}
		if status == http.StatusTooManyRequests {
			t.Fatal("a rate limit called a size limit")
		}
		if len(reason) > logsLimitReasonMax+len("…") {
			t.Fatalf("reason of %d bytes", len(reason))
		}
		if _, again := logsLimitMessage(reason); !again && len(reason) <= logsLimitReasonMax {
			t.Fatalf("reason %q names no known phrase", reason)
		}
	})
}
