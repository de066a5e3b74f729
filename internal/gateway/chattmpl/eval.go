package chattmpl

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"unicode"
)

// Limits bound one render. The zero value means the defaults.
type Limits struct {
	MaxSteps  int // nodes and expressions evaluated; default 1,000,000
	MaxOutput int // bytes of output; default 8 MiB
	MaxRange  int // elements range() may produce; default 100,000
}

// Template is a parsed chat template, safe for concurrent Execute calls.
type Template struct {
	body   []node
	Limits Limits
	// Now is the clock for strftime_now; nil means time.Now.
	Now func() time.Time
}

// RaisedError is returned when the template calls raise_exception: the
// template refused its input. Msg is the template's own text.
type RaisedError struct{ Msg string }

func (e *RaisedError) Error() string { return "chattmpl: template raised: " + e.Msg }

func (e *RaisedError) Unwrap() error { return ErrRaised }

// Parse parses a template.
func Parse(src string) (*Template, error) {
	if len(src) > MaxSourceBytes {
		return nil, fmt.Errorf("%w: template larger than %d bytes", ErrLimit, MaxSourceBytes)
	}
	items, err := lex(src)
	if err != nil {
		return nil, err
	}
	p := &parser{items: items}
	body, _, err := p.parseBody()
	if err != nil {
		return nil, err
	}
	return &Template{body: body}, nil
}

type scope struct {
	vars   map[string]any
	parent *scope
}

func (s *scope) lookup(name string) (any, bool) {
	for ; s != nil; s = s.parent {
		if v, ok := s.vars[name]; ok {
			return v, true
		}
	}
	return nil, false
}

type renderer struct {
	t      *Template
	out    *strings.Builder
	steps  int
	limits Limits
	calls  int // macro calls in progress, bounded by maxMacroDepth
}

// maxMacroDepth bounds nested (and recursive) macro calls.
const maxMacroDepth = 64

// Loop control travels as an error value through the body being run.
var (
	errBreak    = errors.New("break")
	errContinue = errors.New("continue")
)

// Execute renders the template with vars (nil, bool, int, float64, string,
// []any, []string, map[string]any and *Dict values).
func (t *Template) Execute(vars map[string]any) (string, error) {
	r := &renderer{t: t, limits: t.Limits, out: &strings.Builder{}}
	if r.limits.MaxSteps <= 0 {
		r.limits.MaxSteps = 1_000_000
	}
	if r.limits.MaxOutput <= 0 {
		r.limits.MaxOutput = 8 << 20
	}
	if r.limits.MaxRange <= 0 {
		r.limits.MaxRange = 100_000
	}
	global := &scope{vars: map[string]any{
		"raise_exception": function(fnRaise),
		"namespace":       function(fnNamespace),
		"range":           function(fnRange),
		"strftime_now":    function(fnStrftimeNow),
	}}
	top := &scope{vars: make(map[string]any, len(vars)), parent: global}
	for k, v := range vars {
		top.vars[k] = fromGo(v)
	}
	if err := r.run(r.t.body, top); err != nil {
		if errors.Is(err, errBreak) || errors.Is(err, errContinue) {
			return "", fmt.Errorf("%w: break or continue outside a loop", ErrRender)
		}
		return "", err
	}
	return r.out.String(), nil
}

func (r *renderer) step() error {
	r.steps++
	if r.steps > r.limits.MaxSteps {
		return fmt.Errorf("%w: more than %d steps", ErrLimit, r.limits.MaxSteps)
	}
	return nil
}

func (r *renderer) write(s string) error {
	if r.out.Len()+len(s) > r.limits.MaxOutput {
		return fmt.Errorf("%w: output larger than %d bytes", ErrLimit, r.limits.MaxOutput)
	}
	r.out.WriteString(s)
	return nil
}

