// Command benchpool prints the warm-pool table of `make bench-pool`: every
// churn trace on every instance type, in secondary-IP and prefix mode,
// replayed against the reference algorithm and vpcipd's pool side by side
// on a virtual clock (package poolsim).
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/vpcip/vpcip/test/poolsim/compare"
)

func main() {
	seed := flag.Uint64("seed", 1, "seed of the traces")
	flag.Parse()
	start := time.Now()
	rows := compare.Table(compare.Options{Seed: *seed})
	compare.Print(os.Stdout, rows)
	fmt.Println()
	compare.Summary(os.Stdout, rows)
	fmt.Printf("\n%d rows × %d pools, %d-hour traces, seed %d, in %.1f s\n", len(rows), len(compare.Setups), 6, *seed, time.Since(start).Seconds())
	for _, r := range rows {
		if r.Err != nil {
			os.Exit(1)
		}
	}
}
