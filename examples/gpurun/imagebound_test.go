package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/gpuiso/gpuiso/internal/testenv"
	"github.com/gpuiso/gpuiso/volume"
)

// layoutEntry is a file of a test image's one layer.
type layoutEntry struct {
	name, link string // link: a symlink to it
	body       []byte
	mode       int64
	size       int64 // declared size when body is nil (a bomb)
}

// ociLayout writes an OCI image layout of one gzip layer holding entries,
// with cfg as its configuration, and returns its directory.
func ociLayout(t *testing.T, cfg ocispec.ImageConfig, entries []layoutEntry) string {
	t.Helper()
	dir := t.TempDir()
	blob := func(b []byte) ocispec.Descriptor {
		d := digest.FromBytes(b)
		p := filepath.Join(dir, "blobs", "sha256", d.Encoded())
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return ocispec.Descriptor{Digest: d, Size: int64(len(b))}
	}
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Typeflag: tar.TypeReg, Size: int64(len(e.body))}
		switch {
		case e.link != "":
			h = &tar.Header{Name: e.name, Linkname: e.link, Typeflag: tar.TypeSymlink, Mode: 0o777}
		case strings.HasSuffix(e.name, "/"):
			h = &tar.Header{Name: e.name, Typeflag: tar.TypeDir, Mode: 0o755}
		case e.body == nil:
			h.Size = e.size
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.body == nil && e.size > 0 {
			zeros := make([]byte, 1<<20)
			for left := e.size; left > 0; left -= int64(len(zeros)) {
				if _, err := tw.Write(zeros[:min(left, int64(len(zeros)))]); err != nil {
					t.Fatal(err)
				}
			}
		} else if _, err := tw.Write(e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
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
	mb, _ := json.Marshal(ocispec.Manifest{Versioned: ocispecVersioned(), MediaType: ocispec.MediaTypeImageManifest, Config: config, Layers: []ocispec.Descriptor{layer}})
	manifest := blob(mb)
	manifest.MediaType = ocispec.MediaTypeImageManifest
	ib, _ := json.Marshal(ocispec.Index{Versioned: ocispecVersioned(), MediaType: ocispec.MediaTypeImageIndex, Manifests: []ocispec.Descriptor{manifest}})
	if err := os.WriteFile(filepath.Join(dir, "index.json"), ib, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ocispec.ImageLayoutFile), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestImageBoundary runs hostile and configured images through gpurun
// --image: a USER is honoured (and --user overrides it), a mount point
// behind a link out of the image makes nothing on the host, and an archive
// past the limits is refused in one line, leaving nothing.
func TestImageBoundary(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCgroupV1Devices(t)
	testenv.RequireNVIDIALibraries(t)
	probe, err := os.ReadFile(testenv.BuildProbe(t))
	if err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(t.TempDir(), "outside") // absent: nothing may make it
	files := []layoutEntry{{name: "probe", body: probe, mode: 0o755}, {name: "usr/", mode: 0o755}, {name: "usr/local", link: outside}}
	cfg := ocispec.ImageConfig{User: "65534:65534", WorkingDir: "/work", Entrypoint: []string{"/probe"},
		Labels: map[string]string{volume.LabelVolumesNeeded: "nvidia_driver"}}
	image := ociLayout(t, cfg, files)

	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	run := func(args ...string) (string, string, int) {
		return gpurun(append([]string{"--simulate", "dgx1-volta", "--gpus", "1", "--quiet", "--image", image}, args...)...)
	}
	out, errOut, code := run("--", "do", "status", "--", "cwd", "--", "ls", "/usr/local/nvidia")
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{"Uid:\t65534\t65534\t65534\t65534", "Gid:\t65534\t65534\t65534\t65534", "cwd /work", "bin"} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("the image's USER, WORKDIR or volume through the link: no %q in\n%s", want, out)
		}
	}
	if _, err := os.Lstat(outside); err == nil {
		t.Errorf("gpurun --image made %s on the host, through the image's usr/local link", outside)
	}
	out, errOut, code = run("--user", "0:0", "--", "do", "status")
	if code != 0 || !strings.Contains(out, "Uid:\t0\t0\t0\t0\n") {
		t.Errorf("--user 0:0 does not override the image's USER: exit %d\n%s%s", code, out, errOut)
	}
	if _, errOut, code := run("--user", "4294967295", "--", "true"); code != 125 || strings.Count(errOut, "\n") != 1 {
		t.Errorf("--user 4294967295: exit %d, %q; want 125 and one line", code, errOut)
	}

	bomb := ociLayout(t, cfg, []layoutEntry{{name: "probe", body: probe, mode: 0o755}, {name: "big", size: 64 << 20, mode: 0o644}})
	before, _ := os.ReadDir(tmp)
	_, errOut, code = gpurun("--simulate", "dgx1-volta", "--gpus", "1", "--quiet", "--image", bomb, "--max-image-bytes", "1048576", "--", "true")
	if code != 125 || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "limit") {
		t.Errorf("an image past --max-image-bytes: exit %d, %q; want 125 and one line naming the limit", code, errOut)
	}
	if after, _ := os.ReadDir(tmp); len(after) != len(before) {
		t.Errorf("a refused image left %d entries in TMPDIR (had %d)", len(after), len(before))
	}
	// The run's tree and the unpacker's scratch live under the state
	// directory, named for the run (this process).
	trees, _ := os.ReadDir(filepath.Join(defaultStateDir, "native"))
	for _, e := range trees {
		if strings.Contains(e.Name(), fmt.Sprintf("-%d.", os.Getpid())) {
			t.Errorf("a refused image left %s in the state directory", e.Name())
		}
	}
}

func ocispecVersioned() specs.Versioned { return specs.Versioned{SchemaVersion: 2} }
