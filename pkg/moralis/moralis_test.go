package moralis_test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/moralis"
	"github.com/settle/settle/pkg/payment"
)

const secret = "moralis-stream-secret-0123456789"

// TestStringifyMatchesNode: every line of testdata/stringify.in comes out
// as Node.js 20's JSON.stringify(JSON.parse(line)) wrote it, once, into
// testdata/stringify.node (node stringify over generated bodies: spacing,
// escapes, lone surrogates, U+2028, number forms, integer-like and
// repeated keys).
func TestStringifyMatchesNode(t *testing.T) {
	in, err := os.ReadFile("testdata/stringify.in")
	require.NoError(t, err)
	want, err := os.ReadFile("testdata/stringify.node")
	require.NoError(t, err)
	inputs := strings.Split(strings.TrimSuffix(string(in), "\n"), "\n")
	outputs := strings.Split(strings.TrimSuffix(string(want), "\n"), "\n")
	require.Len(t, outputs, len(inputs))
	for i, line := range inputs {
		got, err := moralis.Stringify([]byte(line))
		require.NoError(t, err, "line %d", i+1)
		require.Equal(t, outputs[i], string(got), "line %d: %s", i+1, line)
	}
}

// TestStringifyAgainstNodeLive compares with a node binary when there is
// one (skipped otherwise): the fixed corpus above is the CI check.
func TestStringifyAgainstNodeLive(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("no node on PATH")
	}
	bodies := []string{
		`{"z":1,"10":2,"9":3,"a":[1.10,2e-7,-0.0,1e21,123456789012345678901]}`,
		"{\"s\":\"\\u2028\\u2029<>&\\u007f\\u0001\\ud800\\udfff\\uDBFF\\uDFFF\"}",
		`{"a":1,"a":{"b":2},"b":null,"c":true,"d":false,"":""}`,
	}
	script := `const rl=require("readline").createInterface({input:process.stdin});rl.on("line",l=>console.log(JSON.stringify(JSON.parse(l))))`
	cmd := exec.Command(node, "-e", script)
	cmd.Stdin = strings.NewReader(strings.Join(bodies, "\n") + "\n")
	out, err := cmd.Output()
	require.NoError(t, err)
	sc := bufio.NewScanner(bytes.NewReader(out))
	for _, body := range bodies {
		require.True(t, sc.Scan())
		got, err := moralis.Stringify([]byte(body))
		require.NoError(t, err)
		require.Equal(t, sc.Text(), string(got), body)
	}
}

// TestSignatureKnownAnswer pins the signature of a body whose bytes
// differ from its serialisation (spacing, \u escapes, 1.0e10, 0.50, an
// integer-like key placed first): its JSON.stringify was written by
// Node.js 20 into testdata/delivery_spaced.stringified, and the digest
// computed over that text + secret by a Keccak-256 written separately in
// Python (checked against keccak256("") = c5d246…a470):
//
//	(cat delivery_spaced.stringified; printf %s "$SECRET") | python3 keccak.py
func TestSignatureKnownAnswer(t *testing.T) {
	const want = "0x5ab82ad7c3d017b1fe82740ab518cf4aa6c79a318a350b8e5bb1737dd3b7084d"
	body, err := os.ReadFile("testdata/delivery_spaced.json")
	require.NoError(t, err)
	text, err := os.ReadFile("testdata/delivery_spaced.stringified")
	require.NoError(t, err)
	got, err := moralis.Stringify(body)
	require.NoError(t, err)
	require.Equal(t, string(text), string(got))
	sig, err := moralis.Sign(body, []byte(secret))
	require.NoError(t, err)
	require.Equal(t, want, sig)
	require.True(t, moralis.Verify(body, want, []byte(secret)))
	require.True(t, moralis.Verify(body, "0x"+strings.ToUpper(want[2:]), []byte("other"), []byte(secret)), "upper-case hex, second secret")
	require.True(t, moralis.Verify(text, want, []byte(secret)), "the serialisation itself verifies too")

	require.False(t, moralis.Verify(body, want, []byte(secret+"x")), "wrong secret")
	require.False(t, moralis.Verify(body, want[2:], []byte(secret)), "no 0x")
	require.False(t, moralis.Verify(bytes.Replace(body, []byte(`"2000000000000000000"`), []byte(`"3000000000000000000"`), 1), want, []byte(secret)), "tampered value")
	require.False(t, moralis.Verify(append(body, '}'), want, []byte(secret)), "not JSON")
	require.False(t, moralis.Verify([]byte("{\"a\":\"\xff\"}"), want, []byte(secret)), "invalid UTF-8")
	deep := strings.Repeat("[", moralis.DepthMax+2) + strings.Repeat("]", moralis.DepthMax+2)
	_, err = moralis.Stringify([]byte(deep))
	require.Error(t, err, "deeper than DepthMax")
}

