package rootfs

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

type entry struct {
	name, body, link string
	typ              byte
}

func layer(t *testing.T, gz bool, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: 0o644, Linkname: e.link, Size: int64(len(e.body))}
		if e.typ == tar.TypeDir {
			h.Mode = 0o755
		}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	if !gz {
		return buf.Bytes()
	}
	var z bytes.Buffer
	w := gzip.NewWriter(&z)
	w.Write(buf.Bytes())
	w.Close()
	return z.Bytes()
}

// The test image: a lower layer, and an upper one that deletes, hides an
// opaque directory, and names a file from "/" (which lands in the root).
func layers(t *testing.T, gz bool) [][]byte {
	return [][]byte{
		layer(t, gz,
			entry{name: "bin/", typ: tar.TypeDir},
			entry{name: "bin/probe", body: "probe", typ: tar.TypeReg},
			entry{name: "etc/gone", body: "x", typ: tar.TypeReg},
			entry{name: "opaque/old", body: "old", typ: tar.TypeReg},
			entry{name: "opaque/sub/old", body: "old", typ: tar.TypeReg},
			entry{name: "escape", link: "/tmp", typ: tar.TypeSymlink},
		),
		layer(t, gz,
			entry{name: "etc/.wh.gone", typ: tar.TypeReg},
			entry{name: "opaque/new", body: "new", typ: tar.TypeReg},
			entry{name: "opaque/.wh..wh..opq", typ: tar.TypeReg},
			entry{name: "bin/link", link: "bin/probe", typ: tar.TypeLink},
			entry{name: "/outside", body: "x", typ: tar.TypeReg},
		),
	}
}

var config = ocispec.Image{Config: ocispec.ImageConfig{Labels: map[string]string{"com.nvidia.volumes.needed": "nvidia_driver"}, Env: []string{"PATH=/bin"}, Cmd: []string{"/bin/probe"}}}

func writeTar(t testing.TB, p string, files map[string][]byte) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(files[n])), Typeflag: tar.TypeReg})
		tw.Write(files[n])
	}
	tw.Close()
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// dockerSave writes the legacy `docker save` layout.
func dockerSave(t *testing.T) string {
	cfg, _ := json.Marshal(config)
	ls := layers(t, false)
	files := map[string][]byte{"cfg.json": cfg, "l1/layer.tar": ls[0], "l2/layer.tar": ls[1]}
	files["manifest.json"], _ = json.Marshal([]map[string]any{{"Config": "cfg.json", "RepoTags": []string{"x:1"}, "Layers": []string{"l1/layer.tar", "l2/layer.tar"}}})
	p := filepath.Join(t.TempDir(), "save.tar")
	writeTar(t, p, files)
	return p
}

// ociLayout writes an OCI image layout directory (gzip layers).
func ociLayout(t *testing.T) string {
	dir := t.TempDir()
	blob := func(b []byte, mt string) ocispec.Descriptor {
		d := digest.FromBytes(b)
		p := filepath.Join(dir, "blobs", "sha256", d.Encoded())
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return ocispec.Descriptor{MediaType: mt, Digest: d, Size: int64(len(b))}
	}
	cfg, _ := json.Marshal(config)
	m := ocispec.Manifest{MediaType: ocispec.MediaTypeImageManifest, Config: blob(cfg, ocispec.MediaTypeImageConfig)}
	m.SchemaVersion = 2
	for _, l := range layers(t, true) {
		m.Layers = append(m.Layers, blob(l, ocispec.MediaTypeImageLayerGzip))
	}
	mb, _ := json.Marshal(m)
	idx := ocispec.Index{MediaType: ocispec.MediaTypeImageIndex, Manifests: []ocispec.Descriptor{blob(mb, ocispec.MediaTypeImageManifest)}}
	idx.SchemaVersion = 2
	ib, _ := json.Marshal(idx)
	os.WriteFile(filepath.Join(dir, "index.json"), ib, 0o644)
	os.WriteFile(filepath.Join(dir, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644)
	return dir
}

func TestUnpack(t *testing.T) {
	for name, src := range map[string]func(*testing.T) string{
		"docker save": dockerSave,
		"oci layout":  ociLayout,
		"oci tar": func(t *testing.T) string {
			dir := ociLayout(t)
			files := map[string][]byte{}
			filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
				if err == nil && !d.IsDir() {
					b, _ := os.ReadFile(p)
					rel, _ := filepath.Rel(dir, p)
					files[rel] = b
				}
				return nil
			})
			p := filepath.Join(t.TempDir(), "oci.tar")
			writeTar(t, p, files)
			return p
		},
	} {
		t.Run(name, func(t *testing.T) {
			base := t.TempDir()
			dst := filepath.Join(base, "a", "rootfs")
			img, err := Unpack(context.Background(), src(t), dst)
			if err != nil {
				t.Fatal(err)
			}
			if img.Labels["com.nvidia.volumes.needed"] != "nvidia_driver" || !slices.Equal(img.Env, []string{"PATH=/bin"}) || !slices.Equal(img.Cmd, []string{"/bin/probe"}) {
				t.Errorf("image config %+v", img)
			}
			var got []string
			filepath.WalkDir(dst, func(p string, d os.DirEntry, err error) error {
				if rel, _ := filepath.Rel(dst, p); rel != "." {
					got = append(got, rel)
				}
				return nil
			})
			want := []string{"bin", "bin/link", "bin/probe", "escape", "etc", "opaque", "opaque/new", "outside"}
			if !slices.Equal(got, want) {
				t.Errorf("unpacked %q, want %q", got, want)
			}
			if b, _ := os.ReadFile(filepath.Join(dst, "bin/link")); string(b) != "probe" {
				t.Errorf("bin/link holds %q", b)
			}
			if _, err := os.Stat(filepath.Join(base, "outside")); err == nil {
				t.Error("an entry was written outside the destination")
			}
			if _, err := Unpack(context.Background(), src(t), dst); !errors.Is(err, ErrNotEmpty) {
				t.Errorf("Unpack into a full directory = %v, want ErrNotEmpty", err)
			}
		})
	}
}

func TestUnpackNotAnImage(t *testing.T) {
	dir := t.TempDir()
	if _, err := Unpack(context.Background(), dir, filepath.Join(t.TempDir(), "r")); !errors.Is(err, ErrFormat) {
		t.Errorf("Unpack(empty dir) = %v, want ErrFormat", err)
	}
	if _, err := Unpack(context.Background(), filepath.Join(dir, "missing"), filepath.Join(t.TempDir(), "r")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Unpack(missing) = %v, want ErrNotExist", err)
	}
}
