package chart

import (
	"slices"
	"testing"
)

// With the shared EC2 budget (VPCIP_EC2_BUDGET=fleet) the chart gives the
// daemons' Lease requests a FlowSchema of their own, matched before the API
// server's default system-leader-election (precedence 100, which takes every
// Lease get, create and update of a kube-system ServiceAccount into the
// control plane's leader-election level): the release's ServiceAccount, the
// Leases' namespace (VPCIP_NAMESPACE, default kube-system), and a priority
// level of its own. Without the budget, or with ec2BudgetFlowControl.create
// false, neither object renders.
func TestTemplateEC2BudgetFlowControl(t *testing.T) {
	for _, h := range helms(t) {
		t.Run(h.Name, func(t *testing.T) {
			for _, c := range []struct {
				values, leaseNamespace string
			}{
				{"env: {VPCIP_EC2_BUDGET: fleet}", "kube-system"},
				{"env: {VPCIP_EC2_BUDGET: fleet, VPCIP_NAMESPACE: vpcip-budget}", "vpcip-budget"},
				// vpcipd reads the value trimmed and in any case.
				{"env: {VPCIP_EC2_BUDGET: ' Fleet', VPCIP_NAMESPACE: ' vpcip-budget '}", "vpcip-budget"},
			} {
				objs, err := render(t, h, c.values)
				if err != nil {
					t.Fatalf("%s: %v", c.values, err)
				}
				fs, plc := findNamed(objs, "FlowSchema", "vpcip-ec2-budget"), findNamed(objs, "PriorityLevelConfiguration", "vpcip-ec2-budget")
				if fs == nil || plc == nil {
					t.Fatalf("%s: FlowSchema %v, PriorityLevelConfiguration %v; want both named vpcip-ec2-budget", c.values, fs != nil, plc != nil)
				}
				if p, ok := dig(fs, "spec", "matchingPrecedence").(int); !ok || p <= 2 || p >= 100 {
					t.Errorf("%s: matchingPrecedence %v, want above the exempt schemas' (1, 2) and below system-leader-election's 100", c.values, dig(fs, "spec", "matchingPrecedence"))
				}
				if got := str(dig(fs, "spec", "priorityLevelConfiguration", "name")); got != "vpcip-ec2-budget" {
					t.Errorf("%s: FlowSchema's priority level %q", c.values, got)
				}
				rule := dig(fs, "spec", "rules", 0)
				sa := dig(rule, "subjects", 0, "serviceAccount")
				if str(dig(sa, "name")) != "vpcip" || str(dig(sa, "namespace")) != "kube-system" {
					t.Errorf("%s: subject %v, want the release's ServiceAccount kube-system/vpcip", c.values, sa)
				}
				rr := dig(rule, "resourceRules", 0)
				if !slices.Equal(strs(dig(rr, "resources")), []string{"leases"}) || !slices.Equal(strs(dig(rr, "namespaces")), []string{c.leaseNamespace}) ||
					!slices.Equal(strs(dig(rr, "verbs")), []string{"get", "create", "update"}) {
					t.Errorf("%s: resource rule %v, want get, create, update of leases in %s", c.values, rr, c.leaseNamespace)
				}
				if got := str(dig(plc, "spec", "type")); got != "Limited" {
					t.Errorf("%s: priority level type %q, want Limited", c.values, got)
				}
			}
			for _, values := range []string{"{}", "env: {VPCIP_EC2_BUDGET: node}", "{env: {VPCIP_EC2_BUDGET: fleet}, ec2BudgetFlowControl: {create: false}}"} {
				objs, err := render(t, h, values)
				if err != nil {
					t.Fatalf("%s: %v", values, err)
				}
				for _, o := range objs {
					if o.Kind() == "FlowSchema" || o.Kind() == "PriorityLevelConfiguration" {
						t.Errorf("%s renders %s %s", values, o.Kind(), o.Name())
					}
				}
			}
		})
	}
}
