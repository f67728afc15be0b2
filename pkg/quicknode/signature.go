// Package quicknode reads QuickNode Streams deliveries on EVM networks: it
// checks their signature and freshness and turns their data (the
// block_with_receipts, receipts or logs dataset, as the chain's JSON-RPC
// returns it) into deposit candidates. It is pure (no I/O), like
// pkg/alchemy: the HTTP package verifies, decodes and then looks the
// recipients up in storage.
package quicknode

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"time"
)

// Bounds on the signed headers, checked before any hashing.
const (
	// SignatureHexLength is the length of a hex HMAC-SHA256 digest.
	SignatureHexLength = 2 * sha256.Size
	// NonceLengthMax bounds X-QN-Nonce (QuickNode sends a short random
	// string).
	NonceLengthMax = 256
	// timestampDigitsMax: unix seconds fit in 11 digits until the year
	// 5138; more is not a timestamp.
	timestampDigitsMax = 11
	// FutureSkewMax is how far ahead of settle's clock a timestamp may be
	// (clock drift between QuickNode and settle); further is refused like a
	// stale one.
	FutureSkewMax = time.Minute
	// MaxAgeDefault is WEBHOOK_MAX_AGE's default: older deliveries are
	// replays as far as settle is concerned.
	MaxAgeDefault = 5 * time.Minute
)

// Sign returns the lowercase hex HMAC-SHA256 under token of nonce +
// timestamp + body, the value QuickNode sends in X-QN-Signature. body is
// the uncompressed payload, whatever Content-Encoding carried it.
func Sign(nonce, timestamp string, body, token []byte) string {
	return hex.EncodeToString(mac(nonce, timestamp, body, token))
}

func mac(nonce, timestamp string, body, token []byte) []byte {
	m := hmac.New(sha256.New, token)
	// Hash writes never fail.
	_, _ = m.Write([]byte(nonce))
	_, _ = m.Write([]byte(timestamp))
	_, _ = m.Write(body)
	return m.Sum(nil)
}

// Verify reports whether signature is the HMAC-SHA256 of nonce +
// timestamp + body under any of tokens (an operator may run several
// streams, each with its own token). The hex is compared
// case-insensitively, the bytes in constant time; every token is tried
// even after a match, so the time taken does not tell which matched.
func Verify(nonce, timestamp string, body []byte, signature string, tokens ...[]byte) bool {
	if len(signature) != SignatureHexLength || nonce == "" || len(nonce) > NonceLengthMax {
		return false
	}
	if _, ok := parseTimestamp(timestamp); !ok {
		return false
	}
	given, err := hex.DecodeString(signature)
	if err != nil {
		return false
	}
	matched := false
	for _, token := range tokens {
		if hmac.Equal(mac(nonce, timestamp, body, token), given) {
			matched = true
		}
	}
	return matched
}

// Fresh reports whether timestamp (unix seconds, as X-QN-Timestamp
// carries it) lies within maxAge before now and at most FutureSkewMax
// after it. A signed delivery outside that window is a replay.
func Fresh(timestamp string, now time.Time, maxAge time.Duration) bool {
	sent, ok := parseTimestamp(timestamp)
	if !ok {
		return false
	}
	unix := now.Unix()
	return sent >= unix-int64(maxAge/time.Second) && sent <= unix+int64(FutureSkewMax/time.Second)
}

// parseTimestamp reads decimal unix seconds: digits only (no sign, no
// spaces, no leading zero), so the signed text and the checked value are
// one thing. A leading zero would let a '0' move from the end of the
// nonce to the timestamp: the same signed bytes, the same time, another
// delivery to the replay guard.
func parseTimestamp(s string) (int64, bool) {
	if s == "" || len(s) > timestampDigitsMax || len(s) > 1 && s[0] == '0' {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}
