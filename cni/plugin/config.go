// Package plugin implements the vpcip-cni commands (CNI spec 1.1: ADD, DEL,
// CHECK, GC, STATUS; VERSION through skel): it parses the network config and
// CNI_ARGS, asks vpcipd for the pod's address over ipamd/api, wires the
// routed-veth datapath through cni/datapath and prints the CNI Result.
//
// Every error that leaves the plugin is a *types.Error with a spec code:
// 7 (invalid network config) for a bad config, naming the field; 4 for bad
// CNI_ARGS; 11 (try again later) when the daemon is unreachable, not ready or
// has no free address; 50 (plugin not available) from STATUS until the daemon
// is ready; 999 for anything else, always with the daemon's own message.
package plugin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/vpcip/vpcip/ipamd/api"
)

// Defaults for the plugin's own config keys (docs/design.md §4, §5).
const (
	DefaultMTU        = 9001 // bytes, the ENI MTU (AWS_VPC_ENI_MTU default)
	DefaultVethPrefix = "eni"
	DefaultLogFile    = "/var/log/vpcip/plugin.log"
	DefaultLogLevel   = "info"
	// DefaultV4EgressDataDir is where host-local records IPv6 pods' IPv4
	// egress addresses (one file per address, named by it).
	DefaultV4EgressDataDir = "/var/lib/cni/vpcip-egress4"

	DefaultAssignTimeout = 30 * time.Second // ADD may wait on a pool refill
	DefaultCallTimeout   = 10 * time.Second // release, check, gc
	DefaultStatusTimeout = 2 * time.Second

	minMTU = 576   // bytes, the IPv4 minimum datagram every host must accept
	maxMTU = 65535 // bytes, the veth driver's maximum
	// maxVethPrefix leaves room for 11 hex characters in the kernel's 15-byte
	// interface name limit (IFNAMSIZ-1).
	maxVethPrefix = 4
)

// Config is the network configuration the runtime hands the plugin on stdin.
// Keys are the CNI spec's (cniVersion, name, type, prevResult, runtimeConfig,
// cni.dev/valid-attachments, and cni.dev/attachments, the name runtimes also
// sent while spec 1.1 settled) plus ours.
type Config struct {
	CNIVersion string `json:"cniVersion"`
	Name       string `json:"name"`
	Type       string `json:"type"`

	IPAMDSocket    string   `json:"ipamdSocket"`    // vpcipd's unix socket
	MTU            int      `json:"mtu"`            // bytes; 0 in the file means "not set"
	VethPrefix     string   `json:"vethPrefix"`     // host veth name prefix, at most 4 characters
	PluginLogFile  string   `json:"pluginLogFile"`  // JSON log lines are appended here (rotated, package logfile), or "stderr"
	PluginLogLevel string   `json:"pluginLogLevel"` // debug, info, warn or error
	Timeouts       Timeouts `json:"timeouts"`
	// IPv4 egress of IPv6 pods (docs/design.md §4): on unless
	// "enableV4Egress" is false; host-local keeps its allocations of
	// datapath.Egress4Range under "v4EgressDataDir".
	V4Egress        bool   `json:"-"`
	V4EgressDataDir string `json:"v4EgressDataDir"`

	RuntimeConfig    map[string]any       `json:"runtimeConfig,omitempty"`
	RawPrevResult    map[string]any       `json:"prevResult,omitempty"`
	ValidAttachments []types.GCAttachment `json:"cni.dev/valid-attachments,omitempty"`

	// MTUSet reports whether mtu was given in the config; when it was not,
	// the daemon's MTU (Assignment.MTU) wins over DefaultMTU.
	MTUSet bool `json:"-"`
	// HasValidAttachments reports whether cni.dev/valid-attachments or
	// cni.dev/attachments was given (an empty list is valid and means
	// "nothing is valid"). With both, ValidAttachments is their union, so
	// nothing either lists is released.
	HasValidAttachments bool `json:"-"`
	// LogLevel is PluginLogLevel parsed.
	LogLevel slog.Level `json:"-"`

	v4EgressOff bool // "enableV4Egress": false
}

// Timeouts bound each daemon call. Each is a Go duration string ("30s") or a
// number of seconds.
type Timeouts struct {
	Assign  Duration `json:"assign"`
	Release Duration `json:"release"`
	Check   Duration `json:"check"`
	GC      Duration `json:"gc"`
	Status  Duration `json:"status"`
}

// longest is the client's overall bound; each call has its own deadline.
func (t Timeouts) longest() time.Duration {
	return time.Duration(max(t.Assign, t.Release, t.Check, t.GC, t.Status))
}

