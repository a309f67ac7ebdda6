package kubecluster

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// LeadTimes are the lead times of one shape of pod creation: for each pod,
// from its binding to the node to the start of kubelet's first CNI ADD for
// it (see Scenario.LeadTimes).
type LeadTimes struct {
	Shape string
	Pods  []string
	Lead  []time.Duration // in Pods' order
	// Bound is when each pod was bound, from the shape's first binding.
	Bound []time.Duration
}

// Quantile returns the q-quantile (0–1) of the lead times, the nearest
// rank; 0 when there are none.
func (l LeadTimes) Quantile(q float64) time.Duration {
	if len(l.Lead) == 0 {
		return 0
	}
	s := slices.Clone(l.Lead)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// String is the line a note quotes: shape, count, p50/p90/max in
// milliseconds, and the span of the bindings.
func (l LeadTimes) String() string {
	span := time.Duration(0)
	if len(l.Bound) > 0 {
		span = slices.Max(l.Bound)
	}
	return fmt.Sprintf("lead time bind->first ADD, %s: n=%d p50=%d ms p90=%d ms max=%d ms (bindings over %d ms)", l.Shape, len(l.Lead),
		l.Quantile(0.5).Milliseconds(), l.Quantile(0.9).Milliseconds(), l.Quantile(1).Milliseconds(), span.Milliseconds())
}

// leadPod is a bare pause pod labelled app=label, without spec.nodeName:
// kube-scheduler binds it.
func (s *Scenario) leadPod(name, label string) (string, error) {
	image, err := s.pauseImage()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: default, labels: {app: %s}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - {name: pause, image: %q, imagePullPolicy: Never}
`, name, label, image), nil
}

// OneAtATime creates n pods labelled app=label, one every gap, waits until
// they all run, and returns their lead times.
func (s *Scenario) OneAtATime(ctx context.Context, label string, n int, gap time.Duration) (LeadTimes, error) {
	var names []string
	for i := range n {
		if i > 0 {
			time.Sleep(gap)
		}
		name := fmt.Sprintf("%s-%02d", label, i)
		m, err := s.leadPod(name, label)
		if err != nil {
			return LeadTimes{}, err
		}
		if err := s.C.Apply(ctx, m); err != nil {
			return LeadTimes{}, err
		}
		names = append(names, name)
	}
	return s.LeadTimes(ctx, fmt.Sprintf("one at a time (%d pods, one every %s)", n, gap), label, names)
}

// Burst creates n pods labelled app=label in one kubectl apply, waits until
// they all run, and returns their lead times.
func (s *Scenario) Burst(ctx context.Context, label string, n int) (LeadTimes, error) {
	var docs, names []string
	for i := range n {
		name := fmt.Sprintf("%s-%02d", label, i)
		m, err := s.leadPod(name, label)
		if err != nil {
			return LeadTimes{}, err
		}
		docs, names = append(docs, m), append(names, name)
	}
	if err := s.C.Apply(ctx, strings.Join(docs, "---\n")); err != nil {
		return LeadTimes{}, err
	}
	return s.LeadTimes(ctx, fmt.Sprintf("burst (%d pods in one apply)", n), label, names)
}

// LeadTimes waits until the named pods (label app=label) run and measures,
// for each, the lead time from its binding to the start of kubelet's first
// CNI ADD for it:
//
//   - the binding is the eventTime of the scheduler's Scheduled event of
//     the pod (events.k8s.io/v1, microseconds; the scheduler records it
//     once its Binding call returned). The pods are created without
//     spec.nodeName: kube-scheduler binds them. The PodScheduled
//     condition's lastTransitionTime (whole seconds) is checked as well;
//   - the ADD's start is the plugin's own record on the node
//     (/var/log/vpcip/plugin.log, the chart's default pluginLogFile): the
//     "added" line's time less its assignMs and wireMs, i.e. when the
//     plugin began its call to vpcipd, with the earliest such line of the
//     pod taken when there are several (a retried sandbox).
//
// It fails when a pod has no Scheduled event or no ADD, or when a pod's ADD
// starts before its binding by either clock: the invariant any lead time
// must keep.
func (s *Scenario) LeadTimes(ctx context.Context, shape, label string, names []string) (LeadTimes, error) {
	if _, err := s.C.WaitPods(ctx, "default", "app="+label, 3*time.Minute, fmt.Sprintf("%d %s pods Running", len(names), label), AllRunning(len(names))); err != nil {
		return LeadTimes{}, err
	}
	bound, err := s.bindings(ctx)
	if err != nil {
		return LeadTimes{}, err
	}
	cond, err := s.scheduledConditions(ctx, label)
	if err != nil {
		return LeadTimes{}, err
	}
	adds := map[string]time.Time{}
	for _, n := range s.C.Nodes {
		if err := firstAdds(n.path("log-vpcip", "plugin.log"), adds); err != nil {
			return LeadTimes{}, err
		}
	}
	l := LeadTimes{Shape: shape}
	var errs []error
	for _, name := range names {
		b, ok := bound[name]
		a, added := adds[name]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("pod %s: no Scheduled event", name))
		case !added:
			errs = append(errs, fmt.Errorf("pod %s: no ADD in the plugin's log", name))
		case a.Before(b) || a.Before(cond[name].Truncate(time.Second)):
			errs = append(errs, fmt.Errorf("pod %s: first ADD at %s, before its binding (Scheduled event %s, PodScheduled %s)",
				name, a.Format(time.RFC3339Nano), b.Format(time.RFC3339Nano), cond[name].Format(time.RFC3339)))
		default:
			l.Pods, l.Lead, l.Bound = append(l.Pods, name), append(l.Lead, a.Sub(b)), append(l.Bound, time.Duration(b.UnixNano()))
		}
	}
	if len(l.Bound) > 0 {
		first := slices.Min(l.Bound)
		for i := range l.Bound {
			l.Bound[i] -= first
		}
	}
	return l, errors.Join(errs...)
}

// bindings maps pod name to the eventTime of its Scheduled event in the
// default namespace.
func (s *Scenario) bindings(ctx context.Context) (map[string]time.Time, error) {
	out, err := s.C.Kubectl(ctx, "get", "events.v1.events.k8s.io", "-n", "default", "--field-selector", "reason=Scheduled", "-o", "json")
	if err != nil {
		return nil, err
	}
	var l struct {
		Items []struct {
			EventTime time.Time `json:"eventTime"`
			Regarding struct{ Kind, Name string }
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		return nil, fmt.Errorf("Scheduled events: %w", err)
	}
	m := map[string]time.Time{}
	for _, it := range l.Items {
		if it.Regarding.Kind == "Pod" && !it.EventTime.IsZero() {
			m[it.Regarding.Name] = it.EventTime
		}
	}
	return m, nil
}

// scheduledConditions maps pod name to its PodScheduled condition's
// lastTransitionTime (whole seconds).
func (s *Scenario) scheduledConditions(ctx context.Context, label string) (map[string]time.Time, error) {
	out, err := s.C.Kubectl(ctx, "get", "pods", "-n", "default", "-l", "app="+label, "-o", "json")
	if err != nil {
		return nil, err
	}
	var l podList
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		return nil, err
	}
	m := map[string]time.Time{}
	for _, it := range l.Items {
		for _, c := range it.Status.Conditions {
			if c.Type == "PodScheduled" && c.Status == "True" {
				m[it.Metadata.Name] = c.LastTransitionTime
			}
		}
	}
	return m, nil
}

// firstAdds reads a plugin log (JSON lines) and records into adds, per pod
// name in the default namespace, the earliest start of a successful ADD:
// the "added" line's time less its assignMs and wireMs.
func firstAdds(path string, adds map[string]time.Time) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var r struct {
			Time         time.Time
			Msg, Cmd     string
			PodName      string `json:"pod"`
			PodNamespace string `json:"podNamespace"`
			AssignMs     float64
			WireMs       float64
		}
		if json.Unmarshal(sc.Bytes(), &r) != nil || r.Cmd != "ADD" || r.Msg != "added" || r.PodNamespace != "default" {
			continue
		}
		start := r.Time.Add(-time.Duration((r.AssignMs + r.WireMs) * float64(time.Millisecond)))
		if prev, ok := adds[r.PodName]; !ok || start.Before(prev) {
			adds[r.PodName] = start
		}
	}
	return sc.Err()
}
