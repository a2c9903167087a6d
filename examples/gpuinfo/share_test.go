package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// TestShares: while gpurun runs a command in a memory share (and another
// in a time slice), gpuinfo lists both under the GPU they hold, the memory
// share with its MPS daemon; once the runs end, nothing is listed and no
// daemon, daemon directory or allocation is left.
func TestShares(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCgroupV2(t)
	testenv.RequireSimulatedMPS(t)
	bin := filepath.Join(t.TempDir(), "gpurun")
	if b, err := exec.Command("go", "build", "-buildvcs=false", "-o", bin, "github.com/gpuiso/gpuiso/examples/gpurun").CombinedOutput(); err != nil {
		t.Fatalf("build gpurun: %v\n%s", err, b)
	}
	dir := t.TempDir()
	t.Cleanup(func() { killDaemons(dir) }) // what a failure left
	wait := "while [ ! -e /dev/shm/done ]; do sleep 0.02; done"
	mem := exec.Command(bin, "--simulate", "dgx1-volta", "--state-dir", dir, "--cgroup", "v2", "--gpu-memory", "4GiB", "--", "sh", "-c", "env | grep CUDA_MPS; "+wait)
	slice := exec.Command(bin, "--simulate", "dgx1-volta", "--state-dir", dir, "--cgroup", "v2", "--gpu-time-slice", "--", "sleep", "30")
	var memOut testenv.Buffer
	mem.Stdout, mem.Stderr = &memOut, &memOut
	for _, c := range []*exec.Cmd{mem, slice} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
	}
	defer slice.Process.Kill()
	defer mem.Process.Kill()
	// gpuinfo meanwhile: the share, its daemon, the time slice.
	owner := "gpurun-" + strconv.Itoa(mem.Process.Pid)
	var out string
	for i := 0; ; i++ {
		o, errOut, code := gpuinfo(t, "--simulate", "dgx1-volta", "--state-dir", dir)
		if code != 0 {
			t.Fatalf("gpuinfo: exit %d: %s", code, errOut)
		}
		out = o
		if strings.Contains(out, owner) && strings.Contains(out, "time slice") && strings.Contains(out, "(running)") {
			break
		}
		if i > 2000 {
			t.Fatalf("gpuinfo never listed both shares:\n%s\n%s", out, memOut.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	row := regexp.MustCompile(`(?m)^\s+\d+\s+` + owner + `\s+4 GiB\s+MPS daemon (\d+) \(running\), ` + regexp.QuoteMeta(dir) + `/mps/` + owner + `/pipe$`).FindStringSubmatch(out)
	if row == nil {
		t.Fatalf("no row of the memory share with its daemon in\n%s", out)
	}
	if !regexp.MustCompile(`(?m)^\s+\d+\s+gpurun-\d+\s+time slice\s+nothing: time slices isolate nothing$`).MatchString(out) {
		t.Fatalf("no row of the time slice in\n%s", out)
	}
	// Let the share's command go: it waits for its daemon's /dev/shm.
	if err := os.WriteFile(filepath.Join(dir, "mps", owner, "shm", "done"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := mem.Wait(); err != nil {
		t.Fatalf("gpurun: %v\n%s", err, memOut.String())
	}
	if !strings.Contains(memOut.String(), "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps") {
		t.Fatalf("the share's command saw no MPS daemon:\n%s", memOut.String())
	}
	slice.Process.Signal(syscall.SIGTERM)
	slice.Wait()
	out, _, _ = gpuinfo(t, "--simulate", "dgx1-volta", "--state-dir", dir)
	if strings.Contains(out, "Shares") {
		t.Fatalf("shares listed after the runs:\n%s", out)
	}
	if entries, _ := os.ReadDir(filepath.Join(dir, "mps")); len(entries) != 1 {
		t.Fatalf("the daemons' directory holds %v after the runs", entries)
	}
	if _, err := os.Stat("/proc/" + row[1]); err == nil {
		t.Fatalf("daemon %s runs after the runs", row[1])
	}
}

// killDaemons kills the MPS processes whose mounts come from under dir.
func killDaemons(dir string) {
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		comm, err := os.ReadFile(filepath.Join("/proc", p.Name(), "comm"))
		if err != nil || !strings.HasPrefix(string(comm), "nvidia-cuda-mps") {
			continue
		}
		mi, err := os.ReadFile(filepath.Join("/proc", p.Name(), "mountinfo"))
		if pid, perr := strconv.Atoi(p.Name()); err == nil && perr == nil && strings.Contains(string(mi), dir+"/") {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
