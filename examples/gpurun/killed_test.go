package main

import (
	"bufio"
	"encoding/json"
	"errors"
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

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/gpuiso/gpuiso/containerizer/native"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// killedRun is a gpurun process that was SIGKILLed, and what its container
// had: its init's pid, when known.
type killedRun struct {
	pid  int
	init int
}

// TestKilledDefaultRuns: gpurun without --state-dir (the default state
// directory) is SIGKILLed, four at a time, half once its container runs and
// half at a random point of its start; then one more run. Nothing of the
// killed runs is left: no container directory, cgroup, process, mount or
// temporary tree (the simulated node, the --image tree and the unpacker's
// scratch), in the state directory or in TMPDIR. GPUISO_DEFAULT_KILLS sets
// the kills of plain runs (default 10), GPUISO_IMAGE_KILLS of --image runs
// (default 20).
func TestKilledDefaultRuns(t *testing.T) {
	testenv.RequireRoot(t)
	v, mount := testenv.RequireDeviceCgroup(t)
	testenv.RequireNVIDIALibraries(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	probe, err := os.ReadFile(testenv.BuildProbe(t))
	if err != nil {
		t.Fatal(err)
	}
	image := testenv.OCILayout(t, ocispec.ImageConfig{Entrypoint: []string{"/probe"}}, []testenv.LayerEntry{{Name: "probe", Body: probe, Mode: 0o755}})
	tests := []struct {
		name  string
		kills int
		args  []string
	}{
		{"plain", envInt("GPUISO_DEFAULT_KILLS", 10), []string{"--", "sleep", "30"}},
		{"image", envInt("GPUISO_IMAGE_KILLS", 20), []string{"--image", image, "--", "sleep", "30"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmp := t.TempDir()
			gpurun := func(args ...string) *exec.Cmd {
				cmd := exec.Command(exe, append([]string{"--simulate", "dgx1-volta", "--gpus", "1", "--cgroup", v}, args...)...)
				cmd.Env = append(os.Environ(), asGpurunEnv+"=1", "TMPDIR="+tmp)
				return cmd
			}
			killed := killRuns(t, tt.kills, func() *exec.Cmd { return gpurun(tt.args...) })
			if out, err := gpurun("--quiet", "--", "/bin/true").CombinedOutput(); err != nil {
				t.Fatalf("the run after %d kills: %v: %s", tt.kills, err, out)
			}
			checkNothingLeft(t, killed, tmp, mount)
		})
	}
}

// killRuns starts runs, four at a time, and SIGKILLs each: the odd ones
// once their container runs, the even ones up to 450 ms into their start.
func killRuns(t *testing.T, kills int, start func() *exec.Cmd) []killedRun {
	t.Helper()
	const batch = 4
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 11))
	var mu sync.Mutex
	var killed []killedRun
	running := 0
	for k := 0; k < kills; k += batch {
		var wg sync.WaitGroup
		for i := range min(batch, kills-k) {
			cmd := start()
			afterStart := (k+i)%2 == 1
			lines, err := cmd.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			delay := time.Duration(rng.IntN(450)) * time.Millisecond
			wg.Add(1)
			go func() {
				defer wg.Done()
				run := killedRun{pid: cmd.Process.Pid}
				if afterStart {
					// gpurun's one line comes once the container runs.
					line, err := bufio.NewReader(lines).ReadString('\n')
					if err == nil && strings.HasPrefix(line, "gpurun: GPUs") {
						run.init = initOf(run.pid)
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
				mu.Lock()
				killed = append(killed, run)
				mu.Unlock()
			}()
		}
		wg.Wait()
	}
	t.Logf("%d runs killed, %d of them once their container ran", kills, running)
	if running == 0 {
		t.Error("no run was killed while its container ran")
	}
	return killed
}

// initOf reads the init's pid from the record of gpurun pid's container
// (a record store entry, whose process is the init; or, of version 1, its
// own pid field).
func initOf(pid int) int {
	var rec struct {
		Pid     int `json:"pid"`
		Process *struct {
			Pid int `json:"pid"`
		} `json:"process"`
	}
	b, err := os.ReadFile(filepath.Join(defaultStateDir, "native", "gpurun-"+strconv.Itoa(pid), "container.json"))
	if err != nil || json.Unmarshal(b, &rec) != nil {
		return 0
	}
	if rec.Process != nil {
		return rec.Process.Pid
	}
	return rec.Pid
}

// checkNothingLeft fails for anything of the killed runs that is left.
// mount is the device cgroup hierarchy's mount point.
func checkNothingLeft(t *testing.T, killed []killedRun, tmp, mount string) {
	t.Helper()
	state := filepath.Join(defaultStateDir, "native")
	parent := filepath.Join(mount, native.CgroupParent(state))
	trees, _ := os.ReadDir(filepath.Join(defaultStateDir, "tmp")) // simulated nodes
	images, _ := os.ReadDir(state)                                // --image trees: .tmp-*
	trees = append(trees, images...)
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	left := map[string]int{}
	for _, run := range killed {
		id := "gpurun-" + strconv.Itoa(run.pid)
		if _, err := os.Lstat(filepath.Join(state, id)); !errors.Is(err, os.ErrNotExist) {
			left["container directories"]++
		}
		if _, err := os.Stat(filepath.Join(parent, id)); !errors.Is(err, os.ErrNotExist) {
			left["cgroups"]++
		}
		if run.init > 0 && alive(run.init) {
			left["processes"]++
		}
		for l := range strings.Lines(string(mounts)) {
			if strings.Contains(l, filepath.Join(state, id)+"/") || strings.Contains(l, "-"+strconv.Itoa(run.pid)+".") {
				left["mounts"]++
			}
		}
		for _, e := range trees {
			if strings.Contains(e.Name(), "-"+strconv.Itoa(run.pid)+".") {
				left["temporary trees"]++
			}
		}
	}
	if entries, _ := os.ReadDir(tmp); len(entries) > 0 {
		left["entries in TMPDIR"] = len(entries)
	}
	for what, n := range left {
		t.Errorf("%d %s of killed runs left", n, what)
	}
	// With no container left in the state directory, its cgroup parent
	// is gone too.
	if entries, _ := os.ReadDir(state); len(entries) == 0 {
		if _, err := os.Stat(parent); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the default state directory's cgroup parent %s is left without containers: %v", parent, err)
		}
	}
}

// alive tells whether pid runs (and is no zombie).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}