func (r *renderer) run(body []node, sc *scope) error {
	for _, n := range body {
		if err := r.step(); err != nil {
			return err
		}
		switch n := n.(type) {
		case *textNode:
			if err := r.write(n.s); err != nil {
				return err
			}
		case *outputNode:
			v, err := r.eval(n.e, sc)
			if err != nil {
				return err
			}
			if err := r.write(toString(v)); err != nil {
				return err
			}
		case *ifNode:
			done := false
			for i, c := range n.conds {
				v, err := r.eval(c, sc)
				if err != nil {
					return err
				}
				if truthy(v) {
					if err := r.run(n.bodies[i], sc); err != nil {
						return err
					}
					done = true
					break
				}
			}
			if !done && n.els != nil {
				if err := r.run(n.els, sc); err != nil {
					return err
				}
			}
		case *forNode:
			if err := r.runFor(n, sc); err != nil {
				return err
			}
		case *setNode:
			v, err := r.eval(n.e, sc)
			if err != nil {
				return err
			}
			if n.attr == "" {
				sc.vars[n.name] = v
				continue
			}
			target, _ := sc.lookup(n.name)
			d, ok := target.(*Dict)
			if !ok || !d.ns {
				return fmt.Errorf("%w: can only set attributes of a namespace", ErrRender)
			}
			d.Set(n.attr, v)
		case *macroNode:
			sc.vars[n.name] = r.macro(n, sc)
		case *breakNode:
			return errBreak
		case *continueNode:
			return errContinue
		}
	}
	return nil
}

// macro makes a macro's function: called, it binds the arguments
// (positional, then by name, then the defaults, evaluated in the defining
// scope; a missing one is undefined, as in Jinja2) in a scope of its own
// above the one it was defined in, and returns what its body writes.
func (r *renderer) macro(n *macroNode, def *scope) function {
	return func(r *renderer, args []any, kw map[string]any) (any, error) {
		if len(args) > len(n.params) {
			return nil, fmt.Errorf("%w: macro %s takes %d arguments, got %d", ErrRender, n.name, len(n.params), len(args))
		}
		r.calls++
		defer func() { r.calls-- }()
		if r.calls > maxMacroDepth {
			return nil, fmt.Errorf("%w: macro calls nested deeper than %d", ErrLimit, maxMacroDepth)
		}
		sc := &scope{vars: make(map[string]any, len(n.params)), parent: def}
		for i, name := range n.params {
			switch v, ok := kw[name]; {
			case i < len(args):
				sc.vars[name] = args[i]
			case ok:
				sc.vars[name] = v
			case n.defaults[i] != nil:
				v, err := r.eval(n.defaults[i], def)
				if err != nil {
					return nil, err
				}
				sc.vars[name] = v
			default:
				sc.vars[name] = undefined{name}
			}
		}
		for k := range kw {
			if !slices.Contains(n.params, k) {
				return nil, fmt.Errorf("%w: macro %s has no parameter %q", ErrRender, n.name, k)
			}
		}
		outer := r.out
		r.out = &strings.Builder{}
		defer func() { r.out = outer }()
		if err := r.run(n.body, sc); err != nil {
			return nil, err
		}
		if outer.Len()+r.out.Len() > r.limits.MaxOutput {
			return nil, fmt.Errorf("%w: output larger than %d bytes", ErrLimit, r.limits.MaxOutput)
		}
		return r.out.String(), nil
	}
}

