// Package alchemy reads Alchemy's Address Activity webhooks: it checks
// their signature and turns their activities into deposit candidates. It
// is pure (no I/O): the HTTP package verifies, decodes and then looks the
// recipients up in storage.
package alchemy

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
)

// SignatureHexLength is the length of a hex HMAC-SHA256 digest.
const SignatureHexLength = 2 * sha256.Size

// Sign returns the lowercase hex HMAC-SHA256 of body under key, the value
// Alchemy sends in X-Alchemy-Signature.
func Sign(body, key []byte) string {
	mac := hmac.New(sha256.New, key)
	_, _ = mac.Write(body) // hash writes never fail
	return hex.EncodeToString(mac.Sum(nil))
}

// Verify reports whether signature is the HMAC-SHA256 of body under any
// of keys. The hex is compared case-insensitively (it is decoded, then the
// bytes are compared in constant time). Alchemy gives every webhook its
// own key, so an operator may configure several.
func Verify(body []byte, signature string, keys ...[]byte) bool {
	if len(signature) != SignatureHexLength {
		return false
	}
	given, err := hex.DecodeString(signature)
	if err != nil {
		return false
	}
	matched := false
	// Every key is tried even after a match, so the time taken does not
	// depend on which key matched.
	for _, key := range keys {
		mac := hmac.New(sha256.New, key)
		_, _ = mac.Write(body)
		if hmac.Equal(mac.Sum(nil), given) {
			matched = true
		}
	}
	return matched
}
