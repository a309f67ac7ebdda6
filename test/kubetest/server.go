package kubetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Options shape one server. The zero value is a plain server.
type Options struct {
	// Name tags the temporary directory (kubetest-<name>-*), for finding logs.
	Name string
	// ExtraArgs are appended to kube-apiserver's flags (a later flag wins).
	ExtraArgs []string
	// IPv6 makes the API server IPv6 single-stack: it listens on and
	// advertises [::1] (URL https://[::1]:<port>) and Services take
	// addresses of ServiceCIDR6. etcd stays on 127.0.0.1 (the API
	// server's storage, not the cluster's network).
	IPv6 bool
	// StartTimeout bounds etcd + kube-apiserver start-up; 0 means 3 minutes
	// (a loaded 2-core machine can take over a minute).
	StartTimeout time.Duration
}

// Server is one running etcd + kube-apiserver pair on loopback.
type Server struct {
	// Config authenticates as a member of system:masters (client certificate).
	Config *rest.Config
	// Kubeconfig is a file holding Config, for kubectl and helm.
	Kubeconfig string
	// BinDir holds kube-apiserver, kubectl and the other built binaries.
	BinDir string
	// URL is the API server's https://127.0.0.1:<port> (https://[::1]:<port>
	// with Options.IPv6).
	URL string
	// ServiceCIDR is the range Services take their ClusterIPs from
	// (--service-cluster-ip-range).
	ServiceCIDR string

	dir     string
	pki     *pki
	args    []string
	timeout time.Duration

	mu        sync.Mutex // guards the processes below
	etcd      *proc
	apiserver *proc
}

// proc is a started process; done closes once it exited and was reaped.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// ownerFile, in a server's directory, holds the ID of the process that
// started it (decimal): removeStale's witness that it is still in use.
const ownerFile = "owner.pid"

// removeStale removes the server directories under base (kubetest-*)
// whose owner process is gone: a test binary killed with SIGKILL cannot
// stop its servers, and each left etcd's data (about 120 MB of memory on
// /dev/shm) behind. A directory without an owner file, or whose owner
// still runs, is kept.
func removeStale(base string) {
	dirs, _ := filepath.Glob(filepath.Join(base, "kubetest-*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, ownerFile))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			os.RemoveAll(d)
		}
	}
}

// Start starts etcd and kube-apiserver and waits until /readyz answers and the
// default ServiceAccounts exist (no controller-manager runs to create them).
// On error everything started is stopped and removed; the error carries the
// tail of the failing process's log.
func Start(opts Options) (srv *Server, err error) {
	binDir, etcdPath, err := Binaries()
	if err != nil {
		return nil, err
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 3 * time.Minute
	}
	base := os.TempDir()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		base = "/dev/shm" // etcd fsyncs on every write; memory makes that free
	}
	removeStale(base)
	dir, err := os.MkdirTemp(base, "kubetest-"+opts.Name+"-")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s := &Server{BinDir: binDir, dir: dir, timeout: opts.StartTimeout}
	defer func() {
		if err != nil {
			s.Stop()
			srv = nil
		}
	}()
	if s.pki, err = newPKI(dir); err != nil {
		return nil, fmt.Errorf("certificates: %w", err)
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	if err := s.startEtcd(etcdPath, etcdURL, ports[1]); err != nil {
		return nil, err
	}
	host := "127.0.0.1"
	s.ServiceCIDR = ServiceCIDR4
	if opts.IPv6 {
		host, s.ServiceCIDR = "::1", ServiceCIDR6
	}
	s.URL = "https://" + net.JoinHostPort(host, strconv.Itoa(ports[2]))
	s.args = append(s.apiserverArgs(etcdURL, host, ports[2]), opts.ExtraArgs...)
	s.Config = &rest.Config{
		Host:            s.URL,
		TLSClientConfig: rest.TLSClientConfig{CAData: s.pki.caPEM, CertData: s.pki.adminCertPEM, KeyData: s.pki.adminKeyPEM},
		QPS:             100, Burst: 200,
	}
	if err := s.StartAPIServer(); err != nil {
		return nil, err
	}
	s.Kubeconfig = filepath.Join(dir, "admin.kubeconfig")
	if err := WriteKubeconfig(s.Config, s.Kubeconfig); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), opts.StartTimeout)
	defer cancel()
	for _, ns := range []string{"default", "kube-system"} {
		if err := s.EnsureNamespace(ctx, ns); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Service ranges: ServiceCIDR4 by default, ServiceCIDR6 (a /112 of a ULA,
// as kubeadm's IPv6 examples use) with Options.IPv6.
const (
	ServiceCIDR4 = "10.96.0.0/16"
	ServiceCIDR6 = "fd00:10:96::/112"
)

func (s *Server) apiserverArgs(etcdURL, host string, port int) []string {
	p := s.pki
	return []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=" + host, "--advertise-address=" + host, "--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + p.servingCert, "--tls-private-key-file=" + p.servingKey,
		"--client-ca-file=" + p.caCert,
		"--service-account-key-file=" + p.saPub, "--service-account-signing-key-file=" + p.saKey,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-cluster-ip-range=" + s.ServiceCIDR,
		"--authorization-mode=RBAC",
		"--endpoint-reconciler-type=none",
		"--allow-privileged=true",
		"--profiling=false",
		"--cert-dir=" + filepath.Join(s.dir, "certs"),
	}
}

func (s *Server) startEtcd(etcdPath, clientURL string, peerPort int) error {
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	cmd, err := s.spawn("etcd", etcdPath,
		"--name=kubetest", "--data-dir="+filepath.Join(s.dir, "etcd"),
		"--listen-client-urls="+clientURL, "--advertise-client-urls="+clientURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=kubetest="+peerURL, "--logger=zap", "--log-level=warn")
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.etcd = cmd
	s.mu.Unlock()
	return s.waitHTTP(cmd, "etcd", clientURL+"/health", nil)
}

// StartAPIServer (re)starts kube-apiserver with the same port, etcd and keys,
// and waits for /readyz. Tests use it with StopAPIServer to take the API away
// and give it back.
func (s *Server) StartAPIServer() error {
	s.mu.Lock()
	running := s.apiserver != nil
	s.mu.Unlock()
	if running {
		return errors.New("kube-apiserver is already running")
	}
	cmd, err := s.spawn("kube-apiserver", filepath.Join(s.BinDir, "kube-apiserver"), s.args...)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.apiserver = cmd
	s.mu.Unlock()
	tlsCfg, err := rest.TLSConfigFor(s.Config)
	if err != nil {
		return err
	}
	return s.waitHTTP(cmd, "kube-apiserver", s.URL+"/readyz", &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg}})
}

