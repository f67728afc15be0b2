package moralis

import (
	"bytes"
	"errors"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// Moralis signs JSON.stringify(JSON.parse(body)), not the bytes it sends:
// what a Node.js server sees after its JSON body parser. Stringify
// re-creates that text from the body: the same values, in JavaScript's
// order and spelling, whatever whitespace, escapes or number forms the
// wire used. It implements ECMAScript's JSON.parse (strict RFC 8259
// grammar, last duplicate key wins at the first key's place) and
// JSON.stringify (no whitespace, integer-like keys first in numeric
// order, Number::toString, QuoteJSONString of ES2019: lone surrogates
// escaped, everything else but '"', '\\' and control characters raw).

// Bounds of the parse; a body past them is refused (its signature cannot
// be checked, so it is not Moralis's).
const (
	// DepthMax bounds nesting; Moralis payloads are a few levels deep.
	DepthMax = 128
)

// errJSON marks text JSON.parse would refuse (or that settle refuses to
// judge: invalid UTF-8, nesting past DepthMax).
var errJSON = errors.New("not JSON as JSON.parse reads it")

// Stringify returns JSON.stringify(JSON.parse(body)) as UTF-8.
func Stringify(body []byte) ([]byte, error) {
	if !utf8.Valid(body) {
		// Node would decode invalid UTF-8 to U+FFFD first; Moralis never
		// sends it, so it is refused rather than guessed at.
		return nil, errJSON
	}
	p := parser{s: body}
	p.space()
	v, err := p.value(0)
	if err != nil {
		return nil, err
	}
	p.space()
	if p.i != len(p.s) {
		return nil, errJSON
	}
	out := make([]byte, 0, len(body))
	return v.write(out), nil
}

type kind uint8

const (
	kindNull kind = iota
	kindTrue
	kindFalse
	kindNumber
	kindString
	kindArray
	kindObject
)

type value struct {
	kind kind
	// text is a number's or a string's serialisation, ready to write.
	text  string
	items []*value
	obj   *object
}

// object keeps JavaScript's property order: keys in first-insertion
// order; a repeated key replaces the value at its first place.
type object struct {
	keys []string // serialised keys (quoted), the identity of a key
	// index marks keys that are array indexes (serialised first, by
	// value); num is that value.
	index []bool
	num   []uint32
	vals  map[string]*value
}

func (v *value) write(out []byte) []byte {
	switch v.kind {
	case kindNull:
		return append(out, "null"...)
	case kindTrue:
		return append(out, "true"...)
	case kindFalse:
		return append(out, "false"...)
	case kindNumber, kindString:
		return append(out, v.text...)
	case kindArray:
		out = append(out, '[')
		for i, item := range v.items {
			if i > 0 {
				out = append(out, ',')
			}
			out = item.write(out)
		}
		return append(out, ']')
	}
	o := v.obj
	order := make([]int, len(o.keys))
	for i := range order {
		order[i] = i
	}
	// Integer-like keys ascending, then the others as inserted (stable).
	sort.SliceStable(order, func(a, b int) bool {
		ia, ib := o.index[order[a]], o.index[order[b]]
		if ia && ib {
			return o.num[order[a]] < o.num[order[b]]
		}
		return ia && !ib
	})
	out = append(out, '{')
	for n, i := range order {
		if n > 0 {
			out = append(out, ',')
		}
		out = append(out, o.keys[i]...)
		out = append(out, ':')
		out = o.vals[o.keys[i]].write(out)
	}
	return append(out, '}')
}

type parser struct {
	s []byte
	i int
}

func (p *parser) space() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *parser) literal(word string) bool {
	if bytes.HasPrefix(p.s[p.i:], []byte(word)) {
		p.i += len(word)
		return true
	}
	return false
}

func (p *parser) value(depth int) (*value, error) {
	if depth > DepthMax {
		return nil, errJSON
	}
	if p.i >= len(p.s) {
		return nil, errJSON
	}
	switch c := p.s[p.i]; {
	case c == '{':
		return p.object(depth)
	case c == '[':
		return p.array(depth)
	case c == '"':
		text, _, err := p.str()
		if err != nil {
			return nil, err
		}
		return &value{kind: kindString, text: text}, nil
	case c == '-' || c >= '0' && c <= '9':
		text, err := p.number()
		if err != nil {
			return nil, err
		}
		return &value{kind: kindNumber, text: text}, nil
	case p.literal("true"):
		return &value{kind: kindTrue}, nil
	case p.literal("false"):
		return &value{kind: kindFalse}, nil
	case p.literal("null"):
		return &value{kind: kindNull}, nil
	}
	return nil, errJSON
}

