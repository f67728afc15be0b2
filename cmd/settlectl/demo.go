//go:build dev

package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/chain/devchain"
	"github.com/settle/settle/pkg/payment"
)

func init() {
	register("demo", "against a running `settlectl dev`: real chain transactions, their signed webhooks, followed to settlement", runDemo)
}

const (
	demoWait        = 4 * time.Minute
	demoPoll        = time.Second
	demoHTTPTimeout = 10 * time.Second
	// demoWithdrawal of ETH from alice once her deposits are in.
	demoWithdrawal = "0.4"
	// demoPrecise: seven decimals, too many for a 6-decimals listing.
	demoPrecise = "0.0000001"
)

// The demo's deposits on the i-th network: decimal strings, turned into
// base units with that network's decimals (never through a float).
var (
	demoETHAmounts   = []string{"1.5", "0.5", "0.25", "0.125"}
	demoTokenAmounts = []string{"25", "12.5", "6.25", "3.125"}
)

// demoUser is a user of the demo with the deposit address it receives on
// (the same on every network, as one key's address is).
type demoUser struct {
	id      int64
	address string
}

// demoChain is one network of the running stack.
type demoChain struct {
	st    devChainState
	chain *devchain.Chain
}

func runDemo(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	dir := fs.String("dir", ".dev", "the directory `settlectl dev` runs in")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	data, err := os.ReadFile(filepath.Join(*dir, "state.json"))
	if err != nil {
		return fmt.Errorf("no running stack found (%w): start it with `go tool task run` first", err)
	}
	var st devState
	if err := json.Unmarshal(data, &st); err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(*dir, "state.json"), err)
	}
	if len(st.Chains) == 0 || len(st.Chains) > len(demoETHAmounts) || st.DatabaseURL == "" {
		return fmt.Errorf("%s is not from this settlectl dev: restart `go tool task run`", filepath.Join(*dir, "state.json"))
	}
	d := &demo{st: st, out: out, http: &http.Client{Timeout: demoHTTPTimeout}}
	var chains []demoChain
	for _, c := range st.Chains {
		chain, err := devchain.Dial(ctx, c.URL)
		if err != nil {
			return fmt.Errorf("%s: %w", c.Network, err)
		}
		defer chain.Close()
		chains = append(chains, demoChain{st: c, chain: chain})
	}

	run := time.Now().Unix() % 100_000
	alice := demoUser{id: 100_000 + run*2, address: fmt.Sprintf("0xa11ce%035x", run)}
	bob := demoUser{id: 100_000 + run*2 + 1, address: fmt.Sprintf("0xb0b00%035x", run)}
	for _, u := range []demoUser{alice, bob} {
		if err := d.admin(ctx, http.MethodPut, fmt.Sprintf("/admin/users/%d", u.id), nil); err != nil {
			return err
		}
		for _, c := range chains {
			if err := d.admin(ctx, http.MethodPost, "/admin/deposit-addresses", map[string]any{"address": u.address, "network": c.st.Network, "user_id": u.id}); err != nil {
				return err
			}
		}
		fmt.Fprintf(out, "user %d receives on %s on %s\n", u.id, u.address, networkNames(chains))
	}

	ethTotal, tokenTotal := decimal.Zero, decimal.Zero
	var ids []string
	for i, c := range chains {
		ethAmount, tokenAmount := decimal.RequireFromString(demoETHAmounts[i]), decimal.RequireFromString(demoTokenAmounts[i])
		ethTotal, tokenTotal = ethTotal.Add(ethAmount), tokenTotal.Add(tokenAmount)
		ethWei, tokenUnits := baseUnits(ethAmount, 18), baseUnits(tokenAmount, c.st.TokenDecimals)
		fmt.Fprintf(out, "\n%s: sending %s ETH to alice and %s %s (%d decimals here) to bob ...\n", c.st.Network, ethAmount, tokenAmount, st.TokenAsset, c.st.TokenDecimals)
		ethTx, err := c.chain.SendETH(ctx, 0, alice.address, ethWei)
		if err != nil {
			return fmt.Errorf("%s: %w", c.st.Network, err)
		}
		tokenTx, err := c.chain.TransferToken(ctx, 1, c.st.Token, bob.address, tokenUnits)
		if err != nil {
			return fmt.Errorf("%s: %w", c.st.Network, err)
		}
		fmt.Fprintf(out, "  ETH  tx %s in block %d\n  %s tx %s in block %d\n", ethTx.Hash, ethTx.BlockNumber, st.TokenAsset, tokenTx.Hash, tokenTx.BlockNumber)

		payload := alchemyPayload(c.st.Network, []map[string]any{
			{"fromAddress": c.chain.Accounts()[0].Address, "toAddress": alice.address, "blockNum": fmt.Sprintf("0x%x", ethTx.BlockNumber),
				"hash": ethTx.Hash, "value": json.Number(ethAmount.String()), "asset": "ETH", "category": "external",
				"rawContract": map[string]any{"rawValue": "0x" + ethWei.Text(16), "address": nil, "decimals": 18}},
			{"fromAddress": c.chain.Accounts()[1].Address, "toAddress": bob.address, "blockNum": fmt.Sprintf("0x%x", tokenTx.BlockNumber),
				"hash": tokenTx.Hash, "value": json.Number(tokenAmount.String()), "asset": st.TokenAsset, "category": "token",
				"rawContract": map[string]any{"rawValue": "0x" + tokenUnits.Text(16), "address": c.st.Token, "decimals": c.st.TokenDecimals},
				"log":         map[string]any{"address": c.st.Token, "transactionHash": tokenTx.Hash, "logIndex": "0x0", "blockHash": tokenTx.BlockHash, "removed": false}},
		})
		for delivery := 1; delivery <= 2; delivery++ { // providers deliver at least once: send it twice
			answer, err := d.post(ctx, "/webhook/alchemy", payload, "X-Alchemy-Signature", st.AlchemyKey)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "  alchemy webhook (%s), delivery %d: %s\n", c.st.Network, delivery, answer)
		}
		// The ids settle derives from the transfers themselves.
		ids = append(ids,
			payment.Transfer{Network: c.st.Network, TxHash: ethTx.Hash, Index: payment.TransferNative}.EventID(),
			payment.Transfer{Network: c.st.Network, TxHash: tokenTx.Hash, Index: payment.LogIndexTransfer(0)}.EventID())
	}

	fmt.Fprintln(out, "\nwaiting for each network's finalized tag to pass its blocks (the dev chains finalize every 32 blocks) ...")
	if err := d.follow(ctx, ids...); err != nil {
		return err
	}

	// Precision is each network's own: demoPrecise has more decimals than
	// the dev token has on a 6-decimals network, and fewer than on 18.
	precise := decimal.RequireFromString(demoPrecise)
	fmt.Fprintf(out, "\na trusted deposit of %s %s to bob on each network (/webhook/payments with its network):\n", demoPrecise, st.TokenAsset)
	var preciseIDs []string
	for _, c := range chains {
		id := fmt.Sprintf("demo-precise-%s-%d", strings.ToLower(c.st.Network), run)
		body, _ := json.Marshal(map[string]any{"event_id": id, "event_type": "deposit", "user_id": bob.id,
			"asset": st.TokenAsset, "amount": demoPrecise, "network": c.st.Network})
		status, answer, err := d.postStatus(ctx, "/webhook/payments", body, "X-Signature", st.WebhookSecret)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "  %s (%d decimals): %d %s\n", c.st.Network, c.st.TokenDecimals, status, answer)
		fits := -precise.Exponent() <= int32(c.st.TokenDecimals)
		switch {
		case fits && status == http.StatusOK:
			tokenTotal = tokenTotal.Add(precise)
			preciseIDs = append(preciseIDs, id)
		case !fits && status == http.StatusBadRequest:
		default:
			return fmt.Errorf("%s: a deposit of %s %s answered %d, want %s", c.st.Network, demoPrecise, st.TokenAsset, status,
				map[bool]string{true: "200 (it fits the network's decimals)", false: "400 (more decimals than the network's)"}[fits])
		}
	}
	if err := d.follow(ctx, preciseIDs...); err != nil {
		return err
	}

	withdrawalID := fmt.Sprintf("demo-withdrawal-%d", run)
	withdrawal, _ := json.Marshal(map[string]any{"event_id": withdrawalID, "event_type": "withdrawal", "user_id": alice.id,
		"asset": "ETH", "amount": demoWithdrawal, "network": chains[0].st.Network})
	answer, err := d.post(ctx, "/webhook/payments", withdrawal, "X-Signature", st.WebhookSecret)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nwithdrawal of %s ETH from alice on %s: %s\n", demoWithdrawal, chains[0].st.Network, answer)
	if err := d.follow(ctx, withdrawalID); err != nil {
		return err
	}

	journal, err := pgx.Connect(ctx, st.DatabaseURL)
	if err != nil {
		return err
	}
	defer journal.Close(ctx)
	want := map[int64]map[string]decimal.Decimal{
		alice.id: {"ETH": ethTotal.Sub(decimal.RequireFromString(demoWithdrawal))},
		bob.id:   {st.TokenAsset: tokenTotal},
	}
	for _, u := range []demoUser{alice, bob} {
		if err := d.printJournal(ctx, journal, u.id); err != nil {
			return err
		}
		if err := d.checkBalances(ctx, u.id, want[u.id]); err != nil {
			return err
		}
	}
	return nil
}

