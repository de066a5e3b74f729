//go:build amd64 && !purego

#include "textflag.h"

// func gemmF32Rows1(w *float32, ws int, x *float32, cols, kc, nrows int, dst *float32)
//
// dst[r] = w_r . x for nrows (even) rows ws bytes apart, with exactly the
// arithmetic of the 4 x a tile kernels (gemm_amd64.s) for one output:
// per column chunk of kc (the last may be shorter), lane j sums the
// products of columns j mod 16 in order (masked loads for the tail), the
// 16 lanes are folded by the same tree (halves, quarters, then pairs
// within a quarter), and the chunk sums are added in order to a total that
// starts at +0.
//
// The rows are read as two long sequential streams, the first half of
// them and the second, one row of each at a time (one FMA chain each):
// from DRAM two streams kept about 35 GB/s on one core where one stream
// kept 25-30, and 65-80 on two cores where one stream each kept 47-60
// (the hardware prefetchers follow each stream; one stream alone leaves
// memory-level parallelism unused). Four interleaved neighbouring rows
// were slower still: their streams restart every row.
TEXT ·gemmF32Rows1(SB), NOSPLIT, $0-56
	MOVQ w+0(FP), SI
	MOVQ ws+8(FP), R8
	MOVQ nrows+40(FP), BX
	MOVQ dst+48(FP), R11
	SHRQ $1, BX             // row pairs
	TESTQ BX, BX
	JZ   rows1_done
	MOVQ BX, R15
	IMULQ R8, R15
	ADDQ SI, R15            // the second stream's rows
	LEAQ (R11)(BX*4), R9    // and their outputs

rows1_row:
	MOVQ SI, AX             // weights of this row
	MOVQ R15, R14           // weights of the other stream's row
	MOVQ x+16(FP), DI       // activations
	MOVQ cols+24(FP), DX    // columns left
	VXORPS X3, X3, X3       // the rows' totals
	VXORPS X4, X4, X4

rows1_chunk:
	MOVQ kc+32(FP), CX
	CMPQ DX, CX
	CMOVQLT DX, CX          // this chunk's length
	SUBQ CX, DX
	VPXORD Z0, Z0, Z0
	VPXORD Z2, Z2, Z2

rows1_loop:
	CMPQ CX, $16
	JL   rows1_tail
	VMOVUPS (DI), Z1
	VFMADD231PS (AX), Z1, Z0
	VFMADD231PS (R14), Z1, Z2
	ADDQ $64, AX
	ADDQ $64, R14
	ADDQ $64, DI
	SUBQ $16, CX
	JMP  rows1_loop

rows1_tail:
	TESTQ CX, CX
	JZ   rows1_reduce
	MOVQ $1, R10
	SHLQ CX, R10
	DECQ R10
	KMOVW R10, K1
	VMOVUPS.Z (DI), K1, Z1
	VMOVUPS.Z (AX), K1, Z5
	VFMADD231PS Z5, Z1, Z0
	VMOVUPS.Z (R14), K1, Z5
	VFMADD231PS Z5, Z1, Z2
	LEAQ (AX)(CX*4), AX
	LEAQ (R14)(CX*4), R14
	LEAQ (DI)(CX*4), DI

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
	VEXTRACTF64X4 $1, Z2, Y1
	VADDPS Y1, Y2, Y2
	VEXTRACTF128 $1, Y2, X1
	VADDPS X1, X2, X2
	VPERMILPS $0x4e, X2, X1
	VADDPS X1, X2, X2
	VPERMILPS $0xb1, X2, X1
	VADDPS X1, X2, X2
	VADDSS X4, X2, X4
	TESTQ DX, DX
	JNZ  rows1_chunk

	VMOVSS X3, (R11)
	VMOVSS X4, (R9)
	ADDQ R8, SI
	ADDQ R8, R15
	ADDQ $4, R11
	ADDQ $4, R9
	DECQ BX
	JNZ  rows1_row

rows1_done:
	VZEROUPPER
	RET
