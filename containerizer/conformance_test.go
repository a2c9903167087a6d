package containerizer_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/docker"
	"github.com/gpuiso/gpuiso/containerizer/native"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
	"github.com/gpuiso/gpuiso/isolator/dockerconfig"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/simnode"
	"github.com/gpuiso/gpuiso/volume"
)

// conformance is one back end under the shared cases: a fresh allocator and
// containerizer on the same simulated node for every case.
type conformance struct {
	t     *testing.T
	kind  containerizer.Kind
	sim   *simnode.Node
	host  *simnode.Host
	inv   *node.Inventory
	alloc *allocator.Allocator
	c     containerizer.Containerizer
	// spec makes the spec of a container running the probe with args.
	spec func(id string, req allocator.Request, args ...string) containerizer.Spec
	// leftovers lists what the back end still holds of id outside the
	// containerizer (Docker containers, cgroups).
	leftovers func(id string) []string
	// mps runs the daemons of memory shares.
	mps *mps.Manager
}

// run launches a container that answers the probe's questions, waits for
// it, destroys it, and returns its output as a set of lines.
func (b *conformance) run(id string, req allocator.Request, args ...string) (containerizer.Container, map[string]bool) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out testenv.Buffer
	spec := b.spec(id, req, args...)
	spec.Stdout, spec.Stderr = &out, &out
	ct, err := b.c.Launch(ctx, spec)
	if err != nil {
		b.t.Fatalf("%s: launch %s: %v", b.kind, id, err)
	}
	if st, err := b.c.Wait(ctx, id); err != nil || st.Code != 0 {
		b.t.Fatalf("%s: %s: exit %+v, %v\n%s", b.kind, id, st, err, out.String())
	}
	if err := b.c.Destroy(ctx, id); err != nil {
		b.t.Fatal(err)
	}
	got := map[string]bool{}
	for l := range strings.Lines(out.String()) {
		got[strings.TrimSpace(l)] = true
	}
	return ct, got
}

// nothingLeft fails unless id holds nothing: no allocation, no container,
// nothing of the back end.
func (b *conformance) nothingLeft(id string) {
	b.t.Helper()
	if al, err := b.alloc.Allocation(id); err == nil {
		b.t.Errorf("%s: %s still holds %+v", b.kind, id, al)
	}
	if slices.ContainsFunc(b.c.Containers(), func(c containerizer.Container) bool { return c.ID == id }) {
		b.t.Errorf("%s: container %s is still listed", b.kind, id)
	}
	if left := b.leftovers(id); len(left) > 0 {
		b.t.Errorf("%s: %s left %v", b.kind, id, left)
	}
	if ds, err := b.mps.List(context.Background()); err != nil || slices.ContainsFunc(ds, func(d mps.Daemon) bool { return d.Owner == id }) {
		b.t.Errorf("%s: %s left an MPS daemon: %+v, %v", b.kind, id, ds, err)
	}
}

// conformanceMPS is a daemon manager for a back end under the cases.
func conformanceMPS(t *testing.T) *mps.Manager {
	t.Helper()
	m, err := mps.New(filepath.Join(t.TempDir(), "mps"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := m.Sweep(context.Background(), nil); err != nil {
			t.Error(err)
		}
		m.Close()
	})
	return m
}

