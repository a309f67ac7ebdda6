// Package ociarchive writes a container image as an OCI image layout in one
// tar stream, the archive form that `ctr images import` reads: a
// single-platform image (Write) or a multi-platform one (WriteIndex).
//
// The test machines have no image registry, so images are built here from
// locally compiled binaries (the pod sandbox image, vpcip's own image built by
// `make image`). The image itself (layers, config, manifest, index, digests)
// is modelled with go-containerregistry; this package lays it out as the OCI
// image-layout specification 1.0 asks: an `oci-layout` marker, an
// `index.json` naming one manifest (Write) or one image index that lists a
// manifest per platform (WriteIndex), and content-addressed blobs under
// `blobs/sha256/`. Output is deterministic: the same Image always gives the
// same bytes and digests (fixed timestamps and owners, sorted entries, gzip
// without a header time).
package ociarchive

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Annotation keys of the index entry.
const (
	// AnnotationImageName is the full reference containerd's importer gives
	// the image ("io.containerd.image.name").
	AnnotationImageName = "io.containerd.image.name"
	// AnnotationRefName is the OCI tag annotation ("org.opencontainers.image.ref.name").
	AnnotationRefName = "org.opencontainers.image.ref.name"
)

// epoch is the modification time of every tar entry, for reproducible output.
var epoch = time.Unix(0, 0).UTC()

// File is one entry of a layer: a regular file, or a symbolic link when
// Link is set (Data is then ignored).
type File struct {
	Path string // absolute path inside the image, e.g. "/pause"
	Mode int64  // permission bits, e.g. 0o755
	Data []byte
	Link string // symlink target, e.g. "xtables-nft-multi"; empty for a regular file
}

// Image describes the image to write.
type Image struct {
	Name         string   // full reference, e.g. "localhost/vpcip/pause:1"; its tag also becomes the OCI ref name
	OS           string   // GOOS form, e.g. "linux"
	Architecture string   // GOARCH form, e.g. "amd64"
	Entrypoint   []string // e.g. ["/pause"]
	Env          []string // e.g. ["PATH=/usr/local/bin:/usr/sbin:/usr/bin"]
	// Layers, bottom first; each is a list of files. Files is a shorthand
	// for a single layer (used when Layers is empty).
	Layers [][]File
	Files  []File
	// Gzip compresses the layers (application/vnd.oci.image.layer.v1.tar+gzip);
	// otherwise they are stored uncompressed and a layer's digest is its diff ID.
	Gzip bool
}

// Write writes img to w as an OCI image layout tar and returns the manifest
// descriptor recorded in index.json. It fails on an image without a name,
// platform or files, on a relative or duplicate path within a layer, and on
// write errors.
func Write(w io.Writer, img Image) (v1.Descriptor, error) {
	image, err := check(img)
	if err != nil {
		return v1.Descriptor{}, err
	}
	index := mutate.AppendManifests(emptyIndex(), mutate.IndexAddendum{
		Add: image,
		Descriptor: v1.Descriptor{
			Platform:    &v1.Platform{OS: img.OS, Architecture: img.Architecture},
			Annotations: nameAnnotations(img.Name),
		},
	})
	return writeLayout(w, index, []v1.Image{image}, nil)
}

