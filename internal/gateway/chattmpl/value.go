package chattmpl

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Dict is an insertion-ordered string-keyed mapping, the template's dict
// (and namespace) value. Order matters: tojson and items() follow it.
type Dict struct {
	keys []string
	m    map[string]any
	ns   bool // a namespace(): its attributes may be set
}

// NewDict builds a Dict from alternating keys and values. Values may be
// nil, bool, int, float64, string, []any, *Dict, or (for convenience)
// []string, []map-free Go slices are not accepted.
func NewDict(kv ...any) *Dict {
	d := &Dict{m: make(map[string]any, len(kv)/2)}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Set(fmt.Sprint(kv[i]), kv[i+1])
	}
	return d
}

// Set sets key to v, keeping the key's first position.
func (d *Dict) Set(key string, v any) {
	if _, ok := d.m[key]; !ok {
		d.keys = append(d.keys, key)
	}
	d.m[key] = v
}

// Get returns the value of key.
func (d *Dict) Get(key string) (any, bool) {
	v, ok := d.m[key]
	return v, ok
}

// undefined is the value of a missing name, attribute or item. Printing it
// gives "", testing it gives false, most operations on it fail, as in
// Jinja2's default Undefined.
type undefined struct{ name string }

// function is a callable: a global or a bound method.
type function func(r *renderer, args []any, kw map[string]any) (any, error)

func isUndefined(v any) bool { _, ok := v.(undefined); return ok }

func truthy(v any) bool {
	switch x := v.(type) {
	case nil, undefined:
		return false
	case bool:
		return x
	case int:
		return x != 0
	case float64:
		return x != 0
	case string:
		return x != ""
	case []any:
		return len(x) > 0
	case *Dict:
		return len(x.keys) > 0
	}
	return true
}

// toString converts like Python's str().
func toString(v any) string {
	switch x := v.(type) {
	case undefined:
		return ""
	case string:
		return x
	}
	return repr(v, false)
}

