//go:build !noprefetch

#include "textflag.h"

// func Lines(ps []unsafe.Pointer)
TEXT ·Lines(SB), NOSPLIT, $0-24
	MOVQ ps_base+0(FP), SI
	MOVQ ps_len+8(FP), CX
	TESTQ CX, CX
	JEQ done
loop:
	MOVQ (SI), AX
	PREFETCHT0 (AX)
	ADDQ $8, SI
	DECQ CX
	JNE loop
done:
	RET
