package ipamd

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/introspect"
)

// counter reads one sample of a metric family with exactly these labels.
func counter(t *testing.T, n *node, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := n.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return 0
}

// TestMetricsLintAndValues: the exposition passes promtool's lint rules and
// the gauges report the pool.
func TestMetricsLintAndValues(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, map[string]string{"WARM_IP_TARGET": "4"})
	n.start()
	n.mustAdd("c1")
	n.mustAdd("c2")
	n.cycle()
	problems, err := testutil.GatherAndLint(n.reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	st := n.status()
	want := map[string]float64{
		"vpcip_addresses_assigned": 2, "vpcip_addresses_warm": float64(st.Warm),
		"vpcip_addresses_budget": 27, "vpcip_enis_max": 3, "vpcip_ready": 1,
		"vpcip_enis_attached": float64(st.ENIs),
	}
	for name, v := range want {
		if got := counter(t, n, name, nil); got != v {
			t.Errorf("%s = %v, want %v", name, got, v)
		}
	}
	if got := counter(t, n, "vpcip_add_wait_seconds", nil); got != 2 {
		t.Errorf("ADD wait histogram has %v samples, want 2", got)
	}
	if got := counter(t, n, "vpcip_provider_calls_total", map[string]string{"operation": "AssignPrivateIpAddresses", "outcome": "ok"}); got < 1 {
		t.Errorf("provider call counter for AssignPrivateIpAddresses ok = %v", got)
	}
	// The names the chart and dashboards use are all there.
	mfs, _ := n.reg.Gather()
	var have []string
	for _, mf := range mfs {
		have = append(have, mf.GetName())
		if mf.GetType().String() == "COUNTER" && !strings.HasSuffix(mf.GetName(), "_total") {
			t.Errorf("counter %s does not end in _total", mf.GetName())
		}
	}
	for _, name := range []string{"vpcip_addresses_cooling", "vpcip_addresses_capacity", "vpcip_provider_call_duration_seconds"} {
		found := false
		for _, h := range have {
			found = found || h == name
		}
		if !found {
			t.Errorf("metric %s missing", name)
		}
	}
}

