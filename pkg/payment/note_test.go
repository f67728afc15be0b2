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
	// A reason may span lines; no escape sequence reaches a terminal.
	require.True(t, payment.NoteFits("line one\r\nline two\tend", payment.ReasonLengthMax))
	require.False(t, payment.NoteFits("red \x1b[31m", payment.ReasonLengthMax))
	require.False(t, payment.NoteFits("nul \x00", payment.ReasonLengthMax))
	require.False(t, payment.NoteFits("c1 \u009b", payment.ReasonLengthMax))
}

// A name is one line of text.
func TestNameFits(t *testing.T) {
	require.True(t, payment.NameFits("Ann O'Neil (oncall)", payment.OperatorLengthMax))
	require.False(t, payment.NameFits("ann\nbob", payment.OperatorLengthMax))
	require.False(t, payment.NameFits("ann\tbob", payment.OperatorLengthMax))
	require.False(t, payment.NameFits("ann\x1b[2J", payment.OperatorLengthMax))
	require.False(t, payment.NameFits(strings.Repeat("n", payment.OperatorLengthMax+1), payment.OperatorLengthMax))
}
