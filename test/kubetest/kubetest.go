// Package kubetest runs a real kube-apiserver (with its own etcd) for tests:
// one per test package through Main and Shared, or one per test through Start.
//
// The binaries come from scripts/k8s-tools.sh (kube-apiserver, kubectl; v1.37.2
// built from the Go module proxy) and Debian's etcd. The harness looks for the
// bin dir in $VPCIP_K8S_BIN, else the newest /var/cache/vpcip/k8s-*/bin holding
// kube-apiserver. Without root, etcd or kube-apiserver the tests skip, unless
// VPCIP_REQUIRE_KUBE=1 (set by `make test`) turns that into a failure.
//
// Each server gets a fresh etcd data dir (in /dev/shm when it exists), free
// loopback ports, a CA, serving and admin client certificates and service
// account signing keys generated here. kube-apiserver runs with
// --endpoint-reconciler-type=none (no Endpoints reconciling for a loopback
// address), --allow-privileged=true (privileged DaemonSets) and RBAC
// authorization, so identities other than the admin get exactly what their
// roles grant.
//
//	var kube *kubetest.Server // not needed: kubetest.Shared(t) returns it
//
//	func TestMain(m *testing.M) { kubetest.Main(m) }
//
//	func TestX(t *testing.T) {
//		k := kubetest.Shared(t) // started on first use, stopped after the package's tests
//		cs := kubernetes.NewForConfigOrDie(k.Config)
//		...
//	}
package kubetest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"testing"
)

// RequireEnv is the environment variable that turns a skip for missing root or
// binaries into a failure (CI sets it, so a broken setup cannot pass as skipped).
const RequireEnv = "VPCIP_REQUIRE_KUBE"

// BinDirEnv names the directory holding kube-apiserver and kubectl; it is the
// variable scripts/k8s-tools.sh reads too.
const BinDirEnv = "VPCIP_K8S_BIN"

// Binaries locates kube-apiserver and etcd (kubectl, next to kube-apiserver,
// is needed by Kubectl only). It returns the bin dir of
// the Kubernetes binaries, the etcd path, or an error saying what is missing.
func Binaries() (binDir, etcd string, err error) {
	binDir = os.Getenv(BinDirEnv)
	if binDir == "" {
		matches, _ := filepath.Glob("/var/cache/vpcip/k8s-*/bin/kube-apiserver")
		sort.Slice(matches, func(i, j int) bool { return modTime(matches[i]) > modTime(matches[j]) })
		if len(matches) > 0 {
			binDir = filepath.Dir(matches[0])
		}
	}
	if binDir == "" {
		return "", "", errors.New("no kube-apiserver: run `bash scripts/k8s-tools.sh` (or set " + BinDirEnv + ")")
	}
	if _, err := os.Stat(filepath.Join(binDir, "kube-apiserver")); err != nil {
		return "", "", fmt.Errorf("kube-apiserver missing in %s: run `bash scripts/k8s-tools.sh`", binDir)
	}
	etcd, err = exec.LookPath("etcd")
	if err != nil {
		return "", "", errors.New("no etcd: apt-get install etcd-server (scripts/deps.sh etcd-server)")
	}
	return binDir, etcd, nil
}

func modTime(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.ModTime().UnixNano()
}

// Unavailable says why no server can run here (not root, binaries missing),
// or "" when one can.
func Unavailable() string {
	if os.Geteuid() != 0 {
		return "kube-apiserver tests need root"
	}
	if _, _, err := Binaries(); err != nil {
		return err.Error()
	}
	return ""
}

// SkipIfUnavailable skips t when no server can run here, or fails it when
// VPCIP_REQUIRE_KUBE=1.
func SkipIfUnavailable(t testing.TB) {
	t.Helper()
	if why := Unavailable(); why != "" {
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("%s, and %s=1 requires it", why, RequireEnv)
		}
		t.Skip(why)
	}
}

var shared struct {
	mu  sync.Mutex
	srv *Server
	err error
}

// Shared returns the package's server, starting it on first use (about 10 s).
// It skips t when the server cannot run here (see SkipIfUnavailable) and fails
// it when the start failed. Main stops it after the package's tests; tests must
// leave it running (use Start for a server of one's own to stop or break).
func Shared(t testing.TB) *Server {
	t.Helper()
	SkipIfUnavailable(t)
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.srv == nil && shared.err == nil {
		shared.srv, shared.err = Start(Options{Name: "shared"})
	}
	if shared.err != nil {
		t.Fatalf("kube-apiserver: %v", shared.err)
	}
	return shared.srv
}

// Main runs the package's tests and stops the shared server afterwards, also
// when a test failed. Call it from TestMain; it does not return.
func Main(m *testing.M) {
	code := m.Run()
	StopShared()
	os.Exit(code)
}

// StopShared stops the shared server if Shared started one; for a TestMain
// that cannot use Main.
func StopShared() {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.srv != nil {
		shared.srv.Stop()
		shared.srv, shared.err = nil, nil
	}
}
