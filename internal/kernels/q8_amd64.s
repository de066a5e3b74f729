//go:build amd64 && !purego

#include "textflag.h"

// Q8_0 x Q8_0 products of one interleaved group of four weight rows with one
// quantised activation row (layout: see Matrix.q8q). Both kernels compute,
// per block, each row's exact integer dot product, then
// acc_r += float(sum_r) * (f16(d_w[r]) * d_x), multiply and add rounded
// separately and blocks taken in order: bit-identical to dotQ8x4Ref.

// Permutation tables.
// q8evens/q8odds gather the even / odd dwords of the 32-dword pair (A:B) so
// that row r's partial sums land in 128-bit lane r.
DATA q8evens<>+0(SB)/4, $0
DATA q8evens<>+4(SB)/4, $2
DATA q8evens<>+8(SB)/4, $4
DATA q8evens<>+12(SB)/4, $6
DATA q8evens<>+16(SB)/4, $8
DATA q8evens<>+20(SB)/4, $10
DATA q8evens<>+24(SB)/4, $12
DATA q8evens<>+28(SB)/4, $14
DATA q8evens<>+32(SB)/4, $16
DATA q8evens<>+36(SB)/4, $18
DATA q8evens<>+40(SB)/4, $20
DATA q8evens<>+44(SB)/4, $22
DATA q8evens<>+48(SB)/4, $24
DATA q8evens<>+52(SB)/4, $26
DATA q8evens<>+56(SB)/4, $28
DATA q8evens<>+60(SB)/4, $30
GLOBL q8evens<>(SB), RODATA|NOPTR, $64

DATA q8odds<>+0(SB)/4, $1
DATA q8odds<>+4(SB)/4, $3
DATA q8odds<>+8(SB)/4, $5
DATA q8odds<>+12(SB)/4, $7
DATA q8odds<>+16(SB)/4, $9
DATA q8odds<>+20(SB)/4, $11
DATA q8odds<>+24(SB)/4, $13
DATA q8odds<>+28(SB)/4, $15
DATA q8odds<>+32(SB)/4, $17
DATA q8odds<>+36(SB)/4, $19
DATA q8odds<>+40(SB)/4, $21
DATA q8odds<>+44(SB)/4, $23
DATA q8odds<>+48(SB)/4, $25
DATA q8odds<>+52(SB)/4, $27
DATA q8odds<>+56(SB)/4, $29
DATA q8odds<>+60(SB)/4, $31
GLOBL q8odds<>(SB), RODATA|NOPTR, $64

// q8spread copies float r (r < 4) into every element of 128-bit lane r.
DATA q8spread<>+0(SB)/4, $0
DATA q8spread<>+4(SB)/4, $0
DATA q8spread<>+8(SB)/4, $0
DATA q8spread<>+12(SB)/4, $0
DATA q8spread<>+16(SB)/4, $1
DATA q8spread<>+20(SB)/4, $1
DATA q8spread<>+24(SB)/4, $1
DATA q8spread<>+28(SB)/4, $1
DATA q8spread<>+32(SB)/4, $2
DATA q8spread<>+36(SB)/4, $2
DATA q8spread<>+40(SB)/4, $2
DATA q8spread<>+44(SB)/4, $2
DATA q8spread<>+48(SB)/4, $3
DATA q8spread<>+52(SB)/4, $3
DATA q8spread<>+56(SB)/4, $3
DATA q8spread<>+60(SB)/4, $3
GLOBL q8spread<>(SB), RODATA|NOPTR, $64

// q8gather takes element 0 of each 128-bit lane into elements 0-3.
DATA q8gather<>+0(SB)/4, $0
DATA q8gather<>+4(SB)/4, $4
DATA q8gather<>+8(SB)/4, $8
DATA q8gather<>+12(SB)/4, $12
DATA q8gather<>+16(SB)/4, $0
DATA q8gather<>+20(SB)/4, $0
DATA q8gather<>+24(SB)/4, $0
DATA q8gather<>+28(SB)/4, $0
DATA q8gather<>+32(SB)/4, $0
DATA q8gather<>+36(SB)/4, $0
DATA q8gather<>+40(SB)/4, $0
DATA q8gather<>+44(SB)/4, $0
DATA q8gather<>+48(SB)/4, $0
DATA q8gather<>+52(SB)/4, $0
DATA q8gather<>+56(SB)/4, $0
DATA q8gather<>+60(SB)/4, $0
GLOBL q8gather<>(SB), RODATA|NOPTR, $64

DATA q8bias<>+0(SB)/4, $0x80808080
GLOBL q8bias<>(SB), RODATA|NOPTR, $4

DATA q8ones16<>+0(SB)/4, $0x00010001
GLOBL q8ones16<>(SB), RODATA|NOPTR, $4

