package quant

import (
	"errors"
	"fmt"
	"strconv"
)

// Type is a GGML tensor element type, numbered as in ggml.h's enum
// ggml_type (the ids are stored in GGUF files, so they never change).
type Type uint32

// GGML type ids. Gaps (4, 5, 31-33, 36-38) are types GGML removed; they are
// not Known.
const (
	F32     Type = 0
	F16     Type = 1
	Q4_0    Type = 2
	Q4_1    Type = 3
	Q5_0    Type = 6
	Q5_1    Type = 7
	Q8_0    Type = 8
	Q8_1    Type = 9
	Q2_K    Type = 10
	Q3_K    Type = 11
	Q4_K    Type = 12
	Q5_K    Type = 13
	Q6_K    Type = 14
	Q8_K    Type = 15
	IQ2_XXS Type = 16
	IQ2_XS  Type = 17
	IQ3_XXS Type = 18
	IQ1_S   Type = 19
	IQ4_NL  Type = 20
	IQ3_S   Type = 21
	IQ2_S   Type = 22
	IQ4_XS  Type = 23
	I8      Type = 24
	I16     Type = 25
	I32     Type = 26
	I64     Type = 27
	F64     Type = 28
	IQ1_M   Type = 29
	BF16    Type = 30
	TQ1_0   Type = 34
	TQ2_0   Type = 35
	MXFP4   Type = 39
	NVFP4   Type = 40
	Q1_0    Type = 41
	Q2_0    Type = 42
)

// QK_K is the super-block size of the K-quants.
const QK_K = 256

// Sentinel errors. Errors returned by this package wrap one of them.
var (
	ErrUnknownType = errors.New("quant: unknown tensor type")
	ErrUnsupported = errors.New("quant: unsupported tensor type")
	ErrBlockSize   = errors.New("quant: length is not a multiple of the block size")
	ErrShortBuffer = errors.New("quant: buffer too short")
)

type traits struct {
	name       string
	blockSize  int
	blockBytes int
}

// table mirrors ggml's type_traits (name, blck_size, type_size). Names are
// the upper-case spellings used by llama.cpp's tooling ("Q4_K", "BF16").
var table = map[Type]traits{
	F32:     {"F32", 1, 4},
	F16:     {"F16", 1, 2},
	Q4_0:    {"Q4_0", 32, 18},
	Q4_1:    {"Q4_1", 32, 20},
	Q5_0:    {"Q5_0", 32, 22},
	Q5_1:    {"Q5_1", 32, 24},
	Q8_0:    {"Q8_0", 32, 34},
	Q8_1:    {"Q8_1", 32, 36},
	Q2_K:    {"Q2_K", QK_K, 84},
	Q3_K:    {"Q3_K", QK_K, 110},
	Q4_K:    {"Q4_K", QK_K, 144},
	Q5_K:    {"Q5_K", QK_K, 176},
	Q6_K:    {"Q6_K", QK_K, 210},
	Q8_K:    {"Q8_K", QK_K, 292},
	IQ2_XXS: {"IQ2_XXS", QK_K, 66},
	IQ2_XS:  {"IQ2_XS", QK_K, 74},
	IQ3_XXS: {"IQ3_XXS", QK_K, 98},
	IQ1_S:   {"IQ1_S", QK_K, 50},
	IQ4_NL:  {"IQ4_NL", 32, 18},
	IQ3_S:   {"IQ3_S", QK_K, 110},
	IQ2_S:   {"IQ2_S", QK_K, 82},
	IQ4_XS:  {"IQ4_XS", QK_K, 136},
	I8:      {"I8", 1, 1},
	I16:     {"I16", 1, 2},
	I32:     {"I32", 1, 4},
	I64:     {"I64", 1, 8},
	F64:     {"F64", 1, 8},
	IQ1_M:   {"IQ1_M", QK_K, 56},
	BF16:    {"BF16", 1, 2},
	TQ1_0:   {"TQ1_0", QK_K, 54},
	TQ2_0:   {"TQ2_0", QK_K, 66},
	MXFP4:   {"MXFP4", 32, 17},
	NVFP4:   {"NVFP4", 64, 36},
	Q1_0:    {"Q1_0", 128, 18},
	Q2_0:    {"Q2_0", 64, 18},
}

// String returns GGML's name for t ("F32", "Q4_K"), or "type(N)" for an id
// GGML does not define.
func (t Type) String() string {
	if tr, ok := table[t]; ok {
		return tr.name
	}
	return "type(" + strconv.FormatUint(uint64(t), 10) + ")"
}

// ParseType returns the type whose name is s (as String spells it, case
// sensitive), for command-line flags such as `convert --type Q8_0`.
func ParseType(s string) (Type, error) {
	for t, tr := range table {
		if tr.name == s {
			return t, nil
		}
	}
	return 0, fmt.Errorf("%w %q", ErrUnknownType, s)
}

// Known reports whether t is a type id GGML defines, so its block size and
// byte size are known even if this package cannot compute with it.
func (t Type) Known() bool {
	_, ok := table[t]
	return ok
}

// Supported reports whether Dequantize handles t.
func (t Type) Supported() bool {
	switch t {
	case F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K,
		Q4_1, Q5_0, Q5_1, Q5_K, Q3_K, Q2_K, IQ4_NL, IQ4_XS:
		return true
	}
	return false
}

// BlockSize returns the number of elements per block (1 for plain float and
// integer types), or 0 for an unknown type.
func (t Type) BlockSize() int { return table[t].blockSize }

// BlockBytes returns the number of bytes per block, or 0 for an unknown type.
func (t Type) BlockBytes() int { return table[t].blockBytes }

// RowBytes returns the number of bytes n elements of type t occupy. It fails
// if t is unknown, n is negative or not a multiple of the block size, or the
// result would overflow an int.
func RowBytes(t Type, n int) (int, error) {
	tr, ok := table[t]
	if !ok {
		return 0, fmt.Errorf("%w %s", ErrUnknownType, t)
	}
	if n < 0 || n%tr.blockSize != 0 {
		return 0, fmt.Errorf("%w: %d elements of %s (block size %d)", ErrBlockSize, n, t, tr.blockSize)
	}
	blocks := n / tr.blockSize
	if blocks > maxInt/tr.blockBytes {
		return 0, fmt.Errorf("%w: %d elements of %s overflow", ErrBlockSize, n, t)
	}
	return blocks * tr.blockBytes, nil
}

const maxInt = int(^uint(0) >> 1)

// checkType returns an error unless t is Supported.
func checkType(t Type) error {
	if !t.Known() {
		return fmt.Errorf("%w %s", ErrUnknownType, t)
	}
	if !t.Supported() {
		return fmt.Errorf("%w %s", ErrUnsupported, t)
	}
	return nil
}
