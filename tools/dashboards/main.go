// Command dashboards generates vpcip's Grafana dashboards (Fleet capacity,
// Node detail) as JSON with grafana-foundation-sdk, into the chart's
// files/dashboards, where the chart ships them as ConfigMaps for Grafana's
// dashboard sidecar. It is a module of its own so that the project's go.mod
// never requires the SDK: the dashboards are build output, not code any
// binary links. test/monitoring evaluates every panel's query against a real
// Prometheus scraping real daemons.
//
// Usage (from the repository root: make dashboards):
//
//	go run . -out ../../charts/vpcip/files/dashboards          write the JSON
//	go run . -out ../../charts/vpcip/files/dashboards -check   fail if it differs
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

func main() {
	out := flag.String("out", "../../charts/vpcip/files/dashboards", "directory for the JSON files")
	check := flag.Bool("check", false, "compare with the files in -out instead of writing them")
	flag.Parse()
	if err := run(*out, *check); err != nil {
		fmt.Fprintln(os.Stderr, "dashboards:", err)
		os.Exit(1)
	}
}

func run(dir string, check bool) error {
	all := map[string]*dashboard.DashboardBuilder{
		"vpcip-fleet.json": fleet(),
		"vpcip-node.json":  node(),
	}
	if !check {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	for name, b := range all {
		d, err := b.Build()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		js, err := json.MarshalIndent(d, "", "  ")
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		js = append(js, '\n')
		path := filepath.Join(dir, name)
		if check {
			have, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if !bytes.Equal(have, js) {
				return fmt.Errorf("%s differs from the generator's output: run make dashboards and commit it", path)
			}
			continue
		}
		if err := os.WriteFile(path, js, 0o644); err != nil {
			return err
		}
	}
	return nil
}
