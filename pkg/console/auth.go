package console

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/payment"
)

// csrfTTL is how long a page's forms stay valid: a working day, so a page
// left open over lunch still acts, and a leaked token soon stops.
const csrfTTL = 12 * time.Hour

// csrfSkew tolerates api replicas whose clocks differ a little.
const csrfSkew = time.Minute

// Role is what a credential may do.
type Role string

const (
	RoleAdmin    Role = "admin"
	RoleReadOnly Role = "read-only"
)

// identity is who is asking: the role, the Basic user name (if any) and
// the digest of the credential the CSRF tokens are bound to.
type identity struct {
	role       Role
	user       string
	credential tokenDigest
}

type identityKey struct{}

func identityOf(r *http.Request) identity {
	id, _ := r.Context().Value(identityKey{}).(identity)
	return id
}

// tokenDigest is what tokens are compared by: equal-length digests leak
// neither content nor length.
type tokenDigest [sha256.Size]byte

func digest(token string) tokenDigest { return sha256.Sum256([]byte(token)) }

// authenticate reads a bearer token, or HTTP Basic with the token as
// password (browsers cannot send a bearer header).
func (c *Console) authenticate(r *http.Request) (identity, bool) {
	scheme, credentials, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	credentials = strings.TrimSpace(credentials)
	var token, user string
	switch {
	case strings.EqualFold(scheme, "Bearer"):
		token = credentials
	case strings.EqualFold(scheme, "Basic"):
		decoded, err := base64.StdEncoding.DecodeString(credentials)
		if err != nil {
			return identity{}, false
		}
		user, token, _ = strings.Cut(string(decoded), ":")
	}
	if token == "" {
		return identity{}, false
	}
	d := digest(token)
	admin := subtle.ConstantTimeCompare(d[:], c.admin[:]) == 1
	viewer := c.viewer != nil && subtle.ConstantTimeCompare(d[:], c.viewer[:]) == 1
	id := identity{user: cleanName(user), credential: d}
	switch {
	case admin:
		id.role = RoleAdmin
	case viewer:
		id.role = RoleReadOnly
	default:
		return identity{}, false
	}
	return id, true
}

// challenge asks for credentials, one scheme per WWW-Authenticate line:
// a browser offers its login only when Basic has a line of its own.
func challenge(h http.Header) {
	h.Del("WWW-Authenticate")
	h.Add("WWW-Authenticate", `Basic realm="settle"`)
	h.Add("WWW-Authenticate", `Bearer realm="settle"`)
}

// csrfKey derives the key of the CSRF tokens from the admin token, so
// every api replica accepts the forms of every other.
func csrfKey(adminToken string) []byte {
	mac := hmac.New(sha256.New, []byte(adminToken))
	mac.Write([]byte("settle console csrf v1"))
	return mac.Sum(nil)
}

// csrfToken is "<unix seconds>.<mac>", the mac over the time and the
// credential: a form works only for the credential it was served to, and
// only for csrfTTL.
func (c *Console) csrfToken(id identity, at time.Time) string {
	ts := strconv.FormatInt(at.Unix(), 10)
	return ts + "." + base64.RawURLEncoding.EncodeToString(c.csrfMAC(ts, id))
}

func (c *Console) csrfMAC(ts string, id identity) []byte {
	mac := hmac.New(sha256.New, c.csrfKey)
	mac.Write([]byte(ts))
	mac.Write([]byte{0})
	mac.Write(id.credential[:])
	return mac.Sum(nil)
}

func (c *Console) validCSRF(id identity, token string) bool {
	ts, sig, ok := strings.Cut(token, ".")
	if !ok || len(ts) > 20 {
		return false
	}
	unix, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return false
	}
	age := c.now().Sub(time.Unix(unix, 0))
	if age < -csrfSkew || age > csrfTTL {
		return false
	}
	// The MAC's own spelling is compared, not a decoding of the given one:
	// a decoder skips CR and LF and may ignore padding bits, and a token
	// must have one form.
	want := base64.RawURLEncoding.EncodeToString(c.csrfMAC(ts, id))
	return hmac.Equal([]byte(sig), []byte(want))
}

// actor is who acts and why, as an action records it.
type actor struct {
	identity
	// who is what the record names: the operator, the role and where the
	// request came from.
	who    string
	reason string
}

// action guards a POST: admin role, same origin, a valid CSRF token and
// a reason, in that order; then the handler runs with the actor.
func (c *Console) action(next func(http.ResponseWriter, *http.Request, actor)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := identityOf(r)
		if id.role != RoleAdmin {
			c.fail(w, r, http.StatusForbidden, "This credential is read-only: it may look, not act.")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, formBodyMax)
		if err := r.ParseForm(); err != nil {
			c.fail(w, r, http.StatusBadRequest, "The form could not be read.")
			return
		}
		if !httpapi.SameOrigin(r) || !c.validCSRF(id, r.PostForm.Get("csrf")) {
			c.fail(w, r, http.StatusForbidden, "The form expired or came from another site. Go back, reload the page and try again.")
			return
		}
		reason := strings.TrimSpace(r.PostForm.Get("reason"))
		if reason == "" {
			c.fail(w, r, http.StatusBadRequest, "A reason is required: it is recorded with the action.")
			return
		}
		if utf8.RuneCountInString(reason) > reasonMax {
			c.fail(w, r, http.StatusBadRequest, "The reason is longer than "+strconv.Itoa(reasonMax)+" characters.")
			return
		}
		if !payment.NoteFits(reason, reasonMax) {
			c.fail(w, r, http.StatusBadRequest, "The reason may hold no control characters but line breaks and tabs.")
			return
		}
		name := cleanName(r.PostForm.Get("operator"))
		if name == "" {
			name = id.user
		}
		if name == "" {
			name = "operator"
		}
		a := actor{identity: id, reason: reason,
			who: name + " (console, " + string(id.role) + ") @" + httpapi.ClientIP(r.Context()).String()}
		logging.From(r.Context()).Info().Str("path", r.URL.Path).Str("operator", a.who).Str("reason", reason).Msg("console action")
		next(w, r, a)
	}
}

// cleanName keeps a printable name of at most operatorMax characters.
func cleanName(s string) string {
	s = strings.TrimSpace(s)
	if !utf8.ValidString(s) {
		return ""
	}
	s = strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return -1
	}, s)
	if utf8.RuneCountInString(s) > operatorMax {
		s = string([]rune(s)[:operatorMax])
	}
	return s
}
