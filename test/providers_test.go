package test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/sha3"

	"github.com/settle/settle/pkg/chain/devchain"
	"github.com/settle/settle/pkg/quicknode"
)

const (
	quickNodeToken = "qn-test-security-token-0123456789"
	moralisSecret  = "moralis-test-stream-secret-0123456789"
)

// providerStack is a chain stack with all three provider routes open.
func providerStack(t *testing.T) *chainStack {
	return newChainStack(t, "confirmations:1", map[string]string{
		"QUICKNODE_SECURITY_TOKEN": quickNodeToken,
		"MORALIS_STREAM_SECRET":    moralisSecret,
	})
}

func postJSON(t *testing.T, url string, body []byte, headers map[string]string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	out := map[string]any{}
	_ = json.Unmarshal(data, &out)
	return resp.StatusCode, out
}

// hmacQN is QuickNode's signature, written here apart from pkg/quicknode.
func hmacQN(nonce, timestamp string, body []byte, token string) string {
	return quicknode.Sign(nonce, timestamp, body, []byte(token))
}

// quickNode posts a delivery signed at sent; gz compresses it on the wire.
func (c *chainStack) quickNode(t *testing.T, body []byte, sent time.Time, token string, gz bool) (int, map[string]any) {
	t.Helper()
	ts := strconv.FormatInt(sent.Unix(), 10)
	headers := map[string]string{
		"X-QN-Nonce": "nonce-" + ts, "X-QN-Timestamp": ts,
		"X-QN-Signature": hmacQN("nonce-"+ts, ts, body, token),
	}
	wire := body
	if gz {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		_, _ = zw.Write(body)
		require.NoError(t, zw.Close())
		wire = buf.Bytes()
		headers["Content-Encoding"] = "gzip"
	}
	return postJSON(t, c.api.URL()+"/webhook/quicknode", wire, headers)
}

