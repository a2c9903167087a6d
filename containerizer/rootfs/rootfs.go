package rootfs

import (
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
	"path/filepath"
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
// first is taken (in an OCI index, the first for this platform).
//
// Unpack keeps within [Limits] (the defaults, or those of [WithLimits]).
// On any error it removes what it wrote: the directories it made for dst,
// or, when dst already existed, everything in it; its scratch directory
// goes too.
func Unpack(ctx context.Context, src, dst string, opts ...Option) (Image, error) {
	c, err := newOptions(opts)
	if err != nil {
		return Image{}, fmt.Errorf("unpack %s: %w", src, err)
	}
	img, err := unpack(ctx, c, src, dst)
	if err != nil {
		return Image{}, fmt.Errorf("unpack %s: %w", src, err)
	}
	return img, nil
}

func unpack(ctx context.Context, c options, src, dst string) (_ Image, err error) {
	fi, err := os.Stat(src)
	if err != nil {
		return Image{}, err
	}
	made, err := makeDest(dst)
	if err != nil {
		return Image{}, err
	}
	defer func() {
		if err != nil {
			if cerr := cleanDest(dst, made); cerr != nil {
				err = fmt.Errorf("%w (and removing what was unpacked: %v)", err, cerr)
			}
		}
	}()
	dir := src
	if !fi.IsDir() {
		// A tar of the image: its files are read in no useful order, so
		// they are laid out in a scratch directory first.
		tmp, err := os.MkdirTemp(c.scratch, "gpuiso-unpack-")
		if err != nil {
			return Image{}, err
		}
		defer removeTree(tmp)
		f, err := os.Open(src)
		if err != nil {
			return Image{}, err
		}
		defer f.Close()
		x, err := newExtractor(tmp, c.limits, false)
		if err != nil {
			return Image{}, err
		}
		defer x.close()
		if err := x.extract(ctx, f, false); err != nil {
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
	x, err := newExtractor(dst, c.limits, true)
	if err != nil {
		return Image{}, err
	}
	defer x.close()
	for _, l := range layers {
		if err := x.applyLayer(ctx, srcRoot, l); err != nil {
			return Image{}, &LayerError{Layer: l, Err: err}
		}
	}
	if err := x.setModes(); err != nil {
		return Image{}, err
	}
	c2 := cfg.Config
	return Image{Labels: c2.Labels, Env: c2.Env, Entrypoint: c2.Entrypoint, Cmd: c2.Cmd, WorkingDir: c2.WorkingDir, User: c2.User}, nil
}

// makeDest makes dst if it is missing, and returns the topmost directory
// it made ("" if dst was there), or refuses a dst that holds files.
func makeDest(dst string) (string, error) {
	if fi, err := os.Stat(dst); err == nil {
		if !fi.IsDir() {
			return "", fmt.Errorf("%s: not a directory: %w", dst, ErrNotEmpty)
		}
		entries, err := os.ReadDir(dst)
		if err != nil {
			return "", err
		}
		if len(entries) > 0 {
			return "", fmt.Errorf("%s: %w", dst, ErrNotEmpty)
		}
		return "", nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	top := filepath.Clean(dst)
	for {
		parent := filepath.Dir(top)
		if _, err := os.Lstat(parent); !errors.Is(err, fs.ErrNotExist) || parent == top {
			break
		}
		top = parent
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return "", err
	}
	return top, nil
}

// cleanDest removes what Unpack wrote: made, the directories it made for
// dst, or else dst's content.
func cleanDest(dst, made string) error {
	if made != "" {
		return removeTree(made)
	}
	entries, err := os.ReadDir(dst)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if rerr := removeTree(filepath.Join(dst, e.Name())); err == nil {
			err = rerr
		}
	}
	return err
}

// removeTree removes the tree at p, first giving its owner write and
// search permission on each directory when that is what stops it.
func removeTree(p string) error {
	if err := os.RemoveAll(p); err == nil {
		return nil
	}
	filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(q, 0o700)
		}
		return nil
	})
	return os.RemoveAll(p)
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
	if _, err := root.Lstat("manifest.json"); err == nil {
		var m []struct {
			Config string
			Layers []string
		}
		if err := readJSON(root, "manifest.json", &m); err != nil {
			return cfg, nil, err
		}
		if len(m) == 0 {
			return cfg, nil, fmt.Errorf("manifest.json: no image: %w", ErrFormat)
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

// maxJSON bounds an image's index, manifest and configuration files.
const maxJSON = 16 << 20

func readJSON(root *os.Root, name string, v any) error {
	f, err := root.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxJSON+1))
	if err != nil {
		return err
	}
	if len(b) > maxJSON {
		return fmt.Errorf("%s: larger than %d bytes: %w", name, maxJSON, ErrFormat)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w: %w", name, ErrFormat, err)
	}
	return nil
}

// applyLayer extracts the layer (a tar, gzip-compressed or not) at p in src
// over the root, with whiteouts.
func (x *extractor) applyLayer(ctx context.Context, src *os.Root, p string) error {
	f, err := src.Open(path.Clean(p))
	if err != nil {
		return err
	}
	defer f.Close()
	in := &countReader{r: f}
	br := bufio.NewReader(in)
	var r io.Reader = br
	if magic, err := br.Peek(2); err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return readError(err)
		}
		defer gz.Close()
		r = &ratioReader{r: gz, in: in, max: x.limits.Ratio}
	}
	if err := x.extract(ctx, r, true); err != nil {
		return err
	}
	// The rest of the stream: a gzip layer's checksum is checked only when
	// its end is read.
	if _, err := io.Copy(io.Discard, r); err != nil {
		return readError(err)
	}
	return nil
}

// countReader counts the bytes read through it.
type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// ratioReader reads a decompressed stream and fails with a LimitError when
// it has expanded past max times the compressed bytes read (in), beyond
// RatioFloor.
type ratioReader struct {
	r   io.Reader
	in  *countReader
	out int64
	max int64
}

func (q *ratioReader) Read(p []byte) (int, error) {
	n, err := q.r.Read(p)
	q.out += int64(n)
	if q.out > RatioFloor && q.out/q.max > q.in.n {
		return n, &LimitError{Limit: "ratio", Max: q.max}
	}
	return n, err
}

// readError marks an error reading an archive (a bad header, a truncated
// stream, a bad checksum) as ErrFormat; a limit stays a limit.
func readError(err error) error {
	if errors.Is(err, ErrLimit) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrFormat, err)
}
