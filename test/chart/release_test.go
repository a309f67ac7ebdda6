package chart

import (
	"bufio"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// releaseValues are the AWS VPC CNI users' values files of testdata, each
// list layered in order as `helm install -f a -f b` layers them: the current
// reference release's default env block alone, and under a typical
// custom-networking and a prefix-delegation install.
var releaseValues = []struct {
	name  string
	files []string
}{
	{"v1.23 defaults", []string{"aws-node-values.yaml"}},
	{"custom networking", []string{"aws-node-values.yaml", "custom-networking-values.yaml"}},
	{"prefix delegation", []string{"aws-node-values.yaml", "prefix-delegation-values.yaml"}},
}

// readValues returns the files' text and their env blocks merged in order.
func readValues(t *testing.T, files []string) (docs []string, env map[string]string) {
	t.Helper()
	env = map[string]string{}
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join("testdata", f))
		if err != nil {
			t.Fatal(err)
		}
		var v struct {
			Env map[string]string `yaml:"env"`
		}
		if err := yaml.Unmarshal(data, &v); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		maps.Copy(env, v.Env)
		docs = append(docs, string(data))
	}
	return docs, env
}

// Each release values file renders unchanged: every variable vpcip reads
// reaches both containers with its merged value, mapped ones under their
// vpcip names, and no aws-node-only one; custom networking creates one
// ENIConfig per zone.
func TestTemplateReleaseValues(t *testing.T) {
	r := readRules(t)
	for _, h := range helms(t) {
		for _, rv := range releaseValues {
			t.Run(h.Name+"/"+rv.name, func(t *testing.T) {
				docs, want := readValues(t, rv.files)
				objs, err := render(t, h, docs...)
				if err != nil {
					t.Fatal(err)
				}
				ds := find(t, objs, "DaemonSet")
				for _, c := range []string{"vpcipd", "install-cni"} {
					env, _ := envOf(container(t, ds, c))
					for name, value := range want {
						_, awsOnly := r.AWSOnly[name]
						_, mapped := r.Mapped[name]
						switch got, ok := env[name]; {
						case (awsOnly || mapped) && ok:
							t.Errorf("%s: %s passed to the daemon under its AWS name", c, name)
						case !awsOnly && !mapped && got != value:
							t.Errorf("%s: %s = %q, want %q", c, name, got, value)
						}
					}
				}
				// The reference's daemon log path lands in the host's
				// /var/log/aws-routed-eni.
				if want["AWS_VPC_K8S_CNI_LOG_FILE"] != "/host/var/log/aws-routed-eni/ipamd.log" {
					t.Fatalf("the release values' AWS_VPC_K8S_CNI_LOG_FILE is %q", want["AWS_VPC_K8S_CNI_LOG_FILE"])
				}
				if got := hostPathAt(t, ds, "vpcipd", "/host/var/log/aws-routed-eni"); got != "/var/log/aws-routed-eni" {
					t.Errorf("vpcipd's /host/var/log/aws-routed-eni is host path %q, want /var/log/aws-routed-eni", got)
				}
				var eniConfigs []string
				for _, o := range objs {
					if o.Kind() == "ENIConfig" {
						eniConfigs = append(eniConfigs, o.Name()+"="+str(dig(o, "spec", "subnet")))
					}
				}
				slices.Sort(eniConfigs)
				wantConfigs := []string(nil)
				if rv.name == "custom networking" {
					wantConfigs = []string{"us-west-2a=subnet-0a1b2c3d4e5f60001", "us-west-2b=subnet-0a1b2c3d4e5f60002", "us-west-2c=subnet-0a1b2c3d4e5f60003"}
				}
				if !slices.Equal(eniConfigs, wantConfigs) {
					t.Errorf("ENIConfigs %v, want %v", eniConfigs, wantConfigs)
				}
			})
		}
	}
}