func (r *renderer) runFor(n *forNode, sc *scope) error {
	v, err := r.eval(n.iter, sc)
	if err != nil {
		return err
	}
	all, err := iterate(v)
	if err != nil {
		return err
	}
	bind := func(s *scope, e any) error {
		if len(n.vars) == 1 {
			s.vars[n.vars[0]] = e
			return nil
		}
		tuple, ok := e.([]any)
		if !ok || len(tuple) != len(n.vars) {
			return fmt.Errorf("%w: cannot unpack %s into %d names", ErrRender, typeName(e), len(n.vars))
		}
		for i, name := range n.vars {
			s.vars[name] = tuple[i]
		}
		return nil
	}
	items := all
	if n.cond != nil {
		items = nil
		for _, e := range all {
			s := &scope{vars: map[string]any{}, parent: sc}
			if err := bind(s, e); err != nil {
				return err
			}
			c, err := r.eval(n.cond, s)
			if err != nil {
				return err
			}
			if truthy(c) {
				items = append(items, e)
			}
		}
	}
	if len(items) == 0 {
		if n.els != nil {
			return r.run(n.els, sc)
		}
		return nil
	}
	for i, e := range items {
		if err := r.step(); err != nil {
			return err
		}
		loop := NewDict("index", i+1, "index0", i, "revindex", len(items)-i, "revindex0", len(items)-i-1,
			"first", i == 0, "last", i == len(items)-1, "length", len(items))
		if i > 0 {
			loop.Set("previtem", items[i-1])
		}
		if i+1 < len(items) {
			loop.Set("nextitem", items[i+1])
		}
		// Each iteration has its own scope: a plain set inside the loop
		// does not leak out (that is what namespace() is for).
		s := &scope{vars: map[string]any{"loop": loop}, parent: sc}
		if err := bind(s, e); err != nil {
			return err
		}
		err := r.run(n.body, s)
		if errors.Is(err, errBreak) {
			break
		}
		if err != nil && !errors.Is(err, errContinue) {
			return err
		}
	}
	return nil
}

func (r *renderer) eval(e expr, sc *scope) (any, error) {
	if err := r.step(); err != nil {
		return nil, err
	}
	switch e := e.(type) {
	case *literal:
		return e.v, nil
	case *nameExpr:
		if v, ok := sc.lookup(e.name); ok {
			return v, nil
		}
		return undefined{e.name}, nil
	case *listExpr:
		out := make([]any, len(e.items))
		for i, x := range e.items {
			v, err := r.eval(x, sc)
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	case *dictExpr:
		d := NewDict()
		for i := range e.keys {
			k, err := r.eval(e.keys[i], sc)
			if err != nil {
				return nil, err
			}
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("%w: dict keys must be strings", ErrUnsupported)
			}
			v, err := r.eval(e.vals[i], sc)
			if err != nil {
				return nil, err
			}
			d.Set(ks, v)
		}
		return d, nil
	case *attrExpr:
		x, err := r.eval(e.x, sc)
		if err != nil {
			return nil, err
		}
		return getAttr(x, e.name), nil
	case *indexExpr:
		x, err := r.eval(e.x, sc)
		if err != nil {
			return nil, err
		}
		i, err := r.eval(e.i, sc)
		if err != nil {
			return nil, err
		}
		return getItem(x, i), nil
	case *sliceExpr:
		return r.evalSlice(e, sc)
	case *callExpr:
		return r.evalCall(e, sc)
	case *filterExpr:
		x, err := r.eval(e.x, sc)
		if err != nil {
			return nil, err
		}
		args, kw, err := r.evalArgs(e.args, e.kw, sc)
		if err != nil {
			return nil, err
		}
		return r.filter(e.name, x, args, kw)
	case *testExpr:
		x, err := r.eval(e.x, sc)
		if err != nil {
			return nil, err
		}
		args, _, err := r.evalArgs(e.args, nil, sc)
		if err != nil {
			return nil, err
		}
		ok, err := test(e.name, x, args)
		return ok != e.neg, err
	case *unaryExpr:
		x, err := r.eval(e.x, sc)
		if err != nil {
			return nil, err
		}
		if e.op == "not" {
			return !truthy(x), nil
		}
		switch v := x.(type) {
		case int:
			return -v, nil
		case float64:
			return -v, nil
		}
		return nil, fmt.Errorf("%w: cannot negate %s", ErrRender, typeName(x))
	case *condExpr:
		c, err := r.eval(e.cond, sc)
		if err != nil {
			return nil, err
		}
		if truthy(c) {
			return r.eval(e.a, sc)
		}
		if e.b == nil {
			return undefined{}, nil
		}
		return r.eval(e.b, sc)
	case *binExpr:
		return r.evalBinary(e, sc)
	}
	return nil, fmt.Errorf("%w: unknown expression", ErrRender)
}

func (r *renderer) evalArgs(args []expr, kw []kwArg, sc *scope) ([]any, map[string]any, error) {
	var out []any
	for _, a := range args {
		v, err := r.eval(a, sc)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, v)
	}
	var kws map[string]any
	for _, k := range kw {
		v, err := r.eval(k.e, sc)
		if err != nil {
			return nil, nil, err
		}
		if kws == nil {
			kws = map[string]any{}
		}
		kws[k.name] = v
	}
	return out, kws, nil
}

