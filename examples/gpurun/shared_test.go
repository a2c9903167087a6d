package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
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
	"github.com/gpuiso/gpuiso/containerizer/native"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/volume"
)

// asGpurunEnv makes the test binary gpurun itself (see TestMain): the
// multi-process tests start it as separate processes and kill them.
const asGpurunEnv = "GPUISO_TEST_AS_GPURUN"

// envInt reads a positive count from the environment, or def.
func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// sharedRun is the state directory, temporary directory and cgroup parent
// of a multi-process test.
type sharedRun struct {
	t        *testing.T
	exe      string
	state    string
	tmp      string
	v        string // cgroup version
	mount    string // its hierarchy's mount point
	mu       sync.Mutex
	failures []string
	seen     map[string]bool // containers the sampler saw running
}

func newSharedRun(t *testing.T) *sharedRun {
	testenv.RequireRoot(t)
	v, mount := testenv.RequireDeviceCgroup(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	r := &sharedRun{t: t, exe: exe, state: filepath.Join(base, "state"), tmp: filepath.Join(base, "tmp"), v: v, mount: mount}
	if err := os.Mkdir(r.tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Whatever a failed test left: containers, cgroups, mounts.
		r.gpurun(context.Background(), "--gpus", "8", "--", "/bin/true").Run()
	})
	return r
}

// gpurun returns a gpurun process on the shared state directory.
func (r *sharedRun) gpurun(ctx context.Context, args ...string) *exec.Cmd {
	all := append([]string{"--simulate", "dgx1-volta", "--state-dir", r.state, "--cgroup", r.v, "--quiet"}, args...)
	cmd := exec.CommandContext(ctx, r.exe, all...)
	cmd.Env = append(os.Environ(), asGpurunEnv+"=1", "TMPDIR="+r.tmp)
	return cmd
}

func (r *sharedRun) fail(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
}

// running returns, by container id, the GPUs (UUIDs) of every container of
// the state directory whose init still runs.
func (r *sharedRun) running() map[string][]string {
	out := map[string][]string{}
	dir := filepath.Join(r.state, "native")
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "container.json"))
		if err != nil {
			continue
		}
		// A record store entry (the init its process, the GPUs in its
		// data) or, of version 1, the fields alone.
		type gpus []struct {
			UUID string `json:"uuid"`
		}
		var rec struct {
			Pid     int    `json:"pid"`
			Start   uint64 `json:"start"`
			GPUs    gpus   `json:"gpus"`
			Process *struct {
				Pid   int    `json:"pid"`
				Start uint64 `json:"start"`
			} `json:"process"`
			Data *struct {
				GPUs gpus `json:"gpus"`
			} `json:"data"`
		}
		if json.Unmarshal(b, &rec) != nil {
			continue
		}
		if rec.Process != nil {
			rec.Pid, rec.Start = rec.Process.Pid, rec.Process.Start
		}
		if rec.Data != nil {
			rec.GPUs = rec.Data.GPUs
		}
		if rec.Pid == 0 {
			continue
		}
		if allocator.HolderDead("", allocator.Holder{Pid: rec.Pid, Start: rec.Start}) {
			continue
		}
		for _, g := range rec.GPUs {
			out[e.Name()] = append(out[e.Name()], g.UUID)
		}
	}
	return out
}

// sample checks, until stop is closed, that no GPU belongs to two running
// containers at once.
func (r *sharedRun) sample(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-time.After(5 * time.Millisecond):
		}
		holder := map[string]string{}
		run := r.running()
		r.mu.Lock()
		if r.seen == nil {
			r.seen = map[string]bool{}
		}
		for id := range run {
			r.seen[id] = true
		}
		r.mu.Unlock()
		for id, gpus := range run {
			for _, g := range gpus {
				if other, ok := holder[g]; ok {
					r.fail("%s held by running containers %s and %s", g, other, id)
				}
				holder[g] = id
			}
		}
	}
}

// checkClean verifies that nothing of any run is left: no owner in the
// allocator's state, no container directory, cgroup, mount, volume user or
// temporary directory.
func (r *sharedRun) checkClean(ids []string) {
	t := r.t
	t.Helper()
	b, err := os.ReadFile(filepath.Join(r.state, allocator.StateFile))
	if err == nil && strings.Contains(string(b), `"owner"`) {
		t.Errorf("owners left in the state: %s", b)
	}
	if entries, _ := os.ReadDir(filepath.Join(r.state, "native")); len(entries) != 0 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("container directories left: %v", names)
	}
	for _, e := range mustReadDir(t, r.state) {
		if strings.HasSuffix(e.Name(), ".tmp") {
			t.Errorf("temporary state file left: %s", e.Name())
		}
	}
	// The state directory's own cgroup parent goes with its last container.
	parent := filepath.Join(r.mount, native.CgroupParent(filepath.Join(r.state, "native")))
	if _, err := os.Stat(parent); !os.IsNotExist(err) {
		t.Errorf("cgroup parent left: %s (%v)", parent, err)
	}
	if f, err := os.Open("/proc/self/mountinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if strings.Contains(sc.Text(), r.state) || strings.Contains(sc.Text(), r.tmp) {
				t.Errorf("mount left: %s", sc.Text())
			}
		}
		f.Close()
	}
	for _, dir := range []string{r.tmp, filepath.Join(r.state, "tmp")} {
		if entries := mustReadDir(t, dir); len(entries) != 0 {
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			t.Errorf("temporary directories left in %s: %v", dir, names)
		}
	}
	if m, err := volume.New(); err == nil {
		vols, _ := m.List(context.Background())
		want := map[string]bool{}
		for _, id := range ids {
			want[id] = true
		}
		for _, v := range vols {
			for _, u := range v.Users {
				if want[u] {
					t.Errorf("volume %s keeps user %s", v.Version, u)
				}
			}
		}
	}
}

