package chattmpl

import (
	"fmt"
	"strconv"
)

// maxDepth bounds nesting of blocks and expressions while parsing.
const maxDepth = 200

type node interface{}

type (
	textNode   struct{ s string }
	outputNode struct{ e expr }
	ifNode     struct {
		conds  []expr
		bodies [][]node
		els    []node
	}
	forNode struct {
		vars      []string
		iter      expr
		cond      expr
		body, els []node
	}
	setNode struct {
		name, attr string
		e          expr
	}
	breakNode    struct{}
	continueNode struct{}
	// macroNode defines a macro: a function of its parameters (with
	// default values where given) that renders its body and returns the
	// text.
	macroNode struct {
		name     string
		params   []string
		defaults []expr // nil where a parameter has no default
		body     []node
	}
)

type expr interface{}

type (
	literal  struct{ v any }
	nameExpr struct{ name string }
	attrExpr struct {
		x    expr
		name string
	}
	indexExpr struct{ x, i expr }
	sliceExpr struct{ x, lo, hi, step expr }
	kwArg     struct {
		name string
		e    expr
	}
	callExpr struct {
		fn   expr
		args []expr
		kw   []kwArg
	}
	filterExpr struct {
		x    expr
		name string
		args []expr
		kw   []kwArg
	}
	testExpr struct {
		x    expr
		name string
		args []expr
		neg  bool
	}
	binExpr struct {
		op   string
		l, r expr
	}
	unaryExpr struct {
		op string
		x  expr
	}
	condExpr struct{ cond, a, b expr }
	listExpr struct{ items []expr }
	dictExpr struct{ keys, vals []expr }
)

type parser struct {
	items []item
	p     int
	depth int
}

func (p *parser) peek() item { return p.items[p.p] }
func (p *parser) next() item {
	it := p.items[p.p]
	if it.kind != itemEOF {
		p.p++
	}
	return it
}

func (p *parser) isOp(op string) bool {
	it := p.peek()
	return it.kind == itemOp && it.val == op
}

func (p *parser) isName(n string) bool {
	it := p.peek()
	return it.kind == itemName && it.val == n
}

func (p *parser) expectOp(op string) error {
	if !p.isOp(op) {
		return syntaxErr(p.peek().pos, "expected %q", op)
	}
	p.next()
	return nil
}

func (p *parser) expectEnd() error {
	if p.peek().kind != itemEnd {
		return syntaxErr(p.peek().pos, "expected end of tag")
	}
	p.next()
	return nil
}

func (p *parser) enter() error {
	p.depth++
	if p.depth > maxDepth {
		return fmt.Errorf("%w at byte %d: nesting deeper than %d", ErrLimit, p.peek().pos, maxDepth)
	}
	return nil
}

// parseBody parses nodes until one of the block tags in ends (returned) or
// the end of the template (returned as "").
func (p *parser) parseBody(ends ...string) ([]node, string, error) {
	if err := p.enter(); err != nil {
		return nil, "", err
	}
	defer func() { p.depth-- }()
	var body []node
	for {
		it := p.next()
		switch it.kind {
		case itemEOF:
			if len(ends) > 0 {
				return nil, "", syntaxErr(it.pos, "missing {%% %s %%}", ends[len(ends)-1])
			}
			return body, "", nil
		case itemText:
			body = append(body, &textNode{it.val})
		case itemVarStart:
			e, err := p.parseExpr()
			if err != nil {
				return nil, "", err
			}
			if err := p.expectEnd(); err != nil {
				return nil, "", err
			}
			body = append(body, &outputNode{e})
		case itemBlockStart:
			tag := p.next()
			if tag.kind != itemName {
				return nil, "", syntaxErr(tag.pos, "expected a tag name")
			}
			for _, e := range ends {
				if tag.val == e {
					return body, e, nil
				}
			}
			n, err := p.parseStmt(tag)
			if err != nil {
				return nil, "", err
			}
			if n != nil {
				body = append(body, n)
			}
		default:
			return nil, "", syntaxErr(it.pos, "unexpected token")
		}
	}
}

