package chart

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/vpcip/vpcip/ipamd/config"
)

// envRules is charts/vpcip/files/env.yaml.
type envRules struct {
	Supported  []string          `yaml:"supported"`
	SDK        []string          `yaml:"sdk"`
	ChartOwned map[string]string `yaml:"chartOwned"`
	AWSOnly    map[string]struct {
		Accept  []string `yaml:"accept"`
		Any     bool     `yaml:"any"`
		SameAs  string   `yaml:"sameAs"`
		Default string   `yaml:"default"`
		Why     string   `yaml:"why"`
	} `yaml:"awsOnly"`
	Mapped map[string]struct {
		To  []string `yaml:"to"`
		Why string   `yaml:"why"`
	} `yaml:"mapped"`
}

func readRules(t *testing.T) envRules {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(ChartDir(), "files", "env.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var r envRules
	if err := yaml.Unmarshal(data, &r); err != nil {
		t.Fatalf("files/env.yaml: %v", err)
	}
	return r
}

// The chart passes on exactly the variables the daemon reads: a setting added
// to ipamd/config without the chart (or the reverse) fails here.
func TestEnvNamesAreTheDaemons(t *testing.T) {
	r := readRules(t)
	got := slices.Sorted(slices.Values(r.Supported))
	want := config.Names()
	if !slices.Equal(got, want) {
		for _, n := range want {
			if !slices.Contains(got, n) {
				t.Errorf("the daemon reads %s; files/env.yaml does not list it as supported", n)
			}
		}
		for _, n := range got {
			if !slices.Contains(want, n) {
				t.Errorf("files/env.yaml lists %s as supported; the daemon does not read it", n)
			}
		}
	}
	if got, want := slices.Sorted(slices.Values(r.SDK)), slices.Sorted(slices.Values(config.SDKNames)); !slices.Equal(got, want) {
		t.Errorf("files/env.yaml sdk %v, want the daemon's SDK names %v", got, want)
	}
	for n, why := range r.ChartOwned {
		if !slices.Contains(want, n) {
			t.Errorf("chartOwned %s is not a daemon setting", n)
		}
		if why == "" {
			t.Errorf("chartOwned %s has no explanation", n)
		}
	}
	for n, rule := range r.AWSOnly {
		if slices.Contains(want, n) || slices.Contains(config.SDKNames, n) {
			t.Errorf("awsOnly %s is read by the daemon now: move it to supported", n)
		}
		if rule.Why == "" || (!rule.Any && len(rule.Accept) == 0 && rule.SameAs == "") {
			t.Errorf("awsOnly %s: needs why and accept (or any, or sameAs)", n)
		}
		if rule.SameAs != "" && !slices.Contains(want, rule.SameAs) {
			t.Errorf("awsOnly %s: sameAs %s is not a daemon setting", n, rule.SameAs)
		}
	}
	for n, m := range r.Mapped {
		if slices.Contains(want, n) || r.AWSOnly[n].Why != "" {
			t.Errorf("mapped %s is also supported or awsOnly", n)
		}
		if m.Why == "" || len(m.To) == 0 {
			t.Errorf("mapped %s: needs to and why", n)
		}
	}
}

func helms(t *testing.T) []Helm {
	t.Helper()
	hs, err := Helms()
	if err != nil {
		if os.Getenv("VPCIP_REQUIRE_KUBE") == "1" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	return hs
}

// render runs helm template with values files written from the given YAML
// documents (and --set arguments) and returns the objects.
func render(t *testing.T, h Helm, values ...string) ([]Object, error) {
	t.Helper()
	args := []string{"template", "vpcip", ChartDir(), "--namespace", "kube-system"}
	for i, v := range values {
		if strings.HasPrefix(v, "--") {
			args = append(args, v)
			continue
		}
		p := filepath.Join(t.TempDir(), "values"+string(rune('a'+i))+".yaml")
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, "-f", p)
	}
	out, err := h.Run(args...)
	if err != nil {
		return nil, err
	}
	return Decode(out)
}

func find(t *testing.T, objs []Object, kind string) Object {
	t.Helper()
	for _, o := range objs {
		if o.Kind() == kind {
			return o
		}
	}
	t.Fatalf("no %s rendered", kind)
	return nil
}

func container(t *testing.T, ds Object, name string) map[string]any {
	t.Helper()
	cs, _ := dig(ds, "spec", "template", "spec", "containers").([]any)
	for _, c := range cs {
		if m, _ := c.(map[string]any); str(m["name"]) == name {
			return m
		}
	}
	t.Fatalf("DaemonSet has no container %s", name)
	return nil
}

// envOf returns a container's plain env values by name, and the names set
// from a fieldRef.
func envOf(c map[string]any) (values map[string]string, fieldRefs map[string]string) {
	values, fieldRefs = map[string]string{}, map[string]string{}
	list, _ := c["env"].([]any)
	for _, e := range list {
		m := e.(map[string]any)
		if ref := str(dig(m, "valueFrom", "fieldRef", "fieldPath")); ref != "" {
			fieldRefs[str(m["name"])] = ref
			continue
		}
		values[str(m["name"])] = str(m["value"])
	}
	return values, fieldRefs
}

func TestLint(t *testing.T) {
	for _, h := range helms(t) {
		t.Run(h.Name, func(t *testing.T) {
			if out, err := h.Run("lint", "--strict", ChartDir()); err != nil {
				t.Errorf("default values: %v\n%s", err, out)
			}
			for _, rv := range releaseValues {
				args := []string{"lint", "--strict", ChartDir()}
				for _, f := range rv.files {
					p, err := filepath.Abs(filepath.Join("testdata", f))
					if err != nil {
						t.Fatal(err)
					}
					args = append(args, "-f", p)
				}
				if out, err := h.Run(args...); err != nil {
					t.Errorf("%s: %v\n%s", rv.name, err, out)
				}
			}
		})
	}
}

// The default render: the DaemonSet as the issue specifies it, RBAC tied to
// its ServiceAccount and its two admission policies with their bindings, no
// monitoring objects.
func TestTemplateDefault(t *testing.T) {
	for _, h := range helms(t) {
		t.Run(h.Name, func(t *testing.T) {
			objs, err := render(t, h)
			if err != nil {
				t.Fatal(err)
			}
			var kinds []string
			for _, o := range objs {
				kinds = append(kinds, o.Kind())
			}
			slices.Sort(kinds)
			if want := []string{"ClusterRole", "ClusterRoleBinding", "DaemonSet", "ServiceAccount",
				"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ValidatingAdmissionPolicyBinding"}; !slices.Equal(kinds, want) {
				t.Errorf("kinds %v, want %v", kinds, want)
			}
			ds := find(t, objs, "DaemonSet")
			spec := dig(ds, "spec", "template", "spec")
			checks := []struct {
				what string
				got  any
				want string
			}{
				{"hostNetwork", dig(spec, "hostNetwork"), "true"},
				{"priorityClassName", dig(spec, "priorityClassName"), "system-node-critical"},
				{"toleration", dig(spec, "tolerations", 0, "operator"), "Exists"},
				{"maxUnavailable", dig(ds, "spec", "updateStrategy", "rollingUpdate", "maxUnavailable"), "10%"},
				{"namespace", dig(ds, "metadata", "namespace"), "kube-system"},
				{"serviceAccount", dig(spec, "serviceAccountName"), "vpcip"},
				{"privileged", dig(container(t, ds, "vpcipd"), "securityContext", "privileged"), "false"},
				{"seccomp", dig(spec, "securityContext", "seccompProfile", "type"), "RuntimeDefault"},
				{"liveness path", dig(container(t, ds, "vpcipd"), "livenessProbe", "httpGet", "path"), "/livez"},
				{"liveness host", dig(container(t, ds, "vpcipd"), "livenessProbe", "httpGet", "host"), "127.0.0.1"},
				{"liveness port", dig(container(t, ds, "vpcipd"), "livenessProbe", "httpGet", "port"), "61679"},
				{"readiness path", dig(container(t, ds, "vpcipd"), "readinessProbe", "httpGet", "path"), "/healthz"},
				{"metrics port", dig(container(t, ds, "vpcipd"), "ports", 0, "containerPort"), "61678"},
				{"install-cni", strings.Join(strs(container(t, ds, "install-cni")["command"]), " "), "/usr/local/bin/vpcipd install-cni -stay"},
				{"install-cni caps", dig(container(t, ds, "install-cni"), "securityContext", "capabilities", "drop", 0), "ALL"},
				{"image", dig(container(t, ds, "vpcipd"), "image"), "localhost/vpcip/vpcip:0.1.0"},
				{"binding subject", dig(find(t, objs, "ClusterRoleBinding"), "subjects", 0, "name"), "vpcip"},
				{"binding role", dig(find(t, objs, "ClusterRoleBinding"), "roleRef", "name"), find(t, objs, "ClusterRole").Name()},
			}
			for _, c := range checks {
				if str(c.got) != c.want {
					t.Errorf("%s = %v, want %s", c.what, c.got, c.want)
				}
			}
			_, refs := envOf(container(t, ds, "vpcipd"))
			if refs["MY_NODE_NAME"] != "spec.nodeName" {
				t.Errorf("MY_NODE_NAME from %q, want the downward API's spec.nodeName", refs["MY_NODE_NAME"])
			}
			hostPaths := map[string]bool{}
			vols, _ := dig(spec, "volumes").([]any)
			for _, v := range vols {
				hostPaths[str(dig(v, "hostPath", "path"))] = true
			}
			for _, p := range []string{"/opt/cni/bin", "/etc/cni/net.d", "/run/vpcip", "/var/run/vpcip", "/var/log/vpcip", "/var/log/aws-routed-eni", "/run/xtables.lock"} {
				if !hostPaths[p] {
					t.Errorf("no hostPath volume for %s (have %v)", p, hostPaths)
				}
			}
		})
	}
}

func strs(v any) []string {
	l, _ := v.([]any)
	out := make([]string, len(l))
	for i, x := range l {
		out[i] = str(x)
	}
	return out
}

// Values the chart must refuse, each failing with the offending name.
func TestTemplateRefuses(t *testing.T) {
	tests := []struct {
		name, values, want string
	}{
		{"dual stack", "env: {ENABLE_IPv6: \"true\", ENABLE_PREFIX_DELEGATION: \"true\"}", "dual stack is not supported"},
		{"IPv6 without prefixes", "env: {ENABLE_IPv6: \"true\", ENABLE_IPv4: \"false\"}", "ENABLE_PREFIX_DELEGATION"},
		{"IPv6 with prefixes off", "env: {ENABLE_IPv6: true, ENABLE_IPv4: false, ENABLE_PREFIX_DELEGATION: false}", "ENABLE_PREFIX_DELEGATION=\"false\""},
		{"IPv4 turned off", "env: {ENABLE_IPv4: \"false\"}", "ENABLE_IPv4"},
		{"IPv4 turned off and IPv6 false", "env: {ENABLE_IPv4: \"false\", ENABLE_IPv6: \"false\", ENABLE_PREFIX_DELEGATION: \"true\"}", "ENABLE_IPv4"},
		{"IPv6 not a boolean", "env: {ENABLE_IPv6: \"yes\"}", "ENABLE_IPv6"},
		{"pod IP annotations asked for", "env: {ANNOTATE_POD_IP: \"true\"}", "ANNOTATE_POD_IP"},
		{"pod ENIs asked for", "env: {ENABLE_POD_ENI: true}", "ENABLE_POD_ENI"},
		{"multi-NIC asked for", "env: {ENABLE_MULTI_NIC: \"true\"}", "ENABLE_MULTI_NIC"},
		{"pod MTU other than the ENI's", "env: {POD_MTU: \"1500\"}", "POD_MTU"},
		{"pod MTU other than a set ENI MTU", "env: {AWS_VPC_ENI_MTU: \"1500\", POD_MTU: \"9001\"}", "POD_MTU"},
		{"daemon log file outside the mounted log dirs", "env: {AWS_VPC_K8S_CNI_LOG_FILE: /tmp/ipamd.log}", "AWS_VPC_K8S_CNI_LOG_FILE"},
		{"plugin log to stdout", "env: {AWS_VPC_K8S_PLUGIN_LOG_FILE: stdout}", "AWS_VPC_K8S_PLUGIN_LOG_FILE"},
		{"cluster endpoint not https", "env: {CLUSTER_ENDPOINT: \"http://10.0.0.1\"}", "CLUSTER_ENDPOINT"},
		{"mapped and target both set", "env: {AWS_EC2_ENDPOINT: https://a, AWS_ENDPOINT_URL_EC2: https://b}", "AWS_ENDPOINT_URL_EC2"},
		{"misspelt key", "env: {WARM_IP_TARGETS: \"5\"}", "WARM_IP_TARGETS"},
		{"chart-owned key", "env: {MY_NODE_NAME: node1}", "MY_NODE_NAME"},
		{"socket moved", "env: {VPCIP_SOCKET: /tmp/x.sock}", "VPCIP_SOCKET"},
		{"introspection off", "env: {VPCIP_INTROSPECTION_ADDR: \"off\"}", "VPCIP_INTROSPECTION_ADDR"},
		{"metrics off with a PodMonitor", "env: {VPCIP_METRICS_ADDR: \"off\"}\npodMonitor: {enabled: true}", "VPCIP_METRICS_ADDR"},
		{"GC grace below the daemon's floor", "env: {VPCIP_GC_GRACE: 5s}", "VPCIP_GC_GRACE"},
		{"secure metrics with metrics off", "env: {VPCIP_METRICS_ADDR: \"off\"}\nmetrics: {secure: true}", "VPCIP_METRICS_ADDR is off"},
		{"node address bind with metrics off", "env: {VPCIP_METRICS_ADDR: \"off\"}\nmetrics: {bindNodeAddress: true}", "VPCIP_METRICS_ADDR is off"},
		{"node address bind with an address in env", "env: {VPCIP_METRICS_ADDR: \"10.0.0.1:9\"}\nmetrics: {bindNodeAddress: true}", "metrics.bindNodeAddress"},
		{"metrics certificate without secure", "metrics: {tlsSecretName: x}", "metrics.tlsSecretName"},
		{"secure set through env", "env: {VPCIP_METRICS_SECURE: \"true\"}", "VPCIP_METRICS_SECURE"},
		{"secure PodMonitor elsewhere without a token Secret", "metrics: {secure: true}\npodMonitor: {enabled: true, namespace: monitoring}", "metrics.scrapeTokenSecret.name"},
		{"secure monitors without RBAC or a token Secret", "metrics: {secure: true}\nserviceMonitor: {enabled: true}\nrbac: {create: false}", "metrics.scrapeTokenSecret.name"},
		{"unknown metrics key", "metrics: {auth: true}", "auth"},
		{"unknown top-level key", "warmTarget: 3", "warmTarget"},
		{"env value of wrong type", "env: {WARM_IP_TARGET: [5]}", "WARM_IP_TARGET"},
		{"tolerations of wrong type", "tolerations: everything", "tolerations"},
		{"unknown image key", "image: {region: us-west-2}", "region"},
		{"pull policy", "image: {pullPolicy: Sometimes}", "pullPolicy"},
		{"relative CNI dir", "cni: {binDir: opt/cni/bin}", "binDir"},
	}
	for _, h := range helms(t) {
		t.Run(h.Name, func(t *testing.T) {
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					_, err := render(t, h, tt.values)
					if err == nil {
						t.Fatalf("rendered %q; want a failure naming %s", tt.values, tt.want)
					}
					if !strings.Contains(err.Error(), tt.want) {
						t.Errorf("error does not name %s:\n%v", tt.want, err)
					}
				})
			}
		})
	}
}

