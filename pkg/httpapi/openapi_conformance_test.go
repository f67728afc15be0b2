package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/settle/settle/pkg/adminapi"
	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/moralis"
	notifyadmin "github.com/settle/settle/pkg/notify/admin"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// specChecker is an http.RoundTripper that checks every answer against
// openapi.yaml: the status must be documented (but 405 and 500, which
// the document's introduction gives every route), a JSON body must match
// the documented schema (required fields present, no undocumented field,
// types, nullability, enums, formats), and a documented JSON body must be
// JSON. It runs in the test's goroutine (http.Client.Do).
type specChecker struct {
	t       *testing.T
	base    http.RoundTripper
	paths   map[string]any
	root    map[string]any
	checked map[string]bool // "METHOD /spec/path" with a 2xx JSON body checked
}

func newSpecChecker(t *testing.T, base http.RoundTripper) *specChecker {
	var root map[string]any
	require.NoError(t, yaml.Unmarshal(httpapi.OpenAPISpec(), &root))
	if base == nil {
		base = http.DefaultTransport
	}
	return &specChecker{t: t, base: base, root: root, paths: root["paths"].(map[string]any), checked: map[string]bool{}}
}

func (c *specChecker) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.base.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	raw, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(raw))
	c.check(req.Method, req.URL.EscapedPath(), resp.StatusCode, resp.Header.Get("Content-Type"), raw)
	return resp, nil
}

// operation finds the spec path matching a request path; literal
// segments beat parameters.
func (c *specChecker) operation(method, path string) (string, map[string]any) {
	segments := strings.Split(path, "/")
	best, bestScore := "", -1
	for template := range c.paths {
		parts := strings.Split(template, "/")
		if len(parts) != len(segments) {
			continue
		}
		score := 0
		for i, p := range parts {
			switch {
			case strings.HasPrefix(p, "{"):
			case p == segments[i]:
				score++
			default:
				score = -1
			}
			if score < 0 {
				break
			}
		}
		if score > bestScore {
			best, bestScore = template, score
		}
	}
	if best == "" {
		return "", nil
	}
	item, _ := c.paths[best].(map[string]any)
	op, _ := item[strings.ToLower(method)].(map[string]any)
	return best, op
}

func (c *specChecker) check(method, path string, status int, contentType string, raw []byte) {
	t := c.t
	t.Helper()
	template, op := c.operation(method, path)
	where := fmt.Sprintf("%s %s → %d", method, path, status)
	if op == nil && status != http.StatusMethodNotAllowed {
		t.Errorf("%s: no operation in openapi.yaml", where)
		return
	}
	responses, _ := op["responses"].(map[string]any)
	var schema any
	documented, ok := responses[fmt.Sprint(status)]
	switch {
	case !ok && (status == http.StatusMethodNotAllowed || status == http.StatusInternalServerError):
		schema = map[string]any{"$ref": "#/components/schemas/Error"}
	case !ok:
		t.Errorf("%s: status not documented (%s)", where, bytes.TrimSpace(raw))
		return
	}
	response := c.resolve(documented)
	if content, ok := response["content"].(map[string]any); ok {
		if media, ok := content["application/json"].(map[string]any); ok {
			schema = media["schema"]
		}
	}
	isJSON := strings.HasPrefix(contentType, "application/json")
	switch {
	case schema == nil && isJSON:
		t.Errorf("%s: answers JSON the spec does not describe: %s", where, raw)
		return
	case schema == nil:
		return
	case !isJSON:
		t.Errorf("%s: documented as JSON, answered %q", where, contentType)
		return
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var body any
	if err := dec.Decode(&body); err != nil {
		t.Errorf("%s: body is not JSON: %v", where, err)
		return
	}
	for _, problem := range c.validate(schema, body, "$") {
		t.Errorf("%s: %s\n\tbody: %s", where, problem, raw)
	}
	if status >= 200 && status <= 299 {
		c.checked[method+" "+template] = true
	}
}

// resolve follows a local $ref.
func (c *specChecker) resolve(node any) map[string]any {
	m, _ := node.(map[string]any)
	for m != nil {
		ref, ok := m["$ref"].(string)
		if !ok {
			return m
		}
		var cur any = c.root
		for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
			cur = cur.(map[string]any)[part]
		}
		m, _ = cur.(map[string]any)
	}
	return m
}

