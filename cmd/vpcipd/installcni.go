package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/config"
)

// Names of what install-cni writes.
const (
	pluginName   = "vpcip-cni"
	conflistName = "10-vpcip.conflist"
	networkName  = "vpcip"
	// egressIPAM is the reference IPAM plugin the plugin delegates IPv6
	// pods' IPv4 egress addresses to (cni/plugin); the image ships it
	// beside vpcip-cni.
	egressIPAM = "host-local"
)

// installCNI waits until the daemon reports ready on its socket, then copies
// the plugin binary into the CNI bin dir and writes the conflist into the CNI
// conf dir, each atomically (temp file, fsync, rename), so the node turns
// network-ready only once it can serve ADDs. In IPv6 mode with IPv4 egress
// (ENABLE_V4_EGRESS) it first copies the reference host-local plugin from
// beside the plugin binary too; without one there, a host-local already in
// the CNI bin dir is used, and with neither it fails naming both paths (an
// IPv6 pod's ADD would fail on every pod).
func installCNI(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	if err := waitReady(ctx, cfg.Socket, cfg.InstallWait, log); err != nil {
		return err
	}
	src := cfg.PluginSource
	if src == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("locate the %s binary: %w", pluginName, err)
		}
		src = filepath.Join(filepath.Dir(exe), pluginName)
	}
	if cfg.IPv6 && cfg.V4Egress {
		if err := installEgressIPAM(filepath.Join(filepath.Dir(src), egressIPAM), cfg.CNIBinDir, log); err != nil {
			return err
		}
	}
	dst := filepath.Join(cfg.CNIBinDir, pluginName)
	if err := copyFile(src, dst, 0o755); err != nil {
		return err
	}
	data, err := conflist(cfg)
	if err != nil {
		return err
	}
	confPath := filepath.Join(cfg.CNIConfDir, conflistName)
	if err := writeAtomic(confPath, data, 0o644); err != nil {
		return err
	}
	log.Info("CNI plugin installed", "binary", dst, "conflist", confPath)
	return nil
}

// installEgressIPAM copies host-local from src into binDir; a missing src is
// fine when binDir already holds one (the node's own reference plugins).
func installEgressIPAM(src, binDir string, log *slog.Logger) error {
	dst := filepath.Join(binDir, egressIPAM)
	if _, err := os.Stat(src); errors.Is(err, os.ErrNotExist) {
		if fi, err := os.Stat(dst); err == nil && !fi.IsDir() {
			log.Info("IPv4 egress: using the node's host-local", "path", dst)
			return nil
		}
		return fmt.Errorf("IPv4 egress of IPv6 pods (ENABLE_V4_EGRESS=true) needs the reference %s IPAM plugin: none at %s nor at %s (install containernetworking/plugins on the node, or set ENABLE_V4_EGRESS=false)", egressIPAM, src, dst)
	}
	return copyFile(src, dst, 0o755)
}

// waitReady polls the daemon's status until it is ready or wait passes.
func waitReady(ctx context.Context, socket string, wait time.Duration, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	client := api.NewClient(socket, 2*time.Second)
	var last string
	for {
		st, err := client.Status(ctx)
		switch {
		case err == nil && st.Ready:
			return nil
		case err == nil:
			last = "not ready: " + st.Reason
		default:
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("vpcipd on %s not ready after %s (%s)", socket, wait, last)
		case <-time.After(500 * time.Millisecond):
			log.Debug("waiting for vpcipd", "socket", socket, "last", last)
		}
	}
}

// conflist is the network configuration list written for the runtime. The
// portmap plugin is chained (hostPort support) only when its binary is in
// the CNI bin dir, so the list never names a plugin the runtime cannot run.
// In IPv6 mode it carries "enableV4Egress" (ENABLE_V4_EGRESS).
func conflist(cfg config.Config) ([]byte, error) {
	plugins := []map[string]any{{
		"type":           pluginName,
		"ipamdSocket":    cfg.Socket,
		"mtu":            cfg.MTU,
		"vethPrefix":     cfg.VethPrefix,
		"pluginLogFile":  cfg.PluginLogFile,
		"pluginLogLevel": strings.ToLower(cfg.PluginLogLevel),
	}}
	if cfg.IPv6 {
		plugins[0]["enableV4Egress"] = cfg.V4Egress
	}
	if fi, err := os.Stat(filepath.Join(cfg.CNIBinDir, "portmap")); err == nil && !fi.IsDir() {
		plugins = append(plugins, map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}, "snat": true})
	}
	doc := map[string]any{"cniVersion": cfg.CNIVersion, "name": networkName, "plugins": plugins}
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("plugin binary: %w", err)
	}
	defer in.Close()
	data, err := io.ReadAll(in)
	if err != nil {
		return fmt.Errorf("read plugin binary %s: %w", src, err)
	}
	return writeAtomic(dst, data, mode)
}

// writeAtomic replaces path with data: temp file in the same directory,
// fsync, chmod, rename, fsync of the directory. A running runtime sees the
// old file or the new one, never a partial one.
func writeAtomic(path string, data []byte, mode os.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	name := tmp.Name()
	_, err = tmp.Write(data)
	err = errors.Join(err, tmp.Chmod(mode), tmp.Sync(), tmp.Close())
	if err == nil {
		err = os.Rename(name, path)
	}
	if err != nil {
		os.Remove(name)
		return fmt.Errorf("write %s: %w", path, err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
