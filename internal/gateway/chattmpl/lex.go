package chattmpl

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Errors returned by Parse and Execute.
var (
	ErrSyntax      = errors.New("chattmpl: syntax error")
	ErrUnsupported = errors.New("chattmpl: unsupported template feature")
	ErrRender      = errors.New("chattmpl: render error")
	ErrLimit       = errors.New("chattmpl: resource limit exceeded")
)

// MaxSourceBytes bounds a template's source.
const MaxSourceBytes = 1 << 20

type itemKind uint8

const (
	itemText       itemKind = iota
	itemVarStart            // {{
	itemBlockStart          // {%
	itemEnd                 // }} or %}
	itemName
	itemString
	itemInt
	itemFloat
	itemOp
	itemEOF
)

type item struct {
	kind itemKind
	val  string
	pos  int
}

func syntaxErr(pos int, format string, args ...any) error {
	return fmt.Errorf("%w at byte %d: %s", ErrSyntax, pos, fmt.Sprintf(format, args...))
}

// lex splits src into text and tag tokens, applying whitespace control
// with trim_blocks and lstrip_blocks on, as Hugging Face renders chat
// templates.
func lex(src string) ([]item, error) {
	var items []item
	trimNext, newlineNext := false, false
	i := 0
	for {
		j := nextTag(src, i)
		end := len(src)
		if j >= 0 {
			end = j
		}
		text := src[i:end]
		if trimNext {
			text = strings.TrimLeft(text, " \t\r\n")
		} else if newlineNext {
			if strings.HasPrefix(text, "\r\n") {
				text = text[2:]
			} else if strings.HasPrefix(text, "\n") {
				text = text[1:]
			}
		}
		trimNext, newlineNext = false, false
		if j < 0 {
			if text != "" {
				items = append(items, item{itemText, text, i})
			}
			items = append(items, item{kind: itemEOF, pos: len(src)})
			return items, nil
		}
		kind := src[j+1] // '{', '%' or '#'
		k := j + 2
		switch {
		case k < len(src) && src[k] == '-':
			text = strings.TrimRight(text, " \t\r\n")
			k++
		case k < len(src) && src[k] == '+':
			k++
		case kind != '{':
			// lstrip_blocks: a block or comment tag alone at the start
			// of its line takes the line's indentation with it.
			nl := strings.LastIndexByte(text, '\n')
			if rest := text[nl+1:]; strings.Trim(rest, " \t") == "" && (nl >= 0 || isLineStart(src, j-len(rest))) {
				text = text[:nl+1]
			}
		}
		if text != "" {
			items = append(items, item{itemText, text, i})
		}
		if kind == '#' {
			e := strings.Index(src[k:], "#}")
			if e < 0 {
				return nil, syntaxErr(j, "unclosed comment")
			}
			e += k
			trimNext = e > k && src[e-1] == '-'
			newlineNext = true
			i = e + 2
			continue
		}
		start := itemVarStart
		closer := "}}"
		if kind == '%' {
			start, closer = itemBlockStart, "%}"
		}
		items = append(items, item{start, "", j})
		var err error
		var trim bool
		items, i, trim, err = lexExpr(src, k, closer, items)
		if err != nil {
			return nil, err
		}
		trimNext = trim
		newlineNext = kind == '%'
	}
}

// isLineStart reports whether position p of src starts a line.
func isLineStart(src string, p int) bool { return p == 0 || src[p-1] == '\n' }

func nextTag(src string, from int) int {
	for i := from; i+1 < len(src); i++ {
		if src[i] == '{' && (src[i+1] == '{' || src[i+1] == '%' || src[i+1] == '#') {
			return i
		}
	}
	return -1
}

var ops2 = []string{"//", "**", "==", "!=", "<=", ">="}

const ops1 = "+-*/%~<>=()[]{},:.|"

// lexExpr lexes the inside of a tag up to closer, returning the position
// after it and whether it was preceded by "-".
func lexExpr(src string, i int, closer string, items []item) ([]item, int, bool, error) {
	for {
		for i < len(src) && strings.IndexByte(" \t\r\n", src[i]) >= 0 {
			i++
		}
		if i >= len(src) {
			return nil, 0, false, syntaxErr(i, "unclosed tag")
		}
		if strings.HasPrefix(src[i:], "-"+closer) {
			return append(items, item{itemEnd, "", i}), i + 1 + len(closer), true, nil
		}
		if strings.HasPrefix(src[i:], "+"+closer) {
			return append(items, item{itemEnd, "", i}), i + 1 + len(closer), false, nil
		}
		if strings.HasPrefix(src[i:], closer) {
			return append(items, item{itemEnd, "", i}), i + len(closer), false, nil
		}
		c := src[i]
		switch {
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			j := i + 1
			for j < len(src) && (src[j] == '_' || src[j] >= 'a' && src[j] <= 'z' || src[j] >= 'A' && src[j] <= 'Z' || src[j] >= '0' && src[j] <= '9') {
				j++
			}
			items = append(items, item{itemName, src[i:j], i})
			i = j
		case c >= '0' && c <= '9':
			j := i
			for j < len(src) && (src[j] >= '0' && src[j] <= '9' || src[j] == '_') {
				j++
			}
			kind := itemInt
			if j+1 < len(src) && src[j] == '.' && src[j+1] >= '0' && src[j+1] <= '9' {
				kind = itemFloat
				j++
				for j < len(src) && src[j] >= '0' && src[j] <= '9' {
					j++
				}
			}
			items = append(items, item{kind, strings.ReplaceAll(src[i:j], "_", ""), i})
			i = j
		case c == '\'' || c == '"':
			s, j, err := lexString(src, i)
			if err != nil {
				return nil, 0, false, err
			}
			items = append(items, item{itemString, s, i})
			i = j
		default:
			matched := false
			for _, op := range ops2 {
				if strings.HasPrefix(src[i:], op) {
					items = append(items, item{itemOp, op, i})
					i += 2
					matched = true
					break
				}
			}
			if matched {
				continue
			}
			if strings.IndexByte(ops1, c) >= 0 {
				items = append(items, item{itemOp, string(c), i})
				i++
				continue
			}
			return nil, 0, false, syntaxErr(i, "unexpected character %q", c)
		}
	}
}

// lexString reads a quoted literal with Python's escapes.
func lexString(src string, i int) (string, int, error) {
	q := src[i]
	var b strings.Builder
	for j := i + 1; j < len(src); j++ {
		c := src[j]
		switch {
		case c == q:
			return b.String(), j + 1, nil
		case c == '\\' && j+1 < len(src):
			j++
			switch e := src[j]; e {
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			case 'r':
				b.WriteByte('\r')
			case '0':
				b.WriteByte(0)
			case '\\', '\'', '"':
				b.WriteByte(e)
			case 'x', 'u', 'U':
				n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
				if j+n >= len(src) {
					return "", 0, syntaxErr(j, "short escape")
				}
				v, err := strconv.ParseUint(src[j+1:j+1+n], 16, 32)
				if err != nil {
					return "", 0, syntaxErr(j, "bad escape")
				}
				b.WriteRune(rune(v))
				j += n
			case '\n':
			default:
				b.WriteByte('\\')
				b.WriteByte(e)
			}
		default:
			b.WriteByte(c)
		}
	}
	return "", 0, syntaxErr(i, "unterminated string")
}
