package chart

import (
	"strings"
	"testing"
)

// The AWS VPC CNI chart's values keys that have a vpcip equivalent keep
// their name and shape and take effect.
func TestTemplateUpstreamValuesKeys(t *testing.T) {
	values := `image: {override: "registry.example/vpcip:v9"}
podSecurityContext: {seccompProfile: {type: RuntimeDefault}}
securityContext: {privileged: true, readOnlyRootFilesystem: true}
livenessProbeTimeoutSeconds: 10
readinessProbeTimeoutSeconds: 11
extraVolumes: [{name: extra, emptyDir: {}}]
extraVolumeMounts: [{name: extra, mountPath: /extra}]
podMonitor: {create: true, namespace: monitoring, sampleLimit: 5000}
enableNetworkPolicy: false
enableWindowsIpam: false
originalMatchLabels: false
`
	for _, h := range helms(t) {
		t.Run(h.Name, func(t *testing.T) {
			objs, err := render(t, h, values)
			if err != nil {
				t.Fatal(err)
			}
			ds := find(t, objs, "DaemonSet")
			d := container(t, ds, "vpcipd")
			pm := find(t, objs, "PodMonitor")
			var mounts []string
			list, _ := d["volumeMounts"].([]any)
			for _, m := range list {
				mounts = append(mounts, str(dig(m, "mountPath")))
			}
			checks := []struct {
				what string
				got  any
				want string
			}{
				{"image", d["image"], "registry.example/vpcip:v9"},
				{"install-cni image", container(t, ds, "install-cni")["image"], "registry.example/vpcip:v9"},
				{"pod seccomp", dig(ds, "spec", "template", "spec", "securityContext", "seccompProfile", "type"), "RuntimeDefault"},
				{"container readOnlyRootFilesystem", dig(d, "securityContext", "readOnlyRootFilesystem"), "true"},
				{"liveness timeout", dig(d, "livenessProbe", "timeoutSeconds"), "10"},
				{"liveness period kept", dig(d, "livenessProbe", "periodSeconds"), "10"},
				{"readiness timeout", dig(d, "readinessProbe", "timeoutSeconds"), "11"},
				{"extra mount", strings.Join(mounts, ","), "/extra"},
				{"PodMonitor namespace", dig(pm, "metadata", "namespace"), "monitoring"},
				{"PodMonitor selects the release namespace", dig(pm, "spec", "namespaceSelector", "matchNames", 0), "kube-system"},
				{"PodMonitor sampleLimit", dig(pm, "spec", "sampleLimit"), "5000"},
			}
			for _, c := range checks {
				if got := str(c.got); got != c.want && !(c.what == "extra mount" && strings.HasSuffix(got, ","+c.want)) {
					t.Errorf("%s = %v, want %s", c.what, c.got, c.want)
				}
			}

			objs, err = render(t, h, "image: {overrideRepository: registry.example/mirror/vpcip, tag: v2}")
			if err != nil {
				t.Fatal(err)
			}
			if got := str(container(t, find(t, objs, "DaemonSet"), "vpcipd")["image"]); got != "registry.example/mirror/vpcip:v2" {
				t.Errorf("overrideRepository: image %s", got)
			}
		})
	}
}

// The AWS VPC CNI chart's keys without a vpcip equivalent are refused by the
// schema with a message saying what to do.
func TestTemplateRefusesUpstreamKeys(t *testing.T) {
	tests := []struct{ values, want string }{
		{"init: {env: {DISABLE_TCP_EARLY_DEMUX: \"false\"}}", "move init.env variables to env"},
		{"nodeAgent: {enabled: true}", "run a network policy agent beside vpcip"},
		{"cniConfig: {enabled: false}", "vpcip writes its own conflist"},
		{"image: {region: us-west-2}", "set image.repository"},
		{"image: {account: \"602401143452\"}", "remove image.account"},
		{"livenessProbe: {exec: {command: [/app/grpc-health-probe]}}", "HTTP GETs"},
		{"enableNetworkPolicy: true", "network policy agent"},
		{"enableWindowsIpam: true", "no Windows IPAM"},
		{"warmWindowsIPTarget: 1", "no Windows IPAM"},
		{"branchENICooldown: 60", "no branch ENIs"},
		{"originalMatchLabels: true", "cannot adopt the aws-node DaemonSet"},
	}
	for _, h := range helms(t) {
		t.Run(h.Name, func(t *testing.T) {
			for _, tt := range tests {
				_, err := render(t, h, tt.values)
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Errorf("%s: err = %v, want a refusal saying %q", tt.values, err, tt.want)
				}
			}
		})
	}
}