// Duration is a time.Duration that decodes from "1.5s" or from a number of
// seconds.
type Duration time.Duration

// UnmarshalJSON accepts a duration string or a number of seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("want a duration like \"10s\": %v", err)
		}
		*d = Duration(v)
		return nil
	}
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return fmt.Errorf("want a duration like \"10s\" or a number of seconds")
	}
	if f > float64(math.MaxInt64)/float64(time.Second) {
		return fmt.Errorf("%v seconds is too long (at most %v)", f, time.Duration(math.MaxInt64))
	}
	*d = Duration(f * float64(time.Second))
	return nil
}

// maxConfigBytes bounds the stdin document; a real conflist entry with a
// prevResult is a few KiB.
const maxConfigBytes = 1 << 20

// ParseConfig decodes and validates the stdin network config, applying
// defaults. Errors are *types.Error: 6 (decoding failure) for input that is
// not a JSON object, 7 (invalid network config) naming the field otherwise.
// prevResult is left raw; see PrevResult.
func ParseConfig(stdin []byte) (*Config, error) {
	if len(stdin) > maxConfigBytes {
		return nil, types.NewError(types.ErrDecodingFailure,
			fmt.Sprintf("network config is %d bytes, more than the %d accepted", len(stdin), maxConfigBytes), "")
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(stdin, &raw); err != nil || raw == nil {
		msg := "network config is not a JSON object"
		if err != nil {
			msg += ": " + err.Error()
		}
		return nil, types.NewError(types.ErrDecodingFailure, msg, "")
	}
	c := &Config{}
	for key, val := range raw {
		if err := decodeField(c, key, val); err != nil {
			return nil, invalidConfig(key, err.Error())
		}
	}
	if _, ok := raw["mtu"]; ok {
		c.MTUSet = true
	}
	for _, k := range []string{"cni.dev/valid-attachments", "cni.dev/attachments"} {
		if _, ok := raw[k]; ok {
			c.HasValidAttachments = true
		}
	}
	if err := c.defaultsAndValidate(); err != nil {
		return nil, err
	}
	return c, nil
}

// decodeField decodes one top-level key into c, so that a type error names
// the key it came from. Unknown keys are ignored (CNI spec: plugins ignore
// fields they do not know).
func decodeField(c *Config, key string, val json.RawMessage) error {
	var dst any
	switch key {
	case "cniVersion":
		dst = &c.CNIVersion
	case "name":
		dst = &c.Name
	case "type":
		dst = &c.Type
	case "ipamdSocket":
		dst = &c.IPAMDSocket
	case "mtu":
		dst = &c.MTU
	case "vethPrefix":
		dst = &c.VethPrefix
	case "pluginLogFile":
		dst = &c.PluginLogFile
	case "pluginLogLevel":
		dst = &c.PluginLogLevel
	case "timeouts":
		return decodeTimeouts(&c.Timeouts, val)
	case "enableV4Egress":
		var on *bool
		if err := json.Unmarshal(val, &on); err != nil {
			return fmt.Errorf("wrong type: %s", jsonTypeError(err))
		}
		c.v4EgressOff = on != nil && !*on
		return nil
	case "v4EgressDataDir":
		dst = &c.V4EgressDataDir
	case "runtimeConfig":
		dst = &c.RuntimeConfig
	case "prevResult":
		dst = &c.RawPrevResult
	case "cni.dev/valid-attachments", "cni.dev/attachments":
		var list []types.GCAttachment
		if err := json.Unmarshal(val, &list); err != nil && !bytes.Equal(bytes.TrimSpace(val), []byte("null")) {
			return fmt.Errorf("wrong type: %s", jsonTypeError(err))
		}
		// CNI spec 1.1 §GC: each entry names a containerID and an ifname.
		// An entry without one would match no attachment, and GC would
		// release a live one the runtime meant to keep.
		for i, a := range list {
			switch {
			case a.ContainerID == "":
				return fmt.Errorf("entry %d has no containerID", i)
			case a.IfName == "":
				return fmt.Errorf("entry %d (containerID %q) has no ifname", i, a.ContainerID)
			}
		}
		c.ValidAttachments = append(c.ValidAttachments, list...)
		return nil
	default:
		return nil
	}
	if bytes.Equal(bytes.TrimSpace(val), []byte("null")) {
		return nil
	}
	if err := json.Unmarshal(val, dst); err != nil {
		return fmt.Errorf("wrong type: %s", jsonTypeError(err))
	}
	return nil
}

// MaxTimeout bounds each of the config's timeouts: no runtime waits an
// hour for one CNI call (containerd's and CRI-O's own bounds are minutes),
// and the plugin adds its own margins to them.
const MaxTimeout = time.Hour

func decodeTimeouts(t *Timeouts, val json.RawMessage) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(val, &raw); err != nil {
		return fmt.Errorf("want an object of durations: %s", jsonTypeError(err))
	}
	fields := map[string]*Duration{"assign": &t.Assign, "release": &t.Release, "check": &t.Check, "gc": &t.GC, "status": &t.Status}
	for k, v := range raw {
		dst, ok := fields[k]
		if !ok {
			continue
		}
		if err := json.Unmarshal(v, dst); err != nil {
			return fmt.Errorf("%s: %v", k, err)
		}
		if *dst < 0 {
			return fmt.Errorf("%s: must not be negative", k)
		}
		if time.Duration(*dst) > MaxTimeout {
			return fmt.Errorf("%s: %v is longer than %v", k, time.Duration(*dst), MaxTimeout)
		}
	}
	return nil
}

