package introspect_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/introspect"
	"github.com/vpcip/vpcip/ipamd/introspect/introspecttest"
)

var netipEqual = cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{})

func serve(t *testing.T, s introspect.State) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(introspect.Handler(func() introspect.State { return s }))
	t.Cleanup(srv.Close)
	return srv
}

func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("GET %s: Content-Type %q", url, ct)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: decode: %v", url, err)
	}
	return resp.StatusCode
}

func TestFetchRoundTrip(t *testing.T) {
	want := introspecttest.Sample()
	srv := serve(t, want)
	for _, base := range []string{srv.URL, strings.TrimPrefix(srv.URL, "http://"), srv.URL + "/"} {
		got, err := introspect.Fetch(context.Background(), base)
		if err != nil {
			t.Fatalf("Fetch(%q): %v", base, err)
		}
		if diff := cmp.Diff(want, got, netipEqual); diff != "" {
			t.Fatalf("Fetch(%q) (-want +got):\n%s", base, diff)
		}
	}
}

func TestEndpoints(t *testing.T) {
	s := introspecttest.Sample()
	srv := serve(t, s)

	var pool api.Counts
	getJSON(t, srv.URL+"/v1/pool", &pool)
	if diff := cmp.Diff(s.Pool, pool); diff != "" {
		t.Errorf("/v1/pool (-want +got):\n%s", diff)
	}
	var enis []introspect.ENI
	getJSON(t, srv.URL+"/v1/enis", &enis)
	if diff := cmp.Diff(s.ENIs, enis, netipEqual); diff != "" {
		t.Errorf("/v1/enis (-want +got):\n%s", diff)
	}
	var pods introspect.Pods
	getJSON(t, srv.URL+"/v1/pods", &pods)
	if diff := cmp.Diff(introspect.Pods{Assignments: s.Assignments, Cooling: s.Cooling}, pods, netipEqual); diff != "" {
		t.Errorf("/v1/pods (-want +got):\n%s", diff)
	}
	var cfg map[string]string
	getJSON(t, srv.URL+"/v1/config", &cfg)
	if diff := cmp.Diff(s.Config, cfg); diff != "" {
		t.Errorf("/v1/config (-want +got):\n%s", diff)
	}
	var h introspect.Health
	if code := getJSON(t, srv.URL+"/healthz", &h); code != http.StatusOK || !h.Ready {
		t.Errorf("/healthz of a ready daemon: %d %+v", code, h)
	}
}

func TestHealthzNotReady(t *testing.T) {
	srv := serve(t, introspect.State{Ready: false, Reason: "restoring checkpoint"})
	var h introspect.Health
	code := getJSON(t, srv.URL+"/healthz", &h)
	if code != http.StatusServiceUnavailable || h.Ready || h.Reason != "restoring checkpoint" {
		t.Fatalf("/healthz: %d %+v, want 503 with the reason", code, h)
	}
}

// A daemon still waiting for the cloud is alive: /livez answers 200 with the
// reason, while /healthz keeps the node's readiness at 503.
func TestLivezWhileWaitingForTheCloud(t *testing.T) {
	srv := serve(t, introspect.State{Ready: false, Reason: "waiting for the cloud: RequestLimitExceeded"})
	var h introspect.Health
	code := getJSON(t, srv.URL+"/livez", &h)
	if code != http.StatusOK || h.Ready || h.Reason != "waiting for the cloud: RequestLimitExceeded" {
		t.Fatalf("/livez: %d %+v, want 200 with ready=false and the reason", code, h)
	}
	if code := getJSON(t, srv.URL+"/healthz", &h); code != http.StatusServiceUnavailable {
		t.Fatalf("/healthz: %d, want 503", code)
	}
}

// An empty node still answers arrays and objects, never null.
func TestEmptyStateHasNoNulls(t *testing.T) {
	srv := serve(t, introspect.State{ENIs: []introspect.ENI{{ID: "eni-1"}}})
	resp, err := http.Get(srv.URL + "/v1/state")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"assignments", "cooling", "config", "enis"} {
		if string(raw[k]) == "null" || raw[k] == nil {
			t.Errorf("%s is %s in %s", k, raw[k], b)
		}
	}
	if strings.Contains(string(raw["enis"]), `"addresses": null`) {
		t.Errorf("ENI addresses null: %s", raw["enis"])
	}
}

func TestMethodsAndPaths(t *testing.T) {
	srv := serve(t, introspecttest.Sample())
	tests := []struct {
		method, path string
		want         int
	}{
		{http.MethodPost, "/v1/state", http.StatusMethodNotAllowed},
		{http.MethodDelete, "/v1/pods", http.StatusMethodNotAllowed},
		{http.MethodGet, "/v1/nothing", http.StatusNotFound},
		{http.MethodHead, "/healthz", http.StatusOK},
		{http.MethodHead, "/livez", http.StatusOK},
		{http.MethodPost, "/livez", http.StatusMethodNotAllowed},
	}
	for _, tt := range tests {
		req, _ := http.NewRequest(tt.method, srv.URL+tt.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tt.want {
			t.Errorf("%s %s: %d, want %d", tt.method, tt.path, resp.StatusCode, tt.want)
		}
	}
}

func TestFetchErrors(t *testing.T) {
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "datastore locked", http.StatusInternalServerError)
	}))
	defer broken.Close()
	if _, err := introspect.Fetch(context.Background(), broken.URL); err == nil || !strings.Contains(err.Error(), "500") || !strings.Contains(err.Error(), "datastore locked") {
		t.Errorf("Fetch from a failing server: %v, want the status and body", err)
	}
	garbage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "{not json") }))
	defer garbage.Close()
	if _, err := introspect.Fetch(context.Background(), garbage.URL); err == nil || !strings.Contains(err.Error(), "decode") {
		t.Errorf("Fetch of a bad body: %v, want a decode error", err)
	}
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	if _, err := introspect.Fetch(context.Background(), closed.URL); err == nil {
		t.Error("Fetch from a closed port succeeded")
	}
}