func (p *parser) array(depth int) (*value, error) {
	p.i++ // [
	v := &value{kind: kindArray}
	p.space()
	if p.i < len(p.s) && p.s[p.i] == ']' {
		p.i++
		return v, nil
	}
	for {
		p.space()
		item, err := p.value(depth + 1)
		if err != nil {
			return nil, err
		}
		v.items = append(v.items, item)
		p.space()
		if p.i >= len(p.s) {
			return nil, errJSON
		}
		switch p.s[p.i] {
		case ',':
			p.i++
		case ']':
			p.i++
			return v, nil
		default:
			return nil, errJSON
		}
	}
}

func (p *parser) object(depth int) (*value, error) {
	p.i++ // {
	o := &object{vals: map[string]*value{}}
	v := &value{kind: kindObject, obj: o}
	p.space()
	if p.i < len(p.s) && p.s[p.i] == '}' {
		p.i++
		return v, nil
	}
	for {
		p.space()
		if p.i >= len(p.s) || p.s[p.i] != '"' {
			return nil, errJSON
		}
		key, units, err := p.str()
		if err != nil {
			return nil, err
		}
		p.space()
		if p.i >= len(p.s) || p.s[p.i] != ':' {
			return nil, errJSON
		}
		p.i++
		p.space()
		item, err := p.value(depth + 1)
		if err != nil {
			return nil, err
		}
		if _, seen := o.vals[key]; !seen {
			n, isIndex := arrayIndex(units)
			o.keys = append(o.keys, key)
			o.index = append(o.index, isIndex)
			o.num = append(o.num, n)
		}
		o.vals[key] = item
		p.space()
		if p.i >= len(p.s) {
			return nil, errJSON
		}
		switch p.s[p.i] {
		case ',':
			p.i++
		case '}':
			p.i++
			return v, nil
		default:
			return nil, errJSON
		}
	}
}

// arrayIndex reports whether a key is an array index as ECMAScript
// orders properties: the canonical decimal form of an integer below
// 2^32 - 1.
func arrayIndex(units []uint16) (uint32, bool) {
	if len(units) == 0 || len(units) > 10 || (len(units) > 1 && units[0] == '0') {
		return 0, false
	}
	var n uint64
	for _, u := range units {
		if u < '0' || u > '9' {
			return 0, false
		}
		n = n*10 + uint64(u-'0')
	}
	if n >= math.MaxUint32 {
		return 0, false
	}
	return uint32(n), true
}

// str reads a string literal and returns its serialisation by
// QuoteJSONString and its UTF-16 code units (for key ordering).
func (p *parser) str() (string, []uint16, error) {
	p.i++ // "
	var units []uint16
	for {
		if p.i >= len(p.s) {
			return "", nil, errJSON
		}
		c := p.s[p.i]
		switch {
		case c == '"':
			p.i++
			return quote(units), units, nil
		case c < 0x20:
			return "", nil, errJSON
		case c == '\\':
			if p.i+1 >= len(p.s) {
				return "", nil, errJSON
			}
			e := p.s[p.i+1]
			p.i += 2
			switch e {
			case '"', '\\', '/':
				units = append(units, uint16(e))
			case 'b':
				units = append(units, '\b')
			case 'f':
				units = append(units, '\f')
			case 'n':
				units = append(units, '\n')
			case 'r':
				units = append(units, '\r')
			case 't':
				units = append(units, '\t')
			case 'u':
				if p.i+4 > len(p.s) {
					return "", nil, errJSON
				}
				n, err := strconv.ParseUint(string(p.s[p.i:p.i+4]), 16, 16)
				if err != nil || !isHex4(p.s[p.i:p.i+4]) {
					return "", nil, errJSON
				}
				p.i += 4
				units = append(units, uint16(n))
			default:
				return "", nil, errJSON
			}
		case c < utf8.RuneSelf:
			units = append(units, uint16(c))
			p.i++
		default:
			r, size := utf8.DecodeRune(p.s[p.i:])
			p.i += size
			units = utf16.AppendRune(units, r)
		}
	}
}