func (r *renderer) evalBinary(e *binExpr, sc *scope) (any, error) {
	l, err := r.eval(e.l, sc)
	if err != nil {
		return nil, err
	}
	switch e.op { // short-circuit: the value of the deciding operand
	case "and":
		if !truthy(l) {
			return l, nil
		}
		return r.eval(e.r, sc)
	case "or":
		if truthy(l) {
			return l, nil
		}
		return r.eval(e.r, sc)
	}
	rv, err := r.eval(e.r, sc)
	if err != nil {
		return nil, err
	}
	switch e.op {
	case "==":
		return equal(l, rv), nil
	case "!=":
		return !equal(l, rv), nil
	case "<", "<=", ">", ">=":
		c, err := compare(l, rv)
		if err != nil {
			return nil, err
		}
		return map[string]bool{"<": c < 0, "<=": c <= 0, ">": c > 0, ">=": c >= 0}[e.op], nil
	case "in", "not in":
		ok, err := contains(rv, l)
		if err != nil {
			return nil, err
		}
		return ok == (e.op == "in"), nil
	case "~":
		s := toString(l) + toString(rv)
		if len(s) > r.limits.MaxOutput {
			return nil, fmt.Errorf("%w: string larger than %d bytes", ErrLimit, r.limits.MaxOutput)
		}
		return s, nil
	}
	return r.arith(e.op, l, rv)
}

func (r *renderer) arith(op string, l, rv any) (any, error) {
	if isUndefined(l) || isUndefined(rv) {
		name := ""
		if u, ok := l.(undefined); ok {
			name = u.name
		} else {
			name = rv.(undefined).name
		}
		return nil, fmt.Errorf("%w: %q is undefined", ErrRender, name)
	}
	if op == "+" {
		switch x := l.(type) {
		case string:
			if y, ok := rv.(string); ok {
				if len(x)+len(y) > r.limits.MaxOutput {
					return nil, fmt.Errorf("%w: string larger than %d bytes", ErrLimit, r.limits.MaxOutput)
				}
				return x + y, nil
			}
		case []any:
			if y, ok := rv.([]any); ok {
				return append(append([]any{}, x...), y...), nil
			}
		}
	}
	if op == "*" {
		if s, ok := l.(string); ok {
			if n, ok := rv.(int); ok {
				if n < 0 {
					n = 0
				}
				if len(s)*n > r.limits.MaxOutput {
					return nil, fmt.Errorf("%w: string larger than %d bytes", ErrLimit, r.limits.MaxOutput)
				}
				return strings.Repeat(s, n), nil
			}
		}
	}
	li, lInt := l.(int)
	ri, rInt := rv.(int)
	if lInt && rInt {
		switch op {
		case "+":
			return li + ri, nil
		case "-":
			return li - ri, nil
		case "*":
			return li * ri, nil
		case "//", "%":
			if ri == 0 {
				return nil, fmt.Errorf("%w: division by zero", ErrRender)
			}
			q, m := li/ri, li%ri
			if m != 0 && (m < 0) != (ri < 0) { // Python floors
				q, m = q-1, m+ri
			}
			if op == "//" {
				return q, nil
			}
			return m, nil
		}
	}
	lf, ok1 := toFloat(l)
	rf, ok2 := toFloat(rv)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("%w: unsupported operands for %s: %s and %s", ErrRender, op, typeName(l), typeName(rv))
	}
	switch op {
	case "+":
		return lf + rf, nil
	case "-":
		return lf - rf, nil
	case "*":
		return lf * rf, nil
	case "/":
		if rf == 0 {
			return nil, fmt.Errorf("%w: division by zero", ErrRender)
		}
		return lf / rf, nil
	case "//":
		if rf == 0 {
			return nil, fmt.Errorf("%w: division by zero", ErrRender)
		}
		return math.Floor(lf / rf), nil
	case "%":
		if rf == 0 {
			return nil, fmt.Errorf("%w: division by zero", ErrRender)
		}
		return lf - rf*math.Floor(lf/rf), nil
	case "**":
		return math.Pow(lf, rf), nil
	}
	return nil, fmt.Errorf("%w: operator %s", ErrUnsupported, op)
}