func (p *parser) parseStmt(tag item) (node, error) {
	switch tag.val {
	case "if":
		n := &ifNode{}
		cond, err := p.parseExpr()
		if err != nil {
			return nil, err
		}
		for {
			if err := p.expectEnd(); err != nil {
				return nil, err
			}
			body, end, err := p.parseBody("elif", "else", "endif")
			if err != nil {
				return nil, err
			}
			n.conds, n.bodies = append(n.conds, cond), append(n.bodies, body)
			switch end {
			case "endif":
				return n, p.expectEnd()
			case "else":
				if err := p.expectEnd(); err != nil {
					return nil, err
				}
				els, _, err := p.parseBody("endif")
				if err != nil {
					return nil, err
				}
				n.els = els
				return n, p.expectEnd()
			}
			if cond, err = p.parseExpr(); err != nil {
				return nil, err
			}
		}
	case "for":
		n := &forNode{}
		for {
			v := p.next()
			if v.kind != itemName {
				return nil, syntaxErr(v.pos, "expected a loop variable")
			}
			n.vars = append(n.vars, v.val)
			if !p.isOp(",") {
				break
			}
			p.next()
		}
		if !p.isName("in") {
			return nil, syntaxErr(p.peek().pos, "expected 'in'")
		}
		p.next()
		var err error
		if n.iter, err = p.parseOr(); err != nil {
			return nil, err
		}
		if p.isName("if") {
			p.next()
			if n.cond, err = p.parseOr(); err != nil {
				return nil, err
			}
		}
		if err := p.expectEnd(); err != nil {
			return nil, err
		}
		body, end, err := p.parseBody("else", "endfor")
		if err != nil {
			return nil, err
		}
		n.body = body
		if end == "else" {
			if err := p.expectEnd(); err != nil {
				return nil, err
			}
			if n.els, _, err = p.parseBody("endfor"); err != nil {
				return nil, err
			}
		}
		return n, p.expectEnd()
	case "set":
		name := p.next()
		if name.kind != itemName {
			return nil, syntaxErr(name.pos, "expected a variable name")
		}
		n := &setNode{name: name.val}
		if p.isOp(".") {
			p.next()
			attr := p.next()
			if attr.kind != itemName {
				return nil, syntaxErr(attr.pos, "expected an attribute name")
			}
			n.attr = attr.val
		}
		if !p.isOp("=") {
			return nil, fmt.Errorf("%w at byte %d: block {%% set %%}", ErrUnsupported, p.peek().pos)
		}
		p.next()
		var err error
		if n.e, err = p.parseExpr(); err != nil {
			return nil, err
		}
		return n, p.expectEnd()
	case "break", "continue":
		if err := p.expectEnd(); err != nil {
			return nil, err
		}
		if tag.val == "break" {
			return &breakNode{}, nil
		}
		return &continueNode{}, nil
	case "macro":
		name := p.next()
		if name.kind != itemName {
			return nil, syntaxErr(name.pos, "expected a macro name")
		}
		n := &macroNode{name: name.val}
		if !p.isOp("(") {
			return nil, syntaxErr(p.peek().pos, "expected '(' after the macro name")
		}
		p.next()
		for !p.isOp(")") {
			v := p.next()
			if v.kind != itemName {
				return nil, syntaxErr(v.pos, "expected a parameter name")
			}
			var def expr
			if p.isOp("=") {
				p.next()
				var err error
				if def, err = p.parseOr(); err != nil {
					return nil, err
				}
			}
			n.params, n.defaults = append(n.params, v.val), append(n.defaults, def)
			if p.isOp(",") {
				p.next()
			} else if !p.isOp(")") {
				return nil, syntaxErr(p.peek().pos, "expected ',' or ')'")
			}
		}
		p.next() // ')'
		if err := p.expectEnd(); err != nil {
			return nil, err
		}
		body, _, err := p.parseBody("endmacro")
		if err != nil {
			return nil, err
		}
		n.body = body
		return n, p.expectEnd()
	case "generation", "endgeneration":
		// Hugging Face's assistant-mask marker: no output of its own.
		return nil, p.expectEnd()
	}
	return nil, fmt.Errorf("%w at byte %d: tag %q", ErrUnsupported, tag.pos, tag.val)
}

// Expressions, in Jinja2's precedence order.

func (p *parser) parseExpr() (expr, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer func() { p.depth-- }()
	a, err := p.parseOr()
	if err != nil {
		return nil, err
	}
	if p.isName("if") {
		p.next()
		cond, err := p.parseOr()
		if err != nil {
			return nil, err
		}
		var b expr
		if p.isName("else") {
			p.next()
			if b, err = p.parseExpr(); err != nil {
				return nil, err
			}
		}
		return &condExpr{cond: cond, a: a, b: b}, nil
	}
	return a, nil
}

func (p *parser) parseOr() (expr, error) {
	l, err := p.parseAnd()
	for err == nil && p.isName("or") {
		p.next()
		var r expr
		if r, err = p.parseAnd(); err == nil {
			l = &binExpr{"or", l, r}
		}
	}
	return l, err
}