func networkNames(chains []demoChain) string {
	names := make([]string, 0, len(chains))
	for _, c := range chains {
		names = append(names, c.st.Network)
	}
	return strings.Join(names, " and ")
}

// baseUnits is amount × 10^decimals; the amounts above are exact there.
func baseUnits(amount decimal.Decimal, decimals int) *big.Int {
	return amount.Shift(int32(decimals)).BigInt()
}

// printJournal prints a user's journal rows with the network each
// movement happened on (balance_events.network).
func (d *demo) printJournal(ctx context.Context, conn *pgx.Conn, user int64) error {
	rows, err := conn.Query(ctx, `SELECT asset, amount::text, event_type, coalesce(network, ''), source_event_id
		FROM balance_events WHERE user_id = $1 ORDER BY id LIMIT 100`, user)
	if err != nil {
		return fmt.Errorf("read the journal: %w", err)
	}
	defer rows.Close()
	fmt.Fprintf(d.out, "\njournal of user %d:\n  %-6s %-14s %-12s %-14s %s\n", user, "asset", "amount", "event_type", "network", "source_event_id")
	for rows.Next() {
		var asset, amount, eventType, network, source string
		if err := rows.Scan(&asset, &amount, &eventType, &network, &source); err != nil {
			return err
		}
		if v, err := decimal.NewFromString(amount); err == nil {
			amount = v.String() // without the column's trailing zeros
		}
		fmt.Fprintf(d.out, "  %-6s %-14s %-12s %-14s %s\n", asset, amount, eventType, network, source)
	}
	return rows.Err()
}

