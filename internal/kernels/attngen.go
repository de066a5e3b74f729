//go:build ignore

// attngen writes attn_amd64.s and attn_stubs_amd64.go: the register-blocked
// micro-kernels of AttnGemm (attn.go), one unrolled body per tile shape (R
// rows of a held in registers, C vectors of columns of b). Run it with `go
// generate` in this directory; a test checks the committed files are its
// output.
//
// Every kernel computes, for i < R and j < C*lanes,
//
//	dst[i*ds + j] = alpha * (a[i*as+0]*b[0*bs+j] + ... + a[i*as+k-1]*b[(k-1)*bs+j])
//
// with one FMA chain per output in k order (so each output's sum is the
// same on both tiers and the same as a scalar FMA loop). With acc != 0 the
// chains start from dst's values instead of zero (alpha is then 1), so a
// sum over k split across calls is the same chain as one call over all k. Per step of k it
// loads C vectors of row k of b, broadcasts a[i*as+k] once per row and
// issues R*C independent FMAs: b is read as whole vectors, a as scalars, and
// no horizontal sum is ever needed. Strides are in bytes.
package main

import (
	"bytes"
	"fmt"
	"os"
)

var out bytes.Buffer

func p(format string, args ...any) { fmt.Fprintf(&out, format+"\n", args...) }

// Tile shapes. AVX-512 has 32 zmm registers: up to 24 accumulators, 4 b
// vectors, the broadcast and alpha. AVX2 has 16 ymm: 12 accumulators, 2 b
// vectors, the broadcast and alpha.
type isa struct {
	name   string // suffix of the function names
	reg    string // register prefix
	vbytes int    // bytes per vector
	maxR   int
	maxC   int
	breg   int    // first b-vector register
	bcast  int    // broadcast register
	alpha  int    // alpha register
	zero   string // zeroing instruction (VXORPS on zmm needs AVX512DQ)
}

var isas = []isa{
	{"AVX512", "Z", 64, 6, 4, 24, 30, 31, "VPXORD"},
	{"AVX2", "Y", 32, 6, 2, 12, 14, 15, "VXORPS"},
}

// rowAddr addresses element k of row i of a: rows 0-2 from SI, rows 3-5
// from DX = SI + 3*as (the scaled index reaches 2*as at most).
func rowAddr(i int) string {
	base := "SI"
	if i >= 3 {
		base, i = "DX", i-3
	}
	switch i {
	case 0:
		return "(" + base + ")"
	case 1:
		return "(" + base + ")(R8*1)"
	default:
		return "(" + base + ")(R8*2)"
	}
}

func kernel(s isa, r, c int) {
	name := fmt.Sprintf("attnGemm%sr%dc%d", s.name, r, c)
	acc := func(i, j int) string { return fmt.Sprintf("%s%d", s.reg, i*c+j) }
	bv := func(j int) string { return fmt.Sprintf("%s%d", s.reg, s.breg+j) }
	bc := fmt.Sprintf("%s%d", s.reg, s.bcast)
	al := fmt.Sprintf("%s%d", s.reg, s.alpha)
	p("// func %s(dst *float32, ds int, a *float32, as int, b *float32, bs int, k int, acc int, alpha float32)", name)
	p("//")
	p("// %d rows x %d columns: accumulator (i, j) is %s.", r, c*s.vbytes/4, acc(0, 0)+"+i*"+fmt.Sprint(c)+"+j")
	p("TEXT ·%s(SB), NOSPLIT, $0-68", name)
	p("\tMOVQ dst+0(FP), DI")
	p("\tMOVQ ds+8(FP), R10")
	p("\tMOVQ a+16(FP), SI")
	p("\tMOVQ as+24(FP), R8")
	p("\tMOVQ b+32(FP), BX")
	p("\tMOVQ bs+40(FP), R9")
	p("\tMOVQ k+48(FP), CX")
	p("\tLEAQ (SI)(R8*2), DX")
	p("\tADDQ R8, DX")
	p("\tMOVQ acc+56(FP), AX")
	p("\tTESTQ AX, AX")
	p("\tJNZ %s_load", name)
	for i := 0; i < r; i++ {
		for j := 0; j < c; j++ {
			p("\t%s %s, %s, %s", s.zero, acc(i, j), acc(i, j), acc(i, j))
		}
	}
	p("\tJMP %s_start", name)
	p("%s_load:", name)
	p("\tMOVQ DI, R11")
	for i := 0; i < r; i++ {
		for j := 0; j < c; j++ {
			p("\tVMOVUPS %d(R11), %s", j*s.vbytes, acc(i, j))
		}
		if i < r-1 {
			p("\tADDQ R10, R11")
		}
	}
	p("%s_start:", name)
	p("\tTESTQ CX, CX")
	p("\tJZ %s_store", name)
	p("%s_loop:", name)
	for j := 0; j < c; j++ {
		p("\tVMOVUPS %d(BX), %s", j*s.vbytes, bv(j))
	}
	for i := 0; i < r; i++ {
		p("\tVBROADCASTSS %s, %s", rowAddr(i), bc)
		for j := 0; j < c; j++ {
			p("\tVFMADD231PS %s, %s, %s", bv(j), bc, acc(i, j))
		}
	}
	p("\tADDQ $4, SI")
	p("\tADDQ $4, DX")
	p("\tADDQ R9, BX")
	p("\tDECQ CX")
	p("\tJNZ %s_loop", name)
	p("%s_store:", name)
	p("\tVBROADCASTSS alpha+64(FP), %s", al)
	for i := 0; i < r; i++ {
		for j := 0; j < c; j++ {
			p("\tVMULPS %s, %s, %s", al, acc(i, j), acc(i, j))
			p("\tVMOVUPS %s, %d(DI)", acc(i, j), j*s.vbytes)
		}
		if i < r-1 {
			p("\tADDQ R10, DI")
		}
	}
	p("\tVZEROUPPER")
	p("\tRET")
	p("")
}

