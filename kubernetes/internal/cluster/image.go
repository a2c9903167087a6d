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
// into every node's containerd (namespace k8s.io), where the kubelets find
// it (pods use imagePullPolicy: Never).
func (c *Cluster) ImportImage(ctx context.Context, ref, program string, args []string) error {
	for _, n := range c.Nodes {
		if err := c.ImportImageOn(ctx, n, ref, program, args); err != nil {
			return err
		}
	}
	return nil
}

// ImportImageOn is ImportImage on node n alone.
func (c *Cluster) ImportImageOn(ctx context.Context, n *Node, ref, program string, args []string) error {
	archive, err := imageArchive(ref, program, args)
	if err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	return c.ImportArchive(ctx, n, ref, archive)
}

// ImportArchive imports an OCI image archive (an image layout as a tar
// stream) into node n's containerd, or every node's when n is nil.
func (c *Cluster) ImportArchive(ctx context.Context, n *Node, ref string, archive []byte) error {
	nodes := c.Nodes
	if n != nil {
		nodes = []*Node{n}
	}
	for _, n := range nodes {
		if _, err := c.CtrOn(ctx, n, archive, "images", "import", "--local", "-"); err != nil {
			return fmt.Errorf("image %s on node %s: %w", ref, n.Name, err)
		}
	}
	return nil
}

// imageArchive is an OCI image layout as a tar archive, its one manifest
// annotated with ref: the static program at /<its base name>, its
// entrypoint with args.
func imageArchive(ref, program string, args []string) ([]byte, error) {
	body, err := os.ReadFile(program)
	if err != nil {
		return nil, err
	}
	name := filepath.Base(program)
	return ociArchive(ref, []imageFile{{Path: name, Mode: 0o755, Body: body}},
		ocispec.ImageConfig{Entrypoint: append([]string{"/" + name}, args...)})
}

// imageFile is a file of an image's one layer.
type imageFile struct {
	Path string // relative to the image's root
	Mode int64
	Body []byte
}

// ociArchive is an OCI image layout as a tar archive: one layer of files,
// the configuration cfg, its one manifest annotated with ref.
func ociArchive(ref string, files []imageFile, cfg ocispec.ImageConfig) ([]byte, error) {
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	dirs := map[string]bool{}
	for _, f := range files {
		// Parent directories first, each once.
		var parents []string
		for d := filepath.Dir(f.Path); d != "." && d != "/" && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if err := tw.WriteHeader(&tar.Header{Name: d + "/", Mode: 0o755, Typeflag: tar.TypeDir}); err != nil {
				return nil, err
			}
		}
		if err := tw.WriteHeader(&tar.Header{Name: f.Path, Mode: f.Mode, Size: int64(len(f.Body)), Typeflag: tar.TypeReg}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.Body); err != nil {
			return nil, err
		}
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
		Config:   cfg,
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
