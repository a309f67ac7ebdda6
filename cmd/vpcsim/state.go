package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// stateVersion is the schema version of the state file.
const stateVersion = 1

// state is what `vpcsim up` writes for the other subcommands.
type state struct {
	Version      int    `json:"version"`
	Prefix       string `json:"prefix"`
	PID          int    `json:"pid"` // of `vpcsim up`
	Region       string `json:"region"`
	EC2URL       string `json:"ec2Url"`      // inside the fabric (from every node)
	IMDSURL      string `json:"imdsUrl"`     // inside the fabric (from every node)
	LocalEC2URL  string `json:"localEc2Url"` // the same EC2 API on loopback, for the host
	AdminURL     string `json:"adminUrl"`    // faults and model state, on loopback
	RouterNetns  string `json:"routerNetns"`
	OutsideAddr  string `json:"outsideAddr,omitempty"`
	OutsideNetns string `json:"outsideNetns,omitempty"`
	Nodes        []node `json:"nodes"`
	// PodSubnets and PodSecurityGroup exist with --pod-subnets.
	PodSubnets       []subnetState `json:"podSubnets,omitempty"`
	PodSecurityGroup string        `json:"podSecurityGroup,omitempty"`
}

// subnetState is one subnet for pod ENIs.
type subnetState struct {
	ID   string `json:"id"`
	CIDR string `json:"cidr"`
	Zone string `json:"zone"`
}

// node is one launched instance.
type node struct {
	Name         string `json:"name"` // node1, node2, ...
	InstanceID   string `json:"instanceId"`
	InstanceType string `json:"instanceType"`
	Netns        string `json:"netns"`
	PrimaryIP    string `json:"primaryIp"`
	MAC          string `json:"mac"`
	ENI          string `json:"eni"`
	SubnetID     string `json:"subnetId"`
	Zone         string `json:"zone"`
}

func statePath(c commonFlags) string {
	return filepath.Join(c.stateDir, c.prefix+".json")
}

// nodeDir is the directory `vpcsim exec` gives a node's hand-run daemon for
// its socket and checkpoint: <state dir>/<prefix>/<node>; `vpcsim down`
// removes <state dir>/<prefix>.
func nodeDir(c commonFlags, node string) string {
	return filepath.Join(c.stateDir, c.prefix, node)
}

// writeState writes the state file atomically: temp file, fsync, rename.
func writeState(path string, s *state) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".state-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// readState reads the state file; os.ErrNotExist when vpcsim is not up.
func readState(path string) (*state, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s state
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("state file %s: %w", path, err)
	}
	if s.Version != stateVersion {
		return nil, fmt.Errorf("state file %s: version %d, want %d", path, s.Version, stateVersion)
	}
	return &s, nil
}

// loadRunning reads the state of a running `vpcsim up`.
func loadRunning(c commonFlags) (*state, error) {
	s, err := readState(statePath(c))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("vpcsim with prefix %q is not up (no %s)", c.prefix, statePath(c))
	}
	if err != nil {
		return nil, err
	}
	if !upRunning(s.PID) {
		return nil, fmt.Errorf("vpcsim up (pid %d) is not running; run vpcsim down --prefix %s", s.PID, c.prefix)
	}
	return s, nil
}

// upRunning reports whether pid is a live `vpcsim up` (not a reused pid).
func upRunning(pid int) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(b) == 0 {
		return false // gone, or a zombie
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	return len(args) >= 2 && strings.HasPrefix(filepath.Base(args[0]), "vpcsim") && args[1] == "up" &&
		syscall.Kill(pid, 0) == nil
}

// findNode looks a node up by name, instance ID or netns name.
func (s *state) findNode(key string) (node, error) {
	var names []string
	for _, n := range s.Nodes {
		if key == n.Name || key == n.InstanceID || key == n.Netns {
			return n, nil
		}
		names = append(names, n.Name)
	}
	return node{}, fmt.Errorf("no node %q (nodes: %s)", key, strings.Join(names, ", "))
}
