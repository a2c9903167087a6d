package native_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/native"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
	"github.com/gpuiso/gpuiso/volume"
)

func TestMain(m *testing.M) {
	native.Init()
	if os.Getenv(agentEnv) != "" {
		os.Exit(runAgent())
	}
	testenv.MainCheckingLeaks(m)
}

// sim is a simulated DGX-1 host (real device nodes under a temporary
// directory), its inventory, an allocator with a state directory, a cgroups
// isolator of one version, the host's driver volume, and a containerizer.
type testNode struct {
	sim      *simnode.Node
	host     *simnode.Host
	inv      *node.Inventory
	alloc    *allocator.Allocator
	iso      *cgroups.Isolator
	vols     *volume.Manager
	c        *native.Containerizer
	dirs     dirs
	version  cgroups.Version
	probe    string
	parentCG string
}

// dirs are the paths a containerizer process needs; a restarted one (or a
// child agent) gets the same.
type dirs struct {
	Host, AllocState, State, Volumes string
}

func requireVersion(t testing.TB, v cgroups.Version) string {
	if v == cgroups.V1 {
		return testenv.RequireCgroupV1Devices(t)
	}
	return testenv.RequireCgroupV2(t)
}

func newNode(t testing.TB, v cgroups.Version) *testNode {
	t.Helper()
	testenv.RequireRoot(t)
	requireVersion(t, v)
	testenv.RequireNVIDIALibraries(t)
	base := t.TempDir()
	d := dirs{Host: filepath.Join(base, "host"), AllocState: filepath.Join(base, "alloc"), State: filepath.Join(base, "state"), Volumes: filepath.Join(base, "volumes")}
	n, err := open(d, v, fmt.Sprintf("gpuiso-test-%d", os.Getpid()), true)
	if err != nil {
		t.Fatal(err)
	}
	n.probe = testenv.BuildProbe(t)
	t.Cleanup(func() {
		for _, ct := range n.c.Containers() {
			n.c.Destroy(context.Background(), ct.ID)
		}
		n.host.Remove()
		os.Remove(filepath.Join(filepath.Dir(filepath.Dir(n.iso.Path("x"))), n.parentCG))
	})
	return n
}

// open builds the sim's pieces over dirs; makeHost creates the simulated
// host tree (the first process does, a restarted one finds it).
func open(d dirs, v cgroups.Version, parent string, makeHost bool) (*testNode, error) {
	n := &testNode{dirs: d, version: v, parentCG: parent}
	var err error
	if n.sim, err = simnode.New("dgx1-volta"); err != nil {
		return nil, err
	}
	if makeHost {
		if n.host, err = n.sim.MakeHost(d.Host); err != nil {
			return nil, err
		}
	} else {
		n.host = &simnode.Host{Root: d.Host, DevRoot: filepath.Join(d.Host, "dev"), ProcRoot: filepath.Join(d.Host, "proc"), SysRoot: filepath.Join(d.Host, "sys")}
	}
	if n.inv, err = nvmlnode.Discover(context.Background(), n.sim.DiscoverOptions(n.host)...); err != nil {
		return nil, err
	}
	if n.alloc, err = allocator.New(n.inv, allocator.WithStateDir(d.AllocState)); err != nil {
		return nil, err
	}
	mount := "/sys/fs/cgroup/devices"
	if v == cgroups.V2 {
		mount = "/sys/fs/cgroup/unified"
		if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
			mount = "/sys/fs/cgroup"
		}
	}
	if n.iso, err = cgroups.New(cgroups.WithVersion(v), cgroups.WithMount(mount), cgroups.WithParent(parent)); err != nil {
		return nil, err
	}
	if n.vols, err = volume.New(volume.WithRoot(d.Volumes)); err != nil {
		return nil, err
	}
	n.c, err = native.New(native.Config{Allocator: n.alloc, Inventory: n.inv, Isolator: n.iso, Volumes: n.vols, NVML: n.sim.NVML(), StateDir: d.State})
	return n, err
}

func versions(t *testing.T, run func(t *testing.T, n *testNode)) {
	for _, v := range []cgroups.Version{cgroups.V1, cgroups.V2} {
		t.Run(v.String(), func(t *testing.T) { run(t, newNode(t, v)) })
	}
}

