package main

import (
	"context"
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

	"github.com/moby/moby/client"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer/docker"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/dockerconfig"
)

// asDockerrunEnv makes the test binary dockerrun itself: the multi-process
// tests start it as separate processes and kill them.
const asDockerrunEnv = "GPUISO_TEST_AS_DOCKERRUN"

func TestMain(m *testing.M) {
	if os.Getenv(asDockerrunEnv) != "" {
		main()
	}
	os.Exit(m.Run())
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

type dockerRuns struct {
	t     *testing.T
	exe   string
	state string
	tmp   string
	img   string
	dc    *client.Client
}

func newDockerRuns(t *testing.T) *dockerRuns {
	testenv.RequireRoot(t)
	dc := testenv.RequireDocker(t)
	testenv.LockDocker(t, false)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	r := &dockerRuns{t: t, exe: exe, state: filepath.Join(base, "state"), tmp: filepath.Join(base, "tmp"), dc: dc}
	if err := os.Mkdir(r.tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	r.img = testenv.BuildProbeImage(t, dc, testenv.ProbeImage{})
	t.Cleanup(func() { r.cmd(context.Background(), "gc").Run() })
	return r
}

// cmd returns a dockerrun process (or "gc") on the shared state directory.
func (r *dockerRuns) cmd(ctx context.Context, args ...string) *exec.Cmd {
	var all []string
	if len(args) > 0 && args[0] == "gc" {
		all, args = []string{"gc"}, args[1:]
	}
	all = append(all, "--simulate", "dgx1-volta", "--state-dir", r.state, "--quiet")
	all = append(all, args...)
	c := exec.CommandContext(ctx, r.exe, all...)
	c.Env = append(os.Environ(), asDockerrunEnv+"=1", "TMPDIR="+r.tmp)
	return c
}

// containers returns the namespace's containers: all, and the GPUs (UUIDs)
// of the running ones by owner.
func (r *dockerRuns) containers() (all int, running map[string][]string) {
	list, err := r.dc.ContainerList(context.Background(), client.ContainerListOptions{
		All: true, Filters: make(client.Filters).Add("label", docker.LabelNamespace+"="+namespace(r.state)),
	})
	if err != nil {
		r.t.Error(err)
		return 0, nil
	}
	running = map[string][]string{}
	for _, c := range list.Items {
		if c.State != "running" {
			continue
		}
		owner, gpus, err := dockerconfig.ParseLabels(c.Labels)
		if err != nil {
			r.t.Error(err)
			continue
		}
		for _, g := range gpus {
			running[owner] = append(running[owner], g.UUID)
		}
	}
	return len(list.Items), running
}

// sample fails the test when two running containers share a GPU.
func (r *dockerRuns) sample(stop <-chan struct{}, seen map[string]bool, mu *sync.Mutex) {
	for {
		select {
		case <-stop:
			return
		case <-time.After(20 * time.Millisecond):
		}
		_, running := r.containers()
		holder := map[string]string{}
		mu.Lock()
		for owner, gpus := range running {
			seen[owner] = true
			for _, g := range gpus {
				if other, ok := holder[g]; ok {
					r.t.Errorf("%s held by running containers %s and %s", g, other, owner)
				}
				holder[g] = owner
			}
		}
		mu.Unlock()
	}
}

func (r *dockerRuns) checkClean() {
	r.t.Helper()
	if n, _ := r.containers(); n != 0 {
		r.t.Errorf("%d containers left", n)
	}
	if b, err := os.ReadFile(filepath.Join(r.state, allocator.StateFile)); err == nil && strings.Contains(string(b), `"owner"`) {
		r.t.Errorf("owners left: %s", b)
	}
	if entries, _ := os.ReadDir(r.tmp); len(entries) != 0 {
		r.t.Errorf("%d temporary directories left", len(entries))
	}
}

// TestConcurrentDockerRuns: dockerrun processes at once on one state
// directory never give two running containers one GPU; each gets GPUs or
// fails with "not enough free GPUs"; nothing is left afterwards.
func TestConcurrentDockerRuns(t *testing.T) {
	r := newDockerRuns(t)
	procs := envInt("GPUISO_DOCKER_PROCS", 8)
	stop, done := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	seen := map[string]bool{}
	go func() { r.sample(stop, seen, &mu); close(done) }()
	var wg sync.WaitGroup
	for range procs {
		c := r.cmd(context.Background(), "--gpus", "2", r.img, "sleep", "2")
		var errOut strings.Builder
		c.Stderr = &errOut
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := c.Wait()
			if err != nil && !(c.ProcessState.ExitCode() == exitFailed && strings.Contains(errOut.String(), "not enough free GPUs")) {
				t.Errorf("dockerrun: %v: %s", err, errOut.String())
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-done
	t.Logf("%d runs, %d containers seen running", procs, len(seen))
	r.checkClean()
}

// TestKilledDockerRuns: dockerrun processes SIGKILLed at random points
// leave nothing once the next start (here dockerrun gc, then a run of all
// 8 GPUs) has run. GPUISO_DOCKER_KILLS sets the kills (default 6).
func TestKilledDockerRuns(t *testing.T) {
	r := newDockerRuns(t)
	kills := envInt("GPUISO_DOCKER_KILLS", 6)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 11))
	var wg sync.WaitGroup
	for range kills {
		c := r.cmd(context.Background(), "--gpus", "2", r.img, "sleep", "60")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		delay := time.Duration(rng.IntN(1500)) * time.Millisecond
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(delay)
			c.Process.Signal(syscall.SIGKILL)
			c.Wait()
		}()
	}
	wg.Wait()
	n, _ := r.containers()
	if out, err := r.cmd(context.Background(), "--gpus", "8", r.img, "exit", "0").CombinedOutput(); err != nil {
		t.Errorf("the run after %d kills: %v: %s", kills, err, out)
	}
	t.Logf("%d kills left %d containers before the next start", kills, n)
	r.checkClean()
}

// TestDaemonIsTheTruth: when the allocator's state is lost while a run's
// container lives, the next run takes that container's GPUs from its labels
// (under the state directory's lock) and never hands them out again.
func TestDaemonIsTheTruth(t *testing.T) {
	r := newDockerRuns(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	long := r.cmd(ctx, "--gpus", "2", r.img, "sleep", "60")
	if err := long.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { long.Process.Signal(syscall.SIGTERM); long.Wait() }()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if _, running := r.containers(); len(running) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the long run's container never ran")
		}
	}
	// The state is lost: its file is gone, the container still runs.
	if err := os.Remove(filepath.Join(r.state, allocator.StateFile)); err != nil {
		t.Fatal(err)
	}
	out, err := r.cmd(ctx, "--gpus", "8", r.img, "exit", "0").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "not enough free GPUs") {
		t.Fatalf("8 GPUs while a container holds 2: %v\n%s", err, out)
	}
	if out, err := r.cmd(ctx, "--gpus", "6", r.img, "exit", "0").CombinedOutput(); err != nil {
		t.Fatalf("the 6 free GPUs: %v\n%s", err, out)
	}
}
