// Command bench is `make bench`: vpcip's latency, burst, memory and cloud-call
// figures, each next to a reference measured in the same run on the same
// machine where one exists. It prints a table and writes JSON under --out.
//
//	(a) warm ADD and DEL latency, p50/p99, and CPU time per ADD and DEL: vpcip-cni (+ vpcipd's share)
//	    vs the reference ptp+host-local chain
//	(b) 30 concurrent ADDs on one node: p50/p99, wall time and CPU time per ADD, vs the same burst
//	    through ptp+host-local
//	(e) user-space instructions of one ADD and one DEL (cachegrind), ours vs the reference chain
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
	"strings"
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
	Note  string  `json:"note,omitempty"` // a second value or a caveat, printed after the goal
}

func main() {
	bin := flag.String("bin", "bin", "directory holding vpcipd, vpcip-cni and vpcipctl")
	out := flag.String("out", "results", "directory for the JSON results")
	rounds := flag.Int("rounds", 3, "sequential ADD/DEL rounds of 20 pods for (a)")
	burstRounds := flag.Int("burst-rounds", 5, "bursts of 30 concurrent ADDs for (b), each against one of the reference chain")
	smoke := flag.Bool("smoke", false, "a quick run with small counts, to check the bench itself works (make test runs it)")
	only := flag.String("only", "", "comma-separated steps to run (latency, instructions, memory, calls); empty: all")
	profiles := flag.String("cachegrind-out", "", "keep the cachegrind profiles of (e) under this directory (vpcip|reference/add|del/cachegrind.<pid>; read them with cg_annotate)")
	var others pluginFlag
	flag.Var(&others, "cachegrind-plugin", "NAME=PATH: (e) also counts the vpcip-cni binary at PATH (say, one built from another revision) on the same node in the same run, as NAME; repeatable")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench: needs root")
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	binAbs, _ := filepath.Abs(*bin)
	if *profiles != "" {
		*profiles, _ = filepath.Abs(*profiles)
	}
	b := &bench{bin: binAbs, profileDir: *profiles, otherPlugins: others, tag: fmt.Sprintf("%04d", os.Getpid()%10000), rounds: *rounds, burstRounds: *burstRounds, memPods: 250, callPods: 100, deleteWindow: 90 * time.Second}
	if *smoke {
		b.rounds, b.burstRounds, b.memPods, b.callPods, b.deleteWindow = 1, 1, 20, 10, 3*time.Second
	}
	if err := b.run(ctx, *only); err != nil {
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
	profileDir   string        // (e): where cachegrind profiles are kept; "": removed
	otherPlugins []namedPlugin // (e): more vpcip-cni binaries counted beside ours
	tag          string        // makes this run's netns names its own (prefix)
	rounds       int           // (a): sequential rounds of 20 pods
	burstRounds  int           // (b): bursts of 30 pods, alternating with the reference's
	memPods      int           // (c): pods on the node whose RSS is read
	callPods     int           // (d): pods started and deleted
	deleteWindow time.Duration // (d): how long calls are counted after the deletes
	figures      []Figure
}

// prefix names the netns, links and pods of one step: two letters for the
// step and this run's tag, 6 characters (cluster.Options.Prefix's limit),
// so benches run side by side on one machine do not collide.
func (b *bench) prefix(step string) string { return step + b.tag }

func (b *bench) add(f Figure) {
	if f.Ref > 0 {
		f.Ratio = f.Value / f.Ref
	}
	b.figures = append(b.figures, f)
}

func (b *bench) run(ctx context.Context, only string) error {
	steps := []struct {
		key, name string
		fn        func(context.Context) error
	}{
		{"latency", "plugin latency, burst and CPU time", b.latency},
		{"instructions", "instructions of one ADD and DEL (cachegrind)", b.instructions},
		{"memory", fmt.Sprintf("daemon memory with %d pods", b.memPods), b.memory},
		{"calls", fmt.Sprintf("EC2 calls per %d pods", b.callPods), b.cloudCalls},
	}
	want := map[string]bool{}
	for _, k := range strings.Split(only, ",") {
		if k = strings.TrimSpace(k); k != "" {
			want[k] = true
		}
	}
	for _, s := range steps {
		if len(want) > 0 && !want[s.key] {
			continue
		}
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
		fmt.Printf("%-44s %12s %12s %8s  %s\n", f.Name, fmt.Sprintf("%.2f %s", f.Value, f.Unit), ref, ratio,
			strings.TrimSpace(f.Goal+"  "+f.Note))
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