// jsonTypeError shortens encoding/json's messages to what the user can act on.
func jsonTypeError(err error) string {
	if te, ok := err.(*json.UnmarshalTypeError); ok {
		return fmt.Sprintf("got a JSON %s, want %s", te.Value, te.Type)
	}
	return err.Error()
}

func (c *Config) defaultsAndValidate() error {
	if c.CNIVersion == "" {
		return invalidConfig("cniVersion", "missing")
	}
	if c.Name == "" {
		return invalidConfig("name", "missing")
	}
	if c.Type == "" {
		return invalidConfig("type", "missing")
	}
	if c.IPAMDSocket == "" {
		c.IPAMDSocket = api.DefaultSocket
	}
	c.V4Egress = !c.v4EgressOff
	if c.V4EgressDataDir == "" {
		c.V4EgressDataDir = DefaultV4EgressDataDir
	} else if !filepath.IsAbs(c.V4EgressDataDir) {
		return invalidConfig("v4EgressDataDir", "must be an absolute path")
	}
	if !c.MTUSet || c.MTU == 0 {
		c.MTUSet = false
		c.MTU = DefaultMTU
	}
	if c.MTU < minMTU || c.MTU > maxMTU {
		return invalidConfig("mtu", fmt.Sprintf("%d is outside %d..%d bytes", c.MTU, minMTU, maxMTU))
	}
	if c.VethPrefix == "" {
		c.VethPrefix = DefaultVethPrefix
	}
	if len(c.VethPrefix) > maxVethPrefix || strings.ContainsAny(c.VethPrefix, "/: \t\n") {
		return invalidConfig("vethPrefix", fmt.Sprintf("%q must be 1..%d characters without '/', ':' or spaces (interface names are at most 15 bytes)", c.VethPrefix, maxVethPrefix))
	}
	if c.PluginLogFile == "" {
		c.PluginLogFile = DefaultLogFile
	}
	if c.PluginLogLevel == "" {
		c.PluginLogLevel = DefaultLogLevel
	}
	if err := c.LogLevel.UnmarshalText([]byte(c.PluginLogLevel)); err != nil {
		return invalidConfig("pluginLogLevel", fmt.Sprintf("%q is not one of debug, info, warn, error", c.PluginLogLevel))
	}
	setDefault(&c.Timeouts.Assign, DefaultAssignTimeout)
	setDefault(&c.Timeouts.Release, DefaultCallTimeout)
	setDefault(&c.Timeouts.Check, DefaultCallTimeout)
	setDefault(&c.Timeouts.GC, DefaultCallTimeout)
	setDefault(&c.Timeouts.Status, DefaultStatusTimeout)
	return nil
}

func setDefault(d *Duration, def time.Duration) {
	if *d == 0 {
		*d = Duration(def)
	}
}

// PrevResult parses prevResult (CNI ≥ 0.4, chained plugins and DEL/CHECK)
// into a Result of the config's version. It returns nil, nil when there is
// none.
func (c *Config) PrevResult() (types.Result, error) {
	if len(c.RawPrevResult) == 0 {
		return nil, nil
	}
	pc := &types.PluginConf{CNIVersion: c.CNIVersion, RawPrevResult: c.RawPrevResult}
	if err := version.ParsePrevResult(pc); err != nil {
		return nil, err
	}
	return pc.PrevResult, nil
}

func invalidConfig(field, msg string) *types.Error {
	return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("invalid network config: field %q: %s", field, msg), "")
}
