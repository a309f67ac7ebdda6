//go:build !amd64

package main

// avx512 stands in on other architectures: a nil write, so -illegal still
// ends the program with a fault of its own.
func avx512() {
	var p *int
	*p = 1
}
