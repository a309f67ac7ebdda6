package metricsauth_test

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/vpcip/vpcip/ipamd/metricsauth"
	"github.com/vpcip/vpcip/test/kubetest"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

const (
	daemonRules = "../../charts/vpcip/files/metrics-auth-rules.yaml"
	readerRules = "../../charts/vpcip/files/metrics-reader-rules.yaml"
)

// reviewCounter counts the API server requests of a rest.Config by path.
type reviewCounter struct{ tokenReviews, accessReviews atomic.Int64 }

func (c *reviewCounter) wrap(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(r *http.Request) (*http.Response, error) {
			switch {
			case strings.HasSuffix(r.URL.Path, "/tokenreviews"):
				c.tokenReviews.Add(1)
			case strings.HasSuffix(r.URL.Path, "/subjectaccessreviews"):
				c.accessReviews.Add(1)
			}
			return rt.RoundTrip(r)
		})
	})
	return cfg
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// serve runs guard in front of a registry's /metrics on a loopback TLS
// listener, as vpcipd's metrics listener does, and returns its address.
func serve(t *testing.T, g *metricsauth.Guard) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "vpcip_test_scrapes_total", Help: "x"})
	reg.MustRegister(c)
	c.Inc()
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: g.Wrap(mux), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(tls.NewListener(ln, g.TLSConfig()))
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

type answer struct {
	status int
	body   string
}

func scrape(t *testing.T, url, token string) answer {
	t.Helper()
	client := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // the self-signed certificate, as the chart's monitors
	}}
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, string(b)}
}