// checkBalances prints the user's balances, one per asset code whatever
// the networks its deposits came from, and fails unless they are want.
func (d *demo) checkBalances(ctx context.Context, user int64, want map[string]decimal.Decimal) error {
	body, err := d.read(ctx, fmt.Sprintf("/v1/users/%d/balances", user))
	if err != nil {
		return err
	}
	fmt.Fprintf(d.out, "balances of user %d: %s\n", user, body)
	var got struct {
		Balances []struct {
			Asset   string `json:"asset"`
			Balance string `json:"balance"`
		} `json:"balances"`
	}
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		return fmt.Errorf("balances of user %d: %w", user, err)
	}
	for asset, amount := range want {
		n := 0
		for _, b := range got.Balances {
			if b.Asset != asset {
				continue
			}
			n++
			if v, err := decimal.NewFromString(b.Balance); err != nil || !v.Equal(amount) {
				return fmt.Errorf("user %d: %s balance %s, want %s (the deposits of every network in one balance)", user, asset, b.Balance, amount)
			}
		}
		if n != 1 {
			return fmt.Errorf("user %d: %d %s balances, want one for every network", user, n, asset)
		}
		fmt.Fprintf(d.out, "  one %s balance of %s from the deposits on every network\n", asset, amount)
	}
	return nil
}

type demo struct {
	st   devState
	out  io.Writer
	http *http.Client
}

func alchemyPayload(network string, activities []map[string]any) []byte {
	b, _ := json.Marshal(map[string]any{
		"webhookId": "wh_settle_demo", "id": fmt.Sprintf("whevt_%d", time.Now().UnixNano()),
		"createdAt": time.Now().UTC().Format(time.RFC3339), "type": "ADDRESS_ACTIVITY",
		"event": map[string]any{"network": network, "activity": activities},
	})
	return b
}

func sign(body []byte, key string) string {
	mac := hmac.New(sha256.New, []byte(key))
	mac.Write(body)
	return hex.EncodeToString(mac.Sum(nil))
}

func (d *demo) post(ctx context.Context, path string, body []byte, header, key string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.st.APIURL+path, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(header, sign(body, key))
	return d.do(req)
}

// postStatus is post for an answer that may be a refusal.
func (d *demo) postStatus(ctx context.Context, path string, body []byte, header, key string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.st.APIURL+path, bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(header, sign(body, key))
	resp, err := d.http.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	return resp.StatusCode, string(bytes.TrimSpace(answer)), nil
}

func (d *demo) admin(ctx context.Context, method, path string, body any) error {
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, d.st.APIURL+path, r)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+d.st.AdminToken)
	req.Header.Set("Content-Type", "application/json")
	_, err = d.do(req)
	return err
}

func (d *demo) read(ctx context.Context, path string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.st.APIURL+path, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+d.st.APIToken)
	return d.do(req)
}

func (d *demo) do(req *http.Request) (string, error) {
	resp, err := d.http.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode >= 300 {
		return "", fmt.Errorf("%s %s: %s %s", req.Method, req.URL.Path, resp.Status, bytes.TrimSpace(body))
	}
	return string(bytes.TrimSpace(body)), nil
}

// follow prints each event's status as it changes until all are terminal.
func (d *demo) follow(ctx context.Context, ids ...string) error {
	last := map[string]string{}
	deadline := time.Now().Add(demoWait)
	for time.Now().Before(deadline) {
		done := 0
		for _, id := range ids {
			body, err := d.read(ctx, "/v1/events/"+id)
			if err != nil {
				return err
			}
			var ev struct {
				Status  string `json:"status"`
				Outcome string `json:"outcome"`
			}
			_ = json.Unmarshal([]byte(body), &ev)
			if ev.Status != last[id] {
				fmt.Fprintf(d.out, "  %-80s %s %s\n", id, ev.Status, ev.Outcome)
				last[id] = ev.Status
			}
			if ev.Status == "confirmed" || ev.Status == "failed" {
				done++
			}
		}
		if done == len(ids) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(demoPoll):
		}
	}
	return fmt.Errorf("events not settled within %s: see .dev/logs", demoWait)
}
