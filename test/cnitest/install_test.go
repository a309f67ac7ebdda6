package cnitest

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestInstalledConflistVpcipd: the conflist `vpcipd install-cni` writes (and
// the plugin binary it copies) works through libcni as written: the keys the
// daemon puts there are the keys the plugin reads.
func TestInstalledConflistVpcipd(t *testing.T) {
	RequireRoot(t)
	if testing.Short() {
		t.Skip("starts vpcsim and vpcipd")
	}
	v := startVPC(t, "m5.large", 1)
	node, d := v.nodes[0], v.daemons[0]
	binDir, confDir := t.TempDir(), t.TempDir()
	if err := os.Symlink(filepath.Join(ReferencePlugins(t), "portmap"), filepath.Join(binDir, "portmap")); err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(t.TempDir(), "plugin.log")
	cmd := exec.Command(d.bin, "install-cni")
	cmd.Env = append(append([]string{}, d.env...),
		"VPCIP_CNI_BIN_DIR="+binDir, "VPCIP_CNI_CONF_DIR="+confDir,
		"VPCIP_CNI_PLUGIN_SRC="+BuildPlugin(t), "VPCIP_PLUGIN_LOG_FILE="+logFile, "VPCIP_INSTALL_WAIT=30s")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := node.Do(cmd.Run); err != nil {
		t.Fatalf("vpcipd install-cni: %v\n%s", err, out.Bytes())
	}
	raw, err := os.ReadFile(filepath.Join(confDir, "10-vpcip.conflist"))
	if err != nil {
		t.Fatalf("conflist not written: %v\n%s", err, out.Bytes())
	}
	var doc struct {
		Plugins []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil || len(doc.Plugins) != 2 || doc.Plugins[0]["type"] != "vpcip-cni" || doc.Plugins[1]["type"] != "portmap" {
		t.Fatalf("conflist %s: want vpcip-cni then portmap (%v)", raw, err)
	}
	e := &Env{Node: node, Daemon: d, BinDir: binDir, CacheDir: t.TempDir(), LogFile: logFile,
		CNIVersion: "1.1.0", VethPrefix: "eni", RawConfList: raw}
	p := e.NewPod(t, "installed")
	p.CapabilityArgs = map[string]any{"portMappings": []map[string]any{{"hostPort": 18081, "containerPort": 80, "protocol": "tcp"}}}
	e.MustAdd(t, p)
	a := mustHeld(t, e, p)
	AssertPodWired(t, e, p, a.RouteTable, mtuOf(e, a))
	if err := e.Check(t, p); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	if err := e.Status(t); err != nil {
		t.Errorf("STATUS: %v", err)
	}
	mustDel(t, e, p)
	if _, ok := e.Held(t, p); ok {
		t.Errorf("daemon still holds %v after DEL", a.Address)
	}
	if fi, err := os.Stat(logFile); err != nil || fi.Size() == 0 {
		t.Errorf("plugin log %s from the conflist's pluginLogFile is empty or missing: %v", logFile, err)
	}
	AssertNodeClean(t, e)
}
