package ociarchive

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// readArchive returns every regular file of a tar stream by name.
func readArchive(t *testing.T, data []byte) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatalf("read archive: %v", err)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("read %s: %v", hdr.Name, err)
		}
		files[hdr.Name] = body
	}
}

// blob returns the blob a descriptor names, after checking its digest and size.
func blob(t *testing.T, files map[string][]byte, d v1.Descriptor) []byte {
	t.Helper()
	body, ok := files["blobs/sha256/"+d.Digest.Hex]
	if !ok {
		t.Fatalf("blob %s missing from archive", d.Digest)
	}
	sum := sha256.Sum256(body)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != d.Digest.String() {
		t.Fatalf("blob %s has digest %s", d.Digest, got)
	}
	if int64(len(body)) != d.Size {
		t.Fatalf("blob %s has %d bytes, descriptor says %d", d.Digest, len(body), d.Size)
	}
	return body
}

func TestWriteLayoutResolves(t *testing.T) {
	img := Image{
		Name: "localhost/vpcip/pause:7", OS: "linux", Architecture: "amd64",
		Entrypoint: []string{"/pause"},
		Files:      []File{{Path: "/pause", Mode: 0o755, Data: []byte("binary")}, {Path: "/etc/hostname", Mode: 0o644, Data: []byte("pod\n")}},
	}
	var buf bytes.Buffer
	desc, err := Write(&buf, img)
	if err != nil {
		t.Fatal(err)
	}
	files := readArchive(t, buf.Bytes())
	if got, want := string(files["oci-layout"]), `{"imageLayoutVersion":"1.0.0"}`; got != want {
		t.Errorf("oci-layout = %s, want %s", got, want)
	}
	var index v1.IndexManifest
	if err := json.Unmarshal(files["index.json"], &index); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]v1.Descriptor{desc}, index.Manifests); diff != "" {
		t.Errorf("index manifests differ from returned descriptor (-want +got):\n%s", diff)
	}
	if got := desc.Annotations[AnnotationImageName]; got != img.Name {
		t.Errorf("image name annotation = %q, want %q", got, img.Name)
	}
	if got := desc.Annotations[AnnotationRefName]; got != "7" {
		t.Errorf("ref name annotation = %q, want 7", got)
	}

	var manifest v1.Manifest
	if err := json.Unmarshal(blob(t, files, desc), &manifest); err != nil {
		t.Fatal(err)
	}
	var config v1.ConfigFile
	if err := json.Unmarshal(blob(t, files, manifest.Config), &config); err != nil {
		t.Fatal(err)
	}
	if len(manifest.Layers) != 1 {
		t.Fatalf("manifest has %d layers, want 1", len(manifest.Layers))
	}
	if diff := cmp.Diff([]v1.Hash{manifest.Layers[0].Digest}, config.RootFS.DiffIDs); diff != "" {
		t.Errorf("diff IDs of an uncompressed layer must equal its digest (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(img.Entrypoint, config.Config.Entrypoint); diff != "" {
		t.Errorf("entrypoint (-want +got):\n%s", diff)
	}

	layer := blob(t, files, manifest.Layers[0])
	tr := tar.NewReader(bytes.NewReader(layer))
	var names []string
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, hdr.Name)
		if hdr.Name == "pause" && hdr.Mode != 0o755 {
			t.Errorf("pause mode = %o, want 755", hdr.Mode)
		}
	}
	if diff := cmp.Diff([]string{"etc/hostname", "pause"}, names); diff != "" {
		t.Errorf("layer entries (-want +got):\n%s", diff)
	}
}

func TestWriteIsDeterministic(t *testing.T) {
	img := Image{Name: "x/y:z", OS: "linux", Architecture: "arm64", Files: []File{{Path: "/a", Mode: 0o755, Data: []byte("a")}}}
	var a, b bytes.Buffer
	da, err := Write(&a, img)
	if err != nil {
		t.Fatal(err)
	}
	db, err := Write(&b, img)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) || da.Digest != db.Digest {
		t.Errorf("two writes of one image differ: %s vs %s", da.Digest, db.Digest)
	}
}

