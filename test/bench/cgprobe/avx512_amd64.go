package main

// avx512 executes one AVX-512 instruction (avx512_amd64.s).
func avx512()
