package chain

import (
	"encoding/json"
	"math/big"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
)

func TestParseTxHashAndAddress(t *testing.T) {
	hash := "0x" + strings.Repeat("aB", 32)
	got, err := ParseTxHash(hash)
	require.NoError(t, err)
	require.Equal(t, strings.ToLower(hash), got)

	got, err = ParseTxHash("0X" + strings.Repeat("0", 64))
	require.NoError(t, err)
	require.Equal(t, "0x"+strings.Repeat("0", 64), got)

	for _, bad := range []string{"", "0x", hash[:65], hash + "0", "00" + hash[2:], "0x" + strings.Repeat("g", 64), " " + hash[1:]} {
		_, err := ParseTxHash(bad)
		require.ErrorIs(t, err, payment.ErrInvalid, bad)
	}

	addr := "0x" + strings.Repeat("Cd", 20)
	got, err = ParseAddress(addr)
	require.NoError(t, err)
	require.Equal(t, strings.ToLower(addr), got)
	for _, bad := range []string{"", addr[:41], addr + "0", hash} {
		_, err := ParseAddress(bad)
		require.ErrorIs(t, err, payment.ErrInvalid, bad)
	}
}

func TestParseHeader(t *testing.T) {
	hash := "0x" + strings.Repeat("AB", 32)
	h, ok, err := parseHeader(json.RawMessage(`{"number":"0x20","hash":"` + hash + `","timestamp":"0x5f5e100","extra":"ignored"}`))
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, Header{Number: 32, Hash: strings.ToLower(hash), Time: 100_000_000}, h)

	_, ok, err = parseHeader(json.RawMessage(`null`))
	require.NoError(t, err)
	require.False(t, ok)

	for _, bad := range []string{
		`{}`, `[]`, `"x"`, `{"number":"0x20","hash":"` + hash + `"}`,
		`{"number":"32","hash":"` + hash + `","timestamp":"0x1"}`,
		`{"number":"0x020","hash":"` + hash + `","timestamp":"0x1"}`,
		`{"number":"0x10000000000000000","hash":"` + hash + `","timestamp":"0x1"}`,
		`{"number":"0x1","hash":"0x12","timestamp":"0x1"}`,
		`{"number":1,"hash":"` + hash + `","timestamp":"0x1"}`,
	} {
		_, _, err := parseHeader(json.RawMessage(bad))
		require.Error(t, err, bad)
	}
}

func TestParseTxHashes(t *testing.T) {
	a, b := "0x"+strings.Repeat("AB", 32), "0x"+strings.Repeat("cd", 32)
	for raw, want := range map[string][]string{
		`{"transactions":["` + a + `","` + b + `"],"hash":"x"}`: {strings.ToLower(a), b},
		`{"transactions":[]}`: {},
	} {
		got, err := parseTxHashes(json.RawMessage(raw))
		require.NoError(t, err, raw)
		require.Equal(t, want, got, raw)
	}
	for _, bad := range []string{
		`{}`, `[]`, `"x"`, `{"transactions":null}`, `{"transactions":["0x12"]}`,
		`{"transactions":[{"hash":"` + b + `"}]}`, `{"transactions":"` + b + `"}`,
	} {
		_, err := parseTxHashes(json.RawMessage(bad))
		require.Error(t, err, bad)
	}
}

func FuzzParseTxHashes(f *testing.F) {
	for _, seed := range []string{`{"transactions":["0x` + strings.Repeat("ab", 32) + `"]}`, `{"transactions":[]}`, `{}`, `null`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		hashes, err := parseTxHashes(raw)
		if err != nil {
			return
		}
		// Every accepted hash is already in the form settle stores.
		for _, h := range hashes {
			again, err := ParseTxHash(h)
			require.NoError(t, err)
			require.Equal(t, h, again)
		}
	})
}

func TestParseTransaction(t *testing.T) {
	to := "0x" + strings.Repeat("Ab", 20)
	tx, ok, err := parseTransaction(json.RawMessage(`{"to":"` + to + `","value":"0xde0b6b3a7640000","input":"0x"}`))
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, strings.ToLower(to), tx.To)
	require.Equal(t, "1000000000000000000", tx.Value.String())

	creation, ok, err := parseTransaction(json.RawMessage(`{"to":null,"value":"0x0"}`))
	require.NoError(t, err)
	require.True(t, ok)
	require.Empty(t, creation.To, "a contract creation pays nobody")

	_, ok, err = parseTransaction(json.RawMessage(`null`))
	require.NoError(t, err)
	require.False(t, ok)

	for _, bad := range []string{
		`{}`, `[]`, `"x"`, `{"to":"` + to + `"}`,
		`{"to":"` + to + `","value":"1"}`,
		`{"to":"` + to + `","value":"0x01"}`,
		`{"to":"` + to + `","value":"0x1` + strings.Repeat("0", 64) + `"}`,
		`{"to":"0x12","value":"0x1"}`,
		`{"to":"` + to + `","value":1}`,
	} {
		_, _, err := parseTransaction(json.RawMessage(bad))
		require.Error(t, err, bad)
	}
}

