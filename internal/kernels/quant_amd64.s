//go:build amd64 && !purego

#include "textflag.h"

DATA qabsmask<>+0(SB)/4, $0x7fffffff
GLOBL qabsmask<>(SB), RODATA|NOPTR, $4
DATA q127<>+0(SB)/4, $127.0
GLOBL q127<>(SB), RODATA|NOPTR, $4

// func quantQ8_0AVX512(x *float32, nb int, q *int8, step int, d *float32, c *int32, corr int32)
//
// quantizeQ8_0Packed for one activation row, nb blocks of 32: per block
// amax = max |x|, d = f16(amax/127) (VCVTPS2PH rounds to nearest even, as
// f32ToF16), q = round-half-even(x * (127/amax)) (VCVTPS2DQ under the
// default MXCSR), c = corr * sum(q). The block's eight 4-byte quant
// groups go step bytes apart; d and c advance by step bytes per block
// (step = 4 * group width), the quants by 8*step. A block of zeros gets
// d = 0, q = 0, c = 0 without dividing.
TEXT ·quantQ8_0AVX512(SB), NOSPLIT, $0-52
	MOVQ x+0(FP), SI
	MOVQ nb+8(FP), CX
	MOVQ q+16(FP), DI
	MOVQ step+24(FP), R12
	MOVQ d+32(FP), R8
	MOVQ c+40(FP), R9
	MOVL corr+48(FP), R10
	LEAQ (R12)(R12*2), R13
	VPBROADCASTD qabsmask<>(SB), Z31
	VMOVSS q127<>(SB), X30
	TESTQ CX, CX
	JZ   qz_done

qz_loop:
	VMOVUPS (SI), Z0
	VMOVUPS 64(SI), Z1
	VANDPS Z31, Z0, Z2
	VANDPS Z31, Z1, Z3
	VMAXPS Z3, Z2, Z2
	VEXTRACTF64X4 $1, Z2, Y3
	VMAXPS Y3, Y2, Y2
	VEXTRACTF128 $1, Y2, X3
	VMAXPS X3, X2, X2
	VPERMILPS $0x4e, X2, X3
	VMAXPS X3, X2, X2
	VPERMILPS $0xb1, X2, X3
	VMAXSS X3, X2, X2
	VXORPS X4, X4, X4
	VUCOMISS X4, X2
	JEQ  qz_zero

	VDIVSS X30, X2, X4 // amax/127
	VCVTPS2PH $0, X4, X4
	VCVTPH2PS X4, X4
	VMOVSS X4, (R8)
	VDIVSS X2, X30, X5 // id = 127/amax
	VBROADCASTSS X5, Z5
	VMULPS Z5, Z0, Z0
	VMULPS Z5, Z1, Z1
	VCVTPS2DQ Z0, Z0
	VCVTPS2DQ Z1, Z1

	VPADDD Z1, Z0, Z6
	VEXTRACTI64X4 $1, Z6, Y7
	VPADDD Y7, Y6, Y6
	VEXTRACTI128 $1, Y6, X7
	VPADDD X7, X6, X6
	VPSHUFD $0x4e, X6, X7
	VPADDD X7, X6, X6
	VPSHUFD $0xb1, X6, X7
	VPADDD X7, X6, X6
	VMOVD X6, AX
	IMULL R10, AX
	MOVL AX, (R9)

	VPMOVDB Z0, X0
	VPMOVDB Z1, X1
	LEAQ (DI)(R12*4), DX
	VMOVD X0, (DI)
	VPEXTRD $1, X0, (DI)(R12*1)
	VPEXTRD $2, X0, (DI)(R12*2)
	VPEXTRD $3, X0, (DI)(R13*1)
	VMOVD X1, (DX)
	VPEXTRD $1, X1, (DX)(R12*1)
	VPEXTRD $2, X1, (DX)(R12*2)
	VPEXTRD $3, X1, (DX)(R13*1)
	JMP  qz_next

qz_zero:
	MOVL $0, (R8)
	MOVL $0, (R9)
	LEAQ (DI)(R12*4), DX
	MOVL $0, (DI)
	MOVL $0, (DI)(R12*1)
	MOVL $0, (DI)(R12*2)
	MOVL $0, (DI)(R13*1)
	MOVL $0, (DX)
	MOVL $0, (DX)(R12*1)
	MOVL $0, (DX)(R12*2)
	MOVL $0, (DX)(R13*1)

qz_next:
	ADDQ $128, SI
	LEAQ (DI)(R12*8), DI
	ADDQ R12, R8
	ADDQ R12, R9
	DECQ CX
	JNZ  qz_loop

qz_done:
	VZEROUPPER
	RET
