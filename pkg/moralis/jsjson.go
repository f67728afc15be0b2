package moralis

import (
	"bytes"
	"cmp"
	"errors"
	"math"
	"slices"
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
	p, err := stringify(body, nil)
	if err != nil {
		return nil, err
	}
	return p.out, nil
}

// inputMax keeps every offset into the output within a uint32 (the
// output is at most ~4.4 times the input: "1e20" becomes 21 digits).
const inputMax = math.MaxUint32 / 8

// streamChunk is how much output outside any object is held before it
// goes to emit.
const streamChunk = 32 << 10

// stringify serialises body in one pass, without a tree: scalars and
// arrays are written as they are read; only the members of open objects
// are held (as spans of the output), since JavaScript's key order may
// move them. The body is not authenticated yet when Verify runs, so what
// it holds must stay a small multiple of its bytes. With emit nil, the
// whole output stays in p.out; else whatever no open object holds is
// handed to emit and dropped, and emit gets the rest at the end.
func stringify(body []byte, emit func([]byte)) (*parser, error) {
	if !utf8.Valid(body) || len(body) > inputMax {
		// Node would decode invalid UTF-8 to U+FFFD first; Moralis never
		// sends it, so it is refused rather than guessed at.
		return nil, errJSON
	}
	p := &parser{s: body, emit: emit}
	if emit == nil {
		p.out = make([]byte, 0, len(body))
	}
	p.space()
	if err := p.value(0); err != nil {
		return nil, err
	}
	p.space()
	if p.i != len(p.s) {
		return nil, errJSON
	}
	if emit != nil {
		emit(p.out)
	}
	return p, nil
}

type parser struct {
	s []byte
	i int

	// out is the serialisation not yet handed to emit.
	out  []byte
	emit func([]byte)
	// open counts the objects being read: while one is, out is held.
	open int
	// members of the open objects, the innermost's last.
	members []member
	// units and reorder are scratch buffers, reused.
	units   []uint16
	reorder []byte
}

// member is one property of an open object, as offsets into out: its
// key (quoted) at key, ':' at val-1, its value from val to end. first
// is where the key was first seen (a repeated key keeps that place).
type member struct{ first, key, val, end uint32 }

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
		p.out = append(p.out, word...)
		return true
	}
	return false
}

func (p *parser) value(depth int) error {
	if depth > DepthMax {
		return errJSON
	}
	if p.i >= len(p.s) {
		return errJSON
	}
	switch c := p.s[p.i]; {
	case c == '{':
		return p.object(depth)
	case c == '[':
		return p.array(depth)
	case c == '"':
		return p.str()
	case c == '-' || c >= '0' && c <= '9':
		text, err := p.number()
		if err != nil {
			return err
		}
		p.out = append(p.out, text...)
		return nil
	case p.literal("true"), p.literal("false"), p.literal("null"):
		return nil
	}
	return errJSON
}

func (p *parser) array(depth int) error {
	p.i++ // [
	p.out = append(p.out, '[')
	p.space()
	if p.i < len(p.s) && p.s[p.i] == ']' {
		p.i++
		p.out = append(p.out, ']')
		return nil
	}
	for {
		p.space()
		if err := p.value(depth + 1); err != nil {
			return err
		}
		p.space()
		if p.i >= len(p.s) {
			return errJSON
		}
		switch p.s[p.i] {
		case ',':
			p.i++
			p.out = append(p.out, ',')
			if p.emit != nil && p.open == 0 && len(p.out) >= streamChunk {
				p.emit(p.out)
				p.out = p.out[:0]
			}
		case ']':
			p.i++
			p.out = append(p.out, ']')
			return nil
		default:
			return errJSON
		}
	}
}

func (p *parser) object(depth int) error {
	p.i++ // {
	start := len(p.out)
	p.out = append(p.out, '{')
	p.space()
	if p.i < len(p.s) && p.s[p.i] == '}' {
		p.i++
		p.out = append(p.out, '}')
		return nil
	}
	p.open++
	base := len(p.members)
	for {
		p.space()
		if p.i >= len(p.s) || p.s[p.i] != '"' {
			return errJSON
		}
		if len(p.members) > base {
			p.out = append(p.out, ',')
		}
		key := uint32(len(p.out))
		if err := p.str(); err != nil {
			return err
		}
		p.space()
		if p.i >= len(p.s) || p.s[p.i] != ':' {
			return errJSON
		}
		p.i++
		p.out = append(p.out, ':')
		val := uint32(len(p.out))
		p.space()
		if err := p.value(depth + 1); err != nil {
			return err
		}
		p.members = append(p.members, member{first: key, key: key, val: val, end: uint32(len(p.out))})
		p.space()
		if p.i >= len(p.s) {
			return errJSON
		}
		switch p.s[p.i] {
		case ',':
			p.i++
		case '}':
			p.i++
			p.order(start, base)
			p.members = p.members[:base]
			p.open--
			p.out = append(p.out, '}')
			return nil
		default:
			return errJSON
		}
	}
}

