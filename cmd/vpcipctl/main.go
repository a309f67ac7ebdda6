// Command vpcipctl shows an operator what a node's vpcipd holds: pool
// counts, ENIs, pod assignments, capacity and the effective configuration
// (every variable vpcipd reads, as it parsed them), read from the daemon's
// introspection endpoint (default 127.0.0.1:61679, docs/design.md §5).
//
//	vpcipctl [--addr host:port] [--timeout 5s] status|pool|enis|pods|capacity|config [-o table|json]
//	vpcipctl max-pods --instance-type T [--prefix-delegation] [--custom-networking] [-o table|json]
//	vpcipctl capacity --cluster [--kubeconfig f] [--context c] [-o table|json|yaml]
//
// max-pods needs no daemon: it computes kubelet's max-pods from the built-in
// instance-type limits (see MaxPods).
//
// capacity --cluster reads every node's AddressBudget from the API server
// through the user's kubeconfig instead: nodes least headroom first with a
// usage bar, then totals per zone and per subnet. Installed (copied or
// linked) as kubectl-vpcip, `kubectl vpcip capacity` does the same.
//
// Exit status: 0 on success, 1 when the daemon cannot be read, 2 on a usage
// error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/vpcip/vpcip/ipamd/introspect"
)

func main() {
	args := os.Args[1:]
	if filepath.Base(os.Args[0]) == "kubectl-vpcip" {
		args = pluginArgs(args)
	}
	os.Exit(run(context.Background(), args, os.Stdout, os.Stderr))
}

// command prints one view of the state as a table or as JSON.
type command struct {
	summary string
	table   func(io.Writer, introspect.State) error
	json    func(introspect.State) any
}

var commands = map[string]command{
	"status":   {"node, readiness and pool summary", writeStatus, func(s introspect.State) any { return s }},
	"pool":     {"address pool counts", writePool, func(s introspect.State) any { return s.Pool }},
	"enis":     {"attached ENIs and their addresses", writeENIs, func(s introspect.State) any { return s.ENIs }},
	"pods":     {"addresses held by pods and addresses in cooldown", writePods, podsJSON},
	"capacity": {"addresses used / warm / cooling / budget and ENIs used / max", writeCapacity, func(s introspect.State) any { return capacityOf(s) }},
	"config":   {"the daemon's effective configuration, by variable", writeConfig, func(s introspect.State) any { return s.Config }},
}

var commandOrder = []string{"status", "pool", "enis", "pods", "capacity", "config"}

const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	global := flag.NewFlagSet("vpcipctl", flag.ContinueOnError)
	global.SetOutput(stderr)
	addr := global.String("addr", introspect.DefaultAddr, "vpcipd introspection address, host:port")
	timeout := global.Duration("timeout", 5*time.Second, "give up reading the daemon after this long")
	output := global.String("o", "table", "output format: table or json")
	global.Usage = func() { usage(stderr, global) }
	if err := global.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return exitUsage
	}
	rest := global.Args()
	if len(rest) == 0 {
		usage(stderr, global)
		return exitUsage
	}
	name := rest[0]
	if name == "max-pods" {
		return runMaxPods(rest[1:], *output, stdout, stderr)
	}
	cmd, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "vpcipctl: unknown command %q\n", name)
		usage(stderr, global)
		return exitUsage
	}
	sub := flag.NewFlagSet("vpcipctl "+name, flag.ContinueOnError)
	sub.SetOutput(stderr)
	sub.StringVar(output, "o", *output, "output format: table or json")
	var cluster bool
	var cf clusterFlags
	if name == "capacity" {
		sub.BoolVar(&cluster, "cluster", false, "every node's AddressBudget through the kubeconfig, least headroom first (-o table|json|yaml)")
		sub.StringVar(&cf.kubeconfig, "kubeconfig", "", "with --cluster: kubeconfig file (default $KUBECONFIG, then ~/.kube/config)")
		sub.StringVar(&cf.context, "context", "", "with --cluster: kubeconfig context (default the current one)")
	}
	if err := sub.Parse(rest[1:]); err != nil {
		return exitUsage
	}
	if sub.NArg() > 0 {
		fmt.Fprintf(stderr, "vpcipctl %s: unexpected arguments %q\n", name, sub.Args())
		return exitUsage
	}
	if cluster {
		ctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		return runCluster(ctx, cf, *output, stdout, stderr)
	}
	if *output != "table" && *output != "json" {
		fmt.Fprintf(stderr, "vpcipctl: -o %q: want table or json\n", *output)
		return exitUsage
	}

	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	state, err := introspect.Fetch(ctx, *addr)
	if err != nil {
		fmt.Fprintf(stderr, "vpcipctl: is vpcipd running? %v\n", err)
		return exitFail
	}
	if *output == "json" {
		err = writeJSON(stdout, cmd.json(state))
	} else {
		err = cmd.table(stdout, state)
	}
	if err != nil {
		fmt.Fprintf(stderr, "vpcipctl: %v\n", err)
		return exitFail
	}
	return exitOK
}

func usage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintln(w, "usage: vpcipctl [--addr host:port] [--timeout d] <command> [-o table|json]")
	fmt.Fprintln(w, "       vpcipctl capacity --cluster [--kubeconfig f] [--context c] [-o table|json|yaml]")
	fmt.Fprintln(w, "\ncommands:")
	for _, name := range commandOrder {
		fmt.Fprintf(w, "  %-9s %s\n", name, commands[name].summary)
	}
	fmt.Fprintf(w, "  %-9s %s\n", "max-pods", "kubelet max-pods an instance type's addresses allow (--instance-type T [--prefix-delegation] [--custom-networking]; no daemon needed)")
	fmt.Fprintln(w, "\nflags:")
	fs.PrintDefaults()
}