func isHex4(b []byte) bool {
	for _, c := range b {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}

const hexDigits = "0123456789abcdef"

// quote is QuoteJSONString over UTF-16 code units (ES2019 and later).
func quote(units []uint16) string {
	var b strings.Builder
	b.Grow(len(units) + 2)
	b.WriteByte('"')
	escape := func(u uint16) {
		b.WriteString(`\u`)
		b.WriteByte(hexDigits[u>>12])
		b.WriteByte(hexDigits[u>>8&0xf])
		b.WriteByte(hexDigits[u>>4&0xf])
		b.WriteByte(hexDigits[u&0xf])
	}
	for i := 0; i < len(units); i++ {
		u := units[i]
		switch {
		case u == '\b':
			b.WriteString(`\b`)
		case u == '\t':
			b.WriteString(`\t`)
		case u == '\n':
			b.WriteString(`\n`)
		case u == '\f':
			b.WriteString(`\f`)
		case u == '\r':
			b.WriteString(`\r`)
		case u == '"':
			b.WriteString(`\"`)
		case u == '\\':
			b.WriteString(`\\`)
		case u < 0x20:
			escape(u)
		case utf16.IsSurrogate(rune(u)):
			if u < 0xdc00 && i+1 < len(units) && units[i+1] >= 0xdc00 && units[i+1] <= 0xdfff {
				b.WriteRune(utf16.DecodeRune(rune(u), rune(units[i+1])))
				i++
				continue
			}
			// A lone surrogate has no UTF-8 form: ES2019 escapes it.
			escape(u)
		default:
			b.WriteRune(rune(u))
		}
	}
	b.WriteByte('"')
	return b.String()
}

// number reads a number literal by the JSON grammar and returns
// JSON.stringify's text for the double JSON.parse makes of it.
func (p *parser) number() (string, error) {
	start := p.i
	if p.s[p.i] == '-' {
		p.i++
	}
	switch {
	case p.i < len(p.s) && p.s[p.i] == '0':
		p.i++
	case p.i < len(p.s) && p.s[p.i] >= '1' && p.s[p.i] <= '9':
		p.digits()
	default:
		return "", errJSON
	}
	if p.i < len(p.s) && p.s[p.i] == '.' {
		p.i++
		if p.digits() == 0 {
			return "", errJSON
		}
	}
	if p.i < len(p.s) && (p.s[p.i] == 'e' || p.s[p.i] == 'E') {
		p.i++
		if p.i < len(p.s) && (p.s[p.i] == '+' || p.s[p.i] == '-') {
			p.i++
		}
		if p.digits() == 0 {
			return "", errJSON
		}
	}
	// ParseFloat rounds correctly, as JSON.parse does; out of range it
	// gives ±Inf or 0, as JSON.parse does too.
	f, err := strconv.ParseFloat(string(p.s[start:p.i]), 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return "", errJSON
	}
	return NumberString(f), nil
}

func (p *parser) digits() int {
	n := 0
	for p.i < len(p.s) && p.s[p.i] >= '0' && p.s[p.i] <= '9' {
		p.i++
		n++
	}
	return n
}

// NumberString is JSON.stringify of a number: Number::toString for a
// finite one (shortest round-trip digits; plain notation for decimal
// exponents -6 < n <= 21, else d.ddde±x), "null" for ±Infinity and NaN.
func NumberString(f float64) string {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return "null"
	}
	if f == 0 {
		return "0" // -0 too
	}
	sign := ""
	if f < 0 {
		sign, f = "-", -f
	}
	// "d.ddddde±XX": the shortest digits that read back as f.
	e := strconv.FormatFloat(f, 'e', -1, 64)
	mantissa, exp, _ := strings.Cut(e, "e")
	digits := strings.Replace(mantissa, ".", "", 1)
	x, _ := strconv.Atoi(exp)
	k, n := len(digits), x+1 // f = 0.digits × 10^n
	switch {
	case k <= n && n <= 21:
		return sign + digits + strings.Repeat("0", n-k)
	case 0 < n && n <= 21:
		return sign + digits[:n] + "." + digits[n:]
	case -6 < n && n <= 0:
		return sign + "0." + strings.Repeat("0", -n) + digits
	}
	expSign := "+"
	if n-1 < 0 {
		expSign = "-"
	}
	exponent := strconv.Itoa(abs(n - 1))
	if k == 1 {
		return sign + digits + "e" + expSign + exponent
	}
	return sign + digits[:1] + "." + digits[1:] + "e" + expSign + exponent
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}