// An aws-node user's identity carries over: the ServiceAccount named
// aws-node with aws-node's IRSA annotation and labels, bound to the
// ClusterRole and used by the pods; or an existing one used as it is.
func TestTemplateAWSNodeIdentity(t *testing.T) {
	values := `serviceAccount:
  name: aws-node
  annotations: {eks.amazonaws.com/role-arn: "arn:aws:iam::111122223333:role/AmazonEKSVPCCNIRole"}
  labels: {k8s-app: aws-node}
podLabels: {k8s-app: aws-node}
`
	for _, h := range helms(t) {
		t.Run(h.Name, func(t *testing.T) {
			objs, err := render(t, h, values)
			if err != nil {
				t.Fatal(err)
			}
			sa := find(t, objs, "ServiceAccount")
			ds := find(t, objs, "DaemonSet")
			checks := []struct {
				what string
				got  any
				want string
			}{
				{"ServiceAccount name", sa.Name(), "aws-node"},
				{"ServiceAccount namespace", dig(sa, "metadata", "namespace"), "kube-system"},
				{"role annotation", dig(sa, "metadata", "annotations", "eks.amazonaws.com/role-arn"), "arn:aws:iam::111122223333:role/AmazonEKSVPCCNIRole"},
				{"ServiceAccount label", dig(sa, "metadata", "labels", "k8s-app"), "aws-node"},
				{"chart label kept", dig(sa, "metadata", "labels", "app.kubernetes.io/name"), "vpcip"},
				{"pods' ServiceAccount", dig(ds, "spec", "template", "spec", "serviceAccountName"), "aws-node"},
				{"pod label", dig(ds, "spec", "template", "metadata", "labels", "k8s-app"), "aws-node"},
				{"binding subject", dig(find(t, objs, "ClusterRoleBinding"), "subjects", 0, "name"), "aws-node"},
			}
			for _, c := range checks {
				if str(c.got) != c.want {
					t.Errorf("%s = %v, want %s", c.what, c.got, c.want)
				}
			}
			objs, err = render(t, h, "serviceAccount: {create: false, name: aws-node}")
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range objs {
				if o.Kind() == "ServiceAccount" {
					t.Errorf("create: false renders ServiceAccount %s", o.Name())
				}
			}
			if got := str(dig(find(t, objs, "ClusterRoleBinding"), "subjects", 0, "name")); got != "aws-node" {
				t.Errorf("create: false binds %s, want the existing aws-node", got)
			}
		})
	}
}

// The DaemonSet's node affinity is the AWS VPC CNI's: Linux, amd64 or
// arm64, and not Fargate, EKS hybrid or EKS Auto Mode nodes.
func TestTemplateNodeAffinity(t *testing.T) {
	for _, h := range helms(t) {
		t.Run(h.Name, func(t *testing.T) {
			objs, err := render(t, h)
			if err != nil {
				t.Fatal(err)
			}
			terms, _ := dig(find(t, objs, "DaemonSet"), "spec", "template", "spec", "affinity", "nodeAffinity",
				"requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms").([]any)
			if len(terms) != 1 {
				t.Fatalf("%d node selector terms, want 1", len(terms))
			}
			got := map[string]string{}
			exprs, _ := dig(terms[0], "matchExpressions").([]any)
			for _, e := range exprs {
				got[str(dig(e, "key"))] = str(dig(e, "operator")) + " " + strings.Join(strs(dig(e, "values")), ",")
			}
			want := map[string]string{
				"kubernetes.io/os":               "In linux",
				"kubernetes.io/arch":             "In amd64,arm64",
				"eks.amazonaws.com/compute-type": "NotIn fargate,hybrid,auto",
			}
			if len(got) != len(want) {
				t.Errorf("match expressions %v, want %v", got, want)
			}
			for k, v := range want {
				if got[k] != v {
					t.Errorf("%s: %q, want %q", k, got[k], v)
				}
			}
		})
	}
}
