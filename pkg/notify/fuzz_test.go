package notify_test

import (
	"strings"
	"testing"
	"time"

	"github.com/settle/settle/pkg/notify"
)

// NOTIFY_WEBHOOK_SECRET is operator input: any string either yields a key
// of the promised size or an error, never a panic, and signing with the
// key is deterministic.
func FuzzParseSecret(f *testing.F) {
	f.Add("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	f.Add("whsec_")
	f.Add("whsec_====")
	f.Add(strings.Repeat("k", 32))
	f.Fuzz(func(t *testing.T, secret string) {
		key, err := notify.ParseSecret(secret)
		if err != nil {
			return
		}
		if strings.HasPrefix(secret, notify.SecretPrefix) && len(key) < notify.SecretKeyBytesMin ||
			!strings.HasPrefix(secret, notify.SecretPrefix) && len(key) < notify.SecretLengthMin {
			t.Fatalf("key of %d bytes accepted from %q", len(key), secret)
		}
		at := time.Unix(1614265330, 0)
		first, second := notify.Sign(key, "id", at, []byte("{}")), notify.Sign(key, "id", at, []byte("{}"))
		if first != second {
			t.Fatal("signing is not deterministic")
		}
	})
}