// The IPv6 mode, in the one combination vpcipd runs (ENABLE_IPv6=true,
// ENABLE_IPv4=false, ENABLE_PREFIX_DELEGATION=true, as booleans or strings,
// with IPv4 egress on or off), renders and reaches vpcipd and the
// install-cni init container as given (install-cni writes enableV4Egress
// from ENABLE_V4_EGRESS).
func TestTemplateIPv6Mode(t *testing.T) {
	for _, h := range helms(t) {
		t.Run(h.Name, func(t *testing.T) {
			for _, values := range []string{
				"env: {ENABLE_IPv6: \"true\", ENABLE_IPv4: \"false\", ENABLE_PREFIX_DELEGATION: \"true\"}",
				"env: {ENABLE_IPv6: true, ENABLE_IPv4: false, ENABLE_PREFIX_DELEGATION: true, ENABLE_V4_EGRESS: false}",
			} {
				objs, err := render(t, h, values)
				if err != nil {
					t.Fatalf("%s: %v", values, err)
				}
				ds := find(t, objs, "DaemonSet")
				for _, c := range []Object{container(t, ds, "vpcipd"), container(t, ds, "install-cni")} {
					env, _ := envOf(c)
					want := map[string]string{"ENABLE_IPv6": "true", "ENABLE_IPv4": "false", "ENABLE_PREFIX_DELEGATION": "true"}
					if strings.Contains(values, "V4_EGRESS") {
						want["ENABLE_V4_EGRESS"] = "false"
					}
					for k, v := range want {
						if env[k] != v {
							t.Errorf("%s: %s %s=%q, want %q", values, str(c["name"]), k, env[k], v)
						}
					}
				}
			}
		})
	}
}