// TestIntrospectionState: the introspection handler serves the datastore's
// pool, ENIs, assignments with pod names, config and readiness.
func TestIntrospectionState(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, nil)
	n.start()
	a := n.mustAdd("c1")
	n.del("c1")
	b := n.mustAdd("c2")
	srv := httptest.NewServer(introspect.Handler(n.d.State))
	defer srv.Close()
	st, err := introspect.Fetch(context.Background(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Ready || st.Node.InstanceID != n.inst.ID || st.Node.InstanceType != itypeSmall || st.Node.Mode != introspect.ModeSecondaryIP {
		t.Errorf("node %+v ready %v", st.Node, st.Ready)
	}
	if len(st.Assignments) != 1 || st.Assignments[0].Address != b.Address || st.Assignments[0].Pod.Name != "p-c2" {
		t.Errorf("assignments %+v, want c2's", st.Assignments)
	}
	if len(st.Cooling) != 1 || st.Cooling[0].Address != a.Address {
		t.Errorf("cooling %+v, want c1's released address", st.Cooling)
	}
	if st.Pool.Assigned != 1 || st.Pool.Cooling != 1 || st.Pool.MaxENIs != 3 || st.Pool.Budget != 27 {
		t.Errorf("pool %+v", st.Pool)
	}
	if len(st.ENIs) == 0 || st.ENIs[0].DeviceNumber != 0 || st.ENIs[0].RouteTable != 254 || len(st.ENIs[0].Addresses) == 0 {
		t.Errorf("ENIs %+v", st.ENIs)
	}
	if st.Config["WARM_ENI_TARGET"] != "1" /* set by testConfig */ || st.Config["VPCIP_HOSTNET"] != "false" {
		t.Errorf("config %v", st.Config)
	}
}

// TestMetricsAndIntrospectionServed: the daemon serves /metrics and the
// introspection endpoints on their TCP addresses.
func TestMetricsAndIntrospectionServed(t *testing.T) {
	c := startCloud(t)
	metricsAddr, introAddr := freeAddr(t), freeAddr(t)
	n := newNode(t, c, itypeSmall, map[string]string{"VPCIP_METRICS_ADDR": metricsAddr, "VPCIP_INTROSPECTION_ADDR": introAddr})
	n.start()
	n.mustAdd("c1")
	body := get(t, "http://"+metricsAddr+"/metrics")
	for _, want := range []string{"vpcip_addresses_assigned 1", "vpcip_enis_max 3", "vpcip_ready 1"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if body := get(t, "http://"+introAddr+"/healthz"); body == "" {
		t.Error("empty /healthz")
	}
	st, err := introspect.Fetch(context.Background(), introAddr)
	if err != nil || st.Pool.Assigned != 1 || len(st.Assignments) != 1 || st.Assignments[0].Key != key("c1") {
		t.Errorf("introspection state %+v, %v", st.Pool, err)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b)
}

// TestMetricLabelsStartAtZero: every refusal cause and repair kind the code
// can count is exported at 0 from the start (so rate() sees the first one),
// and the lists name every one the code uses.
func TestMetricLabelsStartAtZero(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var src []byte
	for _, f := range files {
		if !strings.HasSuffix(f, "_test.go") {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			src = append(src, b...)
		}
	}
	for _, m := range regexp.MustCompile(`repaired\("(\w+)"`).FindAllSubmatch(src, -1) {
		if !slices.Contains(repairKinds, string(m[1])) {
			t.Errorf("repair kind %q is counted but not in repairKinds", m[1])
		}
	}
	apiSrc, err := os.ReadFile(filepath.Join("api", "api.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`Cause += "([\w-]+)"`).FindAllSubmatch(apiSrc, -1) {
		if !slices.Contains(noAddressCauses, api.Cause(m[1])) {
			t.Errorf("cause %q is not in noAddressCauses", m[1])
		}
	}
	reg := prometheus.NewRegistry()
	NewMetrics(reg)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if m.GetCounter().GetValue() != 0 {
				t.Errorf("%s %v starts at %v", mf.GetName(), m.GetLabel(), m.GetCounter().GetValue())
			}
			got[mf.GetName()]++
		}
	}
	if got["vpcip_add_no_address_total"] != len(noAddressCauses) || got["vpcip_reconcile_repairs_total"] != len(repairKinds) {
		t.Errorf("series at start: %v", got)
	}
}

// TestSideListenersBoundConnections: a client of the metrics listener
// cannot hold connections forever: an idle keep-alive connection is closed
// after the idle timeout, and no more than MaxConns are served at once
// (#25 kind 7; before, any number were accepted: the second half fails
// on the old listener; the idle one was closed by the header timeout).
func TestSideListenersBoundConnections(t *testing.T) {
	saved := sideLimits
	t.Cleanup(func() { sideLimits = saved })
	sideLimits.Idle, sideLimits.MaxConns = 300*time.Millisecond, 2
	c := startCloud(t)
	metricsAddr := freeAddr(t)
	n := newNode(t, c, itypeSmall, map[string]string{"VPCIP_METRICS_ADDR": metricsAddr})
	n.start()

	// Idle: one request, then the connection waits with keep-alive.
	conn, err := net.Dial("tcp", metricsAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
	r := bufio.NewReader(conn)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.ReadByte(); err != io.EOF {
		t.Errorf("idle keep-alive connection after the idle timeout: read %v, want EOF (closed by the daemon)", err)
	}

	// At most MaxConns at once: two silent connections, then a third
	// client's request waits until one of them times out.
	for range 2 {
		c, err := net.Dial("tcp", metricsAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	time.Sleep(100 * time.Millisecond)
	client := &http.Client{Timeout: 2 * time.Second}
	if resp, err := client.Get("http://" + metricsAddr + "/metrics"); err == nil {
		resp.Body.Close()
		t.Errorf("a third connection was served while two were open; want it held back (MaxConns 2)")
	}
}

// tokenGuard stands in for metricsauth.Guard (tested against a real API
// server in its package): TLS with httptest's certificate, and only
// "Bearer good" passes.
type tokenGuard struct{ cert tls.Certificate }

func (g tokenGuard) TLSConfig() *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{g.cert}}
}

func (g tokenGuard) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer good" {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// TestSecureMetricsListener: with a MetricsGuard the metrics listener
// speaks TLS with the guard's configuration and every request passes the
// guard; plain HTTP gets no metrics. The introspection listener is
// unchanged (plain HTTP, the probes' endpoint).
func TestSecureMetricsListener(t *testing.T) {
	ts := httptest.NewUnstartedServer(http.NotFoundHandler())
	ts.StartTLS()
	cert := ts.TLS.Certificates[0]
	ts.Close()
	c := startCloud(t)
	metricsAddr, introAddr := freeAddr(t), freeAddr(t)
	n := newNode(t, c, itypeSmall, map[string]string{"VPCIP_METRICS_ADDR": metricsAddr, "VPCIP_INTROSPECTION_ADDR": introAddr})
	n.guard = tokenGuard{cert}
	n.start()

	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	do := func(url, auth string) (int, string) {
		req, _ := http.NewRequest("GET", url, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := do("https://"+metricsAddr+"/metrics", "Bearer good"); code != http.StatusOK || !strings.Contains(body, "vpcip_addresses_assigned") {
		t.Errorf("https with a passing token: %d, metrics present %v; want 200 with the metrics", code, strings.Contains(body, "vpcip_addresses_assigned"))
	}
	if code, body := do("https://"+metricsAddr+"/metrics", ""); code != http.StatusUnauthorized || strings.Contains(body, "vpcip_") {
		t.Errorf("https without a token: %d %q; want the guard's 401", code, body)
	}
	if resp, err := http.Get("http://" + metricsAddr + "/metrics"); err != nil {
		t.Errorf("plain HTTP to the secure listener: %v; want a 400 answer", err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || strings.Contains(string(b), "vpcip_") {
			t.Errorf("plain HTTP to the secure listener: %d %q; want 400 without metrics", resp.StatusCode, b)
		}
	}
	if code, _ := do("http://"+introAddr+"/healthz", ""); code != http.StatusOK {
		t.Errorf("introspection /healthz over plain HTTP: %d, want 200", code)
	}
}
