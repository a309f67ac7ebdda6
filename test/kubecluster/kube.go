package kubecluster

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Pod is what the scenario reads of a pod.
type Pod struct {
	Name, Namespace, Node, IP, Phase, UID string
	IPs                                   []string // status.podIPs, primary first
	Ready                                 bool
	Created                               time.Time
	ReadySince                            time.Time // last transition of the Ready condition
}

type podList struct {
	Items []struct {
		Metadata struct {
			Name, Namespace, UID string
			CreationTimestamp    time.Time `json:"creationTimestamp"`
		} `json:"metadata"`
		Spec struct {
			NodeName string `json:"nodeName"`
		} `json:"spec"`
		Status struct {
			Phase  string `json:"phase"`
			PodIP  string `json:"podIP"`
			PodIPs []struct {
				IP string `json:"ip"`
			} `json:"podIPs"`
			Conditions []struct {
				Type, Status       string
				LastTransitionTime time.Time `json:"lastTransitionTime"`
			} `json:"conditions"`
		} `json:"status"`
	} `json:"items"`
}

// Pods lists the pods of a namespace matching a label selector ("" for all).
func (c *Cluster) Pods(ctx context.Context, namespace, selector string) ([]Pod, error) {
	args := []string{"get", "pods", "-n", namespace, "-o", "json"}
	if selector != "" {
		args = append(args, "-l", selector)
	}
	out, err := c.Kubectl(ctx, args...)
	if err != nil {
		return nil, err
	}
	var l podList
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		return nil, fmt.Errorf("pods: %w", err)
	}
	var pods []Pod
	for _, it := range l.Items {
		p := Pod{Name: it.Metadata.Name, Namespace: it.Metadata.Namespace, UID: it.Metadata.UID, Node: it.Spec.NodeName,
			IP: it.Status.PodIP, Phase: it.Status.Phase, Created: it.Metadata.CreationTimestamp}
		for _, a := range it.Status.PodIPs {
			p.IPs = append(p.IPs, a.IP)
		}
		for _, cond := range it.Status.Conditions {
			if cond.Type == "Ready" {
				p.Ready, p.ReadySince = cond.Status == "True", cond.LastTransitionTime
			}
		}
		pods = append(pods, p)
	}
	return pods, nil
}

// WaitPods polls the pods matching selector until done says so, up to timeout.
func (c *Cluster) WaitPods(ctx context.Context, namespace, selector string, timeout time.Duration, what string, done func([]Pod) bool) ([]Pod, error) {
	deadline := time.Now().Add(timeout)
	for {
		pods, err := c.Pods(ctx, namespace, selector)
		if err == nil && done(pods) {
			return pods, nil
		}
		if ctx.Err() != nil {
			return pods, ctx.Err()
		}
		if time.Now().After(deadline) {
			return pods, fmt.Errorf("%s: not after %s (%d pods, %s; %v)", what, timeout, len(pods), phases(pods), err)
		}
		time.Sleep(time.Second)
	}
}

func phases(pods []Pod) string {
	count := map[string]int{}
	for _, p := range pods {
		count[p.Phase]++
	}
	var parts []string
	for k, v := range count {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	return strings.Join(parts, " ")
}

// AllRunning is a WaitPods condition: n pods, all Running and Ready with an IP.
func AllRunning(n int) func([]Pod) bool {
	return func(pods []Pod) bool {
		if len(pods) != n {
			return false
		}
		for _, p := range pods {
			if p.Phase != "Running" || !p.Ready || p.IP == "" {
				return false
			}
		}
		return true
	}
}

// Event is what the scenario reads of an Event.
type Event struct {
	Reason, Message, Object, Type string
}

// Events lists the Events of a namespace about one object (kind/name).
func (c *Cluster) Events(ctx context.Context, namespace, name string) ([]Event, error) {
	out, err := c.Kubectl(ctx, "get", "events", "-n", namespace, "--field-selector", "involvedObject.name="+name, "-o", "json")
	if err != nil {
		return nil, err
	}
	var l struct {
		Items []struct {
			Reason, Message, Type string
			InvolvedObject        struct{ Kind, Name string } `json:"involvedObject"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		return nil, err
	}
	var evs []Event
	for _, it := range l.Items {
		evs = append(evs, Event{Reason: it.Reason, Message: it.Message, Type: it.Type, Object: it.InvolvedObject.Kind + "/" + it.InvolvedObject.Name})
	}
	return evs, nil
}

// Apply applies a manifest given as YAML text.
func (c *Cluster) Apply(ctx context.Context, manifest string) error {
	return c.kubectlStdin(ctx, manifest, "apply", "-f", "-")
}

func jsonUnmarshal(s string, v any) error { return json.Unmarshal([]byte(s), v) }
