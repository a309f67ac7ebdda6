// Package ociarchive writes a single-platform container image as an OCI image
// layout in one tar stream, the archive form that `ctr images import` reads.
//
// The test machines have no image registry, so the pod sandbox image is built
// here from a locally compiled binary. The layout follows the OCI image-layout
// specification 1.0: an `oci-layout` marker, an `index.json` naming one
// manifest, and content-addressed blobs under `blobs/sha256/`. The single layer
// is stored uncompressed, so its digest is also its diff ID. Output is
// deterministic: the same Image always gives the same bytes and digests.
package ociarchive

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"time"
)

// Media types and annotation keys from the OCI image specification 1.0 and
// containerd's importer.
const (
	MediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	MediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	MediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar"

	// AnnotationImageName is the full reference containerd's importer gives
	// the image ("io.containerd.image.name").
	AnnotationImageName = "io.containerd.image.name"
	// AnnotationRefName is the OCI tag annotation ("org.opencontainers.image.ref.name").
	AnnotationRefName = "org.opencontainers.image.ref.name"
)

// epoch is the modification time of every tar entry, for reproducible output.
var epoch = time.Unix(0, 0).UTC()

// File is one regular file of the image's only layer.
type File struct {
	Path string // absolute path inside the image, e.g. "/pause"
	Mode int64  // permission bits, e.g. 0o755
	Data []byte
}

// Image describes the image to write.
type Image struct {
	Name         string   // full reference, e.g. "localhost/vpcip/pause:1"; its tag also becomes the OCI ref name
	OS           string   // GOOS form, e.g. "linux"
	Architecture string   // GOARCH form, e.g. "amd64"
	Entrypoint   []string // e.g. ["/pause"]
	Files        []File
}

// Descriptor is the OCI content descriptor (media type, digest, size in bytes).
type Descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    *Platform         `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Platform is the OCI platform of a manifest.
type Platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// Index is the OCI image index stored as index.json.
type Index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []Descriptor `json:"manifests"`
}

// Manifest is the OCI image manifest.
type Manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        Descriptor   `json:"config"`
	Layers        []Descriptor `json:"layers"`
}

// Config is the subset of the OCI image configuration this package writes.
type Config struct {
	Architecture string        `json:"architecture"`
	OS           string        `json:"os"`
	Config       ContainerSpec `json:"config"`
	RootFS       RootFS        `json:"rootfs"`
}

// ContainerSpec is the execution part of the image configuration.
type ContainerSpec struct {
	Entrypoint []string `json:"Entrypoint,omitempty"`
}

// RootFS lists the layers' diff IDs (digests of the uncompressed layers).
type RootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

// Write writes img to w as an OCI image layout tar and returns the manifest
// descriptor recorded in index.json. It fails on an image without a name,
// platform or files, on a relative or duplicate file path, and on write errors.
func Write(w io.Writer, img Image) (Descriptor, error) {
	if err := validate(img); err != nil {
		return Descriptor{}, err
	}
	layer, err := layerTar(img.Files)
	if err != nil {
		return Descriptor{}, err
	}
	layerDesc := describe(MediaTypeLayer, layer)
	config, err := json.Marshal(Config{
		Architecture: img.Architecture,
		OS:           img.OS,
		Config:       ContainerSpec{Entrypoint: img.Entrypoint},
		RootFS:       RootFS{Type: "layers", DiffIDs: []string{layerDesc.Digest}},
	})
	if err != nil {
		return Descriptor{}, err
	}
	configDesc := describe(MediaTypeConfig, config)
	manifest, err := json.Marshal(Manifest{
		SchemaVersion: 2,
		MediaType:     MediaTypeManifest,
		Config:        configDesc,
		Layers:        []Descriptor{layerDesc},
	})
	if err != nil {
		return Descriptor{}, err
	}
	manifestDesc := describe(MediaTypeManifest, manifest)
	manifestDesc.Platform = &Platform{Architecture: img.Architecture, OS: img.OS}
	manifestDesc.Annotations = map[string]string{
		AnnotationImageName: img.Name,
		AnnotationRefName:   tagOf(img.Name),
	}
	index, err := json.Marshal(Index{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: []Descriptor{manifestDesc}})
	if err != nil {
		return Descriptor{}, err
	}

	tw := tar.NewWriter(w)
	entries := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{blobPath(layerDesc.Digest), layer},
		{blobPath(configDesc.Digest), config},
		{blobPath(manifestDesc.Digest), manifest},
	}
	for _, e := range entries {
		if err := writeFile(tw, e.name, 0o644, e.data); err != nil {
			return Descriptor{}, err
		}
	}
	if err := tw.Close(); err != nil {
		return Descriptor{}, fmt.Errorf("ociarchive: finish archive: %w", err)
	}
	return manifestDesc, nil
}

func validate(img Image) error {
	var errs []error
	if img.Name == "" {
		errs = append(errs, errors.New("ociarchive: image name is empty"))
	}
	if img.OS == "" || img.Architecture == "" {
		errs = append(errs, errors.New("ociarchive: OS and Architecture are required"))
	}
	if len(img.Files) == 0 {
		errs = append(errs, errors.New("ociarchive: image has no files"))
	}
	seen := map[string]bool{}
	for _, f := range img.Files {
		clean := path.Clean(f.Path)
		if !path.IsAbs(f.Path) || clean == "/" {
			errs = append(errs, fmt.Errorf("ociarchive: file path %q is not an absolute file path", f.Path))
		}
		if seen[clean] {
			errs = append(errs, fmt.Errorf("ociarchive: file path %q given twice", f.Path))
		}
		seen[clean] = true
	}
	return errors.Join(errs...)
}

// layerTar builds the uncompressed layer: files sorted by path, stored
// relative to the root, owned by 0:0, with fixed timestamps.
func layerTar(files []File) ([]byte, error) {
	sorted := append([]File(nil), files...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Path < sorted[j].Path })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range sorted {
		if err := writeFile(tw, path.Clean(f.Path)[1:], f.Mode, f.Data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("ociarchive: finish layer: %w", err)
	}
	return buf.Bytes(), nil
}

func writeFile(tw *tar.Writer, name string, mode int64, data []byte) error {
	hdr := &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     name,
		Mode:     mode,
		Size:     int64(len(data)),
		ModTime:  epoch,
		Format:   tar.FormatPAX,
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("ociarchive: write %s: %w", name, err)
	}
	if _, err := tw.Write(data); err != nil {
		return fmt.Errorf("ociarchive: write %s: %w", name, err)
	}
	return nil
}

func describe(mediaType string, data []byte) Descriptor {
	sum := sha256.Sum256(data)
	return Descriptor{MediaType: mediaType, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(data))}
}

func blobPath(digest string) string {
	return "blobs/sha256/" + digest[len("sha256:"):]
}

// tagOf returns the tag of a reference ("latest" when it has none).
func tagOf(ref string) string {
	for i := len(ref) - 1; i >= 0; i-- {
		switch ref[i] {
		case ':':
			return ref[i+1:]
		case '/':
			return "latest"
		}
	}
	return "latest"
}
