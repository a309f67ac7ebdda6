package provider_test

import (
	"os/exec"
	"strings"
	"testing"
)

// goList returns the non-standard-library packages pkgs depend on.
func goList(t *testing.T, pkgs ...string) []string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go command not found")
	}
	args := append([]string{"list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}"}, pkgs...)
	out, err := exec.Command("go", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	return strings.Fields(string(out))
}

// TestProviderImportsStandardLibraryOnly pins design rule §3: provider
// depends on the standard library alone.
func TestProviderImportsStandardLibraryOnly(t *testing.T) {
	for _, dep := range goList(t, ".") {
		if dep != "github.com/vpcip/vpcip/provider" {
			t.Errorf("provider depends on %s", dep)
		}
	}
}

// TestOnlyAWSBackendImportsSDK: the contract suite stays cloud-neutral.
func TestOnlyAWSBackendImportsSDK(t *testing.T) {
	for _, dep := range goList(t, "./providertest") {
		if strings.HasPrefix(dep, "github.com/aws/") {
			t.Errorf("providertest depends on %s", dep)
		}
	}
}
