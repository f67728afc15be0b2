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
	"time"

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
)

// demoUser is a user of the demo with the deposit address it receives on.
type demoUser struct {
	id      int64
	address string
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
	d := &demo{st: st, out: out, http: &http.Client{Timeout: demoHTTPTimeout}}
	chain, err := devchain.Dial(ctx, st.ChainURL)
	if err != nil {
		return err
	}
	defer chain.Close()

	run := time.Now().Unix() % 100_000
	alice := demoUser{id: 100_000 + run*2, address: fmt.Sprintf("0xa11ce%035x", run)}
	bob := demoUser{id: 100_000 + run*2 + 1, address: fmt.Sprintf("0xb0b00%035x", run)}
	for _, u := range []demoUser{alice, bob} {
		if err := d.admin(ctx, http.MethodPut, fmt.Sprintf("/admin/users/%d", u.id), nil); err != nil {
			return err
		}
		if err := d.admin(ctx, http.MethodPost, "/admin/deposit-addresses", map[string]any{"address": u.address, "network": st.Network, "user_id": u.id}); err != nil {
			return err
		}
		fmt.Fprintf(out, "user %d receives on %s\n", u.id, u.address)
	}

	fmt.Fprintln(out, "\nsending 1.5 ETH to alice and 25 TUSD to bob on the dev chain ...")
	ethTx, err := chain.SendETH(ctx, 0, alice.address, new(big.Int).Mul(big.NewInt(15), big.NewInt(100_000_000_000_000_000)))
	if err != nil {
		return err
	}
	tokenTx, err := chain.TransferToken(ctx, 1, st.Token, bob.address, big.NewInt(25_000_000))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "  ETH  tx %s in block %d\n  TUSD tx %s in block %d\n", ethTx.Hash, ethTx.BlockNumber, tokenTx.Hash, tokenTx.BlockNumber)

	payload := alchemyPayload(st, []map[string]any{
		{"fromAddress": chain.Accounts()[0].Address, "toAddress": alice.address, "blockNum": fmt.Sprintf("0x%x", ethTx.BlockNumber),
			"hash": ethTx.Hash, "value": 1.5, "asset": "ETH", "category": "external",
			"rawContract": map[string]any{"rawValue": "0x14d1120d7b160000", "address": nil, "decimals": 18}},
		{"fromAddress": chain.Accounts()[1].Address, "toAddress": bob.address, "blockNum": fmt.Sprintf("0x%x", tokenTx.BlockNumber),
			"hash": tokenTx.Hash, "value": 25, "asset": "TUSD", "category": "token",
			"rawContract": map[string]any{"rawValue": "0x17d7840", "address": st.Token, "decimals": 6},
			"log":         map[string]any{"address": st.Token, "transactionHash": tokenTx.Hash, "logIndex": "0x0", "blockHash": tokenTx.BlockHash, "removed": false}},
	})
	for delivery := 1; delivery <= 2; delivery++ { // providers deliver at least once: send it twice
		answer, err := d.post(ctx, "/webhook/alchemy", payload, "X-Alchemy-Signature", st.AlchemyKey)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "alchemy webhook, delivery %d: %s\n", delivery, answer)
	}
	// The ids settle derives from the transfers themselves.
	ethEvent := payment.Transfer{Network: st.Network, TxHash: ethTx.Hash, Index: payment.TransferNative}.EventID()
	tokenEvent := payment.Transfer{Network: st.Network, TxHash: tokenTx.Hash, Index: payment.LogIndexTransfer(0)}.EventID()

	fmt.Fprintln(out, "\nwaiting for the finalized tag to pass both blocks (the dev chain finalizes every 32 blocks) ...")
	if err := d.follow(ctx, ethEvent, tokenEvent); err != nil {
		return err
	}

	withdrawal, _ := json.Marshal(map[string]any{"event_id": fmt.Sprintf("demo-withdrawal-%d", run), "event_type": "withdrawal", "user_id": alice.id, "asset": "ETH", "amount": "0.4"})
	answer, err := d.post(ctx, "/webhook/payments", withdrawal, "X-Signature", st.WebhookSecret)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nwithdrawal of 0.4 ETH from alice: %s\n", answer)
	if err := d.follow(ctx, fmt.Sprintf("demo-withdrawal-%d", run)); err != nil {
		return err
	}
	for _, u := range []demoUser{alice, bob} {
		body, err := d.read(ctx, fmt.Sprintf("/v1/users/%d/balances", u.id))
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "balances of user %d: %s\n", u.id, body)
	}
	return nil
}

type demo struct {
	st   devState
	out  io.Writer
	http *http.Client
}

func alchemyPayload(st devState, activities []map[string]any) []byte {
	b, _ := json.Marshal(map[string]any{
		"webhookId": "wh_settle_demo", "id": fmt.Sprintf("whevt_%d", time.Now().UnixNano()),
		"createdAt": time.Now().UTC().Format(time.RFC3339), "type": "ADDRESS_ACTIVITY",
		"event": map[string]any{"network": st.Network, "activity": activities},
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
