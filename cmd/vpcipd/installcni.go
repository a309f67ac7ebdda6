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
)

// installCNI waits until the daemon reports ready on its socket, then copies
// the plugin binary into the CNI bin dir and writes the conflist into the CNI
// conf dir, each atomically (temp file, fsync, rename), so the node turns
// network-ready only once it can serve ADDs.
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
func conflist(cfg config.Config) ([]byte, error) {
	plugins := []map[string]any{{
		"type":           pluginName,
		"ipamdSocket":    cfg.Socket,
		"mtu":            cfg.MTU,
		"vethPrefix":     cfg.VethPrefix,
		"pluginLogFile":  cfg.PluginLogFile,
		"pluginLogLevel": strings.ToLower(cfg.PluginLogLevel),
	}}
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
