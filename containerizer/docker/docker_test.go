package docker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/docker"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/volume"
)

const needed = "nvidia_driver"

// TestLaunchWithVolume proves what a container of an nvidia-docker image
// given 2 GPUs of a simulated DGX-1 gets: its two GPU nodes (ENXIO: allowed,
// no hardware), no other GPU node, the control devices, the volume
// read-only, and the environment naming its GPUs and the volume.
func TestLaunchWithVolume(t *testing.T) {
	r := newRig(t, "dgx1-volta", false)
	img := r.image(t, map[string]string{volume.LabelVolumesNeeded: needed}, map[string]string{"PATH": "/bin"})
	var all []string
	for i := range r.node.Len() {
		all = append(all, fmt.Sprintf("/dev/nvidia%d", r.node.Minor(i)))
	}
	spec := containerizer.Spec{ID: "gpus-2", Image: img, GPUs: allocator.Request{Count: 2}}

	spec.Command = append([]string{"open", "/dev/nvidiactl", "/dev/nvidia-uvm"}, all...)
	c, out, _, code := r.run(t, spec)
	if code != 0 || len(c.GPUs) != 2 || c.Kind != containerizer.KindDocker || c.RuntimeID == "" {
		t.Fatalf("container %+v exited %d", c, code)
	}
	if c.Volume == "" {
		t.Fatal("an image with the label got no volume")
	}
	got := lines(out)
	for _, p := range all {
		want := "ENOENT"
		if slices.ContainsFunc(c.GPUs, func(g node.DeviceRef) bool { return p == fmt.Sprintf("/dev/nvidia%d", g.Minor) }) {
			want = "ENXIO"
		}
		if got[p] != want {
			t.Errorf("open %s = %q, want %s (GPUs %v)", p, got[p], want, c.GPUs)
		}
	}
	for _, p := range []string{"/dev/nvidiactl", "/dev/nvidia-uvm"} {
		if got[p] != "ENXIO" {
			t.Errorf("open %s = %q, want ENXIO", p, got[p])
		}
	}

	// The same GPUs again, by UUID, for the rest.
	spec.GPUs = allocator.Request{Devices: []string{c.GPUs[0].UUID, c.GPUs[1].UUID}}
	spec.Command = []string{"ls", "/dev"}
	_, out, _, _ = r.run(t, spec)
	var nodes []string
	for l := range strings.Lines(out) {
		if name := strings.TrimSpace(l); strings.HasPrefix(name, "nvidia") && !strings.HasPrefix(name, "nvidia-") && name != "nvidiactl" {
			nodes = append(nodes, name)
		}
	}
	wantNodes := []string{fmt.Sprintf("nvidia%d", c.GPUs[0].Minor), fmt.Sprintf("nvidia%d", c.GPUs[1].Minor)}
	slices.Sort(nodes)
	slices.Sort(wantNodes)
	if !slices.Equal(nodes, wantNodes) {
		t.Errorf("GPU nodes in /dev = %v, want %v", nodes, wantNodes)
	}

	spec.Command = []string{"write", "/usr/local/nvidia/x", "/usr/local/nvidia/lib64/x", "/tmp-probe"}
	_, out, _, _ = r.run(t, spec)
	got = lines(out)
	if got["/usr/local/nvidia/x"] != "EROFS" || got["/usr/local/nvidia/lib64/x"] != "EROFS" {
		t.Errorf("writes into the volume: %q, want EROFS", out)
	}
	if got["/tmp-probe"] != "ok" {
		t.Errorf("write outside the volume = %q, want ok", got["/tmp-probe"])
	}

	spec.Command = []string{"ls", "/usr/local/nvidia/lib64"}
	_, out, _, _ = r.run(t, spec)
	if !strings.Contains(out, "libnvidia-ml.so.1") {
		t.Errorf("volume's lib64 holds %q, want libnvidia-ml.so.1", out)
	}

	spec.Command = []string{"env", "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "PATH", "LD_LIBRARY_PATH"}
	spec.Env = []string{"USER_SET=1"}
	_, out, _, _ = r.run(t, spec)
	uuids := c.GPUs[0].UUID + "," + c.GPUs[1].UUID
	for _, want := range []string{
		"NVIDIA_VISIBLE_DEVICES=" + uuids,
		"CUDA_VISIBLE_DEVICES=" + uuids,
		"PATH=/bin:/usr/local/nvidia/bin",
		"LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("environment %q lacks %q", out, want)
		}
	}

	if a := r.alloc.Allocations(); len(a) != 0 {
		t.Errorf("allocations after destroy: %+v", a)
	}
	vols, err := r.volumes.List(context.Background())
	if err != nil || len(vols) != 1 || len(vols[0].Users) != 0 {
		t.Errorf("volumes after destroy = %+v, %v; want one without users", vols, err)
	}
	if left := r.ours(t); len(left) != 0 {
		t.Errorf("containers left: %v", left)
	}
}

