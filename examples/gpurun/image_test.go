package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/volume"
)

// TestImage runs the static probe from unpacked images: the container sees
// exactly its 2 GPUs, the driver volume read-only at /usr/local/nvidia for a
// labelled image and none for an unlabelled one, and none of the host's
// files.
func TestImage(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireNVIDIALibraries(t)
	cli := testenv.RequireDocker(t)
	testenv.LockDocker(t, false)
	marker := filepath.Join(t.TempDir(), "host-only")
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, labelled := range []bool{true, false} {
		img := testenv.ProbeImage{}
		if labelled {
			img.Labels = map[string]string{volume.LabelVolumesNeeded: "nvidia_driver"}
		}
		archive := saveImage(t, cli, testenv.BuildProbeImage(t, cli, img))
		out, errOut, code := gpurun("--simulate", "dgx1-volta", "--gpus", "2", "--image", archive, "--",
			"do", "ls", "/dev", "--", "ls", "/usr/local/nvidia", "--", "write", "/usr/local/nvidia/x", "--", "open", marker, "/etc/hostname")
		if code != 0 {
			t.Fatalf("labelled %v: exit %d\nstdout: %s\nstderr: %s", labelled, code, out, errOut)
		}
		var gpus []string
		for l := range strings.Lines(out) {
			if name := strings.TrimSpace(l); strings.HasPrefix(name, "nvidia") && strings.Trim(name[len("nvidia"):], "0123456789") == "" {
				gpus = append(gpus, name)
			}
		}
		if len(gpus) != 2 {
			t.Errorf("labelled %v: GPU nodes %v, want 2", labelled, gpus)
		}
		for _, want := range []string{marker + " ENOENT", "/etc/hostname ENOENT"} {
			if !strings.Contains(out, want+"\n") {
				t.Errorf("labelled %v: a host file is visible (want %q):\n%s", labelled, want, out)
			}
		}
		if labelled {
			if !strings.Contains(out, "bin\n") || !strings.Contains(out, "/usr/local/nvidia/x EROFS\n") {
				t.Errorf("labelled: no read-only volume at /usr/local/nvidia:\n%s", out)
			}
		} else if !strings.Contains(out, "/usr/local/nvidia ENOENT\n") {
			t.Errorf("unlabelled: /usr/local/nvidia exists:\n%s", out)
		}
	}
}

// saveImage writes `docker save` of tag to a file and returns its path.
func saveImage(t *testing.T, cli *client.Client, tag string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cli.ImageSave(ctx, []string{tag})
	if err != nil {
		t.Fatal(err)
	}
	defer res.Close()
	path := filepath.Join(t.TempDir(), "image.tar")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := io.Copy(f, res); err != nil {
		t.Fatal(err)
	}
	return path
}