// rowKernels emits the three passes of an attention row's softmax that are
// not the exponentials (those are expSub's): the maximum, the float64 sum
// and the scaling with optional F16 rounding. Each covers n elements, n a
// multiple of the vector width; the Go wrapper does the tail.
func rowKernels(s isa) {
	r := func(i int) string { return fmt.Sprintf("%s%d", s.reg, i) }
	lanes := s.vbytes / 4
	half := "Y" // the register holding half a vector
	if s.reg == "Y" {
		half = "X"
	}
	h := func(i int) string { return fmt.Sprintf("%s%d", half, i) }

	name := "attnMax" + s.name
	p("// func %s(x *float32, n int) float32", name)
	p("//")
	p("// The largest of x[:n] (n a multiple of %d); NaNs are skipped, as the", lanes)
	p("// scalar loop's x > max skips them: MAXPS keeps its second (Intel)")
	p("// operand, the running maximum, when either is NaN.")
	p("TEXT ·%s(SB), NOSPLIT, $0-20", name)
	p("\tMOVQ x+0(FP), SI")
	p("\tMOVQ n+8(FP), CX")
	p("\tMOVL $0xff800000, AX")
	p("\tMOVQ AX, X0")
	p("\tVBROADCASTSS X0, %s", r(0))
	for i := 1; i < 4; i++ {
		p("\tVMOVAPS %s, %s", r(0), r(i))
	}
	p("%s_loop4:", name)
	p("\tCMPQ CX, $%d", 4*lanes)
	p("\tJL %s_loop1", name)
	for i := 0; i < 4; i++ {
		p("\tVMOVUPS %d(SI), %s", i*s.vbytes, r(4+i))
		p("\tVMAXPS %s, %s, %s", r(i), r(4+i), r(i))
	}
	p("\tADDQ $%d, SI", 4*s.vbytes)
	p("\tSUBQ $%d, CX", 4*lanes)
	p("\tJMP %s_loop4", name)
	p("%s_loop1:", name)
	p("\tTESTQ CX, CX")
	p("\tJZ %s_fold", name)
	p("\tVMOVUPS (SI), %s", r(4))
	p("\tVMAXPS %s, %s, %s", r(0), r(4), r(0))
	p("\tADDQ $%d, SI", s.vbytes)
	p("\tSUBQ $%d, CX", lanes)
	p("\tJMP %s_loop1", name)
	p("%s_fold:", name)
	p("\tVMAXPS %s, %s, %s", r(1), r(0), r(0))
	p("\tVMAXPS %s, %s, %s", r(3), r(2), r(2))
	p("\tVMAXPS %s, %s, %s", r(2), r(0), r(0))
	if s.reg == "Z" {
		p("\tVEXTRACTF64X4 $1, Z0, Y1")
		p("\tVMAXPS Y1, Y0, Y0")
	}
	p("\tVEXTRACTF128 $1, Y0, X1")
	p("\tVMAXPS X1, X0, X0")
	p("\tVMOVHLPS X0, X0, X1")
	p("\tVMAXPS X1, X0, X0")
	p("\tVMOVSHDUP X0, X1")
	p("\tVMAXPS X1, X0, X0")
	p("\tVZEROUPPER")
	p("\tMOVSS X0, ret+16(FP)")
	p("\tRET")
	p("")

	name = "attnSum" + s.name
	p("// func %s(x *float32, n int) float64", name)
	p("//")
	p("// The sum of x[:n] (n a multiple of %d) in float64, as ggml sums a", lanes)
	p("// softmax row: each half vector widened to doubles, two accumulators.")
	p("TEXT ·%s(SB), NOSPLIT, $0-24", name)
	p("\tMOVQ x+0(FP), SI")
	p("\tMOVQ n+8(FP), CX")
	p("\tVXORPD %s, %s, %s", r(0), r(0), r(0))
	p("\tVXORPD %s, %s, %s", r(1), r(1), r(1))
	p("%s_loop:", name)
	p("\tTESTQ CX, CX")
	p("\tJZ %s_fold", name)
	p("\tVCVTPS2PD (SI), %s", r(2))
	p("\tVCVTPS2PD %d(SI), %s", s.vbytes/2, r(3))
	p("\tVADDPD %s, %s, %s", r(2), r(0), r(0))
	p("\tVADDPD %s, %s, %s", r(3), r(1), r(1))
	p("\tADDQ $%d, SI", s.vbytes)
	p("\tSUBQ $%d, CX", lanes)
	p("\tJMP %s_loop", name)
	p("%s_fold:", name)
	p("\tVADDPD %s, %s, %s", r(1), r(0), r(0))
	if s.reg == "Z" {
		p("\tVEXTRACTF64X4 $1, Z0, Y1")
		p("\tVADDPD Y1, Y0, Y0")
	}
	p("\tVEXTRACTF128 $1, Y0, X1")
	p("\tVADDPD X1, X0, X0")
	p("\tVUNPCKHPD X0, X0, X1")
	p("\tVADDSD X1, X0, X0")
	p("\tVZEROUPPER")
	p("\tMOVSD X0, ret+16(FP)")
	p("\tRET")
	p("")

	name = "attnScale" + s.name
	p("// func %s(x *float32, n int, c float32, round int)", name)
	p("//")
	p("// x[:n] *= c (n a multiple of %d), each product then rounded to F16", lanes)
	p("// (nearest even) and back when round is non-zero.")
	p("TEXT ·%s(SB), NOSPLIT, $0-32", name)
	p("\tMOVQ x+0(FP), SI")
	p("\tMOVQ n+8(FP), CX")
	p("\tVBROADCASTSS c+16(FP), %s", r(1))
	p("\tMOVQ round+24(FP), AX")
	p("%s_loop:", name)
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	p("\tVMULPS (SI), %s, %s", r(1), r(0))
	p("\tTESTQ AX, AX")
	p("\tJZ %s_store", name)
	p("\tVCVTPS2PH $0, %s, %s", r(0), h(2))
	p("\tVCVTPH2PS %s, %s", h(2), r(0))
	p("%s_store:", name)
	p("\tVMOVUPS %s, (SI)", r(0))
	p("\tADDQ $%d, SI", s.vbytes)
	p("\tSUBQ $%d, CX", lanes)
	p("\tJMP %s_loop", name)
	p("%s_done:", name)
	p("\tVZEROUPPER")
	p("\tRET")
	p("")
}

