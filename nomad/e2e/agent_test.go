// Package e2e runs gpuiso's Nomad device plugin under a real Nomad agent.
// It is opt-in: GPUISO_NOMAD_BIN names the nomad binary to run (none is
// built here), and without it the suite skips with that reason.
package e2e_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// NomadBinEnv names the nomad binary the suite runs.
const NomadBinEnv = "GPUISO_NOMAD_BIN"

const topology = "dgx1-volta"

// build builds pkg of the module rooted at dir into out.
func build(t *testing.T, dir, pkg, out string) {
	t.Helper()
	cmd := exec.Command("go", "build", "-buildvcs=false", "-o", out, pkg)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
}

// freePorts returns n free loopback ports.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	var ls []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}

// agent is a dev agent with the plugin in its plugin_dir.
type agent struct {
	api      *api.Client
	inv      *node.Inventory
	stateDir string
	image    string
	log      string
}

func startAgent(t *testing.T, nomad string) *agent {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireNVIDIALibraries(t)
	dir := t.TempDir()
	plugins := filepath.Join(dir, "plugins")
	build(t, "..", "./cmd/gpuiso-nomad-plugin", filepath.Join(plugins, "gpuiso-nomad-plugin"))
	runtime := filepath.Join(dir, "gpuiso-runtime")
	build(t, filepath.Join("..", ".."), "./cmd/gpuiso-runtime", runtime)

	devRoot, stateDir := filepath.Join(dir, "node"), filepath.Join(dir, "state")
	sim, err := simnode.New(topology)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	host, err := sim.OpenHost(ctx, devRoot)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := nvmlnode.Discover(ctx, sim.DiscoverOptions(host)...)
	if err != nil {
		t.Fatal(err)
	}
	d := testenv.StartDockerd(t, map[string]any{"runtimes": map[string]any{"gpuiso": map[string]any{
		"path":        runtime,
		"runtimeArgs": []string{"--simulate", topology, "--sim-root", devRoot, "--state-dir", stateDir},
	}}})
	img := testenv.BuildProbeImage(t, d.Client, testenv.ProbeImage{})

	ports := freePorts(t, 3)
	addr := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	config := fmt.Sprintf(`
data_dir   = %q
plugin_dir = %q
bind_addr  = "127.0.0.1"
ports {
  http = %d
  rpc  = %d
  serf = %d
}
plugin "gpuiso-nomad-plugin" {
  config {
    simulate           = %q
    dev_root           = %q
    state_dir          = %q
    env                = "runtime"
    fingerprint_period = "1s"
    nomad_addr         = %q
  }
}
plugin "docker" {
  config {
    endpoint       = %q
    nvidia_runtime = "gpuiso"
    allow_runtimes = ["runc", "gpuiso"]
  }
}
plugin "raw_exec" {
  config {
    enabled = true
  }
}
`, filepath.Join(dir, "data"), plugins, ports[0], ports[1], ports[2], topology, devRoot, stateDir, addr, d.Host)
	cfg := filepath.Join(dir, "agent.hcl")
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "agent.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(nomad, "agent", "-dev", "-config", cfg)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		logFile.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logPath); err == nil {
				t.Logf("agent log:\n%s", b)
			}
		}
	})
	c, err := api.NewClient(&api.Config{Address: addr})
	if err != nil {
		t.Fatal(err)
	}
	return &agent{api: c, inv: inv, stateDir: stateDir, image: img, log: logPath}
}

// eventually polls cond every second for up to limit: the agent is
// another process, with no event to wait on.
func eventually(t *testing.T, what string, limit time.Duration, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(limit)
	var last error
	for time.Now().Before(deadline) {
		ok, err := cond()
		if ok {
			return
		}
		last = err
		time.Sleep(time.Second)
	}
	t.Fatalf("%s: not within %s (last error: %v)", what, limit, last)
}

// gpus returns the node's nvidia/gpu devices.
func (a *agent) gpus(t *testing.T) (*api.NodeDeviceResource, error) {
	t.Helper()
	nodes, _, err := a.api.Nodes().List(nil)
	if err != nil || len(nodes) != 1 {
		return nil, fmt.Errorf("nodes %v: %w", nodes, err)
	}
	n, _, err := a.api.Nodes().Info(nodes[0].ID, nil)
	if err != nil {
		return nil, err
	}
	if n.NodeResources == nil {
		return nil, fmt.Errorf("node %s has no resources yet", n.ID)
	}
	for _, d := range n.NodeResources.Devices {
		if d.Vendor == "nvidia" && d.Type == "gpu" {
			return d, nil
		}
	}
	return nil, fmt.Errorf("node %s has no nvidia/gpu", n.ID)
}

