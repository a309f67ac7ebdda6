package main

import (
	"context"
	"fmt"
	"maps"
	"math"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

// TestAWSCNINamesAgreeWithOurs: with VPCIP_METRICS_AWSCNI_NAMES=true, after
// address requests that were answered, refused for want of an address (the
// node at MAX_ENI=1) and released, one scrape of vpcipd's /metrics holds
// every awscni_* series the README lists, each equal to what it is derived
// from among vpcip's own series in that same scrape, the request counters
// equal the requests made, and the per-CIDR gauges equal EC2's view of the
// node's secondary IPs and the addresses held.
func TestAWSCNINamesAgreeWithOurs(t *testing.T) {
	d := newAWSCNIDaemon(t, 27, "MAX_ENI=1", "VPCIP_ADD_WAIT=200ms")
	l, inst, addr := d.l, d.inst, d.metrics
	// Two failed EC2 calls, so the error series have something to show.
	l.Cloud.Faults().FailNext("AssignPrivateIpAddresses", "InsufficientFreeAddressesInSubnet")
	l.Cloud.Faults().FailNext("AssignPrivateIpAddresses", "RequestLimitExceeded")
	p := d.start(t)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	requests, refused := 0, 0
	var held []string
	addrOf := map[string]netip.Addr{}
	for i := 0; refused < 2 && i < 30; i++ {
		k := fmt.Sprint("c", i)
		requests++
		a, err := p.client.Assign(ctx, api.AssignRequest{Key: key(k), Pod: api.Pod{Namespace: "default", Name: k}})
		if err != nil {
			refused++
			continue
		}
		held = append(held, k)
		addrOf[k] = a.Address
	}
	if refused < 2 || len(held) == 0 {
		t.Fatalf("%d requests: %d held, %d refused; want some of each (MAX_ENI=1)", requests, len(held), refused)
	}
	for _, k := range held[:2] {
		if _, err := p.client.Release(ctx, api.ReleaseRequest{Key: key(k)}); err != nil {
			t.Fatal(err)
		}
		delete(addrOf, k)
	}
	// A release of an attachment that holds nothing is a request too.
	if _, err := p.client.Release(ctx, api.ReleaseRequest{Key: key("never-assigned")}); err != nil {
		t.Fatal(err)
	}
	releases := 3
	perCIDRAgreesWithEC2(t, "http://"+addr+"/metrics", l, inst.ID, slices.Collect(maps.Values(addrOf)))

	fams := scrape(t, "http://"+addr+"/metrics")
	one := func(name string, labels ...string) float64 {
		t.Helper()
		f := fams[name]
		if f == nil {
			t.Errorf("the scrape has no %s", name)
			return math.NaN()
		}
		var sum float64
		for _, m := range f.Metric {
			if !hasLabels(m, labels...) {
				continue
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				sum += m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				sum += m.GetGauge().GetValue()
			case dto.MetricType_UNTYPED:
				sum += m.GetUntyped().GetValue()
			}
		}
		return sum
	}
	eq := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9*math.Max(1, math.Abs(want)) {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}

	// Gauges.
	eq("awscni_assigned_ip_addresses", one("awscni_assigned_ip_addresses"), one("vpcip_addresses_assigned"))
	eq("awscni_total_ip_addresses", one("awscni_total_ip_addresses"), one("vpcip_addresses_assigned")+one("vpcip_addresses_warm")+one("vpcip_addresses_cooling"))
	eq("awscni_ip_max", one("awscni_ip_max"), one("vpcip_addresses_budget"))
	eq("awscni_eni_allocated", one("awscni_eni_allocated"), one("vpcip_enis_attached"))
	eq("awscni_eni_max", one("awscni_eni_max"), one("vpcip_enis_max"))
	eq("awscni_assigned_ip_addresses after the releases", one("awscni_assigned_ip_addresses"), float64(len(held)-2))

	// Request counters.
	addWait := fams["vpcip_add_wait_seconds"]
	if addWait == nil || len(addWait.Metric) != 1 {
		t.Fatalf("vpcip_add_wait_seconds: %v", addWait)
	}
	eq("awscni_add_ip_req_count", one("awscni_add_ip_req_count"), float64(addWait.Metric[0].GetHistogram().GetSampleCount()))
	eq("awscni_add_ip_req_count (requests made)", one("awscni_add_ip_req_count"), float64(requests))
	eq("awscni_del_ip_req_count", one("awscni_del_ip_req_count"), one("vpcip_release_requests_total"))
	eq("awscni_del_ip_req_count (releases made)", one("awscni_del_ip_req_count"), float64(releases))
	var noAddress float64
	for _, m := range fams["vpcip_add_no_address_total"].GetMetric() {
		if c := labelOf(m, "cause"); c != "max-pods" && c != "not-ready" {
			noAddress += m.GetCounter().GetValue()
		}
	}
	eq("awscni_no_available_ip_addresses", one("awscni_no_available_ip_addresses"), noAddress)
	eq("awscni_no_available_ip_addresses (refusals)", one("awscni_no_available_ip_addresses"), float64(refused))

	// EC2 API series.
	calls := fams["vpcip_provider_calls_total"]
	ops := map[string]bool{}
	for _, m := range calls.GetMetric() {
		ops[labelOf(m, "operation")] = true
		if o := labelOf(m, "outcome"); o != "ok" {
			eq("awscni_aws_api_error_count{"+labelOf(m, "operation")+","+o+"}",
				one("awscni_aws_api_error_count", "api", labelOf(m, "operation"), "error", o), m.GetCounter().GetValue())
		}
	}
	if len(ops) == 0 || one("vpcip_provider_calls_total", "operation", "AssignPrivateIpAddresses")-one("vpcip_provider_calls_total", "operation", "AssignPrivateIpAddresses", "outcome", "ok") < 2 {
		t.Fatalf("vpcip_provider_calls_total: %v; want the two injected failures", calls)
	}
	for op := range ops {
		var all, failed float64
		for _, m := range calls.Metric {
			if labelOf(m, "operation") == op {
				all += m.GetCounter().GetValue()
				if labelOf(m, "outcome") != "ok" {
					failed += m.GetCounter().GetValue()
				}
			}
		}
		eq("awscni_ec2api_req_count{fn="+op+"}", one("awscni_ec2api_req_count", "fn", op), all)
		eq("awscni_ec2api_error_count{fn="+op+"}", one("awscni_ec2api_error_count", "fn", op), failed)
	}
	eq("awscni_aws_api_error_count total", one("awscni_aws_api_error_count"), one("vpcip_provider_calls_total")-one("vpcip_provider_calls_total", "outcome", "ok"))
	lat := fams["awscni_aws_api_latency_ms"]
	if lat.GetType() != dto.MetricType_SUMMARY {
		t.Errorf("awscni_aws_api_latency_ms is %v, want a summary", lat.GetType())
	}
	for _, m := range fams["vpcip_provider_call_duration_seconds"].GetMetric() {
		op := labelOf(m, "operation")
		i := slices.IndexFunc(lat.GetMetric(), func(x *dto.Metric) bool { return labelOf(x, "api") == op })
		if i < 0 {
			t.Errorf("awscni_aws_api_latency_ms has no api=%s", op)
			continue
		}
		s := lat.Metric[i].GetSummary()
		eq("awscni_aws_api_latency_ms_count{"+op+"}", float64(s.GetSampleCount()), float64(m.GetHistogram().GetSampleCount()))
		eq("awscni_aws_api_latency_ms_sum{"+op+"} (ms)", s.GetSampleSum(), m.GetHistogram().GetSampleSum()*1000)
	}

	// Build info.
	bi, ours := fams["awscni_build_info"], fams["vpcip_build_info"]
	if bi == nil || ours == nil || len(bi.Metric) != 1 || len(ours.Metric) != 1 {
		t.Fatalf("build info: awscni %v, vpcip %v", bi, ours)
	}
	if labelOf(bi.Metric[0], "version") != labelOf(ours.Metric[0], "version") || labelOf(bi.Metric[0], "goversion") != labelOf(ours.Metric[0], "go_version") || bi.Metric[0].GetGauge().GetValue() != 1 {
		t.Errorf("awscni_build_info %v, vpcip_build_info %v", bi.Metric[0], ours.Metric[0])
	}
}

// TestAWSCNIPrefixSeries: in prefix mode (ENABLE_PREFIX_DELEGATION=true)
// awscni_total_ipv4_prefixes counts the /28s EC2 shows on the node's ENIs
// and awscni_assigned_ip_per_cidr gives each /28 the addresses pods hold
// in it.
func TestAWSCNIPrefixSeries(t *testing.T) {
	d := newAWSCNIDaemon(t, 28, "ENABLE_PREFIX_DELEGATION=true", "WARM_PREFIX_TARGET=1", "WARM_IP_TARGET=")
	p := d.start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var held []netip.Addr
	for i := range 20 {
		k := fmt.Sprint("p", i)
		a, err := p.client.Assign(ctx, api.AssignRequest{Key: key(k), Pod: api.Pod{Namespace: "default", Name: k}})
		if err != nil {
			t.Fatalf("assign %s: %v", k, err)
		}
		held = append(held, a.Address)
	}
	n := perCIDRAgreesWithEC2(t, "http://"+d.metrics+"/metrics", d.l, d.inst.ID, held)
	if n < 2 {
		t.Errorf("20 pods in %d /28 prefixes; want at least 2", n)
	}
}

// awscniDaemon is a vpcipd on an m5.large of its own vpcsim, its metrics
// listener on a free loopback port with the awscni_* names on.
type awscniDaemon struct {
	l        *vpcsimtest.Local
	inst     vpcsim.InstanceInfo
	bin, dir string
	metrics  string // host:port of /metrics
	env      []string
}

// newAWSCNIDaemon prepares the daemon with the test environment plus
// extra NAME=value settings (each replacing the default of that name; an
// empty value drops it) without starting it, so a test can set vpcsim's
// faults first.
func newAWSCNIDaemon(t *testing.T, seed int64, extra ...string) *awscniDaemon {
	t.Helper()
	d := &awscniDaemon{bin: buildDaemon(t), l: vpcsimtest.Start(t, vpcsim.Config{Seed: seed}), dir: shortDir(t)}
	d.inst = d.l.Launch(t, "m5.large")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d.metrics = ln.Addr().String()
	ln.Close()
	extra = append([]string{"VPCIP_METRICS_ADDR=" + d.metrics, "VPCIP_METRICS_AWSCNI_NAMES=true"}, extra...)
	for _, e := range daemonEnv(d.l, d.inst.ID, d.dir) {
		name, _, _ := strings.Cut(e, "=")
		if !slices.ContainsFunc(extra, func(x string) bool { return strings.HasPrefix(x, name+"=") }) {
			d.env = append(d.env, e)
		}
	}
	for _, e := range extra {
		if !strings.HasSuffix(e, "=") {
			d.env = append(d.env, e)
		}
	}
	return d
}

func (d *awscniDaemon) start(t *testing.T) *proc { return startDaemon(t, d.bin, d.env, d.dir) }

// perCIDRAgreesWithEC2 waits (up to 20 s, for the pool to settle) until
// one scrape's awscni_assigned_ip_per_cidr has exactly one series per /28
// prefix EC2 shows on the instance's ENIs (or, without prefixes, per
// secondary IP as a /32), each valued at the held addresses inside it, and
// awscni_total_ipv4_prefixes counts the prefixes. It returns the number of
// address blocks.
func perCIDRAgreesWithEC2(t *testing.T, url string, l *vpcsimtest.Local, instanceID string, held []netip.Addr) int {
	t.Helper()
	var problem string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		want, prefixes := map[string]float64{}, 0
		for _, e := range l.Cloud.NetworkInterfaces() {
			if e.InstanceID != instanceID {
				continue
			}
			blocks := e.Prefixes
			prefixes += len(e.Prefixes)
			if len(blocks) == 0 {
				for _, a := range e.SecondaryIPs {
					blocks = append(blocks, netip.PrefixFrom(a, 32))
				}
			}
			for _, b := range blocks {
				n := 0
				for _, a := range held {
					if b.Contains(a) {
						n++
					}
				}
				want[b.String()] = float64(n)
			}
		}
		fams := scrape(t, url)
		got := map[string]float64{}
		for _, m := range fams["awscni_assigned_ip_per_cidr"].GetMetric() {
			got[labelOf(m, "cidr")] = m.GetGauge().GetValue()
		}
		var gotPrefixes float64 = -1
		if f := fams["awscni_total_ipv4_prefixes"]; f != nil && len(f.Metric) == 1 {
			gotPrefixes = f.Metric[0].GetGauge().GetValue()
		}
		if maps.Equal(got, want) && gotPrefixes == float64(prefixes) {
			return len(want)
		}
		problem = fmt.Sprintf("awscni_assigned_ip_per_cidr %v and awscni_total_ipv4_prefixes %v; EC2 and the held addresses give %v and %d",
			got, gotPrefixes, want, prefixes)
		if time.Now().After(deadline) {
			t.Fatal(problem)
		}
	}
}

func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing %s: %v", url, err)
	}
	return fams
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// hasLabels reports whether m has every name=value pair of kv.
func hasLabels(m *dto.Metric, kv ...string) bool {
	for i := 0; i+1 < len(kv); i += 2 {
		if labelOf(m, kv[i]) != kv[i+1] {
			return false
		}
	}
	return true
}
