package cluster

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// ImportImage makes an image named ref of one layer holding the static
// program at /<its base name>, its entrypoint with args, and imports it
// into containerd's k8s.io namespace, where the kubelet finds it (pods
// use imagePullPolicy: Never).
func (c *Cluster) ImportImage(ctx context.Context, ref, program string, args []string) error {
	archive, err := imageArchive(ref, program, args)
	if err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	if _, err := c.Ctr(ctx, archive, "images", "import", "--local", "-"); err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	return nil
}

// imageArchive is an OCI image layout as a tar archive, its one manifest
// annotated with ref.
func imageArchive(ref, program string, args []string) ([]byte, error) {
	body, err := os.ReadFile(program)
	if err != nil {
		return nil, err
	}
	name := filepath.Base(program)
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(body); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	if _, err := zw.Write(layer.Bytes()); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}

	var out bytes.Buffer
	ow := tar.NewWriter(&out)
	add := func(path string, b []byte) error {
		if err := ow.WriteHeader(&tar.Header{Name: path, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := ow.Write(b)
		return err
	}
	blob := func(mediaType string, b []byte) (ocispec.Descriptor, error) {
		d := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(b), Size: int64(len(b))}
		return d, add("blobs/sha256/"+d.Digest.Encoded(), b)
	}
	layerDesc, err := blob(ocispec.MediaTypeImageLayerGzip, gz.Bytes())
	if err != nil {
		return nil, err
	}
	img := ocispec.Image{
		Platform: ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH},
		Config:   ocispec.ImageConfig{Entrypoint: append([]string{"/" + name}, args...)},
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{digest.FromBytes(layer.Bytes())}},
	}
	cb, err := json.Marshal(img)
	if err != nil {
		return nil, err
	}
	configDesc, err := blob(ocispec.MediaTypeImageConfig, cb)
	if err != nil {
		return nil, err
	}
	mb, err := json.Marshal(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		Config: configDesc, Layers: []ocispec.Descriptor{layerDesc}})
	if err != nil {
		return nil, err
	}
	manifest, err := blob(ocispec.MediaTypeImageManifest, mb)
	if err != nil {
		return nil, err
	}
	manifest.Platform = &img.Platform
	manifest.Annotations = map[string]string{"io.containerd.image.name": ref}
	ib, err := json.Marshal(ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{manifest}})
	if err != nil {
		return nil, err
	}
	if err := add(ocispec.ImageLayoutFile, []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return nil, err
	}
	if err := add("index.json", ib); err != nil {
		return nil, err
	}
	if err := ow.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}