// job is a batch job of one task asking count GPUs, with constraints on
// them.
func job(name, driver string, config map[string]any, count uint64, constraints ...*api.Constraint) *api.Job {
	j := api.NewBatchJob(name, name, "global", 50)
	tg := api.NewTaskGroup("g", 1)
	zero, fail := 0, "fail"
	tg.RestartPolicy = &api.RestartPolicy{Attempts: &zero, Mode: &fail}
	tg.ReschedulePolicy = &api.ReschedulePolicy{Attempts: &zero}
	task := api.NewTask("t", driver)
	task.Config = config
	task.Require(&api.Resources{Devices: []*api.RequestedDevice{{Name: "nvidia/gpu", Count: &count, Constraints: constraints}}})
	tg.AddTask(task)
	j.AddTaskGroup(tg)
	return j
}

// run registers j and returns its task's standard output once its one
// allocation completed, or "" and false when the job cannot be placed.
func (a *agent) run(t *testing.T, j *api.Job) (string, bool) {
	t.Helper()
	return a.start(t, j)()
}

// start registers j and returns what waits for it as run does.
func (a *agent) start(t *testing.T, j *api.Job) func() (string, bool) {
	t.Helper()
	resp, _, err := a.api.Jobs().Register(j, nil)
	if err != nil {
		t.Fatalf("register %s: %v", *j.ID, err)
	}
	return func() (string, bool) {
		t.Helper()
		return a.wait(t, j, resp.EvalID)
	}
}

