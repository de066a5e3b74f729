// Package quant knows GGML's tensor element types: their numbering, block
// layouts and sizes, and how to turn blocks of bytes into float32 values and
// back.
//
// It promises:
//
//   - Type ids, names, block sizes and block byte sizes for every type GGML
//     defines (including ones this project cannot compute with), so that a
//     file using an exotic type is refused with a clear "unsupported tensor
//     type IQ2_XXS" instead of a size mismatch.
//   - Dequantize for F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K,
//     Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS that produces the same
//     float32 bits as ggml's scalar dequantize_row_* functions
//     (ggml evaluates those with separate multiply and subtract roundings;
//     so does this package, explicitly, so results do not depend on whether
//     the Go compiler would fuse a multiply-add on the target).
//   - Quantize for the same types, with the bytes llama-quantize writes
//     without an importance matrix: ggml's quantize_row_*_ref, and
//     quantize_iq4_nl/_xs for the IQ4 types (compiled without FMA
//     contraction; see golden_ext_test.go).
//   - F16 and BF16 conversions that round to nearest even, handle
//     subnormals, infinities and NaN, and never panic.
//
// Functions never panic on bad input: lengths that do not fit the type are
// errors wrapping ErrBlockSize or ErrShortBuffer, unknown or unsupported
// types errors wrapping ErrUnknownType or ErrUnsupported.
package quant
