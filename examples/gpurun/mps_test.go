package main

import (
	"bufio"
	"encoding/json"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// TestShareUsage: the share flags refuse what they cannot mean, before
// anything runs.
func TestShareUsage(t *testing.T) {
	for name, args := range map[string][]string{
		"compute alone":           {"--gpu-compute", "50", "--", "true"},
		"memory and time slice":   {"--gpu-memory", "1G", "--gpu-time-slice", "--", "true"},
		"share of two GPUs":       {"--gpu-memory", "1G", "--gpus", "2", "--", "true"},
		"no size":                 {"--gpu-memory", "lots", "--", "true"},
		"compute over 100":        {"--gpu-memory", "1G", "--gpu-compute", "101", "--", "true"},
		"a fraction of a GiB":     {"--gpu-memory", "1.5G", "--", "true"},
		"compute of a time slice": {"--gpu-time-slice", "--gpu-compute", "5", "--", "true"},
	} {
		_, errOut, code := gpurun(args...)
		if code != exitFailed || !strings.Contains(errOut, "see gpurun --help") || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%s: exit %d, %q", name, code, errOut)
		}
	}
}

// TestShareRun: a memory share's command sees its MPS daemon (the pipe
// directory, its limits in the environment) and runs beside a time slice
// of another GPU; afterwards no daemon, directory or allocation is left.
func TestShareRun(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCgroupV2(t)
	testenv.RequireSimulatedMPS(t)
	dir := t.TempDir()
	t.Cleanup(func() { killDaemons(dir) })
	out, errOut, code := gpurun("--simulate", "dgx1-volta", "--state-dir", dir, "--gpu-memory", "4GiB", "--gpu-compute", "25", "--",
		"sh", "-c", "env | grep CUDA_MPS | sort; ls /tmp/nvidia-mps")
	if code != 0 {
		t.Fatalf("exit %d: %s%s", code, out, errOut)
	}
	for _, want := range []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25\n", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M\n", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps\n", "control\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(errOut, "a share of 4 GiB, 25% compute held by MPS daemon") {
		t.Errorf("gpurun's line: %s", errOut)
	}
	out, errOut, code = gpurun("--simulate", "dgx1-volta", "--state-dir", dir, "--gpu-time-slice", "--", "sh", "-c", "env | grep -c CUDA_MPS || true")
	if code != 0 || strings.TrimSpace(out) != "0" || !strings.Contains(errOut, "a time slice") {
		t.Fatalf("time slice: exit %d, %q, %s", code, out, errOut)
	}
	sharesLeft(t, dir)
}

// mpsOf lists the live MPS processes whose mounts come from under dir.
func mpsOf(dir string) []int {
	var out []int
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		comm, err := os.ReadFile(filepath.Join("/proc", p.Name(), "comm"))
		if err != nil || !strings.HasPrefix(string(comm), "nvidia-cuda-mps") {
			continue
		}
		if mi, err := os.ReadFile(filepath.Join("/proc", p.Name(), "mountinfo")); err == nil && strings.Contains(string(mi), dir+"/") {
			if pid, err := strconv.Atoi(p.Name()); err == nil {
				out = append(out, pid)
			}
		}
	}
	return out
}

// killDaemons kills what a failed test left of dir's MPS daemons.
func killDaemons(dir string) {
	for _, pid := range mpsOf(dir) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

// sharesLeft fails for what shares left in gpurun's state directory dir:
// a daemon's directory, a live MPS process of it, an allocation.
func sharesLeft(t *testing.T, dir string) {
	t.Helper()
	entries, _ := os.ReadDir(filepath.Join(dir, "mps"))
	for _, e := range entries {
		if e.IsDir() {
			t.Errorf("MPS daemon directory left: %s", e.Name())
		}
	}
	for _, pid := range mpsOf(dir) {
		t.Errorf("MPS process %d of the state directory is left", pid)
	}
	b, err := os.ReadFile(filepath.Join(dir, allocator.StateFile))
	if err != nil {
		t.Fatal(err)
	}
	var env struct {
		State struct {
			Owners []json.RawMessage `json:"owners"`
		} `json:"state"`
	}
	if err := json.Unmarshal(b, &env); err != nil || len(env.State.Owners) != 0 {
		t.Errorf("allocations left: %s (%v)", b, err)
	}
}

// TestKilledShareRuns: runs holding memory shares are SIGKILLed, four at a
// time, half once their container runs and half at a random point of their
// start (their daemon's start included); the next run leaves no daemon,
// daemon directory or allocation of theirs. GPUISO_SHARE_KILLS sets the
// kills (default 12).
func TestKilledShareRuns(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCgroupV2(t)
	testenv.RequireSimulatedMPS(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	t.Cleanup(func() { killDaemons(dir) })
	start := func(args ...string) *exec.Cmd {
		cmd := exec.Command(exe, append([]string{"--simulate", "dgx1-volta", "--state-dir", dir, "--cgroup", "v2", "--gpu-memory", "2GiB"}, args...)...)
		cmd.Env = append(os.Environ(), asGpurunEnv+"=1")
		return cmd
	}
	kills := envInt("GPUISO_SHARE_KILLS", 12)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 13))
	running := 0
	var mu sync.Mutex
	for k := 0; k < kills; k += 4 {
		var wg sync.WaitGroup
		for i := range min(4, kills-k) {
			cmd := start("--", "sleep", "30")
			lines, err := cmd.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			afterStart := (k+i)%2 == 1
			delay := time.Duration(rng.IntN(300)) * time.Millisecond
			wg.Go(func() {
				if afterStart {
					line, err := bufio.NewReader(lines).ReadString('\n')
					if err == nil && strings.Contains(line, "held by MPS daemon") {
						mu.Lock()
						running++
						mu.Unlock()
					}
				} else {
					time.Sleep(delay)
				}
				go io.Copy(io.Discard, lines)
				cmd.Process.Signal(syscall.SIGKILL)
				cmd.Wait()
			})
		}
		wg.Wait()
	}
	t.Logf("%d runs killed, %d of them once their container ran", kills, running)
	if running == 0 {
		t.Error("no run was killed while its container ran")
	}
	if out, err := start("--quiet", "--", "true").CombinedOutput(); err != nil {
		t.Fatalf("the run after the kills: %v: %s", err, out)
	}
	sharesLeft(t, dir)
	if entries, _ := os.ReadDir(filepath.Join(dir, "native")); len(entries) > 0 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("containers left: %s", strconv.Quote(strings.Join(names, " ")))
	}
}
