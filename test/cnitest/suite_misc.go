package cnitest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/vpcip/vpcip/ipamd/api"
)

// execError decodes the one JSON error object a failed plugin prints.
func execError(t testing.TB, stdout []byte) types.Error {
	t.Helper()
	var e types.Error
	dec := json.NewDecoder(bytes.NewReader(stdout))
	if err := dec.Decode(&e); err != nil {
		t.Fatalf("stdout %q is not a JSON error: %v", stdout, err)
	}
	if dec.More() {
		t.Fatalf("stdout holds more than one JSON document: %q", stdout)
	}
	if e.Code == 0 || e.Msg == "" {
		t.Fatalf("error without code or msg: %q", stdout)
	}
	return e
}

func (e *Env) addEnv(p *Pod) map[string]string {
	env := e.delEnv(p)
	env["CNI_COMMAND"] = "ADD"
	return env
}

// testVersions is B32: VERSION lists exactly our versions; ADD/CHECK/DEL
// work in each and print the result in the config's version; unsupported
// versions get code 1 without asking the daemon; GC and STATUS below 1.1.0
// get the spec's refusal.
func testVersions(t *testing.T, e *Env) {
	stdout, _, err := e.Exec(t, map[string]string{"CNI_COMMAND": "VERSION"}, []byte(`{"cniVersion":"1.1.0"}`))
	if err != nil {
		t.Fatalf("VERSION: %v", err)
	}
	var vi struct {
		CNIVersion string   `json:"cniVersion"`
		Supported  []string `json:"supportedVersions"`
	}
	if err := json.Unmarshal(stdout, &vi); err != nil || !slices.Equal(vi.Supported, []string{"0.4.0", "1.0.0", "1.1.0"}) {
		t.Errorf("VERSION printed %s (%v); want supportedVersions [0.4.0 1.0.0 1.1.0]", stdout, err)
	}
	for _, v := range []string{"0.4.0", "1.0.0", "1.1.0"} {
		ve := *e
		ve.CNIVersion = v
		p := ve.NewPod(t, "v"+strings.ReplaceAll(v, ".", ""))
		ve.MustAdd(t, p)
		a := mustHeld(t, &ve, p)
		AssertPodWired(t, &ve, p, a.RouteTable, mtuOf(&ve, a))
		if err := ve.Check(t, p); err != nil {
			t.Errorf("%s: CHECK: %v", v, err)
		}
		mustDel(t, &ve, p)
		// The plugin alone prints its result in the config's version.
		q := ve.NewPod(t, "raw"+strings.ReplaceAll(v, ".", ""))
		out, _, err := ve.Exec(t, ve.addEnv(q), ve.pluginStdin(t, nil))
		var res struct {
			CNIVersion string `json:"cniVersion"`
			IPs        []struct {
				Address string `json:"address"`
			} `json:"ips"`
		}
		if err != nil || json.Unmarshal(out, &res) != nil || res.CNIVersion != v || len(res.IPs) != 1 {
			t.Errorf("%s: ADD printed %s (%v); want a result of version %s with one IP", v, out, err, v)
		}
		if _, _, err := ve.Exec(t, ve.delEnv(q), ve.pluginStdin(t, nil)); err != nil {
			t.Errorf("%s: DEL: %v", v, err)
		}
	}
	for _, v := range []string{"0.3.1", "9.9.9"} {
		ve := *e
		ve.CNIVersion = v
		p := ve.NewPod(t, "unsupported")
		out, _, err := ve.Exec(t, ve.addEnv(p), ve.pluginStdin(t, nil))
		if err == nil || execError(t, out).Code != types.ErrIncompatibleCNIVersion {
			t.Errorf("ADD at %s: %v %s; want code 1", v, err, out)
		}
		if _, held := e.Held(t, p); held {
			t.Errorf("ADD at unsupported %s reached the daemon", v)
		}
	}
	old := *e
	old.CNIVersion = "0.4.0"
	for _, cmd := range []string{"GC", "STATUS"} {
		out, _, err := old.Exec(t, map[string]string{"CNI_COMMAND": cmd}, old.pluginStdin(t, nil))
		if err == nil || execError(t, out).Code != types.ErrIncompatibleCNIVersion {
			t.Errorf("%s at 0.4.0: %v %s; want code 1", cmd, err, out)
		}
	}
}

