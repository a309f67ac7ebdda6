package fleetmetrics

import (
	"fmt"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// The AWS VPC CNI's counters, its EC2 API series and build info
// (VPCIP_METRICS_AWSCNI_NAMES=true), each derived at scrape time from vpcip's
// own series in the same gather, so the two can never disagree. Names, types
// and labels are the reference's (its ipamd's /metrics); the README lists
// them, and the reference's series that vpcip has no meaning for.
//
//	awscni_add_ip_req_count           counter   vpcip_add_wait_seconds_count (every address request)
//	awscni_del_ip_req_count           counter   vpcip_release_requests_total (every release request)
//	awscni_no_available_ip_addresses  counter   sum of vpcip_add_no_address_total over the causes that
//	                                            mean no free address (not max-pods, not not-ready)
//	awscni_ec2api_req_count{fn}       counter   vpcip_provider_calls_total by operation (every attempt)
//	awscni_ec2api_error_count{fn}     counter   the same, outcome not ok
//	awscni_aws_api_error_count{api,error} counter vpcip_provider_calls_total, outcome not ok; error is the outcome
//	awscni_aws_api_latency_ms{api}    summary   vpcip_provider_call_duration_seconds, in milliseconds
//	                                            (sum and count; no quantiles, as the reference's)
//	awscni_build_info{version,goversion} gauge  vpcip_build_info
var derivedDescs = struct {
	addReq, delReq, noAddr, ec2Req, ec2Err, apiErr, apiLatency, build *prometheus.Desc
}{
	addReq:     prometheus.NewDesc("awscni_add_ip_req_count", "The number of add IP address requests (vpcip_add_wait_seconds_count).", nil, nil),
	delReq:     prometheus.NewDesc("awscni_del_ip_req_count", "The number of release IP address requests (vpcip_release_requests_total).", nil, nil),
	noAddr:     prometheus.NewDesc("awscni_no_available_ip_addresses", "The number of pod IP assignments that failed for want of a free address (vpcip_add_no_address_total, causes other than max-pods and not-ready).", nil, nil),
	ec2Req:     prometheus.NewDesc("awscni_ec2api_req_count", "The number of requests made to EC2 APIs, by operation (vpcip_provider_calls_total).", []string{"fn"}, nil),
	ec2Err:     prometheus.NewDesc("awscni_ec2api_error_count", "The number of failed EC2 API requests, by operation (vpcip_provider_calls_total, outcome not ok).", []string{"fn"}, nil),
	apiErr:     prometheus.NewDesc("awscni_aws_api_error_count", "The number of failed AWS API calls, by operation and error (vpcip_provider_calls_total, outcome not ok).", []string{"api", "error"}, nil),
	apiLatency: prometheus.NewDesc("awscni_aws_api_latency_ms", "AWS API call latency in ms, by operation (vpcip_provider_call_duration_seconds).", []string{"api"}, nil),
	build:      prometheus.NewDesc("awscni_build_info", "Always 1; labelled with the running vpcipd's version and Go release (vpcip_build_info).", []string{"version", "goversion"}, nil),
}

// notNoAddress are vpcip_add_no_address_total causes that are not "no free
// address": the node is at its pod limit, or the daemon is not ready yet.
var notNoAddress = []string{"max-pods", "not-ready"}

type derivedCollector struct{ from prometheus.Gatherer }

// RegisterAWSCNIDerived registers on reg the reference's series that are
// derived from vpcip's own, read from `from` (the daemon's registry) at each
// scrape. reg must not be gathered by from: serve both with
// prometheus.Gatherers{from, reg}.
func RegisterAWSCNIDerived(reg prometheus.Registerer, from prometheus.Gatherer) {
	reg.MustRegister(derivedCollector{from: from})
}

func (derivedCollector) Describe(ch chan<- *prometheus.Desc) {
	d := derivedDescs
	for _, desc := range []*prometheus.Desc{d.addReq, d.delReq, d.noAddr, d.ec2Req, d.ec2Err, d.apiErr, d.apiLatency, d.build} {
		ch <- desc
	}
}

func (c derivedCollector) Collect(ch chan<- prometheus.Metric) {
	families, err := c.from.Gather()
	if err != nil && len(families) == 0 {
		ch <- prometheus.NewInvalidMetric(derivedDescs.addReq, fmt.Errorf("gathering vpcip's metrics: %w", err))
		return
	}
	byName := map[string]*dto.MetricFamily{}
	for _, f := range families {
		byName[f.GetName()] = f
	}
	d := derivedDescs
	counter := func(desc *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, v, labels...)
	}

	if f := byName["vpcip_add_wait_seconds"]; f != nil && len(f.Metric) == 1 {
		counter(d.addReq, float64(f.Metric[0].GetHistogram().GetSampleCount()))
	}
	if f := byName["vpcip_release_requests_total"]; f != nil && len(f.Metric) == 1 {
		counter(d.delReq, f.Metric[0].GetCounter().GetValue())
	}
	if f := byName["vpcip_add_no_address_total"]; f != nil {
		var n float64
		for _, m := range f.Metric {
			if !slices.Contains(notNoAddress, label(m, "cause")) {
				n += m.GetCounter().GetValue()
			}
		}
		counter(d.noAddr, n)
	}
	if f := byName["vpcip_provider_calls_total"]; f != nil {
		reqs, errs := map[string]float64{}, map[string]float64{}
		apiErrs := map[[2]string]float64{}
		for _, m := range f.Metric {
			op, outcome, v := label(m, "operation"), label(m, "outcome"), m.GetCounter().GetValue()
			reqs[op] += v
			if outcome != "ok" {
				errs[op] += v
				apiErrs[[2]string{op, outcome}] += v
			}
		}
		for op, v := range reqs {
			counter(d.ec2Req, v, op)
			counter(d.ec2Err, errs[op], op)
		}
		for k, v := range apiErrs {
			counter(d.apiErr, v, k[0], k[1])
		}
	}
	if f := byName["vpcip_provider_call_duration_seconds"]; f != nil {
		for _, m := range f.Metric {
			h := m.GetHistogram()
			ch <- prometheus.MustNewConstSummary(d.apiLatency, h.GetSampleCount(), h.GetSampleSum()*1000, nil, label(m, "operation"))
		}
	}
	if f := byName["vpcip_build_info"]; f != nil && len(f.Metric) == 1 {
		m := f.Metric[0]
		ch <- prometheus.MustNewConstMetric(d.build, prometheus.GaugeValue, 1, label(m, "version"), label(m, "go_version"))
	}
}

// label is m's value of the label name, "" when it has none.
func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
