package cdi_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cdi"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/volume"
)

// podmanNode is a simulated node with real device nodes, its spec written
// into the runtime's spec directory under a kind of its own (Podman 4.3
// reads /etc/cdi and /var/run/cdi only), and a probe image.
type podmanNode struct {
	podman, image, kind string
	inv                 *node.Inventory
	nvidiaMajor         uint32
	vol                 *volume.Volume
}

func newPodmanNode(tb testing.TB) *podmanNode {
	tb.Helper()
	podman := testenv.RequirePodman(tb)
	_, host, inv := testenv.SimulatedNode(tb, "dgx1-volta")
	volDir := tb.TempDir()
	if err := os.MkdirAll(filepath.Join(volDir, "lib64"), 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(volDir, "lib64", "libcuda.so.1"), []byte("not a library\n"), 0o644); err != nil {
		tb.Fatal(err)
	}
	n := &podmanNode{
		podman:      podman,
		image:       testenv.BuildPodmanProbeImage(tb, podman),
		kind:        fmt.Sprintf("gpuiso.test/gpu-%d-%d", os.Getpid(), time.Now().UnixNano()),
		inv:         inv,
		nvidiaMajor: host.NVIDIAMajor,
		vol:         &volume.Volume{Version: inv.DriverVersion, Path: volDir},
	}
	tb.Cleanup(func() { cdi.Writer{}.Remove(context.Background(), n.kind) })
	n.write(tb)
	return n
}

// write puts the spec of n's inventory where Podman reads it.
func (n *podmanNode) write(tb testing.TB) {
	tb.Helper()
	spec, err := cdi.New(n.inv, cdi.WithKind(n.kind), cdi.WithVolume(n.vol))
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := (cdi.Writer{}).Write(context.Background(), spec); err != nil {
		tb.Fatal(err)
	}
}

// run runs the probe with args in a container given the CDI devices.
func (n *podmanNode) run(tb testing.TB, devices []string, args ...string) (string, error) {
	tb.Helper()
	cmd := append([]string{"run", "--rm"}, testenv.PodmanRunFlags...)
	for _, d := range devices {
		cmd = append(cmd, "--device", d)
	}
	cmd = append(cmd, n.image)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return testenv.RunPodman(ctx, n.podman, append(cmd, args...)...)
}

func (n *podmanNode) mustRun(tb testing.TB, devices []string, args ...string) map[string]string {
	tb.Helper()
	out, err := n.run(tb, devices, args...)
	if err != nil {
		tb.Fatal(err)
	}
	return parseProbe(out)
}

func mapHas(m map[string]string, k string) bool { _, ok := m[k]; return ok }

// derive builds an image from n's probe image with the Containerfile
// instructions given, removed when the test ends.
func (n *podmanNode) derive(tb testing.TB, instructions ...string) string {
	tb.Helper()
	dir := tb.TempDir()
	file := "FROM " + n.image + "\n" + strings.Join(instructions, "\n") + "\n"
	if err := os.WriteFile(filepath.Join(dir, "Containerfile"), []byte(file), 0o644); err != nil {
		tb.Fatal(err)
	}
	name := n.image + "-derived"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, err := testenv.RunPodman(ctx, n.podman, "build", "--pull=never", "-t", name, dir); err != nil {
		tb.Fatalf("build derived image: %v: %s", err, out)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		testenv.RunPodman(ctx, n.podman, "rmi", "--force", name)
	})
	return name
}

// parseProbe reads the probe's output: "<name> <result>" or "KEY=value"
// lines, or a bare name that ls printed.
func parseProbe(out string) map[string]string {
	res := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok {
			res[k] = v
		} else if k, v, ok := strings.Cut(line, "="); ok {
			res[k] = v
		} else {
			res[line] = "" // a name that ls printed
		}
	}
	return res
}

var controlNodes = []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}

// allowed is what an open of a node the container may use gives: anything
// but EPERM (the device cgroup) and ENOENT (not in the container's /dev).
func allowed(r string) bool { return r != "" && r != "EPERM" && r != "ENOENT" }