func TestNumberString(t *testing.T) {
	for in, want := range map[float64]string{
		1: "1", 100: "100", 1e21: "1e+21", 1e20: "100000000000000000000", 0.1: "0.1", 1e-7: "1e-7",
		0.000001: "0.000001", 1.5e300: "1.5e+300", 5e-324: "5e-324", -2.5: "-2.5", 123e-20: "1.23e-18",
	} {
		require.Equal(t, want, moralis.NumberString(in), "%v", in)
	}
}

type chains map[int64]string

func (c chains) NetworkOf(id int64) (string, bool) { n, ok := c[id]; return n, ok }

var networks = chains{1: "ETH_MAINNET", 8453: "BASE_MAINNET"}

func registry() *payment.Registry {
	return payment.NewRegistry([]payment.Asset{
		{Code: "ETH", Network: "ETH_MAINNET", Decimals: 18},
		{Code: "USDC", Network: "ETH_MAINNET", Contract: "0xa0b86991c6218b36c1d19d4a2e9eb0ce3606eb48", Decimals: 6},
	})
}

func TestDecodeTransfers(t *testing.T) {
	body := []byte(`{"confirmed":true,"chainId":"0x1","block":{"number":"19000000"},"streamId":"s",
	"erc20Transfers":[
	  {"transactionHash":"0x7A4A39DA2A3FA1FC2EF88FD1EAEA070286ED2ABA21E0419DCFB6D5C5D9F02A72","logIndex":"12","contract":"0xA0b86991c6218b36c1d19d4a2e9eb0ce3606eB48","from":"0x9999999999999999999999999999999999999999","to":"0x1111111111111111111111111111111111111111","value":"7000000","tokenDecimals":"18","valueWithDecimals":"1e99"},
	  {"transactionHash":"0x7a4a39da2a3fa1fc2ef88fd1eaea070286ed2aba21e0419dcfb6d5c5d9f02a72","logIndex":13,"contract":"0xdddddddddddddddddddddddddddddddddddddddd","to":"0x1111111111111111111111111111111111111111","value":"1"},
	  {"transactionHash":"0x7a4a39da2a3fa1fc2ef88fd1eaea070286ed2aba21e0419dcfb6d5c5d9f02a72","logIndex":"014","contract":"0xa0b86991c6218b36c1d19d4a2e9eb0ce3606eb48","to":"0x1111111111111111111111111111111111111111","value":"1"}],
	"txs":[
	  {"hash":"0x0a20777dadad23b885daf4cd95a955293f230de3abd64705db324f45ae0f664e","toAddress":"0x1111111111111111111111111111111111111111","value":"2000000000000000000","receiptStatus":"1"},
	  {"hash":"0x0b20777dadad23b885daf4cd95a955293f230de3abd64705db324f45ae0f664e","toAddress":"0x1111111111111111111111111111111111111111","value":"5","receiptStatus":"0"},
	  {"hash":"0x0c20777dadad23b885daf4cd95a955293f230de3abd64705db324f45ae0f664e","toAddress":"0x1111111111111111111111111111111111111111","value":"0","receiptStatus":"1"}],
	"txsInternal":[{"transactionHash":"0x0a20777dadad23b885daf4cd95a955293f230de3abd64705db324f45ae0f664e","to":"0x1111111111111111111111111111111111111111","value":"1"}],
	"unknownField":{"x":1}}`)
	p, err := moralis.Decode(body)
	require.NoError(t, err)
	require.False(t, p.Test)
	transfers, ignored := moralis.Transfers(p, registry(), networks)
	require.Len(t, transfers, 2)
	require.Equal(t, "chain:ETH_MAINNET:0x7a4a39da2a3fa1fc2ef88fd1eaea070286ed2aba21e0419dcfb6d5c5d9f02a72:12", transfers[0].EventID())
	require.Equal(t, "USDC", transfers[0].Asset.Code)
	require.Equal(t, "7", transfers[0].Amount.String(), "value over the registry's decimals, not tokenDecimals")
	require.Equal(t, "chain:ETH_MAINNET:0x0a20777dadad23b885daf4cd95a955293f230de3abd64705db324f45ae0f664e:native", transfers[1].EventID())
	require.Equal(t, "2", transfers[1].Amount.String())
	reasons := map[payment.IgnoreReason]int{}
	for _, i := range ignored {
		reasons[i.Reason]++
	}
	require.Equal(t, map[payment.IgnoreReason]int{
		payment.IgnoreUnknownAsset: 1, payment.IgnoreMalformed: 1, payment.IgnoreFailed: 1,
		payment.IgnoreZeroAmount: 1, moralis.IgnoreInternal: 1,
	}, reasons)
	require.Equal(t, p.Candidates(), len(transfers)+len(ignored))

	// The same body unconfirmed names the same events.
	p2, err := moralis.Decode(bytes.Replace(body, []byte(`"confirmed":true`), []byte(`"confirmed":false`), 1))
	require.NoError(t, err)
	again, _ := moralis.Transfers(p2, registry(), networks)
	require.Equal(t, transfers, again)

	// A chain settle does not map: every candidate ignored.
	p3, err := moralis.Decode(bytes.Replace(body, []byte(`"0x1"`), []byte(`"0x38"`), 1))
	require.NoError(t, err)
	none, ignored := moralis.Transfers(p3, registry(), networks)
	require.Empty(t, none)
	require.Len(t, ignored, p3.Candidates())
}