// Every daemon setting the chart does not own reaches the containers as given,
// numbers and booleans as strings; moved listen addresses move the probes and
// the metrics port.
func TestTemplateEverySetting(t *testing.T) {
	r := readRules(t)
	var b strings.Builder
	b.WriteString("env:\n")
	want := map[string]string{}
	for _, v := range config.Vars {
		if _, owned := r.ChartOwned[v.Name]; owned {
			continue
		}
		value := v.Example
		switch v.Name {
		case "VPCIP_INTROSPECTION_ADDR":
			value = "0.0.0.0:7001"
		case "VPCIP_METRICS_ADDR":
			value = "127.0.0.1:7002"
		}
		want[v.Name] = value
		fmt.Fprintf(&b, "  %s: %q\n", v.Name, value)
	}
	for _, n := range config.SDKNames {
		want[n] = "sdk-" + n
		fmt.Fprintf(&b, "  %s: %q\n", n, want[n])
	}
	for _, h := range helms(t) {
		t.Run(h.Name, func(t *testing.T) {
			objs, err := render(t, h, b.String())
			if err != nil {
				t.Fatal(err)
			}
			ds := find(t, objs, "DaemonSet")
			d := container(t, ds, "vpcipd")
			env, _ := envOf(d)
			for n, v := range want {
				if env[n] != v {
					t.Errorf("%s = %q, want %q", n, env[n], v)
				}
			}
			if got := str(dig(d, "livenessProbe", "httpGet", "port")); got != "7001" {
				t.Errorf("liveness port %s, want 7001 (from VPCIP_INTROSPECTION_ADDR)", got)
			}
			if got := str(dig(d, "ports", 0, "containerPort")); got != "7002" {
				t.Errorf("metrics port %s, want 7002", got)
			}
		})
	}
}

