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