// TestScrapersAreReviewedByTheAPIServer: the guard runs as a ServiceAccount
// bound to exactly the chart's metrics-auth rules, against a real
// kube-apiserver. A ServiceAccount bound to the chart's reader rules gets
// the metrics; one without them gets 403; no token, a garbage token and a
// malformed header get 401; plain HTTP to the listener gets no metrics. A
// token is reviewed once per TTL however often it scrapes.
func TestScrapersAreReviewedByTheAPIServer(t *testing.T) {
	k := kubetest.Shared(t)
	ctx := context.Background()
	daemonCfg, err := k.ServiceAccountConfigFromFile(ctx, "kube-system", "metrics-guard", daemonRules)
	if err != nil {
		t.Fatal(err)
	}
	reader, err := k.ServiceAccountConfigFromFile(ctx, "monitoring", "prometheus", readerRules)
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := k.ServiceAccountConfig(ctx, "monitoring", "stranger",
		[]rbacv1.PolicyRule{{NonResourceURLs: []string{"/healthz"}, Verbs: []string{"get"}}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the authorizer's role cache

	var calls reviewCounter
	cs, err := kubernetes.NewForConfig(calls.wrap(daemonCfg))
	if err != nil {
		t.Fatal(err)
	}
	g, err := metricsauth.New(metricsauth.Options{Client: cs, Hosts: []string{"node-a", "127.0.0.1"},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, g)
	url := "https://" + addr + "/metrics"

	if a := scrape(t, url, reader.BearerToken); a.status != http.StatusOK || !strings.Contains(a.body, "vpcip_test_scrapes_total 1") {
		t.Errorf("reader: %d %q, want 200 with the metrics", a.status, a.body)
	}
	if a := scrape(t, url, stranger.BearerToken); a.status != http.StatusForbidden || strings.Contains(a.body, "vpcip_test") ||
		!strings.Contains(a.body, "system:serviceaccount:monitoring:stranger") {
		t.Errorf("ServiceAccount without the reader rules: %d %q, want 403 naming the user, no metrics", a.status, a.body)
	}
	for name, token := range map[string]string{"no token": "", "garbage token": "not-a-token"} {
		if a := scrape(t, url, token); a.status != http.StatusUnauthorized || strings.Contains(a.body, "vpcip_test") {
			t.Errorf("%s: %d %q, want 401, no metrics", name, a.status, a.body)
		}
	}
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Authorization", "Basic "+reader.BearerToken)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	if resp, err := client.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a Basic header carrying the token: %v %v, want 401", resp, err)
	} else {
		resp.Body.Close()
	}

	// Plain HTTP to the TLS listener: Go's TLS server answers 400, no metrics.
	if resp, err := http.Get("http://" + addr + "/metrics"); err != nil {
		t.Errorf("plain HTTP: %v, want a 400 answer", err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || strings.Contains(string(b), "vpcip_test") {
			t.Errorf("plain HTTP: %d %q, want 400 without metrics", resp.StatusCode, b)
		}
	}

	// Cached: ten more scrapes of each token cost no further review.
	before := [2]int64{calls.tokenReviews.Load(), calls.accessReviews.Load()}
	if before != [2]int64{3, 2} {
		t.Errorf("reviews after reader, stranger, garbage: %d TokenReviews, %d SubjectAccessReviews; want 3 and 2", before[0], before[1])
	}
	for range 10 {
		scrape(t, url, reader.BearerToken)
		scrape(t, url, stranger.BearerToken)
		scrape(t, url, "not-a-token")
	}
	if after := [2]int64{calls.tokenReviews.Load(), calls.accessReviews.Load()}; after != before {
		t.Errorf("ten more scrapes of each token: reviews %v -> %v, want none (cached for a minute)", before, after)
	}
}

// TestDecisionsExpire: after the TTL a token is reviewed again, so a
// binding removed stops the scraper within one TTL.
func TestDecisionsExpire(t *testing.T) {
	k := kubetest.Shared(t)
	ctx := context.Background()
	daemonCfg, err := k.ServiceAccountConfigFromFile(ctx, "kube-system", "metrics-guard-ttl", daemonRules)
	if err != nil {
		t.Fatal(err)
	}
	reader, err := k.ServiceAccountConfigFromFile(ctx, "monitoring", "prometheus-ttl", readerRules)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	now := time.Now()
	var clock atomic.Int64
	clock.Store(now.UnixNano())
	cs, err := kubernetes.NewForConfig(daemonCfg)
	if err != nil {
		t.Fatal(err)
	}
	g, err := metricsauth.New(metricsauth.Options{Client: cs, TTL: time.Minute,
		Now: func() time.Time { return time.Unix(0, clock.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	url := "https://" + serve(t, g) + "/metrics"
	if a := scrape(t, url, reader.BearerToken); a.status != http.StatusOK {
		t.Fatalf("reader: %d %q", a.status, a.body)
	}
	// Take the permission away: the cached decision holds within the TTL...
	if _, err := k.ServiceAccountConfig(ctx, "monitoring", "prometheus-ttl", []rbacv1.PolicyRule{{NonResourceURLs: []string{"/healthz"}, Verbs: []string{"get"}}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	clock.Add(int64(30 * time.Second))
	if a := scrape(t, url, reader.BearerToken); a.status != http.StatusOK {
		t.Errorf("within the TTL: %d, want the cached 200", a.status)
	}
	// ...and is reviewed again after it.
	clock.Add(int64(31 * time.Second))
	if a := scrape(t, url, reader.BearerToken); a.status != http.StatusForbidden {
		t.Errorf("after the TTL, permission removed: %d %q, want 403", a.status, a.body)
	}
}

// TestCacheIsBounded: many distinct tokens never grow the cache beyond
// MaxEntries; the newest decision is kept.
func TestCacheIsBounded(t *testing.T) {
	k := kubetest.Shared(t)
	ctx := context.Background()
	daemonCfg, err := k.ServiceAccountConfigFromFile(ctx, "kube-system", "metrics-guard-bound", daemonRules)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	var calls reviewCounter
	cs, err := kubernetes.NewForConfig(calls.wrap(daemonCfg))
	if err != nil {
		t.Fatal(err)
	}
	g, err := metricsauth.New(metricsauth.Options{Client: cs, MaxEntries: 4})
	if err != nil {
		t.Fatal(err)
	}
	url := "https://" + serve(t, g) + "/metrics"
	for i := range 10 {
		scrape(t, url, "bogus-"+string(rune('a'+i)))
	}
	if n := g.CachedDecisions(); n > 4 {
		t.Errorf("cache holds %d decisions, want at most 4", n)
	}
	before := calls.tokenReviews.Load()
	scrape(t, url, "bogus-j") // the last one stored
	if calls.tokenReviews.Load() != before {
		t.Errorf("the newest decision was evicted")
	}
}

// TestNewNeedsAClient: no client, no guard (the daemon refuses to start).
func TestNewNeedsAClient(t *testing.T) {
	if _, err := metricsauth.New(metricsauth.Options{}); err == nil {
		t.Fatal("New without a client succeeded")
	}
	if _, err := metricsauth.New(metricsauth.Options{Client: &kubernetes.Clientset{}, TLSDir: t.TempDir()}); err == nil ||
		!strings.Contains(err.Error(), "tls.crt") {
		t.Fatalf("New with an empty TLS directory: %v, want an error naming tls.crt", err)
	}
}
