package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vpcip/vpcip/ipamd/api"
)

// network is the CNI network name the harness's attachments carry.
const network = "vpcip"

// Pod is a pod the harness created, bound to Node, and the attachment it
// holds through the socket API.
type Pod struct {
	Node    *Node
	Name    string
	UID     string
	Key     api.Key
	Address string
}

// tally collects pod waits and failures from many goroutines.
type tally struct {
	mu     sync.Mutex // guards the fields below
	waits  []time.Duration
	failed []string
	pods   map[*Node][]*Pod
}

func newTally() *tally { return &tally{pods: map[*Node][]*Pod{}} }

func (t *tally) ok(p *Pod, wait time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.waits = append(t.waits, wait)
	t.pods[p.Node] = append(t.pods[p.Node], p)
}

func (t *tally) fail(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.failed = append(t.failed, err.Error())
}

// Pods are the pods holding an address, by node.
func (t *tally) Pods() map[*Node][]*Pod { return t.pods }

// podCounter names pods uniquely within a fleet.
var podCounter struct {
	mu sync.Mutex
	n  int
}

func nextPodName(n *Node) string {
	podCounter.mu.Lock()
	defer podCounter.mu.Unlock()
	podCounter.n++
	return fmt.Sprintf("p%d-%s", podCounter.n, n.Name[len(n.fleet.Prefix)+1:])
}

// runPod creates a pod bound to n in the API, as the scheduler leaves it,
// then does what kubelet and the plugin do for its sandbox: CNI ADD through
// the socket API (the daemon holds it up to VPCIP_ADD_WAIT for an address),
// retried while the daemon answers "try again" (no address yet) or cannot
// be reached, until ctx ends, each retry after Options.ADDRetry stretched
// by up to half again (kubelet's pod worker requeues a pod whose sync
// failed after its backOffPeriod, 10 s, jittered by a factor of 0.5). The
// wait is from the pod's creation until its address.
func (f *Fleet) runPod(ctx context.Context, n *Node, t *tally) {
	name := nextPodName(n)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.Namespace},
		Spec: corev1.PodSpec{NodeName: n.Name, Containers: []corev1.Container{{Name: "c", Image: "pause"}}}}
	created := time.Now()
	pod, err := f.createPod(ctx, pod)
	if err != nil {
		t.fail(fmt.Errorf("create pod %s: %w", name, err))
		return
	}
	p := &Pod{Node: n, Name: name, UID: string(pod.UID), Key: api.Key{Network: network, ContainerID: containerID(), IfName: "eth0"}}
	req := api.AssignRequest{Key: p.Key, Pod: api.Pod{Namespace: f.Namespace, Name: name, UID: p.UID}}
	for {
		a, err := n.client.Assign(ctx, req)
		if err == nil {
			p.Address = a.Address.String()
			t.ok(p, time.Since(created))
			return
		}
		var ae *api.Error
		if !(errors.As(err, &ae) && ae.Retryable()) && !errors.Is(err, api.ErrUnreachable) {
			t.fail(fmt.Errorf("pod %s on %s: %w", name, n.Name, err))
			return
		}
		select {
		case <-ctx.Done():
			t.fail(fmt.Errorf("pod %s on %s: no address after %s: %v", name, n.Name, time.Since(created).Round(time.Second), err))
			return
		case <-time.After(f.ADDRetry + mrand.N(f.ADDRetry/2+1)):
		}
	}
}

// createPod creates the pod, retrying while the API server answers that it
// is overloaded or timed out (as the scheduler retries a bind), until ctx
// ends. A create that timed out may have been done: AlreadyExists then
// reads the pod back.
func (f *Fleet) createPod(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, error) {
	for {
		out, err := f.Admin.CoreV1().Pods(f.Namespace).Create(ctx, pod, metav1.CreateOptions{})
		switch {
		case err == nil:
			return out, nil
		case apierrors.IsAlreadyExists(err):
			return f.Admin.CoreV1().Pods(f.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		case !(apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) || apierrors.IsTooManyRequests(err) ||
			apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) || errors.Is(err, context.DeadlineExceeded) ||
			!isAPIStatus(err)):
			// An answer of the API server other than overload is final; a
			// failure to get one (a reset stream, a refused connection)
			// is retried as the scheduler's bind would be.
			return nil, err
		}
		f.apiRetries.Add(1)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (API server still refusing: %v)", ctx.Err(), err)
		case <-time.After(time.Second):
		}
	}
}

// isAPIStatus reports whether err is an answer of the API server (a Status),
// not a failure to reach it.
func isAPIStatus(err error) bool {
	var st apierrors.APIStatus
	return errors.As(err, &st)
}