func TestWriteRejectsBadImages(t *testing.T) {
	good := File{Path: "/pause", Mode: 0o755, Data: []byte("x")}
	tests := []struct {
		name string
		img  Image
		want string
	}{
		{"no name", Image{OS: "linux", Architecture: "amd64", Files: []File{good}}, "name is empty"},
		{"no platform", Image{Name: "a:b", Files: []File{good}}, "OS and Architecture"},
		{"no files", Image{Name: "a:b", OS: "linux", Architecture: "amd64"}, "no files"},
		{"relative path", Image{Name: "a:b", OS: "linux", Architecture: "amd64", Files: []File{{Path: "pause"}}}, "not an absolute"},
		{"duplicate path", Image{Name: "a:b", OS: "linux", Architecture: "amd64", Files: []File{good, good}}, "given twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			_, err := Write(&buf, tt.img)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Write error = %v, want one containing %q", err, tt.want)
			}
			if buf.Len() != 0 {
				t.Errorf("Write wrote %d bytes for a rejected image", buf.Len())
			}
		})
	}
}

// A gzip, two-layer image with a symlink: layers are stored compressed, their
// diff IDs are the digests of the uncompressed tars, and two writes agree.
func TestWriteGzipLayers(t *testing.T) {
	img := Image{
		Name: "localhost/vpcip/vpcip:1", OS: "linux", Architecture: "amd64", Gzip: true,
		Entrypoint: []string{"/usr/local/bin/d"}, Env: []string{"PATH=/usr/sbin"},
		Layers: [][]File{
			{{Path: "/usr/sbin/multi", Mode: 0o755, Data: bytes.Repeat([]byte("x"), 4096)}, {Path: "/usr/sbin/tool", Link: "multi"}},
			{{Path: "/usr/local/bin/d", Mode: 0o755, Data: []byte("daemon")}},
		},
	}
	var a, b bytes.Buffer
	desc, err := Write(&a, img)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Write(&b, img); err != nil || !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatalf("two writes differ (err %v)", err)
	}
	files := readArchive(t, a.Bytes())
	var manifest v1.Manifest
	if err := json.Unmarshal(blob(t, files, desc), &manifest); err != nil {
		t.Fatal(err)
	}
	var config v1.ConfigFile
	if err := json.Unmarshal(blob(t, files, manifest.Config), &config); err != nil {
		t.Fatal(err)
	}
	if len(manifest.Layers) != 2 || len(config.RootFS.DiffIDs) != 2 {
		t.Fatalf("%d layers, %d diff IDs; want 2 and 2", len(manifest.Layers), len(config.RootFS.DiffIDs))
	}
	if diff := cmp.Diff(img.Env, config.Config.Env); diff != "" {
		t.Errorf("env (-want +got):\n%s", diff)
	}
	for i, l := range manifest.Layers {
		if l.MediaType != "application/vnd.oci.image.layer.v1.tar+gzip" {
			t.Errorf("layer %d media type %s", i, l.MediaType)
		}
		zr, err := gzip.NewReader(bytes.NewReader(blob(t, files, l)))
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(zr)
		sum := sha256.Sum256(raw)
		if got := "sha256:" + hex.EncodeToString(sum[:]); got != config.RootFS.DiffIDs[i].String() {
			t.Errorf("layer %d: diff ID %s, uncompressed digest %s", i, config.RootFS.DiffIDs[i], got)
		}
		if i == 0 {
			tr := tar.NewReader(bytes.NewReader(raw))
			tr.Next()
			hdr, err := tr.Next()
			if err != nil || hdr.Typeflag != tar.TypeSymlink || hdr.Name != "usr/sbin/tool" || hdr.Linkname != "multi" {
				t.Errorf("second entry of layer 0: %+v %v, want symlink usr/sbin/tool -> multi", hdr, err)
			}
		}
	}
}

func TestTagOf(t *testing.T) {
	tests := []struct{ ref, want string }{
		{"localhost/vpcip/pause:1", "1"},
		{"localhost:5000/pause", "latest"},
		{"pause", "latest"},
	}
	for _, tt := range tests {
		if got := tagOf(tt.ref); got != tt.want {
			t.Errorf("tagOf(%q) = %q, want %q", tt.ref, got, tt.want)
		}
	}
}

