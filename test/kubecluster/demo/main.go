// Command demo runs vpcip in a real Kubernetes cluster on vpcsim
// (`make demo-cluster`): it starts the control plane and two nodes (kubelet
// + containerd each), installs charts/vpcip with Helm from an aws-node style
// values file, and walks through the scenario of package kubecluster, then
// removes everything, also on Ctrl-C.
//
//	go run ./test/kubecluster/demo --image bin/vpcip-image.tar --vpcipctl bin/image/vpcipctl
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
	pods := flag.Int("pods", 40, "pods of the workload")
	flag.Parse()
	start := time.Now()
	if err := run(*image, *vpcipctl, *values, *helmName, *prefix, *pods); err != nil {
		fmt.Fprintln(os.Stderr, "demo-cluster:", err)
		os.Exit(1)
	}
	fmt.Printf("demo-cluster: done in %s, everything removed\n", time.Since(start).Round(time.Second))
}

func run(image, vpcipctl, values, helmName, prefix string, pods int) error {
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
		if *p, err = filepath.Abs(*p); err != nil {
			return err
		}
	}
	want, err := kubecluster.WantConfigFromValues(values)
	if err != nil {
		return err
	}
	c, err := kubecluster.Start(ctx, kubecluster.Options{Prefix: prefix, Image: image, Logf: logf})
	if err != nil {
		return err
	}
	defer func() {
		logf("== tearing down")
		if err := c.Close(); err != nil {
			logf("teardown: %v", err)
		}
	}()
	s := &kubecluster.Scenario{C: c, Helm: h, Vpcipctl: vpcipctl, Values: values, Pods: pods, Logf: logf, WantConfig: want}
	return s.Run(ctx)
}
