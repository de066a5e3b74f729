package gguf

import (
	"fmt"
	"math"
	"strconv"
)

// ValueType is a GGUF metadata value type, numbered as in gguf.h.
type ValueType uint32

// GGUF metadata value types.
const (
	TypeUint8   ValueType = 0
	TypeInt8    ValueType = 1
	TypeUint16  ValueType = 2
	TypeInt16   ValueType = 3
	TypeUint32  ValueType = 4
	TypeInt32   ValueType = 5
	TypeFloat32 ValueType = 6
	TypeBool    ValueType = 7
	TypeString  ValueType = 8
	TypeArray   ValueType = 9
	TypeUint64  ValueType = 10
	TypeInt64   ValueType = 11
	TypeFloat64 ValueType = 12
)

var valueTypeNames = [...]string{"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool", "string", "array", "uint64", "int64", "float64"}

// String returns gguf.h's name for t ("uint32", "array").
func (t ValueType) String() string {
	if int(t) < len(valueTypeNames) {
		return valueTypeNames[t]
	}
	return "type(" + strconv.FormatUint(uint64(t), 10) + ")"
}

// size returns the encoded size of one scalar of type t, or 0 for strings,
// arrays and unknown types.
func (t ValueType) size() int {
	switch t {
	case TypeUint8, TypeInt8, TypeBool:
		return 1
	case TypeUint16, TypeInt16:
		return 2
	case TypeUint32, TypeInt32, TypeFloat32:
		return 4
	case TypeUint64, TypeInt64, TypeFloat64:
		return 8
	}
	return 0
}

// Value is one GGUF metadata value: a scalar or an array of scalars.
// The zero Value is invalid (Valid reports false).
//
// The Go representation (Any) is uint8, int8, uint16, int16, uint32, int32,
// float32, bool, string, uint64, int64 or float64 for scalars, and a slice
// of one of those for arrays. Slices returned by the accessors are shared
// with the Value: do not modify them.
type Value struct {
	typ  ValueType
	elem ValueType // element type when typ == TypeArray
	v    any
}

// Type returns the value's type (TypeArray for arrays).
func (v Value) Type() ValueType { return v.typ }

// ElemType returns the element type of an array (meaningless otherwise).
func (v Value) ElemType() ValueType { return v.elem }

// Valid reports whether v holds a value.
func (v Value) Valid() bool { return v.v != nil }

// Any returns the Go value held (see Value).
func (v Value) Any() any { return v.v }

// Len returns the number of elements of an array, or -1 for a scalar.
func (v Value) Len() int {
	if v.typ != TypeArray {
		return -1
	}
	switch a := v.v.(type) {
	case []uint8:
		return len(a)
	case []int8:
		return len(a)
	case []uint16:
		return len(a)
	case []int16:
		return len(a)
	case []uint32:
		return len(a)
	case []int32:
		return len(a)
	case []float32:
		return len(a)
	case []bool:
		return len(a)
	case []string:
		return len(a)
	case []uint64:
		return len(a)
	case []int64:
		return len(a)
	case []float64:
		return len(a)
	}
	return 0
}

// Str returns a string value.
func (v Value) Str() (string, bool) {
	s, ok := v.v.(string)
	return s, ok
}

// Bool returns a bool value.
func (v Value) Bool() (bool, bool) {
	b, ok := v.v.(bool)
	return b, ok
}

// Uint returns an integer value of any integer type if it is non-negative.
func (v Value) Uint() (uint64, bool) {
	switch x := v.v.(type) {
	case uint8:
		return uint64(x), true
	case uint16:
		return uint64(x), true
	case uint32:
		return uint64(x), true
	case uint64:
		return x, true
	}
	if i, ok := v.signed(); ok && i >= 0 {
		return uint64(i), true
	}
	return 0, false
}

func (v Value) signed() (int64, bool) {
	switch x := v.v.(type) {
	case int8:
		return int64(x), true
	case int16:
		return int64(x), true
	case int32:
		return int64(x), true
	case int64:
		return x, true
	}
	return 0, false
}

// Int returns an integer value of any integer type if it fits in an int64.
func (v Value) Int() (int64, bool) {
	if i, ok := v.signed(); ok {
		return i, true
	}
	if u, ok := v.Uint(); ok && u <= math.MaxInt64 {
		return int64(u), true
	}
	return 0, false
}

// Float returns a float32 or float64 value as a float64.
func (v Value) Float() (float64, bool) {
	switch x := v.v.(type) {
	case float32:
		return float64(x), true
	case float64:
		return x, true
	}
	return 0, false
}

// Strings returns an array of strings.
func (v Value) Strings() ([]string, bool) {
	s, ok := v.v.([]string)
	return s, ok
}

// Float32s returns an array of float32 (shared), or of float64 converted.
func (v Value) Float32s() ([]float32, bool) {
	switch a := v.v.(type) {
	case []float32:
		return a, true
	case []float64:
		out := make([]float32, len(a))
		for i, x := range a {
			out[i] = float32(x)
		}
		return out, true
	}
	return nil, false
}

