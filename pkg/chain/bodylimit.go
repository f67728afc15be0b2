package chain

import (
	"errors"
	"fmt"
	"io"
	"net/http"
)

// Bounds of one RPC answer's body (one HTTP response: a call, or a whole
// batch), counted after the transport's gzip decompression. go-ethereum's
// client decodes an answer whole, so without this a broken or lying node
// makes the process allocate whatever it sends before any parser's own
// check. The largest honest answers are the scanner's batches: 50 full
// blocks or 4 blocks' call traces, tens of MiB on mainnet.
const (
	ResponseMaxDefault = 128 << 20
	ResponseMaxMin     = 1 << 20
	ResponseMaxLimit   = 1 << 30
	// ResponseMaxSetting names the setting in the error an operator sees.
	ResponseMaxSetting = "RPC_RESPONSE_MAX"
)

// ErrResponseTooLarge: the node's answer was longer than RPC_RESPONSE_MAX.
// The endpoint misbehaves (or the setting is too low for it): the call
// fails, counts against the breaker, and comes wrapped as
// payment.ErrUnavailable. An eth_getLogs answer over it is ErrLogsLimit
// instead, so the scanner asks again over fewer blocks.
var ErrResponseTooLarge = errors.New("rpc answer larger than " + ResponseMaxSetting)

// boundResponses wraps base (nil: http.DefaultTransport) so that reading
// more than limit bytes of a response body fails. A non-2xx body is only
// ever an error message and is bounded by rpcErrorBodyMax.
func boundResponses(base http.RoundTripper, limit int64) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &boundedTransport{
		base:          base,
		limit:         limit,
		tooLarge:      fmt.Errorf("%w=%d bytes", ErrResponseTooLarge, limit),
		errorTooLarge: fmt.Errorf("rpc error answer larger than %d bytes", rpcErrorBodyMax),
	}
}

type boundedTransport struct {
	base          http.RoundTripper
	limit         int64
	tooLarge      error
	errorTooLarge error
}

func (t *boundedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	limit, tooLarge := t.limit, t.tooLarge
	if resp.StatusCode < 200 || resp.StatusCode >= 300 {
		limit, tooLarge = min(limit, rpcErrorBodyMax), t.errorTooLarge
	}
	if resp.ContentLength > limit {
		// Announced too long: not a byte of it is read. Closing unread
		// drops the connection, which is what a misbehaving node gets.
		_ = resp.Body.Close()
		resp.Body = &boundedBody{failed: true, tooLarge: tooLarge, body: http.NoBody}
		return resp, nil
	}
	resp.Body = &boundedBody{body: resp.Body, left: limit, tooLarge: tooLarge}
	return resp, nil
}

// boundedBody reads at most left bytes of body and one more to tell an
// answer of exactly the limit from a longer one; past that every Read
// fails, so draining it before Close (go-ethereum does) stops at once.
type boundedBody struct {
	body     io.ReadCloser
	left     int64
	tooLarge error
	failed   bool
}

func (b *boundedBody) Read(p []byte) (int, error) {
	if b.failed {
		return 0, b.tooLarge
	}
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.body.Read(p)
	if int64(n) > b.left {
		n, b.left, b.failed = int(b.left), 0, true
		return n, b.tooLarge
	}
	b.left -= int64(n)
	return n, err
}

func (b *boundedBody) Close() error { return b.body.Close() }