func (p *parser) parseAnd() (expr, error) {
	l, err := p.parseNot()
	for err == nil && p.isName("and") {
		p.next()
		var r expr
		if r, err = p.parseNot(); err == nil {
			l = &binExpr{"and", l, r}
		}
	}
	return l, err
}

func (p *parser) parseNot() (expr, error) {
	if p.isName("not") {
		p.next()
		if err := p.enter(); err != nil {
			return nil, err
		}
		defer func() { p.depth-- }()
		x, err := p.parseNot()
		return &unaryExpr{"not", x}, err
	}
	return p.parseCompare()
}

func (p *parser) parseCompare() (expr, error) {
	l, err := p.parseMath1()
	for err == nil {
		it := p.peek()
		var op string
		switch {
		case it.kind == itemOp && (it.val == "==" || it.val == "!=" || it.val == "<" || it.val == "<=" || it.val == ">" || it.val == ">="):
			op = it.val
			p.next()
		case p.isName("in"):
			op = "in"
			p.next()
		case p.isName("not") && p.items[p.p+1].kind == itemName && p.items[p.p+1].val == "in":
			op = "not in"
			p.next()
			p.next()
		default:
			return l, nil
		}
		var r expr
		if r, err = p.parseMath1(); err == nil {
			l = &binExpr{op, l, r}
		}
	}
	return l, err
}

func (p *parser) parseMath1() (expr, error) {
	l, err := p.parseConcat()
	for err == nil && (p.isOp("+") || p.isOp("-")) {
		op := p.next().val
		var r expr
		if r, err = p.parseConcat(); err == nil {
			l = &binExpr{op, l, r}
		}
	}
	return l, err
}

func (p *parser) parseConcat() (expr, error) {
	l, err := p.parseMath2()
	for err == nil && p.isOp("~") {
		p.next()
		var r expr
		if r, err = p.parseMath2(); err == nil {
			l = &binExpr{"~", l, r}
		}
	}
	return l, err
}

func (p *parser) parseMath2() (expr, error) {
	l, err := p.parsePow()
	for err == nil && (p.isOp("*") || p.isOp("/") || p.isOp("//") || p.isOp("%")) {
		op := p.next().val
		var r expr
		if r, err = p.parsePow(); err == nil {
			l = &binExpr{op, l, r}
		}
	}
	return l, err
}

func (p *parser) parsePow() (expr, error) {
	l, err := p.parseUnary(true)
	for err == nil && p.isOp("**") {
		p.next()
		var r expr
		if r, err = p.parseUnary(true); err == nil {
			l = &binExpr{"**", l, r}
		}
	}
	return l, err
}

func (p *parser) parseUnary(withFilter bool) (expr, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer func() { p.depth-- }()
	var x expr
	var err error
	switch {
	case p.isOp("-"):
		p.next()
		x, err = p.parseUnary(false)
		x = &unaryExpr{"-", x}
	case p.isOp("+"):
		p.next()
		x, err = p.parseUnary(false)
	default:
		x, err = p.parsePrimary()
		if err == nil {
			x, err = p.parsePostfix(x)
		}
	}
	if err == nil && withFilter {
		x, err = p.parseFilters(x)
	}
	return x, err
}

func (p *parser) parsePrimary() (expr, error) {
	it := p.next()
	switch it.kind {
	case itemName:
		switch it.val {
		case "true", "True":
			return &literal{true}, nil
		case "false", "False":
			return &literal{false}, nil
		case "none", "None":
			return &literal{nil}, nil
		}
		return &nameExpr{it.val}, nil
	case itemString:
		s := it.val
		for p.peek().kind == itemString { // adjacent literals concatenate
			s += p.next().val
		}
		return &literal{s}, nil
	case itemInt:
		v, err := strconv.ParseInt(it.val, 10, 64)
		if err != nil {
			return nil, syntaxErr(it.pos, "bad integer")
		}
		return &literal{int(v)}, nil
	case itemFloat:
		v, err := strconv.ParseFloat(it.val, 64)
		if err != nil {
			return nil, syntaxErr(it.pos, "bad number")
		}
		return &literal{v}, nil
	case itemOp:
		switch it.val {
		case "(":
			if p.isOp(")") {
				p.next()
				return &listExpr{}, nil
			}
			x, err := p.parseExpr()
			if err != nil {
				return nil, err
			}
			if p.isOp(",") { // a tuple: treated as a list
				items := []expr{x}
				for p.isOp(",") {
					p.next()
					if p.isOp(")") {
						break
					}
					y, err := p.parseExpr()
					if err != nil {
						return nil, err
					}
					items = append(items, y)
				}
				x = &listExpr{items}
			}
			return x, p.expectOp(")")
		case "[":
			l := &listExpr{}
			for !p.isOp("]") {
				x, err := p.parseExpr()
				if err != nil {
					return nil, err
				}
				l.items = append(l.items, x)
				if !p.isOp(",") {
					break
				}
				p.next()
			}
			return l, p.expectOp("]")
		case "{":
			d := &dictExpr{}
			for !p.isOp("}") {
				k, err := p.parseExpr()
				if err != nil {
					return nil, err
				}
				if err := p.expectOp(":"); err != nil {
					return nil, err
				}
				v, err := p.parseExpr()
				if err != nil {
					return nil, err
				}
				d.keys, d.vals = append(d.keys, k), append(d.vals, v)
				if !p.isOp(",") {
					break
				}
				p.next()
			}
			return d, p.expectOp("}")
		}
	}
	return nil, syntaxErr(it.pos, "unexpected %q", it.val)
}