// WriteIndex writes one image for several platforms to w as an OCI image
// layout tar: index.json names a single image index (the image's name in its
// annotations, as `ctr images import` reads it), which lists one manifest per
// platform, in the order of imgs, each with its platform; this is the form a
// multi-architecture image has in a registry, and containerd picks the
// manifest of the host's platform from it. It returns the image index's
// descriptor from index.json (its digest is the image's digest once pushed).
// It fails as Write does for any image, when imgs is empty, when the images'
// names differ, or when a platform (OS and architecture) repeats.
func WriteIndex(w io.Writer, imgs []Image) (v1.Descriptor, error) {
	if len(imgs) == 0 {
		return v1.Descriptor{}, errors.New("ociarchive: no image to write")
	}
	var (
		adds   []mutate.IndexAddendum
		images []v1.Image
		seen   = map[string]bool{}
	)
	for _, img := range imgs {
		image, err := check(img)
		if err != nil {
			return v1.Descriptor{}, fmt.Errorf("%s/%s: %w", img.OS, img.Architecture, err)
		}
		if img.Name != imgs[0].Name {
			return v1.Descriptor{}, fmt.Errorf("ociarchive: one index, two names: %q and %q", imgs[0].Name, img.Name)
		}
		platform := img.OS + "/" + img.Architecture
		if seen[platform] {
			return v1.Descriptor{}, fmt.Errorf("ociarchive: platform %s given twice", platform)
		}
		seen[platform] = true
		images = append(images, image)
		adds = append(adds, mutate.IndexAddendum{
			Add:        image,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: img.OS, Architecture: img.Architecture}},
		})
	}
	multi := mutate.AppendManifests(emptyIndex(), adds...)
	top := mutate.AppendManifests(emptyIndex(), mutate.IndexAddendum{
		Add:        multi,
		Descriptor: v1.Descriptor{Annotations: nameAnnotations(imgs[0].Name)},
	})
	return writeLayout(w, top, images, []v1.ImageIndex{multi})
}

// check validates img and assembles it.
func check(img Image) (v1.Image, error) {
	layers := img.Layers
	if len(layers) == 0 && len(img.Files) > 0 {
		layers = [][]File{img.Files}
	}
	if err := validate(img, layers); err != nil {
		return nil, err
	}
	return build(img, layers)
}

func emptyIndex() v1.ImageIndex { return mutate.IndexMediaType(empty.Index, types.OCIImageIndex) }

// nameAnnotations are the index entry's annotations naming the image.
func nameAnnotations(name string) map[string]string {
	return map[string]string{AnnotationImageName: name, AnnotationRefName: tagOf(name)}
}

// build assembles the image: layers, then the config (platform, entrypoint,
// environment; every time stamp zero).
func build(img Image, layers [][]File) (v1.Image, error) {
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	var adds []v1.Layer
	for _, files := range layers {
		l, err := layer(files, img.Gzip)
		if err != nil {
			return nil, err
		}
		adds = append(adds, l)
	}
	image, err := mutate.AppendLayers(base, adds...)
	if err != nil {
		return nil, fmt.Errorf("ociarchive: %w", err)
	}
	cf, err := image.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("ociarchive: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = img.OS, img.Architecture
	cf.Config.Entrypoint, cf.Config.Env = img.Entrypoint, img.Env
	image, err = mutate.ConfigFile(image, cf)
	if err != nil {
		return nil, fmt.Errorf("ociarchive: %w", err)
	}
	return image, nil
}

func layer(files []File, gz bool) (v1.Layer, error) {
	data, err := layerTar(files)
	if err != nil {
		return nil, err
	}
	if !gz {
		return static.NewLayer(data, types.OCIUncompressedLayer), nil
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.BestCompression))
	if err != nil {
		return nil, fmt.Errorf("ociarchive: %w", err)
	}
	return l, nil
}

