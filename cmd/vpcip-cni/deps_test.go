package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDependencies pins docs/design.md §3 for the binary the runtime executes on
// every pod start: no AWS SDK, Kubernetes client, Prometheus, gRPC or daemon
// internals (only the wire protocol, ipamd/api), so it stays small and starts
// fast. net/http (and the crypto/tls it brings) is allowed: ipamd/api's
// client uses it (docs/design.md §3, "The plugin's socket client").
func TestDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/vpcip/vpcip/cmd/vpcip-cni").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	forbidden := []string{"github.com/aws/", "k8s.io/", "prometheus", "google.golang.org/grpc", "github.com/vpcip/vpcip/ipamd"}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps printed %d packages; the check would be vacuous", len(deps))
	}
	for _, dep := range deps {
		if dep == "github.com/vpcip/vpcip/ipamd/api" {
			continue
		}
		for _, f := range forbidden {
			if strings.Contains(dep, f) {
				t.Errorf("vpcip-cni links %s (forbidden: %s)", dep, f)
			}
		}
	}
}
