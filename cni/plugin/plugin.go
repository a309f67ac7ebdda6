package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/vpcip/vpcip/cni/datapath"
	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/logfile"
)

// Versions are the CNI spec versions the plugin accepts in a config and
// prints results in (VERSION advertises exactly these).
var Versions = version.PluginSupports("0.4.0", "1.0.0", "1.1.0")

// About is printed by skel when the binary runs without CNI_COMMAND.
const About = "vpcip-cni: routed-veth CNI plugin backed by vpcipd"

// Plugin runs the CNI commands; Funcs hands them to skel.PluginMainFuncs.
// The zero value prints to os.Stdout.
type Plugin struct {
	// Stdout receives the result of ADD; nil means os.Stdout.
	Stdout io.Writer
}

// Funcs returns the command table for skel.PluginMainFuncs.
func (p *Plugin) Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: p.Add, Del: p.Del, Check: p.Check, GC: p.GC, Status: p.Status}
}

// invocation is what every command starts from: the parsed config, the
// key, the pod and a logger carrying them.
type invocation struct {
	conf   *Config
	key    api.Key
	pod    PodArgs
	log    *slog.Logger
	client *api.Client
	close  func()
	veth   string // hostVeth, once looked up
}

// start parses the config and CNI_ARGS and opens the log. Bad CNI_ARGS are
// an error unless lenient (DEL must not fail on them).
func start(cmd string, args *skel.CmdArgs, lenient bool) (*invocation, error) {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return nil, err
	}
	pod, argsErr := ParseArgs(args.Args)
	if argsErr != nil && !lenient {
		return nil, argsErr
	}
	log, closeLog := openLog(conf)
	log = log.With("cmd", cmd, "network", conf.Name, "containerID", args.ContainerID,
		"ifName", args.IfName, "netns", args.Netns, "podNamespace", pod.Namespace, "pod", pod.Name)
	if argsErr != nil {
		log.Warn("ignoring malformed CNI_ARGS", "error", argsErr)
	}
	in := &invocation{
		conf:   conf,
		key:    api.Key{Network: conf.Name, ContainerID: args.ContainerID, IfName: args.IfName},
		pod:    pod,
		log:    log,
		client: api.NewClient(conf.IPAMDSocket, conf.Timeouts.longest()),
		close:  closeLog,
	}
	if err := in.key.Check(); err != nil && (cmd == "ADD" || cmd == "DEL" || cmd == "CHECK") {
		closeLog()
		return nil, keyError(cmd, err, log)
	}
	if cmd == "ADD" || cmd == "DEL" || cmd == "CHECK" {
		// One attachment's invocations, and those of the sandboxes of
		// one pod, take turns (lockAttachment), waiting as long as the
		// holder's daemon call may take, plus a second for its wiring.
		t := conf.Timeouts
		veth, _ := in.vethNames()
		unlock, skipped, err := lockAttachment(lockDir(conf.IPAMDSocket), lockNames(in.key, veth), time.Duration(max(t.Assign, t.Release, t.Check))+time.Second)
		if err != nil {
			in.log.Error("attachment lock", "error", err)
			closeLog()
			return nil, types.NewError(types.ErrTryAgainLater, fmt.Sprintf("%s %s: %v", cmd, in.key, err), "")
		}
		if skipped != nil {
			in.log.Warn("running without the attachment lock", "error", skipped)
		}
		in.close = func() { unlock(); closeLog() }
	}
	return in, nil
}

func (in *invocation) ctx(d Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), time.Duration(d))
}

// hostVeth is the attachment's host veth name
// (datapath.AttachmentVethName). An attachment beside the pod's default one
// that a plugin made before such attachments had names of their own has
// the pod's default name (datapath.HostVethName) and keeps it after an
// upgrade: that veth is used when it is there and records this attachment
// (Identity), and the new name is not. Looked up once per invocation.
func (in *invocation) hostVeth() string {
	if in.veth != "" {
		return in.veth
	}
	name, legacy := in.vethNames()
	in.veth = name
	if legacy != name {
		if own, _, err := vethOwner(name, in.key); err == nil && own == vethMissing {
			if own, _, err := vethOwner(legacy, in.key); err == nil && own == vethOurs {
				in.veth = legacy
			}
		}
	}
	return in.veth
}

// vethNames are the attachment's host veth name and the name plugins gave
// it before attachments beside the default had names of their own (equal
// for the default attachment).
func (in *invocation) vethNames() (name, legacy string) {
	return datapath.AttachmentVethName(in.conf.VethPrefix, in.pod.Namespace, in.pod.Name, in.key.ContainerID, in.key.Network, in.key.IfName),
		datapath.HostVethName(in.conf.VethPrefix, in.pod.Namespace, in.pod.Name, in.key.ContainerID)
}

// recordedVeths are the host veth names the plugin may have given asg's
// attachment at ADD, from the pod the daemon recorded: its own name and the
// one before attachments beside the default had names of their own (they
// match a veth made before veths recorded their sandbox).
func (in *invocation) recordedVeths(asg api.Assignment) []string {
	name := datapath.AttachmentVethName(in.conf.VethPrefix, asg.Pod.Namespace, asg.Pod.Name, asg.Key.ContainerID, asg.Key.Network, asg.Key.IfName)
	legacy := datapath.HostVethName(in.conf.VethPrefix, asg.Pod.Namespace, asg.Pod.Name, asg.Key.ContainerID)
	if legacy == name {
		return []string{name}
	}
	return []string{name, legacy}
}

