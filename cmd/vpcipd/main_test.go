package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/checkpoint"
	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

var build struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if build.dir != "" {
		os.RemoveAll(build.dir)
	}
	os.Exit(code)
}

// buildDaemon builds cmd/vpcipd once per test binary run.
func buildDaemon(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the vpcipd binary")
	}
	build.once.Do(func() {
		if build.dir, build.err = os.MkdirTemp("", "vpcipd-bin"); build.err != nil {
			return
		}
		build.bin = filepath.Join(build.dir, "vpcipd")
		out, err := exec.Command("go", "build", "-o", build.bin, ".").CombinedOutput()
		if err != nil {
			build.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if build.err != nil {
		t.Fatal(build.err)
	}
	return build.bin
}

// TestBadConfigStopsWithTheVariable: a malformed value stops vpcipd before
// it does anything, naming each bad variable and the accepted form.
func TestBadConfigStopsWithTheVariable(t *testing.T) {
	bin := buildDaemon(t)
	cmd := exec.Command(bin)
	cmd.Env = []string{"WARM_IP_TARGET=many", "AWS_VPC_ENI_MTU=90000", "VPCIP_SOCKET=" + filepath.Join(shortDir(t), "s.sock")}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Fatalf("vpcipd with a bad config: %v, want exit 2\n%s", err, out)
	}
	for _, want := range []string{`WARM_IP_TARGET="many": want a whole number`, `AWS_VPC_ENI_MTU="90000": want a whole number from 576 to 9001`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// daemonEnv runs vpcipd against a vpcsim instance without host networking.
func daemonEnv(l *vpcsimtest.Local, instanceID, dir string) []string {
	return []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + dir,
		"AWS_REGION=us-west-2",
		"AWS_ACCESS_KEY_ID=AKIDVPCIPTEST",
		"AWS_SECRET_ACCESS_KEY=secret",
		"AWS_CONFIG_FILE=/dev/null",
		"AWS_SHARED_CREDENTIALS_FILE=/dev/null",
		"AWS_ENDPOINT_URL_EC2=" + l.EC2URL,
		"AWS_EC2_METADATA_SERVICE_ENDPOINT=" + l.IMDSURL(instanceID),
		"VPCIP_HOSTNET=false",
		"VPCIP_SOCKET=" + filepath.Join(dir, "s.sock"),
		"VPCIP_CHECKPOINT=" + filepath.Join(dir, "state", "ipam.json"),
		"VPCIP_METRICS_ADDR=off",
		"VPCIP_INTROSPECTION_ADDR=off",
		"VPCIP_CLUSTER_NAME=crash-test",
		"WARM_IP_TARGET=5",
		"IP_COOLDOWN_PERIOD=0",
	}
}

func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "vpcipd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

type proc struct {
	cmd    *exec.Cmd
	client *api.Client
}

func startDaemon(t testing.TB, bin string, env []string, dir string) *proc {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = env
	logf, err := os.OpenFile(filepath.Join(dir, "vpcipd.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd.Stderr, cmd.Stdout = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, client: api.NewClient(filepath.Join(dir, "s.sock"), 5*time.Second)}
	t.Cleanup(func() { p.cmd.Process.Kill(); p.cmd.Wait() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := p.client.Status(context.Background())
		if err == nil && st.Ready {
			return p
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "vpcipd.log"))
			t.Fatalf("vpcipd not ready: %v %+v\n%s", err, st, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCrashDuringAssignReleaseStream: kill -9 the daemon at random points of
// a stream of assigns and releases; after each restart no address is held by
// two keys, every answered assign still holds its address, every answered
// release holds none, and the checkpoint loads.
func TestCrashDuringAssignReleaseStream(t *testing.T) {
	bin := buildDaemon(t)
	l := vpcsimtest.Start(t, vpcsim.Config{Seed: 7})
	inst := l.Launch(t, "m5.large")
	dir := shortDir(t)
	env := daemonEnv(l, inst.ID, dir)
	rng := rand.New(rand.NewPCG(1, 2))
	held := map[string]netip.Addr{} // keys whose last answered call gave them an address
	unknown := map[string]bool{}    // keys whose last call was cut by a kill
	keys := make([]string, 24)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%02d", i)
	}
	for round := range 8 {
		p := startDaemon(t, bin, env, dir)
		verifyAfterRestart(t, p, dir, keys, held, unknown)
		result := make(chan string)
		seed := rng.Uint64()
		go func() { result <- stream(p, rand.New(rand.NewPCG(seed, 3)), keys, held, unknown) }()
		time.Sleep(time.Duration(20+rng.IntN(300)) * time.Millisecond)
		p.cmd.Process.Signal(syscall.SIGKILL)
		p.cmd.Wait()
		inFlight := <-result
		delete(held, inFlight) // its outcome is unknown
		unknown[inFlight] = true
		t.Logf("round %d: killed with %d keys holding addresses, %q in flight", round, len(held), inFlight)
	}
	p := startDaemon(t, bin, env, dir)
	verifyAfterRestart(t, p, dir, keys, held, unknown)
	p.cmd.Process.Signal(syscall.SIGTERM)
	if err := p.cmd.Wait(); err != nil {
		t.Errorf("vpcipd after SIGTERM: %v", err)
	}
	st, dropped, err := checkpoint.Load(filepath.Join(dir, "state", "ipam.json"))
	if err != nil || len(dropped) > 0 {
		t.Fatalf("checkpoint after SIGTERM: %v %v", err, dropped)
	}
	cloud := map[netip.Addr]bool{}
	for _, e := range l.Cloud.NetworkInterfaces() {
		for _, a := range e.SecondaryIPs {
			cloud[a] = e.InstanceID == inst.ID
		}
	}
	for _, a := range st.Assignments {
		if !cloud[a.Address] {
			t.Errorf("checkpointed %s (%s) is not on the instance's ENIs", a.Address, a.Key)
		}
	}
}

// stream runs assigns and releases until a call fails (the daemon was
// killed), keeping held up to date with answered calls, and returns the key
// of the call that failed: its outcome is unknown.
func stream(p *proc, rng *rand.Rand, keys []string, held map[string]netip.Addr, unknown map[string]bool) string {
	ctx := context.Background()
	for {
		k := keys[rng.IntN(len(keys))]
		_, isHeld := held[k]
		delete(held, k) // in flight until answered
		if isHeld {
			if _, err := p.client.Release(ctx, api.ReleaseRequest{Key: key(k)}); err != nil {
				return k
			}
			delete(unknown, k)
			continue
		}
		a, err := p.client.Assign(ctx, api.AssignRequest{Key: key(k), Pod: api.Pod{Namespace: "default", Name: k}})
		var e *api.Error
		switch {
		case errors.As(err, &e) && e.Code == api.CodeNoAddress:
		case err != nil:
			return k
		default:
			held[k] = a.Address
		}
		delete(unknown, k)
	}
}

func key(k string) api.Key { return api.Key{Network: "vpcip", ContainerID: k, IfName: "eth0"} }

func verifyAfterRestart(t *testing.T, p *proc, dir string, keys []string, held map[string]netip.Addr, unknown map[string]bool) {
	t.Helper()
	st, dropped, err := checkpoint.Load(filepath.Join(dir, "state", "ipam.json"))
	if err != nil && !errors.Is(err, os.ErrNotExist) || len(dropped) > 0 {
		t.Fatalf("checkpoint does not load cleanly: %v %v", err, dropped)
	}
	owner := map[netip.Addr]string{}
	for _, a := range st.Assignments {
		if o, dup := owner[a.Address]; dup {
			t.Errorf("address %s held by %s and %s", a.Address, o, a.Key.ContainerID)
		}
		owner[a.Address] = a.Key.ContainerID
	}
	for _, k := range keys {
		got, err := p.client.Check(context.Background(), api.CheckRequest{Key: key(k)})
		addr, isHeld := held[k]
		var e *api.Error
		switch {
		case isHeld && (err != nil || got.Address != addr):
			t.Errorf("after restart %s holds %v (%v), answered %s before the kill", k, got.Address, err, addr)
		case !isHeld && !unknown[k] && !(errors.As(err, &e) && e.Code == api.CodeNotFound):
			t.Errorf("after restart %s holds %v (%v), its answered release or nothing before the kill", k, got.Address, err)
		}
	}
}

// TestInstallCNIAfterReady: install-cni writes nothing while the daemon is
// not ready, then installs the plugin and the conflist (portmap chained only
// when its binary exists).
func TestInstallCNIAfterReady(t *testing.T) {
	bin := buildDaemon(t)
	l := vpcsimtest.Start(t, vpcsim.Config{Seed: 8})
	inst := l.Launch(t, "m5.large")
	dir := shortDir(t)
	binDir, confDir := filepath.Join(dir, "bin"), filepath.Join(dir, "net.d")
	plugin := filepath.Join(dir, "vpcip-cni-build")
	if err := os.WriteFile(plugin, []byte("#!/bin/sh\necho plugin\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	env := append(daemonEnv(l, inst.ID, dir), "VPCIP_CNI_BIN_DIR="+binDir, "VPCIP_CNI_CONF_DIR="+confDir,
		"VPCIP_CNI_PLUGIN_SRC="+plugin, "AWS_VPC_ENI_MTU=1500", "VPCIP_INSTALL_WAIT=500ms")
	install := func() error {
		cmd := exec.Command(bin, "install-cni")
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	if err := install(); err == nil {
		t.Fatal("install-cni succeeded with no daemon running")
	}
	if _, err := os.Stat(filepath.Join(confDir, "10-vpcip.conflist")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("conflist written before the daemon was ready")
	}
	startDaemon(t, bin, env, dir)
	if err := install(); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(binDir, "vpcip-cni"))
	fi, _ := os.Stat(filepath.Join(binDir, "vpcip-cni"))
	if err != nil || string(got) != "#!/bin/sh\necho plugin\n" || fi.Mode().Perm() != 0o755 {
		t.Errorf("installed plugin: %v %q mode %v", err, got, fi.Mode())
	}
	want := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"vpcip","plugins":[{"ipamdSocket":%q,"mtu":1500,`+
		`"pluginLogFile":"/var/log/vpcip/plugin.log","pluginLogLevel":"info","type":"vpcip-cni","vethPrefix":"eni"}]}`,
		filepath.Join(dir, "s.sock"))
	if got := compactJSON(t, filepath.Join(confDir, "10-vpcip.conflist")); got != want {
		t.Errorf("conflist:\n got %s\nwant %s", got, want)
	}
	if err := os.WriteFile(filepath.Join(binDir, "portmap"), []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := install(); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Plugins []map[string]any `json:"plugins"`
	}
	json.Unmarshal([]byte(compactJSON(t, filepath.Join(confDir, "10-vpcip.conflist"))), &doc)
	if len(doc.Plugins) != 2 || doc.Plugins[1]["type"] != "portmap" || doc.Plugins[1]["snat"] != true {
		t.Errorf("with portmap present, plugins = %v", doc.Plugins)
	}
	leftovers, _ := filepath.Glob(filepath.Join(confDir, ".*"))
	if len(leftovers) > 0 {
		t.Errorf("temp files left: %v", leftovers)
	}
}

// TestInstallCNIStay: with -stay (the chart's sidecar) install-cni installs,
// keeps running and exits 0 on SIGTERM; a bad flag is a usage error.
func TestInstallCNIStay(t *testing.T) {
	bin := buildDaemon(t)
	l := vpcsimtest.Start(t, vpcsim.Config{Seed: 9})
	inst := l.Launch(t, "m5.large")
	dir := shortDir(t)
	confDir := filepath.Join(dir, "net.d")
	plugin := filepath.Join(dir, "vpcip-cni-build")
	if err := os.WriteFile(plugin, []byte("plugin"), 0o700); err != nil {
		t.Fatal(err)
	}
	env := append(daemonEnv(l, inst.ID, dir), "VPCIP_CNI_BIN_DIR="+filepath.Join(dir, "bin"), "VPCIP_CNI_CONF_DIR="+confDir,
		"VPCIP_CNI_PLUGIN_SRC="+plugin, "VPCIP_INSTALL_WAIT=20s")
	if out, err := exec.Command(bin, "install-cni", "-bogus").CombinedOutput(); exitCode(err) != 2 {
		t.Errorf("install-cni -bogus: %v %s, want exit 2", err, out)
	}
	startDaemon(t, bin, env, dir)
	cmd := exec.Command(bin, "install-cni", "-stay")
	cmd.Env = env
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(confDir, "10-vpcip.conflist")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("no conflist after 20s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("install-cni -stay exited after installing: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("install-cni -stay on SIGTERM: %v, want exit 0", err)
		}
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		t.Fatal("install-cni -stay ignored SIGTERM")
	}
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

func compactJSON(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	out, _ := json.Marshal(v)
	return string(out)
}

// TestB11CooldownSurvivesKill9: an address released just before a kill -9
// is not handed out again by the restarted daemon within IP_COOLDOWN_PERIOD.
func TestB11CooldownSurvivesKill9(t *testing.T) {
	bin := buildDaemon(t)
	l := vpcsimtest.Start(t, vpcsim.Config{Seed: 12})
	inst := l.Launch(t, "m5.large")
	dir := shortDir(t)
	env := append(daemonEnv(l, inst.ID, dir), "MAX_ENI=1", "WARM_IP_TARGET=9", "IP_COOLDOWN_PERIOD=300", "VPCIP_ADD_WAIT=3s")
	p := startDaemon(t, bin, env, dir)
	ctx := context.Background()
	var released netip.Addr
	for i := range 9 { // the primary ENI's 9 secondary addresses
		a, err := p.client.Assign(ctx, api.AssignRequest{Key: key(fmt.Sprint("c", i)), Pod: api.Pod{Name: "p"}})
		if err != nil {
			t.Fatalf("ADD c%d: %v", i, err)
		}
		if i == 1 {
			released = a.Address
		}
	}
	if _, err := p.client.Release(ctx, api.ReleaseRequest{Key: key("c1")}); err != nil {
		t.Fatal(err)
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	p.cmd.Wait()
	p = startDaemon(t, bin, env, dir)
	a, err := p.client.Assign(ctx, api.AssignRequest{Key: key("c9"), Pod: api.Pod{Name: "p"}})
	var e *api.Error
	switch {
	case err == nil && a.Address == released:
		t.Fatalf("c9 got %s, released before the kill and still cooling down", released)
	case err != nil && !(errors.As(err, &e) && e.Cause == api.CauseCooldown):
		t.Fatalf("ADD c9 after restart: %v, want a cooldown refusal", err)
	}
}
