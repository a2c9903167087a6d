package testenv

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// LayerEntry is a file of a test image's one layer: a regular file (body,
// mode), a directory (name ending in "/"), a symlink (link), or a file of
// size zero bytes declared without a body (a bomb).
type LayerEntry struct {
	Name, Link string // Link: a symlink to it
	Body       []byte
	Mode       int64
	Size       int64 // declared size when Body is nil (a bomb)
}

// OCILayout writes an OCI image layout of one gzip layer holding entries,
// with cfg as its configuration, and returns its directory.
func OCILayout(tb testing.TB, cfg ocispec.ImageConfig, entries []LayerEntry) string {
	tb.Helper()
	dir := tb.TempDir()
	blob := func(b []byte) ocispec.Descriptor {
		d := digest.FromBytes(b)
		p := filepath.Join(dir, "blobs", "sha256", d.Encoded())
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			tb.Fatal(err)
		}
		return ocispec.Descriptor{Digest: d, Size: int64(len(b))}
	}
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, e := range entries {
		h := &tar.Header{Name: e.Name, Mode: e.Mode, Typeflag: tar.TypeReg, Size: int64(len(e.Body))}
		switch {
		case e.Link != "":
			h = &tar.Header{Name: e.Name, Linkname: e.Link, Typeflag: tar.TypeSymlink, Mode: 0o777}
		case strings.HasSuffix(e.Name, "/"):
			h = &tar.Header{Name: e.Name, Typeflag: tar.TypeDir, Mode: 0o755}
		case e.Body == nil:
			h.Size = e.Size
		}
		if err := tw.WriteHeader(h); err != nil {
			tb.Fatal(err)
		}
		if e.Body == nil && e.Size > 0 {
			zeros := make([]byte, 1<<20)
			for left := e.Size; left > 0; left -= int64(len(zeros)) {
				if _, err := tw.Write(zeros[:min(left, int64(len(zeros)))]); err != nil {
					tb.Fatal(err)
				}
			}
		} else if _, err := tw.Write(e.Body); err != nil {
			tb.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		tb.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(raw.Bytes())
	zw.Close()
	layer := blob(gz.Bytes())
	layer.MediaType = ocispec.MediaTypeImageLayerGzip
	img := ocispec.Image{Config: cfg, RootFS: ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{digest.FromBytes(raw.Bytes())}}}
	img.OS, img.Architecture = "linux", "amd64"
	cb, _ := json.Marshal(img)
	config := blob(cb)
	config.MediaType = ocispec.MediaTypeImageConfig
	mb, _ := json.Marshal(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest, Config: config, Layers: []ocispec.Descriptor{layer}})
	manifest := blob(mb)
	manifest.MediaType = ocispec.MediaTypeImageManifest
	ib, _ := json.Marshal(ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex, Manifests: []ocispec.Descriptor{manifest}})
	if err := os.WriteFile(filepath.Join(dir, "index.json"), ib, 0o644); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ocispec.ImageLayoutFile), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644); err != nil {
		tb.Fatal(err)
	}
	return dir
}
