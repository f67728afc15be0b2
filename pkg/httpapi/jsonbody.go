package httpapi

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/labstack/echo/v4"
)

// fieldsMax bounds the members of a request object; our bodies have at
// most six, so a body with many more is not one of ours.
const fieldsMax = 64

var errBodyTooLarge = errors.New("body too large")

// readBody reads the whole body, refusing more than limit bytes. The
// declared Content-Length is only used to refuse early: a body that
// lies about its length is still cut at limit+1 bytes.
func readBody(c echo.Context, limit int64) ([]byte, error) {
	r := c.Request()
	if r.ContentLength > limit {
		return nil, errBodyTooLarge
	}
	return readLimited(r.Body, limit, r.ContentLength)
}

// bodyError maps a readBody failure to the caller's answer.
func bodyError(err error) *apiError {
	if errors.Is(err, errBodyTooLarge) {
		return newError(http.StatusRequestEntityTooLarge, "request body too large")
	}
	return newError(http.StatusBadRequest, "could not read the request body")
}

// decodeObject reads a JSON object into its raw members. It is stricter
// than encoding/json on purpose: the body must be valid UTF-8 (json would
// silently replace bad bytes), a member may not repeat (parsers disagree
// on which copy wins, which is how signed bodies get reinterpreted), and
// nothing may follow the object.
func decodeObject(body []byte) (map[string]json.RawMessage, error) {
	if !utf8.Valid(body) {
		return nil, errors.New("body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	open, err := dec.Token()
	if err != nil {
		return nil, errors.New("body is not JSON")
	}
	if delim, ok := open.(json.Delim); !ok || delim != '{' {
		return nil, errors.New("body is not a JSON object")
	}
	fields := map[string]json.RawMessage{}
	for dec.More() {
		token, err := dec.Token()
		if err != nil {
			return nil, errors.New("body is not JSON")
		}
		key, ok := token.(string)
		if !ok {
			return nil, errors.New("body is not JSON")
		}
		if _, dup := fields[key]; dup {
			return nil, fmt.Errorf("field %q appears twice", truncate(key))
		}
		if len(fields) == fieldsMax {
			return nil, fmt.Errorf("more than %d fields", fieldsMax)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, errors.New("body is not JSON")
		}
		fields[key] = raw
	}
	if _, err := dec.Token(); err != nil {
		return nil, errors.New("body is not JSON")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("unexpected data after the JSON object")
	}
	return fields, nil
}

// DecodeStrict decodes a JSON object body into the struct v points to as
// strictly as the API's own bodies are read (decodeObject): valid UTF-8,
// no member twice, nothing after the object, and no member the struct
// does not name, spelled exactly (encoding/json alone would take
// "REASON" for "reason", a second copy by another case). For the admin
// routes that plugins contribute.
func DecodeStrict(body []byte, v any) error {
	fields, err := decodeObject(body)
	if err != nil {
		return err
	}
	names := memberNames(v)
	for name := range fields {
		if !names[name] {
			return fmt.Errorf("unknown field %q", truncate(name))
		}
	}
	return json.Unmarshal(body, v)
}

// memberNames are the JSON member names of the struct v points to: each
// exported field's tag name, else its own name.
func memberNames(v any) map[string]bool {
	t := reflect.TypeOf(v)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	names := map[string]bool{}
	if t == nil || t.Kind() != reflect.Struct {
		return names
	}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		names[cmp.Or(name, f.Name)] = true
	}
	return names
}

func isJSONNull(raw json.RawMessage) bool { return string(raw) == "null" }

// jsonString reads a member that must be a JSON string.
func jsonString(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || raw[0] != '"' {
		return "", false
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false
	}
	return s, true
}

// positiveIntegerDigitsMax: an int64 has at most 19 digits.
const positiveIntegerDigitsMax = 19

// jsonPositiveInteger reads a member that must be a JSON integer literal
// above zero: "7", 7.0, 1e3 and -1 are all refused, so an id never passes
// through a float or a string conversion.
func jsonPositiveInteger(raw json.RawMessage) (int64, bool) {
	if len(raw) == 0 || len(raw) > positiveIntegerDigitsMax || raw[0] < '1' || raw[0] > '9' {
		return 0, false
	}
	for _, c := range raw {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	return n, err == nil
}

// positiveIntegerParam parses a path segment as an id above zero.
func positiveIntegerParam(s string) (int64, bool) {
	return jsonPositiveInteger(json.RawMessage(s))
}

// printable reports whether s holds no control characters (ids end up in
// logs and headers).
func printable(s string) bool {
	for _, r := range s {
		if unicode.IsControl(r) || r == utf8.RuneError {
			return false
		}
	}
	return true
}

// truncateLengthMax bounds outside text quoted back in an error.
const truncateLengthMax = 64

func truncate(s string) string {
	if len(s) <= truncateLengthMax {
		return s
	}
	cut := truncateLengthMax
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
