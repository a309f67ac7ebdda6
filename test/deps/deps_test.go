// Package deps pins the dependency rules of docs/design.md §3: which packages may
// import what. It runs `go list -deps` and fails on a forbidden import.
package deps

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/vpcip/vpcip"

// goList returns the transitive dependencies of pkgs (import paths).
func goList(t *testing.T, pkgs ...string) map[string]bool {
	t.Helper()
	args := append([]string{"list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}"}, pkgs...)
	out, err := exec.Command("go", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	deps := map[string]bool{}
	for _, line := range strings.Fields(string(out)) {
		deps[line] = true
	}
	return deps
}

// exists reports whether the package directory has Go files yet.
func exists(pkg string) bool {
	return exec.Command("go", "list", pkg).Run() == nil
}

func TestStandardLibraryOnly(t *testing.T) {
	for _, pkg := range []string{"warmpool", "provider", "ipamd/api"} {
		t.Run(pkg, func(t *testing.T) {
			full := module + "/" + pkg
			for dep := range goList(t, full) {
				if dep != full {
					t.Errorf("%s imports non-standard package %s; it must stay on the standard library", pkg, dep)
				}
			}
		})
	}
}

func TestPluginStaysLight(t *testing.T) {
	pkgs := []string{module + "/cni/...", module + "/cmd/vpcip-cni"}
	if !exists(module + "/cmd/vpcip-cni") {
		t.Skip("cmd/vpcip-cni not built yet")
	}
	forbidden := []string{"github.com/aws/", "k8s.io/", "github.com/prometheus/", "google.golang.org/grpc", module + "/ipamd", module + "/provider", module + "/test/"}
	for dep := range goList(t, pkgs...) {
		if dep == module+"/ipamd/api" {
			continue
		}
		for _, f := range forbidden {
			if strings.HasPrefix(dep, f) {
				t.Errorf("the plugin links %s: it must not import %s (docs/conventions.md habit 12)", dep, f)
			}
		}
	}
}

// TestRoutingContractIsSmall: package routing, the datapath contract the
// plugin and the daemon share, links only the standard library, netlink
// (with netlink's own dependencies) and containernetworking's netlinksafe
// (its retried netlink lists; the plugin links it anyway), so the plugin
// may import it.
func TestRoutingContractIsSmall(t *testing.T) {
	allowed := []string{"github.com/vishvananda/netlink", "github.com/vishvananda/netns", "golang.org/x/sys/",
		"github.com/containernetworking/plugins/pkg/netlinksafe", "github.com/pkg/errors"}
	full := module + "/routing"
	for dep := range goList(t, full) {
		if dep == full || slices.ContainsFunc(allowed, func(a string) bool { return strings.HasPrefix(dep, a) }) {
			continue
		}
		t.Errorf("routing imports %s: it may use only the standard library, netlink and netlinksafe", dep)
	}
	if !goList(t, module+"/cni/datapath")[full] || !goList(t, module+"/ipamd/hostnet")[full] {
		t.Errorf("cni/datapath and ipamd/hostnet must both use the routing contract")
	}
}

func TestSimulatorSpeaksTheWireProtocolItself(t *testing.T) {
	if !exists(module + "/test/vpcsim") {
		t.Skip("test/vpcsim not built yet")
	}
	for dep := range goList(t, module+"/test/vpcsim/...") {
		if strings.HasPrefix(dep, module+"/provider") || strings.HasPrefix(dep, "github.com/aws/aws-sdk-go-v2") {
			t.Errorf("vpcsim imports %s: it must speak EC2's wire protocol on its own so the SDK judges it", dep)
		}
	}
}

func TestNoBinaryLinksTesting(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}", module+"/cmd/...").Output()
	if err != nil {
		t.Fatalf("go list ./cmd/...: %v", err)
	}
	for _, cmd := range strings.Fields(string(out)) {
		deps, err := exec.Command("go", "list", "-deps", cmd).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", cmd, err)
		}
		for _, dep := range strings.Fields(string(deps)) {
			if dep == "testing" {
				t.Errorf("%s links package testing", cmd)
			}
		}
	}
}

func TestNothingImportsCmd(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", module+"/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		for _, imp := range f[1:] {
			if strings.HasPrefix(imp, module+"/cmd/") {
				t.Errorf("%s imports %s: nothing imports cmd", f[0], imp)
			}
		}
	}
}

// TestClusterPartIsAGuest: the Kubernetes part (ipamd/cluster) is a one-way
// source of facts and a sink of the daemon's status (docs/design.md §9): it
// links none of the daemon's internals, neither the daemon itself, nor the
// host's networking (hostnet, routing), the checkpoint, introspection, the
// datastore or the pool. What it knows of the daemon comes as a
// nodestatus.Snapshot; what the daemon asks of it is ipamd.PodFacts.
func TestClusterPartIsAGuest(t *testing.T) {
	full := module + "/ipamd/cluster"
	deps := goList(t, full)
	if !deps[full] {
		t.Fatalf("go list -deps %s did not list the package itself", full)
	}
	for _, forbidden := range []string{"ipamd", "ipamd/hostnet", "ipamd/checkpoint", "ipamd/introspect", "ipamd/datastore", "ipamd/pool", "routing"} {
		if deps[module+"/"+forbidden] {
			t.Errorf("ipamd/cluster links %s: the Kubernetes part must reach the daemon only through ipamd.PodFacts and the status sink", forbidden)
		}
	}
}

// TestMetricsGuardStandsAlone: ipamd/metricsauth, the secure metrics
// listener's token check (client-go), links no package of vpcip's: the
// daemon takes it through ipamd.MetricsGuard and stays free of client-go.
func TestMetricsGuardStandsAlone(t *testing.T) {
	full := module + "/ipamd/metricsauth"
	deps := goList(t, full)
	if !deps[full] {
		t.Fatalf("go list -deps %s did not list the package itself", full)
	}
	for dep := range deps {
		if dep != full && strings.HasPrefix(dep, module+"/") {
			t.Errorf("ipamd/metricsauth links %s: it must stand alone (docs/design.md §3)", dep)
		}
	}
	for dep := range goList(t, module+"/ipamd") {
		if strings.HasPrefix(dep, "k8s.io/") {
			t.Errorf("the daemon (ipamd) links %s: Kubernetes code reaches it only through its interfaces", dep)
			break
		}
	}
}