// testMalformed is B36: bad input to ADD, DEL and CHECK gives exactly one
// JSON error with the spec's code on stdout, never a panic, and never
// reaches the daemon.
func testMalformed(t *testing.T, e *Env) {
	p := e.NewPod(t, "malformed")
	good := e.pluginStdin(t, nil)
	with := func(k string, v any) []byte {
		var m map[string]any
		_ = json.Unmarshal(good, &m)
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
		b, _ := json.Marshal(m)
		return b
	}
	cases := []struct {
		name   string
		stdin  []byte
		env    map[string]string
		code   uint
		inMsg  string
		skipOn string // command for which the case does not apply
	}{
		{"empty stdin", nil, nil, types.ErrDecodingFailure, "", ""},
		{"truncated JSON", []byte("{"), nil, types.ErrDecodingFailure, "", ""},
		{"no name", with("name", nil), nil, types.ErrInvalidNetworkConfig, "name", ""},
		{"no type", with("type", nil), nil, types.ErrInvalidNetworkConfig, `"type"`, ""},
		{"mtu not a number", with("mtu", "abc"), nil, types.ErrInvalidNetworkConfig, `"mtu"`, ""},
		{"veth prefix too long", with("vethPrefix", "toolongprefix"), nil, types.ErrInvalidNetworkConfig, `"vethPrefix"`, ""},
		{"no cniVersion", with("cniVersion", nil), nil, types.ErrIncompatibleCNIVersion, "", ""},
		{"10 MB document", with("padding", strings.Repeat("x", 10<<20)), nil, types.ErrDecodingFailure, "bytes", ""},
		{"malformed CNI_ARGS pair", good, map[string]string{"CNI_ARGS": "K8S_POD_NAME=x;garbage"}, types.ErrInvalidEnvironmentVariables, "garbage", "DEL"},
		{"no CNI_CONTAINERID", good, map[string]string{"CNI_CONTAINERID": ""}, types.ErrInvalidEnvironmentVariables, "CNI_CONTAINERID", ""},
	}
	for _, cmd := range []string{"ADD", "DEL", "CHECK"} {
		for _, c := range cases {
			if c.skipOn == cmd {
				continue
			}
			env := e.addEnv(p)
			env["CNI_COMMAND"] = cmd
			for k, v := range c.env {
				env[k] = v
			}
			out, stderr, err := e.Exec(t, env, c.stdin)
			if err == nil {
				t.Errorf("%s %s: succeeded", cmd, c.name)
				continue
			}
			got := execError(t, out)
			if got.Code != c.code || !strings.Contains(got.Msg+got.Details, c.inMsg) {
				t.Errorf("%s %s: code %d %q, want code %d mentioning %q", cmd, c.name, got.Code, got.Msg, c.code, c.inMsg)
			}
			if bytes.Contains(stderr, []byte("panic")) || bytes.Contains(stderr, []byte("goroutine ")) {
				t.Errorf("%s %s: panicked:\n%s", cmd, c.name, stderr)
			}
		}
	}
	// An attachment key the daemon refuses (api.Key.Check), and a netns
	// path naming another kind of namespace: ADD and CHECK get the spec's
	// code, and DEL succeeds, as nothing can have been added (a DEL that
	// always failed would keep the runtime from ever removing the sandbox).
	long := strings.Repeat("a", 300)
	refused := []struct {
		name  string
		stdin []byte
		env   map[string]string
		code  uint
		skip  string
	}{
		{"container ID over 256 bytes", good, map[string]string{"CNI_CONTAINERID": long}, types.ErrInvalidEnvironmentVariables, ""},
		{"network name over 256 bytes", with("name", long), nil, types.ErrInvalidNetworkConfig, ""},
		// skel refuses it for DEL too, before the plugin runs: the kernel
		// cannot have made such an interface.
		{"ifname over 15 bytes", good, map[string]string{"CNI_IFNAME": "eth0123456789abc"}, types.ErrInvalidEnvironmentVariables, "DEL"},
		{"netns of another kind", good, map[string]string{"CNI_NETNS": "/proc/self/ns/uts"}, types.ErrInvalidNetNS, "CHECK"},
	}
	for _, c := range refused {
		for _, cmd := range []string{"ADD", "CHECK", "DEL"} {
			if c.skip == cmd {
				continue
			}
			env := e.addEnv(p)
			env["CNI_COMMAND"] = cmd
			for k, v := range c.env {
				env[k] = v
			}
			out, stderr, err := e.Exec(t, env, c.stdin)
			switch {
			case cmd == "DEL" && err != nil:
				t.Errorf("DEL %s: %v %s; want success (nothing can be held)", c.name, err, out)
			case cmd != "DEL" && err == nil:
				t.Errorf("%s %s: succeeded", cmd, c.name)
			case cmd != "DEL":
				if got := execError(t, out); got.Code != c.code {
					t.Errorf("%s %s: code %d %q, want code %d", cmd, c.name, got.Code, got.Msg, c.code)
				}
			}
			if bytes.Contains(stderr, []byte("panic")) {
				t.Errorf("%s %s: panicked:\n%s", cmd, c.name, stderr)
			}
		}
	}
	if _, held := e.Held(t, p); held {
		t.Errorf("a malformed invocation reached the daemon and holds an address")
	}
	// Unknown fields and IgnoreUnknown are fine.
	env := e.addEnv(p)
	env["CNI_ARGS"] += ";SOMETHING_NEW=1"
	if out, _, err := e.Exec(t, env, with("futureKnob", map[string]any{"a": 1})); err != nil {
		t.Errorf("ADD with an unknown field and CNI_ARGS key: %v %s", err, out)
	}
	if _, _, err := e.Exec(t, e.delEnv(p), good); err != nil {
		t.Errorf("DEL: %v", err)
	}
}

