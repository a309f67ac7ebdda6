package main

import (
	"context"
	"fmt"
	"io"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/vpcip/vpcip/ipamd/addressbudget"
)

// clusterFlags select the cluster for `capacity --cluster`, as kubectl does.
type clusterFlags struct {
	kubeconfig string // --kubeconfig; else $KUBECONFIG, else ~/.kube/config
	context    string // --context; else the kubeconfig's current context
}

// readBudgets lists every node's AddressBudget (vpcip.io/v1alpha1) through
// the user's kubeconfig, with clientcmd's loading rules: the identity needs
// only get/list on addressbudgets.
func readBudgets(ctx context.Context, cf clusterFlags) ([]addressbudget.AddressBudget, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = cf.kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: cf.context}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	budgets, err := addressbudget.NewClient(dyn).List(ctx)
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("the cluster at %s serves no AddressBudgets: is vpcip's chart (its CRD) installed? %w", cfg.Host, err)
	}
	if err != nil {
		return nil, fmt.Errorf("list AddressBudgets at %s: %w", cfg.Host, err)
	}
	return budgets, nil
}

// writeFleetAs prints the fleet as a table, JSON or YAML.
func writeFleetAs(w io.Writer, f fleet, output string) error {
	switch output {
	case "json":
		return writeJSON(w, f)
	case "yaml":
		b, err := yaml.Marshal(f)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	default:
		return writeFleet(w, f)
	}
}

// runCluster is `capacity --cluster`: the fleet from the API server.
func runCluster(ctx context.Context, cf clusterFlags, output string, stdout, stderr io.Writer) int {
	if output != "table" && output != "json" && output != "yaml" {
		fmt.Fprintf(stderr, "vpcipctl: -o %q: want table, json or yaml\n", output)
		return exitUsage
	}
	budgets, err := readBudgets(ctx, cf)
	if err != nil {
		fmt.Fprintf(stderr, "vpcipctl: %v\n", err)
		return exitFail
	}
	if err := writeFleetAs(stdout, fleetOf(budgets), output); err != nil {
		fmt.Fprintf(stderr, "vpcipctl: %v\n", err)
		return exitFail
	}
	return exitOK
}

// pluginArgs maps `kubectl vpcip <args>` (this binary installed as
// kubectl-vpcip): capacity there is the cluster's, since kubectl runs on an
// operator's machine, not on a node.
func pluginArgs(args []string) []string {
	if len(args) > 0 && args[0] == "capacity" {
		return append([]string{"capacity", "--cluster"}, args[1:]...)
	}
	return args
}
