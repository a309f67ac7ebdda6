// Package podruntime is vpcsim's minimal container runtime: it does for a
// simulated node what containerd's CRI does for a real one when a pod sandbox
// starts or stops. It creates the pod's network namespace, loads the
// lexically first network configuration list from the node's CNI conf dir,
// and executes the chain through libcni (the library container runtimes use)
// with Kubernetes-style CNI_ARGS, from inside the node's network namespace so
// the plugin sees the node as its host. DEL, CHECK, GC and STATUS run the same
// way.
package podruntime

import (
	"context"
	"crypto/rand"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"net/netip"
	"path/filepath"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/vpcip/vpcip/test/netnsdir"
)

// NetnsDir is where named network namespaces are bind-mounted (as iproute2's
// `ip netns add` does).
const NetnsDir = "/var/run/netns"

// Node runs pods on one simulated node.
type Node struct {
	Netns    string // name of the node's network namespace (under NetnsDir)
	ConfDir  string // CNI conf dir; the lexically first *.conflist is used
	BinDir   string // CNI bin dir
	CacheDir string // libcni result cache (as containerd's /var/lib/cni)
	Prefix   string // prefix of the pod netns names this node creates
}

// PodSpec names a pod to start.
type PodSpec struct {
	Namespace string // Kubernetes namespace, e.g. "default"
	Name      string // pod name
	IfName    string // default "eth0"
	UID       string // K8S_POD_UID, as kubelet passes the API object's; default random
}

// Pod is a started pod sandbox.
type Pod struct {
	PodSpec
	UID         string
	ContainerID string     // 64 hex digits, as a sandbox id
	Netns       string     // pod netns name (under NetnsDir)
	Address     netip.Addr // the IPv4 address of the result's first IP
	Result      *types100.Result
	Network     string        // the network name of the conflist used
	AddTime     time.Duration // how long the chain's ADD took (libcni call only, not netns creation)
	DelTime     time.Duration // how long the chain's DEL took, once Del ran
}

// NetnsPath is the pod's netns path, CNI_NETNS.
func (p *Pod) NetnsPath() string { return filepath.Join(NetnsDir, p.Netns) }

func (n *Node) cni() *libcni.CNIConfig {
	return libcni.NewCNIConfigWithCacheDir([]string{n.BinDir}, n.CacheDir, nil)
}

