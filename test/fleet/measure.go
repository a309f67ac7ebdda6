package fleet

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vpcip/vpcip/test/vpcsim"
)

// RequestCounter counts a client's API requests by the verb and resource
// apiserver_request_total labels them with ("POST pods", "PUT nodes/status"), so that the harness's own
// requests can be taken out of apiserver_request_total.
type RequestCounter struct {
	mu sync.Mutex // guards n
	n  map[string]float64
}

func newRequestCounter() *RequestCounter { return &RequestCounter{n: map[string]float64{}} }

func (c *RequestCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if k := requestKey(r); k != "" {
			c.mu.Lock()
			c.n[k]++
			c.mu.Unlock()
		}
		return rt.RoundTrip(r)
	})
}

// Snapshot copies the counts.
func (c *RequestCounter) Snapshot() map[string]float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]float64, len(c.n))
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// requestKey names a resource request as apiserver_request_total labels it:
// verb (POST, PUT, PATCH, DELETE, GET, LIST, WATCH), resource and
// subresource; "" for a non-resource path.
func requestKey(r *http.Request) string {
	segs := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case len(segs) >= 3 && segs[0] == "api":
		segs = segs[2:]
	case len(segs) >= 4 && segs[0] == "apis":
		segs = segs[3:]
	default:
		return ""
	}
	if len(segs) >= 3 && segs[0] == "namespaces" {
		segs = segs[2:]
	}
	resource, named := segs[0], len(segs) >= 2
	if len(segs) >= 3 {
		resource += "/" + segs[2]
	}
	verb := r.Method
	if r.Method == http.MethodGet {
		switch {
		case r.URL.Query().Get("watch") == "true":
			verb = "WATCH"
		case named:
			verb = "GET"
		default:
			verb = "LIST"
		}
	}
	return verb + " " + resource
}

var labelRE = regexp.MustCompile(`(\w+)="([^"]*)"`)

// apiserverRequests reads apiserver_request_total from the API server's
// /metrics, summed by "VERB resource[/subresource]" (resource requests only).
func (f *Fleet) apiserverRequests(ctx context.Context) (map[string]float64, error) {
	return f.apiserverMetric(ctx, "apiserver_request_total", func(labels map[string]string) string {
		if labels["resource"] == "" {
			return ""
		}
		k := labels["verb"] + " " + labels["resource"]
		if labels["subresource"] != "" {
			k += "/" + labels["subresource"]
		}
		return k
	})
}

// DispatchedByFlowSchema is how many requests the API server's priority and
// fairness has dispatched so far, by FlowSchema name
// (apiserver_flowcontrol_dispatched_requests_total).
func (f *Fleet) DispatchedByFlowSchema(ctx context.Context) (map[string]float64, error) {
	return f.apiserverMetric(ctx, "apiserver_flowcontrol_dispatched_requests_total", func(labels map[string]string) string {
		return labels["flow_schema"]
	})
}

// apiserverMetric sums the API server's counter name by key(labels),
// skipping series whose key is empty.
func (f *Fleet) apiserverMetric(ctx context.Context, name string, key func(map[string]string) string) (map[string]float64, error) {
	raw, err := f.Admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("API server /metrics: %w", err)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		end := strings.LastIndexByte(line, '}')
		v, err := strconv.ParseFloat(strings.TrimSpace(line[end+1:]), 64)
		if err != nil {
			continue
		}
		labels := map[string]string{}
		for _, m := range labelRE.FindAllStringSubmatch(line[:end], -1) {
			labels[m[1]] = m[2]
		}
		if k := key(labels); k != "" {
			out[k] += v
		}
	}
	return out, sc.Err()
}

// procStats are a daemon's CPU time (user + system) and resident memory.
type procStats struct {
	CPU time.Duration
	RSS int64 // bytes
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on Linux
// for every architecture Go supports.
const clockTicks = 100

func readProc(pid int) (procStats, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStats{}, err
	}
	// Fields after the command (which may hold spaces) start at "state",
	// field 3 of proc(5); utime and stime are fields 14 and 15.
	rest := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(rest) < 13 {
		return procStats{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(rest))
	}
	ut, _ := strconv.ParseInt(rest[11], 10, 64)
	st, _ := strconv.ParseInt(rest[12], 10, 64)
	s := procStats{CPU: time.Duration(ut+st) * time.Second / clockTicks}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return procStats{}, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			s.RSS = kb << 10
		}
	}
	return s, nil
}

// snapshot is what the harness reads before and after a scenario.
type snapshot struct {
	at       time.Time
	ec2      map[string]map[string]vpcsim.RequestCount // by caller address
	apiAll   map[string]float64
	apiAdmin map[string]float64
	procs    map[*Node]procStats
	retries  int64
}

