package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/volume"
)

// TestImageBoundary runs hostile and configured images through gpurun
// --image: a USER is honoured (and --user overrides it), a mount point
// behind a link out of the image makes nothing on the host, and an archive
// past the limits is refused in one line, leaving nothing.
func TestImageBoundary(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireDeviceCgroup(t)
	testenv.RequireNVIDIALibraries(t)
	probe, err := os.ReadFile(testenv.BuildProbe(t))
	if err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(t.TempDir(), "outside") // absent: nothing may make it
	files := []testenv.LayerEntry{{Name: "probe", Body: probe, Mode: 0o755}, {Name: "usr/", Mode: 0o755}, {Name: "usr/local", Link: outside}}
	cfg := ocispec.ImageConfig{User: "65534:65534", WorkingDir: "/work", Entrypoint: []string{"/probe"},
		Labels: map[string]string{volume.LabelVolumesNeeded: "nvidia_driver"}}
	image := testenv.OCILayout(t, cfg, files)

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
			t.Errorf("the image's USER, WORKDIR or volume through the Link: no %q in\n%s", want, out)
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

	bomb := testenv.OCILayout(t, cfg, []testenv.LayerEntry{{Name: "probe", Body: probe, Mode: 0o755}, {Name: "big", Size: 64 << 20, Mode: 0o644}})
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
