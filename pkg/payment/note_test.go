package payment_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
)

// Names and reasons are bounded in characters, not bytes, and must be
// text.
func TestNoteFits(t *testing.T) {
	require.True(t, payment.NoteFits(strings.Repeat("ж", payment.OperatorLengthMax), payment.OperatorLengthMax))
	require.False(t, payment.NoteFits(strings.Repeat("ж", payment.OperatorLengthMax+1), payment.OperatorLengthMax))
	require.True(t, payment.NoteFits("", payment.ReasonLengthMax))
	require.False(t, payment.NoteFits("ok\xff", payment.ReasonLengthMax))
}
