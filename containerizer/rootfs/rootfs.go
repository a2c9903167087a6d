package rootfs

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"runtime"
	"strings"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Image is what an unpacked image says about how to run it.
type Image struct {
	Labels     map[string]string `json:"labels,omitempty"`
	Env        []string          `json:"env,omitempty"`
	Entrypoint []string          `json:"entrypoint,omitempty"`
	Cmd        []string          `json:"cmd,omitempty"`
	WorkingDir string            `json:"workingDir,omitempty"`
	User       string            `json:"user,omitempty"`
}

// Unpack extracts the image at src into dst, which must be empty or not
// exist yet, and returns its configuration. src is an OCI image layout
// directory, a tar of one, or a `docker save` tar; of several images, the
// first is taken (in an OCI index, the first for this platform). On error,
// what was already written to dst is left for the caller to remove.
func Unpack(ctx context.Context, src, dst string) (Image, error) {
	img, err := unpack(ctx, src, dst)
	if err != nil {
		return Image{}, fmt.Errorf("unpack %s: %w", src, err)
	}
	return img, nil
}

func unpack(ctx context.Context, src, dst string) (Image, error) {
	fi, err := os.Stat(src)
	if err != nil {
		return Image{}, err
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return Image{}, err
	}
	if entries, err := os.ReadDir(dst); err != nil {
		return Image{}, err
	} else if len(entries) > 0 {
		return Image{}, fmt.Errorf("%s: %w", dst, ErrNotEmpty)
	}
	dir := src
	if !fi.IsDir() {
		// A tar of the image: its files are read in no useful order, so
		// they are laid out in a scratch directory first.
		tmp, err := os.MkdirTemp("", "gpuiso-image-")
		if err != nil {
			return Image{}, err
		}
		defer os.RemoveAll(tmp)
		f, err := os.Open(src)
		if err != nil {
			return Image{}, err
		}
		defer f.Close()
		if err := extract(ctx, f, tmp, false); err != nil {
			return Image{}, err
		}
		dir = tmp
	}
	cfg, layers, err := readImage(dir)
	if err != nil {
		return Image{}, err
	}
	srcRoot, err := os.OpenRoot(dir)
	if err != nil {
		return Image{}, err
	}
	defer srcRoot.Close()
	for _, l := range layers {
		if err := applyLayer(ctx, srcRoot, l, dst); err != nil {
			return Image{}, &LayerError{Layer: l, Err: err}
		}
	}
	c := cfg.Config
	return Image{Labels: c.Labels, Env: c.Env, Entrypoint: c.Entrypoint, Cmd: c.Cmd, WorkingDir: c.WorkingDir, User: c.User}, nil
}

// readImage finds the configuration and the layers (paths relative to dir,
// lowest first) of the first image in dir.
func readImage(dir string) (ocispec.Image, []string, error) {
	var cfg ocispec.Image
	root, err := os.OpenRoot(dir)
	if err != nil {
		return cfg, nil, err
	}
	defer root.Close()
	// docker save: manifest.json lists each image's config and layers.
	if b, err := root.ReadFile("manifest.json"); err == nil {
		var m []struct {
			Config string
			Layers []string
		}
		if err := json.Unmarshal(b, &m); err != nil || len(m) == 0 {
			return cfg, nil, fmt.Errorf("manifest.json: %w", ErrFormat)
		}
		if err := readJSON(root, m[0].Config, &cfg); err != nil {
			return cfg, nil, err
		}
		return cfg, m[0].Layers, nil
	}
	var index ocispec.Index
	if err := readJSON(root, "index.json", &index); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return cfg, nil, ErrFormat
		}
		return cfg, nil, err
	}
	for depth := 0; depth < 4; depth++ {
		desc, ok := pick(index.Manifests)
		if !ok {
			return cfg, nil, fmt.Errorf("no image for %s/%s: %w", runtime.GOOS, runtime.GOARCH, ErrFormat)
		}
		p, err := blobPath(desc.Digest)
		if err != nil {
			return cfg, nil, err
		}
		if desc.MediaType == ocispec.MediaTypeImageIndex {
			index = ocispec.Index{}
			if err := readJSON(root, p, &index); err != nil {
				return cfg, nil, err
			}
			continue
		}
		var m ocispec.Manifest
		if err := readJSON(root, p, &m); err != nil {
			return cfg, nil, err
		}
		cp, err := blobPath(m.Config.Digest)
		if err != nil {
			return cfg, nil, err
		}
		if err := readJSON(root, cp, &cfg); err != nil {
			return cfg, nil, err
		}
		var layers []string
		for _, l := range m.Layers {
			lp, err := blobPath(l.Digest)
			if err != nil {
				return cfg, nil, err
			}
			if strings.Contains(l.MediaType, "zstd") {
				return cfg, nil, fmt.Errorf("layer %s: zstd compression is not supported: %w", l.Digest, ErrFormat)
			}
			layers = append(layers, lp)
		}
		return cfg, layers, nil
	}
	return cfg, nil, fmt.Errorf("indexes nested too deep: %w", ErrFormat)
}