// owners are the names an unmarked host veth of this invocation's
// attachment may have (see removeHostSide), plus those recorded for asg.
func (in *invocation) owners(asg *api.Assignment) []string {
	name, legacy := in.vethNames()
	out := []string{in.hostVeth(), name, legacy}
	if asg != nil {
		out = append(out, in.recordedVeths(*asg)...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// errKeyHoldsNothing is start's answer to a DEL whose attachment key the
// daemon refuses (api.Key.Check): no ADD of it can have succeeded, so the
// DEL has nothing to remove and succeeds.
var errKeyHoldsNothing = errors.New("attachment key refused by vpcipd: nothing can be held under it")

// keyError is the CNI error for a key api.Key.Check refused: code 7 for the
// config's network name, 4 for CNI_CONTAINERID or CNI_IFNAME; for DEL,
// errKeyHoldsNothing.
func keyError(cmd string, err error, log *slog.Logger) error {
	if cmd == "DEL" {
		log.Warn("nothing to delete: no ADD of this attachment key can have succeeded", "error", err)
		return fmt.Errorf("%w: %v", errKeyHoldsNothing, err)
	}
	code := uint(types.ErrInvalidEnvironmentVariables)
	var ke *api.KeyError
	if errors.As(err, &ke) && ke.Field == "network" {
		code = types.ErrInvalidNetworkConfig
	}
	log.Error("attachment key refused", "error", err)
	return types.NewError(code, fmt.Sprintf("%s: %v", cmd, err), "")
}

// openLog opens the plugin's log (pluginLogFile): JSON lines appended to the
// file, rotated by size (package logfile: several plugin processes may
// append at once), or to stderr when it names "stderr"; when the file cannot
// be opened the log goes to stderr (which runtimes record), never stdout.
func openLog(conf *Config) (*slog.Logger, func()) {
	opts := &slog.HandlerOptions{Level: conf.LogLevel}
	if conf.PluginLogFile != logfile.Stderr {
		if w, err := logfile.Open(conf.PluginLogFile, logfile.DefaultRotation); err == nil && w != nil {
			return slog.New(slog.NewJSONHandler(w, opts)), func() { w.Close() }
		}
	}
	return slog.New(slog.NewJSONHandler(os.Stderr, opts)), func() {}
}

// daemonError turns a failed daemon call into the CNI error the runtime
// sees: the daemon's own message, code 11 when retrying can help.
func daemonError(op string, key api.Key, err error) *types.Error {
	var ae *api.Error
	switch {
	case errors.As(err, &ae):
		code := uint(types.ErrInternal)
		if ae.Retryable() {
			code = types.ErrTryAgainLater
		}
		details := fmt.Sprintf("vpcipd %s %s: code %s", op, key, ae.Code)
		if ae.Cause != "" {
			details += ", cause " + string(ae.Cause)
		}
		return types.NewError(code, ae.Error(), details)
	case errors.Is(err, api.ErrUnreachable), errors.Is(err, context.DeadlineExceeded):
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("vpcipd %s for %s: %v", op, key, err), "")
	default:
		return types.NewError(types.ErrInternal, fmt.Sprintf("vpcipd %s for %s: %v", op, key, err), "")
	}
}

func (p *Plugin) print(r types.Result, ver string) error {
	out, err := r.GetAsVersion(ver)
	if err != nil {
		return types.NewError(types.ErrIncompatibleCNIVersion, fmt.Sprintf("convert result to %s: %v", ver, err), "")
	}
	w := p.Stdout
	if w == nil {
		w = os.Stdout
	}
	if r, ok := out.(*current.Result); ok {
		data, err := appendResult(nil, r)
		if err != nil {
			return err
		}
		_, err = w.Write(data)
		return err
	}
	return out.PrintTo(w)
}

// prevResultAddrs returns the IPv4 addresses a prevResult gives the
// container interface ifName; a missing or unreadable prevResult gives none
// (B34: a corrupt cached result never blocks DEL).
func prevResultAddrs(conf *Config, ifName string, log *slog.Logger) []netip.Addr {
	prev, err := conf.PrevResult()
	if err != nil {
		log.Warn("ignoring unreadable prevResult", "error", err)
		return nil
	}
	if prev == nil {
		return nil
	}
	res, err := current.NewResultFromResult(prev)
	if err != nil {
		log.Warn("ignoring prevResult of unknown shape", "error", err)
		return nil
	}
	var out []netip.Addr
	for _, ipc := range res.IPs {
		if ipc.Interface != nil && (*ipc.Interface < 0 || *ipc.Interface >= len(res.Interfaces) ||
			res.Interfaces[*ipc.Interface].Name != ifName) {
			continue
		}
		if a, ok := netip.AddrFromSlice(ipc.Address.IP); ok && (a.Unmap().Is4() || a.IsGlobalUnicast()) {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// podIPNet is the CNI result's form of a pod address: /32, or /128 for an
// IPv6 one.
func podIPNet(a netip.Addr) net.IPNet {
	if a.Is6() {
		return net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(128, 128)}
	}
	return net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(32, 32)}
}