func FuzzParseTransaction(f *testing.F) {
	for _, seed := range []string{
		`{"to":"0x` + strings.Repeat("ab", 20) + `","value":"0x1"}`, `{"to":null,"value":"0x0"}`, `null`, `{}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		tx, ok, err := parseTransaction(raw)
		if err != nil || !ok {
			return
		}
		// An accepted transaction has a canonical recipient (or none) and
		// a non-negative value of at most 256 bits.
		if tx.To != "" {
			again, err := parseHex(tx.To, addressHexLength, "address")
			require.NoError(t, err)
			require.Equal(t, tx.To, again)
		}
		require.NotNil(t, tx.Value)
		require.GreaterOrEqual(t, tx.Value.Sign(), 0)
		require.LessOrEqual(t, tx.Value.BitLen(), 256)
	})
}

func TestParseQuantity(t *testing.T) {
	for in, want := range map[string]uint64{"0x0": 0, "0x1": 1, "0xff": 255, "0xFF": 255, "0xffffffffffffffff": 1<<64 - 1} {
		got, err := parseQuantity(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "0x", "0x00", "0x01", "1", "0xg", "0x10000000000000000", "-0x1", "0x-1", "0x+1"} {
		_, err := parseQuantity(bad)
		require.Error(t, err, bad)
	}
}

func FuzzParseHeader(f *testing.F) {
	hash := "0x" + strings.Repeat("ab", 32)
	for _, seed := range []string{
		`{"number":"0x20","hash":"` + hash + `","timestamp":"0x1"}`, `null`, `{}`, `{"number":"0x0"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		h, ok, err := parseHeader(raw)
		if err != nil || !ok {
			return
		}
		// An accepted header has a canonical hash and numbers that print
		// back to what was parsed.
		again, err := parseHex(h.Hash, hashHexLength, "hash")
		require.NoError(t, err)
		require.Equal(t, h.Hash, again)
		// Formatted as a node would send it, it parses to the same header.
		formatted, err := json.Marshal(map[string]string{
			"number": "0x" + strconv.FormatUint(h.Number, 16), "hash": h.Hash, "timestamp": "0x" + strconv.FormatUint(h.Time, 16),
		})
		require.NoError(t, err)
		h2, ok, err := parseHeader(formatted)
		require.NoError(t, err, "formatted %s", formatted)
		require.True(t, ok)
		require.Equal(t, h, h2)
	})
}

func FuzzParseTxHash(f *testing.F) {
	for _, seed := range []string{"0x" + strings.Repeat("ab", 32), "0X" + strings.Repeat("AB", 32), "", "0x", "0x" + strings.Repeat("g", 64)} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in string) {
		h, err := ParseTxHash(in)
		if err != nil {
			require.ErrorIs(t, err, payment.ErrInvalid)
			return
		}
		require.Len(t, h, hashHexLength)
		require.Equal(t, strings.ToLower(in[2:]), h[2:])
		again, err := ParseTxHash(h)
		require.NoError(t, err)
		require.Equal(t, h, again)
	})
}

func FuzzDecodeFinalRecord(f *testing.F) {
	txHash := "0x" + strings.Repeat("11", 32)
	good, err := encodeFinalRecord(&Receipt{
		TxHash: txHash, Status: 1, BlockNumber: 7, BlockHash: "0x" + strings.Repeat("22", 32),
		Transfers: []Transfer{{Contract: "0x" + strings.Repeat("33", 20), From: "0x" + strings.Repeat("44", 20), To: "0x" + strings.Repeat("55", 20), Value: big.NewInt(9), LogIndex: 2}},
	})
	require.NoError(f, err)
	f.Add(good)
	native, err := encodeFinalRecord(&Receipt{
		TxHash: txHash, Status: 1, BlockNumber: 7, BlockHash: "0x" + strings.Repeat("22", 32),
		TxTo: "0x" + strings.Repeat("66", 20), TxValue: big.NewInt(12),
	})
	require.NoError(f, err)
	f.Add(native)
	f.Add([]byte(`{"v":1}`))
	f.Add([]byte(`garbage`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		r, err := decodeFinalRecord(raw, txHash)
		if err != nil {
			return
		}
		// Whatever is accepted encodes back to an entry that decodes to
		// the same receipt.
		again, err := encodeFinalRecord(r)
		require.NoError(t, err)
		r2, err := decodeFinalRecord(again, txHash)
		require.NoError(t, err)
		require.Equal(t, r, r2)
	})
}