func (f *Fleet) snapshot(ctx context.Context) (snapshot, error) {
	s := snapshot{at: time.Now(), ec2: f.Cloud.Faults().RequestCountsByCaller(), procs: map[*Node]procStats{}}
	var err error
	if s.apiAll, err = f.apiserverRequests(ctx); err != nil {
		return s, err
	}
	s.apiAdmin = f.AdminRequests.Snapshot()
	s.retries = f.apiRetries.Load()
	for _, n := range f.Nodes {
		if n.PID() != 0 {
			if p, err := readProc(n.PID()); err == nil {
				s.procs[n] = p
			}
		}
	}
	return s, nil
}

// Report is one scenario's measurements.
type Report struct {
	Scenario string
	Nodes    int
	Pods     int // pods that asked for an address in the scenario
	Failed   int // pods that got none, or deletions that failed (the first errors are in Errors)
	Deleted  int // pods deleted (CNI DEL and API delete) in the scenario
	// HarnessAPIRetries are the harness's pod creates the API server
	// timed out or refused for load, repeated (a sign the API server, not
	// the daemons, was the bottleneck).
	HarnessAPIRetries int64
	Errors            []string
	Window            time.Duration // from the scenario's start to its last snapshot

	WaitP50, WaitP99, WaitMax time.Duration // per pod: created in the API until its address
	// ReadyP50 and ReadyMax: from the daemons' start until each was ready
	// (scenario a only).
	ReadyP50, ReadyMax time.Duration
	// Buckets is how many account request buckets vpcsim enforced.
	Buckets int

	EC2ByAction map[string]vpcsim.RequestCount
	// EC2 requests per node (all actions, accepted + throttled): median
	// and maximum; ThrottledPerNodeMax the most one node saw refused.
	EC2PerNodeP50, EC2PerNodeMax, ThrottledPerNodeMax int
	// APIPerNodeMinute are the API server's requests per node and minute by
	// "VERB resource", the harness's own left out.
	APIPerNodeMinute map[string]float64

	CPUMean, CPUMax time.Duration // per daemon, within the window
	RSSMean, RSSMax int64         // per daemon at the end, bytes
}

func (f *Fleet) report(name string, before, after snapshot, waits []time.Duration, failed []string) Report {
	r := Report{Scenario: name, Nodes: len(f.Nodes), Pods: len(waits) + len(failed), Failed: len(failed), Window: after.at.Sub(before.at),
		HarnessAPIRetries: after.retries - before.retries, Buckets: len(f.Cloud.Faults().RequestLimits())}
	if len(failed) > 5 {
		r.Errors = failed[:5]
	} else {
		r.Errors = failed
	}
	r.WaitP50, r.WaitP99, r.WaitMax = quantile(waits, 0.50), quantile(waits, 0.99), quantile(waits, 1)

	r.EC2ByAction = map[string]vpcsim.RequestCount{}
	var perNode, throttledPerNode []int
	for _, n := range f.Nodes {
		ip := n.PrimaryIP.String()
		total, throttled := 0, 0
		for action, c := range after.ec2[ip] {
			d := vpcsim.RequestCount{Accepted: c.Accepted - before.ec2[ip][action].Accepted, Throttled: c.Throttled - before.ec2[ip][action].Throttled}
			sum := r.EC2ByAction[action]
			sum.Accepted += d.Accepted
			sum.Throttled += d.Throttled
			r.EC2ByAction[action] = sum
			total += d.Accepted + d.Throttled
			throttled += d.Throttled
		}
		perNode, throttledPerNode = append(perNode, total), append(throttledPerNode, throttled)
	}
	sort.Ints(perNode)
	sort.Ints(throttledPerNode)
	if len(perNode) > 0 {
		r.EC2PerNodeP50, r.EC2PerNodeMax = perNode[len(perNode)/2], perNode[len(perNode)-1]
		r.ThrottledPerNodeMax = throttledPerNode[len(throttledPerNode)-1]
	}

	r.APIPerNodeMinute = map[string]float64{}
	minutes := r.Window.Minutes()
	for k, v := range after.apiAll {
		d := v - before.apiAll[k] - (after.apiAdmin[k] - before.apiAdmin[k])
		if d > 0 && minutes > 0 {
			r.APIPerNodeMinute[k] = d / float64(len(f.Nodes)) / minutes
		}
	}

	var cpuSum time.Duration
	var rssSum int64
	count := 0
	for n, a := range after.procs {
		cpu := a.CPU - before.procs[n].CPU // zero before a daemon started
		cpuSum += cpu
		r.CPUMax = max(r.CPUMax, cpu)
		rssSum += a.RSS
		r.RSSMax = max(r.RSSMax, a.RSS)
		count++
	}
	if count > 0 {
		r.CPUMean, r.RSSMean = cpuSum/time.Duration(count), rssSum/int64(count)
	}
	return r
}

