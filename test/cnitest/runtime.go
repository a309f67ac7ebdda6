package cnitest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/vpcip/vpcip/cni/datapath"
)

// Network is the network name of the suite's conflist.
const Network = "vpcip"

// Env is one runtime on one node: a CNI bin dir, a libcni result cache and a
// plugin log, pointed at a daemon.
type Env struct {
	Node       *Node
	Daemon     Daemon
	BinDir     string
	CacheDir   string
	LogFile    string
	CNIVersion string // the conflist's cniVersion; default 1.1.0
	MTU        int    // written as "mtu" when non-zero
	VethPrefix string // default "eni"
	Chain      bool   // chain tuning, bandwidth and portmap after vpcip-cni (default true via NewEnv)
	// EgressDir is the plugin's v4EgressDataDir, host-local's store of IPv6
	// pods' IPv4 egress addresses (private to the test via NewEnv).
	EgressDir string
	// RawConfList, when set, is the conflist used instead of ConfListJSON
	// (a reference chain, for comparison).
	RawConfList []byte
}

// NewEnv returns an Env for node and daemon with the full chain.
func NewEnv(t testing.TB, node *Node, d Daemon) *Env {
	t.Helper()
	dir := t.TempDir()
	return &Env{Node: node, Daemon: d, BinDir: BinDir(t), CacheDir: filepath.Join(dir, "cache"),
		LogFile: filepath.Join(dir, "plugin.log"), CNIVersion: "1.1.0", VethPrefix: "eni", Chain: true,
		EgressDir: filepath.Join(dir, "egress4")}
}

// PluginConf is the vpcip-cni entry of the conflist.
func (e *Env) PluginConf() map[string]any {
	c := map[string]any{"type": "vpcip-cni", "ipamdSocket": e.Daemon.Socket(), "vethPrefix": e.VethPrefix,
		"pluginLogFile": e.LogFile, "pluginLogLevel": "debug"}
	if e.MTU != 0 {
		c["mtu"] = e.MTU
	}
	if e.EgressDir != "" {
		c["v4EgressDataDir"] = e.EgressDir
	}
	return c
}

// ConfListJSON is the conflist: vpcip-cni first, then (Chain) tuning with a
// namespaced sysctl, bandwidth and portmap with their capabilities.
func (e *Env) ConfListJSON() []byte {
	plugins := []any{e.PluginConf()}
	if e.Chain {
		plugins = append(plugins,
			map[string]any{"type": "tuning", "sysctl": map[string]string{"net.core.somaxconn": "512"}},
			map[string]any{"type": "bandwidth", "capabilities": map[string]bool{"bandwidth": true}},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}, "snat": true, "backend": "iptables"})
	}
	b, _ := json.Marshal(map[string]any{"cniVersion": e.CNIVersion, "name": Network, "plugins": plugins})
	return b
}

// ConfList parses ConfListJSON as a runtime loads a conflist file.
func (e *Env) ConfList(t testing.TB) *libcni.NetworkConfigList {
	t.Helper()
	raw := e.RawConfList
	if raw == nil {
		raw = e.ConfListJSON()
	}
	l, err := libcni.NetworkConfFromBytes(raw)
	if err != nil {
		t.Fatalf("conflist: %v", err)
	}
	return l
}

func (e *Env) cni() *libcni.CNIConfig {
	return libcni.NewCNIConfigWithCacheDir([]string{e.BinDir}, e.CacheDir, nil)
}

// Pod is one sandbox.
type Pod struct {
	Namespace, Name string
	ContainerID     string
	IfName          string
	NetnsName       string         // under NetnsDir; "" after the netns was removed on purpose
	NetnsPath       string         // what CNI_NETNS carries
	CapabilityArgs  map[string]any // runtimeConfig for the chain (portMappings, bandwidth)
	Result          *current.Result
	Address         netip.Addr
}

// NewPod creates a pod netns "vct-pod-<rand>" (removed at cleanup) and a
// sandbox ID; name gets a random suffix so pods never share a host veth.
func (e *Env) NewPod(t testing.TB, name string) *Pod {
	t.Helper()
	netns := NewNetns(t, "vct-pod-")
	return &Pod{Namespace: "default", Name: name + "-" + randomHex(3), ContainerID: randomHex(32), IfName: "eth0",
		NetnsName: netns, NetnsPath: filepath.Join(NetnsDir, netns)}
}

