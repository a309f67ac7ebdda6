package monitoring

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vpcip/vpcip/test/vpcsim/fabric"
)

// prometheus is Debian's Prometheus running inside a netns (the fabric's
// router, which routes to every instance's primary address), scraping the
// daemons' metrics endpoints there. Its API listens on that netns's own
// loopback, reached by dialling from inside the netns: nothing listens on
// the host and nothing leaves the fabric.
type prometheus struct {
	base   string
	client *http.Client
}

// target is one daemon to scrape: address and the node label the scrape
// attaches, as the chart's PodMonitor does from the pod's node name.
type target struct{ addr, node string }

// startPrometheus writes a config scraping targets every second and
// evaluating the chart's alert rules every second, starts Prometheus in
// netns and waits until every target is up. It stops with t.Cleanup.
func startPrometheus(t *testing.T, netns string, targets []target) *prometheus {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus not installed (make test-deps installs Debian's prometheus)")
	}
	dir := t.TempDir()
	rules, err := filepath.Abs(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\nrule_files: [%q]\nscrape_configs:\n  - job_name: vpcip\n    static_configs:\n", rules)
	for _, tg := range targets {
		fmt.Fprintf(&cfg, "      - targets: [%q]\n        labels: {node: %q}\n", tg.addr, tg.node)
	}
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", netns, bin,
		"--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address=127.0.0.1:9090", "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "prometheus.log"))
			t.Logf("prometheus log:\n%s", b)
		}
	})
	p := &prometheus{
		base:   "http://127.0.0.1:9090",
		client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: fabric.DialContext(netns)}},
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		up, err := p.targetsUp(t.Context())
		if err == nil && up == len(targets) {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus: %d of %d targets up after 60s (%v)", up, len(targets), err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// get calls a Prometheus HTTP API endpoint and decodes its data.
func (p *prometheus) get(ctx context.Context, path string, q url.Values, data any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+path+"?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if body.Status != "success" {
		return fmt.Errorf("%s %v: %s", path, q, body.Error)
	}
	return json.Unmarshal(body.Data, data)
}

func (p *prometheus) targetsUp(ctx context.Context) (int, error) {
	var data struct {
		ActiveTargets []struct {
			Health string `json:"health"`
		} `json:"activeTargets"`
	}
	if err := p.get(ctx, "/api/v1/targets", url.Values{}, &data); err != nil {
		return 0, err
	}
	up := 0
	for _, tg := range data.ActiveTargets {
		if tg.Health == "up" {
			up++
		}
	}
	return up, nil
}

// series is one result series: its labels and its values (one for an
// instant query, one per step for a range query; NaN stays NaN).
type series struct {
	labels map[string]string
	values []float64
	times  []float64 // unix seconds of values
}

func (s series) last() float64 { return s.values[len(s.values)-1] }

// max is the largest non-NaN value, or NaN when there is none.
func (s series) max() float64 {
	m := nan
	for _, v := range s.values {
		if v == v && (m != m || v > m) {
			m = v
		}
	}
	return m
}

type sample [2]any // [unix seconds, "value"]

func (s sample) value() (float64, error) {
	str, ok := s[1].(string)
	if !ok {
		return 0, fmt.Errorf("sample value %v is not a string", s[1])
	}
	return strconv.ParseFloat(str, 64)
}

// instant evaluates expr at time at.
func (p *prometheus) instant(ctx context.Context, expr string, at time.Time) ([]series, error) {
	var data struct {
		Result []struct {
			Metric map[string]string `json:"metric"`
			Value  sample            `json:"value"`
		} `json:"result"`
	}
	q := url.Values{"query": {expr}, "time": {strconv.FormatInt(at.Unix(), 10)}}
	if err := p.get(ctx, "/api/v1/query", q, &data); err != nil {
		return nil, err
	}
	var out []series
	for _, r := range data.Result {
		v, err := r.Value.value()
		if err != nil {
			return nil, err
		}
		t, _ := r.Value[0].(float64)
		out = append(out, series{labels: r.Metric, values: []float64{v}, times: []float64{t}})
	}
	return out, nil
}

// span evaluates expr from start to end every step, as a Grafana time
// series panel does.
func (p *prometheus) span(ctx context.Context, expr string, start, end time.Time, step time.Duration) ([]series, error) {
	var data struct {
		Result []struct {
			Metric map[string]string `json:"metric"`
			Values []sample          `json:"values"`
		} `json:"result"`
	}
	q := url.Values{"query": {expr}, "start": {strconv.FormatInt(start.Unix(), 10)},
		"end": {strconv.FormatInt(end.Unix(), 10)}, "step": {step.String()}}
	if err := p.get(ctx, "/api/v1/query_range", q, &data); err != nil {
		return nil, err
	}
	var out []series
	for _, r := range data.Result {
		s := series{labels: r.Metric}
		for _, smp := range r.Values {
			v, err := smp.value()
			if err != nil {
				return nil, err
			}
			t, _ := smp[0].(float64)
			s.values, s.times = append(s.values, v), append(s.times, t)
		}
		out = append(out, s)
	}
	return out, nil
}

// labelValues lists the values of a label on series matching match, as
// Grafana's label_values(match, label) variable query does.
func (p *prometheus) labelValues(ctx context.Context, label, match string) ([]string, error) {
	var out []string
	q := url.Values{}
	if match != "" {
		q.Set("match[]", match)
	}
	err := p.get(ctx, "/api/v1/label/"+label+"/values", q, &out)
	return out, err
}