func TestTemplateMonitoring(t *testing.T) {
	for _, h := range helms(t) {
		t.Run(h.Name, func(t *testing.T) {
			objs, err := render(t, h, "podMonitor: {enabled: true}\nserviceMonitor: {enabled: true, interval: 15s}\nprometheusRule: {enabled: true}\ndashboards: {enabled: true}")
			if err != nil {
				t.Fatal(err)
			}
			pm := find(t, objs, "PodMonitor")
			if got := str(dig(pm, "spec", "podMetricsEndpoints", 0, "port")); got != "metrics" {
				t.Errorf("PodMonitor port %q", got)
			}
			sm := find(t, objs, "ServiceMonitor")
			if got := str(dig(sm, "spec", "endpoints", 0, "interval")); got != "15s" {
				t.Errorf("ServiceMonitor interval %q", got)
			}
			if got := str(dig(pm, "spec", "podMetricsEndpoints", 0, "relabelings", 0, "targetLabel")); got != "node" {
				t.Errorf("PodMonitor relabels to %q, want node (the rules group by it)", got)
			}
			rule := find(t, objs, "PrometheusRule")
			if got := str(dig(rule, "spec", "groups", 0, "rules", 0, "alert")); !strings.HasPrefix(got, "Vpcip") {
				t.Errorf("PrometheusRule's first alert %q", got)
			}
			cm := find(t, objs, "ConfigMap")
			for _, d := range []string{"vpcip-fleet.json", "vpcip-node.json"} {
				if !strings.Contains(str(dig(cm, "data", d)), "panels") {
					t.Errorf("dashboards ConfigMap lacks %s", d)
				}
			}
			svc := find(t, objs, "Service")
			if got := str(dig(svc, "spec", "clusterIP")); got != "None" {
				t.Errorf("metrics Service clusterIP %q, want None", got)
			}
		})
	}
}
