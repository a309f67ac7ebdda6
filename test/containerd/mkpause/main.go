// Command mkpause packages a static pause binary as an OCI image archive that
// `ctr -n k8s.io images import` loads as the CRI sandbox image.
//
//	mkpause -bin /path/to/pause -o pause.tar [-name localhost/vpcip/pause:1]
//
// scripts/containerd-setup.sh builds the binary from test/containerd/pause
// (CGO_ENABLED=0) and calls this command; the image is placed at /pause and is
// its entrypoint.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/vpcip/vpcip/test/containerd/ociarchive"
)

// defaultName is the reference the image is imported under; the CRI config
// of each node names whatever reference the archive carries.
const defaultName = "localhost/vpcip/pause:1"

func main() {
	bin := flag.String("bin", "", "path of the static pause binary")
	out := flag.String("o", "", "path of the archive to write")
	name := flag.String("name", defaultName, "image reference recorded in the archive")
	flag.Parse()
	if err := run(*bin, *out, *name); err != nil {
		fmt.Fprintln(os.Stderr, "mkpause:", err)
		os.Exit(1)
	}
}

func run(bin, out, name string) error {
	if bin == "" || out == "" {
		return fmt.Errorf("-bin and -o are required")
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	desc, err := ociarchive.Write(&buf, ociarchive.Image{
		Name:         name,
		OS:           "linux",
		Architecture: runtime.GOARCH,
		Entrypoint:   []string{"/pause"},
		Files:        []ociarchive.File{{Path: "/pause", Mode: 0o755, Data: data}},
	})
	if err != nil {
		return err
	}
	// Write to a temporary file and rename, so a cached archive is never half-written.
	tmp, err := os.CreateTemp(filepath.Dir(out), ".mkpause-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(buf.Bytes()); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return err
	}
	fmt.Printf("%s %s %s\n", out, name, desc.Digest)
	return nil
}
