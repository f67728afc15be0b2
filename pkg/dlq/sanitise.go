package dlq

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/payment"
)

// rawShownMax bounds how much of a refused value the sanitised letter's
// error quotes.
const rawShownMax = 256

// amountLimit is the first magnitude dead_letter_queue.amount, a
// NUMERIC(38,18), cannot hold.
var amountLimit = decimal.New(1, 20)

// sanitise makes a letter PostgreSQL refused fit dead_letter_queue: an
// amount that is no NUMERIC(38,18) and a payload that is no jsonb become
// NULL, text loses its NUL bytes and invalid UTF-8, and the error says
// what was refused and quotes each raw value it replaced (escaped, so the
// quote itself fits a text column).
func sanitise(l payment.DeadLetter, refusal error) payment.DeadLetter {
	var raw []string
	if l.Amount != "" && !fitsNumeric(l.Amount) {
		raw = append(raw, "amount "+quoteRaw(l.Amount))
		l.Amount = ""
	}
	if len(l.Payload) > 0 && !fitsJSONB(l.Payload) {
		raw = append(raw, "payload "+quoteRaw(string(l.Payload)))
		l.Payload = nil
	}
	for _, field := range []struct {
		name  string
		value *string
	}{
		{"event_id", &l.EventID}, {"event_type", &l.EventType}, {"asset", &l.Asset},
		{"trace_id", &l.TraceID}, {"fallback_id", &l.FallbackID},
	} {
		if clean := cleanText(*field.value); clean != *field.value {
			raw = append(raw, field.name+" "+quoteRaw(*field.value))
			*field.value = clean
		}
	}
	l.Error = cleanText(l.Error) + "; stored sanitised, PostgreSQL refused the letter: " + cleanText(refusal.Error())
	if len(raw) > 0 {
		l.Error += "; raw " + strings.Join(raw, ", ")
	}
	return l
}

// fitsNumeric reports whether s is a decimal a NUMERIC(38,18) holds once
// rounded to its 18 places.
func fitsNumeric(s string) bool {
	d, err := decimal.NewFromString(s)
	return err == nil && d.Round(18).Abs().LessThan(amountLimit)
}

// fitsJSONB reports whether p is JSON that jsonb takes: valid UTF-8 and
// no \u0000, which jsonb refuses (a false alarm on an escaped backslash
// before "u0000" only costs the payload's column, never the letter).
func fitsJSONB(p json.RawMessage) bool {
	return json.Valid(p) && utf8.Valid(p) && !bytes.Contains(p, []byte(`\u0000`))
}

// cleanText is s as a text column takes it: no NUL, valid UTF-8.
func cleanText(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

func quoteRaw(s string) string {
	if len(s) > rawShownMax {
		return strconv.QuoteToASCII(s[:rawShownMax]) + "..."
	}
	return strconv.QuoteToASCII(s)
}
