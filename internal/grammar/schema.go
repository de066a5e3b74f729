package grammar

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Kind is what a Spec constrains the output to.
type Kind uint8

const (
	// JSONObject is response_format {"type":"json_object"}: any JSON object.
	JSONObject Kind = 1
	// JSONSchema is response_format {"type":"json_schema"}: a value the
	// schema accepts.
	JSONSchema Kind = 2
	// ToolCall is one call of one of several functions, written as
	// {"name": "NAME", "arguments": ARGS} with ARGS what that function's
	// parameters schema accepts. Its Schema is a JSON array of
	// {"name", "parameters", "strict"} objects (ToolCallSpec builds it).
	ToolCall Kind = 3
)

// MaxTools bounds the functions of a ToolCall spec.
const MaxTools = 128

// Tool is one function a ToolCall spec may call.
type Tool struct {
	Name       string
	Parameters []byte // a JSON Schema; empty means any object
	Strict     bool
}

// ToolCallSpec is the spec of a call of one of tools.
func ToolCallSpec(tools []Tool) Spec {
	var b bytes.Buffer
	b.WriteByte('[')
	for i, t := range tools {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"name":`)
		b.Write(quote(t.Name))
		if len(t.Parameters) > 0 {
			b.WriteString(`,"parameters":`)
			b.Write(t.Parameters)
		}
		if t.Strict {
			b.WriteString(`,"strict":true`)
		}
		b.WriteByte('}')
	}
	b.WriteByte(']')
	return Spec{Kind: ToolCall, Schema: b.Bytes()}
}

// ToolCallPrefix is what a ToolCall output writes before the arguments of
// a call of name: the rest is the arguments and a closing brace.
func ToolCallPrefix(name string) string {
	return `{"name": ` + string(quote(name)) + `, "arguments": `
}

// Bounds on what a schema may ask for. They keep compilation, the wire
// form (package transfer carries Spec.Schema) and the automaton small.
const (
	MaxSchemaBytes = 32 << 10 // a schema's JSON text
	MaxNodes       = 2048     // compiled nodes, after $ref inlining
	MaxDepth       = 32       // nesting of the output (and of a schema)
	MaxEnum        = 256      // values of one enum
	MaxLiteral     = 1024     // bytes of one enum value or property key as JSON
	MaxItemsBound  = 4096     // largest minItems or maxItems (the item count lives in a frame)
)

// Spec is a constraint as it travels: a kind and, for JSONSchema, the
// schema's JSON text (compact; Compile checks it again on every node that
// receives it). Strict is json_schema's strict flag.
type Spec struct {
	Kind   Kind
	Strict bool
	Schema []byte
}

// SchemaError is a schema this package will not enforce: Keyword names the
// JSON Schema keyword (or "type", "$ref" ...) and Path where it stands
// (a JSON pointer into the schema).
type SchemaError struct {
	Keyword string
	Path    string
	Msg     string
}

func (e *SchemaError) Error() string {
	return fmt.Sprintf("grammar: schema at %q: %s", cmpOr(e.Path, "/"), e.Msg)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// value is a parsed JSON value that keeps the order of object members,
// which encoding/json's maps lose (properties are written in schema order).
type value struct {
	kind byte // 'o' object, 'a' array, 's' string, 'n' number, 'b' bool, 'z' null
	obj  []member
	arr  []value
	str  string // string value, or the number's literal text
	b    bool
}

type member struct {
	key string
	val value
}

func (v *value) get(key string) (value, bool) {
	for _, m := range v.obj {
		if m.key == key {
			return m.val, true
		}
	}
	return value{}, false
}

// canonical is v as compact JSON with object members in their order, the
// text an enum or const value must be generated as.
func (v value) canonical(buf *bytes.Buffer) {
	switch v.kind {
	case 'o':
		buf.WriteByte('{')
		for i, m := range v.obj {
			if i > 0 {
				buf.WriteByte(',')
			}
			buf.Write(quote(m.key))
			buf.WriteByte(':')
			m.val.canonical(buf)
		}
		buf.WriteByte('}')
	case 'a':
		buf.WriteByte('[')
		for i, e := range v.arr {
			if i > 0 {
				buf.WriteByte(',')
			}
			e.canonical(buf)
		}
		buf.WriteByte(']')
	case 's':
		buf.Write(quote(v.str))
	case 'n':
		buf.WriteString(v.str)
	case 'b':
		if v.b {
			buf.WriteString("true")
		} else {
			buf.WriteString("false")
		}
	default:
		buf.WriteString("null")
	}
}

// quote is s as a JSON string, without HTML escaping: the one spelling a
// key or an enum string is generated with.
func quote(s string) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// parseValue reads one JSON document into an ordered value.
func parseValue(data []byte) (value, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := readValue(dec, 0)
	if err != nil {
		return value{}, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return value{}, errors.New("trailing data after the schema")
	}
	return v, nil
}

func readValue(dec *json.Decoder, depth int) (value, error) {
	if depth > 4*MaxDepth {
		return value{}, errors.New("the schema is nested too deeply")
	}
	t, err := dec.Token()
	if err != nil {
		return value{}, err
	}
	switch t := t.(type) {
	case json.Delim:
		switch t {
		case '{':
			v := value{kind: 'o'}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return value{}, err
				}
				k, _ := kt.(string)
				for _, m := range v.obj {
					if m.key == k {
						return value{}, fmt.Errorf("key %q appears twice in one object", k)
					}
				}
				e, err := readValue(dec, depth+1)
				if err != nil {
					return value{}, err
				}
				v.obj = append(v.obj, member{k, e})
			}
			_, err := dec.Token() // '}'
			return v, err
		case '[':
			v := value{kind: 'a'}
			for dec.More() {
				e, err := readValue(dec, depth+1)
				if err != nil {
					return value{}, err
				}
				v.arr = append(v.arr, e)
			}
			_, err := dec.Token() // ']'
			return v, err
		}
	case string:
		return value{kind: 's', str: t}, nil
	case json.Number:
		return value{kind: 'n', str: canonicalNumber(t)}, nil
	case bool:
		return value{kind: 'b', b: t}, nil
	case nil:
		return value{kind: 'z'}, nil
	}
	return value{}, fmt.Errorf("unexpected token %v", t)
}

// canonicalNumber spells a number the way encoding/json writes a float64
// (1.0 and 1e0 become 1), so that an enum's numbers are generated in one
// spelling that any parser reads back as the same value.
func canonicalNumber(n json.Number) string {
	f, err := n.Float64()
	if err != nil {
		return string(n)
	}
	b, err := json.Marshal(f)
	if err != nil {
		return string(n)
	}
	return string(b)
}

// Node kinds.
const (
	kObject   = iota + 1 // properties in order (or any keys when generic)
	kArray               // items
	kString              // any string
	kNumber              // any number
	kInteger             // any integer
	kLiterals            // one of a set of byte strings (enum, const, true/false/null)
	kAnyOf               // one of branches, decided by the first byte
	kAny                 // any JSON value (json_object's members)
	kCall                // a tool call: a literal prefix naming the function, its arguments, "}"
)

type node struct {
	kind     uint8
	props    []prop // kObject; nil with generic set means any keys
	generic  bool   // kObject: any keys, any values
	items    int    // kArray: item node
	minItems int    // kArray: bounds on the item count; maxItems -1: none
	maxItems int
	lits     []litNode
	branches []int     // kAnyOf
	first    [256]bool // bytes a value of this node may begin with
	reqAfter []bool    // kObject: reqAfter[i] reports a required property at index >= i
}

type prop struct {
	key      []byte // the JSON-quoted name, quotes included
	node     int
	required bool
}

// litNode is one node of a literal set's byte trie.
type litNode struct {
	next   map[byte]uint16
	end    bool
	branch int16 // kCall: the index in branches of the prefix ending here
}

// Grammar is a compiled Spec: an immutable automaton, safe for concurrent
// use.
type Grammar struct {
	spec  Spec
	nodes []node
	root  int
	// Shared nodes of json_object's generic values.
	anyNode, anyObj, anyArr, anyStr, anyNum, anyLit int
	closeBrace                                      int // the literal "}" after a call's arguments
}

// Spec returns the spec g was compiled from.
func (g *Grammar) Spec() Spec { return g.spec }

// Equal reports whether g and o were compiled from the same spec (and so
// are the same automaton); two nil grammars are equal. go-cmp uses it.
func (g *Grammar) Equal(o *Grammar) bool {
	if g == nil || o == nil {
		return g == o
	}
	a, b := g.spec, o.spec
	return a.Kind == b.Kind && a.Strict == b.Strict && bytes.Equal(a.Schema, b.Schema)
}

// allowed keywords besides the ones compile reads; annotations only.
var annotations = map[string]bool{
	"title": true, "description": true, "default": true, "examples": true, "$schema": true,
	"$id": true, "$comment": true, "deprecated": true, "readOnly": true, "writeOnly": true,
	"$defs": true, "definitions": true,
}

var handled = map[string]bool{
	"type": true, "properties": true, "required": true, "additionalProperties": true, "minItems": true, "maxItems": true,
	"items": true, "enum": true, "const": true, "anyOf": true, "oneOf": true, "$ref": true,
}

// Compile checks spec and builds its automaton. A schema outside the
// supported subset gives a *SchemaError; other errors (bad JSON, sizes)
// are plain.
func Compile(spec Spec) (*Grammar, error) {
	g := &Grammar{spec: spec}
	g.generics()
	switch spec.Kind {
	case JSONObject:
		if len(spec.Schema) != 0 {
			return nil, errors.New("grammar: json_object takes no schema")
		}
		g.root = g.anyObj
		return g, nil
	case JSONSchema, ToolCall:
	default:
		return nil, fmt.Errorf("grammar: unknown kind %d", spec.Kind)
	}
	if len(spec.Schema) > MaxSchemaBytes {
		return nil, fmt.Errorf("grammar: the schema is %d bytes; at most %d are accepted", len(spec.Schema), MaxSchemaBytes)
	}
	doc, err := parseValue(spec.Schema)
	if err != nil {
		return nil, fmt.Errorf("grammar: the schema is not valid JSON: %w", err)
	}
	c := &compiler{g: g, doc: doc, strict: spec.Strict, active: map[string]bool{}}
	if spec.Kind == ToolCall {
		root, err := c.toolCall(doc)
		if err != nil {
			return nil, err
		}
		g.root = root
		return g, nil
	}
	root, err := c.compile(doc, "", 0)
	if err != nil {
		return nil, err
	}
	g.root = root
	return g, nil
}

func (g *Grammar) add(n node) int {
	g.nodes = append(g.nodes, n)
	return len(g.nodes) - 1
}

// generics adds the nodes of an unconstrained JSON value.
func (g *Grammar) generics() {
	g.anyStr = g.add(node{kind: kString})
	g.anyNum = g.add(node{kind: kNumber})
	g.anyLit = g.add(literals([][]byte{[]byte("true"), []byte("false"), []byte("null")}))
	g.anyNode = g.add(node{kind: kAny})
	g.anyObj = g.add(node{kind: kObject, generic: true})
	g.anyArr = g.add(node{kind: kArray, items: g.anyNode, maxItems: -1})
	g.closeBrace = g.add(literals([][]byte{[]byte("}")}))
	for i := range g.nodes {
		g.nodes[i].first = g.firstOf(i)
	}
}

// literals builds a literal set's trie.
func literals(set [][]byte) node {
	n := node{kind: kLiterals, lits: []litNode{{}}}
	for _, s := range set {
		at := 0
		for _, b := range s {
			nx, ok := n.lits[at].next[b]
			if !ok {
				if n.lits[at].next == nil {
					n.lits[at].next = map[byte]uint16{}
				}
				n.lits = append(n.lits, litNode{})
				nx = uint16(len(n.lits) - 1)
				n.lits[at].next[b] = nx
			}
			at = int(nx)
		}
		n.lits[at].end = true
	}
	return n
}

// firstOf is the set of bytes a value of node i may begin with.
func (g *Grammar) firstOf(i int) [256]bool {
	var f [256]bool
	n := &g.nodes[i]
	switch n.kind {
	case kObject:
		f['{'] = true
	case kArray:
		f['['] = true
	case kString:
		f['"'] = true
	case kNumber, kInteger:
		f['-'] = true
		for b := '0'; b <= '9'; b++ {
			f[b] = true
		}
	case kLiterals:
		for b := range n.lits[0].next {
			f[b] = true
		}
	case kAnyOf:
		for _, br := range n.branches {
			for b, ok := range g.nodes[br].first {
				f[b] = f[b] || ok
			}
		}
	case kCall:
		f['{'] = true
	case kAny:
		for _, k := range []int{g.anyObj, g.anyArr, g.anyStr, g.anyNum, g.anyLit} {
			for b, ok := range g.firstOf(k) {
				f[b] = f[b] || ok
			}
		}
	}
	return f
}

type compiler struct {
	g      *Grammar
	doc    value
	strict bool
	active map[string]bool // $refs being inlined, to refuse cycles
}

func refuseAt(path, keyword, format string, args ...any) error {
	return &SchemaError{Keyword: keyword, Path: path, Msg: fmt.Sprintf(format, args...)}
}

func (c *compiler) compile(s value, path string, depth int) (int, error) {
	if depth > MaxDepth {
		return 0, refuseAt(path, "type", "the schema nests deeper than %d levels", MaxDepth)
	}
	if len(c.g.nodes) >= MaxNodes {
		return 0, refuseAt(path, "type", "the schema is too large (more than %d nodes)", MaxNodes)
	}
	switch s.kind {
	case 'b':
		if s.b {
			return c.g.anyNode, nil // true accepts anything
		}
		return 0, refuseAt(path, "false", "the schema false accepts nothing")
	case 'o':
	default:
		return 0, refuseAt(path, "type", "a schema must be an object or a boolean")
	}
	for _, m := range s.obj {
		if !handled[m.key] && !annotations[m.key] {
			return 0, refuseAt(path, m.key, "the keyword %q is not supported (supported: type, properties, required, additionalProperties, items, minItems, maxItems, enum, const, anyOf, oneOf, $ref)", m.key)
		}
	}
	if ref, ok := s.get("$ref"); ok {
		if len(s.obj) > 1 {
			for _, m := range s.obj {
				if m.key != "$ref" && handled[m.key] {
					return 0, refuseAt(path, m.key, "%q beside $ref is not supported", m.key)
				}
			}
		}
		return c.ref(ref, path, depth)
	}
	if v, ok := s.get("const"); ok {
		return c.literal([]value{v}, path, "const")
	}
	if v, ok := s.get("enum"); ok {
		if v.kind != 'a' || len(v.arr) == 0 {
			return 0, refuseAt(path, "enum", "enum must be a non-empty array")
		}
		if len(v.arr) > MaxEnum {
			return 0, refuseAt(path, "enum", "enum may hold at most %d values", MaxEnum)
		}
		return c.literal(v.arr, path, "enum")
	}
	for _, kw := range []string{"anyOf", "oneOf"} {
		if v, ok := s.get(kw); ok {
			if v.kind != 'a' || len(v.arr) == 0 {
				return 0, refuseAt(path, kw, "%s must be a non-empty array of schemas", kw)
			}
			var brs []int
			for i, b := range v.arr {
				n, err := c.compile(b, fmt.Sprintf("%s/%s/%d", path, kw, i), depth+1)
				if err != nil {
					return 0, err
				}
				brs = append(brs, n)
			}
			return c.anyOf(brs, path, kw)
		}
	}
	t, hasType := s.get("type")
	if !hasType {
		// Without a type, properties or items still say what it is.
		switch {
		case has(s, "properties"):
			t = value{kind: 's', str: "object"}
		case has(s, "items"):
			t = value{kind: 's', str: "array"}
		default:
			return c.g.anyNode, nil
		}
	}
	switch t.kind {
	case 's':
		return c.typed(s, t.str, path, depth)
	case 'a':
		if len(t.arr) == 0 {
			return 0, refuseAt(path, "type", "type must not be an empty list")
		}
		var brs []int
		for _, e := range t.arr {
			if e.kind != 's' {
				return 0, refuseAt(path, "type", "type must be a string or a list of strings")
			}
			n, err := c.typed(s, e.str, path, depth)
			if err != nil {
				return 0, err
			}
			brs = append(brs, n)
		}
		if len(brs) == 1 {
			return brs[0], nil
		}
		return c.anyOf(brs, path, "type")
	}
	return 0, refuseAt(path, "type", "type must be a string or a list of strings")
}

func has(s value, key string) bool { _, ok := s.get(key); return ok }

// toolCall compiles a ToolCall spec: each function's parameters (under
// its own strict flag; the root of each document, for $ref, is the
// parameters schema), and a trie of the prefixes that name them.
func (c *compiler) toolCall(doc value) (int, error) {
	if doc.kind != 'a' || len(doc.arr) == 0 || len(doc.arr) > MaxTools {
		return 0, refuseAt("", "tools", "a tool call needs 1 to %d functions", MaxTools)
	}
	var prefixes [][]byte
	var args []int
	seen := map[string]bool{}
	for i, t := range doc.arr {
		path := fmt.Sprintf("/%d", i)
		name, ok := t.get("name")
		if t.kind != 'o' || !ok || name.kind != 's' || name.str == "" || len(name.str) > 64 {
			return 0, refuseAt(path, "name", "each function needs a name of 1 to 64 bytes")
		}
		if seen[name.str] {
			return 0, refuseAt(path, "name", "the function name %q appears twice", name.str)
		}
		seen[name.str] = true
		for _, m := range t.obj {
			if m.key != "name" && m.key != "parameters" && m.key != "strict" {
				return 0, refuseAt(path, m.key, "unknown field %q in a function", m.key)
			}
		}
		strict, _ := t.get("strict")
		sub := &compiler{g: c.g, strict: strict.kind == 'b' && strict.b, active: map[string]bool{}}
		node := c.g.anyObj
		if p, ok := t.get("parameters"); ok {
			sub.doc = p
			var err error
			if node, err = sub.compile(p, path+"/parameters", 1); err != nil {
				return 0, err
			}
		}
		prefixes = append(prefixes, []byte(ToolCallPrefix(name.str)))
		args = append(args, node)
	}
	n := literals(prefixes)
	n.kind = kCall
	n.branches = args
	// Each prefix ends with ": " after a quoted name, so no prefix is
	// another's: every end is a leaf and names one function.
	for i, p := range prefixes {
		at := 0
		for _, b := range p {
			at = int(n.lits[at].next[b])
		}
		n.lits[at].branch = int16(i)
	}
	i := c.g.add(n)
	c.g.nodes[i].first = c.g.firstOf(i)
	return i, nil
}

// ref inlines a local reference to a definition.
func (c *compiler) ref(ref value, path string, depth int) (int, error) {
	if ref.kind != 's' {
		return 0, refuseAt(path, "$ref", "$ref must be a string")
	}
	var name, section string
	switch {
	case strings.HasPrefix(ref.str, "#/$defs/"):
		section, name = "$defs", strings.TrimPrefix(ref.str, "#/$defs/")
	case strings.HasPrefix(ref.str, "#/definitions/"):
		section, name = "definitions", strings.TrimPrefix(ref.str, "#/definitions/")
	case ref.str == "#":
		return 0, refuseAt(path, "$ref", "$ref %q makes the schema recursive, which is not supported", ref.str)
	default:
		return 0, refuseAt(path, "$ref", "$ref %q is not supported: only #/$defs/NAME and #/definitions/NAME", ref.str)
	}
	if strings.ContainsAny(name, "/~") {
		return 0, refuseAt(path, "$ref", "$ref %q is not supported: only #/$defs/NAME and #/definitions/NAME", ref.str)
	}
	defs, _ := c.doc.get(section)
	target, ok := defs.get(name)
	if !ok {
		return 0, refuseAt(path, "$ref", "$ref %q names no definition", ref.str)
	}
	if c.active[ref.str] {
		return 0, refuseAt(path, "$ref", "$ref %q makes the schema recursive, which is not supported", ref.str)
	}
	c.active[ref.str] = true
	defer delete(c.active, ref.str)
	return c.compile(target, "/"+section+"/"+name, depth+1)
}

func (c *compiler) literal(vals []value, path, kw string) (int, error) {
	var set [][]byte
	for _, v := range vals {
		var b bytes.Buffer
		v.canonical(&b)
		if b.Len() > MaxLiteral {
			return 0, refuseAt(path, kw, "a %s value is longer than %d bytes as JSON", kw, MaxLiteral)
		}
		set = append(set, b.Bytes())
	}
	n := literals(set)
	if len(n.lits) > 1<<15 {
		return 0, refuseAt(path, kw, "%s is too large", kw)
	}
	i := c.g.add(n)
	c.g.nodes[i].first = c.g.firstOf(i)
	return i, nil
}

// anyOf makes a choice between branches that the first byte decides.
func (c *compiler) anyOf(brs []int, path, kw string) (int, error) {
	var seen [256]bool
	for _, br := range brs {
		f := c.g.nodes[br].first
		for b, ok := range f {
			if ok && seen[b] {
				return 0, refuseAt(path, kw, "%s branches that can begin with the same character (%q) are not supported; only choices such as string or null, whose first character decides", kw, rune(b))
			}
		}
		for b, ok := range f {
			seen[b] = seen[b] || ok
		}
	}
	i := c.g.add(node{kind: kAnyOf, branches: brs})
	c.g.nodes[i].first = c.g.firstOf(i)
	return i, nil
}

// typed compiles s as one JSON type.
func (c *compiler) typed(s value, typ, path string, depth int) (int, error) {
	var n node
	switch typ {
	case "string":
		return c.g.anyStr, nil
	case "number":
		return c.g.anyNum, nil
	case "integer":
		n = node{kind: kInteger}
	case "boolean":
		n = literals([][]byte{[]byte("true"), []byte("false")})
	case "null":
		n = literals([][]byte{[]byte("null")})
	case "array":
		n = node{kind: kArray, items: c.g.anyNode, maxItems: -1}
		for _, kw := range []string{"minItems", "maxItems"} {
			v, ok := s.get(kw)
			if !ok {
				continue
			}
			k, err := strconv.Atoi(v.str)
			if v.kind != 'n' || err != nil || k < 0 || k > MaxItemsBound {
				return 0, refuseAt(path, kw, "%s must be an integer from 0 to %d", kw, MaxItemsBound)
			}
			if kw == "minItems" {
				n.minItems = k
			} else {
				n.maxItems = k
			}
		}
		if n.maxItems >= 0 && n.minItems > n.maxItems {
			return 0, refuseAt(path, "minItems", "minItems %d is above maxItems %d: no array fits", n.minItems, n.maxItems)
		}
		if it, ok := s.get("items"); ok {
			item, err := c.compile(it, path+"/items", depth+1)
			if err != nil {
				return 0, err
			}
			n.items = item
		}
	case "object":
		var err error
		if n, err = c.object(s, path, depth); err != nil {
			return 0, err
		}
	default:
		return 0, refuseAt(path, "type", "unknown type %q", typ)
	}
	i := c.g.add(n)
	c.g.nodes[i].first = c.g.firstOf(i)
	return i, nil
}

func (c *compiler) object(s value, path string, depth int) (node, error) {
	props, hasProps := s.get("properties")
	addl, hasAddl := s.get("additionalProperties")
	closed := hasAddl && addl.kind == 'b' && !addl.b
	if hasAddl && !closed && !(addl.kind == 'b' && addl.b && !hasProps) {
		return node{}, refuseAt(path, "additionalProperties", "additionalProperties must be false (or absent) where properties are given; a schema for additional properties is not supported")
	}
	if c.strict && !closed {
		return node{}, refuseAt(path, "additionalProperties", "strict mode needs additionalProperties: false on every object, as OpenAI's does")
	}
	if !hasProps {
		if closed {
			return node{kind: kObject}, nil // only {}
		}
		return node{kind: kObject, generic: true}, nil
	}
	if props.kind != 'o' {
		return node{}, refuseAt(path, "properties", "properties must be an object")
	}
	req := map[string]bool{}
	if r, ok := s.get("required"); ok {
		if r.kind != 'a' {
			return node{}, refuseAt(path, "required", "required must be an array of property names")
		}
		for _, e := range r.arr {
			if e.kind != 's' {
				return node{}, refuseAt(path, "required", "required must be an array of property names")
			}
			if _, ok := props.get(e.str); !ok {
				return node{}, refuseAt(path, "required", "required names %q, which is not in properties", e.str)
			}
			req[e.str] = true
		}
	}
	n := node{kind: kObject}
	for _, m := range props.obj {
		if c.strict && !req[m.key] {
			return node{}, refuseAt(path, "required", "strict mode needs every property in required, as OpenAI's does; %q is not", m.key)
		}
		key := quote(m.key)
		if len(key) > MaxLiteral {
			return node{}, refuseAt(path+"/properties", "properties", "a property name is longer than %d bytes", MaxLiteral)
		}
		child, err := c.compile(m.val, path+"/properties/"+escapePointer(m.key), depth+1)
		if err != nil {
			return node{}, err
		}
		n.props = append(n.props, prop{key: key, node: child, required: req[m.key]})
	}
	n.reqAfter = make([]bool, len(n.props)+1)
	for i := len(n.props) - 1; i >= 0; i-- {
		n.reqAfter[i] = n.reqAfter[i+1] || n.props[i].required
	}
	return n, nil
}

func escapePointer(s string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(s)
}