func TestDecodeTestDelivery(t *testing.T) {
	body := []byte(`{"abi":{},"block":{"hash":"","number":"","timestamp":""},"txs":[],"txsInternal":[],"logs":[],"chainId":"","tag":"","streamId":"","confirmed":true,"retries":0,"erc20Approvals":[],"erc20Transfers":[],"nftApprovals":[],"nftTransfers":[]}`)
	p, err := moralis.Decode(body)
	require.NoError(t, err)
	require.True(t, p.Test)
	transfers, ignored := moralis.Transfers(p, registry(), networks)
	require.Empty(t, transfers)
	require.Empty(t, ignored)

	for _, bad := range []string{`[]`, `{"chainId":"1"}`, `{"chainId":"","txs":[{}]}`, `{"chainId":"0x"}`, `not json`} {
		_, err := moralis.Decode([]byte(bad))
		require.ErrorIs(t, err, moralis.ErrPayload, bad)
	}
}

// Every transfer of a delivery names the delivery's block, so the intake
// weighs it with the other providers' reports of that block; a block
// hash that does not read names none.
func TestTransfersNameTheirBlock(t *testing.T) {
	body := func(hash string) []byte {
		return []byte(fmt.Sprintf(`{"confirmed":false,"chainId":"0x1","block":{"number":"16","hash":%q},
		"erc20Transfers":[{"transactionHash":"0x7a4a39da2a3fa1fc2ef88fd1eaea070286ed2aba21e0419dcfb6d5c5d9f02a72","logIndex":"12","contract":"0xa0b86991c6218b36c1d19d4a2e9eb0ce3606eb48","to":"0x1111111111111111111111111111111111111111","value":"7000000"}],
		"txs":[{"hash":"0x0a20777dadad23b885daf4cd95a955293f230de3abd64705db324f45ae0f664e","toAddress":"0x1111111111111111111111111111111111111111","value":"2","receiptStatus":"1"}]}`, hash))
	}
	hash := "0x" + strings.Repeat("Ab", 32)
	p, err := moralis.Decode(body(hash))
	require.NoError(t, err)
	transfers, _ := moralis.Transfers(p, registry(), networks)
	require.Len(t, transfers, 2)
	for _, tr := range transfers {
		require.Equal(t, strings.ToLower(hash), tr.BlockHash)
	}
	p, err = moralis.Decode(body("0x12"))
	require.NoError(t, err)
	transfers, _ = moralis.Transfers(p, registry(), networks)
	require.Len(t, transfers, 2)
	for _, tr := range transfers {
		require.Empty(t, tr.BlockHash)
	}
}
