package chart

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vpcip/vpcip/test/kubetest"
)

// envList is a container's env in order: name, value, fieldRef.
func envList(c map[string]any) [][3]string {
	list, _ := c["env"].([]any)
	var out [][3]string
	for _, e := range list {
		m := e.(map[string]any)
		out = append(out, [3]string{str(m["name"]), str(m["value"]), str(dig(m, "valueFrom", "fieldRef", "fieldPath"))})
	}
	return out
}

func findNamed(objs []Object, kind, name string) Object {
	for _, o := range objs {
		if o.Kind() == kind && o.Name() == name {
			return o
		}
	}
	return nil
}

// metrics.bindNodeAddress binds the daemon's metrics to the node's primary
// address: HOST_IP from the downward API's status.hostIP, then
// VPCIP_METRICS_ADDR=$(HOST_IP):<port> after it (Kubernetes expands only
// variables defined earlier), once, in the vpcipd container; the port and
// probes stay. Off, nothing of it is rendered and the daemon keeps its
// default (every address).
func TestTemplateMetricsBindNodeAddress(t *testing.T) {
	tests := []struct {
		name, values string
		wantAddr     string // "" unset (the daemon's default)
		wantPort     string
	}{
		{"off", "", "", "61678"},
		{"on", "metrics: {bindNodeAddress: true}", "$(HOST_IP):61678", "61678"},
		{"on with the port from env", "metrics: {bindNodeAddress: true}\nenv: {VPCIP_METRICS_ADDR: \":7002\"}", "$(HOST_IP):7002", "7002"},
		{"on with the port from the alias", "metrics: {bindNodeAddress: true}\nenv: {METRICS_BIND_ADDRESS: \"0.0.0.0:7003\"}", "$(HOST_IP):7003", "7003"},
		{"on with secure", "metrics: {bindNodeAddress: true, secure: true}", "$(HOST_IP):61678", "61678"},
	}
	for _, h := range helms(t) {
		for _, tt := range tests {
			t.Run(h.Name+"/"+tt.name, func(t *testing.T) {
				objs, err := render(t, h, tt.values)
				if err != nil {
					t.Fatal(err)
				}
				ds := find(t, objs, "DaemonSet")
				d := container(t, ds, "vpcipd")
				env := envList(d)
				hostIP, addr := -1, -1
				var addrs []string
				for i, e := range env {
					switch e[0] {
					case "HOST_IP":
						hostIP = i
						if e[2] != "status.hostIP" {
							t.Errorf("HOST_IP from %q, want the downward API's status.hostIP", e[2])
						}
					case "VPCIP_METRICS_ADDR", "METRICS_BIND_ADDRESS":
						addr = i
						addrs = append(addrs, e[0]+"="+e[1])
					}
				}
				if tt.wantAddr == "" {
					if hostIP >= 0 || (len(addrs) > 0 && tt.values == "") {
						t.Errorf("bindNodeAddress off: HOST_IP at %d, metrics addresses %v; want neither", hostIP, addrs)
					}
				} else {
					if len(addrs) != 1 || addrs[0] != "VPCIP_METRICS_ADDR="+tt.wantAddr {
						t.Errorf("metrics addresses %v, want only VPCIP_METRICS_ADDR=%s", addrs, tt.wantAddr)
					}
					if hostIP < 0 || hostIP > addr {
						t.Errorf("HOST_IP at %d, VPCIP_METRICS_ADDR at %d: HOST_IP must come first to be expanded", hostIP, addr)
					}
				}
				if got := str(dig(d, "ports", 0, "containerPort")); got != tt.wantPort {
					t.Errorf("metrics port %s, want %s", got, tt.wantPort)
				}
				for _, p := range []string{"livenessProbe", "readinessProbe"} {
					if host, port := str(dig(d, p, "httpGet", "host")), str(dig(d, p, "httpGet", "port")); host != "127.0.0.1" || port != "61679" {
						t.Errorf("%s reads %s:%s, want the introspection endpoint 127.0.0.1:61679", p, host, port)
					}
				}
				// install-cni does not listen for metrics: the user's address is not passed there either.
				for _, e := range envList(container(t, ds, "install-cni")) {
					if tt.wantAddr != "" && (e[0] == "VPCIP_METRICS_ADDR" || e[0] == "METRICS_BIND_ADDRESS") {
						t.Errorf("install-cni gets %s=%s with bindNodeAddress on", e[0], e[1])
					}
				}
			})
		}
	}
}

