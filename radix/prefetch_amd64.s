#include "textflag.h"

// func prefetch(buckets []*bucket)
TEXT ·prefetch(SB), NOSPLIT, $0-24
	MOVQ buckets_base+0(FP), SI
	MOVQ buckets_len+8(FP), CX
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
