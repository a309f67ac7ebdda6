package crinode

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// callTimeout bounds one CRI call, as the kubelet's runtime request timeout
// (2 minutes by default) does.
const callTimeout = 2 * time.Minute

// Pod names a pod sandbox (CRI PodSandboxMetadata).
type Pod struct {
	Name      string
	Namespace string
	UID       string
	Attempt   uint32
}

// Sandbox is what CRI PodSandboxStatus (verbose) reports.
type Sandbox struct {
	ID            string
	State         string // "SANDBOX_READY" or "SANDBOX_NOTREADY"
	Pod           Pod
	IP            netip.Addr   // status.network.ip; invalid when the sandbox has none
	AdditionalIPs []netip.Addr // status.network.additional_ips
	PID           int          // the pause process (verbose info), 0 when not running
	NetnsPath     string       // the pod network namespace containerd made (verbose info)
}

// Status is the CRI runtime status: the conditions a kubelet reads to decide
// whether the node is ready for pods.
type Status struct {
	RuntimeReady   bool
	NetworkReady   bool
	NetworkReason  string // e.g. "NetworkPluginNotReady"
	NetworkMessage string // e.g. "Network plugin returns error: cni plugin not initialized"
}

// dial opens the CRI client connection. It reconnects on its own after a
// containerd restart; the short backoff keeps that within a fraction of a
// second instead of gRPC's default of up to two minutes.
func (n *Node) dial() error {
	conn, err := grpc.NewClient("unix://"+n.Socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, MaxDelay: 500 * time.Millisecond},
			MinConnectTimeout: 5 * time.Second,
		}))
	if err != nil {
		return fmt.Errorf("crinode: CRI client: %w", err)
	}
	n.conn, n.cri = conn, cri.NewRuntimeServiceClient(conn)
	return nil
}

// RunPodSandbox asks CRI to run a pod sandbox and returns its ID.
// containerd creates the netns, runs the CNI ADD chain of the first conflist
// in CNIConfDir, then starts the pause container.
func (n *Node) RunPodSandbox(ctx context.Context, p Pod) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := n.cri.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: &cri.PodSandboxConfig{
		Metadata:     &cri.PodSandboxMetadata{Name: p.Name, Namespace: p.Namespace, Uid: p.UID, Attempt: p.Attempt},
		Hostname:     p.Name,
		LogDirectory: filepath.Join(n.Dir, "pods", p.Namespace+"_"+p.Name+"_"+p.UID),
		Linux:        &cri.LinuxPodSandboxConfig{},
	}})
	if err != nil {
		return "", fmt.Errorf("RunPodSandbox %s/%s: %w", p.Namespace, p.Name, err)
	}
	return resp.PodSandboxId, nil
}

// InspectPodSandbox returns the sandbox's CRI status, with the verbose info
// containerd adds (pause PID, netns path).
func (n *Node) InspectPodSandbox(ctx context.Context, id string) (Sandbox, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := n.cri.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
	if err != nil {
		return Sandbox{}, fmt.Errorf("PodSandboxStatus %s: %w", id, err)
	}
	return sandboxFrom(resp)
}

func sandboxFrom(resp *cri.PodSandboxStatusResponse) (Sandbox, error) {
	st := resp.GetStatus()
	md := st.GetMetadata()
	sb := Sandbox{
		ID: st.GetId(), State: st.GetState().String(),
		Pod: Pod{Name: md.GetName(), Namespace: md.GetNamespace(), UID: md.GetUid(), Attempt: md.GetAttempt()},
	}
	if ip := st.GetNetwork().GetIp(); ip != "" {
		a, err := netip.ParseAddr(ip)
		if err != nil {
			return sb, fmt.Errorf("crinode: sandbox %s: %w", sb.ID, err)
		}
		sb.IP = a
	}
	for _, extra := range st.GetNetwork().GetAdditionalIps() {
		a, err := netip.ParseAddr(extra.GetIp())
		if err != nil {
			return sb, fmt.Errorf("crinode: sandbox %s: %w", sb.ID, err)
		}
		sb.AdditionalIPs = append(sb.AdditionalIPs, a)
	}
	if info, ok := resp.GetInfo()["info"]; ok {
		pid, netns, err := parseVerboseInfo([]byte(info))
		if err != nil {
			return sb, fmt.Errorf("crinode: sandbox %s: %w", sb.ID, err)
		}
		sb.PID, sb.NetnsPath = pid, netns
	}
	return sb, nil
}

// parseVerboseInfo reads the pause PID and the network namespace path from
// the JSON containerd puts under the "info" key of a verbose status.
func parseVerboseInfo(data []byte) (pid int, netns string, err error) {
	var info struct {
		PID         int `json:"pid"`
		RuntimeSpec struct {
			Linux struct {
				Namespaces []struct {
					Type string `json:"type"`
					Path string `json:"path"`
				} `json:"namespaces"`
			} `json:"linux"`
		} `json:"runtimeSpec"`
	}
	if err := json.Unmarshal(data, &info); err != nil {
		return 0, "", fmt.Errorf("parse verbose info: %w", err)
	}
	for _, ns := range info.RuntimeSpec.Linux.Namespaces {
		if ns.Type == "network" {
			netns = ns.Path
		}
	}
	return info.PID, netns, nil
}

// StopPodSandbox stops the sandbox: containerd runs the CNI DEL chain and
// stops the pause container. Stopping a stopped sandbox succeeds.
func (n *Node) StopPodSandbox(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if _, err := n.cri.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		return fmt.Errorf("StopPodSandbox %s: %w", id, err)
	}
	return nil
}

// RemovePodSandbox removes a sandbox (stopping it first if needed).
func (n *Node) RemovePodSandbox(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if _, err := n.cri.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		return fmt.Errorf("RemovePodSandbox %s: %w", id, err)
	}
	return nil
}

// PodSandboxIDs lists the IDs of every sandbox CRI knows, ready or not.
func (n *Node) PodSandboxIDs(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := n.cri.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if err != nil {
		return nil, fmt.Errorf("ListPodSandbox: %w", err)
	}
	ids := make([]string, 0, len(resp.Items))
	for _, it := range resp.Items {
		ids = append(ids, it.Id)
	}
	return ids, nil
}

// Status returns the CRI runtime status conditions.
func (n *Node) Status(ctx context.Context) (Status, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := n.cri.Status(ctx, &cri.StatusRequest{})
	if err != nil {
		return Status{}, fmt.Errorf("Status: %w", err)
	}
	var s Status
	for _, c := range resp.GetStatus().GetConditions() {
		switch c.Type {
		case cri.RuntimeReady:
			s.RuntimeReady = c.Status
		case cri.NetworkReady:
			s.NetworkReady, s.NetworkReason, s.NetworkMessage = c.Status, c.Reason, c.Message
		}
	}
	return s, nil
}

// WaitNetworkReady polls CRI status until the network is ready (containerd
// watches CNIConfDir and loads a new conflist within a moment) or the timeout.
func (n *Node) WaitNetworkReady(ctx context.Context, timeout time.Duration) (Status, error) {
	deadline := time.Now().Add(timeout)
	for {
		s, err := n.Status(ctx)
		if err == nil && s.NetworkReady {
			return s, nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("crinode: network not ready after %v: %s: %s", timeout, s.NetworkReason, s.NetworkMessage)
			}
			return s, err
		}
		select {
		case <-ctx.Done():
			return s, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