// unpackLayout extracts a layout tar into a directory, for go-containerregistry's
// layout reader.
func unpackLayout(t *testing.T, data []byte) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range readArchive(t, data) {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// A multi-platform archive, read back with go-containerregistry's layout
// reader: index.json names one image index (with the image's name), which
// lists each platform's manifest in order; each manifest's config carries its
// platform and its layer holds that platform's files.
func TestWriteIndexResolves(t *testing.T) {
	img := func(arch string) Image {
		return Image{
			Name: "localhost/vpcip/vpcip:3", OS: "linux", Architecture: arch, Gzip: true,
			Entrypoint: []string{"/d"}, Files: []File{{Path: "/d", Mode: 0o755, Data: []byte("daemon for " + arch)}},
		}
	}
	imgs := []Image{img("amd64"), img("arm64")}
	var buf bytes.Buffer
	desc, err := WriteIndex(&buf, imgs)
	if err != nil {
		t.Fatal(err)
	}
	var again bytes.Buffer
	if d2, err := WriteIndex(&again, imgs); err != nil || d2.Digest != desc.Digest || !bytes.Equal(buf.Bytes(), again.Bytes()) {
		t.Fatalf("two writes differ: %v %s vs %s", err, desc.Digest, d2.Digest)
	}
	top, err := layout.ImageIndexFromPath(unpackLayout(t, buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]v1.Descriptor{desc}, tm.Manifests); diff != "" {
		t.Errorf("index.json differs from the returned descriptor (-want +got):\n%s", diff)
	}
	if desc.MediaType != types.OCIImageIndex || desc.Annotations[AnnotationImageName] != "localhost/vpcip/vpcip:3" || desc.Annotations[AnnotationRefName] != "3" {
		t.Errorf("index.json entry: %s %v, want an OCI image index named localhost/vpcip/vpcip:3", desc.MediaType, desc.Annotations)
	}
	multi, err := top.ImageIndex(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	mm, err := multi.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(mm.Manifests) != len(imgs) {
		t.Fatalf("image index lists %d manifests, want %d", len(mm.Manifests), len(imgs))
	}
	for i, m := range mm.Manifests {
		want := imgs[i]
		if m.Platform == nil || m.Platform.OS != want.OS || m.Platform.Architecture != want.Architecture || m.MediaType != types.OCIManifestSchema1 {
			t.Errorf("manifest %d: %s %+v, want an OCI manifest for %s/%s", i, m.MediaType, m.Platform, want.OS, want.Architecture)
			continue
		}
		image, err := multi.Image(m.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := image.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.OS != want.OS || cf.Architecture != want.Architecture {
			t.Errorf("manifest %d config: %s/%s, want %s/%s", i, cf.OS, cf.Architecture, want.OS, want.Architecture)
		}
		tr := tar.NewReader(mutate.Extract(image))
		hdr, err := tr.Next()
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		if hdr.Name != "d" || string(body) != "daemon for "+want.Architecture {
			t.Errorf("manifest %d file %s = %q, want d = %q", i, hdr.Name, body, "daemon for "+want.Architecture)
		}
	}
}

func TestWriteIndexRejects(t *testing.T) {
	good := func(name, arch string) Image {
		return Image{Name: name, OS: "linux", Architecture: arch, Files: []File{{Path: "/d", Mode: 0o755, Data: []byte("x")}}}
	}
	tests := []struct {
		name string
		imgs []Image
		want string
	}{
		{"none", nil, "no image"},
		{"two names", []Image{good("a:1", "amd64"), good("a:2", "arm64")}, "two names"},
		{"platform twice", []Image{good("a:1", "amd64"), good("a:1", "amd64")}, "linux/amd64 given twice"},
		{"bad image", []Image{good("a:1", "amd64"), {Name: "a:1", OS: "linux", Architecture: "arm64"}}, "linux/arm64: ociarchive: image has no files"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			_, err := WriteIndex(&buf, tt.imgs)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("WriteIndex error = %v, want one containing %q", err, tt.want)
			}
			if buf.Len() != 0 {
				t.Errorf("WriteIndex wrote %d bytes for a rejected index", buf.Len())
			}
		})
	}
}