// ConfList loads the lexically first .conflist in ConfDir, as containerd does.
func (n *Node) ConfList() (*libcni.NetworkConfigList, error) {
	files, err := libcni.ConfFiles(n.ConfDir, []string{".conflist"})
	if err != nil {
		return nil, fmt.Errorf("read CNI conf dir %s: %w", n.ConfDir, err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no .conflist in %s: the node's network is not ready", n.ConfDir)
	}
	first := files[0]
	for _, f := range files {
		if f < first {
			first = f
		}
	}
	return libcni.ConfListFromFile(first)
}

// Add creates the pod's netns and runs CNI ADD for it. On failure the netns
// is removed again and the chain's DEL is run, as a runtime does.
func (n *Node) Add(ctx context.Context, spec PodSpec) (*Pod, error) {
	if spec.IfName == "" {
		spec.IfName = "eth0"
	}
	list, err := n.ConfList()
	if err != nil {
		return nil, err
	}
	pod := &Pod{PodSpec: spec, UID: spec.UID, ContainerID: randomHex(32), Network: list.Name}
	if pod.UID == "" {
		pod.UID = randomHex(16)
	}
	pod.Netns = n.podNetnsName(spec)
	if err := CreateNetns(pod.Netns); err != nil {
		return nil, err
	}
	res, err := n.exec(func(c *libcni.CNIConfig) (types.Result, error) {
		t0 := time.Now()
		defer func() { pod.AddTime = time.Since(t0) }()
		return c.AddNetworkList(ctx, list, n.runtimeConf(pod))
	})
	if err != nil {
		_ = n.del(context.WithoutCancel(ctx), list, pod)
		_ = netnsdir.Delete(pod.Netns)
		return nil, fmt.Errorf("CNI ADD %s/%s: %w", spec.Namespace, spec.Name, err)
	}
	r, err := types100.GetResult(res)
	if err != nil {
		return nil, fmt.Errorf("CNI ADD %s/%s: result: %w", spec.Namespace, spec.Name, err)
	}
	pod.Result = r
	for _, ip := range r.IPs {
		if a, ok := netip.AddrFromSlice(ip.Address.IP.To4()); ok {
			pod.Address = a
			break
		}
	}
	return pod, nil
}

// Del runs CNI DEL for the pod and removes its netns. DEL is run even when
// the netns is already gone, as runtimes do.
func (n *Node) Del(ctx context.Context, pod *Pod) error {
	list, err := n.ConfList()
	if err != nil {
		return err
	}
	if err := n.del(ctx, list, pod); err != nil {
		return fmt.Errorf("CNI DEL %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	if err := netnsdir.Delete(pod.Netns); err != nil {
		return fmt.Errorf("remove netns %s: %w", pod.Netns, err)
	}
	return nil
}

func (n *Node) del(ctx context.Context, list *libcni.NetworkConfigList, pod *Pod) error {
	_, err := n.exec(func(c *libcni.CNIConfig) (types.Result, error) {
		t0 := time.Now()
		defer func() { pod.DelTime = time.Since(t0) }()
		return nil, c.DelNetworkList(ctx, list, n.runtimeConf(pod))
	})
	return err
}

// Check runs CNI CHECK for the pod.
func (n *Node) Check(ctx context.Context, pod *Pod) error {
	list, err := n.ConfList()
	if err != nil {
		return err
	}
	_, err = n.exec(func(c *libcni.CNIConfig) (types.Result, error) {
		return nil, c.CheckNetworkList(ctx, list, n.runtimeConf(pod))
	})
	return err
}

// GC runs CNI GC (spec 1.1) with the given pods as the valid attachments.
func (n *Node) GC(ctx context.Context, valid []*Pod) error {
	list, err := n.ConfList()
	if err != nil {
		return err
	}
	args := &libcni.GCArgs{}
	for _, p := range valid {
		args.ValidAttachments = append(args.ValidAttachments, types.GCAttachment{ContainerID: p.ContainerID, IfName: p.IfName})
	}
	_, err = n.exec(func(c *libcni.CNIConfig) (types.Result, error) {
		return nil, c.GCNetworkList(ctx, list, args)
	})
	return err
}

// Status runs CNI STATUS (spec 1.1): nil when the network is ready.
func (n *Node) Status(ctx context.Context) error {
	list, err := n.ConfList()
	if err != nil {
		return err
	}
	_, err = n.exec(func(c *libcni.CNIConfig) (types.Result, error) {
		return nil, c.GetStatusNetworkList(ctx, list)
	})
	return err
}

// exec runs fn on an OS thread switched into the node's netns, so plugins the
// runtime executes inherit the node as their host namespace.
func (n *Node) exec(fn func(*libcni.CNIConfig) (types.Result, error)) (types.Result, error) {
	nodeNS, err := ns.GetNS(filepath.Join(NetnsDir, n.Netns))
	if err != nil {
		return nil, fmt.Errorf("node netns %s: %w", n.Netns, err)
	}
	defer nodeNS.Close()
	var res types.Result
	err = nodeNS.Do(func(ns.NetNS) error {
		var ferr error
		res, ferr = fn(n.cni())
		return ferr
	})
	return res, err
}

func (n *Node) runtimeConf(p *Pod) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID: p.ContainerID,
		NetNS:       p.NetnsPath(),
		IfName:      p.IfName,
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", p.Namespace},
			{"K8S_POD_NAME", p.Name},
			{"K8S_POD_INFRA_CONTAINER_ID", p.ContainerID},
			{"K8S_POD_UID", p.UID},
		},
	}
}

// podNetnsName is prefix + a short hash of namespace/name, at most 40 bytes.
func (n *Node) podNetnsName(spec PodSpec) string {
	sum := sha1.Sum([]byte(spec.Namespace + "/" + spec.Name + "/" + randomHex(4)))
	return n.Prefix + "-p" + hex.EncodeToString(sum[:])[:10]
}

// CreateNetns creates a named netns without moving the caller's thread
// (netnsdir: safe when other processes make their first netns at once).
func CreateNetns(name string) error { return netnsdir.Create(name) }

// CleanupNetns removes every named netns whose name starts with prefix,
// also names hidden under stacked /run/netns mounts.
func CleanupNetns(prefix string) error { return netnsdir.DeletePrefix(prefix) }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
