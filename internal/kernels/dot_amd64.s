//go:build amd64 && !purego

#include "textflag.h"

// Float vector kernels. Operands follow Go assembler order (sources first,
// destination last): VFMADD231PS m, a, acc computes acc += a*m.

// func dotF32AVX512(a, b *float32, n int) float32
TEXT ·dotF32AVX512(SB), NOSPLIT, $0-28
	MOVQ a+0(FP), SI
	MOVQ b+8(FP), DI
	MOVQ n+16(FP), CX
	VXORPS Z0, Z0, Z0
	VXORPS Z1, Z1, Z1
	VXORPS Z2, Z2, Z2
	VXORPS Z3, Z3, Z3

f32z_loop64:
	CMPQ CX, $64
	JL   f32z_loop16
	VMOVUPS (SI), Z4
	VMOVUPS 64(SI), Z5
	VMOVUPS 128(SI), Z6
	VMOVUPS 192(SI), Z7
	VFMADD231PS (DI), Z4, Z0
	VFMADD231PS 64(DI), Z5, Z1
	VFMADD231PS 128(DI), Z6, Z2
	VFMADD231PS 192(DI), Z7, Z3
	ADDQ $256, SI
	ADDQ $256, DI
	SUBQ $64, CX
	JMP  f32z_loop64

f32z_loop16:
	CMPQ CX, $16
	JL   f32z_tail
	VMOVUPS (SI), Z4
	VFMADD231PS (DI), Z4, Z0
	ADDQ $64, SI
	ADDQ $64, DI
	SUBQ $16, CX
	JMP  f32z_loop16

f32z_tail:
	// Masked loads read only the remaining elements (no access, hence no
	// fault, beyond the slices).
	TESTQ CX, CX
	JZ    f32z_reduce
	MOVQ  $1, AX
	SHLQ  CX, AX
	DECQ  AX
	KMOVW AX, K1
	VMOVUPS.Z (SI), K1, Z4
	VMOVUPS.Z (DI), K1, Z5
	VFMADD231PS Z5, Z4, Z1

f32z_reduce:
	VADDPS Z1, Z0, Z0
	VADDPS Z3, Z2, Z2
	VADDPS Z2, Z0, Z0
	VEXTRACTF64X4 $1, Z0, Y1
	VADDPS Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VPERMILPS $0x4e, X0, X1
	VADDPS X1, X0, X0
	VPERMILPS $0xb1, X0, X1
	VADDSS X1, X0, X0
	VZEROUPPER
	MOVSS X0, ret+24(FP)
	RET

