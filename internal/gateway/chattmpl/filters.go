package chattmpl

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"
)

func argOr(args []any, kw map[string]any, i int, name string, def any) any {
	if i < len(args) {
		return args[i]
	}
	if v, ok := kw[name]; ok {
		return v
	}
	return def
}

func wantString(name string, v any) (string, error) {
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%w: %s needs a string, got %s", ErrRender, name, typeName(v))
	}
	return s, nil
}

func (r *renderer) filter(name string, x any, args []any, kw map[string]any) (any, error) {
	switch name {
	case "trim", "upper", "lower", "title", "capitalize":
		if isUndefined(x) {
			x = ""
		}
		s := toString(x)
		switch name {
		case "trim":
			if len(args) > 0 {
				chars, err := wantString("trim", args[0])
				if err != nil {
					return nil, err
				}
				return strings.Trim(s, chars), nil
			}
			return strings.TrimFunc(s, isSpace), nil
		case "upper":
			return strings.ToUpper(s), nil
		case "lower":
			return strings.ToLower(s), nil
		case "title":
			return title(s), nil
		default:
			return capitalize(s), nil
		}
	case "length", "count":
		if isUndefined(x) {
			return 0, nil
		}
		return length(x)
	case "first", "last":
		elems, err := iterate(x)
		if err != nil {
			return nil, err
		}
		if len(elems) == 0 {
			return undefined{name}, nil
		}
		if name == "first" {
			return elems[0], nil
		}
		return elems[len(elems)-1], nil
	case "join":
		elems, err := iterate(x)
		if err != nil {
			return nil, err
		}
		sep := toString(argOr(args, kw, 0, "d", ""))
		attr, _ := argOr(args, kw, 1, "attribute", nil).(string)
		parts := make([]string, len(elems))
		for i, e := range elems {
			if attr != "" {
				e = getAttr(e, attr)
			}
			parts[i] = toString(e)
		}
		s := strings.Join(parts, sep)
		if len(s) > r.limits.MaxOutput {
			return nil, fmt.Errorf("%w: string larger than %d bytes", ErrLimit, r.limits.MaxOutput)
		}
		return s, nil
	case "default", "d":
		def := argOr(args, kw, 0, "default_value", "")
		boolean := truthy(argOr(args, kw, 1, "boolean", false))
		if isUndefined(x) || (boolean && !truthy(x)) {
			return def, nil
		}
		return x, nil
	case "tojson":
		indent := 0
		if v, ok := argOr(args, kw, 0, "indent", nil).(int); ok {
			indent = v
		}
		var b strings.Builder
		if err := toJSON(&b, x, indent, 0); err != nil {
			return nil, err
		}
		if b.Len() > r.limits.MaxOutput {
			return nil, fmt.Errorf("%w: string larger than %d bytes", ErrLimit, r.limits.MaxOutput)
		}
		return b.String(), nil
	case "string":
		return toString(x), nil
	case "int":
		switch v := x.(type) {
		case int:
			return v, nil
		case float64:
			return int(v), nil
		case bool:
			if v {
				return 1, nil
			}
			return 0, nil
		case string:
			if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
				return n, nil
			}
		}
		return argOr(args, kw, 0, "default", 0), nil
	case "float":
		if f, ok := toFloat(x); ok {
			return f, nil
		}
		if s, ok := x.(string); ok {
			if f, err := strconv.ParseFloat(strings.TrimSpace(s), 64); err == nil {
				return f, nil
			}
		}
		return argOr(args, kw, 0, "default", 0.0), nil
	case "abs":
		switch v := x.(type) {
		case int:
			if v < 0 {
				return -v, nil
			}
			return v, nil
		case float64:
			return math.Abs(v), nil
		}
		return nil, fmt.Errorf("%w: abs of a %s", ErrRender, typeName(x))
	case "list":
		return iterate(x)
	case "reverse":
		if s, ok := x.(string); ok {
			rs := []rune(s)
			for i, j := 0, len(rs)-1; i < j; i, j = i+1, j-1 {
				rs[i], rs[j] = rs[j], rs[i]
			}
			return string(rs), nil
		}
		elems, err := iterate(x)
		if err != nil {
			return nil, err
		}
		out := make([]any, len(elems))
		for i, e := range elems {
			out[len(elems)-1-i] = e
		}
		return out, nil
	case "items":
		d, ok := x.(*Dict)
		if !ok {
			if isUndefined(x) {
				return []any{}, nil
			}
			return nil, fmt.Errorf("%w: items of a %s", ErrRender, typeName(x))
		}
		return dictItems(d), nil
	case "replace":
		s := toString(x)
		if len(args) < 2 {
			return nil, fmt.Errorf("%w: replace needs two arguments", ErrRender)
		}
		old, new := toString(args[0]), toString(args[1])
		out := strings.ReplaceAll(s, old, new)
		if len(out) > r.limits.MaxOutput {
			return nil, fmt.Errorf("%w: string larger than %d bytes", ErrLimit, r.limits.MaxOutput)
		}
		return out, nil
	case "safe", "e", "escape", "unique":
		if name == "unique" {
			elems, err := iterate(x)
			if err != nil {
				return nil, err
			}
			var out []any
			for _, e := range elems {
				if ok, _ := contains(out, e); !ok {
					out = append(out, e)
				}
			}
			return out, nil
		}
		if name == "safe" {
			return x, nil
		}
		return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&#34;", "'", "&#39;").Replace(toString(x)), nil
	case "selectattr", "rejectattr", "select", "reject":
		// Jinja2 filters a falsy sequence (none too) to nothing: templates
		// run `tools | selectattr(...)` with tools set to none.
		if x == nil {
			return []any{}, nil
		}
		elems, err := iterate(x)
		if err != nil {
			return nil, err
		}
		attrMode := strings.HasSuffix(name, "attr")
		keep := strings.HasPrefix(name, "select")
		rest := args
		attr := ""
		if attrMode {
			if len(args) == 0 {
				return nil, fmt.Errorf("%w: %s needs an attribute", ErrRender, name)
			}
			attr = toString(args[0])
			rest = args[1:]
		}
		testName := ""
		var testArgs []any
		if len(rest) > 0 {
			testName = toString(rest[0])
			testArgs = rest[1:]
		}
		out := []any{}
		for _, e := range elems {
			v := e
			if attrMode {
				v = getAttr(e, attr)
			}
			ok := truthy(v)
			if testName != "" {
				if ok, err = test(testName, v, testArgs); err != nil {
					return nil, err
				}
			}
			if ok == keep {
				out = append(out, e)
			}
		}
		return out, nil
	case "map":
		if x == nil {
			return []any{}, nil // as select, for a none sequence
		}
		elems, err := iterate(x)
		if err != nil {
			return nil, err
		}
		out := make([]any, len(elems))
		if attr, ok := kw["attribute"].(string); ok {
			for i, e := range elems {
				v := getAttr(e, attr)
				if isUndefined(v) {
					if d, ok := kw["default"]; ok {
						v = d
					}
				}
				out[i] = v
			}
			return out, nil
		}
		if len(args) == 0 {
			return nil, fmt.Errorf("%w: map needs a filter name or attribute=", ErrRender)
		}
		f := toString(args[0])
		for i, e := range elems {
			if out[i], err = r.filter(f, e, args[1:], nil); err != nil {
				return nil, err
			}
		}
		return out, nil
	case "dictsort":
		d, ok := x.(*Dict)
		if !ok {
			return nil, fmt.Errorf("%w: dictsort of a %s", ErrRender, typeName(x))
		}
		items := dictItems(d)
		for i := 1; i < len(items); i++ {
			for j := i; j > 0 && items[j].([]any)[0].(string) < items[j-1].([]any)[0].(string); j-- {
				items[j], items[j-1] = items[j-1], items[j]
			}
		}
		return items, nil
	case "indent":
		s := toString(x)
		width := 4
		if w, ok := argOr(args, kw, 0, "width", 4).(int); ok {
			width = w
		}
		first := truthy(argOr(args, kw, 1, "first", false))
		pad := strings.Repeat(" ", max(width, 0))
		lines := strings.Split(s, "\n")
		for i := range lines {
			if (i > 0 || first) && lines[i] != "" {
				lines[i] = pad + lines[i]
			}
		}
		return strings.Join(lines, "\n"), nil
	}
	return nil, fmt.Errorf("%w: filter %q", ErrUnsupported, name)
}

