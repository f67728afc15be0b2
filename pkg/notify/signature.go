package notify

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Standard Webhooks (https://www.standardwebhooks.com): every notification
// carries these headers, and the signature is
//
//	v1,<base64 of HMAC-SHA256(key, "<webhook-id>.<webhook-timestamp>.<body>")>
//
// with the timestamp in unix seconds.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// Secret bounds: a whsec_ key decodes to at least SecretKeyBytesMin bytes
// (the spec's 24); any other secret is at least SecretLengthMin characters.
const (
	SecretPrefix      = "whsec_"
	SecretKeyBytesMin = 24
	SecretLengthMin   = 32
)

// ParseSecret turns NOTIFY_WEBHOOK_SECRET into the HMAC key. A secret that
// starts with whsec_ is the spec's form: the rest is base64 and its bytes
// are the key, as the Standard Webhooks libraries read it. Any other
// secret is used as its literal bytes (those libraries' "raw" format), so
// a receiver configures the same string either way it was shared.
func ParseSecret(secret string) ([]byte, error) {
	if rest, ok := strings.CutPrefix(secret, SecretPrefix); ok {
		key, err := base64.StdEncoding.DecodeString(rest)
		if err != nil {
			key, err = base64.RawStdEncoding.DecodeString(rest)
		}
		if err != nil {
			return nil, errors.New("the part after whsec_ is not base64")
		}
		if len(key) < SecretKeyBytesMin {
			return nil, fmt.Errorf("a whsec_ key must decode to at least %d bytes, got %d", SecretKeyBytesMin, len(key))
		}
		return key, nil
	}
	if len(secret) < SecretLengthMin {
		return nil, fmt.Errorf("must be at least %d characters (or whsec_ and base64 of %d+ bytes), got %d", SecretLengthMin, SecretKeyBytesMin, len(secret))
	}
	return []byte(secret), nil
}

// Sign is the webhook-signature header value of one message.
func Sign(key []byte, id string, at time.Time, body []byte) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id))
	mac.Write([]byte{'.'})
	mac.Write([]byte(strconv.FormatInt(at.Unix(), 10)))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}
