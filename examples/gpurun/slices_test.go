package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/internal/cli"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/mps"
)

// TestSliceUsage: --gpu-slices refuses what it cannot mean, before
// anything runs.
func TestSliceUsage(t *testing.T) {
	for name, args := range map[string][]string{
		"one slice":          {"--gpu-slices", "1", "--", "true"},
		"too many":           {"--gpu-slices", "49", "--", "true"},
		"slices and memory":  {"--gpu-slices", "4", "--gpu-memory", "1G", "--", "true"},
		"slices and time":    {"--gpu-slices", "4", "--gpu-time-slice", "--", "true"},
		"slices of two GPUs": {"--gpu-slices", "4", "--gpus", "2", "--", "true"},
	} {
		_, errOut, code := gpurun(args...)
		if code != exitFailed || !strings.Contains(errOut, "see gpurun --help") || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%s: exit %d, %q", name, code, errOut)
		}
	}
}

var (
	daemonPid = regexp.MustCompile(`held by MPS daemon (\d+)`)
	gpuLine   = regexp.MustCompile(`(?m)^gpu=(\S+)$`)
)

// TestSlicesRun: two slices of 4 of one GPU run at once, under one MPS
// daemon whose default limits, read from it, are a quarter of the GPU and
// whose pipe directory both see; a memory share asked beside them goes to
// another GPU; once all have ended no daemon, directory or allocation is
// left.
func TestSlicesRun(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCgroupV2(t)
	testenv.RequireSimulatedMPS(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	t.Cleanup(func() { killDaemons(dir) })
	// The first slice, a process of its own, holds its container until
	// its stdin closes.
	first := exec.Command(exe, "--simulate", "dgx1-volta", "--state-dir", dir, "--gpu-slices", "4", "--",
		"sh", "-c", `echo gpu=$NVIDIA_VISIBLE_DEVICES; env | grep CUDA_MPS | sort; ls /tmp/nvidia-mps; echo ready; read x || true`)
	first.Env = append(os.Environ(), asGpurunEnv+"=1")
	stdin, err := first.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := first.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var firstErr testenv.Buffer
	first.Stderr = &firstErr
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		first.Wait()
	}()
	var firstOut strings.Builder
	for sc := bufio.NewScanner(stdout); sc.Scan(); {
		firstOut.WriteString(sc.Text() + "\n")
		if sc.Text() == "ready" {
			break
		}
	}
	if !strings.Contains(firstOut.String(), "ready\n") {
		t.Fatalf("first slice: %s%s", firstOut.String(), firstErr.String())
	}
	// The second slice runs while the first holds its container.
	out, errOut, code := gpurun("--simulate", "dgx1-volta", "--state-dir", dir, "--gpu-slices", "4", "--",
		"sh", "-c", `echo gpu=$NVIDIA_VISIBLE_DEVICES; env | grep CUDA_MPS | sort; ls /tmp/nvidia-mps`)
	if code != 0 {
		t.Fatalf("second slice: exit %d: %s%s", code, out, errOut)
	}
	p1, p2 := daemonPid.FindStringSubmatch(firstErr.String()), daemonPid.FindStringSubmatch(errOut)
	if p1 == nil || p2 == nil || p1[1] != p2[1] {
		t.Fatalf("daemons of the two slices: %q and %q, want one", firstErr.String(), errOut)
	}
	g1, g2 := gpuLine.FindStringSubmatch(firstOut.String()), gpuLine.FindStringSubmatch(out)
	if g1 == nil || g2 == nil || g1[1] != g2[1] {
		t.Fatalf("gpus of the two slices: %q and %q, want one", firstOut.String(), out)
	}
	m, err := mps.New(filepath.Join(dir, "mps"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ds, err := m.List(context.Background())
	if err != nil || len(ds) != 1 || ds[0].Owner != mps.SliceOwner(g1[1]) || !ds[0].Alive {
		t.Fatalf("daemons while a slice runs: %+v, %v; want the one of %s", ds, err, mps.SliceOwner(g1[1]))
	}
	held, err := m.Held(context.Background(), ds[0].Owner)
	if err != nil {
		t.Fatal(err)
	}
	quarter := gpuMemory(t, dir, g1[1]) >> 20 / 4
	if held.ComputePercent != 25 || !held.MemorySet || held.MemoryMinMiB > quarter || held.MemoryMaxMiB < quarter {
		t.Fatalf("the daemon holds %+v, want %d MiB and 25%% (a quarter of the GPU)", held, quarter)
	}
	for _, o := range []string{firstOut.String(), out} {
		for _, want := range []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25\n", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps\n", "control\n"} {
			if !strings.Contains(o, want) {
				t.Errorf("a slice's output lacks %q:\n%s", want, o)
			}
		}
	}
	// A memory share beside them: another GPU, a daemon of its own.
	out, errOut, code = gpurun("--simulate", "dgx1-volta", "--state-dir", dir, "--gpu-memory", "1GiB", "--", "sh", "-c", "echo gpu=$NVIDIA_VISIBLE_DEVICES")
	g3 := gpuLine.FindStringSubmatch(out)
	if code != 0 || g3 == nil || g3[1] == g1[1] {
		t.Fatalf("memory share beside the slices: exit %d, %q, %s; want a gpu other than %s", code, out, errOut, g1[1])
	}
	if p3 := daemonPid.FindStringSubmatch(errOut); p3 == nil || p3[1] == p1[1] {
		t.Fatalf("memory share's daemon: %s, want one of its own", errOut)
	}
	stdin.Close()
	if err := first.Wait(); err != nil {
		t.Fatalf("first slice: %v: %s", err, firstErr.String())
	}
	sharesLeft(t, dir)
}

// gpuMemory is the memory of the simulated GPU uuid of gpurun's state
// directory dir, as gpurun's node has it.
func gpuMemory(t *testing.T, dir, uuid string) uint64 {
	t.Helper()
	nd, err := cli.OpenSharedNode(context.Background(), "dgx1-volta", filepath.Join(dir, "sim", "dgx1-volta"))
	if err != nil {
		t.Fatal(err)
	}
	defer nd.Close()
	for _, d := range nd.Inventory.Devices {
		if d.UUID == uuid {
			return d.MemoryBytes
		}
	}
	t.Fatalf("no gpu %s", uuid)
	return 0
}
