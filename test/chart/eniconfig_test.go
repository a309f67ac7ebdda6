package chart

import (
	"slices"
	"strings"
	"testing"
)

// eniConfigValues are custom-networking values as an AWS VPC CNI chart user
// writes them: one ENIConfig per zone.
const eniConfigValues = `env:
  AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG: "true"
  ENI_CONFIG_LABEL_DEF: topology.kubernetes.io/zone
eniConfig:
  create: true
  region: us-west-2
  subnets:
    us-west-2a:
      id: subnet-0123456789abcdef0
      securityGroups: [sg-0123456789abcdef0, sg-0fedcba9876543210]
    us-west-2b:
      id: subnet-0fedcba9876543210
`

// eniConfig values create one ENIConfig (crd.k8s.amazonaws.com/v1alpha1,
// cluster-scoped) per key with its subnet and groups, none by default; a
// subnet without id, a malformed id or an unknown key is refused.
func TestTemplateENIConfigs(t *testing.T) {
	for _, h := range helms(t) {
		t.Run(h.Name, func(t *testing.T) {
			objs, err := render(t, h, eniConfigValues)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, o := range objs {
				if o.Kind() != "ENIConfig" {
					continue
				}
				if str(o["apiVersion"]) != "crd.k8s.amazonaws.com/v1alpha1" || dig(o, "metadata", "namespace") != nil {
					t.Errorf("ENIConfig %s: apiVersion %v, namespace %v; want crd.k8s.amazonaws.com/v1alpha1, cluster-scoped", o.Name(), o["apiVersion"], dig(o, "metadata", "namespace"))
				}
				got[o.Name()] = str(dig(o, "spec", "subnet")) + " " + strings.Join(strs(dig(o, "spec", "securityGroups")), ",")
			}
			want := map[string]string{
				"us-west-2a": "subnet-0123456789abcdef0 sg-0123456789abcdef0,sg-0fedcba9876543210",
				"us-west-2b": "subnet-0fedcba9876543210 ",
			}
			if len(got) != len(want) || got["us-west-2a"] != want["us-west-2a"] || got["us-west-2b"] != want["us-west-2b"] {
				t.Errorf("ENIConfigs %q, want %q", got, want)
			}
			env, _ := envOf(container(t, find(t, objs, "DaemonSet"), "vpcipd"))
			if env["AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG"] != "true" || env["ENI_CONFIG_LABEL_DEF"] != "topology.kubernetes.io/zone" {
				t.Errorf("custom networking settings not passed to vpcipd: %v", env)
			}

			objs, err = render(t, h)
			if err != nil {
				t.Fatal(err)
			}
			if slices.ContainsFunc(objs, func(o Object) bool { return o.Kind() == "ENIConfig" }) {
				t.Error("default values render an ENIConfig")
			}
			for _, bad := range []struct{ values, want string }{
				{"eniConfig: {create: true, subnets: {us-west-2a: {securityGroups: [sg-1]}}}", "id"},
				{"eniConfig: {create: true, subnets: {us-west-2a: {id: sn-1}}}", "id"},
				{"eniConfig: {create: true, subnets: {us-west-2a: {id: subnet-1, groups: [sg-1]}}}", "groups"},
				{"eniConfig: {create: true, subnets: {us-west-2a: {id: subnet-1, securityGroups: [default]}}}", "securityGroups"},
			} {
				if _, err := render(t, h, bad.values); err == nil || !strings.Contains(err.Error(), bad.want) {
					t.Errorf("%s: err = %v, want a refusal naming %s", bad.values, err, bad.want)
				}
			}
		})
	}
}