// repr is Python's repr (quote=true) or str of a value.
func repr(v any, quote bool) string {
	switch x := v.(type) {
	case nil:
		return "None"
	case undefined:
		return ""
	case bool:
		if x {
			return "True"
		}
		return "False"
	case int:
		return strconv.Itoa(x)
	case float64:
		if math.IsInf(x, 0) || math.IsNaN(x) {
			return map[bool]string{true: "inf", false: "nan"}[math.IsInf(x, 1)]
		}
		if x == math.Trunc(x) && math.Abs(x) < 1e16 {
			return strconv.FormatFloat(x, 'f', 1, 64)
		}
		return strconv.FormatFloat(x, 'g', -1, 64)
	case string:
		if !quote {
			return x
		}
		return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`, "\n", `\n`).Replace(x) + "'"
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = repr(e, true)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case *Dict:
		parts := make([]string, len(x.keys))
		for i, k := range x.keys {
			parts[i] = repr(k, true) + ": " + repr(x.m[k], true)
		}
		return "{" + strings.Join(parts, ", ") + "}"
	case function:
		return "<function>"
	}
	return "<value>"
}

func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "none"
	case undefined:
		return "undefined"
	case bool:
		return "boolean"
	case int:
		return "integer"
	case float64:
		return "float"
	case string:
		return "string"
	case []any:
		return "list"
	case *Dict:
		return "dict"
	case function:
		return "function"
	}
	return "value"
}

func toFloat(v any) (float64, bool) {
	switch x := v.(type) {
	case int:
		return float64(x), true
	case float64:
		return x, true
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	}
	return 0, false
}

func equal(a, b any) bool {
	if fa, ok := toFloat(a); ok {
		if _, isBool := a.(bool); !isBool {
			if fb, ok := toFloat(b); ok {
				if _, isBool := b.(bool); !isBool {
					return fa == fb
				}
			}
		}
	}
	switch x := a.(type) {
	case nil:
		return b == nil
	case undefined:
		return isUndefined(b)
	case bool:
		y, ok := b.(bool)
		return ok && x == y
	case string:
		y, ok := b.(string)
		return ok && x == y
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !equal(x[i], y[i]) {
				return false
			}
		}
		return true
	case *Dict:
		y, ok := b.(*Dict)
		if !ok || len(x.keys) != len(y.keys) {
			return false
		}
		for k, v := range x.m {
			if w, ok := y.m[k]; !ok || !equal(v, w) {
				return false
			}
		}
		return true
	}
	return false
}

func compare(a, b any) (int, error) {
	if fa, ok := toFloat(a); ok {
		if fb, ok := toFloat(b); ok {
			switch {
			case fa < fb:
				return -1, nil
			case fa > fb:
				return 1, nil
			}
			return 0, nil
		}
	}
	if sa, ok := a.(string); ok {
		if sb, ok := b.(string); ok {
			return strings.Compare(sa, sb), nil
		}
	}
	return 0, fmt.Errorf("%w: cannot compare %s with %s", ErrRender, typeName(a), typeName(b))
}

func length(v any) (int, error) {
	switch x := v.(type) {
	case string:
		return utf8.RuneCountInString(x), nil
	case []any:
		return len(x), nil
	case *Dict:
		return len(x.keys), nil
	}
	return 0, fmt.Errorf("%w: %s has no length", ErrRender, typeName(v))
}

// iterate returns the elements a for loop visits.
func iterate(v any) ([]any, error) {
	switch x := v.(type) {
	case []any:
		return x, nil
	case *Dict:
		out := make([]any, len(x.keys))
		for i, k := range x.keys {
			out[i] = k
		}
		return out, nil
	case string:
		out := make([]any, 0, len(x))
		for _, r := range x {
			out = append(out, string(r))
		}
		return out, nil
	case undefined:
		return nil, nil // Jinja2 iterates an undefined as empty
	}
	return nil, fmt.Errorf("%w: %s is not iterable", ErrRender, typeName(v))
}

// toJSON encodes like Python's json.dumps(ensure_ascii=False) with
// separators (", ", ": ") or, with indent, Jinja's pretty form.
func toJSON(b *strings.Builder, v any, indent, level int) error {
	nl := func(l int) {
		if indent > 0 {
			b.WriteByte('\n')
			b.WriteString(strings.Repeat(" ", indent*l))
		}
	}
	sep := ", "
	if indent > 0 {
		sep = ","
	}
	switch x := v.(type) {
	case nil, undefined:
		b.WriteString("null")
	case bool:
		b.WriteString(map[bool]string{true: "true", false: "false"}[x])
	case int:
		b.WriteString(strconv.Itoa(x))
	case float64:
		if math.IsInf(x, 0) || math.IsNaN(x) {
			return fmt.Errorf("%w: tojson of a non-finite number", ErrRender)
		}
		b.WriteString(repr(x, false))
	case string:
		writeJSONString(b, x)
	case []any:
		if len(x) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteString(sep)
			}
			nl(level + 1)
			if err := toJSON(b, e, indent, level+1); err != nil {
				return err
			}
		}
		nl(level)
		b.WriteByte(']')
	case *Dict:
		if len(x.keys) == 0 {
			b.WriteString("{}")
			return nil
		}
		b.WriteByte('{')
		for i, k := range x.keys {
			if i > 0 {
				b.WriteString(sep)
			}
			nl(level + 1)
			writeJSONString(b, k)
			b.WriteString(": ")
			if err := toJSON(b, x.m[k], indent, level+1); err != nil {
				return err
			}
		}
		nl(level)
		b.WriteByte('}')
	default:
		return fmt.Errorf("%w: tojson of a %s", ErrRender, typeName(v))
	}
	return nil
}

func writeJSONString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			if r < 0x20 {
				fmt.Fprintf(b, `\u%04x`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

// fromGo converts caller-supplied variables into template values.
func fromGo(v any) any {
	switch x := v.(type) {
	case nil, bool, int, float64, string, *Dict, function:
		return x
	case int64:
		return int(x)
	case float32:
		return float64(x)
	case []string:
		out := make([]any, len(x))
		for i, s := range x {
			out[i] = s
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = fromGo(e)
		}
		return out
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		d := &Dict{m: make(map[string]any, len(x))}
		for _, k := range keys {
			d.Set(k, fromGo(x[k]))
		}
		return d
	}
	return undefined{name: "unsupported Go value"}
}
