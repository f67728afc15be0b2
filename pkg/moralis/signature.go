// Package moralis reads Moralis Streams deliveries: it checks their
// signature (over JavaScript's re-serialisation of the body) and turns
// their ERC-20 transfers and native transactions into deposit candidates.
// It is pure (no I/O), like pkg/alchemy.
package moralis

import (
	"crypto/subtle"
	"encoding/hex"

	"golang.org/x/crypto/sha3"
)

// SignatureLength is "0x" and 64 hex digits (a Keccak-256 digest).
const SignatureLength = 2 + 64

// Sign returns x-signature for body under secret: "0x" + lowercase hex
// Keccak-256 (Ethereum's, web3.utils.sha3) of JSON.stringify(parsed body)
// + secret, as UTF-8. It fails when body is not JSON.
func Sign(body, secret []byte) (string, error) {
	text, err := Stringify(body)
	if err != nil {
		return "", err
	}
	return "0x" + hex.EncodeToString(digest(text, secret)), nil
}

func digest(text, secret []byte) []byte {
	h := sha3.NewLegacyKeccak256()
	// Hash writes never fail.
	_, _ = h.Write(text)
	_, _ = h.Write(secret)
	return h.Sum(nil)
}

// Verify reports whether signature is x-signature for body under any of
// secrets. The body is re-serialised once; the hex after "0x" is
// compared case-insensitively, the bytes in constant time, and every
// secret is tried even after a match.
func Verify(body []byte, signature string, secrets ...[]byte) bool {
	if len(signature) != SignatureLength || signature[:2] != "0x" {
		return false
	}
	given, err := hex.DecodeString(signature[2:])
	if err != nil {
		return false
	}
	text, err := Stringify(body)
	if err != nil {
		return false
	}
	matched := false
	for _, secret := range secrets {
		if subtle.ConstantTimeCompare(digest(text, secret), given) == 1 {
			matched = true
		}
	}
	return matched
}