// testMTU is B16: the config's MTU reaches both veth ends and the result.
func testMTU(t *testing.T, e *Env) {
	e.MTU = 1500
	p := e.NewPod(t, "mtu")
	e.MustAdd(t, p)
	a := mustHeld(t, e, p)
	AssertPodWired(t, e, p, a.RouteTable, 1500)
	for _, itf := range p.Result.Interfaces {
		if itf.Mtu != 1500 {
			t.Errorf("result interface %s mtu %d, want 1500", itf.Name, itf.Mtu)
		}
	}
	mustDel(t, e, p)
}

func ipCmd(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v %s", strings.Join(args, " "), err, out)
	}
}

// testCheckFaults is B33: CHECK passes on a healthy pod again and again
// without changing anything, and names each fault precisely.
func testCheckFaults(t *testing.T, e *Env) {
	p := e.NewPod(t, "check")
	e.MustAdd(t, p)
	a := mustHeld(t, e, p)
	before := snapshot(t, e, p)
	for i := 0; i < 20; i++ {
		if err := e.Check(t, p); err != nil {
			t.Fatalf("healthy CHECK %d: %v", i, err)
		}
	}
	if got := snapshot(t, e, p); !slices.Equal(before, got) {
		t.Errorf("CHECK changed state: %v -> %v", before, got)
	}
	expectCheck := func(what, want string) {
		t.Helper()
		err := e.Check(t, p)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: CHECK said %v; want it to name %q", what, err, want)
		}
	}
	ipCmd(t, "-n", p.NetnsName, "route", "del", "default")
	expectCheck("pod default route deleted", "default route via 169.254.1.1")
	ipCmd(t, "-n", p.NetnsName, "route", "add", "default", "via", gateway, "dev", p.IfName)
	ipCmd(t, "-n", e.Node.Name, "rule", "del", "priority", "512", "to", a.Address.String()+"/32", "table", "main")
	expectCheck("host rule deleted", `rule "512: to `+a.Address.String()+`/32 lookup main" missing`)
	ipCmd(t, "-n", e.Node.Name, "rule", "add", "priority", "512", "to", a.Address.String()+"/32", "table", "main")
	ipCmd(t, "-n", e.Node.Name, "route", "del", a.Address.String()+"/32")
	expectCheck("host route deleted", "host route "+a.Address.String()+"/32")
	ipCmd(t, "-n", e.Node.Name, "route", "add", a.Address.String()+"/32", "dev", e.HostVeth(p), "scope", "link")
	if err := e.Check(t, p); err != nil {
		t.Errorf("CHECK after repairs: %v", err)
	}
	e.Daemon.Stop(t)
	err := e.Check(t, p)
	e.Daemon.Start(t)
	if CNICode(err) != types.ErrTryAgainLater {
		t.Errorf("CHECK with the daemon down: %v (code %d), want code 11", err, CNICode(err))
	}
	if _, err := e.client().Release(context.Background(), api.ReleaseRequest{Key: e.key(p)}); err != nil {
		t.Fatal(err)
	}
	expectCheck("address released in the daemon", "holds no address")
	// DEL after the daemon already released: the local host state still goes.
	mustDel(t, e, p)
	AssertHostSideGone(t, e, p, a.Address)
}

// testAddFailureReleases is B37: an ADD that fails after the daemon assigned
// (here: a non-veth link squats the host veth name) undoes its work and
// releases the address, every time.
func testAddFailureReleases(t *testing.T, e *Env) {
	p := e.NewPod(t, "squatted")
	veth := e.HostVeth(p)
	ipCmd(t, "-n", e.Node.Name, "link", "add", veth, "type", "bridge")
	for i := 0; i < 10; i++ {
		p.ContainerID = randomHex(32)
		err := e.Add(t, p)
		if err == nil || !strings.Contains(err.Error(), "not a veth") {
			t.Fatalf("ADD %d with the host veth name taken: %v; want a failure naming it", i, err)
		}
		if _, held := e.Held(t, p); held {
			t.Fatalf("ADD %d failed but the daemon still holds its address", i)
		}
		if _, ok := linkNamed(t, p.NetnsName, p.IfName); ok {
			t.Fatalf("ADD %d failed but left %s in the pod", i, p.IfName)
		}
	}
	ipCmd(t, "-n", e.Node.Name, "link", "del", veth)
	e.MustAdd(t, p)
	a := mustHeld(t, e, p)
	AssertPodWired(t, e, p, a.RouteTable, mtuOf(e, a))
	mustDel(t, e, p)
}

