// Command demo runs vpcip in a real Kubernetes cluster on vpcsim
// (`make demo-cluster`): it starts the control plane and two nodes (kubelet
// + containerd each), installs charts/vpcip with Helm from an aws-node style
// values file, and walks through the scenario of package kubecluster, then
// removes everything, also on Ctrl-C. With --ipv6 (`make demo-cluster
// IPV6=1`) the cluster is IPv6 single-stack (Services, node addresses and
// pods) and vpcip runs the reference's IPv6 mode: install, 6 pods, EC2's
// view, IPv6 pings across nodes and IPv4 egress (kubecluster.RunIPv6);
// --values is then layered under kubecluster.IPv6Values.
//
//	go run ./test/kubecluster/demo --image bin/vpcip-image.tar --vpcipctl bin/image/vpcipctl [--ipv6]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/vpcip/vpcip/test/chart"
	"github.com/vpcip/vpcip/test/kubecluster"
)

func main() {
	image := flag.String("image", "bin/vpcip-image.tar", "vpcip's OCI archive (make image)")
	vpcipctl := flag.String("vpcipctl", "bin/image/vpcipctl", "vpcipctl, run inside each node's netns")
	values := flag.String("values", filepath.Join(chart.ChartDir(), "..", "..", "test", "chart", "testdata", "aws-node-values.yaml"), "the user's values file")
	helmName := flag.String("helm", "helm", "helm (v3) or helm4")
	prefix := flag.String("prefix", "vkdemo", "netns and link prefix (at most 6 characters)")
	pods := flag.Int("pods", 0, "pods of the workload (default 40, 6 with --ipv6)")
	ipv6 := flag.Bool("ipv6", false, "an IPv6 single-stack cluster with vpcip's IPv6 mode (without --values: kubecluster.IPv6Values alone)")
	flag.Parse()
	if *ipv6 && !isFlagSet("values") {
		*values = ""
	}
	start := time.Now()
	if err := run(*image, *vpcipctl, *values, *helmName, *prefix, *pods, *ipv6); err != nil {
		fmt.Fprintln(os.Stderr, "demo-cluster:", err)
		os.Exit(1)
	}
	fmt.Printf("demo-cluster: done in %s, everything removed\n", time.Since(start).Round(time.Second))
}

func isFlagSet(name string) (set bool) {
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func run(image, vpcipctl, values, helmName, prefix string, pods int, ipv6 bool) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf := func(format string, args ...any) { fmt.Printf(format+"\n", args...) }
	helms, err := chart.Helms()
	if err != nil {
		return err
	}
	var h chart.Helm
	for _, x := range helms {
		if x.Name == helmName {
			h = x
		}
	}
	if h.Path == "" {
		return fmt.Errorf("no %s among %v", helmName, helms)
	}
	for _, p := range []*string{&image, &vpcipctl, &values} {
		if *p == "" {
			continue
		}
		if *p, err = filepath.Abs(*p); err != nil {
			return err
		}
	}
	c, err := kubecluster.Start(ctx, kubecluster.Options{Prefix: prefix, Image: image, Logf: logf, IPv6: ipv6})
	if err != nil {
		return err
	}
	defer func() {
		logf("== tearing down")
		if err := c.Close(); err != nil {
			logf("teardown: %v", err)
		}
	}()
	files := []string{values}
	if ipv6 {
		v6, err := c.WriteIPv6Values()
		if err != nil {
			return err
		}
		files = append(files, v6)
	}
	want, err := kubecluster.WantConfigFromValues(files...)
	if err != nil {
		return err
	}
	s := &kubecluster.Scenario{C: c, Helm: h, Vpcipctl: vpcipctl, Values: files[len(files)-1], Pods: pods, Logf: logf, WantConfig: want}
	if ipv6 {
		if values != "" {
			s.ValuesUnder = []string{values}
		}
		return s.RunIPv6(ctx)
	}
	return s.Run(ctx)
}