// rpc asks the dev chain directly.
func (c *chainStack) rpc(t *testing.T, method string, params ...any) json.RawMessage {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	resp, err := http.Post(c.chain.URL(), "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	var out struct {
		Result json.RawMessage `json:"result"`
		Error  any             `json:"error"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	require.Nil(t, out.Error, method)
	return out.Result
}

// quickNodeBlock is the block_with_receipts delivery of tx's block, as
// the chain's JSON-RPC returns the block and its receipts.
func (c *chainStack) quickNodeBlock(t *testing.T, tx devchain.Tx) []byte {
	t.Helper()
	number := fmt.Sprintf("0x%x", tx.BlockNumber)
	block := c.rpc(t, "eth_getBlockByNumber", number, true)
	receipts := c.rpc(t, "eth_getBlockReceipts", number)
	body, _ := json.Marshal(map[string]any{
		"data": []any{map[string]any{"block": block, "receipts": receipts}},
		"metadata": map[string]any{"network": "ethereum-mainnet", "dataset": "block_with_receipts", "blocks_reorged": nil,
			"batch_start_range": tx.BlockNumber, "batch_end_range": tx.BlockNumber, "stream_id": "s-1"},
	})
	return body
}

// member is one key and its JSON value, in the order Moralis sends them.
type member struct {
	key   string
	value string // JSON text, compact
}

// moralisBody writes an object twice from the same members: as
// JSON.stringify would (compact, in order) and as it may arrive (spaced,
// a space before each colon, line breaks). This is a second serialiser,
// independent of pkg/moralis: the members are plain ASCII, so their JS
// serialisation is their compact join.
func moralisBody(members []member) (compact, spaced []byte) {
	var a, b strings.Builder
	a.WriteByte('{')
	b.WriteString("{\n")
	for i, m := range members {
		if i > 0 {
			a.WriteByte(',')
			b.WriteString(",\n")
		}
		fmt.Fprintf(&a, "%q:%s", m.key, m.value)
		fmt.Fprintf(&b, "  %q : %s", m.key, m.value)
	}
	a.WriteByte('}')
	b.WriteString("\n}\n")
	return []byte(a.String()), []byte(b.String())
}

// keccakSig is x-signature over a JS serialisation.
func keccakSig(serialised []byte, secret string) string {
	h := sha3.NewLegacyKeccak256()
	h.Write(serialised)
	h.Write([]byte(secret))
	return "0x" + hex.EncodeToString(h.Sum(nil))
}

func jsonText(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// moralisDelivery is a Moralis delivery of one transfer (a token one
// when token is set, else the transaction's own value).
func moralisDelivery(tx devchain.Tx, token, to, value string, confirmed bool) (compact, spaced []byte) {
	erc20, txs := "[]", "[]"
	if token != "" {
		erc20 = jsonText([]any{map[string]any{"transactionHash": tx.Hash, "logIndex": "0", "contract": token,
			"from": "0x9999999999999999999999999999999999999999", "to": to, "value": value, "tokenDecimals": "6", "possibleSpam": false}})
	} else {
		txs = jsonText([]any{map[string]any{"hash": tx.Hash, "fromAddress": "0x9999999999999999999999999999999999999999",
			"toAddress": to, "value": value, "receiptStatus": "1"}})
	}
	return moralisBody([]member{
		{"confirmed", strconv.FormatBool(confirmed)},
		{"chainId", `"0x1"`},
		{"abi", "[]"},
		{"streamId", `"stream-1"`},
		{"tag", `"settle"`},
		{"retries", "0"},
		{"block", jsonText(map[string]any{"number": strconv.FormatUint(tx.BlockNumber, 10), "hash": tx.BlockHash, "timestamp": "1700000000"})},
		{"logs", "[]"},
		{"txs", txs},
		{"txsInternal", "[]"},
		{"erc20Transfers", erc20},
		{"nftTransfers", "[]"},
	})
}

func (c *chainStack) moralis(t *testing.T, body []byte, signature string) (int, map[string]any) {
	t.Helper()
	return postJSON(t, c.api.URL()+"/webhook/moralis", body, map[string]string{"x-signature": signature})
}

// moralisSigned posts the spaced form signed over the compact one.
func (c *chainStack) moralisSigned(t *testing.T, compact, spaced []byte) (int, map[string]any) {
	t.Helper()
	return c.moralis(t, spaced, keccakSig(compact, moralisSecret))
}

func requireCounts(t *testing.T, answer map[string]any, accepted, duplicates int) {
	t.Helper()
	require.EqualValues(t, accepted, answer["accepted"], "%v", answer)
	require.EqualValues(t, duplicates, answer["duplicates"], "%v", answer)
}

// TestProviderSignatures: each provider's signature, computed in the test:
// valid → accepted; tampered, stale, far-future or under a wrong secret →
// 401 and nothing stored. QuickNode verifies a gzip body over its
// uncompressed bytes; Moralis verifies a spaced body over its JavaScript
// serialisation, and the fixed vector of pkg/moralis verifies end to end.
func TestProviderSignatures(t *testing.T) {
	c := providerStack(t)
	ctx := context.Background()
	ethTx, err := c.chain.SendETH(ctx, 0, addrUser1, wei(2))
	require.NoError(t, err)
	tokenTx, err := c.chain.TransferToken(ctx, 0, c.token, addrUser1, big.NewInt(7_000_000))
	require.NoError(t, err)

	qn := c.quickNodeBlock(t, ethTx)
	now := time.Now()
	for name, post := range map[string]func() (int, map[string]any){
		"tampered": func() (int, map[string]any) {
			ts := strconv.FormatInt(now.Unix(), 10)
			return postJSON(t, c.api.URL()+"/webhook/quicknode", bytes.Replace(qn, []byte(`"s-1"`), []byte(`"s-2"`), 1),
				map[string]string{"X-QN-Nonce": "n", "X-QN-Timestamp": ts, "X-QN-Signature": hmacQN("n", ts, qn, quickNodeToken)})
		},
		"stale": func() (int, map[string]any) {
			return c.quickNode(t, qn, now.Add(-6*time.Minute), quickNodeToken, false)
		},
		"far future": func() (int, map[string]any) {
			return c.quickNode(t, qn, now.Add(10*time.Minute), quickNodeToken, false)
		},
		"wrong token":  func() (int, map[string]any) { return c.quickNode(t, qn, now, "another-token-0123456789", false) },
		"gzip, wrong":  func() (int, map[string]any) { return c.quickNode(t, qn, now, "another-token-0123456789", true) },
		"no signature": func() (int, map[string]any) { return postJSON(t, c.api.URL()+"/webhook/quicknode", qn, nil) },
	} {
		status, answer := post()
		require.Equal(t, http.StatusUnauthorized, status, "quicknode %s: %v", name, answer)
		require.Equal(t, "invalid_signature", answer["code"], name)
	}
	compact, spaced := moralisDelivery(tokenTx, c.token, addrUser1, "7000000", false)
	require.NotEqual(t, compact, spaced, "the wire bytes differ from the serialisation")
	for name, post := range map[string]func() (int, map[string]any){
		"tampered": func() (int, map[string]any) {
			return c.moralis(t, bytes.Replace(spaced, []byte("7000000"), []byte("8000000"), 1), keccakSig(compact, moralisSecret))
		},
		"wrong secret": func() (int, map[string]any) { return c.moralis(t, spaced, keccakSig(compact, "another-secret")) },
		"raw bytes":    func() (int, map[string]any) { return c.moralis(t, spaced, keccakSig(spaced, moralisSecret)) },
		"no 0x":        func() (int, map[string]any) { return c.moralis(t, spaced, keccakSig(compact, moralisSecret)[2:]) },
	} {
		status, answer := post()
		require.Equal(t, http.StatusUnauthorized, status, "moralis %s: %v", name, answer)
	}
	require.Equal(t, 0, c.Count(`SELECT count(*) FROM payment_events`), "nothing stored by a refused delivery")

	status, answer := c.quickNode(t, qn, now, quickNodeToken, true)
	require.Equal(t, http.StatusOK, status, answer)
	requireCounts(t, answer, 1, 0)
	status, answer = c.moralisSigned(t, compact, spaced)
	require.Equal(t, http.StatusOK, status, answer)
	requireCounts(t, answer, 1, 0)
	ethID := "chain:ETH_MAINNET:" + ethTx.Hash + ":native"
	tokenID := "chain:ETH_MAINNET:" + tokenTx.Hash + ":0"
	c.waitStatus(t, ethID, "confirmed")
	c.waitStatus(t, tokenID, "confirmed")
	require.Equal(t, "2", c.balance(t, 1, "ETH"))
	require.Equal(t, "7", c.balance(t, 1, "TUSD"))

	// pkg/moralis's known-answer body (signed by a Keccak-256 written in
	// Python over Node's JSON.stringify) verifies through the route too.
	fixed, err := os.ReadFile("../pkg/moralis/testdata/delivery_spaced.json")
	require.NoError(t, err)
	c.api.Stop(5 * time.Second)
	c.api = c.StartAPI(map[string]string{"MORALIS_STREAM_SECRET": "moralis-stream-secret-0123456789"})
	status, answer = postJSON(t, c.api.URL()+"/webhook/moralis", fixed,
		map[string]string{"x-signature": "0x5ab82ad7c3d017b1fe82740ab518cf4aa6c79a318a350b8e5bb1737dd3b7084d"})
	require.Equal(t, http.StatusOK, status, answer)
	require.EqualValues(t, 1, answer["accepted"], "its transaction pays user 1: stored, for the chain to judge")
}

// bombGrowthMax bounds the api's peak memory growth over four gzip bombs
// of 1 GiB each: a quarter of one bomb.
const bombGrowthMax = 256 << 20

// peakRSS is a process's high-water resident memory (VmHWM), in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			kb, err := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// TestQuickNodeGzipBomb: 1 GiB of zeros, gzip-compressed to about 1 MiB
// (within the wire limit), is refused 413 body_too_large once the
// decompressed bytes pass 4 MiB; nothing is stored and the api's peak
// memory grows by far less than the bomb (bombGrowthMax).
func TestQuickNodeGzipBomb(t *testing.T) {
	c := providerStack(t)
	// One gzip member of 1 MiB of zeros, sent 1,024 times: a reader
	// decodes concatenated members as one stream (multistream, gzip's
	// default), so this is 1 GiB, and compressing 1 GiB under the race
	// detector took minutes of the suite.
	var member bytes.Buffer
	zw, err := gzip.NewWriterLevel(&member, gzip.BestCompression)
	require.NoError(t, err)
	_, err = zw.Write(make([]byte, 1<<20))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	wire := bytes.NewBuffer(bytes.Repeat(member.Bytes(), 1<<10))
	require.Less(t, wire.Len(), 4<<20, "the bomb fits the wire limit")
	t.Logf("1 GiB of zeros is %d bytes gzip-compressed", wire.Len())
	zr, err := gzip.NewReader(bytes.NewReader(wire.Bytes()))
	require.NoError(t, err)
	decoded, err := io.Copy(io.Discard, io.LimitReader(zr, 8<<20))
	require.NoError(t, err)
	require.EqualValues(t, 8<<20, decoded, "the bomb decodes past the 4 MiB limit as one stream")

	before := peakRSS(t, c.api.Pid())
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	for range 4 {
		status, answer := postJSON(t, c.api.URL()+"/webhook/quicknode", wire.Bytes(), map[string]string{
			"Content-Encoding": "gzip", "X-QN-Nonce": "n", "X-QN-Timestamp": ts,
			"X-QN-Signature": strings.Repeat("0", 64),
		})
		require.Equal(t, http.StatusRequestEntityTooLarge, status, answer)
		require.Equal(t, "body_too_large", answer["code"])
	}
	after := peakRSS(t, c.api.Pid())
	t.Logf("api peak RSS %d MiB before, %d MiB after", before>>20, after>>20)
	// Four bodies of at most 4 MiB each (plus the race detector's shadow
	// memory in CI); without the limit the api would hold the whole GiB.
	require.Less(t, after-before, int64(bombGrowthMax), "memory bounded by the limit, not by the bomb")
	require.Equal(t, 0, c.Count(`SELECT count(*) FROM payment_events`))
}

// TestMoralisConfirmations: the test delivery of a new stream is a 200
// that stores nothing; a transfer delivered confirmed then unconfirmed,
// and another the other way round, are one event and one credit each.
func TestMoralisConfirmations(t *testing.T) {
	c := providerStack(t)
	ctx := context.Background()
	testBody := []byte(`{"abi":{},"block":{"hash":"","number":"","timestamp":""},"txs":[],"txsInternal":[],"logs":[],"chainId":"","tag":"","streamId":"","confirmed":true,"retries":0,"erc20Approvals":[],"erc20Transfers":[],"nftApprovals":[],"nftTransfers":[]}`)
	status, answer := c.moralis(t, testBody, keccakSig(testBody, moralisSecret))
	require.Equal(t, http.StatusOK, status, answer)
	requireCounts(t, answer, 0, 0)
	require.EqualValues(t, 0, answer["ignored"])
	require.Equal(t, 0, c.Count(`SELECT count(*) FROM payment_events`))

	first, err := c.chain.SendETH(ctx, 0, addrUser1, wei(3))
	require.NoError(t, err)
	second, err := c.chain.TransferToken(ctx, 0, c.token, addrUser2, big.NewInt(5_000_000))
	require.NoError(t, err)
	for _, order := range []struct {
		tx           devchain.Tx
		token, to    string
		value        string
		confirmedFst bool
	}{
		{first, "", addrUser1, "3000000000000000000", true},
		{second, c.token, addrUser2, "5000000", false},
	} {
		for i, confirmed := range []bool{order.confirmedFst, !order.confirmedFst} {
			compact, spaced := moralisDelivery(order.tx, order.token, order.to, order.value, confirmed)
			status, answer := c.moralisSigned(t, compact, spaced)
			require.Equal(t, http.StatusOK, status, answer)
			requireCounts(t, answer, 1-i, i)
		}
	}
	c.waitStatus(t, "chain:ETH_MAINNET:"+first.Hash+":native", "confirmed")
	c.waitStatus(t, "chain:ETH_MAINNET:"+second.Hash+":0", "confirmed")
	require.Equal(t, 2, c.Count(`SELECT count(*) FROM payment_events`))
	require.Equal(t, 2, c.Count(`SELECT count(*) FROM payment_events WHERE source = 'moralis'`))
	require.Equal(t, "3", c.balance(t, 1, "ETH"))
	require.Equal(t, "5", c.balance(t, 2, "TUSD"))
	require.Equal(t, 2, c.Count(`SELECT count(*) FROM balance_events`))
	requireInvariants(t, c.Stack)
}

// TestOneTransferEveryProvider: real transfers on the dev chain, an ETH
// one and a token one per order, each reported by Alchemy, QuickNode and
// Moralis in every order: one payment_events row and one credit per
// transfer, the first report accepted and the others answered as
// duplicates. (The chain scanner reports the same ids; see
// test/scanner_test.go.)
func TestOneTransferEveryProvider(t *testing.T) {
	c := providerStack(t)
	ctx := context.Background()
	type report func(tx devchain.Tx, token bool) (int, map[string]any)
	reporters := map[string]report{
		"alchemy": func(tx devchain.Tx, token bool) (int, map[string]any) {
			if token {
				return c.alchemy(t, alchemyTokenPayload(c.token, addrUser1, tx, "0xf4240", false))
			}
			return c.alchemy(t, alchemyETHPayload(addrUser1, tx, "0xde0b6b3a7640000"))
		},
		"quicknode": func(tx devchain.Tx, _ bool) (int, map[string]any) {
			return c.quickNode(t, c.quickNodeBlock(t, tx), time.Now(), quickNodeToken, false)
		},
		"moralis": func(tx devchain.Tx, token bool) (int, map[string]any) {
			compact, spaced := moralisDelivery(tx, "", addrUser1, "1000000000000000000", true)
			if token {
				compact, spaced = moralisDelivery(tx, c.token, addrUser1, "1000000", true)
			}
			return c.moralisSigned(t, compact, spaced)
		},
	}
	orders := [][]string{
		{"alchemy", "quicknode", "moralis"}, {"alchemy", "moralis", "quicknode"},
		{"quicknode", "alchemy", "moralis"}, {"quicknode", "moralis", "alchemy"},
		{"moralis", "alchemy", "quicknode"}, {"moralis", "quicknode", "alchemy"},
	}
	var ids []string
	for _, order := range orders {
		for _, token := range []bool{false, true} {
			var tx devchain.Tx
			var err error
			if token {
				tx, err = c.chain.TransferToken(ctx, 0, c.token, addrUser1, big.NewInt(1_000_000))
				ids = append(ids, "chain:ETH_MAINNET:"+tx.Hash+":0")
			} else {
				tx, err = c.chain.SendETH(ctx, 0, addrUser1, wei(1))
				ids = append(ids, "chain:ETH_MAINNET:"+tx.Hash+":native")
			}
			require.NoError(t, err)
			for i, name := range order {
				status, answer := reporters[name](tx, token)
				require.Equal(t, http.StatusOK, status, "%v token=%v %s: %v", order, token, name, answer)
				if i == 0 {
					requireCounts(t, answer, 1, 0)
				} else {
					requireCounts(t, answer, 0, 1)
				}
			}
			require.Equal(t, 1, c.Count(`SELECT count(*) FROM payment_events WHERE tx_hash = $1`, tx.Hash), "%v token=%v", order, token)
			var source string
			require.NoError(t, c.DB.QueryRow(ctx, `SELECT source FROM payment_events WHERE tx_hash = $1`, tx.Hash).Scan(&source))
			require.Equal(t, order[0], source, "the first reporter stored it")
		}
	}
	for _, id := range ids {
		c.waitStatus(t, id, "confirmed")
	}
	require.Equal(t, len(ids), c.Count(`SELECT count(*) FROM payment_events`))
	require.Equal(t, len(ids), c.Count(`SELECT count(*) FROM balance_events WHERE user_id = 1`))
	require.Equal(t, strconv.Itoa(len(orders)), c.balance(t, 1, "ETH"))
	require.Equal(t, strconv.Itoa(len(orders)), c.balance(t, 1, "TUSD"))
	requireInvariants(t, c.Stack)
}

// TestQuickNodeReorgedBlock: a block QuickNode sends again after a reorg
// (listed in blocks_reorged) holds the new branch's transfers. With an RPC
// a transfer settle did not know is stored and credited once the chain
// says so, and the same block sent again is handed to the chain, never a
// second credit.
func TestQuickNodeReorgedBlock(t *testing.T) {
	c := providerStack(t)
	ctx := context.Background()
	tx, err := c.chain.SendETH(ctx, 0, addrUser2, wei(4))
	require.NoError(t, err)
	var delivery map[string]any
	require.NoError(t, json.Unmarshal(c.quickNodeBlock(t, tx), &delivery))
	delivery["metadata"].(map[string]any)["blocks_reorged"] = []uint64{tx.BlockNumber}
	body, _ := json.Marshal(delivery)

	status, answer := c.quickNode(t, body, time.Now(), quickNodeToken, false)
	require.Equal(t, http.StatusOK, status, answer)
	requireCounts(t, answer, 1, 0)
	id := "chain:ETH_MAINNET:" + tx.Hash + ":native"
	c.waitStatus(t, id, "confirmed")

	status, answer = c.quickNode(t, body, time.Now(), quickNodeToken, false)
	require.Equal(t, http.StatusOK, status, answer)
	require.EqualValues(t, 0, answer["accepted"], "%v", answer)
	require.EqualValues(t, 0, answer["reversed"], "with an RPC the chain decides, not the report")
	require.Equal(t, "4", c.balance(t, 2, "ETH"))
	require.Equal(t, 1, c.Count(`SELECT count(*) FROM balance_events WHERE user_id = 2`))
	requireInvariants(t, c.Stack)
}