// metrics.secure: the daemon gets VPCIP_METRICS_SECURE and the right to
// review tokens (exactly files/metrics-auth-rules.yaml, bound to its
// ServiceAccount); scrapers get a reader ClusterRole; the monitors scrape
// https with the token of a scraper ServiceAccount bound to that role.
// Off, none of it.
func TestTemplateMetricsSecure(t *testing.T) {
	authRules, err := kubetest.ReadRules(filepath.Join(ChartDir(), "files", "metrics-auth-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	monitors := "podMonitor: {enabled: true}\nserviceMonitor: {enabled: true}"
	for _, h := range helms(t) {
		t.Run(h.Name+"/off", func(t *testing.T) {
			objs, err := render(t, h, monitors)
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range objs {
				if strings.Contains(o.Name(), "metrics-") && o.Kind() != "Service" {
					t.Errorf("secure off renders %s %s", o.Kind(), o.Name())
				}
			}
			env, _ := envOf(container(t, find(t, objs, "DaemonSet"), "vpcipd"))
			if _, ok := env["VPCIP_METRICS_SECURE"]; ok {
				t.Errorf("secure off sets VPCIP_METRICS_SECURE")
			}
			if s := str(dig(find(t, objs, "PodMonitor"), "spec", "podMetricsEndpoints", 0, "scheme")); s != "" {
				t.Errorf("secure off: PodMonitor scheme %q, want none (http)", s)
			}
		})
		t.Run(h.Name+"/on", func(t *testing.T) {
			objs, err := render(t, h, monitors+"\nmetrics: {secure: true, tlsSecretName: vpcip-metrics-tls}")
			if err != nil {
				t.Fatal(err)
			}
			ds := find(t, objs, "DaemonSet")
			env, _ := envOf(container(t, ds, "vpcipd"))
			if env["VPCIP_METRICS_SECURE"] != "true" || env["VPCIP_METRICS_TLS_DIR"] != "/etc/vpcip/metrics-tls" {
				t.Errorf("vpcipd env: VPCIP_METRICS_SECURE=%q VPCIP_METRICS_TLS_DIR=%q", env["VPCIP_METRICS_SECURE"], env["VPCIP_METRICS_TLS_DIR"])
			}
			var secretVol string
			vols, _ := dig(ds, "spec", "template", "spec", "volumes").([]any)
			for _, v := range vols {
				if str(dig(v, "name")) == "metrics-tls" {
					secretVol = str(dig(v, "secret", "secretName"))
				}
			}
			if secretVol != "vpcip-metrics-tls" {
				t.Errorf("metrics-tls volume from Secret %q, want vpcip-metrics-tls", secretVol)
			}
			if got := hostPathAtMount(container(t, ds, "vpcipd"), "/etc/vpcip/metrics-tls"); got != "metrics-tls" {
				t.Errorf("vpcipd mounts %q at /etc/vpcip/metrics-tls, want the metrics-tls volume", got)
			}

			auth := findNamed(objs, "ClusterRole", "vpcip-metrics-auth")
			if auth == nil {
				t.Fatal("no vpcip-metrics-auth ClusterRole")
			}
			rendered, err := kubetest.ReadRulesFromObject(auth)
			if err != nil || !reflect.DeepEqual(rendered, authRules) {
				t.Errorf("vpcip-metrics-auth rules %+v (%v), want files/metrics-auth-rules.yaml's %+v", rendered, err, authRules)
			}
			checkBinding(t, objs, "vpcip-metrics-auth", "vpcip-metrics-auth", "vpcip")
			reader := findNamed(objs, "ClusterRole", "vpcip-metrics-reader")
			if got := strs(dig(reader, "rules", 0, "nonResourceURLs")); !slices.Equal(got, []string{"/metrics"}) || str(dig(reader, "rules", 0, "verbs", 0)) != "get" {
				t.Errorf("reader rules %v", dig(reader, "rules"))
			}
			checkBinding(t, objs, "vpcip-metrics-scraper", "vpcip-metrics-reader", "vpcip-metrics-scraper")
			secret := findNamed(objs, "Secret", "vpcip-metrics-scraper-token")
			if secret == nil || str(secret["type"]) != "kubernetes.io/service-account-token" ||
				str(dig(secret, "metadata", "annotations", "kubernetes.io/service-account.name")) != "vpcip-metrics-scraper" {
				t.Errorf("scraper token Secret %v", secret)
			}
			for _, ep := range []any{dig(find(t, objs, "PodMonitor"), "spec", "podMetricsEndpoints", 0), dig(find(t, objs, "ServiceMonitor"), "spec", "endpoints", 0)} {
				if str(dig(ep, "scheme")) != "https" || str(dig(ep, "authorization", "credentials", "name")) != "vpcip-metrics-scraper-token" ||
					str(dig(ep, "authorization", "credentials", "key")) != "token" || str(dig(ep, "tlsConfig", "insecureSkipVerify")) != "true" {
					t.Errorf("monitor endpoint %v: want https, the scraper's token and insecureSkipVerify", ep)
				}
			}
		})
		t.Run(h.Name+"/on with a token Secret of one's own", func(t *testing.T) {
			objs, err := render(t, h, monitors+"\nmetrics: {secure: true, scrapeTokenSecret: {name: prom-token, key: t}}")
			if err != nil {
				t.Fatal(err)
			}
			if findNamed(objs, "ServiceAccount", "vpcip-metrics-scraper") != nil || findNamed(objs, "Secret", "vpcip-metrics-scraper-token") != nil {
				t.Errorf("a scraper of the chart's own rendered though scrapeTokenSecret is given")
			}
			ep := dig(find(t, objs, "PodMonitor"), "spec", "podMetricsEndpoints", 0)
			if str(dig(ep, "authorization", "credentials", "name")) != "prom-token" || str(dig(ep, "authorization", "credentials", "key")) != "t" {
				t.Errorf("PodMonitor credentials %v, want prom-token/t", dig(ep, "authorization"))
			}
		})
	}
}

func hostPathAtMount(c map[string]any, mountPath string) string {
	mounts, _ := c["volumeMounts"].([]any)
	for _, m := range mounts {
		if str(dig(m, "mountPath")) == mountPath {
			return str(dig(m, "name"))
		}
	}
	return ""
}

func checkBinding(t *testing.T, objs []Object, name, role, subject string) {
	t.Helper()
	b := findNamed(objs, "ClusterRoleBinding", name)
	if b == nil {
		t.Errorf("no ClusterRoleBinding %s", name)
		return
	}
	if got := str(dig(b, "roleRef", "name")); got != role {
		t.Errorf("%s binds role %q, want %s", name, got, role)
	}
	if got := str(dig(b, "subjects", 0, "name")); got != subject || str(dig(b, "subjects", 0, "kind")) != "ServiceAccount" {
		t.Errorf("%s binds %v, want ServiceAccount %s", name, dig(b, "subjects"), subject)
	}
}

// Durations the daemon refuses for VPCIP_GC_GRACE (below 10 s, or not a
// duration) fail the render, so a helm upgrade cannot leave every node's
// daemon crash-looping; durations it accepts render.
func TestTemplateGCGrace(t *testing.T) {
	for _, h := range helms(t) {
		t.Run(h.Name, func(t *testing.T) {
			for _, v := range []string{"5s", "9.5s", "9999ms", "0", "30", "-1m", "soon"} {
				_, err := render(t, h, "env: {VPCIP_GC_GRACE: \""+v+"\"}")
				if err == nil || !strings.Contains(err.Error(), "VPCIP_GC_GRACE") || !strings.Contains(err.Error(), "at least 10s") {
					t.Errorf("VPCIP_GC_GRACE=%q: err = %v, want a refusal naming it and the 10s floor", v, err)
				}
			}
			for _, v := range []string{"10s", "10000ms", "1m", "1m30s", "0.5h", ""} {
				objs, err := render(t, h, "env: {VPCIP_GC_GRACE: \""+v+"\"}")
				if err != nil {
					t.Errorf("VPCIP_GC_GRACE=%q refused: %v", v, err)
					continue
				}
				env, _ := envOf(container(t, find(t, objs, "DaemonSet"), "vpcipd"))
				if env["VPCIP_GC_GRACE"] != v {
					t.Errorf("VPCIP_GC_GRACE=%q reaches vpcipd as %q", v, env["VPCIP_GC_GRACE"])
				}
			}
		})
	}
}

// The secure, node-bound render (RBAC with a non-resource URL, the
// downward API's status.hostIP, the Secret volume, the scraper's token
// Secret) is valid for a real kube-apiserver (`kubectl apply
// --dry-run=server`); the monitors are left out, their CRDs are not there.
func TestApplyDryRunServerMetricsSecure(t *testing.T) {
	hs := helms(t)
	k := kubetest.Shared(t)
	for _, h := range hs {
		t.Run(h.Name, func(t *testing.T) {
			out, err := h.Run("template", "vpcip", ChartDir(), "--namespace", "kube-system", vapAPI,
				"--set", "metrics.secure=true,metrics.bindNodeAddress=true,metrics.tlsSecretName=vpcip-metrics-tls,podMonitor.enabled=true,serviceMonitor.enabled=true")
			if err != nil {
				t.Fatal(err)
			}
			var keep []string
			for _, doc := range strings.Split(string(out), "\n---") {
				if !strings.Contains(doc, "\nkind: PodMonitor") && !strings.Contains(doc, "\nkind: ServiceMonitor") {
					keep = append(keep, doc)
				}
			}
			p := filepath.Join(t.TempDir(), "rendered.yaml")
			if err := os.WriteFile(p, []byte(strings.Join(keep, "\n---")), 0o644); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			res, err := k.Kubectl(ctx, "apply", "--dry-run=server", "-f", p)
			if err != nil {
				t.Fatalf("%v\n%s", err, res)
			}
			for _, want := range []string{"clusterrole.rbac.authorization.k8s.io/vpcip-metrics-auth", "clusterrole.rbac.authorization.k8s.io/vpcip-metrics-reader",
				"clusterrolebinding.rbac.authorization.k8s.io/vpcip-metrics-scraper", "secret/vpcip-metrics-scraper-token", "daemonset.apps/vpcip"} {
				if !strings.Contains(res, want) {
					t.Errorf("apply output lacks %s:\n%s", want, res)
				}
			}
		})
	}
}