// func dotF32AVX2(a, b *float32, n int) float32
TEXT ·dotF32AVX2(SB), NOSPLIT, $0-28
	MOVQ a+0(FP), SI
	MOVQ b+8(FP), DI
	MOVQ n+16(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3

f32y_loop32:
	CMPQ CX, $32
	JL   f32y_loop8
	VMOVUPS (SI), Y4
	VMOVUPS 32(SI), Y5
	VMOVUPS 64(SI), Y6
	VMOVUPS 96(SI), Y7
	VFMADD231PS (DI), Y4, Y0
	VFMADD231PS 32(DI), Y5, Y1
	VFMADD231PS 64(DI), Y6, Y2
	VFMADD231PS 96(DI), Y7, Y3
	ADDQ $128, SI
	ADDQ $128, DI
	SUBQ $32, CX
	JMP  f32y_loop32

f32y_loop8:
	CMPQ CX, $8
	JL   f32y_reduce
	VMOVUPS (SI), Y4
	VFMADD231PS (DI), Y4, Y0
	ADDQ $32, SI
	ADDQ $32, DI
	SUBQ $8, CX
	JMP  f32y_loop8

f32y_reduce:
	VADDPS Y1, Y0, Y0
	VADDPS Y3, Y2, Y2
	VADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VPERMILPS $0x4e, X0, X1
	VADDPS X1, X0, X0
	VPERMILPS $0xb1, X0, X1
	VADDSS X1, X0, X0

f32y_tail:
	TESTQ CX, CX
	JZ    f32y_done
	VMOVSS (SI), X4
	VFMADD231SS (DI), X4, X0
	ADDQ $4, SI
	ADDQ $4, DI
	DECQ CX
	JMP  f32y_tail

f32y_done:
	VZEROUPPER
	MOVSS X0, ret+24(FP)
	RET

// func dotF16AVX512(a *float32, b *uint16, n int) float32
// Converts 16 halves at a time with VCVTPH2PS; the tail is loaded with a
// masked 16-bit move so nothing past b[n-1] is read.
TEXT ·dotF16AVX512(SB), NOSPLIT, $0-28
	MOVQ a+0(FP), SI
	MOVQ b+8(FP), DI
	MOVQ n+16(FP), CX
	VXORPS Z0, Z0, Z0
	VXORPS Z1, Z1, Z1
	VXORPS Z2, Z2, Z2
	VXORPS Z3, Z3, Z3

f16z_loop64:
	CMPQ CX, $64
	JL   f16z_loop16
	VCVTPH2PS (DI), Z4
	VCVTPH2PS 32(DI), Z5
	VCVTPH2PS 64(DI), Z6
	VCVTPH2PS 96(DI), Z7
	VFMADD231PS (SI), Z4, Z0
	VFMADD231PS 64(SI), Z5, Z1
	VFMADD231PS 128(SI), Z6, Z2
	VFMADD231PS 192(SI), Z7, Z3
	ADDQ $256, SI
	ADDQ $128, DI
	SUBQ $64, CX
	JMP  f16z_loop64

f16z_loop16:
	CMPQ CX, $16
	JL   f16z_tail
	VCVTPH2PS (DI), Z4
	VFMADD231PS (SI), Z4, Z0
	ADDQ $64, SI
	ADDQ $32, DI
	SUBQ $16, CX
	JMP  f16z_loop16

f16z_tail:
	TESTQ CX, CX
	JZ    f16z_reduce
	MOVQ  $1, AX
	SHLQ  CX, AX
	DECQ  AX
	KMOVW AX, K1
	VMOVDQU16.Z (DI), K1, Y4
	VCVTPH2PS Y4, Z4
	VMOVUPS.Z (SI), K1, Z5
	VFMADD231PS Z5, Z4, Z1

f16z_reduce:
	VADDPS Z1, Z0, Z0
	VADDPS Z3, Z2, Z2
	VADDPS Z2, Z0, Z0
	VEXTRACTF64X4 $1, Z0, Y1
	VADDPS Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VPERMILPS $0x4e, X0, X1
	VADDPS X1, X0, X0
	VPERMILPS $0xb1, X0, X1
	VADDSS X1, X0, X0
	VZEROUPPER
	MOVSS X0, ret+24(FP)
	RET

// func dotF16AVX2(a *float32, b *uint16, n int) float32
TEXT ·dotF16AVX2(SB), NOSPLIT, $0-28
	MOVQ a+0(FP), SI
	MOVQ b+8(FP), DI
	MOVQ n+16(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3

f16y_loop32:
	CMPQ CX, $32
	JL   f16y_loop8
	VCVTPH2PS (DI), Y4
	VCVTPH2PS 16(DI), Y5
	VCVTPH2PS 32(DI), Y6
	VCVTPH2PS 48(DI), Y7
	VFMADD231PS (SI), Y4, Y0
	VFMADD231PS 32(SI), Y5, Y1
	VFMADD231PS 64(SI), Y6, Y2
	VFMADD231PS 96(SI), Y7, Y3
	ADDQ $128, SI
	ADDQ $64, DI
	SUBQ $32, CX
	JMP  f16y_loop32

f16y_loop8:
	CMPQ CX, $8
	JL   f16y_reduce
	VCVTPH2PS (DI), Y4
	VFMADD231PS (SI), Y4, Y0
	ADDQ $32, SI
	ADDQ $16, DI
	SUBQ $8, CX
	JMP  f16y_loop8

f16y_reduce:
	VADDPS Y1, Y0, Y0
	VADDPS Y3, Y2, Y2
	VADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VPERMILPS $0x4e, X0, X1
	VADDPS X1, X0, X0
	VPERMILPS $0xb1, X0, X1
	VADDSS X1, X0, X0

f16y_tail:
	TESTQ CX, CX
	JZ    f16y_done
	MOVWLZX (DI), AX
	VMOVD AX, X4
	VCVTPH2PS X4, X4
	VFMADD231SS (SI), X4, X0
	ADDQ $4, SI
	ADDQ $2, DI
	DECQ CX
	JMP  f16y_tail

f16y_done:
	VZEROUPPER
	MOVSS X0, ret+24(FP)
	RET

// func f16ToF32sAVX512(dst *float32, src *uint16, n int)
TEXT ·f16ToF32sAVX512(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

cvtz_loop:
	CMPQ CX, $16
	JL   cvtz_tail
	VCVTPH2PS (SI), Z0
	VMOVUPS Z0, (DI)
	ADDQ $32, SI
	ADDQ $64, DI
	SUBQ $16, CX
	JMP  cvtz_loop

cvtz_tail:
	TESTQ CX, CX
	JZ    cvtz_done
	MOVQ  $1, AX
	SHLQ  CX, AX
	DECQ  AX
	KMOVW AX, K1
	VMOVDQU16.Z (SI), K1, Y0
	VCVTPH2PS Y0, Z0
	VMOVUPS Z0, K1, (DI)

cvtz_done:
	VZEROUPPER
	RET

// func f16ToF32sAVX2(dst *float32, src *uint16, n int)
TEXT ·f16ToF32sAVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

cvty_loop:
	CMPQ CX, $8
	JL   cvty_tail
	VCVTPH2PS (SI), Y0
	VMOVUPS Y0, (DI)
	ADDQ $16, SI
	ADDQ $32, DI
	SUBQ $8, CX
	JMP  cvty_loop

cvty_tail:
	TESTQ CX, CX
	JZ    cvty_done
	MOVWLZX (SI), AX
	VMOVD AX, X0
	VCVTPH2PS X0, X0
	VMOVSS X0, (DI)
	ADDQ $2, SI
	ADDQ $4, DI
	DECQ CX
	JMP  cvty_tail

cvty_done:
	VZEROUPPER
	RET

// func f32ToF16sAVX2(dst *uint16, src *float32, n int)
// VCVTPS2PH rounding to nearest even: exactly f32ToF16, NaN payloads
// included.
TEXT ·f32ToF16sAVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

cvth_loop:
	CMPQ CX, $8
	JL   cvth_tail
	VMOVUPS (SI), Y0
	VCVTPS2PH $0, Y0, (DI)
	ADDQ $32, SI
	ADDQ $16, DI
	SUBQ $8, CX
	JMP  cvth_loop

cvth_tail:
	TESTQ CX, CX
	JZ    cvth_done
	VMOVSS (SI), X0
	VCVTPS2PH $0, X0, X0
	VMOVD X0, AX
	MOVW AX, (DI)
	ADDQ $4, SI
	ADDQ $2, DI
	DECQ CX
	JMP  cvth_tail

cvth_done:
	VZEROUPPER
	RET

// func axpyAVX512(dst *float32, a float32, x *float32, n int)
TEXT ·axpyAVX512(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	VBROADCASTSS a+8(FP), Z15
	MOVQ x+16(FP), SI
	MOVQ n+24(FP), CX

axpyz_loop:
	CMPQ CX, $16
	JL   axpyz_tail
	VMOVUPS (DI), Z0
	VFMADD231PS (SI), Z15, Z0
	VMOVUPS Z0, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	SUBQ $16, CX
	JMP  axpyz_loop

axpyz_tail:
	TESTQ CX, CX
	JZ    axpyz_done
	MOVQ  $1, AX
	SHLQ  CX, AX
	DECQ  AX
	KMOVW AX, K1
	VMOVUPS.Z (DI), K1, Z0
	VMOVUPS.Z (SI), K1, Z1
	VFMADD231PS Z1, Z15, Z0
	VMOVUPS Z0, K1, (DI)

axpyz_done:
	VZEROUPPER
	RET

// func axpyF16AVX512(dst *float32, a float32, x *uint16, n int)
TEXT ·axpyF16AVX512(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	VBROADCASTSS a+8(FP), Z15
	MOVQ x+16(FP), SI
	MOVQ n+24(FP), CX

axpyhz_loop:
	CMPQ CX, $16
	JL   axpyhz_tail
	VCVTPH2PS (SI), Z1
	VMOVUPS (DI), Z0
	VFMADD231PS Z1, Z15, Z0
	VMOVUPS Z0, (DI)
	ADDQ $32, SI
	ADDQ $64, DI
	SUBQ $16, CX
	JMP  axpyhz_loop

axpyhz_tail:
	TESTQ CX, CX
	JZ    axpyhz_done
	MOVQ  $1, AX
	SHLQ  CX, AX
	DECQ  AX
	KMOVW AX, K1
	VMOVDQU16.Z (SI), K1, Y1
	VCVTPH2PS Y1, Z1
	VMOVUPS.Z (DI), K1, Z0
	VFMADD231PS Z1, Z15, Z0
	VMOVUPS Z0, K1, (DI)

axpyhz_done:
	VZEROUPPER
	RET

// func f16ToF32RowsAVX2(dst *float32, ds int, src *uint16, ss int, rows, cols int, pf *uint16)
//
// rows rows of cols halves (cols a multiple of 8, rows > 0), src rows ss
// bytes apart, dst rows ds bytes apart. Attention reads a KV head's rows
// out of pages whose rows hold every KV head, a strided walk that DRAM
// serves slowly one short call per row; here the lines of the rows at pf
// (the next page's, same stride; or, if pf is nil, this block's rows four
// ahead) are prefetched while each row is converted.
TEXT ·f16ToF32RowsAVX2(SB), NOSPLIT, $0-56
	MOVQ dst+0(FP), DI
	MOVQ ds+8(FP), R8
	MOVQ src+16(FP), SI
	MOVQ ss+24(FP), R9
	MOVQ rows+32(FP), DX
	MOVQ cols+40(FP), R10
	MOVQ pf+48(FP), R11
	SHLQ $1, R10 // bytes per source row
	TESTQ R11, R11
	JNZ  cvtr_row
	LEAQ (SI)(R9*4), R11

cvtr_row:
	XORQ AX, AX

cvtr_pf:
	PREFETCHT0 (R11)(AX*1)
	ADDQ $64, AX
	CMPQ AX, R10
	JL   cvtr_pf
	XORQ AX, AX

cvtr_col:
	VCVTPH2PS (SI)(AX*1), Y0
	VMOVUPS Y0, (DI)(AX*2)
	ADDQ $16, AX
	CMPQ AX, R10
	JL   cvtr_col
	ADDQ R9, SI
	ADDQ R9, R11
	ADDQ R8, DI
	DECQ DX
	JNZ  cvtr_row
	VZEROUPPER
	RET
