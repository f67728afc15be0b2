package chain

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
)

// TestRedirectDoesNotCarryTheKeyElsewhere: an endpoint that answers a
// redirect (a provider moving hosts, a hijacked DNS name, a proxy) would
// have the client re-send the call to a host nobody configured, with the
// whole endpoint URL (its path and query: the API key) as Referer. A
// redirect is an outage instead, and the other host hears nothing.
func TestRedirectDoesNotCarryTheKeyElsewhere(t *testing.T) {
	const key, queryKey = "SECRETKEY0123456789abcdef", "QUERYKEY0123456789abcdef"
	var mu sync.Mutex
	var heard []string
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		heard = append(heard, r.URL.RequestURI()+" referer="+r.Header.Get("Referer"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"jsonrpc":"2.0","id":1,"result":"0x1"}`))
	}))
	defer other.Close()
	for _, status := range []int{http.StatusTemporaryRedirect, http.StatusPermanentRedirect, http.StatusFound} {
		moved := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, other.URL+"/elsewhere", status)
		}))
		c, err := Dial(context.Background(), moved.URL+"/v2/"+key+"?key="+queryKey, ClientOptions{
			Logger: zerolog.Nop(), Registerer: prometheus.NewRegistry(),
			Breaker: BreakerSettings{ErrorsMax: 1 << 20, ErrorWindow: time.Minute},
		})
		require.NoError(t, err)
		_, err = c.ChainID(context.Background())
		c.Close()
		moved.Close()
		mu.Lock()
		got := strings.Join(heard, "\n")
		mu.Unlock()
		require.NotContains(t, got, key, "HTTP %d: the other host heard the key", status)
		require.NotContains(t, got, queryKey, "HTTP %d: the other host heard the key", status)
		require.Empty(t, got, "HTTP %d: the other host heard nothing", status)
		require.ErrorIs(t, err, payment.ErrUnavailable, "HTTP %d", status)
		require.NotContains(t, err.Error(), key)
		require.NotContains(t, err.Error(), queryKey)
	}
}