// TestPodman runs a probe through Podman, a real CDI runtime, with devices
// of a spec gpuiso generated for a simulated node, and checks that the
// container gets exactly what the spec names.
func TestPodman(t *testing.T) {
	n := newPodmanNode(t)
	gpuNodes := func() []string {
		var p []string
		for _, d := range n.inv.Devices {
			p = append(p, "/dev/"+filepath.Base(d.Node.Path))
		}
		return p
	}()
	byUUID, err := cdi.Names(n.kind, []node.DeviceRef{n.inv.Devices[5].Ref()})
	if err != nil {
		t.Fatal(err)
	}
	// An allocation's names in the node's spec, as a program that writes
	// only that spec asks for them.
	allocNames, err := cdi.AllocationNames(n.kind, allocator.Allocation{Owner: "task-1", Devices: []node.DeviceRef{n.inv.Devices[2].Ref(), n.inv.Devices[4].Ref()}})
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name    string
		devices []string
		want    []int // positions of the GPUs the container must get
	}{
		{"by index", []string{n.kind + "=3"}, []int{3}},
		{"by UUID", byUUID, []int{5}},
		{"two", []string{n.kind + "=1", n.kind + "=6"}, []int{1, 6}},
		{"an allocation's names", allocNames, []int{2, 4}},
		{"all", []string{n.kind + "=" + cdi.AllDevices}, []int{0, 1, 2, 3, 4, 5, 6, 7}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := n.mustRun(t, tc.devices, append([]string{"open"}, append(gpuNodes, controlNodes...)...)...)
			for i, p := range gpuNodes {
				if want := slices.Contains(tc.want, i); allowed(got[p]) != want {
					t.Errorf("%s: %s (allowed %v, want %v)", p, got[p], allowed(got[p]), want)
				}
			}
			for _, p := range controlNodes {
				if !allowed(got[p]) {
					t.Errorf("control node %s: %s", p, got[p])
				}
			}
		})
	}

	t.Run("environment and volume", func(t *testing.T) {
		// A GPU's device sets no variable, and the spec leaves PATH and
		// LD_LIBRARY_PATH as the image has them.
		bare := n.mustRun(t, nil, "env", "PATH", "LD_LIBRARY_PATH")
		env := n.mustRun(t, []string{n.kind + "=3"}, "env", "NVIDIA_VISIBLE_DEVICES", "PATH", "LD_LIBRARY_PATH")
		if env["NVIDIA_VISIBLE_DEVICES"] != "" {
			t.Errorf("NVIDIA_VISIBLE_DEVICES=%q from a GPU's device, want it unset", env["NVIDIA_VISIBLE_DEVICES"])
		}
		if env["PATH"] != bare["PATH"] || env["LD_LIBRARY_PATH"] != bare["LD_LIBRARY_PATH"] {
			t.Errorf("PATH=%q LD_LIBRARY_PATH=%q, want the image's %q %q", env["PATH"], env["LD_LIBRARY_PATH"], bare["PATH"], bare["LD_LIBRARY_PATH"])
		}
		ls := n.mustRun(t, []string{n.kind + "=3"}, "ls", volume.ContainerLib64)
		if _, ok := ls["libcuda.so.1"]; !ok {
			t.Errorf("volume not mounted: ls %s = %v", volume.ContainerLib64, ls)
		}
		w := n.mustRun(t, []string{n.kind + "=3"}, "write", volume.ContainerPath+"/x")
		if r := w[volume.ContainerPath+"/x"]; r != "EROFS" {
			t.Errorf("write into the volume: %s, want EROFS", r)
		}
	})

	t.Run("allocation of two GPUs", func(t *testing.T) {
		// An image whose PATH holds its own tool directory, given an
		// allocation's CDI names for two GPUs and the driver volume.
		imagePath := "/opt/tool/bin:/usr/local/bin:/usr/bin:/bin"
		image := n.derive(t, "ENV PATH="+imagePath)
		gpus := []node.DeviceRef{n.inv.Devices[2].Ref(), n.inv.Devices[6].Ref()}
		al := allocator.Allocation{Owner: "task-2", Devices: gpus}
		inj := n.vol.Injection([]string{"PATH=" + imagePath})
		mount := ocispecs.Mount{Source: inj.Mount.Source, Destination: inj.Mount.Destination, Type: inj.Mount.Type, Options: inj.Mount.Options}
		plan, err := isolator.NewPlan(al.Owner, n.inv, al.Devices, []ocispecs.Mount{mount}, inj.Env)
		if err != nil {
			t.Fatal(err)
		}
		spec, err := cdi.Render(n.kind, plan)
		if err != nil {
			t.Fatal(err)
		}
		res, err := (cdi.Writer{}).WriteAllocation(context.Background(), al.Owner, spec)
		t.Cleanup(func() { cdi.Writer{}.RemoveAllocation(context.Background(), n.kind, al.Owner) })
		if err != nil {
			t.Fatal(err)
		}
		names := res.Names
		run := func(args ...string) map[string]string {
			t.Helper()
			cmd := append([]string{"run", "--rm"}, testenv.PodmanRunFlags...)
			for _, d := range names {
				cmd = append(cmd, "--device", d)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			out, err := testenv.RunPodman(ctx, n.podman, append(append(cmd, image), args...)...)
			if err != nil {
				t.Fatal(err)
			}
			return parseProbe(out)
		}
		env := run("env", "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "PATH")
		visible := gpus[0].UUID + "," + gpus[1].UUID
		if env["NVIDIA_VISIBLE_DEVICES"] != visible || env["CUDA_VISIBLE_DEVICES"] != visible {
			t.Errorf("NVIDIA_VISIBLE_DEVICES=%q CUDA_VISIBLE_DEVICES=%q, want both %q", env["NVIDIA_VISIBLE_DEVICES"], env["CUDA_VISIBLE_DEVICES"], visible)
		}
		if env["PATH"] != imagePath {
			t.Errorf("PATH=%q, want the image's %q", env["PATH"], imagePath)
		}
		got := run(append([]string{"open"}, append(gpuNodes, controlNodes...)...)...)
		for i, p := range gpuNodes {
			if want := i == 2 || i == 6; allowed(got[p]) != want {
				t.Errorf("%s: %s (allowed %v, want %v)", p, got[p], allowed(got[p]), want)
			}
		}
		for _, p := range controlNodes {
			if !allowed(got[p]) {
				t.Errorf("control node %s: %s", p, got[p])
			}
		}
		if ls := run("ls", volume.ContainerLib64); !mapHas(ls, "libcuda.so.1") {
			t.Errorf("volume not mounted: ls %s = %v", volume.ContainerLib64, ls)
		}
	})

	t.Run("self-made node of another GPU", func(t *testing.T) {
		other := n.inv.Devices[2].Node
		// The container may try mknod; the device cgroup refuses either the
		// node or its open.
		out, err := n.run(t, []string{n.kind + "=3"}, "mknod", "/dev/nvidia"+fmt.Sprint(other.Minor), fmt.Sprint(n.nvidiaMajor), fmt.Sprint(other.Minor), "open")
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		mk, _ := strings.CutPrefix(lines[0], fmt.Sprintf("/dev/nvidia%d ", other.Minor))
		var open string
		if len(lines) > 1 {
			open, _ = strings.CutPrefix(lines[1], fmt.Sprintf("/dev/nvidia%d ", other.Minor))
		}
		if mk != "EPERM" && open != "EPERM" {
			t.Errorf("mknod %d:%d then open: %q, want EPERM for one of them", n.nvidiaMajor, other.Minor, lines)
		}
	})

	t.Run("unhealthy GPU leaves the spec", func(t *testing.T) {
		n.inv.Devices[4].Health = node.Unhealthy("XID 79")
		defer func() { n.inv.Devices[4].Health = node.Healthy(); n.write(t) }()
		n.write(t)
		out, err := n.run(t, []string{n.kind + "=4"}, "exit", "0")
		if err == nil || !strings.Contains(out, "unresolvable CDI devices") {
			t.Fatalf("unhealthy GPU still handed out: %v: %s", err, out)
		}
	})
}
