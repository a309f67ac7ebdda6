// Command bench is `make bench`: vpcip's latency, burst, memory and cloud-call
// figures, each next to a reference measured in the same run on the same
// machine where one exists. It prints a table and writes JSON under --out.
//
//	(a) warm ADD and DEL latency, p50/p99: vpcip-cni vs the reference ptp+host-local chain
//	(b) 30 concurrent ADDs on one node: p50/p99 and wall time, vs the same burst through ptp+host-local
//	(c) vpcipd resident memory with 250 pods
//	(d) EC2 calls per 100 pod starts and per 100 pod deletes, default settings
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

// Figure is one measured number.
type Figure struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Unit  string  `json:"unit"`
	Ref   float64 `json:"reference,omitempty"` // the reference's value, same unit
	Ratio float64 `json:"ratio,omitempty"`     // Value / Ref
	Goal  string  `json:"goal,omitempty"`
}

func main() {
	bin := flag.String("bin", "bin", "directory holding vpcipd, vpcip-cni and vpcipctl")
	out := flag.String("out", "results", "directory for the JSON results")
	rounds := flag.Int("rounds", 3, "sequential ADD/DEL rounds of 20 pods for (a)")
	smoke := flag.Bool("smoke", false, "a quick run with small counts, to check the bench itself works (make test runs it)")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench: needs root")
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	binAbs, _ := filepath.Abs(*bin)
	b := &bench{bin: binAbs, rounds: *rounds, memPods: 250, callPods: 100, deleteWindow: 90 * time.Second}
	if *smoke {
		b.rounds, b.memPods, b.callPods, b.deleteWindow = 1, 20, 10, 3*time.Second
	}
	if err := b.run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "bench failed:", err)
		os.Exit(1)
	}
	b.print()
	if err := b.save(*out); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

type bench struct {
	bin          string
	rounds       int           // (a): sequential rounds of 20 pods
	memPods      int           // (c): pods on the node whose RSS is read
	callPods     int           // (d): pods started and deleted
	deleteWindow time.Duration // (d): how long calls are counted after the deletes
	figures      []Figure
}

func (b *bench) add(f Figure) {
	if f.Ref > 0 {
		f.Ratio = f.Value / f.Ref
	}
	b.figures = append(b.figures, f)
}

func (b *bench) run(ctx context.Context) error {
	steps := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"plugin latency and burst", b.latency},
		{fmt.Sprintf("daemon memory with %d pods", b.memPods), b.memory},
		{fmt.Sprintf("EC2 calls per %d pods", b.callPods), b.cloudCalls},
	}
	for _, s := range steps {
		fmt.Printf("==> %s\n", s.name)
		if err := s.fn(ctx); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	return nil
}

func (b *bench) print() {
	fmt.Printf("\n%-44s %12s %12s %8s  %s\n", "FIGURE", "VPCIP", "REFERENCE", "RATIO", "GOAL")
	for _, f := range b.figures {
		ref, ratio := "-", "-"
		if f.Ref > 0 {
			ref = fmt.Sprintf("%.2f %s", f.Ref, f.Unit)
			ratio = fmt.Sprintf("%.2f×", f.Ratio)
		}
		fmt.Printf("%-44s %12s %12s %8s  %s\n", f.Name, fmt.Sprintf("%.2f %s", f.Value, f.Unit), ref, ratio, f.Goal)
	}
}

func (b *bench) save(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(dir, "bench-"+time.Now().UTC().Format("20060102T150405Z")+".json")
	data, err := json.MarshalIndent(map[string]any{"time": time.Now().UTC(), "figures": b.figures}, "", "  ")
	if err != nil {
		return err
	}
	fmt.Printf("\nresults written to %s\n", path)
	return os.WriteFile(path, data, 0o644)
}