// The mapped variables reach the daemon under the names vpcip's libraries
// read: AWS_EC2_ENDPOINT as the AWS SDK's AWS_ENDPOINT_URL_EC2,
// CLUSTER_ENDPOINT as client-go's in-cluster host and port.
func TestTemplateMappedVariables(t *testing.T) {
	tests := []struct {
		values string
		want   map[string]string
	}{
		{"env: {AWS_EC2_ENDPOINT: https://ec2.us-west-2.amazonaws.com}", map[string]string{"AWS_ENDPOINT_URL_EC2": "https://ec2.us-west-2.amazonaws.com"}},
		{"env: {CLUSTER_ENDPOINT: https://ABCD.gr7.us-west-2.eks.amazonaws.com}", map[string]string{"KUBERNETES_SERVICE_HOST": "ABCD.gr7.us-west-2.eks.amazonaws.com", "KUBERNETES_SERVICE_PORT": "443"}},
		{"env: {CLUSTER_ENDPOINT: \"https://10.0.0.10:6443\"}", map[string]string{"KUBERNETES_SERVICE_HOST": "10.0.0.10", "KUBERNETES_SERVICE_PORT": "6443"}},
	}
	for _, h := range helms(t) {
		for _, tt := range tests {
			t.Run(h.Name+"/"+tt.values, func(t *testing.T) {
				objs, err := render(t, h, tt.values)
				if err != nil {
					t.Fatal(err)
				}
				env, _ := envOf(container(t, find(t, objs, "DaemonSet"), "vpcipd"))
				for n, v := range tt.want {
					if env[n] != v {
						t.Errorf("%s = %q, want %q", n, env[n], v)
					}
				}
			})
		}
	}
}

// Every variable the reference documents or sets by default
// (testdata/reference-env.txt) is sorted by files/env.yaml and has one row in
// the chart README's table saying the same: "implemented" for what the
// daemon reads or the chart maps, "set by the chart" for chart-owned names,
// "accepted ..." naming the accepted values for aws-node-only ones.
func TestReferenceVariablesDocumented(t *testing.T) {
	r := readRules(t)
	ref := readLines(t, filepath.Join("testdata", "reference-env.txt"))
	if len(ref) < 40 {
		t.Fatalf("reference-env.txt lists %d variables", len(ref))
	}
	rows := readmeEnvTable(t)
	for _, n := range ref {
		status, ok := rows[n]
		if !ok {
			t.Errorf("the chart README's table has no row for %s", n)
			continue
		}
		rule, awsOnly := r.AWSOnly[n]
		_, mapped := r.Mapped[n]
		_, owned := r.ChartOwned[n]
		supported := slices.Contains(r.Supported, n)
		switch {
		case owned:
			if !strings.HasPrefix(status, "set by the chart") {
				t.Errorf("%s is set by the chart; README says %q", n, status)
			}
		case supported || mapped:
			if !strings.HasPrefix(status, "implemented") {
				t.Errorf("%s is implemented; README says %q", n, status)
			}
		case awsOnly:
			if !strings.HasPrefix(status, "accepted") {
				t.Errorf("%s is accepted only at some values; README says %q", n, status)
			}
			for _, a := range rule.Accept {
				if a != "" && !strings.Contains(status, "`"+a+"`") {
					t.Errorf("%s: README's %q does not name the accepted value %q", n, status, a)
				}
			}
			if rule.Any != strings.Contains(status, "any value") {
				t.Errorf("%s: any=%v, README says %q", n, rule.Any, status)
			}
		default:
			t.Errorf("files/env.yaml does not sort %s, a variable the reference documents", n)
		}
	}
	for n := range rows {
		if !slices.Contains(ref, n) {
			t.Errorf("the README's table lists %s, which reference-env.txt does not", n)
		}
	}
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(data), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

// readmeEnvTable returns the chart README's "| AWS VPC CNI variable |" table
// as variable to its second cell.
func readmeEnvTable(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open(filepath.Join(ChartDir(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows := map[string]string{}
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "| AWS VPC CNI variable |"):
			in = true
		case in && !strings.HasPrefix(line, "|"):
			in = false
		case in && !strings.HasPrefix(line, "|---"):
			cells := strings.Split(line, "|")
			if len(cells) < 4 {
				t.Fatalf("README table row %q", line)
			}
			name := strings.Trim(strings.TrimSpace(cells[1]), "`")
			if _, dup := rows[name]; dup {
				t.Errorf("README's table lists %s twice", name)
			}
			rows[name] = strings.TrimSpace(cells[2])
		}
	}
	if len(rows) == 0 {
		t.Fatal("the chart README has no \"| AWS VPC CNI variable |\" table")
	}
	return rows
}

// hostPathAt returns the host path mounted at mountPath in container c.
func hostPathAt(t *testing.T, ds Object, c, mountPath string) string {
	t.Helper()
	mounts, _ := container(t, ds, c)["volumeMounts"].([]any)
	vols, _ := dig(ds, "spec", "template", "spec", "volumes").([]any)
	for _, m := range mounts {
		if str(dig(m, "mountPath")) != mountPath {
			continue
		}
		for _, v := range vols {
			if str(dig(v, "name")) == str(dig(m, "name")) {
				return str(dig(v, "hostPath", "path"))
			}
		}
	}
	return ""
}