// run launches a container, waits for it and returns its output.
func (n *testNode) run(t *testing.T, id string, req allocator.Request, script string) (string, containerizer.Container) {
	t.Helper()
	var out bytes.Buffer
	ctx := context.Background()
	ct, err := n.c.Launch(ctx, containerizer.Spec{ID: id, Command: []string{"/bin/sh", "-c", script}, GPUs: req,
		Env: []string{"PROBE=" + n.probe}, Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatal(err)
	}
	st, err := n.c.Wait(ctx, id)
	if err != nil || st.Code != 0 {
		t.Fatalf("container %s: exit %d, %v\n%s", id, st.Code, err, out.String())
	}
	return out.String(), ct
}

// running reports whether pid exists and is not a zombie waiting for its
// parent (a killed process leaves its cgroup at once, its pid a moment later).
func running(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

func lines(s string) map[string]bool {
	m := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		m[l] = true
	}
	return m
}

// TestIsolation gives a container GPUs 1 and 3 and looks from inside. The
// container shares the host's root file system, so it gets the host's driver
// as it is installed, and no volume over it.
func TestIsolation(t *testing.T) {
	versions(t, func(t *testing.T, n *testNode) {
		five := n.inv.Devices[5].Node
		out, ct := n.run(t, "gpus-1-3", allocator.Request{Devices: []string{"1", "3"}}, fmt.Sprintf(`
			$PROBE open /dev/nvidia1 /dev/nvidia3 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools /dev/null
			$PROBE ls /dev | grep '^nvidia[0-9]' | sed 's/^/dev: /'
			$PROBE mknod /dev/nvidia5 %d %d
			$PROBE open /dev/nvidia5
			$PROBE env NVIDIA_VISIBLE_DEVICES CUDA_VISIBLE_DEVICES PATH LD_LIBRARY_PATH
			grep -q ' /usr/local/nvidia ' /proc/self/mountinfo && echo volume: mounted; true`, five.Major, five.Minor))
		got := lines(out)
		uuids := n.inv.Devices[1].UUID + "," + n.inv.Devices[3].UUID
		for _, path := range []string{"/dev/nvidia1", "/dev/nvidia3", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/null"} {
			if !testenv.Opened(got, path) {
				t.Errorf("%s not allowed in the container's output:\n%s", path, out)
			}
		}
		for _, want := range []string{
			"dev: nvidia1", "dev: nvidia3",
			"/dev/nvidia5 ok", "/dev/nvidia5 EPERM",
			"NVIDIA_VISIBLE_DEVICES=" + uuids, "CUDA_VISIBLE_DEVICES=" + uuids,
		} {
			if !got[want] {
				t.Errorf("missing %q in the container's output:\n%s", want, out)
			}
		}
		for l := range got {
			if strings.HasPrefix(l, "dev: nvidia") && !slices.Contains([]string{"dev: nvidia1", "dev: nvidia3"}, l) {
				t.Errorf("the container's /dev holds %s", l)
			}
			if strings.Contains(l, "/usr/local/nvidia") || strings.Contains(l, "/usr/local/cuda/compat") {
				t.Errorf("the container's environment or mounts name the volume: %s", l)
			}
		}
		if ct.Volume != "" || len(ct.GPUs) != 2 || ct.GPUs[0].Index != 1 || ct.GPUs[1].Index != 3 {
			t.Errorf("container = %+v", ct)
		}
		if err := n.c.Destroy(context.Background(), "gpus-1-3"); err != nil {
			t.Fatal(err)
		}
	})
}

// startProber launches a container running a prober that answers on pipes.
func (n *testNode) startProber(t *testing.T, id string, req allocator.Request) *testenv.Prober {
	t.Helper()
	args, env := testenv.ProberCommand(t)
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	_, err := n.c.Launch(context.Background(), containerizer.Spec{ID: id, Command: args, Env: []string{env}, GPUs: req, Stdin: inR, Stdout: outW, Stderr: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inW.Close(); outW.Close() })
	return testenv.NewProber(inW, outR)
}

// check opens every GPU from inside: allowed (anything but EPERM or ENOENT)
// for the container's own, ENOENT for the rest, which are not in its /dev.
func (n *testNode) check(t *testing.T, p *testenv.Prober, id string, want ...int) {
	t.Helper()
	for i := range n.inv.Devices {
		own := slices.Contains(want, i)
		got, err := p.Open(fmt.Sprintf("/dev/nvidia%d", i))
		if err != nil || (own && !testenv.Allowed(got)) || (!own && got != "ENOENT") {
			t.Fatalf("open /dev/nvidia%d with GPUs %v = %s, %v; want allowed for its own, ENOENT for the rest", i, want, got, err)
		}
	}
	al, err := n.alloc.Allocation(id)
	if err != nil || len(al.Devices) != len(want) {
		t.Fatalf("allocation %+v, %v; want %d GPUs", al, err, len(want))
	}
}

// TestLiveUpdate grows and shrinks a running container 100 times.
func TestLiveUpdate(t *testing.T) {
	versions(t, func(t *testing.T, n *testNode) {
		ctx := context.Background()
		p := n.startProber(t, "live", allocator.Request{Devices: []string{"0"}})
		n.check(t, p, "live", 0)
		for cycle := range 100 {
			ct, err := n.c.Update(ctx, "live", 2)
			if err != nil {
				t.Fatalf("cycle %d: grow: %v", cycle, err)
			}
			var idx []int
			for _, g := range ct.GPUs {
				idx = append(idx, g.Index)
			}
			n.check(t, p, "live", idx...)
			if ct, err = n.c.Update(ctx, "live", 1); err != nil {
				t.Fatalf("cycle %d: shrink: %v", cycle, err)
			}
			n.check(t, p, "live", ct.GPUs[0].Index)
			// The GPU that went can no longer be opened, even through a
			// sim the container makes itself.
			gone := idx[0] + idx[1] - ct.GPUs[0].Index
			path := fmt.Sprintf("/dev/gone%d", cycle)
			if r, _ := p.Mknod(path, n.inv.Devices[gone].Node.Major, n.inv.Devices[gone].Node.Minor); r != "ok" {
				t.Fatalf("mknod in the container's /dev: %s", r)
			}
			if r, _ := p.Open(path); r != "EPERM" {
				t.Fatalf("cycle %d: open of the removed GPU %d = %s, want EPERM", cycle, gone, r)
			}
		}
		if n.version == cgroups.V2 {
			if k, err := n.iso.Programs(ctx, "live"); err != nil || k != 1 {
				t.Fatalf("%d device programs after 200 updates (%v), want 1", k, err)
			}
		}
		if _, err := n.c.Update(ctx, "live", 0); !errors.Is(err, containerizer.ErrInvalidSpec) {
			t.Fatalf("Update to 0 GPUs = %v", err)
		}
		if _, err := n.c.Update(ctx, "live", 9); !errors.Is(err, allocator.ErrInvalidRequest) && !errors.Is(err, node.ErrInsufficient) {
			t.Fatalf("Update beyond the sim = %v", err)
		}
		n.check(t, p, "live", n.c.Containers()[0].GPUs[0].Index)
	})
}

// TestDestroy leaves nothing: no process (forks and new sessions included),
// no cgroup, no mount, no state, no allocation.
func TestDestroy(t *testing.T) {
	versions(t, func(t *testing.T, n *testNode) {
		ctx := context.Background()
		ct, err := n.c.Launch(ctx, containerizer.Spec{ID: "forks", GPUs: allocator.Request{Count: 2},
			Command: []string{"/bin/sh", "-c", "sleep 1000 & (setsid sleep 1000 &) ; sleep 1000 & wait"}})
		if err != nil {
			t.Fatal(err)
		}
		var pids []int
		for deadline := time.Now().Add(5 * time.Second); len(pids) < 5 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			pids, _ = n.iso.Processes(ctx, "forks")
		}
		if len(pids) < 5 {
			t.Fatalf("container has processes %v, want the init, sh and three sleeps", pids)
		}
		if err := n.c.Destroy(ctx, "forks"); err != nil {
			t.Fatal(err)
		}
		for _, pid := range pids {
			if running(pid) {
				t.Errorf("process %d survived Destroy", pid)
			}
		}
		if _, err := os.Stat(n.iso.Path("forks")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup left: %v", err)
		}
		if _, err := os.Stat(filepath.Join(n.dirs.State, "forks")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("state left: %v", err)
		}
		mounts, _ := os.ReadFile("/proc/self/mountinfo")
		if strings.Contains(string(mounts), filepath.Join(n.dirs.State, "forks")) {
			t.Error("the container's /dev is still mounted")
		}
		if _, err := n.alloc.Allocation("forks"); !errors.Is(err, allocator.ErrUnknownOwner) {
			t.Errorf("allocation left: %v", err)
		}
		if vols, _ := n.vols.List(ctx); len(vols) == 1 && len(vols[0].Users) != 0 {
			t.Errorf("volume users left: %v", vols[0].Users)
		}
		if ct.Pid == 0 {
			t.Error("no pid reported")
		}
		if err := n.c.Destroy(ctx, "forks"); err != nil {
			t.Errorf("destroying a destroyed container: %v", err)
		}
	})
}