func contains(container, x any) (bool, error) {
	switch c := container.(type) {
	case string:
		s, ok := x.(string)
		if !ok {
			return false, fmt.Errorf("%w: 'in <string>' needs a string", ErrRender)
		}
		return strings.Contains(c, s), nil
	case []any:
		for _, e := range c {
			if equal(e, x) {
				return true, nil
			}
		}
		return false, nil
	case *Dict:
		s, ok := x.(string)
		if !ok {
			return false, nil
		}
		_, found := c.m[s]
		return found, nil
	case undefined:
		return false, nil
	}
	return false, fmt.Errorf("%w: 'in' on a %s", ErrRender, typeName(container))
}

func getAttr(x any, name string) any {
	if d, ok := x.(*Dict); ok {
		if v, ok := d.m[name]; ok {
			return v
		}
	}
	if m := method(x, name); m != nil {
		return m
	}
	return undefined{name}
}

func getItem(x, i any) any {
	switch c := x.(type) {
	case *Dict:
		if s, ok := i.(string); ok {
			if v, ok := c.m[s]; ok {
				return v
			}
			return undefined{s}
		}
	case []any:
		if n, ok := i.(int); ok {
			if n < 0 {
				n += len(c)
			}
			if n >= 0 && n < len(c) {
				return c[n]
			}
		}
	case string:
		if n, ok := i.(int); ok {
			rs := []rune(c)
			if n < 0 {
				n += len(rs)
			}
			if n >= 0 && n < len(rs) {
				return string(rs[n])
			}
		}
	}
	return undefined{toString(i)}
}

func (r *renderer) evalSlice(e *sliceExpr, sc *scope) (any, error) {
	x, err := r.eval(e.x, sc)
	if err != nil {
		return nil, err
	}
	var bounds [3]any
	for k, b := range []expr{e.lo, e.hi, e.step} {
		if b == nil {
			continue
		}
		v, err := r.eval(b, sc)
		if err != nil {
			return nil, err
		}
		if _, ok := v.(int); !ok && v != nil {
			return nil, fmt.Errorf("%w: slice bounds must be integers", ErrRender)
		}
		bounds[k] = v
	}
	var elems []any
	_, isStr := x.(string)
	switch c := x.(type) {
	case []any:
		elems = c
	case string:
		for _, ch := range c {
			elems = append(elems, string(ch))
		}
	default:
		return nil, fmt.Errorf("%w: cannot slice a %s", ErrRender, typeName(x))
	}
	n := len(elems)
	step := 1
	if s, ok := bounds[2].(int); ok {
		step = s
	}
	if step == 0 {
		return nil, fmt.Errorf("%w: slice step is zero", ErrRender)
	}
	clamp := func(v any, def int) int {
		i, ok := v.(int)
		if !ok {
			return def
		}
		if i < 0 {
			i += n
		}
		lo, hi := 0, n
		if step < 0 {
			lo, hi = -1, n-1
		}
		return max(lo, min(hi, i))
	}
	var out []any
	if step > 0 {
		for i := clamp(bounds[0], 0); i < clamp(bounds[1], n); i += step {
			out = append(out, elems[i])
		}
	} else {
		for i := clamp(bounds[0], n-1); i > clamp(bounds[1], -1); i += step {
			out = append(out, elems[i])
		}
	}
	if isStr {
		var b strings.Builder
		for _, e := range out {
			b.WriteString(e.(string))
		}
		return b.String(), nil
	}
	if out == nil {
		out = []any{}
	}
	return out, nil
}

