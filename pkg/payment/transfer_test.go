package payment_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
)

func TestParseTransferIndex(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"native", "native"},
		{"007", "7"},
		{"trace:call_0_1", "trace:call_0_1"},
		{"trace:CALL_0_1", "trace:call_0_1"}, // a Parity-style trace's spelling
		{"trace:DelegateCall_2", "trace:delegatecall_2"},
	} {
		got, err := payment.ParseTransferIndex(c.in)
		require.NoError(t, err, c.in)
		require.Equal(t, c.want, got, c.in)
	}
	for _, bad := range []string{"", "NATIVE", "trace:", "trace:call-0", "Trace:call_0", "-1", "0x1"} {
		_, err := payment.ParseTransferIndex(bad)
		require.Error(t, err, bad)
	}
	require.Equal(t, "trace:call_1_1_0", payment.TraceTransfer("CALL_1_1_0"))
	require.Equal(t, payment.TraceTransfer("call_1_1_0"), payment.TraceTransfer("CALL_1_1_0"), "one frame, one index")
}

// FuzzParseTransferIndex: an accepted index is canonical (parsing it again
// gives it back), and a trace index has one spelling.
func FuzzParseTransferIndex(f *testing.F) {
	for _, s := range []string{"native", "007", "trace:CALL_0_1", "trace:call_0", "unresolved:x", "trace:" + strings.Repeat("a", 97)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		index, err := payment.ParseTransferIndex(s)
		if err != nil {
			return
		}
		again, err := payment.ParseTransferIndex(index)
		require.NoError(t, err, "%q gave %q", s, index)
		require.Equal(t, index, again)
		if payment.InternalTransfer(index) {
			require.Equal(t, strings.ToLower(index), index)
		}
	})
}