// TestBadInput: typed errors, and nothing created.
func TestBadInput(t *testing.T) {
	versions(t, func(t *testing.T, n *testNode) {
		ctx := context.Background()
		cmd := []string{"/bin/true"}
		tests := []struct {
			name string
			spec containerizer.Spec
			want error
		}{
			{"parent path", containerizer.Spec{ID: "../x", Command: cmd, GPUs: allocator.Request{Count: 1}}, node.ErrInvalidOwner},
			{"empty id", containerizer.Spec{ID: "", Command: cmd, GPUs: allocator.Request{Count: 1}}, node.ErrInvalidOwner},
			{"long id", containerizer.Spec{ID: strings.Repeat("x", 129), Command: cmd, GPUs: allocator.Request{Count: 1}}, node.ErrInvalidOwner},
			{"unknown GPU", containerizer.Spec{ID: "u", Command: cmd, GPUs: allocator.Request{Devices: []string{"GPU-nope"}}}, allocator.ErrUnknownDevice},
			{"larger than the sim", containerizer.Spec{ID: "big", Command: cmd, GPUs: allocator.Request{Count: 9}}, allocator.ErrInvalidRequest},
			{"no command", containerizer.Spec{ID: "nocmd", GPUs: allocator.Request{Count: 1}}, containerizer.ErrInvalidSpec},
			{"image", containerizer.Spec{ID: "img", Image: "busybox", Command: cmd, GPUs: allocator.Request{Count: 1}}, containerizer.ErrInvalidSpec},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				if _, err := n.c.Launch(ctx, tt.spec); !errors.Is(err, tt.want) {
					t.Fatalf("Launch = %v, want %v", err, tt.want)
				}
			})
		}
		if owners, _ := n.iso.Owners(ctx); len(owners) != 0 {
			t.Errorf("cgroups created: %v", owners)
		}
		if entries, _ := os.ReadDir(n.dirs.State); len(entries) != 0 {
			t.Errorf("state created: %v", entries)
		}
		if als := n.alloc.Allocations(); len(als) != 0 {
			t.Errorf("allocations made: %v", als)
		}
		if len(n.c.Containers()) != 0 {
			t.Errorf("containers listed: %v", n.c.Containers())
		}
	})
}

