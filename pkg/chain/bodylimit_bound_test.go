package chain

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// countingBody counts the bytes read through it into n.
type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// TestBoundedBody: exactly the bound passes, one byte more fails and
// keeps failing, and no more than the bound and one byte is read from
// the body, whatever the reads' sizes.
func TestBoundedBody(t *testing.T) {
	const limit = 1000
	for _, tc := range []struct {
		size  int
		chunk int
		fails bool
	}{
		{size: 0, chunk: 512},
		{size: limit - 1, chunk: 1},
		{size: limit, chunk: 512},
		{size: limit, chunk: 4096},
		{size: limit + 1, chunk: 512, fails: true},
		{size: limit + 1, chunk: 1, fails: true},
		{size: 100 * limit, chunk: 4096, fails: true},
	} {
		checkBoundedBody(t, tc.size, limit, tc.chunk)
	}
}

func checkBoundedBody(t *testing.T, size, limit, chunk int) {
	t.Helper()
	var read atomic.Int64
	under := &countingBody{ReadCloser: io.NopCloser(bytes.NewReader(make([]byte, size))), n: &read}
	transport := boundResponses(roundTripperFunc(func(*http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusOK, Body: under, ContentLength: -1}, nil
	}), int64(limit))
	resp, err := transport.RoundTrip(httptest.NewRequest(http.MethodPost, "http://node.invalid/", nil))
	require.NoError(t, err)
	got, err := io.ReadAll(&chunkReader{r: resp.Body, chunk: chunk})
	require.LessOrEqual(t, read.Load(), int64(limit+1), "size %d chunk %d", size, chunk)
	if size <= limit {
		require.NoError(t, err, "size %d chunk %d", size, chunk)
		require.Len(t, got, size)
		return
	}
	require.ErrorIs(t, err, ErrResponseTooLarge, "size %d chunk %d", size, chunk)
	require.Len(t, got, limit)
	n, err := resp.Body.Read(make([]byte, chunk))
	require.Zero(t, n)
	require.ErrorIs(t, err, ErrResponseTooLarge, "it keeps failing")
	require.NoError(t, resp.Body.Close())
}

// FuzzBoundedBody: any body size, bound and read size keep the
// invariants of TestBoundedBody.
func FuzzBoundedBody(f *testing.F) {
	f.Add(uint16(0), uint16(1), uint16(1))
	f.Add(uint16(1000), uint16(1000), uint16(512))
	f.Add(uint16(1001), uint16(1000), uint16(1))
	f.Fuzz(func(t *testing.T, size, limit, chunk uint16) {
		if chunk == 0 {
			chunk = 1
		}
		checkBoundedBody(t, int(size), int(limit), int(chunk))
	})
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// chunkReader reads r at most chunk bytes at a time.
type chunkReader struct {
	r     io.Reader
	chunk int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(p) > c.chunk {
		p = p[:c.chunk]
	}
	return c.r.Read(p)
}
