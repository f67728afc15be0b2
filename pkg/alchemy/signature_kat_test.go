package alchemy_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/alchemy"
)

// TestSignatureKnownAnswers pins Sign and Verify to digests computed
// outside Go, once, with OpenSSL 3.0:
//
//	printf '%s' "$BODY" | openssl dgst -sha256 -hmac "$KEY"
//
// The key is used as its literal bytes, whsec_ prefix included; the last
// vector is RFC 4231's test case 2.
func TestSignatureKnownAnswers(t *testing.T) {
	const key = "whsec_testsigningkey0123456789abcdef"
	const body = `{"webhookId":"wh_octjglnywaupz6th","id":"whevt_ogrc5v64myey69ux","createdAt":"2024-01-01T00:00:00.000Z","type":"ADDRESS_ACTIVITY","event":{"network":"ETH_MAINNET","activity":[]}}`
	for _, v := range []struct{ name, key, body, want string }{
		{"address activity body", key, body, "563c58dca345edcab747e8765f6c1f9a74e24ee7ef91f0a33ba7e9a1729fe43f"},
		{"empty body", key, "", "6453366c16a2bec29ae64a527194128805308609b2c3f0ba5d1df87939f57df5"},
		{"trailing newline is signed", key, "{\"a\":1}\n", "a3ebf57bdbbb14d027cddf263b899c75207bab15b4ab2fb16a897fb26bb6ffc8"},
		{"short key", "whsec_abc", "hello", "45c5e8c01dafc236547ee117b4dd23df5951b545561a5788b5beb23cb0d121a4"},
		{"RFC 4231 case 2", "Jefe", "what do ya want for nothing?", "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
	} {
		require.Equal(t, v.want, alchemy.Sign([]byte(v.body), []byte(v.key)), v.name)
		require.True(t, alchemy.Verify([]byte(v.body), v.want, []byte(v.key)), v.name)
		require.True(t, alchemy.Verify([]byte(v.body), strings.ToUpper(v.want), []byte("other-key"), []byte(v.key)), v.name+": upper-case hex, second key")
	}
	// The same body under the key without its prefix (openssl, as above)
	// is another digest: the prefix is part of the key.
	const withoutPrefix = "71c7d43609a55337d151ecb15c2f6e47b6bcf195ff0ad3c0b2962ab9608b12f6"
	require.Equal(t, withoutPrefix, alchemy.Sign([]byte(body), []byte(strings.TrimPrefix(key, "whsec_"))))
	require.False(t, alchemy.Verify([]byte(body), withoutPrefix, []byte(key)))
	require.False(t, alchemy.Verify([]byte(body+" "), "563c58dca345edcab747e8765f6c1f9a74e24ee7ef91f0a33ba7e9a1729fe43f", []byte(key)), "one byte more")
}
