package main

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/vpcip/vpcip/test/kubetest"
	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

// TestSecureMetricsRefusedWithoutAPIServer: the vpcipd binary with
// VPCIP_METRICS_SECURE=true and no way to reach an API server exits at start
// naming the variable; it never serves metrics to everyone.
func TestSecureMetricsRefusedWithoutAPIServer(t *testing.T) {
	bin := buildDaemon(t)
	l := vpcsimtest.Start(t, vpcsim.Config{Seed: 3})
	inst := l.Launch(t, "m5.large")
	dir := shortDir(t)
	cmd := exec.Command(bin)
	cmd.Env = append(daemonEnv(l, inst.ID, dir), "VPCIP_METRICS_SECURE=true", "VPCIP_METRICS_ADDR=127.0.0.1:0")
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
		}
	}()
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("vpcipd: %v, want exit 1\n%s", err, out)
	}
	if !strings.Contains(string(out), "VPCIP_METRICS_SECURE=true needs the Kubernetes API") {
		t.Errorf("output does not say why:\n%s", out)
	}
}

// TestSecureMetricsEndToEnd: the vpcipd binary with VPCIP_METRICS_SECURE=true
// and a kubeconfig of a ServiceAccount bound to exactly the chart's
// files/metrics-auth-rules.yaml, against a real kube-apiserver: a scraper
// bound to the chart's reader rules gets the daemon's metrics over HTTPS,
// one without gets 403, no token 401, plain HTTP 400.
func TestSecureMetricsEndToEnd(t *testing.T) {
	kubetest.SkipIfUnavailable(t)
	bin := buildDaemon(t)
	k, err := kubetest.Start(kubetest.Options{Name: "vpcipd-metrics"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Stop)
	ctx := context.Background()
	charts := filepath.Join("..", "..", "charts", "vpcip", "files")
	daemonCfg, err := k.ServiceAccountConfigFromFile(ctx, "kube-system", "vpcip", filepath.Join(charts, "metrics-auth-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	reader, err := k.ServiceAccountConfigFromFile(ctx, "monitoring", "prometheus", filepath.Join(charts, "metrics-reader-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := k.ServiceAccountConfig(ctx, "monitoring", "stranger", []rbacv1.PolicyRule{{NonResourceURLs: []string{"/version"}, Verbs: []string{"get"}}})
	if err != nil {
		t.Fatal(err)
	}
	dir := shortDir(t)
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := kubetest.WriteKubeconfig(daemonCfg, kubeconfig); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	l := vpcsimtest.Start(t, vpcsim.Config{Seed: 4})
	inst := l.Launch(t, "m5.large")
	env := append(daemonEnv(l, inst.ID, dir), "VPCIP_METRICS_SECURE=true", "VPCIP_METRICS_ADDR="+addr, "VPCIP_KUBECONFIG="+kubeconfig)
	startDaemon(t, bin, env, dir)

	client := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	scrape := func(token string) (int, string) {
		req, _ := http.NewRequest("GET", "https://"+addr+"/metrics", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			log, _ := os.ReadFile(filepath.Join(dir, "vpcipd.log"))
			t.Fatalf("scrape: %v\n%s", err, log)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := scrape(reader.BearerToken); code != http.StatusOK || !strings.Contains(body, "vpcip_addresses_assigned") {
		t.Errorf("reader: %d, metrics present %v; want 200 with the daemon's metrics", code, strings.Contains(body, "vpcip_addresses_assigned"))
	}
	if code, body := scrape(stranger.BearerToken); code != http.StatusForbidden || strings.Contains(body, "vpcip_") {
		t.Errorf("ServiceAccount without the reader rules: %d %q, want 403", code, body)
	}
	if code, body := scrape(""); code != http.StatusUnauthorized || strings.Contains(body, "vpcip_") {
		t.Errorf("no token: %d %q, want 401", code, body)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("plain HTTP: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || strings.Contains(string(b), "vpcip_") {
		t.Errorf("plain HTTP: %d %q, want 400 without metrics", resp.StatusCode, b)
	}
}