// merged folds allOf into one schema, so the union of its properties is
// what the object may hold.
func (c *specChecker) merged(schema map[string]any) map[string]any {
	all, ok := schema["allOf"].([]any)
	if !ok {
		return schema
	}
	out := map[string]any{"type": "object"}
	props, required := map[string]any{}, []any{}
	own := map[string]any{"properties": schema["properties"], "required": schema["required"]}
	for _, part := range append([]any{own}, all...) {
		p := c.merged(c.resolve(part))
		for k, v := range mapOf(p["properties"]) {
			props[k] = v
		}
		if r, ok := p["required"].([]any); ok {
			required = append(required, r...)
		}
	}
	out["properties"], out["required"] = props, required
	return out
}

func mapOf(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

var integerLiteral = regexp.MustCompile(`^-?[0-9]+$`)

// validate checks value against schema (the OpenAPI 3.0 subset the
// document uses). An object is closed unless additionalProperties says
// otherwise: an undocumented field is a drift a generated client hides.
func (c *specChecker) validate(node, value any, at string) []string {
	schema := c.resolve(node)
	if schema == nil {
		return nil
	}
	if _, ok := schema["allOf"]; ok {
		schema = c.merged(schema)
	}
	if value == nil {
		if nullable, _ := schema["nullable"].(bool); nullable || schema["type"] == nil {
			return nil
		}
		return []string{at + ": null, not nullable"}
	}
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, at+": "+fmt.Sprintf(format, args...)) }
	switch schema["type"] {
	case "object":
		obj, ok := value.(map[string]any)
		if !ok {
			bad("want an object, got %T", value)
			break
		}
		required, _ := schema["required"].([]any)
		for _, r := range required {
			if _, ok := obj[r.(string)]; !ok {
				bad("required field %q missing", r)
			}
		}
		props := mapOf(schema["properties"])
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if p, ok := props[k]; ok {
				problems = append(problems, c.validate(p, obj[k], at+"."+k)...)
				continue
			}
			switch extra := schema["additionalProperties"].(type) {
			case map[string]any:
				problems = append(problems, c.validate(extra, obj[k], at+"."+k)...)
			case bool:
				if !extra {
					bad("undocumented field %q", k)
				}
			default:
				bad("undocumented field %q", k)
			}
		}
	case "array":
		arr, ok := value.([]any)
		if !ok {
			bad("want an array, got %T", value)
			break
		}
		for i, v := range arr {
			problems = append(problems, c.validate(schema["items"], v, fmt.Sprintf("%s[%d]", at, i))...)
		}
	case "string":
		s, ok := value.(string)
		if !ok {
			bad("want a string, got %T %v", value, value)
			break
		}
		if pattern, ok := schema["pattern"].(string); ok && !regexp.MustCompile(pattern).MatchString(s) {
			bad("%q does not match %s", s, pattern)
		}
		if schema["format"] == "date-time" {
			if _, err := time.Parse(time.RFC3339Nano, s); err != nil {
				bad("%q is not a date-time", s)
			}
		}
	case "integer":
		n, ok := value.(json.Number)
		if !ok || !integerLiteral.MatchString(n.String()) {
			bad("want an integer, got %T %v", value, value)
		}
	case "number":
		if _, ok := value.(json.Number); !ok {
			bad("want a number, got %T %v", value, value)
		}
	case "boolean":
		if _, ok := value.(bool); !ok {
			bad("want a boolean, got %T %v", value, value)
		}
	}
	if enum, ok := schema["enum"].([]any); ok && len(problems) == 0 {
		found := false
		for _, e := range enum {
			if fmt.Sprint(e) == fmt.Sprint(value) {
				found = true
			}
		}
		if !found {
			bad("%v is not one of %v", value, enum)
		}
	}
	return problems
}

