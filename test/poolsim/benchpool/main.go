// Command benchpool prints the warm-pool table of `make bench-pool`: every
// churn trace on every instance type, in secondary-IP and prefix mode,
// replayed against the reference algorithm and vpcipd's pool side by side
// on a virtual clock (package poolsim).
package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/vpcip/vpcip/test/poolsim"
	"github.com/vpcip/vpcip/test/poolsim/compare"
)

func main() {
	seed := flag.Uint64("seed", 1, "seed of the traces")
	seeds := flag.Int("seeds", 0, "run seeds 1..N and print each seed's summary (no table); 0: one seed, -seed, with its table")
	traces := flag.String("traces", "", "comma-separated trace names to run (default: all)")
	mode := flag.String("mode", "", "ip or pd: one address mode only (default: both)")
	flag.Parse()
	o := compare.Options{Seed: *seed}
	if *traces != "" {
		for _, name := range strings.Split(*traces, ",") {
			i := slices.IndexFunc(poolsim.Generators, func(g poolsim.Generator) bool { return g.Name == name })
			if i < 0 {
				fmt.Fprintf(os.Stderr, "benchpool: no trace %q\n", name)
				os.Exit(2)
			}
			o.Traces = append(o.Traces, poolsim.Generators[i])
		}
	}
	switch *mode {
	case "":
	case "ip":
		o.Modes = []bool{false}
	case "pd":
		o.Modes = []bool{true}
	default:
		fmt.Fprintf(os.Stderr, "benchpool: -mode %q: want ip or pd\n", *mode)
		os.Exit(2)
	}
	start := time.Now()
	if *seeds > 0 {
		failed := false
		for sd := 1; sd <= *seeds; sd++ {
			o.Seed = uint64(sd)
			rows := compare.Table(o)
			fmt.Printf("seed %d:\n", sd)
			compare.Summary(os.Stdout, rows)
			fmt.Println()
			failed = failed || slices.ContainsFunc(rows, func(r compare.Row) bool { return r.Err != nil })
		}
		fmt.Printf("seeds 1-%d in %.1f s\n", *seeds, time.Since(start).Seconds())
		if failed {
			os.Exit(1)
		}
		return
	}
	rows := compare.Table(o)
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