// pick returns the first manifest for this platform (or for none named).
func pick(ms []ocispec.Descriptor) (ocispec.Descriptor, bool) {
	for _, d := range ms {
		if p := d.Platform; p == nil || (p.OS == runtime.GOOS && p.Architecture == runtime.GOARCH) {
			return d, true
		}
	}
	return ocispec.Descriptor{}, false
}

func blobPath(d digest.Digest) (string, error) {
	if err := d.Validate(); err != nil {
		return "", fmt.Errorf("digest %q: %w: %w", d, ErrFormat, err)
	}
	return path.Join("blobs", d.Algorithm().String(), d.Encoded()), nil
}

func readJSON(root *os.Root, name string, v any) error {
	b, err := root.ReadFile(name)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w: %w", name, ErrFormat, err)
	}
	return nil
}

// applyLayer extracts the layer (a tar, gzip-compressed or not) at p in src
// over dst, with whiteouts.
func applyLayer(ctx context.Context, src *os.Root, p, dst string) error {
	f, err := src.Open(path.Clean(p))
	if err != nil {
		return err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var r io.Reader = br
	if magic, err := br.Peek(2); err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return err
		}
		defer gz.Close()
		r = gz
	}
	return extract(ctx, r, dst, true)
}

// extract writes the tar r under dst through an os.Root. With whiteouts,
// ".wh." entries remove what lower layers wrote.
func extract(ctx context.Context, r io.Reader, dst string, whiteouts bool) error {
	root, err := os.OpenRoot(dst)
	if err != nil {
		return err
	}
	defer root.Close()
	owner := os.Geteuid() == 0
	created := map[string]bool{}
	var opaque []string
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		name := strings.TrimPrefix(path.Clean("/"+hdr.Name), "/")
		if name == "" {
			continue
		}
		dir, base := path.Split(name)
		if whiteouts && base == ".wh..wh..opq" {
			opaque = append(opaque, path.Clean("/" + dir)[1:])
			continue
		}
		if whiteouts && strings.HasPrefix(base, ".wh.") {
			if err := root.RemoveAll(path.Join(dir, base[len(".wh."):])); err != nil {
				return err
			}
			continue
		}
		if dir != "" {
			if err := root.MkdirAll(path.Clean(dir), 0o755); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		if err := writeEntry(root, tr, hdr, name); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		created[name] = true
		if owner && hdr.Typeflag != tar.TypeChar && hdr.Typeflag != tar.TypeBlock && hdr.Typeflag != tar.TypeFifo {
			if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		if hdr.Typeflag == tar.TypeDir || hdr.Typeflag == tar.TypeReg {
			if err := root.Chmod(name, hdr.FileInfo().Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
	}
	for _, d := range opaque {
		if err := hideLower(root, d, created); err != nil {
			return err
		}
	}
	return nil
}

// writeEntry writes one tar entry at name, replacing what was there.
func writeEntry(root *os.Root, tr *tar.Reader, hdr *tar.Header, name string) error {
	if hdr.Typeflag == tar.TypeDir {
		if fi, err := root.Lstat(name); err == nil && fi.IsDir() {
			return nil
		}
	}
	if err := root.RemoveAll(name); err != nil {
		return err
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return root.Mkdir(name, 0o755)
	case tar.TypeReg:
		f, err := root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, tr)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	case tar.TypeSymlink:
		return root.Symlink(hdr.Linkname, name)
	case tar.TypeLink:
		return root.Link(strings.TrimPrefix(path.Clean("/"+hdr.Linkname), "/"), name)
	}
	return nil // device nodes and fifos: a native container has its own /dev
}

// hideLower removes from dir what this layer did not write: the lower
// layers' content of an opaque directory.
func hideLower(root *os.Root, dir string, created map[string]bool) error {
	d := dir
	if d == "" {
		d = "."
	}
	f, err := root.Open(d)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, n := range names {
		p := path.Join(dir, n)
		keep := created[p]
		for c := range created {
			if strings.HasPrefix(c, p+"/") {
				keep = true
				break
			}
		}
		switch {
		case !keep:
			if err := root.RemoveAll(p); err != nil {
				return err
			}
		case !created[p] || isDir(root, p):
			if err := hideLower(root, p, created); err != nil {
				return err
			}
		}
	}
	return nil
}

func isDir(root *os.Root, p string) bool {
	fi, err := root.Lstat(p)
	return err == nil && fi.IsDir()
}
