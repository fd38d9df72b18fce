#include "textflag.h"

// func prefetch(addrs *unsafe.Pointer, n int)
TEXT ·prefetch(SB), NOSPLIT, $0-16
	MOVQ addrs+0(FP), SI
	MOVQ n+8(FP), CX
	TESTQ CX, CX
	JEQ done
loop:
	MOVQ (SI), AX
	PREFETCHT1 (AX)
	ADDQ $8, SI
	DECQ CX
	JNE loop
done:
	RET
