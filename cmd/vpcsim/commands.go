package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/vpcip/vpcip/test/vpcsim/fabric"
)

// runExec replaces this process with `ip netns exec <netns> <command>`, so
// the command's exit status and signals are its own. Besides the SDK's
// endpoints it sets VPCIP_SOCKET and VPCIP_CHECKPOINT, unless the caller
// set them, to the node's own directory (nodeDir), so a daemon run by hand
// keeps its socket and checkpoint there rather than at the host's
// /run/vpcip, which a real vpcipd, the next run or another node would share.
func runExec(args []string) error {
	var c commonFlags
	fs := newFlagSet("exec", &c)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: vpcsim exec [flags] <node> -- <command> [args...]\n  node: node1, an instance ID or a netns name")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	rest := fs.Args()
	if len(rest) > 1 && rest[1] == "--" {
		rest = append(rest[:1], rest[2:]...)
	}
	if len(rest) < 2 {
		fs.Usage()
		return errors.New("want a node and a command")
	}
	s, err := loadRunning(c)
	if err != nil {
		return err
	}
	n, err := s.findNode(rest[0])
	if err != nil {
		return err
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		return err
	}
	set := append(fabric.NodeEnv(s.Region), "VPCSIM_NODE="+n.Name, "VPCSIM_INSTANCE_ID="+n.InstanceID)
	dir := nodeDir(c, n.Name)
	for k, file := range map[string]string{"VPCIP_SOCKET": "ipamd.sock", "VPCIP_CHECKPOINT": "ipam.json"} {
		if os.Getenv(k) == "" {
			set = append(set, k+"="+filepath.Join(dir, file))
		}
	}
	env := mergeEnv(os.Environ(), set)
	argv := append([]string{"ip", "netns", "exec", n.Netns}, rest[1:]...)
	return syscall.Exec(ip, argv, env)
}

// mergeEnv returns base with the KEY=value entries of set replacing those of
// the same keys: with duplicates, getenv in C and Go would see the first.
func mergeEnv(base, set []string) []string {
	keys := map[string]bool{}
	for _, kv := range set {
		k, _, _ := strings.Cut(kv, "=")
		keys[k] = true
	}
	var env []string
	for _, kv := range base {
		if k, _, _ := strings.Cut(kv, "="); !keys[k] {
			env = append(env, kv)
		}
	}
	return append(env, set...)
}

func runStatus(args []string) error {
	var c commonFlags
	fs := newFlagSet("status", &c)
	asJSON := fs.Bool("json", false, "print the state file and call counts as JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	s, err := loadRunning(c)
	if err != nil {
		return err
	}
	var calls map[string]int
	if err := adminDo(s, http.MethodGet, "/calls", nil, &calls); err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"state": s, "calls": calls})
	}
	fmt.Printf("vpcsim up (pid %d), prefix %q, region %s\n", s.PID, s.Prefix, s.Region)
	fmt.Printf("  EC2 API %s (host: %s), IMDS %s, admin %s\n", s.EC2URL, s.LocalEC2URL, s.IMDSURL, s.AdminURL)
	if s.OutsideAddr != "" {
		fmt.Printf("  outside %s (netns %s)\n", s.OutsideAddr, s.OutsideNetns)
	}
	for _, n := range s.Nodes {
		fmt.Printf("  %-6s %s %s %s netns %s\n", n.Name, n.InstanceID, n.InstanceType, n.PrimaryIP, n.Netns)
	}
	ops := slices.Sorted(maps.Keys(calls))
	parts := make([]string, 0, len(ops))
	for _, op := range ops {
		parts = append(parts, fmt.Sprintf("%s %d", op, calls[op]))
	}
	fmt.Printf("  API calls: %s\n", strings.Join(parts, ", "))
	return nil
}

// runDown stops `vpcsim up` (SIGTERM, SIGKILL after 10 s) and removes
// every netns with the prefix and every process in them, whether or not up
// exited cleanly.
func runDown(args []string) error {
	var c commonFlags
	fs := newFlagSet("down", &c)
	if err := fs.Parse(args); err != nil {
		return err
	}
	s, err := readState(statePath(c))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	// Processes in the nodes first, while their netns have names; then up,
	// then what a crashed up left.
	errs := []error{fabric.Cleanup(c.prefix)}
	if s != nil && upRunning(s.PID) {
		stopProcess(s.PID, 10*time.Second)
	}
	if err := errors.Join(append(errs, fabric.Cleanup(c.prefix))...); err != nil {
		return err
	}
	if c.prefix != "" && !strings.ContainsAny(c.prefix, "/.") { // the nodes' daemon directories (nodeDir), never the state directory itself
		if err := os.RemoveAll(filepath.Join(c.stateDir, c.prefix)); err != nil {
			return err
		}
	}
	if err := os.Remove(statePath(c)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	_ = os.Remove(c.stateDir) // the state directory, once no other vpcsim uses it (fails while not empty)
	return nil
}

// stopProcess sends SIGTERM, then SIGKILL if pid still runs after grace.
func stopProcess(pid int, grace time.Duration) {
	_ = syscall.Kill(pid, syscall.SIGTERM) // ESRCH: already gone, which upRunning sees below
	for deadline := time.Now().Add(grace); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if !upRunning(pid) {
			return
		}
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for range 100 {
		if !upRunning(pid) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// adminDo calls the admin API of the running vpcsim with a JSON body (nil:
// none) and decodes the JSON answer into out (nil: discard).
func adminDo(s *state, method, path string, body io.Reader, out any) error {
	req, err := http.NewRequest(method, s.AdminURL+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, b)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(b, out)
}
