package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/volume"
)

func dockerrun(args ...string) (stdout, stderr string, code int) {
	var out, errOut testenv.Buffer
	code = run(context.Background(), args, &out, &errOut)
	return out.String(), errOut.String(), code
}

// TestUsage: a bad command line is dockerrun's own error (125, as docker
// run's) in one line; --help alone prints the usage.
func TestUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"--gpus"}, {"--bogus", "img"}, {"--gpus", "2", "--devices", "1,3", "img"}} {
		if _, errOut, code := dockerrun(args...); code != exitFailed || strings.Count(errOut, "\n") != 1 {
			t.Errorf("dockerrun %q: exit %d, stderr %q; want %d and one line", args, code, errOut, exitFailed)
		}
	}
	if out, errOut, code := dockerrun("--help"); code != 0 || !strings.HasPrefix(out, "usage: dockerrun") || errOut != "" {
		t.Errorf("--help: exit %d, stderr %q", code, errOut)
	}
}

// TestSimulated runs an nvidia-docker image on GPUs 1 and 3 of a simulated
// DGX-1: it sees exactly those GPU nodes (ENXIO: allowed, no hardware), the
// driver volume, and dockerrun exits with its status after one line saying
// what it got.
func TestSimulated(t *testing.T) {
	testenv.RequireRoot(t)
	cli := testenv.RequireDocker(t)
	testenv.RequireNVIDIALibraries(t)
	testenv.LockDocker(t, false)
	img := testenv.BuildProbeImage(t, cli, testenv.ProbeImage{Labels: map[string]string{volume.LabelVolumesNeeded: "nvidia_driver"}})

	var nodes []string
	for i := range 8 {
		nodes = append(nodes, fmt.Sprintf("/dev/nvidia%d", i))
	}
	out, errOut, code := dockerrun(append([]string{"--simulate", "dgx1-volta", "--devices", "1,3", img, "open"}, nodes...)...)
	if code != 0 {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	for i, p := range nodes {
		want := "ENOENT"
		if i == 1 || i == 3 {
			want = "ENXIO"
		}
		if !strings.Contains(out, p+" "+want+"\n") {
			t.Errorf("want %s %s in the container's output:\n%s", p, want, out)
		}
	}
	info := strings.Split(strings.TrimSpace(errOut), "\n")
	if len(info) != 1 || !strings.HasPrefix(info[0], "dockerrun: GPUs 1,3 (") || !strings.Contains(info[0], "simulated dgx1-volta") || !strings.Contains(info[0], "at /usr/local/nvidia") {
		t.Fatalf("stderr = %q, want one line naming GPUs 1,3 and the volume", errOut)
	}

	out, _, code = dockerrun("--simulate", "pcie8", "--gpus", "2", "--quiet", img, "write", "/usr/local/nvidia/x")
	if code != 0 || out != "/usr/local/nvidia/x EROFS\n" {
		t.Fatalf("write into the volume: exit %d, %q; want EROFS", code, out)
	}
	if _, errOut, code := dockerrun("--simulate", "pcie8", "--quiet", img, "exit", "7"); code != 7 || errOut != "" {
		t.Fatalf("exit 7: dockerrun exited %d, stderr %q", code, errOut)
	}
	if _, errOut, code := dockerrun("--simulate", "pcie8", "--gpus", "9", img, "exit", "0"); code != exitFailed || !strings.Contains(errOut, "9 GPUs") {
		t.Fatalf("9 GPUs on an 8-GPU node: exit %d, stderr %q", code, errOut)
	}
}

// TestRequirementUnmet: an image needing a newer CUDA than the driver's is
// refused before it runs, with one line naming the requirement.
func TestRequirementUnmet(t *testing.T) {
	testenv.RequireRoot(t)
	cli := testenv.RequireDocker(t)
	testenv.RequireNVIDIALibraries(t)
	testenv.LockDocker(t, false)
	img := testenv.BuildProbeImage(t, cli, testenv.ProbeImage{Env: map[string]string{volume.EnvRequireCUDA: "cuda>=99.0"}})
	out, errOut, code := dockerrun("--simulate", "pcie8", img, "exit", "0")
	if code != exitFailed || out != "" || !strings.Contains(errOut, `NVIDIA_REQUIRE_CUDA "cuda>=99.0" unmet`) || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("exit %d, stdout %q, stderr %q; want %d and one line naming the requirement", code, out, errOut, exitFailed)
	}
}
