package kubecluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/vpcip/vpcip/test/containerd/crinode"
)

// The campaign's workload: the churned Deployments, churn itself, and the
// count of the daemons' API requests.

// deploy starts the churned Deployments and the crash-looping pod (its
// container exits at once, so kubelet restarts it with back-off while its
// sandbox keeps its address).
func (ch *Chaos) deploy(ctx context.Context) error {
	for _, d := range []string{churnA, churnB} {
		m, err := ch.S.deployment(d, 4, "")
		if err != nil {
			return err
		}
		if err := ch.S.C.Apply(ctx, m); err != nil {
			return err
		}
	}
	image, err := crinode.ImageName(ch.S.C.Image)
	if err != nil {
		return err
	}
	crash := fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: %[1]s, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: %[1]s}}
  template:
    metadata: {labels: {app: %[1]s}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
        - {name: exits, image: %[2]q, imagePullPolicy: Never, command: ["/usr/local/bin/vpcipd", "-version"]}
`, crashLoop, image)
	if err := ch.S.C.Apply(ctx, crash); err != nil {
		return err
	}
	_, err = ch.S.C.WaitPods(ctx, "default", "app in ("+churnA+","+churnB+")", 4*time.Minute, "8 churn pods Running", AllRunning(8))
	return err
}

// churn changes the workload every 1 to 4 s until ctx ends: scale a
// Deployment to 0..9 replicas, restart its rollout, or force-delete one of
// its pods. Errors (the API server may be down) are counted, not fatal.
func (ch *Chaos) churn(ctx context.Context) {
	for ctx.Err() == nil {
		ch.rngMu.Lock()
		op, d := ch.churnRng.IntN(10), []string{churnA, churnB}[ch.churnRng.IntN(2)]
		replicas, pick, pause := ch.churnRng.IntN(10), ch.churnRng.IntN(100), 1000+ch.churnRng.IntN(3000)
		ch.rngMu.Unlock()
		var what string
		var err error
		switch {
		case op < 4:
			what, err = "scale", ch.scale(ctx, d, replicas)
		case op < 6:
			what = "rollout restart"
			_, err = ch.S.C.Kubectl(ctx, "rollout", "restart", "deployment", d)
		default:
			what = "force delete"
			var pods []Pod
			if pods, err = ch.S.C.Pods(ctx, "default", "app="+d); err == nil && len(pods) > 0 {
				p := pods[pick%len(pods)]
				_, err = ch.S.C.Kubectl(ctx, "delete", "pod", p.Name, "--force", "--grace-period=0", "--wait=false")
			}
		}
		if err != nil && ctx.Err() == nil {
			what += " (failed)"
		}
		ch.mu.Lock()
		ch.churned[what]++
		ch.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(pause) * time.Millisecond):
		}
	}
}

func (ch *Chaos) scale(ctx context.Context, d string, replicas int) error {
	_, err := ch.S.C.Kubectl(ctx, "scale", "deployment", d, fmt.Sprintf("--replicas=%d", replicas))
	return err
}

// daemonFlowSchema classifies the vpcip daemons' requests (API Priority and
// Fairness) so that kube-apiserver's
// apiserver_flowcontrol_dispatched_requests_total counts them apart.
const daemonFlowSchema = "vpcip-daemons"

// countDaemonRequests makes the FlowSchema that matches the DaemonSet's
// ServiceAccount, at the priority level kube-system's service accounts
// already use.
func (ch *Chaos) countDaemonRequests(ctx context.Context) error {
	sa, err := ch.S.C.Kubectl(ctx, "get", "daemonset", "-n", "kube-system", "-l", "app.kubernetes.io/name=vpcip",
		"-o", "jsonpath={.items[0].spec.template.spec.serviceAccountName}")
	if err != nil || sa == "" {
		return fmt.Errorf("the DaemonSet's ServiceAccount: %q %v", sa, err)
	}
	return ch.S.C.Apply(ctx, fmt.Sprintf(`apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: FlowSchema
metadata: {name: %s}
spec:
  matchingPrecedence: 300
  priorityLevelConfiguration: {name: workload-high}
  distinguisherMethod: {type: ByUser}
  rules:
    - subjects: [{kind: ServiceAccount, serviceAccount: {name: %s, namespace: kube-system}}]
      resourceRules: [{verbs: ["*"], apiGroups: ["*"], resources: ["*"], namespaces: ["*"], clusterScope: true}]
      nonResourceRules: [{verbs: ["*"], nonResourceURLs: ["*"]}]
`, daemonFlowSchema, sa))
}

// apiCounter sums the daemons' dispatched requests across API server
// restarts (the counter starts again at 0 in a new process).
type apiCounter struct {
	mu      sync.Mutex
	started bool // the first sample is the baseline
	last    float64
	total   int
	at      time.Time // of the last sample read
}

// sampleEvery samples when the last sample is older than every: the API
// server's /metrics is megabytes, and reading it in every check took a
// third of the checker's time. The count is lost only across a restart of
// the API server, which the campaign's fault samples right before.
func (a *apiCounter) sampleEvery(ctx context.Context, c *Cluster, every time.Duration) {
	a.mu.Lock()
	due := time.Since(a.at) >= every
	a.mu.Unlock()
	if due {
		a.sample(ctx, c)
	}
}

func (a *apiCounter) sample(ctx context.Context, c *Cluster) {
	v, err := daemonRequests(ctx, c)
	if err != nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.at = time.Now()
	switch {
	case !a.started:
		a.started = true
	case v < a.last: // a restarted API server counts from 0
		a.total += int(v)
	default:
		a.total += int(v - a.last)
	}
	a.last = v
}

// daemonRequests reads apiserver_flowcontrol_dispatched_requests_total of
// the daemons' FlowSchema from kube-apiserver's /metrics.
func daemonRequests(ctx context.Context, c *Cluster) (float64, error) {
	cs, err := kubernetes.NewForConfig(c.API.Config)
	if err != nil {
		return 0, err
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	body, err := cs.RESTClient().Get().AbsPath("/metrics").DoRaw(cctx)
	if err != nil {
		return 0, err
	}
	return sumMetric(string(body), "apiserver_flowcontrol_dispatched_requests_total", `flow_schema="`+daemonFlowSchema+`"`)
}

// sumMetric adds the samples of a metric (Prometheus text format) whose
// labels contain label.
func sumMetric(text, name, label string) (float64, error) {
	var sum float64
	found := false
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") || !strings.Contains(line, label) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", line, err)
		}
		sum += v
		found = true
	}
	if !found {
		return 0, errors.New(name + " with " + label + ": no sample")
	}
	return sum, sc.Err()
}