// deletePod does CNI DEL through the socket API, then deletes the pod in the API.
func (f *Fleet) deletePod(ctx context.Context, p *Pod) error {
	if _, err := p.Node.client.Release(ctx, api.ReleaseRequest{Key: p.Key}); err != nil {
		return fmt.Errorf("release pod %s: %w", p.Name, err)
	}
	zero := int64(0)
	if err := f.Admin.CoreV1().Pods(f.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		return fmt.Errorf("delete pod %s: %w", p.Name, err)
	}
	return nil
}

func containerID() string {
	b := make([]byte, 32)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// LaunchOptions shape scenario (a).
type LaunchOptions struct {
	PodsPerNode  int           // pods each node gets once its daemon is ready (20)
	Spread       time.Duration // each pod is created at a random moment within it after its node is ready (1 minute)
	ReadyTimeout time.Duration // per daemon
	PodTimeout   time.Duration // per pod, from its creation
	Settle       time.Duration // after the last address, before the final measurement (pools top up)
}

// ScenarioLaunch is scenario (a): every daemon of the node group starts at
// once; as each becomes ready, its node is given PodsPerNode pods within
// Spread. It returns the report and the pods holding addresses.
func (f *Fleet) ScenarioLaunch(ctx context.Context, o LaunchOptions) (Report, map[*Node][]*Pod, error) {
	before, err := f.snapshot(ctx)
	if err != nil {
		return Report{}, nil, err
	}
	t := newTally()
	var wg sync.WaitGroup
	start := time.Now()
	var readyMu sync.Mutex
	var readyTimes []time.Duration
	err = f.StartDaemons(ctx, o.ReadyTimeout, func(n *Node) {
		readyMu.Lock()
		readyTimes = append(readyTimes, time.Since(start))
		readyMu.Unlock()
		for range o.PodsPerNode {
			delay := time.Duration(mrand.Int64N(int64(o.Spread) + 1))
			wg.Go(func() {
				select {
				case <-ctx.Done():
					return
				case <-time.After(delay):
				}
				pctx, cancel := context.WithTimeout(ctx, o.PodTimeout)
				defer cancel()
				f.runPod(pctx, n, t)
			})
		}
	})
	if err != nil {
		wg.Wait()
		return Report{}, nil, err
	}
	f.Logf("fleet: %d daemons ready, the last %s after start (median %s)", len(f.Nodes), quantile(readyTimes, 1).Round(time.Millisecond), quantile(readyTimes, 0.5).Round(time.Millisecond))
	wg.Wait()
	f.Logf("fleet: %d pods with an address, %d without, %s after start", len(t.waits), len(t.failed), time.Since(start).Round(time.Millisecond))
	sleep(ctx, o.Settle)
	after, err := f.snapshot(ctx)
	if err != nil {
		return Report{}, nil, err
	}
	r := f.report("a: node group launch", before, after, t.waits, t.failed)
	r.ReadyP50, r.ReadyMax = quantile(readyTimes, 0.5), quantile(readyTimes, 1)
	return r, t.Pods(), nil
}

// ChurnOptions shape scenario (c).
type ChurnOptions struct {
	Duration   time.Duration // how long pods churn
	Interval   time.Duration // each node replaces one pod this often (at a random phase)
	PodTimeout time.Duration
	Settle     time.Duration
}

// ScenarioChurn is scenario (c): for Duration, every node replaces one of
// its pods every Interval: CNI DEL and API delete of the oldest, then a new
// pod created and given an address. pods is updated in place.
func (f *Fleet) ScenarioChurn(ctx context.Context, pods map[*Node][]*Pod, o ChurnOptions) (Report, error) {
	before, err := f.snapshot(ctx)
	if err != nil {
		return Report{}, err
	}
	t := newTally()
	var wg sync.WaitGroup
	var delErrs sync.Map
	var deleted atomic.Int64
	var pmu sync.Mutex // guards pods
	end := time.Now().Add(o.Duration)
	for _, n := range f.Nodes {
		wg.Go(func() {
			sleep(ctx, time.Duration(mrand.Int64N(int64(o.Interval))))
			for time.Now().Before(end) && ctx.Err() == nil {
				pmu.Lock()
				var old *Pod
				if len(pods[n]) > 0 {
					old = pods[n][0]
					pods[n] = pods[n][1:]
				}
				pmu.Unlock()
				if old != nil {
					if err := f.deletePod(ctx, old); err != nil {
						delErrs.Store(old.Name, err)
					} else {
						deleted.Add(1)
					}
				}
				pctx, cancel := context.WithTimeout(ctx, o.PodTimeout)
				nt := newTally()
				f.runPod(pctx, n, nt)
				cancel()
				t.mu.Lock()
				t.waits = append(t.waits, nt.waits...)
				t.failed = append(t.failed, nt.failed...)
				t.mu.Unlock()
				pmu.Lock()
				pods[n] = append(pods[n], nt.pods[n]...)
				pmu.Unlock()
				sleep(ctx, o.Interval)
			}
		})
	}
	wg.Wait()
	delErrs.Range(func(k, v any) bool { t.failed = append(t.failed, v.(error).Error()); return true })
	sleep(ctx, o.Settle)
	after, err := f.snapshot(ctx)
	if err != nil {
		return Report{}, err
	}
	r := f.report("c: steady churn", before, after, t.waits, t.failed)
	r.Deleted = int(deleted.Load())
	return r, nil
}

// ScenarioScaleIn is scenario (d): every node loses half its pods at once
// (CNI DEL and API delete); the window runs for Settle after, while pools
// give surplus back.
func (f *Fleet) ScenarioScaleIn(ctx context.Context, pods map[*Node][]*Pod, settle time.Duration) (Report, error) {
	before, err := f.snapshot(ctx)
	if err != nil {
		return Report{}, err
	}
	var mu sync.Mutex
	var failed []string
	var wg sync.WaitGroup
	var deleted atomic.Int64
	sem := make(chan struct{}, 32)
	for _, n := range f.Nodes {
		half := len(pods[n]) / 2
		gone := pods[n][:half]
		pods[n] = pods[n][half:]
		for _, p := range gone {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				if err := f.deletePod(ctx, p); err != nil {
					mu.Lock()
					failed = append(failed, err.Error())
					mu.Unlock()
					return
				}
				deleted.Add(1)
			})
		}
	}
	wg.Wait()
	sleep(ctx, settle)
	after, err := f.snapshot(ctx)
	if err != nil {
		return Report{}, err
	}
	r := f.report("d: scale-in of half the pods", before, after, nil, failed)
	r.Pods, r.Deleted = 0, int(deleted.Load())
	return r, nil
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// RolloutOptions shape scenario (b).
type RolloutOptions struct {
	Waves      int           // the fleet's pods are replaced in this many waves (4)
	Pause      time.Duration // between the end of one wave and the start of the next
	PodTimeout time.Duration
	Settle     time.Duration
}