// TestConformance runs the same container cases against the native and the
// Docker back ends (root, real cgroups, a real dockerd): both must behave
// alike for GPU-less containers, GPUs shared by memory, requirement
// refusals, Destroy during Launch and shrinks.
func TestConformance(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCgroupV1Devices(t)
	cli := testenv.RequireDocker(t)
	testenv.LockDocker(t, false)
	testenv.RequireSimulatedMPS(t)
	sim, host, inv := testenv.SimulatedNode(t, "dgx1-volta")
	probe := testenv.BuildProbe(t)
	img := testenv.BuildProbeImage(t, cli, testenv.ProbeImage{})
	ns := fmt.Sprintf("test-conformance-%d", time.Now().UnixNano())
	t.Cleanup(func() { removeNamespace(cli, ns) })
	parent := fmt.Sprintf("gpuiso-conformance-%d", os.Getpid())

	backends := map[containerizer.Kind]func(t *testing.T, opts ...allocator.Option) *conformance{
		containerizer.KindNative: func(t *testing.T, opts ...allocator.Option) *conformance {
			alloc := newAllocator(t, inv, opts...)
			iso, err := cgroups.New(cgroups.WithVersion(cgroups.V1), cgroups.WithMount("/sys/fs/cgroup/devices"), cgroups.WithParent(parent))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.Remove(filepath.Dir(iso.Path("x"))) })
			m := conformanceMPS(t)
			c, err := native.New(native.Config{Allocator: alloc, Inventory: inv, Isolator: iso, MPS: m, StateDir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			return &conformance{
				t: t, kind: containerizer.KindNative, sim: sim, host: host, inv: inv, alloc: alloc, c: c, mps: m,
				spec: func(id string, req allocator.Request, args ...string) containerizer.Spec {
					return containerizer.Spec{ID: id, Command: append([]string{probe}, args...), GPUs: req}
				},
				leftovers: func(id string) []string {
					if _, err := os.Stat(iso.Path(id)); err == nil {
						return []string{"cgroup " + iso.Path(id)}
					}
					return nil
				},
			}
		},
		containerizer.KindDocker: func(t *testing.T, opts ...allocator.Option) *conformance {
			alloc := newAllocator(t, inv, opts...)
			m := conformanceMPS(t)
			c, err := docker.New(cli, alloc, docker.WithNamespace(ns), docker.WithStopTimeout(time.Second), docker.WithMPS(m))
			if err != nil {
				t.Fatal(err)
			}
			return &conformance{
				t: t, kind: containerizer.KindDocker, sim: sim, host: host, inv: inv, alloc: alloc, c: c, mps: m,
				spec: func(id string, req allocator.Request, args ...string) containerizer.Spec {
					return containerizer.Spec{ID: id, Image: img, Command: args, GPUs: req}
				},
				leftovers: func(id string) []string {
					list, err := cli.ContainerList(context.Background(), client.ContainerListOptions{All: true,
						Filters: make(client.Filters).Add("label", docker.LabelNamespace+"="+ns).Add("label", dockerconfig.LabelOwner+"="+id)})
					if err != nil {
						return []string{err.Error()}
					}
					var out []string
					for _, s := range list.Items {
						out = append(out, "docker container "+s.ID)
					}
					return out
				},
			}
		},
	}

	cases := []struct {
		name string
		opts []allocator.Option
		run  func(t *testing.T, b *conformance)
	}{
		{"no GPUs: no GPU node, every GPU denied, visible devices void", nil, func(t *testing.T, b *conformance) {
			gpu := b.inv.Devices[0].Node
			_, got := b.run("cpu-only", allocator.Request{}, "do",
				"ls", "/dev", "--", "mknod", "/dev/made", fmt.Sprint(gpu.Major), fmt.Sprint(gpu.Minor), "--",
				"open", "/dev/made", "--", "env", "NVIDIA_VISIBLE_DEVICES")
			for l := range got {
				if strings.HasPrefix(l, "nvidia") && strings.TrimLeft(strings.TrimPrefix(l, "nvidia"), "0123456789") == "" {
					t.Errorf("%s: a container without GPUs has /dev/%s", b.kind, l)
				}
			}
			for _, want := range []string{"/dev/made ok", "/dev/made EPERM", "NVIDIA_VISIBLE_DEVICES=void"} {
				if !got[want] {
					t.Errorf("%s: missing %q in %v", b.kind, want, got)
				}
			}
			b.nothingLeft("cpu-only")
		}},
		{"GPUs shared by memory: the same limits and environment", []allocator.Option{allocator.WithShared("0")}, func(t *testing.T, b *conformance) {
			ctx := context.Background()
			spec := b.spec("slice", allocator.Request{Share: &allocator.Share{MemoryBytes: 4 << 30}}, "sleep", "30")
			if _, err := b.c.Launch(ctx, spec); err != nil {
				t.Fatal(err)
			}
			al, err := b.alloc.Allocation("slice")
			if err != nil || al.Share == nil || al.Share.Mode != allocator.ShareMemory {
				t.Fatalf("%s: allocation %+v, %v", b.kind, al, err)
			}
			lim, err := mps.LimitsOf(*al.Share)
			if err != nil || len(lim.Env()) == 0 {
				t.Fatalf("%s: limits of %+v: %+v, %v", b.kind, al.Share, lim, err)
			}
			if err := b.c.Destroy(ctx, "slice"); err != nil {
				t.Fatal(err)
			}
			keys := lim.Env()
			names := []string{"env"}
			for _, kv := range keys {
				k, _, _ := strings.Cut(kv, "=")
				names = append(names, k)
			}
			_, got := b.run("slice", allocator.Request{Share: &allocator.Share{MemoryBytes: 4 << 30}}, names...)
			for _, kv := range keys {
				if !got[kv] {
					t.Errorf("%s: the container lacks %s: %v", b.kind, kv, got)
				}
			}
			b.nothingLeft("slice")
		}},
		{"a memory share's container sees its MPS daemon and nothing more", []allocator.Option{allocator.WithShared("0", "1")}, func(t *testing.T, b *conformance) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var out testenv.Buffer
			spec := b.spec("mps", allocator.Request{Share: &allocator.Share{MemoryBytes: 2 << 30, ComputePercent: 50}}, "do",
				"env", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_VISIBLE_DEVICES", "--",
				"ls", "/tmp/nvidia-mps", "--", "write", "/dev/shm/from-container", "--", "wait", "/dev/shm/from-host", "--", "ls", "/dev/shm")
			spec.Stdout, spec.Stderr = &out, &out
			ct, err := b.c.Launch(ctx, spec)
			if err != nil {
				t.Fatalf("%s: %v", b.kind, err)
			}
			ds, err := b.mps.List(ctx)
			if err != nil || len(ds) != 1 || ds[0].Owner != "mps" || !ds[0].Alive || ds[0].GPU != ct.GPUs[0].UUID {
				t.Fatalf("%s: daemons %+v, %v", b.kind, ds, err)
			}
			// The container's /dev/shm is its daemon's, both ways.
			for i := 0; ; i++ {
				if _, err := os.Stat(filepath.Join(ds[0].ShmDir, "from-container")); err == nil {
					break
				}
				if i > 10000 {
					t.Fatalf("%s: the container's /dev/shm is not its daemon's:\n%s", b.kind, out.String())
				}
				time.Sleep(time.Millisecond)
			}
			if err := os.WriteFile(filepath.Join(ds[0].ShmDir, "from-host"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if st, err := b.c.Wait(ctx, "mps"); err != nil || st.Code != 0 {
				t.Fatalf("%s: exit %+v, %v\n%s", b.kind, st, err, out.String())
			}
			if err := b.c.Destroy(ctx, "mps"); err != nil {
				t.Fatal(err)
			}
			got := map[string]bool{}
			for l := range strings.Lines(out.String()) {
				got[strings.TrimSpace(l)] = true
			}
			for _, want := range []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",
				"CUDA_VISIBLE_DEVICES=" + ct.GPUs[0].UUID, "control", "control_privileged", "/dev/shm/from-container ok", "from-host"} {
				if !got[want] {
					t.Errorf("%s: the container lacks %q:\n%s", b.kind, want, out.String())
				}
			}
			b.nothingLeft("mps")
		}},
		{"NVIDIA_REQUIRE_* refused before anything is held", nil, func(t *testing.T, b *conformance) {
			spec := b.spec("too-new", allocator.Request{Count: 1}, "exit", "0")
			spec.Env = []string{"NVIDIA_REQUIRE_CUDA=cuda>=99.0"}
			_, err := b.c.Launch(context.Background(), spec)
			var unmet *volume.UnmetError
			if !errors.As(err, &unmet) {
				t.Fatalf("%s: launch = %v, want an unmet requirement", b.kind, err)
			}
			if len(b.alloc.Allocations()) != 0 {
				t.Errorf("%s: allocations after a refusal: %+v", b.kind, b.alloc.Allocations())
			}
			b.nothingLeft("too-new")
		}},
		{"Destroy during Launch waits and tears down", nil, func(t *testing.T, b *conformance) {
			ctx := context.Background()
			launched := make(chan error, 1)
			go func() {
				_, err := b.c.Launch(ctx, b.spec("racing", allocator.Request{Count: 2}, "sleep", "60"))
				launched <- err
			}()
			// The allocation is taken in the middle of the launch.
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
				if _, err := b.alloc.Allocation("racing"); err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: no allocation within 30s", b.kind)
				}
			}
			if err := b.c.Destroy(ctx, "racing"); err != nil {
				t.Fatalf("%s: destroy: %v", b.kind, err)
			}
			if err := <-launched; err != nil {
				t.Fatalf("%s: launch: %v", b.kind, err)
			}
			b.nothingLeft("racing")
		}},
		{"a shrink keeps what the allocator chooses", nil, func(t *testing.T, b *conformance) {
			ctx := context.Background()
			if _, err := b.c.Launch(ctx, b.spec("shrinking", allocator.Request{Devices: []string{"0", "1", "2", "3"}}, "sleep", "60")); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.c.Destroy(context.Background(), "shrinking") })
			if _, err := b.alloc.MarkUnhealthy(ctx, "1", "XID 48"); err != nil {
				t.Fatal(err)
			}
			want, err := b.alloc.Shrink("shrinking", 2)
			if err != nil {
				t.Fatal(err)
			}
			if slices.ContainsFunc(want, func(d node.DeviceRef) bool { return d.Index == 1 }) {
				t.Fatalf("the allocator keeps unhealthy GPU 1: %+v", want)
			}
			ct, err := b.c.Update(ctx, "shrinking", 2)
			if b.kind == containerizer.KindDocker {
				// Docker cannot change a running container's devices.
				if !errors.Is(err, node.ErrNotSupported) {
					t.Fatalf("docker update = %v, want not supported", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(indexes(ct.GPUs), indexes(want)) {
				t.Fatalf("%s: shrink kept %v, the allocator chooses %v", b.kind, indexes(ct.GPUs), indexes(want))
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, kind := range []containerizer.Kind{containerizer.KindNative, containerizer.KindDocker} {
				t.Run(string(kind), func(t *testing.T) { tc.run(t, backends[kind](t, tc.opts...)) })
			}
		})
	}
}

func newAllocator(t *testing.T, inv *node.Inventory, opts ...allocator.Option) *allocator.Allocator {
	t.Helper()
	a, err := allocator.New(inv, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func indexes(refs []node.DeviceRef) []int {
	out := make([]int, len(refs))
	for i, r := range refs {
		out[i] = r.Index
	}
	return out
}
