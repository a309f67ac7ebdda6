package deps

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestKubernetesToolsShareVpcipsModules checks that tools/k8s (the module the
// test clusters' kube-apiserver, kubelet, kubectl and Helm are built from, by
// scripts/k8s-tools.sh) requires the same version of every module whose
// packages vpcip compiles. Both are built with CGO_ENABLED=0 and -trimpath, so
// with equal versions client-go, k8s.io/api, gRPC and the rest are compiled
// once on a fresh machine; one differing module (say golang.org/x/net)
// recompiles everything above it, minutes of a cold `make test`. The same
// holds for tools/gotestsum (scripts/gotestsum.sh) and its golang.org/x
// modules.
func TestKubernetesToolsShareVpcipsModules(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{with .Module}}{{.Path}} {{.Version}}{{end}}", module+"/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	ours := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if path, version, ok := strings.Cut(strings.TrimSpace(line), " "); ok && version != "" {
			ours[path] = version
		}
	}
	for _, tc := range []struct {
		dir                    string
		minRequires, minShared int
	}{
		{"k8s", 50, 20},      // client-go, k8s.io/api, gRPC and more
		{"gotestsum", 10, 3}, // golang.org/x/sys, sync, term, text
	} {
		t.Run(tc.dir, func(t *testing.T) {
			tools := toolsModuleVersions(t, filepath.Join("..", "..", "tools", tc.dir, "go.mod"))
			if len(tools) < tc.minRequires {
				t.Fatalf("read only %d requirements from tools/%s/go.mod", len(tools), tc.dir)
			}
			shared := 0
			for path, version := range ours {
				toolVersion, ok := tools[path]
				if !ok {
					continue
				}
				shared++
				if toolVersion != version {
					t.Errorf("%s: vpcip builds %s, tools/%s requires %s: align them (go get %s@<the higher> in both modules)", path, version, tc.dir, toolVersion, path)
				}
			}
			if shared < tc.minShared {
				t.Fatalf("only %d modules shared with tools/%s, expected at least %d", shared, tc.dir, tc.minShared)
			}
		})
	}
}

// toolsModuleVersions reads a go.mod's require and replace directives:
// module path to the version built (a replace with a version wins).
func toolsModuleVersions(t *testing.T, gomod string) map[string]string {
	t.Helper()
	f, err := os.Open(gomod)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	required, replaced := map[string]string{}, map[string]string{}
	directive := func(kind string, fields []string) {
		switch {
		case kind == "require" && len(fields) == 2:
			required[fields[0]] = fields[1]
		case kind == "replace" && len(fields) >= 4 && fields[len(fields)-3] == "=>" && fields[0] == fields[len(fields)-2]:
			replaced[fields[0]] = fields[len(fields)-1]
		}
	}
	block := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "//")
		fields := strings.Fields(line)
		switch {
		case len(fields) == 0:
		case fields[0] == ")":
			block = ""
		case len(fields) == 2 && fields[1] == "(":
			block = fields[0]
		case block != "":
			directive(block, fields)
		default:
			directive(fields[0], fields[1:])
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	for path, version := range replaced {
		required[path] = version
	}
	return required
}
