package chain

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/ethereum/go-ethereum/rpc"

	"github.com/settle/settle/pkg/logging"
)

// logsLimitPhrases are how nodes and providers word an eth_getLogs they
// refuse because of its size, in lowercase: the same question over fewer
// blocks is answered. A remote JSON-RPC error carries no type and the
// codes are shared with unrelated errors (-32602 is any invalid
// parameter, -32005 also Infura's rate limit), so the text decides.
var logsLimitPhrases = []string{
	// Infura -32005 "query returned more than 10000 results" (also
	// Linea, mevblocker and geth-based relays).
	"query returned more than",
	// Alchemy -32602 "Log response size exceeded. You can make eth_getLogs
	// requests with up to a 2K block range and no limit on the response
	// size, or you can request any block range with a cap of 10K logs".
	"log response size exceeded",
	// geth --rpc.rangelimit: -32602 "exceed maximum block range 1000".
	"exceed maximum block range",
	// reth -32602 "query exceeds max block range 100000" and "query
	// exceeds max results 20000, retry with the range ...".
	"exceeds max block range",
	"exceeds max results",
	// Infura's live API -32602 "range 1000000 exceeds limit of 10000".
	"exceeds limit of",
	// QuickNode -32614 (HTTP 413) "eth_getLogs is limited to a 10,000
	// range"; BlockPI "eth_getLogs is limited to 1024 block range".
	"is limited to",
	// "eth_getLogs range is too large, max is 1k blocks".
	"range is too large",
	"block range is too wide",
	"block range too large",
	// "ranges over 10000 blocks are not supported on freetier".
	"ranges over",
	// Infura -32005 "query timeout exceeded": the range took too long.
	"query timeout exceeded",
}

// rpcErrorBodyMax bounds the error body of a non-2xx answer read for its
// message.
const rpcErrorBodyMax = 64 << 10

// logsLimitError reports whether err is a node's refusal of an eth_getLogs
// as too large, with the node's message (at most a line) as the reason.
// The endpoint's secrets (redact; nil: none) leave the message before it
// is cut, so no part of one is left at the cut.
func logsLimitError(err error, redact *logging.Redactor) (reason string, ok bool) {
	if err == nil {
		return "", false
	}
	if errors.Is(err, ErrResponseTooLarge) {
		// Ours, not the node's: fewer blocks make a shorter answer.
		return redact.Error(err).Error(), true
	}
	var rpcErr rpc.Error
	if errors.As(err, &rpcErr) {
		return logsLimitMessage(redact.String(rpcErr.Error()))
	}
	var httpErr rpc.HTTPError
	if errors.As(err, &httpErr) {
		return logsLimitHTTP(httpErr.StatusCode, httpErr.Body, redact)
	}
	return "", false
}

// logsLimitHTTP reads a non-2xx answer's JSON-RPC error (QuickNode sends
// its range limit with status 413). A rate limit (429) is never a size
// limit, whatever its text says: a narrower range would not help.
func logsLimitHTTP(status int, body []byte, redact *logging.Redactor) (string, bool) {
	if status == http.StatusTooManyRequests || len(body) > rpcErrorBodyMax {
		return "", false
	}
	var answer struct {
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &answer) != nil || answer.Error == nil {
		return "", false
	}
	return logsLimitMessage(redact.String(answer.Error.Message))
}

// logsLimitReasonMax bounds the node's message kept in the error.
const logsLimitReasonMax = 200

func logsLimitMessage(message string) (string, bool) {
	lower := strings.ToLower(message)
	for _, phrase := range logsLimitPhrases {
		if strings.Contains(lower, phrase) {
			reason := strings.Join(strings.Fields(message), " ")
			if len(reason) > logsLimitReasonMax {
				reason = strings.ToValidUTF8(reason[:logsLimitReasonMax], "") + "…"
			}
			return reason, true
		}
	}
	return "", false
}
