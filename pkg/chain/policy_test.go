package chain

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParsePolicy(t *testing.T) {
	cases := []struct {
		in            string
		kind          PolicyKind
		confirmations uint64
		watchWithRPC  bool
		watchNoRPC    bool
	}{
		{in: "finalized", kind: Finalized},
		{in: "none", kind: None, watchWithRPC: true},
		{in: "confirmations:1", kind: Confirmations, confirmations: 1, watchWithRPC: true, watchNoRPC: true},
		{in: "confirmations:12", kind: Confirmations, confirmations: 12, watchWithRPC: true, watchNoRPC: true},
		{in: "confirmations:10000", kind: Confirmations, confirmations: 10000, watchWithRPC: true, watchNoRPC: true},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			p, err := ParsePolicy(tc.in)
			require.NoError(t, err)
			require.True(t, p.Valid())
			require.Equal(t, tc.kind, p.Kind())
			require.Equal(t, tc.confirmations, p.Confirmations())
			require.Equal(t, tc.in, p.String())
			require.Equal(t, tc.watchWithRPC, p.WatchesReorgs(true))
			require.Equal(t, tc.watchNoRPC, p.WatchesReorgs(false))
		})
	}
}

func TestParsePolicyRejects(t *testing.T) {
	for _, in := range []string{
		"", "Finalized", "FINALIZED", " finalized", "finalized ", "final", "safe", "latest", "None",
		"confirmations", "confirmations:", "confirmations:0", "confirmations:10001", "confirmations:-1",
		"confirmations:+5", "confirmations:05", "confirmations:5 ", "confirmations: 5", "confirmations:5.0",
		"confirmations:1e3", "confirmations:0x10", "confirmations:١٢", "confirmations:18446744073709551616",
		"confirmations=5", "Confirmations:5", "confirmations:5:5",
	} {
		t.Run(in, func(t *testing.T) {
			p, err := ParsePolicy(in)
			require.Error(t, err)
			require.False(t, p.Valid())
		})
	}
}

func TestZeroPolicyIsInvalid(t *testing.T) {
	require.False(t, Policy{}.Valid())
	require.False(t, Policy{}.WatchesReorgs(true))
}

func FuzzParsePolicy(f *testing.F) {
	for _, seed := range []string{"finalized", "none", "confirmations:1", "confirmations:10000", "confirmations:0", "confirmations:007", ""} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in string) {
		p, err := ParsePolicy(in)
		if err != nil {
			require.False(t, p.Valid())
			return
		}
		// Every accepted value has exactly one spelling: itself.
		require.True(t, p.Valid())
		require.Equal(t, in, p.String())
		again, err := ParsePolicy(p.String())
		require.NoError(t, err)
		require.Equal(t, p, again)
	})
}
