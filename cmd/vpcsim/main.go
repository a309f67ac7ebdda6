// Command vpcsim runs the VPC in a box: vpcsim's EC2 API and IMDS served
// inside a network-namespace fabric, with one netns per instance.
//
//	vpcsim up [--nodes 2] [--instance-type m5.large] [--prefix vsim] [--outside]
//	vpcsim status [--json]
//	vpcsim exec <node> -- <command> [args...]
//	vpcsim fault <latency|error-rate|fail-next|throttle|imds-lag|reset|calls> ...
//	vpcsim down
//
// Every subcommand takes --prefix (default "vsim", the start of every netns
// and link name) and --state-dir (default /run/vpcsim, where `up` writes
// <prefix>.json for the others).
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
)

const usage = `usage: vpcsim <command> [flags]

commands:
  up       start the cloud, the fabric and the instances; runs until SIGINT/SIGTERM
  status   show the running vpcsim: endpoints, nodes, API call counts
  exec     run a command inside a node's netns with the AWS SDK pointed at vpcsim and a daemon's
           socket and checkpoint in the node's own directory (<state-dir>/<prefix>/<node>)
  fault    set faults through the running vpcsim's admin API
  down     stop vpcsim and remove every netns, link, process and node directory it made (also after a crash)

run "vpcsim <command> -h" for its flags.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	cmds := map[string]func(args []string) error{
		"up": runUp, "status": runStatus, "exec": runExec, "fault": runFault, "down": runDown,
	}
	if h := os.Args[1]; h == "-h" || h == "--help" || h == "help" {
		fmt.Print(usage)
		return
	}
	run, ok := cmds[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "vpcsim: unknown command %q\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err := run(os.Args[2:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "vpcsim %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

// commonFlags are the flags of every subcommand: which vpcsim to act on.
type commonFlags struct {
	prefix   string
	stateDir string
}

func newFlagSet(name string, c *commonFlags) *flag.FlagSet {
	fs := flag.NewFlagSet("vpcsim "+name, flag.ContinueOnError)
	fs.StringVar(&c.prefix, "prefix", "vsim", "name prefix of every netns and link (1-6 characters [a-z0-9])")
	fs.StringVar(&c.stateDir, "state-dir", "/run/vpcsim", "directory of the state file <prefix>.json")
	return fs
}
