package main

import (
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"

	"github.com/vpcip/vpcip/test/containerd/ociarchive"
)

// rootFS collects files from a directory holding an unpacked root file system
// (the extracted Debian packages), following symbolic links and ELF
// dependencies so that every program taken brings what it needs to run.
type rootFS struct {
	dir     string   // the unpacked root on the build machine
	arch    string   // GOARCH every ELF file taken must be for
	libDirs []string // image paths searched for DT_NEEDED libraries
	files   map[string]ociarchive.File
}

// libDirsFor returns the library directories of a Debian root for a GOARCH:
// the multiarch directories first, as the dynamic loader searches them.
func libDirsFor(goarch string) ([]string, error) {
	triplet, ok := map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}[goarch]
	if !ok {
		return nil, fmt.Errorf("no Debian multiarch triplet known for %s", goarch)
	}
	return []string{"/lib/" + triplet, "/usr/lib/" + triplet, "/lib", "/usr/lib", "/lib64"}, nil
}

func newRootFS(dir, goarch string) (*rootFS, error) {
	libs, err := libDirsFor(goarch)
	if err != nil {
		return nil, err
	}
	return &rootFS{dir: dir, arch: goarch, libDirs: libs, files: map[string]ociarchive.File{}}, nil
}

// Add takes the file at image path p (absolute), the targets of symbolic
// links along the way, and for an ELF file its program interpreter and
// needed libraries, transitively. Taking a path twice is a no-op.
func (r *rootFS) Add(p string) error {
	return r.add(p, 0)
}

func (r *rootFS) add(p string, depth int) error {
	p = path.Clean(p)
	if _, done := r.files[p]; done {
		return nil
	}
	if depth > 40 {
		return fmt.Errorf("%s: too many levels of links or libraries", p)
	}
	host := filepath.Join(r.dir, filepath.FromSlash(p))
	fi, err := os.Lstat(host)
	if err != nil {
		return err
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := os.Readlink(host)
		if err != nil {
			return err
		}
		r.files[p] = ociarchive.File{Path: p, Link: target}
		if !path.IsAbs(target) {
			target = path.Join(path.Dir(p), target)
		}
		return r.add(target, depth+1)
	case fi.Mode().IsRegular():
		data, err := os.ReadFile(host)
		if err != nil {
			return err
		}
		r.files[p] = ociarchive.File{Path: p, Mode: int64(fi.Mode().Perm()), Data: data}
		return r.addELFDeps(p, host, depth)
	default:
		return fmt.Errorf("%s: not a regular file or symbolic link", p)
	}
}

// addELFDeps takes the interpreter and DT_NEEDED libraries of an ELF file,
// which must be for the root's architecture; other files have none.
func (r *rootFS) addELFDeps(p, host string, depth int) error {
	f, err := elf.Open(host)
	if err != nil {
		return nil // not ELF: a script or data file
	}
	defer f.Close()
	if want := elfMachine[r.arch]; f.Machine != want {
		return fmt.Errorf("%s is for %s, the %s image needs %s", p, f.Machine, r.arch, want)
	}
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			b := make([]byte, prog.Filesz)
			if _, err := prog.ReadAt(b, 0); err != nil {
				return fmt.Errorf("%s: interpreter: %w", p, err)
			}
			if err := r.add(string(b[:len(b)-1]), depth+1); err != nil {
				return fmt.Errorf("%s: interpreter: %w", p, err)
			}
		}
	}
	needed, err := f.ImportedLibraries()
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	for _, lib := range needed {
		found := false
		for _, d := range r.libDirs {
			if _, err := os.Lstat(filepath.Join(r.dir, d, lib)); err == nil {
				if err := r.add(path.Join(d, lib), depth+1); err != nil {
					return err
				}
				found = true
				break
			}
		}
		if !found {
			return fmt.Errorf("%s needs %s, found in none of %v under %s", p, lib, r.libDirs, r.dir)
		}
	}
	return nil
}

// Glob adds every file matching an image path pattern; no match is an error.
func (r *rootFS) Glob(pattern string) error {
	matches, err := filepath.Glob(filepath.Join(r.dir, filepath.FromSlash(pattern)))
	if err != nil {
		return err
	}
	if len(matches) == 0 {
		return fmt.Errorf("nothing matches %s under %s", pattern, r.dir)
	}
	var errs []error
	for _, m := range matches {
		rel, _ := filepath.Rel(r.dir, m)
		errs = append(errs, r.Add("/"+filepath.ToSlash(rel)))
	}
	return errors.Join(errs...)
}

// Link adds a symbolic link at p pointing to target (not read from the root).
func (r *rootFS) Link(p, target string) {
	r.files[p] = ociarchive.File{Path: p, Link: target}
}

// Files returns what was taken, sorted by path.
func (r *rootFS) Files() []ociarchive.File {
	out := make([]ociarchive.File, 0, len(r.files))
	for _, f := range r.files {
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}