// func dotQ8x4VNNI(w *int8, ws *uint16, xq *int8, xd *float32, xc *int32, nb int, out *[4]float32)
//
// VPDPBUSD multiplies unsigned by signed bytes, so the weights are biased
// to unsigned on the fly (w XOR 0x80 = w+128) and the excess 128*sum(x) is
// cancelled by starting every dword accumulator at xc[b] = -16*sum(x): a
// row's 8 dwords then sum to exactly sum(w*x).
TEXT ·dotQ8x4VNNI(SB), NOSPLIT, $0-56
	MOVQ w+0(FP), SI
	MOVQ ws+8(FP), R8
	MOVQ xq+16(FP), DI
	MOVQ xd+24(FP), R9
	MOVQ xc+32(FP), R10
	MOVQ nb+40(FP), CX
	MOVQ out+48(FP), R11

	VPBROADCASTD q8bias<>(SB), Z31
	VMOVDQU32 q8evens<>(SB), Z30
	VMOVDQU32 q8odds<>(SB), Z29
	VMOVDQU32 q8spread<>(SB), Z28
	VXORPS Z0, Z0, Z0

	TESTQ CX, CX
	JZ    vnni_done

vnni_loop:
	VPBROADCASTD (R10), Z1
	VMOVDQA32 Z1, Z2
	VBROADCASTI64X4 (DI), Z3        // the activation block in both halves
	VPXORD (SI), Z31, Z4            // rows 0,1 as unsigned
	VPXORD 64(SI), Z31, Z5          // rows 2,3
	VPDPBUSD Z3, Z4, Z1
	VPDPBUSD Z3, Z5, Z2

	// Horizontal sums: pair up dwords so row r's four partials sit in lane
	// r, then fold each lane.
	VMOVDQA32 Z1, Z6
	VPERMT2D Z2, Z30, Z6
	VPERMT2D Z2, Z29, Z1
	VPADDD Z6, Z1, Z1
	VPSHUFD $0x4e, Z1, Z6
	VPADDD Z6, Z1, Z1
	VPSHUFD $0xb1, Z1, Z6
	VPADDD Z6, Z1, Z1
	VCVTDQ2PS Z1, Z1

	// Scales: d_r = f16(ws[r]) * d_x, spread to lane r.
	VCVTPH2PS (R8), X7
	VBROADCASTSS (R9), X8
	VMULPS X8, X7, X7
	VPERMPS Z7, Z28, Z7

	VMULPS Z7, Z1, Z1
	VADDPS Z1, Z0, Z0

	ADDQ $128, SI
	ADDQ $8, R8
	ADDQ $32, DI
	ADDQ $4, R9
	ADDQ $4, R10
	DECQ CX
	JNZ  vnni_loop

vnni_done:
	VMOVDQU32 q8gather<>(SB), Z27
	VPERMPS Z0, Z27, Z0
	VMOVUPS X0, (R11)
	VZEROUPPER
	RET

// func dotQ8x4AVX2(w *int8, ws *uint16, xq *int8, xd *float32, xc *int32, nb int, out *[4]float32)
//
// VPMADDUBSW also takes unsigned x signed bytes but saturates its 16-bit
// pair sums, so it gets |w| (128 for -128, still exact as unsigned) and x
// with w's sign: pair sums stay within ±2*128*127.
TEXT ·dotQ8x4AVX2(SB), NOSPLIT, $0-56
	MOVQ w+0(FP), SI
	MOVQ ws+8(FP), R8
	MOVQ xq+16(FP), DI
	MOVQ xd+24(FP), R9
	MOVQ nb+40(FP), CX
	MOVQ out+48(FP), R11

	VPBROADCASTD q8ones16<>(SB), Y15
	VXORPS X8, X8, X8

	TESTQ CX, CX
	JZ    avx2_done

avx2_loop:
	VMOVDQU (DI), Y0

	VMOVDQU (SI), Y1
	VPABSB Y1, Y2
	VPSIGNB Y1, Y0, Y3
	VPMADDUBSW Y3, Y2, Y4
	VPMADDWD Y15, Y4, Y4

	VMOVDQU 32(SI), Y1
	VPABSB Y1, Y2
	VPSIGNB Y1, Y0, Y3
	VPMADDUBSW Y3, Y2, Y5
	VPMADDWD Y15, Y5, Y5

	VMOVDQU 64(SI), Y1
	VPABSB Y1, Y2
	VPSIGNB Y1, Y0, Y3
	VPMADDUBSW Y3, Y2, Y6
	VPMADDWD Y15, Y6, Y6

	VMOVDQU 96(SI), Y1
	VPABSB Y1, Y2
	VPSIGNB Y1, Y0, Y3
	VPMADDUBSW Y3, Y2, Y7
	VPMADDWD Y15, Y7, Y7

	// [r0 r1 r2 r3] partial sums per 128-bit half, then add the halves.
	VPHADDD Y5, Y4, Y4
	VPHADDD Y7, Y6, Y6
	VPHADDD Y6, Y4, Y4
	VEXTRACTI128 $1, Y4, X5
	VPADDD X5, X4, X4
	VCVTDQ2PS X4, X4

	VCVTPH2PS (R8), X5
	VBROADCASTSS (R9), X6
	VMULPS X6, X5, X5
	VMULPS X5, X4, X4
	VADDPS X4, X8, X8

	ADDQ $128, SI
	ADDQ $8, R8
	ADDQ $32, DI
	ADDQ $4, R9
	DECQ CX
	JNZ  avx2_loop

avx2_done:
	VMOVUPS X8, (R11)
	VZEROUPPER
	RET
