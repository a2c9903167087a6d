package native_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/native"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// BenchmarkShareLaunch pairs, in one run, the launch of a 1-GPU container
// (allocate, private /dev, device cgroup v2, confinement, init, `probe exit
// 0`, wait, destroy) with that of a 4 GiB memory share of one GPU, which
// also starts (and at its destruction stops) the share's MPS control
// daemon, and with a share launched while another share's daemon already
// runs on the GPU (each share has a daemon of its own, so the second
// starts one too), and with a concurrent slice (1 of 4) of a GPU whose
// daemon runs for another slice already held, which starts no daemon and
// sends it no command: its launch should cost what the exclusive one
// does. The containers' init is examples/gpurun's binary.
func BenchmarkShareLaunch(b *testing.B) {
	testenv.RequireRoot(b)
	testenv.RequireCgroupV2(b)
	testenv.RequireNVIDIALibraries(b)
	testenv.RequireSimulatedMPS(b)
	ctx := context.Background()
	initPath := filepath.Join(b.TempDir(), "gpurun")
	if out, err := exec.Command("go", "build", "-buildvcs=false", "-o", initPath, "github.com/gpuiso/gpuiso/examples/gpurun").CombinedOutput(); err != nil {
		b.Fatalf("build gpurun: %v\n%s", err, out)
	}
	probe := testenv.BuildProbe(b)
	sim, err := simnode.New("dgx1-volta")
	if err != nil {
		b.Fatal(err)
	}
	host, err := sim.MakeHost(filepath.Join(b.TempDir(), "host"))
	if err != nil {
		b.Fatal(err)
	}
	defer host.Remove()
	inv, err := nvmlnode.Discover(ctx, sim.DiscoverOptions(host)...)
	if err != nil {
		b.Fatal(err)
	}
	alloc, err := allocator.New(inv, allocator.WithShared("0", "1", "2", "3", "4", "5", "6", "7"))
	if err != nil {
		b.Fatal(err)
	}
	daemons, err := mps.New(filepath.Join(b.TempDir(), "mps"))
	if err != nil {
		b.Fatal(err)
	}
	defer daemons.Close()
	parent := fmt.Sprintf("gpuiso-bench-share-%d", os.Getpid())
	iso, err := cgroups.New(cgroups.WithVersion(cgroups.V2), cgroups.WithParent(parent))
	if err != nil {
		b.Fatal(err)
	}
	c, err := native.New(native.Config{Allocator: alloc, Inventory: inv, Isolator: iso, MPS: daemons,
		StateDir: filepath.Join(b.TempDir(), "state"), InitPath: initPath})
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	run1 := func(b *testing.B, req allocator.Request) {
		n++
		id := fmt.Sprintf("bench-%d", n)
		if _, err := c.Launch(ctx, containerizer.Spec{ID: id, Command: []string{probe, "exit", "0"}, GPUs: req}); err != nil {
			b.Fatal(err)
		}
		if st, err := c.Wait(ctx, id); err != nil || st.Code != 0 {
			b.Fatalf("exit %d, %v", st.Code, err)
		}
		if err := c.Destroy(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
	run := func(b *testing.B, req allocator.Request) {
		for range b.N {
			run1(b, req)
		}
	}
	share := &allocator.Share{MemoryBytes: 4 << 30}
	for range 2 { // paired, twice: the host's load moves
		b.Run("gpu=exclusive", func(b *testing.B) { run(b, allocator.Request{Count: 1}) })
		b.Run("gpu=share", func(b *testing.B) { run(b, allocator.Request{Share: share}) })
		b.Run("gpu=share-beside-running-daemon", func(b *testing.B) {
			if _, err := c.Launch(ctx, containerizer.Spec{ID: "neighbour", Command: []string{"sleep", "600"}, GPUs: allocator.Request{Share: share, Devices: []string{"0"}}}); err != nil {
				b.Fatal(err)
			}
			defer c.Destroy(ctx, "neighbour")
			run(b, allocator.Request{Share: share, Devices: []string{"0"}})
		})
		b.Run("gpu=slice", func(b *testing.B) {
			slice := &allocator.Share{Mode: allocator.ShareSlice, Slices: 4}
			if _, err := c.Launch(ctx, containerizer.Spec{ID: "slice-neighbour", Command: []string{"sleep", "600"}, GPUs: allocator.Request{Share: slice, Devices: []string{"1"}}}); err != nil {
				b.Fatal(err)
			}
			defer c.Destroy(ctx, "slice-neighbour")
			run(b, allocator.Request{Share: slice, Devices: []string{"1"}})
		})
	}
	// Interleaved: each iteration launches an exclusive container and a
	// slice, timed apart, so that both see the same load; the metric is
	// the ratio of their medians.
	b.Run("gpu=slice-vs-exclusive", func(b *testing.B) {
		slice := &allocator.Share{Mode: allocator.ShareSlice, Slices: 4}
		if _, err := c.Launch(ctx, containerizer.Spec{ID: "slice-neighbour", Command: []string{"sleep", "600"}, GPUs: allocator.Request{Share: slice, Devices: []string{"1"}}}); err != nil {
			b.Fatal(err)
		}
		defer c.Destroy(ctx, "slice-neighbour")
		var ex, sl []time.Duration
		once := func(req allocator.Request) time.Duration {
			start := time.Now()
			run1(b, req)
			return time.Since(start)
		}
		for range b.N {
			ex = append(ex, once(allocator.Request{Count: 1}))
			sl = append(sl, once(allocator.Request{Share: slice, Devices: []string{"1"}}))
		}
		b.ReportMetric(float64(median(sl))/float64(median(ex)), "slice/exclusive")
		b.ReportMetric(float64(median(ex).Microseconds())/1000, "exclusive-ms")
		b.ReportMetric(float64(median(sl).Microseconds())/1000, "slice-ms")
	})
	if ds, _ := daemons.List(ctx); len(ds) != 0 {
		b.Fatalf("daemons left: %+v", ds)
	}
}

// median is the middle of ds (the upper middle of an even count).
func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