func (p *parser) parsePostfix(x expr) (expr, error) {
	for {
		switch {
		case p.isOp("."):
			p.next()
			n := p.next()
			if n.kind != itemName && n.kind != itemInt {
				return nil, syntaxErr(n.pos, "expected an attribute name")
			}
			x = &attrExpr{x, n.val}
		case p.isOp("["):
			p.next()
			var parts [3]expr
			slice := false
			for k := 0; k < 3; k++ {
				if !p.isOp(":") && !p.isOp("]") {
					e, err := p.parseExpr()
					if err != nil {
						return nil, err
					}
					parts[k] = e
				}
				if !p.isOp(":") {
					break
				}
				slice = true
				p.next()
			}
			if err := p.expectOp("]"); err != nil {
				return nil, err
			}
			if slice {
				x = &sliceExpr{x, parts[0], parts[1], parts[2]}
			} else {
				x = &indexExpr{x, parts[0]}
			}
		case p.isOp("("):
			args, kw, err := p.parseArgs()
			if err != nil {
				return nil, err
			}
			x = &callExpr{x, args, kw}
		default:
			return x, nil
		}
	}
}

func (p *parser) parseArgs() ([]expr, []kwArg, error) {
	if err := p.expectOp("("); err != nil {
		return nil, nil, err
	}
	var args []expr
	var kw []kwArg
	for !p.isOp(")") {
		if p.peek().kind == itemName && p.items[p.p+1].kind == itemOp && p.items[p.p+1].val == "=" {
			name := p.next().val
			p.next()
			e, err := p.parseExpr()
			if err != nil {
				return nil, nil, err
			}
			kw = append(kw, kwArg{name, e})
		} else {
			e, err := p.parseExpr()
			if err != nil {
				return nil, nil, err
			}
			args = append(args, e)
		}
		if !p.isOp(",") {
			break
		}
		p.next()
	}
	return args, kw, p.expectOp(")")
}

func (p *parser) parseFilters(x expr) (expr, error) {
	for {
		switch {
		case p.isOp("|"):
			p.next()
			n := p.next()
			if n.kind != itemName {
				return nil, syntaxErr(n.pos, "expected a filter name")
			}
			f := &filterExpr{x: x, name: n.val}
			if p.isOp("(") {
				var err error
				if f.args, f.kw, err = p.parseArgs(); err != nil {
					return nil, err
				}
			}
			x = f
		case p.isName("is"):
			p.next()
			t := &testExpr{x: x}
			if p.isName("not") {
				p.next()
				t.neg = true
			}
			n := p.next()
			if n.kind != itemName {
				return nil, syntaxErr(n.pos, "expected a test name")
			}
			t.name = n.val
			if p.isOp("(") {
				var err error
				if t.args, _, err = p.parseArgs(); err != nil {
					return nil, err
				}
			} else if it := p.peek(); it.kind == itemString || it.kind == itemInt || it.kind == itemFloat ||
				it.kind == itemName && it.val != "and" && it.val != "or" && it.val != "else" && it.val != "if" && it.val != "is" && it.val != "in" && it.val != "not" {
				// "x is sameas false", "x is divisibleby 3"
				a, err := p.parsePrimary()
				if err != nil {
					return nil, err
				}
				t.args = []expr{a}
			}
			x = t
		default:
			return x, nil
		}
	}
}
