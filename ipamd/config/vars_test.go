package config

import (
	"bufio"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func examples() map[string]string {
	m := map[string]string{}
	for _, v := range Vars {
		m[v.Name] = v.Example
	}
	return m
}

// TestEveryVariableReachesConfigAndView sets every variable of Vars to its
// distinctive Example, alone and all at once, and checks that the parsed
// Config changes and that the effective view (Map) shows exactly that value.
// A variable the parser reads but the view does not show fails here.
func TestEveryVariableReachesConfigAndView(t *testing.T) {
	def, err := Parse(env(nil))
	if err != nil {
		t.Fatalf("Parse(empty): %v", err)
	}
	defView := def.Map()
	for _, v := range Vars {
		if v.Example == "" || v.Example == defView[v.Name] {
			t.Errorf("%s: Example %q must be a valid value other than the default %q", v.Name, v.Example, defView[v.Name])
			continue
		}
		set := map[string]string{v.Name: v.Example}
		for k, x := range v.ExampleNeeds {
			set[k] = x
		}
		c, err := Parse(env(set))
		if err != nil {
			t.Errorf("%s=%q: %v", v.Name, v.Example, err)
			continue
		}
		if reflect.DeepEqual(c, def) {
			t.Errorf("%s=%q: the parsed Config equals the default: the parser does not read it", v.Name, v.Example)
		}
		if got, ok := c.Map()[v.Name]; !ok || got != v.Example {
			t.Errorf("%s=%q: the effective view shows %q (present %v), want %q", v.Name, v.Example, got, ok, v.Example)
		}
	}

	all, err := Parse(env(examples()))
	if err != nil {
		t.Fatalf("Parse(all examples): %v", err)
	}
	view := all.Map()
	for _, v := range Vars {
		if view[v.Name] != v.Example {
			t.Errorf("all set: %s shows %q, want %q", v.Name, view[v.Name], v.Example)
		}
	}
	if len(view) != len(Vars) {
		t.Errorf("the effective view has %d entries, Vars %d rows", len(view), len(Vars))
	}
}

// TestEveryConfigFieldComesFromAVariable: with every variable set to its
// Example, every field of Config differs from its default, so no field is
// parsed outside the table (where the view would not show it).
func TestEveryConfigFieldComesFromAVariable(t *testing.T) {
	def, _ := Parse(env(nil))
	all, err := Parse(env(examples()))
	if err != nil {
		t.Fatalf("Parse(all examples): %v", err)
	}
	dv, av := reflect.ValueOf(def), reflect.ValueOf(all)
	for i := range dv.NumField() {
		f := dv.Type().Field(i)
		if reflect.DeepEqual(dv.Field(i).Interface(), av.Field(i).Interface()) {
			t.Errorf("Config.%s is not changed by any variable of Vars: add its row", f.Name)
		}
	}
}

func TestAliasesAreRead(t *testing.T) {
	c, err := Parse(env(map[string]string{"METRICS_BIND_ADDRESS": "127.0.0.1:9", "INTROSPECTION_BIND_ADDRESS": "bad"}))
	if c.MetricsAddr != "127.0.0.1:9" {
		t.Errorf("METRICS_BIND_ADDRESS: MetricsAddr %q", c.MetricsAddr)
	}
	if err == nil || !strings.Contains(err.Error(), `INTROSPECTION_BIND_ADDRESS="bad"`) {
		t.Errorf("a bad alias value: error %v, want one naming INTROSPECTION_BIND_ADDRESS", err)
	}
	c, _ = Parse(env(map[string]string{"VPCIP_METRICS_ADDR": "off", "METRICS_BIND_ADDRESS": "127.0.0.1:9"}))
	if c.MetricsAddr != "" {
		t.Errorf("VPCIP_METRICS_ADDR wins over its alias: MetricsAddr %q", c.MetricsAddr)
	}
}

// TestREADMEConfigTableMatchesVars: the README's configuration table lists
// exactly the rows of Vars (aliases optional) and the SDK's own variables.
func TestREADMEConfigTableMatchesVars(t *testing.T) {
	f, err := os.Open("../../README.md")
	if err != nil {
		t.Fatalf("README: %v", err)
	}
	defer f.Close()
	var inTable bool
	listed := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "| variable |"):
			inTable = true
		case inTable && !strings.HasPrefix(line, "|"):
			inTable = false
		case inTable && !strings.HasPrefix(line, "|---"):
			first := strings.Split(line, "|")[1]
			for _, f := range strings.Split(first, ",") {
				listed[strings.Trim(strings.TrimSpace(f), "`")] = true
			}
		}
	}
	if len(listed) == 0 {
		t.Fatal("README has no configuration table (a row starting \"| variable |\")")
	}
	known := map[string]bool{}
	for _, v := range Vars {
		known[v.Name] = true
		for _, a := range v.Aliases {
			known[a] = true
		}
		if !listed[v.Name] {
			t.Errorf("README's configuration table misses %s", v.Name)
		}
	}
	for n := range listed {
		if !known[n] && !slices.Contains(SDKNames, n) {
			t.Errorf("README's configuration table lists %s, which is not in config.Vars or SDKNames", n)
		}
	}
}