// PIDs are the process ids of etcd and kube-apiserver while they run (none
// once stopped), for a harness that gives the control plane its own CPU
// share.
func (s *Server) PIDs() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int
	for _, p := range []*proc{s.etcd, s.apiserver} {
		if p != nil && p.cmd.Process != nil {
			out = append(out, p.cmd.Process.Pid)
		}
	}
	return out
}

// StopAPIServer kills kube-apiserver (etcd keeps running) and waits for it to
// exit, so clients see connection refused from then on.
func (s *Server) StopAPIServer() {
	s.mu.Lock()
	cmd := s.apiserver
	s.apiserver = nil
	s.mu.Unlock()
	kill(cmd)
}

// Stop kills both processes and removes the server's directory. Safe to call
// twice.
func (s *Server) Stop() {
	s.StopAPIServer()
	s.mu.Lock()
	cmd := s.etcd
	s.etcd = nil
	s.mu.Unlock()
	kill(cmd)
	if s.dir != "" {
		os.RemoveAll(s.dir)
	}
}

func kill(p *proc) {
	if p == nil {
		return
	}
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) // its process group
	<-p.done
}

// spawn starts a process in its own process group, killed if the test binary
// dies (Pdeathsig, from a thread that outlives the child), logging to
// <dir>/<name>.log.
func (s *Server) spawn(name, path string, args ...string) (*proc, error) {
	logf, err := os.OpenFile(filepath.Join(s.dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	started := make(chan error)
	go func() {
		// The kernel sends Pdeathsig when the forking thread exits, and Go
		// ends threads that netns code locked and left: fork from a thread
		// of our own that lives until the child is gone.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return p, nil
}

// waitHTTP polls url until it answers 200, the process exits or the start
// timeout passes.
func (s *Server) waitHTTP(p *proc, name, url string, client *http.Client) error {
	if client == nil {
		client = &http.Client{}
	}
	client.Timeout = 5 * time.Second
	deadline := time.Now().Add(s.timeout)
	for time.Now().Before(deadline) {
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited during start-up:\n%s", name, s.logTail(name))
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s not ready after %v:\n%s", name, s.timeout, s.logTail(name))
}

func (s *Server) logTail(name string) string {
	b, _ := os.ReadFile(filepath.Join(s.dir, name+".log"))
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// freePorts returns n distinct loopback TCP ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// EnsureNamespace creates namespace ns and its "default" ServiceAccount if
// missing (without a controller-manager nobody else does, and the
// ServiceAccount admission plugin refuses pods until it exists).
func (s *Server) EnsureNamespace(ctx context.Context, ns string) error {
	cs, err := kubernetes.NewForConfig(s.Config)
	if err != nil {
		return err
	}
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("namespace %s: %w", ns, err)
	}
	_, err = cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("serviceaccount %s/default: %w", ns, err)
	}
	return nil
}

// Kubectl runs kubectl against the server as admin and returns its stdout;
// the error carries stderr.
func (s *Server) Kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(s.BinDir, "kubectl"), append([]string{"--kubeconfig", s.Kubeconfig}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// WriteKubeconfig writes cfg (host, CA, client certificate or bearer token) as
// a kubeconfig file with one context, mode 0600.
func WriteKubeconfig(cfg *rest.Config, path string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["kubetest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData, TLSServerName: cfg.ServerName}
	kc.AuthInfos["user"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["kubetest"] = &clientcmdapi.Context{Cluster: "kubetest", AuthInfo: "user"}
	kc.CurrentContext = "kubetest"
	return clientcmd.WriteToFile(*kc, path)
}
