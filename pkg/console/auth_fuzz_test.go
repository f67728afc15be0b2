package console

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/settle/settle/pkg/postgres"
)

const fuzzAdminToken = "admin-token-0123456789-abcdefghijklmn"

func fuzzConsole(t testing.TB, now time.Time) *Console {
	c, err := New(Options{Store: (*postgres.DB)(nil), AdminToken: fuzzAdminToken, ReadOnlyToken: "readonly-token-0123456789-abcdefghijk",
		Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// FuzzCSRFToken: whatever a form carries, only a token this console made
// for this credential within its life is accepted, and nothing panics.
func FuzzCSRFToken(f *testing.F) {
	now := time.Unix(1_900_000_000, 0)
	c := fuzzConsole(f, now)
	admin := identity{role: RoleAdmin, credential: digest(fuzzAdminToken)}
	good := c.csrfToken(admin, now)
	// The same MAC with other padding bits in its last character.
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	last := strings.IndexByte(alphabet, good[len(good)-1])
	sibling := good[:len(good)-1] + string(alphabet[last^1])
	for _, seed := range []string{good, sibling, "", ".", "1900000000.", good + "x", strings.ToUpper(good), "-1.AAAA", "99999999999999999999999.AA", good[:len(good)-1],
		// A decoder skips line breaks: these decode to the good MAC.
		good[:20] + "\r" + good[20:], good[:20] + "\n" + good[20:], good + "\r\n"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, token string) {
		if c.validCSRF(admin, token) && token != good {
			// Another spelling of the same MAC would be a second valid token.
			t.Fatalf("accepted %q, which this console did not make", token)
		}
		other := identity{role: RoleReadOnly, credential: digest("readonly-token-0123456789-abcdefghijk")}
		if c.validCSRF(other, token) && token == good {
			t.Fatal("a token made for one credential passed for another")
		}
	})
}

// FuzzAuthorization: only the two tokens open the console, in either
// scheme; nothing else does, and nothing panics.
func FuzzAuthorization(f *testing.F) {
	c := fuzzConsole(f, time.Now())
	for _, seed := range []string{"", "Bearer " + fuzzAdminToken, "Basic YWxpY2U6", "Basic !!!", "bearer  x", "Basic " + strings.Repeat("A", 100), "Digest x"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, header string) {
		r := httptest.NewRequest("GET", Prefix, nil)
		r.Header.Set("Authorization", header)
		id, ok := c.authenticate(r)
		if !ok {
			return
		}
		if id.credential != digest(fuzzAdminToken) && id.credential != digest("readonly-token-0123456789-abcdefghijk") {
			t.Fatalf("%q authenticated without a token", header)
		}
		if id.role == RoleAdmin && id.credential != digest(fuzzAdminToken) {
			t.Fatalf("%q is admin without the admin token", header)
		}
	})
}