// The AWS VPC CNI's plugin log level reaches the plugin with its meaning: any
// case, FATAL as ERROR; VPCIP_PLUGIN_LOG_LEVEL wins over it.
func TestPluginLogLevelAWSName(t *testing.T) {
	tests := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"AWS_VPC_K8S_PLUGIN_LOG_LEVEL": "DEBUG"}, "DEBUG"},
		{map[string]string{"AWS_VPC_K8S_PLUGIN_LOG_LEVEL": "warn"}, "WARN"},
		{map[string]string{"AWS_VPC_K8S_PLUGIN_LOG_LEVEL": "Fatal"}, "ERROR"},
		{map[string]string{"AWS_VPC_K8S_PLUGIN_LOG_LEVEL": "DEBUG", "VPCIP_PLUGIN_LOG_LEVEL": "ERROR"}, "ERROR"},
		{map[string]string{"AWS_VPC_K8S_CNI_LOGLEVEL": "warn"}, "WARN"}, // the daemon's level is the default
	}
	for _, tt := range tests {
		c, err := Parse(env(tt.env))
		if err != nil {
			t.Errorf("%v: %v", tt.env, err)
			continue
		}
		if c.PluginLogLevel != tt.want {
			t.Errorf("%v: PluginLogLevel %q, want %q", tt.env, c.PluginLogLevel, tt.want)
		}
	}
	if _, err := Parse(env(map[string]string{"AWS_VPC_K8S_PLUGIN_LOG_LEVEL": "loud"})); err == nil || !strings.Contains(err.Error(), "AWS_VPC_K8S_PLUGIN_LOG_LEVEL") {
		t.Errorf("a bad level: error %v, want one naming AWS_VPC_K8S_PLUGIN_LOG_LEVEL", err)
	}
}

// The AWS VPC CNI's log-file settings keep their meaning: the daemon's file
// (or stream), the plugin's file (or stderr, never stdout: the CNI result);
// VPCIP_PLUGIN_LOG_FILE wins over AWS_VPC_K8S_PLUGIN_LOG_FILE.
func TestLogFileSettings(t *testing.T) {
	tests := []struct {
		env           map[string]string
		daemon, plugn string
		bad           string
	}{
		{env: nil, daemon: "", plugn: DefaultPluginLogFile},
		{env: map[string]string{"AWS_VPC_K8S_CNI_LOG_FILE": "/host/var/log/aws-routed-eni/ipamd.log", "AWS_VPC_K8S_PLUGIN_LOG_FILE": "/var/log/aws-routed-eni/plugin.log"},
			daemon: "/host/var/log/aws-routed-eni/ipamd.log", plugn: "/var/log/aws-routed-eni/plugin.log"},
		{env: map[string]string{"AWS_VPC_K8S_CNI_LOG_FILE": "stdout", "AWS_VPC_K8S_PLUGIN_LOG_FILE": "stderr"}, daemon: "stdout", plugn: "stderr"},
		{env: map[string]string{"AWS_VPC_K8S_PLUGIN_LOG_FILE": "/a/p.log", "VPCIP_PLUGIN_LOG_FILE": "/b/p.log"}, plugn: "/b/p.log"},
		{env: map[string]string{"AWS_VPC_K8S_PLUGIN_LOG_FILE": "stdout"}, bad: "AWS_VPC_K8S_PLUGIN_LOG_FILE"},
		{env: map[string]string{"AWS_VPC_K8S_CNI_LOG_FILE": "ipamd.log"}, bad: "AWS_VPC_K8S_CNI_LOG_FILE"},
	}
	for _, tt := range tests {
		c, err := Parse(env(tt.env))
		if tt.bad != "" {
			if err == nil || !strings.Contains(err.Error(), tt.bad) {
				t.Errorf("%v: error %v, want one naming %s", tt.env, err, tt.bad)
			}
			continue
		}
		if err != nil {
			t.Errorf("%v: %v", tt.env, err)
			continue
		}
		if c.LogFile != tt.daemon || c.PluginLogFile != tt.plugn {
			t.Errorf("%v: LogFile %q, PluginLogFile %q; want %q, %q", tt.env, c.LogFile, c.PluginLogFile, tt.daemon, tt.plugn)
		}
	}
}