// ScenarioRollout is scenario (b), a rollout replacing every pod of the
// fleet in waves, as a Deployment's rolling update with maxSurge does: in
// each wave every node gets new pods for a 1/Waves share of its pods, and
// the old ones are deleted once the new ones hold their addresses. pods is
// updated in place.
func (f *Fleet) ScenarioRollout(ctx context.Context, pods map[*Node][]*Pod, o RolloutOptions) (Report, error) {
	before, err := f.snapshot(ctx)
	if err != nil {
		return Report{}, err
	}
	t := newTally()
	var deleted atomic.Int64
	var failMu sync.Mutex
	var delFailed []string
	old := map[*Node][]*Pod{}
	for n, ps := range pods {
		old[n] = ps
		pods[n] = nil
	}
	for w := range o.Waves {
		var wg sync.WaitGroup
		for _, n := range f.Nodes {
			all := old[n]
			lo, hi := len(all)*w/o.Waves, len(all)*(w+1)/o.Waves
			wave := all[lo:hi]
			wg.Go(func() {
				nt := newTally()
				var pw sync.WaitGroup
				for range wave {
					pw.Go(func() {
						sleep(ctx, time.Duration(mrand.Int64N(int64(time.Second))))
						pctx, cancel := context.WithTimeout(ctx, o.PodTimeout)
						defer cancel()
						f.runPod(pctx, n, nt)
					})
				}
				pw.Wait()
				for _, p := range wave {
					if err := f.deletePod(ctx, p); err != nil {
						failMu.Lock()
						delFailed = append(delFailed, err.Error())
						failMu.Unlock()
						continue
					}
					deleted.Add(1)
				}
				t.mu.Lock()
				t.waits = append(t.waits, nt.waits...)
				t.failed = append(t.failed, nt.failed...)
				t.pods[n] = append(t.pods[n], nt.pods[n]...)
				t.mu.Unlock()
			})
		}
		wg.Wait()
		f.Logf("fleet: rollout wave %d of %d done", w+1, o.Waves)
		if w < o.Waves-1 {
			sleep(ctx, o.Pause)
		}
	}
	for n, ps := range t.pods {
		pods[n] = ps
	}
	sleep(ctx, o.Settle)
	after, err := f.snapshot(ctx)
	if err != nil {
		return Report{}, err
	}
	r := f.report("b: rollout in waves", before, after, t.waits, append(t.failed, delFailed...))
	r.Deleted = int(deleted.Load())
	return r, nil
}