// TestLaunchWithoutVolume: an image without the label (or with
// NVIDIA_VISIBLE_DEVICES=void) gets its GPU but no volume; its output goes to
// the spec's writers, stdout and stderr apart, and its exit status comes
// back.
func TestLaunchWithoutVolume(t *testing.T) {
	r := newRig(t, "pcie8", false)
	tests := []struct {
		name string
		env  map[string]string
	}{
		{"no label", nil},
		{"visible devices void", map[string]string{volume.EnvVisibleDevices: "void"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			img := r.image(t, nil, tt.env)
			c, out, _, code := r.run(t, containerizer.Spec{ID: "plain", Image: img, Command: []string{"ls", "/usr/local/nvidia"}, GPUs: allocator.Request{Count: 1}})
			if c.Volume != "" || code != 0 || strings.TrimSpace(out) != "/usr/local/nvidia ENOENT" {
				t.Fatalf("container %+v: ls /usr/local/nvidia = %q (exit %d); want no volume", c, out, code)
			}
			_, out, errOut, code := r.run(t, containerizer.Spec{ID: "plain", Image: img, Command: []string{"bogus"}, GPUs: allocator.Request{Count: 1}})
			if code != 2 || out != "" || !strings.Contains(errOut, `unknown command "bogus"`) {
				t.Fatalf("probe bogus: exit %d, stdout %q, stderr %q", code, out, errOut)
			}
			if _, _, _, code := r.run(t, containerizer.Spec{ID: "plain", Image: img, Command: []string{"exit", "42"}}); code != 42 {
				t.Fatalf("probe exit 42: exit %d", code)
			}
		})
	}
}

// TestRequirementUnmet: an image whose requirement the driver (or the GPU
// it would get) cannot meet is refused with the typed error; no container is
// created and no GPU is held.
func TestRequirementUnmet(t *testing.T) {
	r := newRig(t, "dgx1-volta", false)
	tests := []struct {
		name string
		env  map[string]string
		gpu  bool // the GPU, not the driver, fails it
	}{
		{"cuda", map[string]string{volume.EnvRequireCUDA: "cuda>=99.0"}, false},
		{"cuda version", map[string]string{volume.EnvCUDAVersion: "99.1.0"}, false},
		{"arch", map[string]string{volume.EnvRequireCUDA: "arch>=9.0"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			img := r.image(t, map[string]string{volume.LabelVolumesNeeded: needed}, tt.env)
			ctx := context.Background()
			c, err := r.z.Launch(ctx, containerizer.Spec{ID: "too-new", Image: img, GPUs: allocator.Request{Count: 2}})
			var unmet *volume.UnmetError
			if !errors.Is(err, volume.ErrRequirementUnmet) || !errors.As(err, &unmet) {
				t.Fatalf("Launch = %+v, %v; want an *UnmetError", c, err)
			}
			if (unmet.GPU >= 0) != tt.gpu {
				t.Errorf("unmet on GPU %d, want the GPU to fail it: %v", unmet.GPU, tt.gpu)
			}
			if a := r.alloc.Allocations(); len(a) != 0 {
				t.Errorf("GPUs held after a refused launch: %+v", a)
			}
			if left := r.ours(t); len(left) != 0 {
				t.Errorf("containers created for a refused launch: %v", left)
			}
			if cs := r.z.Containers(); len(cs) != 0 {
				t.Errorf("containerizer knows %+v after a refused launch", cs)
			}
			// Turned off, the same image runs.
			_, _, _, code := r.run(t, containerizer.Spec{ID: "too-new", Image: img, Command: []string{"exit", "0"}, Env: []string{volume.EnvDisableRequire + "=true"}, GPUs: allocator.Request{Count: 2}})
			if code != 0 {
				t.Fatalf("with %s=true: exit %d", volume.EnvDisableRequire, code)
			}
		})
	}
}

