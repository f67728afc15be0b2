package postgres

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
)

// The money rules are table-tested in pkg/ledger, without a database.

func TestRetryEverythingAfterTheLastRound(t *testing.T) {
	waiting := payment.Unavailable("ledger hold", errors.New("hold h has not settled yet"))
	// Three items, the second delivered twice (alias 1 twice).
	out := retryEverything(3, []int{0, 1, 1, 2}, map[int]error{1: waiting})
	require.Len(t, out, 4)
	for i, r := range out {
		require.Equal(t, Retry, r.Kind, i)
	}
	require.Same(t, waiting, out[1].Err)
	require.Same(t, waiting, out[2].Err)
	require.ErrorIs(t, out[0].Err, payment.ErrRetryable)
	require.NotErrorIs(t, out[0].Err, payment.ErrUnavailable, "a rolled-back item spends its budget as any transient error")
	require.ErrorIs(t, out[3].Err, payment.ErrRetryable)
}