// writeLayout writes the layout tar: marker, index, then every blob of the
// images and the nested indexes once.
func writeLayout(w io.Writer, index v1.ImageIndex, images []v1.Image, nested []v1.ImageIndex) (v1.Descriptor, error) {
	im, err := index.IndexManifest()
	if err != nil {
		return v1.Descriptor{}, fmt.Errorf("ociarchive: %w", err)
	}
	rawIndex, err := index.RawManifest()
	if err != nil {
		return v1.Descriptor{}, fmt.Errorf("ociarchive: %w", err)
	}
	tw := tar.NewWriter(w)
	put := func(name string, data []byte) error {
		return writeEntry(tw, File{Path: "/" + name, Mode: 0o644, Data: data})
	}
	if err := errors.Join(put("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)), put("index.json", rawIndex)); err != nil {
		return v1.Descriptor{}, err
	}
	var blobs []stored
	for _, image := range images {
		b, err := blobsOf(image)
		if err != nil {
			return v1.Descriptor{}, err
		}
		blobs = append(blobs, b...)
	}
	for _, idx := range nested {
		data, err := idx.RawManifest()
		if err != nil {
			return v1.Descriptor{}, fmt.Errorf("ociarchive: %w", err)
		}
		d, err := idx.Digest()
		if err != nil {
			return v1.Descriptor{}, fmt.Errorf("ociarchive: %w", err)
		}
		blobs = append(blobs, stored{d, data})
	}
	seen := map[v1.Hash]bool{}
	for _, b := range blobs {
		if seen[b.digest] {
			continue
		}
		seen[b.digest] = true
		if err := put("blobs/sha256/"+b.digest.Hex, b.data); err != nil {
			return v1.Descriptor{}, err
		}
	}
	if err := tw.Close(); err != nil {
		return v1.Descriptor{}, fmt.Errorf("ociarchive: finish archive: %w", err)
	}
	return im.Manifests[0], nil
}

type stored struct {
	digest v1.Hash
	data   []byte
}

// blobsOf returns the image's layers (as stored), config and manifest.
func blobsOf(image v1.Image) ([]stored, error) {
	var out []stored
	layers, err := image.Layers()
	if err != nil {
		return nil, fmt.Errorf("ociarchive: %w", err)
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return nil, fmt.Errorf("ociarchive: layer digest: %w", err)
		}
		rc, err := l.Compressed()
		if err != nil {
			return nil, fmt.Errorf("ociarchive: layer: %w", err)
		}
		data, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return nil, fmt.Errorf("ociarchive: layer: %w", err)
		}
		out = append(out, stored{d, data})
	}
	for _, part := range []struct {
		raw    func() ([]byte, error)
		digest func() (v1.Hash, error)
	}{{image.RawConfigFile, image.ConfigName}, {image.RawManifest, image.Digest}} {
		data, err := part.raw()
		if err != nil {
			return nil, fmt.Errorf("ociarchive: %w", err)
		}
		d, err := part.digest()
		if err != nil {
			return nil, fmt.Errorf("ociarchive: %w", err)
		}
		out = append(out, stored{d, data})
	}
	return out, nil
}

func validate(img Image, layers [][]File) error {
	var errs []error
	if img.Name == "" {
		errs = append(errs, errors.New("ociarchive: image name is empty"))
	}
	if img.OS == "" || img.Architecture == "" {
		errs = append(errs, errors.New("ociarchive: OS and Architecture are required"))
	}
	if len(layers) == 0 {
		errs = append(errs, errors.New("ociarchive: image has no files"))
	}
	if len(img.Layers) > 0 && len(img.Files) > 0 {
		errs = append(errs, errors.New("ociarchive: set Files or Layers, not both"))
	}
	for i, files := range layers {
		if len(files) == 0 {
			errs = append(errs, fmt.Errorf("ociarchive: layer %d has no files", i))
		}
		seen := map[string]bool{}
		for _, f := range files {
			clean := path.Clean(f.Path)
			if !path.IsAbs(f.Path) || clean == "/" {
				errs = append(errs, fmt.Errorf("ociarchive: file path %q is not an absolute file path", f.Path))
			}
			if seen[clean] {
				errs = append(errs, fmt.Errorf("ociarchive: file path %q given twice", f.Path))
			}
			seen[clean] = true
		}
	}
	return errors.Join(errs...)
}

// layerTar builds one uncompressed layer: entries sorted by path, stored
// relative to the root, owned by 0:0, with fixed timestamps.
func layerTar(files []File) ([]byte, error) {
	sorted := append([]File(nil), files...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Path < sorted[j].Path })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range sorted {
		if err := writeEntry(tw, f); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("ociarchive: finish layer: %w", err)
	}
	return buf.Bytes(), nil
}

func writeEntry(tw *tar.Writer, f File) error {
	name := path.Clean(f.Path)[1:]
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: f.Mode, Size: int64(len(f.Data)), ModTime: epoch, Format: tar.FormatPAX}
	if f.Link != "" {
		hdr.Typeflag, hdr.Linkname, hdr.Size, hdr.Mode = tar.TypeSymlink, f.Link, 0, 0o777
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("ociarchive: write %s: %w", name, err)
	}
	if f.Link != "" {
		return nil
	}
	if _, err := tw.Write(f.Data); err != nil {
		return fmt.Errorf("ociarchive: write %s: %w", name, err)
	}
	return nil
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
