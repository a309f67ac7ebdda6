// Command cgprobe checks that valgrind's cachegrind can run a Go program
// the way the bench's instruction count (e) runs the plugins: goroutines
// on locked OS threads contending for runtime locks, and the runtime's
// cycle-counter reads that contention and block profiling make (the
// instruction a processor/valgrind pair may not agree on). It prints "ok".
//
//	cgprobe           the probe
//	cgprobe -panic    panics (a plugin that fails for its own reasons)
//	cgprobe -illegal  executes an AVX-512 instruction, which valgrind 3.x
//	                  never decodes (an instruction valgrind cannot run)
package main

import (
	"flag"
	"fmt"
	"runtime"
	"sync"
)

func main() {
	panicking := flag.Bool("panic", false, "panic after the probe")
	illegal := flag.Bool("illegal", false, "execute an instruction valgrind cannot decode")
	flag.Parse()
	if *illegal {
		avx512()
	}
	runtime.SetBlockProfileRate(1) // every blocking wait reads the cycle counter
	var mu sync.Mutex
	var wg sync.WaitGroup
	n := 0
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // as the plugin does for netns work
			for range 2000 {
				mu.Lock()
				n++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if *panicking {
		panic("cgprobe: a failure of the program's own")
	}
	fmt.Println("ok", n)
}
