//go:build amd64 && !purego

#include "textflag.h"

// func gemmF32Rows1(w *float32, ws int, x *float32, cols, kc, nrows int, dst *float32)
//
// dst[r] = w_r . x for nrows rows ws bytes apart, with exactly the
// arithmetic of the 4 x a tile kernels (gemm_amd64.s) for one output:
// per column chunk of kc (the last may be shorter), lane j sums the
// products of columns j mod 16 in order (masked loads for the tail), the
// 16 lanes are folded by the same tree (halves, quarters, then pairs
// within a quarter), and the chunk sums are added in order to a total that
// starts at +0. One row at a time keeps the weights a single sequential
// stream, which matters for DRAM-bound matrix-vector products; the
// single accumulator's latency is hidden by overlapping the next row.
TEXT ·gemmF32Rows1(SB), NOSPLIT, $0-56
	MOVQ w+0(FP), SI
	MOVQ ws+8(FP), R8
	MOVQ x+16(FP), R9
	MOVQ cols+24(FP), R10
	MOVQ kc+32(FP), R12
	MOVQ nrows+40(FP), BX
	MOVQ dst+48(FP), R11
	TESTQ BX, BX
	JZ   rows1_done

rows1_row:
	MOVQ SI, AX     // weights of this row
	MOVQ R9, DI     // activations
	MOVQ R10, DX    // columns left
	VXORPS X3, X3, X3 // the row's total

rows1_chunk:
	MOVQ R12, CX
	CMPQ DX, CX
	CMOVQLT DX, CX  // this chunk's length
	SUBQ CX, DX
	VPXORD Z0, Z0, Z0

rows1_loop:
	CMPQ CX, $16
	JL   rows1_tail
	VMOVUPS (DI), Z1
	VFMADD231PS (AX), Z1, Z0
	ADDQ $64, AX
	ADDQ $64, DI
	SUBQ $16, CX
	JMP  rows1_loop

rows1_tail:
	TESTQ CX, CX
	JZ   rows1_reduce
	MOVQ CX, R13
	MOVQ $1, R14
	SHLQ CX, R14
	DECQ R14
	KMOVW R14, K1
	VMOVUPS.Z (AX), K1, Z2
	VMOVUPS.Z (DI), K1, Z1
	VFMADD231PS Z2, Z1, Z0
	SHLQ $2, R13
	ADDQ R13, AX
	ADDQ R13, DI

rows1_reduce:
	VEXTRACTF64X4 $1, Z0, Y1
	VADDPS Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VPERMILPS $0x4e, X0, X1
	VADDPS X1, X0, X0
	VPERMILPS $0xb1, X0, X1
	VADDPS X1, X0, X0
	VADDSS X3, X0, X3
	TESTQ DX, DX
	JNZ  rows1_chunk

	VMOVSS X3, (R11)
	ADDQ R8, SI
	ADDQ $4, R11
	DECQ BX
	JNZ  rows1_row

rows1_done:
	VZEROUPPER
	RET
