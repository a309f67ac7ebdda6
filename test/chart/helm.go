// Package chart checks charts/vpcip: its env contract against the daemon's
// configuration names, and what Helm 3 and Helm 4 render from it (lint,
// template with default and aws-node-style values, refusals), and applies
// the rendered manifests to a real kube-apiserver with --dry-run=server.
//
// Helm comes from scripts/k8s-tools.sh (helm v3 and helm4 built from the Go
// module proxy); without it the tests skip, unless VPCIP_REQUIRE_KUBE=1.
package chart

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
)

// ChartDir is the chart's directory: charts/vpcip in the nearest directory
// at or above the working directory that holds it (a test runs in its
// package's directory, a command from the repository or below). Found from
// the working directory, not this file's compiled path, which -trimpath
// (make test builds with it) makes module-relative.
func ChartDir() string {
	dir, err := os.Getwd()
	if err != nil {
		return filepath.Join("charts", "vpcip")
	}
	for {
		c := filepath.Join(dir, "charts", "vpcip")
		if _, err := os.Stat(filepath.Join(c, "Chart.yaml")); err == nil {
			return c
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return filepath.Join("charts", "vpcip")
		}
		dir = parent
	}
}

// Helm is one Helm binary: its name ("helm" for v3, "helm4") and path.
type Helm struct {
	Name, Path string
}

// Helms returns the Helm binaries scripts/k8s-tools.sh built: from
// $VPCIP_K8S_BIN, else the newest /var/cache/vpcip/k8s-*/bin holding them.
func Helms() ([]Helm, error) {
	dirs := []string{}
	if d := os.Getenv("VPCIP_K8S_BIN"); d != "" {
		dirs = append(dirs, d)
	}
	matches, _ := filepath.Glob("/var/cache/vpcip/k8s-*/bin/helm4")
	sort.Slice(matches, func(i, j int) bool { return modTime(matches[i]) > modTime(matches[j]) })
	for _, m := range matches {
		dirs = append(dirs, filepath.Dir(m))
	}
	for _, d := range dirs {
		var out []Helm
		for _, name := range []string{"helm", "helm4"} {
			if fi, err := os.Stat(filepath.Join(d, name)); err == nil && !fi.IsDir() {
				out = append(out, Helm{name, filepath.Join(d, name)})
			}
		}
		if len(out) == 2 {
			return out, nil
		}
	}
	return nil, errors.New("helm and helm4 not found (run scripts/k8s-tools.sh, or set VPCIP_K8S_BIN)")
}

func modTime(p string) int64 {
	fi, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return fi.ModTime().UnixNano()
}

// Run runs helm with args in a private HOME (no repositories, no cache
// shared with other runs) and returns stdout, or an error carrying stderr.
func (h Helm) Run(args ...string) ([]byte, error) {
	home, err := os.MkdirTemp("", "vpcip-helm-home-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(home)
	cmd := exec.Command(h.Path, args...)
	cmd.Env = append(os.Environ(), "HOME="+home, "HELM_CACHE_HOME="+home+"/cache",
		"HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%s %s: %v: %s", h.Name, strings.Join(args, " "), err, stderr.String()+stdout.String())
	}
	return stdout.Bytes(), nil
}

// Object is one rendered manifest, decoded generically.
type Object map[string]any

// Kind is the object's kind; Name its metadata.name.
func (o Object) Kind() string { return str(o["kind"]) }
func (o Object) Name() string { return str(dig(o, "metadata", "name")) }

// Decode splits a multi-document YAML stream into objects, skipping empty ones.
func Decode(data []byte) ([]Object, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var out []Object
	for {
		var o map[string]any // not Object: yaml.v3 would decode nested maps as Object too
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if len(o) > 0 {
			out = append(out, Object(o))
		}
	}
}

// dig follows keys (string for maps, int for lists) and returns what is
// there, or nil.
func dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				if o, ok2 := v.(Object); ok2 {
					m = o
				} else {
					return nil
				}
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func str(v any) string {
	if v == nil {
		return ""
	}
	return fmt.Sprint(v)
}