func main() {
	p("// Code generated by attngen.go; DO NOT EDIT.")
	p("")
	p("//go:build amd64 && !purego")
	p("")
	p("#include \"textflag.h\"")
	p("")
	for _, s := range isas {
		for r := 1; r <= s.maxR; r++ {
			for c := 1; c <= s.maxC; c++ {
				kernel(s, r, c)
			}
		}
	}
	for _, s := range isas {
		rowKernels(s)
	}
	if err := os.WriteFile("attn_amd64.s", out.Bytes(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var g bytes.Buffer
	fmt.Fprintf(&g, "// Code generated by attngen.go; DO NOT EDIT.\n\n//go:build amd64 && !purego\n\npackage kernels\n\n")
	for _, s := range isas {
		for r := 1; r <= s.maxR; r++ {
			for c := 1; c <= s.maxC; c++ {
				fmt.Fprintf(&g, "//go:noescape\nfunc attnGemm%sr%dc%d(dst *float32, ds int, a *float32, as int, b *float32, bs int, k int, acc int, alpha float32)\n\n", s.name, r, c)
			}
		}
		fmt.Fprintf(&g, "// attnGemm%sKernels[r-1][c-1] is the r-row, c-vector kernel.\n", s.name)
		fmt.Fprintf(&g, "var attnGemm%sKernels = [][]attnKernel{\n", s.name)
		for r := 1; r <= s.maxR; r++ {
			fmt.Fprintf(&g, "\t{")
			for c := 1; c <= s.maxC; c++ {
				if c > 1 {
					fmt.Fprintf(&g, ", ")
				}
				fmt.Fprintf(&g, "attnGemm%sr%dc%d", s.name, r, c)
			}
			fmt.Fprintf(&g, "},\n")
		}
		fmt.Fprintf(&g, "}\n\n")
	}
	for _, s := range isas {
		fmt.Fprintf(&g, "//go:noescape\nfunc attnMax%s(x *float32, n int) float32\n\n", s.name)
		fmt.Fprintf(&g, "//go:noescape\nfunc attnSum%s(x *float32, n int) float64\n\n", s.name)
		fmt.Fprintf(&g, "//go:noescape\nfunc attnScale%s(x *float32, n int, c float32, round int)\n\n", s.name)
	}
	src := bytes.TrimRight(g.Bytes(), "\n")
	src = append(src, '\n')
	if err := os.WriteFile("attn_stubs_amd64.go", src, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