// testAddTwice: a retried ADD for the same key gets the same address and
// leaves one working wiring.
func testAddTwice(t *testing.T, e *Env) {
	p := e.NewPod(t, "retry")
	e.MustAdd(t, p)
	first := p.Address
	out, _, err := e.Exec(t, e.addEnv(p), e.pluginStdin(t, nil))
	if err != nil {
		t.Fatalf("second ADD: %v %s", err, out)
	}
	if !strings.Contains(string(out), `"`+first.String()+`/32"`) {
		t.Errorf("second ADD printed %s; want the same address %v", out, first)
	}
	a := mustHeld(t, e, p)
	AssertPodWired(t, e, p, a.RouteTable, mtuOf(e, a))
	mustDel(t, e, p)
}

func testStatus(t *testing.T, e *Env) {
	if err := e.Status(t); err != nil {
		t.Errorf("STATUS with the daemon ready: %v", err)
	}
	e.Daemon.Stop(t)
	err := e.Status(t)
	e.Daemon.Start(t)
	if CNICode(err) != types.ErrPluginNotAvailable {
		t.Errorf("STATUS with the daemon down: %v, want code 50", err)
	}
}

// testChain: the reference plugins after ours find what they need in our
// result (tuning's sysctl in the pod, bandwidth's qdisc on our host veth and
// its ifb, portmap's DNAT to the pod address), CHECK passes through the
// whole chain, and DEL removes all of it.
func testChain(t *testing.T, e *Env) {
	p := e.NewPod(t, "chain")
	p.CapabilityArgs = map[string]any{
		"portMappings": []map[string]any{{"hostPort": 18080, "containerPort": 80, "protocol": "tcp"}},
		"bandwidth":    map[string]any{"ingressRate": 8000000, "ingressBurst": 100000, "egressRate": 8000000, "egressBurst": 100000},
	}
	e.MustAdd(t, p)
	out, err := exec.Command("ip", "netns", "exec", p.NetnsName, "sysctl", "-n", "net.core.somaxconn").Output()
	if err != nil || strings.TrimSpace(string(out)) != "512" {
		t.Errorf("tuning: somaxconn in the pod = %q (%v), want 512", out, err)
	}
	qd, err := exec.Command("tc", "-n", e.Node.Name, "qdisc", "show", "dev", e.HostVeth(p)).CombinedOutput()
	if err != nil || !strings.Contains(string(qd), "tbf") {
		t.Errorf("bandwidth: qdiscs on %s: %s (%v), want tbf", e.HostVeth(p), qd, err)
	}
	nat, err := exec.Command("ip", "netns", "exec", e.Node.Name, "iptables-save", "-t", "nat").CombinedOutput()
	if err != nil || !strings.Contains(string(nat), p.Address.String()+":80") || !strings.Contains(string(nat), "18080") {
		t.Errorf("portmap: nat table has no DNAT 18080 -> %s:80 (%v):\n%s", p.Address, err, nat)
	}
	if err := e.Check(t, p); err != nil {
		t.Errorf("CHECK through the chain: %v", err)
	}
	mustDel(t, e, p)
}

// testLog: the plugin log holds one JSON object per line carrying the
// container ID and pod; stdout carried only the result (libcni parsed it).
func testLog(t *testing.T, e *Env) {
	p := e.NewPod(t, "logged")
	e.MustAdd(t, p)
	mustDel(t, e, p)
	f, err := os.Open(e.LogFile)
	if err != nil {
		t.Fatalf("plugin log: %v", err)
	}
	defer f.Close()
	var added, deleted bool
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("log line is not JSON: %q", sc.Text())
		}
		if line["containerID"] != p.ContainerID {
			continue
		}
		if line["pod"] != p.Name || line["podNamespace"] != p.Namespace {
			t.Errorf("log line without the pod: %q", sc.Text())
		}
		added = added || (line["cmd"] == "ADD" && line["msg"] == "added" && line["address"] == p.Address.String())
		deleted = deleted || (line["cmd"] == "DEL" && line["msg"] == "released")
	}
	if !added || !deleted {
		t.Errorf("plugin log lacks the ADD (%v) or DEL (%v) of %s", added, deleted, p.ContainerID)
	}
}