// wait waits for j's evaluation and allocation.
func (a *agent) wait(t *testing.T, j *api.Job, evalID string) (string, bool) {
	t.Helper()
	var err error
	var ev *api.Evaluation
	eventually(t, "evaluation of "+*j.ID, 2*time.Minute, func() (bool, error) {
		ev, _, err = a.api.Evaluations().Info(evalID, nil)
		return err == nil && ev.Status == api.EvalStatusComplete, err
	})
	if len(ev.FailedTGAllocs) > 0 {
		return "", false
	}
	var alloc *api.Allocation
	eventually(t, *j.ID+" completed", 3*time.Minute, func() (bool, error) {
		allocs, _, err := a.api.Jobs().Allocations(*j.ID, false, nil)
		if err != nil || len(allocs) != 1 {
			return false, err
		}
		switch allocs[0].ClientStatus {
		case api.AllocClientStatusComplete:
			alloc, _, err = a.api.Allocations().Info(allocs[0].ID, nil)
			return err == nil, err
		case api.AllocClientStatusFailed, api.AllocClientStatusLost:
			var events []string
			for task, st := range allocs[0].TaskStates {
				for _, ev := range st.Events {
					events = append(events, fmt.Sprintf("%s: %s %s", task, ev.Type, ev.DisplayMessage))
				}
			}
			t.Fatalf("%s: allocation %s %s:\n%s", *j.ID, allocs[0].ID, allocs[0].ClientStatus, strings.Join(events, "\n"))
		}
		return false, nil
	})
	r, err := a.api.AllocFS().Cat(alloc, "alloc/logs/t.stdout.0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b), true
}

// gpuNodes are the GPU device nodes a probe's ls /dev lists.
func gpuNodes(out string) []string {
	var nodes []string
	for l := range strings.Lines(out) {
		l = strings.TrimSpace(l)
		if n, ok := strings.CutPrefix(l, "nvidia"); ok && n != "" && strings.Trim(n, "0123456789") == "" {
			nodes = append(nodes, l)
		}
	}
	slices.Sort(nodes)
	return nodes
}

// TestAgent: a dev agent shows the simulated node's 8 GPUs healthy with
// their attributes; docker jobs through gpuiso-runtime see exactly their
// GPUs, two at once distinct ones, and a third asking all 8 meanwhile is
// not placed; too many GPUs, or more memory than a
// GPU has, is not placed; a raw_exec task gets NVIDIA_VISIBLE_DEVICES; a
// GPU marked unhealthy is not handed out.
func TestAgent(t *testing.T) {
	nomad := os.Getenv(NomadBinEnv)
	if nomad == "" {
		t.Skipf("%s names no nomad binary: the real-agent suite is opt-in (GPUISO_NOMAD_BIN=/path/to/nomad)", NomadBinEnv)
	}
	a := startAgent(t, nomad)
	var gpus *api.NodeDeviceResource
	eventually(t, "8 healthy GPUs fingerprinted", 3*time.Minute, func() (bool, error) {
		var err error
		gpus, err = a.gpus(t)
		if err != nil {
			return false, err
		}
		healthy := 0
		for _, d := range gpus.Instances {
			if d.Healthy {
				healthy++
			}
		}
		return healthy == len(a.inv.Devices), nil
	})
	if m := gpus.Attributes["memory"]; m == nil || m.IntVal == nil || *m.IntVal != int64(a.inv.Devices[0].MemoryBytes>>20) || m.Unit != "MiB" {
		t.Errorf("memory attribute %v", m)
	}
	if gpus.Name != a.inv.Devices[0].Model {
		t.Errorf("device name %q", gpus.Name)
	}

	probe := func(args ...string) map[string]any {
		return map[string]any{"image": a.image, "args": args}
	}
	t.Run("two at once", func(t *testing.T) {
		var waits []func() (string, bool)
		for _, name := range []string{"one-a", "one-b"} {
			waits = append(waits, a.start(t, job(name, "docker", probe("do", "ls", "/dev", "--", "sleep", "15"), 1)))
		}
		// While they hold two GPUs, a third job asking all 8 is not
		// placed; it is then purged, so that it takes nothing later.
		if _, ok := a.run(t, job("eight", "docker", probe("ls", "/dev"), uint64(len(a.inv.Devices)))); ok {
			t.Error("a job asking every GPU was placed while two jobs held one each")
		}
		if _, _, err := a.api.Jobs().Deregister("eight", true, nil); err != nil {
			t.Fatal(err)
		}
		var seen []string
		for _, wait := range waits {
			out, ok := wait()
			if !ok {
				t.Fatal("a one-GPU job was not placed")
			}
			nodes := gpuNodes(out)
			if len(nodes) != 1 {
				t.Fatalf("a one-GPU job sees %v:\n%s", nodes, out)
			}
			seen = append(seen, nodes[0])
		}
		if seen[0] == seen[1] {
			t.Errorf("two jobs at once both got %s", seen[0])
		}
	})
	t.Run("two GPUs", func(t *testing.T) {
		out, ok := a.run(t, job("two", "docker", probe("ls", "/dev"), 2))
		if !ok || len(gpuNodes(out)) != 2 {
			t.Fatalf("a two-GPU job: placed %v, sees %v", ok, gpuNodes(out))
		}
	})
	t.Run("too many", func(t *testing.T) {
		if _, ok := a.run(t, job("nine", "docker", probe("ls", "/dev"), uint64(len(a.inv.Devices)+1))); ok {
			t.Fatal("a job asking more GPUs than the node has was placed")
		}
	})
	t.Run("memory constraint", func(t *testing.T) {
		big := &api.Constraint{LTarget: "${device.attr.memory}", Operand: ">=", RTarget: "1024 GiB"}
		if _, ok := a.run(t, job("big", "docker", probe("ls", "/dev"), 1, big)); ok {
			t.Fatal("a job asking 1 TiB of GPU memory was placed")
		}
		fits := &api.Constraint{LTarget: "${device.attr.memory}", Operand: ">=", RTarget: "8 GiB"}
		if _, ok := a.run(t, job("fits", "docker", probe("ls", "/dev"), 1, fits)); !ok {
			t.Fatal("a job asking 8 GiB of GPU memory was not placed")
		}
	})
	t.Run("raw_exec", func(t *testing.T) {
		out, ok := a.run(t, job("raw", "raw_exec", map[string]any{"command": "/bin/sh", "args": []string{"-c", "echo NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES"}}, 1))
		if !ok || !strings.Contains(out, "NVIDIA_VISIBLE_DEVICES=GPU-") {
			t.Fatalf("raw_exec task: placed %v, printed %q", ok, out)
		}
	})
	t.Run("unhealthy", func(t *testing.T) {
		al, err := allocator.New(a.inv, allocator.WithStateDir(a.stateDir))
		if err != nil {
			t.Fatal(err)
		}
		defer al.Close()
		sick := a.inv.Devices[0].UUID
		if _, err := al.MarkUnhealthy(context.Background(), sick, "marked by the test"); err != nil {
			t.Fatal(err)
		}
		eventually(t, "GPU 0 unhealthy in Nomad", time.Minute, func() (bool, error) {
			g, err := a.gpus(t)
			if err != nil {
				return false, err
			}
			for _, d := range g.Instances {
				if d.ID == sick {
					return !d.Healthy, nil
				}
			}
			return false, nil
		})
		if _, ok := a.run(t, job("all", "docker", probe("ls", "/dev"), uint64(len(a.inv.Devices)))); ok {
			t.Fatal("a job asking every GPU was placed with one unhealthy")
		}
	})
}
