// Package gguf reads and writes GGUF files, the model format of llama.cpp
// and ggml.
//
// Layout (all integers little-endian):
//
//	+---------+---------+--------------+----------+
//	| "GGUF"  | version | tensor count | KV count |   magic u32, version u32 (2 or 3),
//	+---------+---------+--------------+----------+   counts u64
//	| KV pairs: key string | value type u32 | value |
//	+-----------------------------------------------+
//	| tensor infos: name string | n_dims u32 |      |
//	|   dims u64[n_dims] | ggml type u32 | offset u64
//	+-----------------------------------------------+
//	| padding to general.alignment (default 32)     |
//	+-----------------------------------------------+
//	| tensor data; each offset is relative to the   |
//	| start of this section and aligned             |
//	+-----------------------------------------------+
//
// A string is a u64 byte length and that many bytes (no terminator). An
// array value is an element type u32, a u64 count, then the elements.
//
// The reader promises that outside bytes cannot make it panic, loop, or
// allocate more than a small multiple of the input's size: every count and
// length is checked against the declared maximums (MaxKeyLen,
// MaxStringLen, MaxArrayLen, MaxTensors, MaxKVs, MaxDims, MaxTensorNameLen)
// and against the bytes remaining before anything is allocated. A file it
// accepts has, for every tensor, a known ggml type, a row length that is a
// multiple of the type's block size, an element count that does not
// overflow, and an aligned data range inside the file that overlaps no other
// tensor's; names and keys are unique. Errors say what is wrong and where,
// and wrap one of ErrNotGGUF, ErrUnsupported, ErrTruncated, ErrCorrupt or
// ErrLimit.
//
// The writer produces files llama.cpp reads: KVs in insertion order, tensors
// in insertion order, each tensor's data padded to the alignment.
package gguf
