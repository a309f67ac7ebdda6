package crinode

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// crictlTimeout bounds one crictl call; it is also crictl's own CRI timeout.
const crictlTimeout = 2 * time.Minute

// Pod names a pod sandbox (CRI PodSandboxMetadata).
type Pod struct {
	Name      string
	Namespace string
	UID       string
	Attempt   uint32
}

// Sandbox is what CRI PodSandboxStatus (crictl inspectp) reports.
type Sandbox struct {
	ID            string
	State         string // "SANDBOX_READY" or "SANDBOX_NOTREADY"
	Pod           Pod
	IP            netip.Addr   // status.network.ip; invalid when the sandbox has none
	AdditionalIPs []netip.Addr // status.network.additionalIps
	PID           int          // the pause process (verbose info), 0 when not running
	NetnsPath     string       // the pod network namespace containerd made (verbose info)
}

// Status is the CRI runtime status (crictl info): the conditions a kubelet
// reads to decide whether the node is ready for pods.
type Status struct {
	RuntimeReady   bool
	NetworkReady   bool
	NetworkReason  string // e.g. "NetworkPluginNotReady"
	NetworkMessage string // e.g. "Network plugin returns error: cni plugin not initialized"
}

// crictl runs crictl against this node with no config file, and returns stdout.
func (n *Node) crictl(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, crictlTimeout+10*time.Second)
	defer cancel()
	endpoint := "unix://" + n.Socket
	full := append([]string{"--config", os.DevNull, "--runtime-endpoint", endpoint, "--image-endpoint", endpoint,
		"--timeout", crictlTimeout.String()}, args...)
	cmd := exec.CommandContext(ctx, n.Tools.Crictl, full...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("crictl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// RunPodSandbox asks CRI to run a pod sandbox (crictl runp) and returns its
// ID. containerd creates the netns, runs the CNI ADD chain of the first
// conflist in CNIConfDir, then starts the pause container.
func (n *Node) RunPodSandbox(ctx context.Context, p Pod) (string, error) {
	cfg := map[string]any{
		"metadata":      map[string]any{"name": p.Name, "namespace": p.Namespace, "uid": p.UID, "attempt": p.Attempt},
		"hostname":      p.Name,
		"log_directory": filepath.Join(n.Dir, "pods", p.Namespace+"_"+p.Name+"_"+p.UID),
		"linux":         map[string]any{},
	}
	data, err := json.Marshal(cfg)
	if err != nil {
		return "", err
	}
	f, err := os.CreateTemp(n.Dir, "pod-*.json")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return "", err
	}
	f.Close()
	out, err := n.crictl(ctx, "runp", f.Name())
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
}

// inspect is the subset of `crictl inspectp -o json` this package reads.
type inspect struct {
	Status struct {
		ID       string `json:"id"`
		State    string `json:"state"`
		Metadata struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
			UID       string `json:"uid"`
			Attempt   uint32 `json:"attempt"`
		} `json:"metadata"`
		Network *struct {
			IP            string `json:"ip"`
			AdditionalIPs []struct {
				IP string `json:"ip"`
			} `json:"additionalIps"`
		} `json:"network"`
	} `json:"status"`
	Info struct {
		PID         int `json:"pid"`
		RuntimeSpec struct {
			Linux struct {
				Namespaces []struct {
					Type string `json:"type"`
					Path string `json:"path"`
				} `json:"namespaces"`
			} `json:"linux"`
		} `json:"runtimeSpec"`
	} `json:"info"`
}

// InspectPodSandbox returns the sandbox's CRI status (crictl inspectp).
func (n *Node) InspectPodSandbox(ctx context.Context, id string) (Sandbox, error) {
	out, err := n.crictl(ctx, "inspectp", "-o", "json", id)
	if err != nil {
		return Sandbox{}, err
	}
	return parseInspect(out)
}

func parseInspect(out []byte) (Sandbox, error) {
	var in inspect
	if err := json.Unmarshal(out, &in); err != nil {
		return Sandbox{}, fmt.Errorf("crinode: parse inspectp: %w", err)
	}
	st := in.Status
	sb := Sandbox{
		ID: st.ID, State: st.State, PID: in.Info.PID,
		Pod: Pod{Name: st.Metadata.Name, Namespace: st.Metadata.Namespace, UID: st.Metadata.UID, Attempt: st.Metadata.Attempt},
	}
	if st.Network != nil && st.Network.IP != "" {
		a, err := netip.ParseAddr(st.Network.IP)
		if err != nil {
			return sb, fmt.Errorf("crinode: sandbox %s: %w", st.ID, err)
		}
		sb.IP = a
		for _, extra := range st.Network.AdditionalIPs {
			a, err := netip.ParseAddr(extra.IP)
			if err != nil {
				return sb, fmt.Errorf("crinode: sandbox %s: %w", st.ID, err)
			}
			sb.AdditionalIPs = append(sb.AdditionalIPs, a)
		}
	}
	for _, ns := range in.Info.RuntimeSpec.Linux.Namespaces {
		if ns.Type == "network" {
			sb.NetnsPath = ns.Path
		}
	}
	return sb, nil
}

// StopPodSandbox stops the sandbox (crictl stopp): containerd runs the CNI
// DEL chain and stops the pause container. Stopping a stopped sandbox succeeds.
func (n *Node) StopPodSandbox(ctx context.Context, id string) error {
	_, err := n.crictl(ctx, "stopp", id)
	return err
}

// RemovePodSandbox removes a stopped sandbox (crictl rmp).
func (n *Node) RemovePodSandbox(ctx context.Context, id string) error {
	_, err := n.crictl(ctx, "rmp", id)
	return err
}

// PodSandboxIDs lists the IDs of every sandbox CRI knows, ready or not.
func (n *Node) PodSandboxIDs(ctx context.Context) ([]string, error) {
	out, err := n.crictl(ctx, "pods", "-q", "--no-trunc")
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(out)), nil
}

// Status returns the CRI runtime status conditions (crictl info).
func (n *Node) Status(ctx context.Context) (Status, error) {
	out, err := n.crictl(ctx, "info", "-o", "json")
	if err != nil {
		return Status{}, err
	}
	return parseStatus(out)
}

func parseStatus(out []byte) (Status, error) {
	var info struct {
		Status struct {
			Conditions []struct {
				Type    string `json:"type"`
				Status  bool   `json:"status"`
				Reason  string `json:"reason"`
				Message string `json:"message"`
			} `json:"conditions"`
		} `json:"status"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		return Status{}, fmt.Errorf("crinode: parse info: %w", err)
	}
	var s Status
	for _, c := range info.Status.Conditions {
		switch c.Type {
		case "RuntimeReady":
			s.RuntimeReady = c.Status
		case "NetworkReady":
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