// HostVeth is the host veth name of p's attachment under e's prefix.
func (e *Env) HostVeth(p *Pod) string {
	return datapath.AttachmentVethName(e.VethPrefix, p.Namespace, p.Name, p.ContainerID, Network, p.IfName)
}

func (e *Env) runtimeConf(p *Pod) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: p.ContainerID, NetNS: p.NetnsPath, IfName: p.IfName,
		Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", p.Namespace}, {"K8S_POD_NAME", p.Name},
			{"K8S_POD_INFRA_CONTAINER_ID", p.ContainerID}, {"K8S_POD_UID", "uid-" + p.Name}},
		CapabilityArgs: p.CapabilityArgs}
}

func (e *Env) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 60*time.Second)
}

// Add runs the chain's ADD from the node netns and records the result.
func (e *Env) Add(t testing.TB, p *Pod) error {
	t.Helper()
	ctx, cancel := e.ctx()
	defer cancel()
	var res types.Result
	err := e.Node.Do(func() (err error) {
		res, err = e.cni().AddNetworkList(ctx, e.ConfList(t), e.runtimeConf(p))
		return err
	})
	if err != nil {
		return err
	}
	r, err := current.NewResultFromResult(res)
	if err != nil {
		return fmt.Errorf("result: %w", err)
	}
	p.Result = r
	if len(r.IPs) > 0 {
		a, _ := netip.AddrFromSlice(r.IPs[0].Address.IP)
		p.Address = a.Unmap()
	}
	return nil
}

// MustAdd is Add failing t.
func (e *Env) MustAdd(t testing.TB, p *Pod) {
	t.Helper()
	if err := e.Add(t, p); err != nil {
		t.Fatalf("ADD %s: %v", p.Name, err)
	}
}

// Del runs the chain's DEL (with the cached prevResult, as runtimes do).
func (e *Env) Del(t testing.TB, p *Pod) error {
	t.Helper()
	ctx, cancel := e.ctx()
	defer cancel()
	return e.Node.Do(func() error { return e.cni().DelNetworkList(ctx, e.ConfList(t), e.runtimeConf(p)) })
}

// Check runs the chain's CHECK.
func (e *Env) Check(t testing.TB, p *Pod) error {
	t.Helper()
	ctx, cancel := e.ctx()
	defer cancel()
	return e.Node.Do(func() error { return e.cni().CheckNetworkList(ctx, e.ConfList(t), e.runtimeConf(p)) })
}

// GC runs libcni's GC with the given pods as the valid attachments: DEL for
// cached attachments not listed, then GC of every plugin (CNI 1.1).
func (e *Env) GC(t testing.TB, valid ...*Pod) error {
	t.Helper()
	ctx, cancel := e.ctx()
	defer cancel()
	args := &libcni.GCArgs{ValidAttachments: []types.GCAttachment{}}
	for _, p := range valid {
		args.ValidAttachments = append(args.ValidAttachments, types.GCAttachment{ContainerID: p.ContainerID, IfName: p.IfName})
	}
	return e.Node.Do(func() error { return e.cni().GCNetworkList(ctx, e.ConfList(t), args) })
}

// Status runs the chain's STATUS.
func (e *Env) Status(t testing.TB) error {
	t.Helper()
	ctx, cancel := e.ctx()
	defer cancel()
	return e.Node.Do(func() error { return e.cni().GetStatusNetworkList(ctx, e.ConfList(t)) })
}

// Exec runs vpcip-cni alone from the node netns with the given environment
// and stdin, as a runtime would, and returns stdout, stderr and the exit
// error.
func (e *Env) Exec(t testing.TB, env map[string]string, stdin []byte) (stdout, stderr []byte, err error) {
	t.Helper()
	var out, errb bytes.Buffer
	err = e.Node.Do(func() error {
		cmd := exec.Command(filepath.Join(e.BinDir, "vpcip-cni"))
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "CNI_PATH=" + e.BinDir}
		for k, v := range env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(stdin), &out, &errb
		return cmd.Run()
	})
	return out.Bytes(), errb.Bytes(), err
}

// CNICode returns the CNI error code carried by err (a libcni error wraps
// the plugin's *types.Error), or 0.
func CNICode(err error) uint {
	var te *types.Error
	if errors.As(err, &te) {
		return te.Code
	}
	return 0
}
