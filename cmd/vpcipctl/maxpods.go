package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"text/tabwriter"

	awsprovider "github.com/vpcip/vpcip/provider/aws"
)

// MaxPods is what `vpcipctl max-pods` reports for an instance type.
//
// The figures follow the EKS max-pods calculator (amazon-eks-ami
// max-pods-calculator.sh and eni-max-pods.txt):
//   - ENIs for pods: the type's ENIs on its default network card, capped by
//     --max-eni (MAX_ENI), minus one with custom networking (the primary ENI
//     then carries no pods);
//   - secondary-IP mode: ENIs × (IPv4 addresses per ENI − 1) + 2, the −1 for
//     each ENI's own primary address, the +2 for two host-network pods (the
//     node daemon and kube-proxy);
//   - prefix mode (Nitro types only; others fall back to secondary IPs):
//     ENIs × ((IPv4 addresses per ENI − 1) × 16) + 2, each slot a /28;
//   - the recommended kubelet max-pods is that figure capped at 110 for
//     instance types with at most 30 vCPUs and at 250 above (the EKS
//     guidance the calculator applies in both modes).
type MaxPods struct {
	InstanceType string `json:"instanceType"`
	Mode         string `json:"mode"` // "secondary-ip" or "prefix"
	ENIs         int    `json:"enis"` // ENIs whose addresses serve pods
	PerENI       int    `json:"addressesPerENI"`
	Addresses    int    `json:"addresses"`      // pod addresses at the ENI limit
	AddressLimit int    `json:"addressLimit"`   // Addresses + 2: pods the addresses allow
	VCPUs        int    `json:"vcpus"`          // from the size name, or --vcpus
	Ceiling      int    `json:"ceiling"`        // 110 or 250
	MaxPods      int    `json:"maxPods"`        // min(AddressLimit, Ceiling): kubelet's --max-pods
	Note         string `json:"note,omitempty"` // e.g. prefix mode unsupported
}

// Pod ceilings of the EKS guidance, by vCPU count.
const (
	ceilingSmall    = 110 // at most 30 vCPUs
	ceilingLarge    = 250 // above 30 vCPUs
	ceilingVCPUs    = 30
	hostNetworkPods = 2
	prefixAddresses = 16 // a /28
)

// computeMaxPods applies the formula to the built-in limits table. vcpus 0
// derives the count from the size name (see sizeVCPUs); maxENI 0 is no cap.
func computeMaxPods(instanceType string, prefix, custom bool, maxENI, vcpus int) (MaxPods, error) {
	l, ok := awsprovider.TableLimits(instanceType)
	if !ok {
		return MaxPods{}, fmt.Errorf("instance type %q is not in the built-in limits table", instanceType)
	}
	if vcpus == 0 {
		var err error
		if vcpus, err = sizeVCPUs(instanceType); err != nil {
			return MaxPods{}, err
		}
	}
	// The ENIs holding pods, as the daemon's pool counts them (one formula:
	// provider.Limits.PodENIs), so max-pods and the node's budget agree.
	m := MaxPods{InstanceType: instanceType, Mode: "secondary-ip", ENIs: l.PodENIs(maxENI, custom), PerENI: l.PodAddressesPerENI(), VCPUs: vcpus}
	if prefix {
		if l.Hypervisor == "nitro" {
			m.Mode, m.PerENI = "prefix", m.PerENI*prefixAddresses
		} else {
			m.Note = "prefix delegation needs a Nitro instance type; secondary IPs assumed"
		}
	}
	m.Addresses = m.ENIs * m.PerENI
	m.AddressLimit = m.Addresses + hostNetworkPods
	m.Ceiling = ceilingSmall
	if vcpus > ceilingVCPUs {
		m.Ceiling = ceilingLarge
	}
	m.MaxPods = min(m.AddressLimit, m.Ceiling)
	return m, nil
}

var sizeRe = regexp.MustCompile(`\.(?:metal-)?(\d*)x(?:large|l)$`)

// sizeVCPUs derives the vCPU count from an EC2 size name: large 2, xlarge 4,
// Nxlarge (and metal-Nxl) 4×N; nano to medium at most 2. Only whether the
// count exceeds 30 matters to the ceiling, and for that the rule holds
// across current families. A plain .metal size says nothing: --vcpus is
// needed.
func sizeVCPUs(instanceType string) (int, error) {
	if m := sizeRe.FindStringSubmatch(instanceType); m != nil {
		n := 1
		if m[1] != "" {
			n, _ = strconv.Atoi(m[1])
		}
		return 4 * n, nil
	}
	for _, s := range []string{".large", ".medium", ".small", ".micro", ".nano"} {
		if len(instanceType) > len(s) && instanceType[len(instanceType)-len(s):] == s {
			return 2, nil
		}
	}
	return 0, fmt.Errorf("the vCPU count of %s does not follow from its size name: pass --vcpus", instanceType)
}

// runMaxPods is `vpcipctl max-pods --instance-type T [--prefix-delegation]
// [--custom-networking] [--max-eni N] [--vcpus N]`; it needs no daemon.
func runMaxPods(args []string, output string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("vpcipctl max-pods", flag.ContinueOnError)
	fs.SetOutput(stderr)
	typ := fs.String("instance-type", "", "EC2 instance type, e.g. m5.large (required)")
	prefix := fs.Bool("prefix-delegation", false, "ENABLE_PREFIX_DELEGATION=true: /28 prefixes per slot")
	custom := fs.Bool("custom-networking", false, "custom networking (ENIConfig): the primary ENI carries no pods")
	maxENI := fs.Int("max-eni", 0, "MAX_ENI: cap on ENIs (0: the type's limit)")
	vcpus := fs.Int("vcpus", 0, "vCPUs of the type (0: from the size name)")
	fs.StringVar(&output, "o", output, "output format: table or json")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if *typ == "" || fs.NArg() > 0 || *maxENI < 0 || *vcpus < 0 || (output != "table" && output != "json") {
		fmt.Fprintln(stderr, "usage: vpcipctl max-pods --instance-type T [--prefix-delegation] [--custom-networking] [--max-eni N] [--vcpus N] [-o table|json]")
		return exitUsage
	}
	m, err := computeMaxPods(*typ, *prefix, *custom, *maxENI, *vcpus)
	if err != nil {
		fmt.Fprintf(stderr, "vpcipctl max-pods: %v\n", err)
		return exitFail
	}
	if output == "json" {
		err = writeJSON(stdout, m)
	} else {
		err = writeMaxPods(stdout, m)
	}
	if err != nil {
		fmt.Fprintf(stderr, "vpcipctl: %v\n", err)
		return exitFail
	}
	return exitOK
}

func writeMaxPods(w io.Writer, m MaxPods) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "INSTANCE TYPE\tMODE\tENIS\tADDRESSES/ENI\tADDRESSES ALLOW\tVCPUS\tMAX PODS")
	fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\n", m.InstanceType, m.Mode, m.ENIs, m.PerENI, m.AddressLimit, m.VCPUs, m.MaxPods)
	if err := tw.Flush(); err != nil {
		return err
	}
	if m.Note != "" {
		fmt.Fprintln(w, "note:", m.Note)
	}
	return nil
}