// TestUsage: the container's processes on its GPU, as the (simulated) driver
// lists them, and nobody else's.
func TestUsage(t *testing.T) {
	n := newNode(t, hostVersion())
	ctx := context.Background()
	ct, err := n.c.Launch(ctx, containerizer.Spec{ID: "busy", Command: []string{"/bin/sleep", "1000"}, GPUs: allocator.Request{Devices: []string{"4"}}})
	if err != nil {
		t.Fatal(err)
	}
	n.sim.SetProcesses(4, nvml.ProcessInfo{Pid: uint32(ct.Pid), UsedGpuMemory: 3 << 30}, nvml.ProcessInfo{Pid: 1, UsedGpuMemory: 5 << 30})
	n.sim.SetProcessUtilization(4, nvml.ProcessUtilizationSample{Pid: uint32(ct.Pid), SmUtil: 87, MemUtil: 40}, nvml.ProcessUtilizationSample{Pid: 1, SmUtil: 99})
	u, err := n.c.Usage(ctx, "busy")
	if err != nil {
		t.Fatal(err)
	}
	if len(u.GPUs) != 1 || u.GPUs[0].MemoryBytes != 3<<30 || !slices.Equal(u.GPUs[0].Processes, []int{ct.Pid}) ||
		u.GPUs[0].SMUtilization == nil || *u.GPUs[0].SMUtilization != 87 {
		t.Fatalf("usage = %+v", u)
	}
	if _, err := n.c.Usage(ctx, "nobody"); !errors.Is(err, containerizer.ErrUnknownContainer) {
		t.Fatalf("usage of an unknown container: %v", err)
	}
}