func dictItems(d *Dict) []any {
	out := make([]any, len(d.keys))
	for i, k := range d.keys {
		out[i] = []any{k, d.m[k]}
	}
	return out
}

func test(name string, x any, args []any) (bool, error) {
	switch name {
	case "defined":
		return !isUndefined(x), nil
	case "undefined":
		return isUndefined(x), nil
	case "none":
		return x == nil, nil
	case "string":
		_, ok := x.(string)
		return ok, nil
	case "number":
		switch x.(type) {
		case int, float64:
			return true, nil
		}
		return false, nil
	case "integer":
		_, ok := x.(int)
		return ok, nil
	case "float":
		_, ok := x.(float64)
		return ok, nil
	case "boolean":
		_, ok := x.(bool)
		return ok, nil
	case "true":
		b, ok := x.(bool)
		return ok && b, nil
	case "false":
		b, ok := x.(bool)
		return ok && !b, nil
	case "mapping":
		_, ok := x.(*Dict)
		return ok, nil
	case "sequence", "iterable":
		switch x.(type) {
		case string, []any, *Dict:
			return true, nil
		}
		return false, nil
	case "callable":
		_, ok := x.(function)
		return ok, nil
	case "odd", "even":
		n, ok := x.(int)
		if !ok {
			return false, fmt.Errorf("%w: %s test of a %s", ErrRender, name, typeName(x))
		}
		return (n%2 != 0) == (name == "odd"), nil
	case "lower", "upper":
		s, ok := x.(string)
		if !ok {
			return false, nil
		}
		if name == "lower" {
			return s == strings.ToLower(s), nil
		}
		return s == strings.ToUpper(s), nil
	case "eq", "equalto", "==", "sameas", "ne", "!=":
		if len(args) != 1 {
			return false, fmt.Errorf("%w: test %s needs one argument", ErrRender, name)
		}
		if name == "sameas" {
			return x == nil && args[0] == nil || equal(x, args[0]) && typeName(x) == typeName(args[0]), nil
		}
		eq := equal(x, args[0])
		if name == "ne" || name == "!=" {
			return !eq, nil
		}
		return eq, nil
	case "in":
		if len(args) != 1 {
			return false, fmt.Errorf("%w: test in needs one argument", ErrRender)
		}
		return contains(args[0], x)
	case "divisibleby":
		n, ok1 := x.(int)
		d, ok2 := args[0].(int)
		if len(args) != 1 || !ok1 || !ok2 || d == 0 {
			return false, fmt.Errorf("%w: divisibleby needs integers", ErrRender)
		}
		return n%d == 0, nil
	}
	return false, fmt.Errorf("%w: test %q", ErrUnsupported, name)
}

