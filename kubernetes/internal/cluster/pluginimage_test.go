package cluster

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// TestPluginImageArchive: the image of a dynamic program holds the
// program, its interpreter, libc and what NVML needs, and runs the
// program as root; the archive is an OCI layout naming the image.
func TestPluginImageArchive(t *testing.T) {
	program := "/bin/true" // dynamic on every glibc host
	if _, err := os.Stat(program); err != nil {
		t.Skip("no /bin/true")
	}
	archive, err := PluginImageArchive("gpuiso.test/plugin:1", program)
	if err != nil {
		t.Fatal(err)
	}
	blobs := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(archive))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		blobs[h.Name] = b
	}
	var index ocispec.Index
	if err := json.Unmarshal(blobs["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json: %v, %+v", err, index)
	}
	if got := index.Manifests[0].Annotations["io.containerd.image.name"]; got != "gpuiso.test/plugin:1" {
		t.Errorf("image name %q", got)
	}
	var m ocispec.Manifest
	json.Unmarshal(blobs["blobs/sha256/"+index.Manifests[0].Digest.Encoded()], &m)
	var img ocispec.Image
	json.Unmarshal(blobs["blobs/sha256/"+m.Config.Digest.Encoded()], &img)
	if !slices.Equal(img.Config.Entrypoint, []string{PluginProgram}) || img.Config.User != "0" {
		t.Errorf("config %+v", img.Config)
	}
	zr, err := gzip.NewReader(bytes.NewReader(blobs["blobs/sha256/"+m.Layers[0].Digest.Encoded()]))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	lr := tar.NewReader(zr)
	for {
		h, err := lr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			names = append(names, filepath.Base(h.Name))
		}
	}
	for _, want := range append([]string{"gpuiso-kubelet-plugin", "libc.so.6"}, nvmlNeeds...) {
		if !slices.Contains(names, want) {
			t.Errorf("the image has no %s: %v", want, names)
		}
	}
	if !slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, "ld-linux") }) {
		t.Errorf("the image has no dynamic linker: %v", names)
	}
}