// keyOf is a member's key as serialised (quoted): a key's identity.
func (p *parser) keyOf(m member) []byte { return p.out[m.key : m.val-1] }

// order rewrites the members of the object at out[start] (from base in
// p.members) in JavaScript's order: a repeated key once, at its first
// place with its last value; then integer-like keys ascending before
// the others as inserted. Members already in that order (no repeat, no
// integer-like key: the usual case) are left where they are.
func (p *parser) order(start, base int) {
	ms := p.members[base:]
	if len(ms) < 2 {
		return
	}
	// By key, then by place: repeats end up side by side, first first.
	slices.SortFunc(ms, func(a, b member) int {
		if c := bytes.Compare(p.keyOf(a), p.keyOf(b)); c != 0 {
			return c
		}
		return cmp.Compare(a.key, b.key)
	})
	n, moved := 0, false
	for i, m := range ms {
		if i > 0 && bytes.Equal(p.keyOf(ms[n-1]), p.keyOf(m)) {
			// The last value wins, at the first key's place.
			ms[n-1] = member{first: ms[n-1].first, key: m.key, val: m.val, end: m.end}
			moved = true
			continue
		}
		if _, index := arrayIndexKey(p.keyOf(m)); index {
			moved = true
		}
		ms[n] = m
		n++
	}
	if !moved {
		return
	}
	ms = ms[:n]
	slices.SortFunc(ms, func(a, b member) int {
		na, ia := arrayIndexKey(p.keyOf(a))
		nb, ib := arrayIndexKey(p.keyOf(b))
		switch {
		case ia && ib:
			return cmp.Compare(na, nb)
		case ia != ib:
			if ia {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.first, b.first)
	})
	text := p.reorder[:0]
	for i, m := range ms {
		if i > 0 {
			text = append(text, ',')
		}
		text = append(text, p.out[m.key:m.end]...)
	}
	p.out = append(p.out[:start+1], text...)
	p.reorder = text
}

// arrayIndexKey is arrayIndex of a serialised key: an array index is
// made of ASCII digits only, which serialise as themselves.
func arrayIndexKey(quoted []byte) (uint32, bool) {
	digits := quoted[1 : len(quoted)-1]
	if len(digits) == 0 || len(digits) > 10 {
		return 0, false
	}
	units := make([]uint16, 0, 10)
	for _, c := range digits {
		units = append(units, uint16(c))
	}
	return arrayIndex(units)
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

// str reads a string literal and writes its serialisation by
// QuoteJSONString.
func (p *parser) str() error {
	p.i++ // "
	units := p.units[:0]
	defer func() { p.units = units[:0] }()
	for {
		if p.i >= len(p.s) {
			return errJSON
		}
		c := p.s[p.i]
		switch {
		case c == '"':
			p.i++
			p.out = appendQuote(p.out, units)
			return nil
		case c < 0x20:
			return errJSON
		case c == '\\':
			if p.i+1 >= len(p.s) {
				return errJSON
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
					return errJSON
				}
				n, err := strconv.ParseUint(string(p.s[p.i:p.i+4]), 16, 16)
				if err != nil || !isHex4(p.s[p.i:p.i+4]) {
					return errJSON
				}
				p.i += 4
				units = append(units, uint16(n))
			default:
				return errJSON
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

// appendQuote appends QuoteJSONString over UTF-16 code units (ES2019
// and later) to b.
func appendQuote(b []byte, units []uint16) []byte {
	b = append(b, '"')
	escape := func(u uint16) {
		b = append(b, '\\', 'u', hexDigits[u>>12], hexDigits[u>>8&0xf], hexDigits[u>>4&0xf], hexDigits[u&0xf])
	}
	for i := 0; i < len(units); i++ {
		u := units[i]
		switch {
		case u == '\b':
			b = append(b, `\b`...)
		case u == '\t':
			b = append(b, `\t`...)
		case u == '\n':
			b = append(b, `\n`...)
		case u == '\f':
			b = append(b, `\f`...)
		case u == '\r':
			b = append(b, `\r`...)
		case u == '"':
			b = append(b, `\"`...)
		case u == '\\':
			b = append(b, `\\`...)
		case u < 0x20:
			escape(u)
		case utf16.IsSurrogate(rune(u)):
			if u < 0xdc00 && i+1 < len(units) && units[i+1] >= 0xdc00 && units[i+1] <= 0xdfff {
				b = utf8.AppendRune(b, utf16.DecodeRune(rune(u), rune(units[i+1])))
				i++
				continue
			}
			// A lone surrogate has no UTF-8 form: ES2019 escapes it.
			escape(u)
		default:
			b = utf8.AppendRune(b, rune(u))
		}
	}
	b = append(b, '"')
	return b
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
