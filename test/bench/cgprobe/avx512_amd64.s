#include "textflag.h"

// func avx512()
// VPXORD Z0, Z0, Z0 (EVEX-encoded), spelled as bytes: valgrind's decoder
// has no AVX-512 and stops at it with "Unrecognised instruction".
TEXT ·avx512(SB), NOSPLIT, $0-0
	BYTE $0x62; BYTE $0xF1; BYTE $0x7D; BYTE $0x48; BYTE $0xEF; BYTE $0xC0
	RET
