//go:build amd64 && !purego

#include "textflag.h"

// exp for float32 lanes, AVX-512: x is clamped to [-104, 89] (beyond,
// exp is 0 or +Inf in float32 anyway), split as x = n*ln2 + r with n =
// round(x*log2(e)) and r reduced in two FMA steps (Cody-Waite: ln2hi has
// 9 significant bits, so n*ln2hi is exact), exp(r) for |r| <= ln2/2 by its
// degree-7 Taylor polynomial (truncation below 1e-8 relative), and the
// result scaled by 2^n with VSCALEFPS, which rounds to 0 / +Inf at the
// ends. Error: about 1 ulp against the correctly rounded exp.
DATA expc<>+0(SB)/4, $-104.0
DATA expc<>+4(SB)/4, $89.0
DATA expc<>+8(SB)/4, $1.44269504088896341
DATA expc<>+12(SB)/4, $0x3f318000 // ln2hi = 0.693359375
DATA expc<>+16(SB)/4, $0xb95e8083 // ln2lo = ln2 - ln2hi
DATA expc<>+20(SB)/4, $1.0
DATA expc<>+24(SB)/4, $0.5
DATA expc<>+28(SB)/4, $0.166666666666666667
DATA expc<>+32(SB)/4, $0.0416666666666666667
DATA expc<>+36(SB)/4, $0.00833333333333333333
DATA expc<>+40(SB)/4, $0.00138888888888888889
DATA expc<>+44(SB)/4, $0.000198412698412698413
DATA expc<>+48(SB)/4, $0x80000000
GLOBL expc<>(SB), RODATA|NOPTR, $52

// EXP computes exp(Z0) into Z1 using Z2 as scratch; Z16-Z28 hold the
// constants (LOADEXPC). The clamps take Z0 as their second source so a NaN
// passes through (VMAXPS/VMINPS return the second source on NaN).
#define LOADEXPC \
	VBROADCASTSS expc<>+0(SB), Z16 \
	VBROADCASTSS expc<>+4(SB), Z17 \
	VBROADCASTSS expc<>+8(SB), Z18 \
	VBROADCASTSS expc<>+12(SB), Z19 \
	VBROADCASTSS expc<>+16(SB), Z20 \
	VBROADCASTSS expc<>+20(SB), Z21 \
	VBROADCASTSS expc<>+24(SB), Z22 \
	VBROADCASTSS expc<>+28(SB), Z23 \
	VBROADCASTSS expc<>+32(SB), Z24 \
	VBROADCASTSS expc<>+36(SB), Z25 \
	VBROADCASTSS expc<>+40(SB), Z26 \
	VBROADCASTSS expc<>+44(SB), Z27 \
	VBROADCASTSS expc<>+48(SB), Z28

#define EXP \
	VMAXPS Z0, Z16, Z0 \
	VMINPS Z0, Z17, Z0 \
	VMULPS Z18, Z0, Z2 \
	VRNDSCALEPS $8, Z2, Z2 \
	VFNMADD231PS Z19, Z2, Z0 \
	VFNMADD231PS Z20, Z2, Z0 \
	VMOVAPS Z27, Z1 \
	VFMADD213PS Z26, Z0, Z1 \
	VFMADD213PS Z25, Z0, Z1 \
	VFMADD213PS Z24, Z0, Z1 \
	VFMADD213PS Z23, Z0, Z1 \
	VFMADD213PS Z22, Z0, Z1 \
	VFMADD213PS Z21, Z0, Z1 \
	VFMADD213PS Z21, Z0, Z1 \
	VSCALEFPS Z2, Z1, Z1

// func expSubAVX512(dst, src *float32, n int, c float32)
//
// dst = exp(src - c), the subtraction rounded to float32 first.
TEXT ·expSubAVX512(SB), NOSPLIT, $0-28
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS c+24(FP), Z5
	LOADEXPC

exp_loop:
	CMPQ CX, $16
	JL   exp_tail
	VMOVUPS (SI), Z0
	VSUBPS Z5, Z0, Z0
	EXP
	VMOVUPS Z1, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	SUBQ $16, CX
	JMP  exp_loop

exp_tail:
	TESTQ CX, CX
	JZ    exp_done
	MOVQ  $1, AX
	SHLQ  CX, AX
	DECQ  AX
	KMOVW AX, K1
	VMOVUPS.Z (SI), K1, Z0
	VSUBPS Z5, Z0, Z0
	EXP
	VMOVUPS Z1, K1, (DI)

exp_done:
	VZEROUPPER
	RET

// func siluMulAVX512(dst, gate, up *float32, n int)
//
// dst = gate / (1 + exp(-gate)) * up, the division and the product each
// rounded once, as siluMulRef.
TEXT ·siluMulAVX512(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ gate+8(FP), SI
	MOVQ up+16(FP), DX
	MOVQ n+24(FP), CX
	LOADEXPC

silu_loop:
	CMPQ CX, $16
	JL   silu_tail
	VMOVUPS (SI), Z3
	VXORPS Z28, Z3, Z0
	EXP
	VADDPS Z21, Z1, Z1
	VDIVPS Z1, Z3, Z3
	VMULPS (DX), Z3, Z3
	VMOVUPS Z3, (DI)
	ADDQ $64, SI
	ADDQ $64, DX
	ADDQ $64, DI
	SUBQ $16, CX
	JMP  silu_loop

silu_tail:
	TESTQ CX, CX
	JZ    silu_done
	MOVQ  $1, AX
	SHLQ  CX, AX
	DECQ  AX
	KMOVW AX, K1
	VMOVUPS.Z (SI), K1, Z3
	VMOVUPS.Z (DX), K1, Z4
	VXORPS Z28, Z3, Z0
	EXP
	VADDPS Z21, Z1, Z1
	VDIVPS Z1, Z3, Z3
	VMULPS Z4, Z3, Z3
	VMOVUPS Z3, K1, (DI)

silu_done:
	VZEROUPPER
	RET
