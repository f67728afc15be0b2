// Package moralis reads Moralis Streams deliveries: it checks their
// signature (over JavaScript's re-serialisation of the body) and turns
// their ERC-20 transfers and native transactions into deposit candidates.
// It is pure (no I/O), like pkg/alchemy.
package moralis

import (
	"crypto/subtle"
	"encoding/hex"
	"hash"

	"golang.org/x/crypto/sha3"
)

// SignatureLength is "0x" and 64 hex digits (a Keccak-256 digest).
const SignatureLength = 2 + 64

// Sign returns x-signature for body under secret: "0x" + lowercase hex
// Keccak-256 (Ethereum's, web3.utils.sha3) of JSON.stringify(parsed body)
// + secret, as UTF-8. It fails when body is not JSON.
func Sign(body, secret []byte) (string, error) {
	sums, err := digests(body, secret)
	if err != nil {
		return "", err
	}
	return "0x" + hex.EncodeToString(sums[0]), nil
}

// digests hashes JSON.stringify(body) + secret for each secret, with the
// serialisation streamed into the hashes rather than held whole.
func digests(body []byte, secrets ...[]byte) ([][]byte, error) {
	hashes := make([]hash.Hash, len(secrets))
	for i := range hashes {
		hashes[i] = sha3.NewLegacyKeccak256()
	}
	_, err := stringify(body, func(text []byte) {
		for _, h := range hashes {
			// Hash writes never fail.
			_, _ = h.Write(text)
		}
	})
	if err != nil {
		return nil, err
	}
	sums := make([][]byte, len(secrets))
	for i, secret := range secrets {
		_, _ = hashes[i].Write(secret)
		sums[i] = hashes[i].Sum(nil)
	}
	return sums, nil
}

// Verify reports whether signature is x-signature for body under any of
// secrets. The body is re-serialised once, streamed into the hashes; the hex after "0x" is
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
	sums, err := digests(body, secrets...)
	if err != nil {
		return false
	}
	matched := false
	for _, sum := range sums {
		if subtle.ConstantTimeCompare(sum, given) == 1 {
			matched = true
		}
	}
	return matched
}
