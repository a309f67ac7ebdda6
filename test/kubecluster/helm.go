package kubecluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/vpcip/vpcip/test/chart"
	"github.com/vpcip/vpcip/test/vpcsim/fabric"
)

// Release is the Helm release name the scenario installs.
const Release = "vpcip"

// clusterValues are the values every install here adds to the user's: the
// image imported into each node (no registry to pull from), the AWS SDK
// pointed at vpcsim's EC2 endpoint (which also answers STS) inside the
// fabric (IMDS is at its real address there), static credentials unless
// Options.DaemonCredentials says otherwise, the API server at the nodes' loopback relay, and a GC
// grace of WitnessGrace and reconciliation every WitnessCheck (the host
// checks that see a route gone run then; the witness step waits both out).
func (c *Cluster) clusterValues() string {
	creds := []EnvVar{{"AWS_ACCESS_KEY_ID", "vpcsim"}, {"AWS_SECRET_ACCESS_KEY", "vpcsim"}}
	if c.DaemonCredentials != nil {
		creds = c.DaemonCredentials
	}
	var extra strings.Builder
	for _, e := range creds {
		fmt.Fprintf(&extra, "  - {name: %s, value: %q}\n", e.Name, e.Value)
	}
	return fmt.Sprintf(`image:
  pullPolicy: Never
extraEnv:
  - {name: AWS_REGION, value: %q}
  - {name: AWS_ENDPOINT_URL_EC2, value: %q}
  - {name: AWS_ENDPOINT_URL_STS, value: %q}
%s  - {name: KUBERNETES_SERVICE_HOST, value: %s}
  - {name: KUBERNETES_SERVICE_PORT, value: "%d"}
  - {name: VPCIP_GC_GRACE, value: %q}
  - {name: VPCIP_RECONCILE_INTERVAL, value: %q}
`, c.Cloud.Region(), fabric.EC2URL, fabric.EC2URL, extra.String(), apiServiceHost(c.IPv6), apiPort, WitnessGrace.String(), WitnessCheck.String())
}

// apiServiceHost is KUBERNETES_SERVICE_HOST for hostNetwork pods: the
// node's API relay, on [::1] in an IPv6 cluster.
func apiServiceHost(ipv6 bool) string {
	if ipv6 {
		return `"::1"`
	}
	return "localhost"
}

// Helm runs h against the cluster with the admin kubeconfig.
func (c *Cluster) Helm(h chart.Helm, args ...string) (string, error) {
	out, err := h.Run(append(args, "--kubeconfig", c.API.Kubeconfig)...)
	return string(out), err
}

// InstallChart runs `helm install` (or `upgrade` when upgrade is set) of
// charts/vpcip into kube-system with the user's values file (may be "") and
// extra --set arguments, on top of the cluster's own values. It returns
// Helm's output (the NOTES).
func (c *Cluster) InstallChart(h chart.Helm, upgrade bool, userValues string, set ...string) (string, error) {
	var files []string
	if userValues != "" {
		files = append(files, userValues)
	}
	return c.InstallChartFiles(h, upgrade, files, set...)
}

// InstallChartFiles is InstallChart with the user's values files layered in
// order (`-f a -f b`: later files win key by key), as a user layers a
// feature's values over a release's defaults.
func (c *Cluster) InstallChartFiles(h chart.Helm, upgrade bool, userValues []string, set ...string) (string, error) {
	own := filepath.Join(c.Dir, "cluster-values.yaml")
	if err := os.WriteFile(own, []byte(c.clusterValues()), 0o644); err != nil {
		return "", err
	}
	verb := "install"
	if upgrade {
		verb = "upgrade"
	}
	args := []string{verb, Release, chart.ChartDir(), "-n", "kube-system"}
	for _, f := range userValues {
		args = append(args, "-f", f)
	}
	args = append(args, "-f", own)
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return c.Helm(h, args...)
}

// DaemonConfig reads a node's effective daemon configuration through
// vpcipctl on the node (introspection listens on the node's loopback).
func (c *Cluster) DaemonConfig(ctx context.Context, n *Node, vpcipctl string) (map[string]string, error) {
	out, err := n.InNetns(ctx, vpcipctl, "status", "-o", "json")
	if err != nil {
		return nil, err
	}
	return parseConfig(out)
}

func parseConfig(statusJSON string) (map[string]string, error) {
	var st struct {
		Config map[string]string `json:"config"`
		Ready  bool              `json:"ready"`
	}
	if err := jsonUnmarshal(statusJSON, &st); err != nil {
		return nil, fmt.Errorf("vpcipctl status: %w: %.200s", err, strings.TrimSpace(statusJSON))
	}
	return st.Config, nil
}