// Int32s returns an array of int32 (shared), or an array of another integer
// type converted when every element fits in an int32.
func (v Value) Int32s() ([]int32, bool) {
	if a, ok := v.v.([]int32); ok {
		return a, true
	}
	return convertInts[int32](v, math.MinInt32, math.MaxInt32)
}

// Uint32s returns an array of uint32 (shared), or an array of another
// integer type converted when every element fits in a uint32.
func (v Value) Uint32s() ([]uint32, bool) {
	if a, ok := v.v.([]uint32); ok {
		return a, true
	}
	return convertInts[uint32](v, 0, math.MaxUint32)
}

func convertInts[T int32 | uint32](v Value, lo, hi int64) ([]T, bool) {
	var out []T
	add := func(x int64) bool {
		if x < lo || x > hi {
			return false
		}
		out = append(out, T(x))
		return true
	}
	ok := true
	switch a := v.v.(type) {
	case []uint8:
		for _, x := range a {
			ok = ok && add(int64(x))
		}
	case []int8:
		for _, x := range a {
			ok = ok && add(int64(x))
		}
	case []uint16:
		for _, x := range a {
			ok = ok && add(int64(x))
		}
	case []int16:
		for _, x := range a {
			ok = ok && add(int64(x))
		}
	case []uint32:
		for _, x := range a {
			ok = ok && add(int64(x))
		}
	case []int32:
		for _, x := range a {
			ok = ok && add(int64(x))
		}
	case []uint64:
		for _, x := range a {
			ok = ok && x <= math.MaxInt64 && add(int64(x))
		}
	case []int64:
		for _, x := range a {
			ok = ok && add(x)
		}
	default:
		return nil, false
	}
	if !ok {
		return nil, false
	}
	if out == nil {
		out = []T{}
	}
	return out, true
}

// String formats v for humans: scalars as Go would print them (strings
// quoted and cut at 80 bytes), arrays as their type and length.
func (v Value) String() string {
	switch {
	case !v.Valid():
		return "<invalid>"
	case v.typ == TypeArray:
		return fmt.Sprintf("[%d x %s]", v.Len(), v.elem)
	case v.typ == TypeString:
		s := v.v.(string)
		if len(s) > 80 {
			return strconv.Quote(s[:80]) + "..."
		}
		return strconv.Quote(s)
	}
	return fmt.Sprint(v.v)
}

// NewValue converts a Go value to a Value. It accepts the types listed
// under Value (scalars and slices of them) and Value itself. Plain int and
// uint are refused: GGUF readers expect a specific width (llama.cpp reads
// most counts as uint32), so the caller must choose one.
func NewValue(x any) (Value, error) {
	switch x := x.(type) {
	case Value:
		if !x.Valid() {
			return Value{}, fmt.Errorf("gguf: invalid Value")
		}
		return x, nil
	case uint8:
		return Value{typ: TypeUint8, v: x}, nil
	case int8:
		return Value{typ: TypeInt8, v: x}, nil
	case uint16:
		return Value{typ: TypeUint16, v: x}, nil
	case int16:
		return Value{typ: TypeInt16, v: x}, nil
	case uint32:
		return Value{typ: TypeUint32, v: x}, nil
	case int32:
		return Value{typ: TypeInt32, v: x}, nil
	case float32:
		return Value{typ: TypeFloat32, v: x}, nil
	case bool:
		return Value{typ: TypeBool, v: x}, nil
	case string:
		return Value{typ: TypeString, v: x}, nil
	case uint64:
		return Value{typ: TypeUint64, v: x}, nil
	case int64:
		return Value{typ: TypeInt64, v: x}, nil
	case float64:
		return Value{typ: TypeFloat64, v: x}, nil
	case []uint8:
		return array(TypeUint8, x), nil
	case []int8:
		return array(TypeInt8, x), nil
	case []uint16:
		return array(TypeUint16, x), nil
	case []int16:
		return array(TypeInt16, x), nil
	case []uint32:
		return array(TypeUint32, x), nil
	case []int32:
		return array(TypeInt32, x), nil
	case []float32:
		return array(TypeFloat32, x), nil
	case []bool:
		return array(TypeBool, x), nil
	case []string:
		return array(TypeString, x), nil
	case []uint64:
		return array(TypeUint64, x), nil
	case []int64:
		return array(TypeInt64, x), nil
	case []float64:
		return array(TypeFloat64, x), nil
	}
	if x == nil {
		return Value{}, fmt.Errorf("gguf: nil value")
	}
	return Value{}, fmt.Errorf("gguf: cannot store a %T in GGUF metadata (use a sized type such as uint32, or a slice of one)", x)
}

func array[T any](elem ValueType, s []T) Value {
	if s == nil {
		s = []T{}
	}
	return Value{typ: TypeArray, elem: elem, v: s}
}

// describe is used in error messages: "array of 5 strings".
func describe(v Value) string {
	if v.typ == TypeArray {
		return "array of " + v.elem.String()
	}
	return v.typ.String()
}
