// Package kernels holds the numeric inner loops of the forward pass: matrix
// products over GGML weight types, vector dot products, RMSNorm, softmax,
// SiLU gating, and a persistent worker pool to spread large operations over
// CPU cores.
//
// It promises:
//
//   - Every kernel has a plain-Go reference (files ref*.go) that is the test
//     oracle and the fallback. Building with the tag purego, or on an
//     architecture without assembly, uses only the references.
//   - On amd64 the fast paths are chosen at start-up from the CPU's features
//     (AVX-512F/BW/VNNI, AVX2+FMA+F16C) and produce results that are
//     bit-identical to the reference for quantised weights (the integer
//     block sums are exact and the float combination is done in the same
//     order) and within a few ulps of it for float weights (the order of the
//     float additions differs).
//   - Activations are treated as ggml's CPU backend treats them, so that
//     logits track llama.cpp: Q8_0 and Q4_0 weights meet activations
//     quantised to Q8_0 (per 32 values d = amax/127 kept as fp16, q =
//     round-half-even(x*127/amax)), K-quants meet activations quantised to
//     Q8_K (ggml's quantize_row_q8_K_ref), F16 weights meet activations
//     rounded to F16, BF16 weights activations rounded to BF16; F32 is
//     plain F32.
//   - A Matrix may repack its weights at load time (Q8_0 rows are
//     interleaved four at a time so a four-row product reads one sequential
//     stream); Row still returns each row exactly as GGML would dequantise
//     it.
//   - Kernels never write outside the destination range they are given.
//     Length mismatches are programming errors and panic with a message
//     naming the kernel; they cannot come from outside input, which is
//     validated where matrices are made (NewMatrix returns errors).
package kernels
