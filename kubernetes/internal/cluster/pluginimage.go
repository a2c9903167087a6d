package cluster

import (
	"debug/elf"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// PluginProgram is where the plugin's image holds the program, as in
// kubernetes/deploy/Dockerfile.
const PluginProgram = "/usr/bin/gpuiso-kubelet-plugin"

// nvmlNeeds are the C libraries NVML links besides libc: the image holds
// them, so that NVML loaded from a driver root at run time finds them.
var nvmlNeeds = []string{"libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1"}

// PluginImageArchive is the image of gpuiso-kubelet-plugin as an OCI
// archive named ref, assembled from a built program without a registry or
// a build daemon: the program at PluginProgram, and the C library it was
// linked with on this host (its ELF interpreter and every shared library
// it needs, found the way the dynamic linker finds them; on a Debian host
// that is libc6's files), with the libraries NVML needs. It runs as root
// (see the chart's security context for why and with which capabilities).
func PluginImageArchive(ref, program string) ([]byte, error) {
	body, err := os.ReadFile(program)
	if err != nil {
		return nil, err
	}
	files := []imageFile{{Path: strings.TrimPrefix(PluginProgram, "/"), Mode: 0o755, Body: body}}
	libs, err := sharedLibraries(program, nvmlNeeds)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", ref, err)
	}
	for _, l := range libs {
		b, err := os.ReadFile(l)
		if err != nil {
			return nil, err
		}
		files = append(files, imageFile{Path: strings.TrimPrefix(l, "/"), Mode: 0o755, Body: b})
	}
	return ociArchive(ref, files, ocispec.ImageConfig{
		Entrypoint: []string{PluginProgram},
		User:       "0",
		Labels:     map[string]string{"org.opencontainers.image.title": "gpuiso-kubelet-plugin"},
	})
}

// libDirs are the directories the dynamic linker searches by default.
func libDirs() []string {
	tuple := map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}[runtime.GOARCH]
	return []string{"/lib/" + tuple, "/usr/lib/" + tuple, "/lib64", "/usr/lib64", "/lib", "/usr/lib"}
}

// sharedLibraries lists the files the dynamic program needs to run: its
// interpreter, by its path, and every library it needs, recursively, plus
// extra, each found in libDirs (by the path it is found at). A static
// program needs none.
func sharedLibraries(program string, extra []string) ([]string, error) {
	f, err := elf.Open(program)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b := make([]byte, p.Filesz)
		if _, err := p.ReadAt(b, 0); err != nil {
			return nil, fmt.Errorf("%s: interpreter: %w", program, err)
		}
		out = append(out, strings.TrimRight(string(b), "\x00"))
	}
	if len(out) == 0 {
		return nil, nil // static
	}
	needed, err := f.ImportedLibraries()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", program, err)
	}
	seen := map[string]bool{}
	queue := append(needed, extra...)
	for len(queue) > 0 {
		name := queue[0]
		queue = queue[1:]
		if seen[name] {
			continue
		}
		seen[name] = true
		path, err := findLibrary(name)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(out, path) {
			out = append(out, path)
		}
		lf, err := elf.Open(path)
		if err != nil {
			return nil, err
		}
		more, err := lf.ImportedLibraries()
		lf.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		queue = append(queue, more...)
	}
	return out, nil
}

func findLibrary(name string) (string, error) {
	for _, d := range libDirs() {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("shared library %s: %w", name, fs.ErrNotExist)
}