// jsonOperations are the spec's operations with a documented 2xx JSON
// body.
func (c *specChecker) jsonOperations() []string {
	var out []string
	for path, item := range c.paths {
		for method, op := range mapOf(item) {
			for status, resp := range mapOf(mapOf(op)["responses"]) {
				if !strings.HasPrefix(status, "2") {
					continue
				}
				if _, ok := mapOf(c.resolve(resp)["content"])["application/json"]; ok {
					out = append(out, strings.ToUpper(method)+" "+path)
					break
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// TestOpenAPIResponsesMatchSchemas drives every route with a documented
// JSON success body, through a real server over HTTP with the api's
// plug-ins, and checks each 2xx answer against openapi.yaml: what
// operators generate clients from must be what the handlers write.
func TestOpenAPIResponsesMatchSchemas(t *testing.T) {
	chain := &recordingChain{answer: postgres.Recheck{ID: 4, ChainState: "mismatch", Result: postgres.RecheckUnchanged,
		Detail: "the transaction carries 2 base units", Status: payment.StatusFailed, CreatedAt: time.Now()}}
	h := newHarness(t, harnessOptions{change: func(o *httpapi.Options) {
		o.Chain = chain
		o.QuickNodeTokens = []string{quickNodeToken}
		o.MoralisSecrets = []string{moralisSecret}
		db := o.Store.(*postgres.DB)
		o.AdminRoutes = append(adminapi.Routes(db), notifyadmin.Routes(db)...)
	}})
	spec := newSpecChecker(t, h.client.Transport)
	h.client.Transport = spec
	admin, reader := bearer(adminToken), bearer(apiToken)
	ctx := context.Background()
	ok := func(r response, status int) response {
		t.Helper()
		require.Equal(t, status, r.status, "%s", r.raw)
		return r
	}

	ok(h.do(http.MethodGet, "/healthz", nil, nil), http.StatusOK)
	ok(h.do(http.MethodGet, "/readyz", nil, nil), http.StatusOK)

	ok(h.do(http.MethodPut, "/admin/users/7", nil, admin), http.StatusCreated)
	ok(h.do(http.MethodPut, "/admin/users/7", []byte(`{}`), admin), http.StatusOK)
	address := fmt.Sprintf(`{"address":%q,"network":"ETH_MAINNET","user_id":7,"from_block":7}`, alchemyRecipient)
	backfill := ok(h.do(http.MethodPost, "/admin/deposit-addresses", []byte(address), admin), http.StatusCreated).body["backfill"].(string)
	ok(h.do(http.MethodPost, "/admin/deposit-addresses", []byte(address), admin), http.StatusOK)

	ok(h.postPayment(deposit("dep-1", 7, "10")), http.StatusOK)
	ok(h.postPayment(deposit("dep-1", 7, "10.0")), http.StatusOK)
	h.settleAll()
	ok(h.postPayment(holdBody("hold-1", 7, "2", map[string]string{"to_address": `"` + holdRecipient + `"`})), http.StatusOK)
	ok(h.postPayment(holdBody("hold-2", 7, "1", nil)), http.StatusOK)
	h.settleAll()
	ok(h.postPayment(resolveBody("void-2", "withdrawal_void", 7, "hold-2", nil)), http.StatusOK)
	h.settleAll()

	body, err := os.ReadFile("testdata/alchemy-acceptance.json")
	require.NoError(t, err)
	ok(h.postAlchemy(body, alchemyKey), http.StatusOK)
	qn := quickNodeLogs("0x1", false)
	ok(h.postQuickNode(qn, fixedNow, false), http.StatusOK)
	require.Equal(t, true, ok(h.postQuickNode(qn, fixedNow, false), http.StatusOK).body["replay"])
	test := `{"abi":{},"block":{"hash":"","number":"","timestamp":""},"txs":[],"txsInternal":[],"logs":[],"chainId":"","tag":"","streamId":"","confirmed":true,"retries":0,"erc20Approvals":[],"erc20Transfers":[],"nftApprovals":[],"nftTransfers":[]}`
	sig, err := moralis.Sign([]byte(test), []byte(moralisSecret))
	require.NoError(t, err)
	ok(h.do(http.MethodPost, "/webhook/moralis", []byte(test), map[string]string{httpapi.HeaderMoralisSignature: sig}), http.StatusOK)

	ok(h.do(http.MethodGet, "/v1/users/7/balances", nil, reader), http.StatusOK)
	for _, id := range []string{"dep-1", "hold-1", "void-2", ethEventID, "chain:ETH_MAINNET:" + alchemyTx + ":1"} {
		ok(h.do(http.MethodGet, "/v1/events/"+id, nil, reader), http.StatusOK)
	}
	ok(h.do(http.MethodGet, "/v1/holds/hold-1", nil, reader), http.StatusOK)
	ok(h.do(http.MethodGet, "/v1/holds/hold-2", nil, reader), http.StatusOK)
	ok(h.do(http.MethodGet, "/v1/events?limit=2", nil, reader), http.StatusOK)
	ok(h.do(http.MethodGet, "/v1/events?user_id=999", nil, reader), http.StatusOK)
	ok(h.do(http.MethodGet, "/v1/users/7/journal", nil, reader), http.StatusOK)

	ok(h.postAdmin("/admin/networks", map[string]any{"name": "DEVNET", "chain_id": 31337, "native": "DEV", "decimals": 18}), http.StatusCreated)
	ok(h.postAdmin("/admin/networks", map[string]any{"name": "DEVNET", "chain_id": 31337, "native": "DEV", "decimals": 18}), http.StatusOK)
	ok(h.postAdmin("/admin/assets", map[string]any{"network": "DEVNET", "asset": "DUSD", "contract": "0x1111111111111111111111111111111111111111", "decimals": 6}), http.StatusCreated)
	ok(h.postAdmin("/admin/assets", map[string]any{"network": "DEVNET", "asset": "DUSD", "contract": "0x1111111111111111111111111111111111111111", "decimals": 6}), http.StatusOK)

	ok(h.do(http.MethodPost, "/admin/events/dep-1/recheck", []byte(`{"operator":"alice"}`), admin), http.StatusOK)
	rescan := ok(h.do(http.MethodPost, "/admin/rescan", []byte(`{"network":"ETH_MAINNET","from_block":30000000,"to_block":30000100}`), admin), http.StatusAccepted).body["id"].(string)
	ok(h.do(http.MethodGet, "/admin/rescan/"+rescan, nil, admin), http.StatusOK)
	ok(h.do(http.MethodGet, "/admin/rescan/"+backfill, nil, admin), http.StatusOK)
	ok(h.do(http.MethodPost, "/admin/rescan/"+rescan+"/cancel", []byte(`{"operator":"bob","reason":"typo"}`), admin), http.StatusOK)

	// A deposit waiting for its transaction's finality shows finality.
	h.settleAll()
	waiting := paymentBody(map[string]string{"event_id": `"fin-1"`, "event_type": `"deposit"`, "user_id": "7", "amount": `"1"`,
		"tx_hash": `"0x` + strings.Repeat("ab", 32) + `"`})
	ok(h.postPayment(waiting), http.StatusOK)
	claimed, err := h.db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	parked, err := h.db.AwaitFinality(ctx, claimed[0].Event, postgres.Wait{RecheckIn: time.Hour, ReceiptSeen: true, BlockNumber: 16,
		BlockHash: "0x" + strings.Repeat("cd", 32)})
	require.NoError(t, err)
	require.True(t, parked)
	require.NotNil(t, ok(h.do(http.MethodGet, "/v1/events/fin-1", nil, reader), http.StatusOK).body["finality"])

	// Two dead letters (one to replay, one to discard) and a notification
	// (a withdrawal the balance cannot cover).
	for _, id := range []string{"dead-1", "dead-2"} {
		_, err := h.db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: id, Type: payment.Deposit, UserID: 7, Asset: "ETH", Amount: decimal.RequireFromString("3"), TraceID: "tr"}})
		require.NoError(t, err)
	}
	_, err = h.db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: "broke-1", Type: payment.Withdrawal, UserID: 7, Asset: "ETH", Amount: decimal.RequireFromString("1000"), TraceID: "tr"}})
	require.NoError(t, err)
	claimed, err = h.db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	var dead []int64
	for _, c := range claimed {
		if c.Event.Type == payment.Withdrawal {
			_, err := h.db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: c.Event}}, postgres.LedgerOptions{Notify: true})
			require.NoError(t, err)
			continue
		}
		moved, id, err := h.db.FailToDLQ(ctx, payment.DeadLetter{EventID: c.Event.ID, EventType: string(c.Event.Type), UserID: 7, Asset: "ETH", Amount: "3",
			Error: "retries exhausted", Attempt: 6, Generation: c.Event.Generation, Source: payment.SourceWorker, TraceID: "tr"})
		require.NoError(t, err)
		require.True(t, moved)
		dead = append(dead, id)
	}
	require.Len(t, dead, 2)
	ok(h.do(http.MethodGet, "/admin/dlq", nil, admin), http.StatusOK)
	ok(h.do(http.MethodGet, fmt.Sprintf("/admin/dlq/%d", dead[0]), nil, admin), http.StatusOK)
	ok(h.do(http.MethodPost, fmt.Sprintf("/admin/dlq/%d/replay", dead[0]), []byte(`{"reason":"node was down","operator":"alice"}`), admin), http.StatusOK)
	ok(h.do(http.MethodPost, fmt.Sprintf("/admin/dlq/%d/discard", dead[1]), []byte(`{"reason":"test"}`), admin), http.StatusOK)
	ok(h.do(http.MethodGet, "/admin/dlq?state=resolved", nil, admin), http.StatusOK)
	ok(h.do(http.MethodGet, fmt.Sprintf("/admin/dlq/%d", dead[1]), nil, admin), http.StatusOK)

	due, err := h.db.ClaimNotifications(ctx, 1, 0)
	require.NoError(t, err)
	require.Len(t, due, 1)
	require.NoError(t, h.db.NotificationDelivered(ctx, due[0].ID, postgres.DeliveryAttempt{At: time.Now(), HTTPStatus: 204}))
	ok(h.do(http.MethodGet, "/admin/notifications", nil, admin), http.StatusOK)
	ok(h.do(http.MethodPost, fmt.Sprintf("/admin/notifications/%d/redeliver", due[0].ID), []byte(`{"operator":"alice"}`), admin), http.StatusOK)
	ok(h.do(http.MethodPost, "/admin/notifications/redeliver", nil, admin), http.StatusOK)

	// Refusals are documented too: bodies over the admin limits, a
	// malformed or unknown id.
	huge := []byte(`{"reason":"` + strings.Repeat("a", 70<<10) + `"}`)
	for _, path := range []string{"/admin/deposit-addresses", "/admin/networks", "/admin/assets", "/admin/events/dep-1/recheck",
		"/admin/rescan", "/admin/rescan/" + rescan + "/cancel", fmt.Sprintf("/admin/dlq/%d/replay", dead[0]),
		fmt.Sprintf("/admin/dlq/%d/discard", dead[1]), fmt.Sprintf("/admin/notifications/%d/redeliver", due[0].ID), "/admin/notifications/redeliver"} {
		requireCode(t, h.do(http.MethodPost, path, huge, admin), http.StatusRequestEntityTooLarge, httpapi.CodeBodyTooLarge)
	}
	requireCode(t, h.do(http.MethodPut, "/admin/users/8", huge, admin), http.StatusRequestEntityTooLarge, httpapi.CodeBodyTooLarge)
	requireCode(t, h.do(http.MethodGet, "/admin/dlq/x", nil, admin), http.StatusBadRequest, httpapi.CodeInvalidRequest)
	requireCode(t, h.do(http.MethodGet, "/admin/dlq/999999", nil, admin), http.StatusNotFound, httpapi.CodeNotFound)
	requireCode(t, h.do(http.MethodPost, "/admin/notifications/999999/redeliver", nil, admin), http.StatusNotFound, httpapi.CodeNotFound)
	requireCode(t, h.do(http.MethodGet, "/v1/users/999/balances", nil, reader), http.StatusNotFound, httpapi.CodeUnknownUser)
	requireCode(t, h.do(http.MethodGet, "/v1/users/999/journal", nil, reader), http.StatusNotFound, httpapi.CodeUnknownUser)
	requireCode(t, h.do(http.MethodGet, "/v1/events?limit=1001", nil, reader), http.StatusBadRequest, httpapi.CodeInvalidRequest)
	requireCode(t, h.do(http.MethodDelete, "/v1/events", nil, reader), http.StatusMethodNotAllowed, httpapi.CodeMethodNotAllowed)

	var unchecked []string
	for _, op := range spec.jsonOperations() {
		if !spec.checked[op] {
			unchecked = append(unchecked, op)
		}
	}
	require.Empty(t, unchecked, "operations with a documented JSON success body this test never saw answer")
}