// quantile returns the q-quantile (nearest rank) of ds; 0 when empty.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(q*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// Print writes the report as a table.
func (r Report) Print(w *strings.Builder) {
	fmt.Fprintf(w, "scenario %s: %d nodes, %d pods given an address, %d deleted, %d failures, window %s\n", r.Scenario, r.Nodes, r.Pods-r.Failed, r.Deleted, r.Failed, r.Window.Round(time.Second))
	for _, e := range r.Errors {
		fmt.Fprintf(w, "  error: %s\n", e)
	}
	if r.HarnessAPIRetries > 0 {
		fmt.Fprintf(w, "  the API server timed out or refused %d of the harness's pod creates (repeated)\n", r.HarnessAPIRetries)
	}
	if r.ReadyMax > 0 {
		fmt.Fprintf(w, "  daemon start until ready    p50 %-8s max %s\n", r.ReadyP50.Round(time.Millisecond), r.ReadyMax.Round(time.Millisecond))
	}
	fmt.Fprintf(w, "  pod wait for an address     p50 %-8s p99 %-8s max %s\n", r.WaitP50.Round(time.Millisecond), r.WaitP99.Round(time.Millisecond), r.WaitMax.Round(time.Millisecond))
	total, throttled := 0, 0
	for _, c := range r.EC2ByAction {
		total += c.Accepted + c.Throttled
		throttled += c.Throttled
	}
	pct := 0.0
	if total > 0 {
		pct = 100 * float64(throttled) / float64(total)
	}
	fmt.Fprintf(w, "  EC2 requests                %d, throttled %d (%.1f %%) by %d account buckets; per node p50 %d max %d, throttled per node max %d\n", total, throttled, pct, r.Buckets, r.EC2PerNodeP50, r.EC2PerNodeMax, r.ThrottledPerNodeMax)
	fmt.Fprintf(w, "  %-34s %10s %10s\n", "EC2 action", "accepted", "throttled")
	for _, a := range sortedKeys(r.EC2ByAction) {
		if r.EC2ByAction[a] == (vpcsim.RequestCount{}) {
			continue
		}
		fmt.Fprintf(w, "  %-34s %10d %10d\n", a, r.EC2ByAction[a].Accepted, r.EC2ByAction[a].Throttled)
	}
	fmt.Fprintf(w, "  %-34s %10s\n", "API server requests (not the harness's)", "/node/min")
	for _, k := range sortedKeys(r.APIPerNodeMinute) {
		if r.APIPerNodeMinute[k] >= 0.005 {
			fmt.Fprintf(w, "  %-34s %10.2f\n", k, r.APIPerNodeMinute[k])
		}
	}
	fmt.Fprintf(w, "  daemon CPU in window         mean %s max %s; RSS mean %.1f MiB max %.1f MiB\n",
		r.CPUMean.Round(time.Millisecond), r.CPUMax.Round(time.Millisecond), float64(r.RSSMean)/(1<<20), float64(r.RSSMax)/(1<<20))
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// EC2Totals are the scenario's EC2 requests and how many the account's
// buckets refused.
func (r Report) EC2Totals() (total, refused int) {
	for _, c := range r.EC2ByAction {
		total += c.Accepted + c.Throttled
		refused += c.Throttled
	}
	return total, refused
}

// Model is one way the fleet's daemons share the account's EC2 budget,
// with its scenarios' reports.
type Model struct {
	Name    string
	Reports []Report
}

// PrintComparison writes the scenarios of every model side by side: pod
// waits, EC2 requests and the share refused, AddressBudget status writes
// and the shared budget's Lease requests per node and minute, daemon CPU.
func PrintComparison(w *strings.Builder, models []Model) {
	fmt.Fprintf(w, "%-32s %-20s %6s %26s %8s %8s %9s %9s %9s\n", "scenario", "model", "pods", "pod wait p50 / p99 / max", "EC2 req", "refused", "AB st/n/m", "lease/n/m", "CPU/node")
	byScenario := map[string][]int{}
	var order []string
	for mi, m := range models {
		for ri, r := range m.Reports {
			if _, ok := byScenario[r.Scenario]; !ok {
				order = append(order, r.Scenario)
			}
			byScenario[r.Scenario] = append(byScenario[r.Scenario], mi<<16|ri)
		}
	}
	for _, sc := range order {
		for _, k := range byScenario[sc] {
			m := models[k>>16]
			r := m.Reports[k&0xffff]
			total, refused := r.EC2Totals()
			pct := 0.0
			if total > 0 {
				pct = 100 * float64(refused) / float64(total)
			}
			lease := r.APIPerNodeMinute["GET leases"] + r.APIPerNodeMinute["PUT leases"] + r.APIPerNodeMinute["POST leases"]
			wait := "—"
			if r.Pods-r.Failed > 0 && r.WaitMax > 0 {
				wait = fmt.Sprintf("%s / %s / %s", r.WaitP50.Round(10*time.Millisecond), r.WaitP99.Round(10*time.Millisecond), r.WaitMax.Round(10*time.Millisecond))
			}
			fmt.Fprintf(w, "%-32s %-20s %6d %26s %8d %7.1f%% %9.2f %9.2f %9s\n", r.Scenario, m.Name, r.Pods-r.Failed, wait, total, pct,
				r.APIPerNodeMinute["PUT addressbudgets/status"], lease, r.CPUMean.Round(10*time.Millisecond))
		}
	}
}