func mustReadDir(t *testing.T, dir string) []os.DirEntry {
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return entries
}

// TestConcurrentRuns: rounds of 20 gpurun --gpus 2 at once on one state
// directory of a simulated 8-GPU node. Each run gets GPUs or fails cleanly
// with "not enough free GPUs"; no two running containers share a GPU; no
// owner, container or file is left once all have exited.
// GPUISO_CONCURRENT_ROUNDS sets the rounds (default 2).
func TestConcurrentRuns(t *testing.T) {
	r := newSharedRun(t)
	rounds, procs := envInt("GPUISO_CONCURRENT_ROUNDS", 2), 20
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { r.sample(stop); close(done) }()
	var ids []string
	ran, refused := 0, 0
	for round := range rounds {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for range procs {
			cmd := r.gpurun(context.Background(), "--gpus", "2", "--", "/bin/sh", "-c", "sleep 0.5")
			var errOut strings.Builder
			cmd.Stderr = &errOut
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, "gpurun-"+strconv.Itoa(cmd.Process.Pid))
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := cmd.Wait()
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					ran++
				case cmd.ProcessState.ExitCode() == exitFailed && strings.Contains(errOut.String(), "not enough free GPUs"):
					refused++
				default:
					r.fail("round %d: gpurun: %v: %s", round, err, errOut.String())
				}
			}()
		}
		wg.Wait()
	}
	close(stop)
	<-done
	for _, f := range r.failures {
		t.Error(f)
	}
	if ran == 0 {
		t.Error("no run got GPUs")
	}
	t.Logf("%d rounds of %d: %d ran, %d refused for want of GPUs; %d containers seen running", rounds, procs, ran, refused, len(r.seen))
	r.checkClean(ids)
}

// TestKilledRuns: gpurun processes on one state directory are SIGKILLed,
// four at a time: half at a random point of their start (up to 450 ms), half
// up to 450 ms after their container started. Each next start cleans up
// after them. No GPU is ever held by two running containers, and after a
// last run that takes all 8 GPUs nothing is left. GPUISO_CRASH_KILLS sets
// the number of kills (default 20).
func TestKilledRuns(t *testing.T) {
	r := newSharedRun(t)
	kills := envInt("GPUISO_CRASH_KILLS", 20)
	const batch = 4
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { r.sample(stop); close(done) }()
	var ids []string
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	var mu sync.Mutex
	running := 0 // kills of a run whose container had started
	for k := 0; k < kills; k += batch {
		var wg sync.WaitGroup
		for i := range min(batch, kills-k) {
			args := []string{"--gpus", "2", "--", "/bin/sh", "-c", "sleep 5"}
			afterStart := (k+i)%2 == 1
			if afterStart {
				args = append([]string{"--quiet=false"}, args...)
			}
			cmd := r.gpurun(context.Background(), args...)
			var lines io.Reader
			if afterStart {
				pr, err := cmd.StderrPipe()
				if err != nil {
					t.Fatal(err)
				}
				lines = pr
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, "gpurun-"+strconv.Itoa(cmd.Process.Pid))
			delay := time.Duration(rng.IntN(450)) * time.Millisecond
			wg.Add(1)
			go func() {
				defer wg.Done()
				if lines != nil {
					// gpurun's one line comes once the container runs.
					line, err := bufio.NewReader(lines).ReadString('\n')
					if err == nil && strings.HasPrefix(line, "gpurun: GPUs") {
						mu.Lock()
						running++
						mu.Unlock()
					}
					go io.Copy(io.Discard, lines)
				}
				time.Sleep(delay)
				cmd.Process.Signal(syscall.SIGKILL)
				cmd.Wait()
			}()
		}
		wg.Wait()
	}
	// The next start: it must find all 8 GPUs free once it has cleaned up.
	last := r.gpurun(context.Background(), "--gpus", "8", "--", "/bin/true")
	if out, err := last.CombinedOutput(); err != nil {
		t.Errorf("the run after %d kills: %v: %s", kills, err, out)
	}
	close(stop)
	<-done
	for _, f := range r.failures {
		t.Error(f)
	}
	r.checkClean(ids)
	t.Logf("%d kills (%d after their container started; %d containers seen running), then one run of 8 GPUs", kills, running, len(r.seen))
}
