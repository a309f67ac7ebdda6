package chart

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
)

// capRow is a line of the chart README's capability table:
// | `container` | `CAPABILITY` | why |
var capRow = regexp.MustCompile("^\\|\\s*`([a-z0-9-]+)`\\s*\\|\\s*`([A-Z_]+)`\\s*\\|\\s*(.*?)\\s*\\|\\s*$")

// documentedCaps reads the capability table of the chart README: container
// → capabilities with a justification.
func documentedCaps(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(ChartDir(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, l := range regexp.MustCompile("\r?\n").Split(string(b), -1) {
		if m := capRow.FindStringSubmatch(l); m != nil {
			if len(m[3]) < 20 {
				t.Errorf("README capability row %q: the justification is missing or too short", l)
			}
			out[m[1]] = append(out[m[1]], m[2])
		}
	}
	return out
}

// Every container of the DaemonSet runs unprivileged, without privilege
// escalation, on a read-only root filesystem, under RuntimeDefault seccomp,
// with every capability dropped but those it adds; each added capability
// has its line in the chart README, and the README lists none the chart
// does not add.
func TestContainerCapabilitiesDocumented(t *testing.T) {
	doc := documentedCaps(t)
	for _, h := range helms(t) {
		t.Run(h.Name, func(t *testing.T) {
			objs, err := render(t, h)
			if err != nil {
				t.Fatal(err)
			}
			ds := find(t, objs, "DaemonSet")
			spec := dig(ds, "spec", "template", "spec")
			if got := str(dig(spec, "securityContext", "seccompProfile", "type")); got != "RuntimeDefault" {
				t.Errorf("pod seccompProfile %q, want RuntimeDefault", got)
			}
			var all []any
			for _, k := range []string{"initContainers", "containers"} {
				l, _ := dig(spec, k).([]any)
				all = append(all, l...)
			}
			rendered := map[string][]string{}
			for _, c := range all {
				name := str(dig(c, "name"))
				sc := dig(c, "securityContext")
				if str(dig(sc, "privileged")) == "true" {
					t.Errorf("container %s is privileged", name)
				}
				if str(dig(sc, "allowPrivilegeEscalation")) != "false" {
					t.Errorf("container %s: allowPrivilegeEscalation is not false", name)
				}
				if str(dig(sc, "readOnlyRootFilesystem")) != "true" {
					t.Errorf("container %s: root filesystem is not read-only", name)
				}
				if seccomp := str(dig(sc, "seccompProfile", "type")); seccomp != "" && seccomp != "RuntimeDefault" {
					t.Errorf("container %s: seccompProfile %s overrides the pod's RuntimeDefault", name, seccomp)
				}
				if !slices.Contains(strs(dig(sc, "capabilities", "drop")), "ALL") {
					t.Errorf("container %s does not drop ALL capabilities: it would keep the runtime's default set", name)
				}
				caps := strs(dig(sc, "capabilities", "add"))
				rendered[name] = caps
				t.Logf("container %s: capabilities %v", name, caps)
				for _, cp := range caps {
					if !slices.Contains(doc[name], cp) {
						t.Errorf("container %s adds %s without a line in charts/vpcip/README.md's capability table", name, cp)
					}
				}
			}
			for name, caps := range doc {
				for _, cp := range caps {
					if !slices.Contains(rendered[name], cp) {
						t.Errorf("README documents %s for container %s, which the chart does not add", cp, name)
					}
				}
			}
		})
	}
}