// TestParallelLaunches: eight launches of 1 GPU at once on an 8-GPU node
// all succeed on disjoint GPUs; a ninth gets the "not enough GPUs" error
// and creates nothing.
func TestParallelLaunches(t *testing.T) {
	r := newRig(t, "pcie8", false)
	img := r.image(t, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	cs := make([]containerizer.Container, 8)
	errs := make([]error, 8)
	for i := range 8 {
		wg.Go(func() {
			cs[i], errs[i] = r.z.Launch(ctx, containerizer.Spec{ID: fmt.Sprintf("job-%d", i), Image: img, Command: []string{"sleep", "60"}, GPUs: allocator.Request{Count: 1}})
		})
	}
	wg.Wait()
	seen := map[string]string{}
	for i, c := range cs {
		if errs[i] != nil {
			t.Fatalf("launch job-%d: %v", i, errs[i])
		}
		if len(c.GPUs) != 1 {
			t.Fatalf("job-%d got %v", i, c.GPUs)
		}
		if other, dup := seen[c.GPUs[0].UUID]; dup {
			t.Fatalf("job-%d and %s share GPU %s", i, other, c.GPUs[0].UUID)
		}
		seen[c.GPUs[0].UUID] = c.ID
	}
	_, err := r.z.Launch(ctx, containerizer.Spec{ID: "job-8", Image: img, Command: []string{"sleep", "60"}, GPUs: allocator.Request{Count: 1}})
	var insufficient *allocator.InsufficientError
	if !errors.Is(err, node.ErrInsufficient) || !errors.As(err, &insufficient) {
		t.Fatalf("ninth launch = %v, want ErrInsufficient", err)
	}
	if n := len(r.ours(t)); n != 8 {
		t.Fatalf("%d containers after the ninth launch, want 8", n)
	}
	for i := range 8 {
		wg.Go(func() {
			errs[i] = r.z.Destroy(ctx, fmt.Sprintf("job-%d", i))
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if len(r.alloc.Allocations()) != 0 || len(r.ours(t)) != 0 || len(r.z.Containers()) != 0 {
		t.Fatalf("left after destroy: allocations %+v, containers %v", r.alloc.Allocations(), r.ours(t))
	}
}

// TestUpdateNotSupported: Docker cannot change a created container's
// devices, so its runtime is no Updater; Update says so and changes
// nothing.
func TestUpdateNotSupported(t *testing.T) {
	if _, ok := any(&docker.Runtime{}).(containerizer.Updater); ok {
		t.Error("the Docker runtime is a containerizer.Updater: it can change no container's devices")
	}
	r := newRig(t, "pcie8", false)
	img := r.image(t, nil, nil)
	ctx := context.Background()
	c, err := r.z.Launch(ctx, containerizer.Spec{ID: "fixed", Image: img, Command: []string{"sleep", "60"}, GPUs: allocator.Request{Count: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.z.Destroy(ctx, "fixed")
	before := r.alloc.Allocations()
	if _, err := r.z.Update(ctx, "fixed", 2); !errors.Is(err, containerizer.ErrNotSupported) {
		t.Fatalf("Update = %v, want ErrNotSupported", err)
	}
	if _, err := r.z.Update(ctx, "nobody", 2); !errors.Is(err, containerizer.ErrUnknownContainer) {
		t.Fatalf("Update(nobody) = %v, want ErrUnknownContainer", err)
	}
	if after := r.alloc.Allocations(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("allocations changed by a refused update: %+v -> %+v", before, after)
	}
	if cs := r.z.Containers(); len(cs) != 1 || fmt.Sprint(cs[0]) != fmt.Sprint(c) {
		t.Fatalf("containers after a refused update = %+v, want [%+v]", cs, c)
	}
}

// TestRecover: the containerizer is dropped while its containers run and a
// new one starts over the same allocator state and daemon: the containers
// are re-adopted with their GPUs, one that exited meanwhile reports its
// status, one removed behind its back has its GPUs released, and new
// launches get other GPUs. With the allocator's state lost as well, the GPUs
// are taken back from the containers' labels.
func TestRecover(t *testing.T) {
	for _, lost := range []bool{false, true} {
		t.Run(fmt.Sprintf("state lost=%v", lost), func(t *testing.T) {
			r := newRig(t, "dgx1-volta", false)
			img := r.image(t, map[string]string{volume.LabelVolumesNeeded: needed}, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			launch := func(id string, n int, cmd ...string) containerizer.Container {
				t.Helper()
				c, err := r.z.Launch(ctx, containerizer.Spec{ID: id, Image: img, Command: cmd, GPUs: allocator.Request{Count: n}})
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			long := launch("long", 2, "sleep", "120")
			short := launch("short", 1, "exit", "3")
			gone := launch("gone", 1, "sleep", "120")
			if _, err := r.cli.ContainerRemove(ctx, gone.RuntimeID, client.ContainerRemoveOptions{Force: true}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(500 * time.Millisecond) // let "short" exit

			if lost {
				r.stateDir = t.TempDir()
			}
			r.restart(t)
			if cs := r.z.Containers(); len(cs) != 0 {
				t.Fatalf("a new containerizer knows %+v before Recover", cs)
			}
			cs, err := r.z.Recover(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(cs) != 2 || cs[0].ID != "long" || cs[1].ID != "short" {
				t.Fatalf("recovered %+v, want long and short", cs)
			}
			if cs[0].State != containerizer.StateRunning || cs[1].State != containerizer.StateExited {
				t.Errorf("states %s, %s; want running, exited", cs[0].State, cs[1].State)
			}
			if cs[0].Volume != long.Volume || cs[0].RuntimeID != long.RuntimeID {
				t.Errorf("recovered %+v, launched %+v", cs[0], long)
			}
			for _, want := range []containerizer.Container{long, short} {
				a, err := r.alloc.Allocation(want.ID)
				if err != nil || fmt.Sprint(uuidsOf(a.Devices)) != fmt.Sprint(uuidsOf(want.GPUs)) {
					t.Errorf("allocation of %s = %+v, %v; want %v", want.ID, a.Devices, err, want.GPUs)
				}
			}
			if _, err := r.alloc.Allocation("gone"); !errors.Is(err, allocator.ErrUnknownOwner) {
				t.Errorf("the removed container's GPUs: %v, want released", err)
			}
			if st, err := r.z.Wait(ctx, "short"); err != nil || st.Code != 3 {
				t.Errorf("Wait(short) = %+v, %v; want exit 3", st, err)
			}
			// The 5 GPUs left, and none of the recovered ones.
			fresh := launch("fresh", 5, "exit", "0")
			for _, g := range fresh.GPUs {
				if slices.Contains(uuidsOf(long.GPUs), g.UUID) || slices.Contains(uuidsOf(short.GPUs), g.UUID) {
					t.Errorf("fresh got %s, held by a recovered container", g.UUID)
				}
			}
			for _, id := range []string{"long", "short", "fresh"} {
				if err := r.z.Destroy(ctx, id); err != nil {
					t.Fatal(err)
				}
			}
			if len(r.alloc.Allocations()) != 0 || len(r.ours(t)) != 0 {
				t.Fatalf("left after destroy: %+v, %v", r.alloc.Allocations(), r.ours(t))
			}
		})
	}
}

func uuidsOf(refs []node.DeviceRef) []string {
	var out []string
	for _, r := range refs {
		out = append(out, r.UUID)
	}
	slices.Sort(out)
	return out
}

// TestDaemonRestart: dockerd killed under a running container. While it is
// down the containerizer reports ErrDaemonUnavailable and changes nothing;
// when it is back, Recover finds the container (the daemon stopped it) with
// its GPUs, and launches and destroys work again.
func TestDaemonRestart(t *testing.T) {
	r := newRig(t, "pcie8", true)
	img := r.image(t, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c, err := r.z.Launch(ctx, containerizer.Spec{ID: "survivor", Image: img, Command: []string{"sleep", "300"}, GPUs: allocator.Request{Count: 2}})
	if err != nil {
		t.Fatal(err)
	}

	start := testenv.StopDockerd(t, r.cli)
	before := fmt.Sprint(r.alloc.Allocations())
	if _, err := r.z.Launch(ctx, containerizer.Spec{ID: "while-down", Image: img, GPUs: allocator.Request{Count: 1}}); !errors.Is(err, docker.ErrDaemonUnavailable) {
		t.Errorf("Launch while dockerd is down = %v, want ErrDaemonUnavailable", err)
	}
	var de *docker.DaemonError
	if _, err := r.z.Recover(ctx); !errors.As(err, &de) {
		t.Errorf("Recover while dockerd is down = %v, want a *DaemonError", err)
	}
	if err := r.z.Destroy(ctx, "survivor"); !errors.Is(err, docker.ErrDaemonUnavailable) {
		t.Errorf("Destroy while dockerd is down = %v, want ErrDaemonUnavailable", err)
	}
	if after := fmt.Sprint(r.alloc.Allocations()); after != before {
		t.Errorf("allocations changed while dockerd was down: %s -> %s", before, after)
	}
	if cs := r.z.Containers(); len(cs) != 1 || cs[0].ID != "survivor" {
		t.Errorf("containers while dockerd is down: %+v", cs)
	}
	if err := start(); err != nil {
		t.Fatal(err)
	}

	cs, err := r.z.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 1 || cs[0].RuntimeID != c.RuntimeID || fmt.Sprint(uuidsOf(cs[0].GPUs)) != fmt.Sprint(uuidsOf(c.GPUs)) {
		t.Fatalf("recovered %+v, want %+v", cs, c)
	}
	if a, err := r.alloc.Allocation("survivor"); err != nil || len(a.Devices) != 2 {
		t.Fatalf("survivor's allocation = %+v, %v", a, err)
	}
	if _, _, _, code := r.run(t, containerizer.Spec{ID: "after", Image: img, Command: []string{"exit", "5"}, GPUs: allocator.Request{Count: 1}}); code != 5 {
		t.Fatalf("launch after the restart: exit %d", code)
	}
	if err := r.z.Destroy(ctx, "survivor"); err != nil {
		t.Fatal(err)
	}
	if len(r.alloc.Allocations()) != 0 || len(r.ours(t)) != 0 {
		t.Fatalf("left after destroy: %+v, %v", r.alloc.Allocations(), r.ours(t))
	}
}