// method returns the bound method name of x, or nil.
func method(x any, name string) function {
	switch v := x.(type) {
	case string:
		return stringMethod(v, name)
	case *Dict:
		switch name {
		case "items":
			return func(*renderer, []any, map[string]any) (any, error) { return dictItems(v), nil }
		case "keys":
			return func(*renderer, []any, map[string]any) (any, error) { return iterate(v) }
		case "values":
			return func(*renderer, []any, map[string]any) (any, error) {
				out := make([]any, len(v.keys))
				for i, k := range v.keys {
					out[i] = v.m[k]
				}
				return out, nil
			}
		case "get":
			return func(_ *renderer, args []any, _ map[string]any) (any, error) {
				if len(args) == 0 {
					return nil, fmt.Errorf("%w: get needs a key", ErrRender)
				}
				if k, ok := args[0].(string); ok {
					if e, ok := v.m[k]; ok {
						return e, nil
					}
				}
				if len(args) > 1 {
					return args[1], nil
				}
				return nil, nil
			}
		}
	}
	return nil
}

func stringMethod(s, name string) function {
	strArg := func(args []any, i int) (string, bool) {
		if i >= len(args) || args[i] == nil {
			return "", false
		}
		v, ok := args[i].(string)
		return v, ok
	}
	switch name {
	case "strip", "lstrip", "rstrip":
		return func(_ *renderer, args []any, _ map[string]any) (any, error) {
			chars, has := strArg(args, 0)
			trim := map[string]func(string, func(rune) bool) string{"strip": strings.TrimFunc, "lstrip": strings.TrimLeftFunc, "rstrip": strings.TrimRightFunc}[name]
			if has {
				return trim(s, func(r rune) bool { return strings.ContainsRune(chars, r) }), nil
			}
			return trim(s, isSpace), nil
		}
	case "upper", "lower", "title", "capitalize":
		return func(*renderer, []any, map[string]any) (any, error) {
			switch name {
			case "upper":
				return strings.ToUpper(s), nil
			case "lower":
				return strings.ToLower(s), nil
			case "title":
				return title(s), nil
			}
			return capitalize(s), nil
		}
	case "startswith", "endswith":
		return func(_ *renderer, args []any, _ map[string]any) (any, error) {
			var cands []any
			switch a := argOr(args, nil, 0, "", nil).(type) {
			case string:
				cands = []any{a}
			case []any:
				cands = a
			default:
				return nil, fmt.Errorf("%w: %s needs a string", ErrRender, name)
			}
			for _, c := range cands {
				p, _ := c.(string)
				if name == "startswith" && strings.HasPrefix(s, p) || name == "endswith" && strings.HasSuffix(s, p) {
					return true, nil
				}
			}
			return false, nil
		}
	case "split", "rsplit":
		return func(_ *renderer, args []any, kw map[string]any) (any, error) {
			sep, has := strArg(args, 0)
			limit := -1
			if n, ok := argOr(args, kw, 1, "maxsplit", -1).(int); ok && n >= 0 {
				limit = n + 1
			}
			var parts []string
			switch {
			case !has:
				parts = strings.Fields(s)
			case sep == "":
				return nil, fmt.Errorf("%w: empty separator", ErrRender)
			case name == "rsplit" && limit > 0:
				parts = rsplitN(s, sep, limit)
			default:
				parts = strings.SplitN(s, sep, limit)
			}
			out := make([]any, len(parts))
			for i, p := range parts {
				out[i] = p
			}
			return out, nil
		}
	case "replace":
		return func(r *renderer, args []any, _ map[string]any) (any, error) {
			old, ok1 := strArg(args, 0)
			new, ok2 := strArg(args, 1)
			if !ok1 || !ok2 {
				return nil, fmt.Errorf("%w: replace needs two strings", ErrRender)
			}
			out := strings.ReplaceAll(s, old, new)
			if len(out) > r.limits.MaxOutput {
				return nil, fmt.Errorf("%w: string larger than %d bytes", ErrLimit, r.limits.MaxOutput)
			}
			return out, nil
		}
	case "find":
		return func(_ *renderer, args []any, _ map[string]any) (any, error) {
			sub, ok := strArg(args, 0)
			if !ok {
				return nil, fmt.Errorf("%w: find needs a string", ErrRender)
			}
			i := strings.Index(s, sub)
			if i < 0 {
				return -1, nil
			}
			return len([]rune(s[:i])), nil
		}
	case "join":
		return func(_ *renderer, args []any, _ map[string]any) (any, error) {
			if len(args) != 1 {
				return nil, fmt.Errorf("%w: join needs one argument", ErrRender)
			}
			elems, err := iterate(args[0])
			if err != nil {
				return nil, err
			}
			parts := make([]string, len(elems))
			for i, e := range elems {
				parts[i] = toString(e)
			}
			return strings.Join(parts, s), nil
		}
	}
	return nil
}

func rsplitN(s, sep string, n int) []string {
	var out []string
	for len(out) < n-1 {
		i := strings.LastIndex(s, sep)
		if i < 0 {
			break
		}
		out = append([]string{s[i+len(sep):]}, out...)
		s = s[:i]
	}
	return append([]string{s}, out...)
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	rs := []rune(strings.ToLower(s))
	rs[0] = unicode.ToUpper(rs[0])
	return string(rs)
}

func title(s string) string {
	rs := []rune(s)
	prevLetter := false
	for i, r := range rs {
		if unicode.IsLetter(r) {
			if prevLetter {
				rs[i] = unicode.ToLower(r)
			} else {
				rs[i] = unicode.ToUpper(r)
			}
			prevLetter = true
		} else {
			prevLetter = false
		}
	}
	return string(rs)
}