func (r *renderer) evalCall(e *callExpr, sc *scope) (any, error) {
	fn, err := r.eval(e.fn, sc)
	if err != nil {
		return nil, err
	}
	f, ok := fn.(function)
	if !ok {
		name := "value"
		if u, ok := fn.(undefined); ok {
			name = u.name
			return nil, fmt.Errorf("%w: unknown function or method %q", ErrUnsupported, name)
		}
		return nil, fmt.Errorf("%w: a %s is not callable", ErrRender, typeName(fn))
	}
	args, kw, err := r.evalArgs(e.args, e.kw, sc)
	if err != nil {
		return nil, err
	}
	return f(r, args, kw)
}

// Globals.

func fnRaise(_ *renderer, args []any, _ map[string]any) (any, error) {
	msg := ""
	if len(args) > 0 {
		msg = toString(args[0])
	}
	return nil, &RaisedError{Msg: msg}
}

func fnNamespace(_ *renderer, args []any, kw map[string]any) (any, error) {
	d := NewDict()
	d.ns = true
	if len(args) == 1 {
		if src, ok := args[0].(*Dict); ok {
			for _, k := range src.keys {
				d.Set(k, src.m[k])
			}
		}
	}
	for _, k := range sortedKeys(kw) {
		d.Set(k, kw[k])
	}
	return d, nil
}

func fnRange(r *renderer, args []any, _ map[string]any) (any, error) {
	var n [3]int
	n[2] = 1
	if len(args) == 0 || len(args) > 3 {
		return nil, fmt.Errorf("%w: range takes 1 to 3 arguments", ErrRender)
	}
	for i, a := range args {
		v, ok := a.(int)
		if !ok {
			return nil, fmt.Errorf("%w: range arguments must be integers", ErrRender)
		}
		n[i] = v
	}
	start, stop, step := 0, n[0], 1
	if len(args) >= 2 {
		start, stop = n[0], n[1]
	}
	if len(args) == 3 {
		step = n[2]
	}
	if step == 0 {
		return nil, fmt.Errorf("%w: range step is zero", ErrRender)
	}
	var out []any
	for i := start; (step > 0 && i < stop) || (step < 0 && i > stop); i += step {
		if len(out) >= r.limits.MaxRange {
			return nil, fmt.Errorf("%w: range longer than %d", ErrLimit, r.limits.MaxRange)
		}
		out = append(out, i)
	}
	if out == nil {
		out = []any{}
	}
	return out, nil
}

func fnStrftimeNow(r *renderer, args []any, _ map[string]any) (any, error) {
	if len(args) != 1 {
		return nil, fmt.Errorf("%w: strftime_now takes a format", ErrRender)
	}
	f, ok := args[0].(string)
	if !ok {
		return nil, fmt.Errorf("%w: strftime_now takes a string", ErrRender)
	}
	now := time.Now
	if r.t.Now != nil {
		now = r.t.Now
	}
	t := now()
	var b strings.Builder
	for i := 0; i < len(f); i++ {
		if f[i] != '%' || i+1 == len(f) {
			b.WriteByte(f[i])
			continue
		}
		i++
		switch f[i] {
		case 'd':
			fmt.Fprintf(&b, "%02d", t.Day())
		case 'm':
			fmt.Fprintf(&b, "%02d", int(t.Month()))
		case 'Y':
			fmt.Fprintf(&b, "%04d", t.Year())
		case 'y':
			fmt.Fprintf(&b, "%02d", t.Year()%100)
		case 'b':
			b.WriteString(t.Month().String()[:3])
		case 'B':
			b.WriteString(t.Month().String())
		case 'a':
			b.WriteString(t.Weekday().String()[:3])
		case 'A':
			b.WriteString(t.Weekday().String())
		case 'H':
			fmt.Fprintf(&b, "%02d", t.Hour())
		case 'M':
			fmt.Fprintf(&b, "%02d", t.Minute())
		case 'S':
			fmt.Fprintf(&b, "%02d", t.Second())
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(f[i])
		}
	}
	return b.String(), nil
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	// Python keeps keyword order; Go maps have none, so sort for
	// determinism.
	for i := 1; i < len(keys); i++ {
		for j := i; j > 0 && keys[j] < keys[j-1]; j-- {
			keys[j], keys[j-1] = keys[j-1], keys[j]
		}
	}
	return keys
}

func isSpace(r rune) bool { return unicode.IsSpace(r) }
