package hwtest_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/native"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
)

// spinSeconds is how long each client of TestShareThroughput runs its
// compute loop.
const spinSeconds = 5

// nobody is the user a share's client runs as in TestShareThroughput.
const nobody = 65534

// TestShareThroughput runs a compute loop (cudacheck --spin, the same
// kernel and grid each time) on one real GPU in three arrangements: one
// client alone in an exclusive container; two clients at once in two
// memory shares of half the GPU's memory each (a daemon and a server each:
// their kernels time-slice); two clients at once in two concurrent slices
// of the GPU (Slices 2: one daemon and one server, each client held to
// half the memory and half the threads: their kernels run side by side).
// It logs each client's work per second, their sum and its ratio to the
// alone figure; the figures are not asserted. It asserts that every client
// ran and did work (its kernel's results verified), and that the memory
// limits hold: in a half share and in a slice of 2 more than half the
// GPU's memory does not allocate and 256 MiB does, while the same
// allocation past half does in the exclusive container. Then, with a
// share's client running as a user other than root, the server its daemon
// started for it runs as that user and is non-dumpable (its /proc entries
// are root's). Afterwards no daemon or server is left.
func TestShareThroughput(t *testing.T) {
	testenv.RequireGPU(t)
	testenv.RequireRoot(t)
	testenv.RequireMPS(t)
	ctx := context.Background()
	inv, err := nvmlnode.Discover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gpu := cudaGPU(t, inv)
	if gpu.MemoryBytes < 4<<30 {
		t.Fatalf("GPU %d: discovery gives %d bytes of memory", gpu.Index, gpu.MemoryBytes)
	}
	c, daemons := newShareNode(t, inv, gpu)
	check := cudaCheck(t)
	dev := []string{strconv.Itoa(gpu.Index)}
	// Past half the GPU's memory: more than a half share's or a slice's
	// limit (each at most half, in whole MiB), well within the GPU.
	overMiB := gpu.MemoryBytes>>20/2 + 512
	launch := func(id string, req allocator.Request, script string, user *containerizer.User, extra []*os.File) *testenv.Buffer {
		t.Helper()
		out := new(testenv.Buffer)
		if _, err := c.Launch(ctx, containerizer.Spec{ID: id, Command: []string{"/bin/sh", "-c", script}, GPUs: req,
			Env: []string{"CUDACHECK=" + check}, User: user, ExtraFiles: extra, Stdout: out, Stderr: out}); err != nil {
			t.Fatalf("launch %s: %v", id, err)
		}
		return out
	}
	finish := func(id string, out *testenv.Buffer) {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		st, err := c.Wait(wctx, id)
		t.Logf("container %s: exit %d, %v:\n%s", id, st.Code, err, out.String())
		if err != nil || st.Code != 0 {
			t.Fatalf("container %s: exit %d, %v", id, st.Code, err)
		}
		if err := c.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	// await waits until out holds want, or the line the script echoes
	// once the step is over ("<step> exit"), which fails t.
	await := func(id string, out *testenv.Buffer, want, step string) {
		t.Helper()
		for deadline := time.Now().Add(90 * time.Second); !strings.Contains(out.String(), want); time.Sleep(10 * time.Millisecond) {
			if strings.Contains(out.String(), step+" exit") || time.Now().After(deadline) {
				t.Fatalf("container %s never said %q:\n%s", id, want, out.String())
			}
		}
	}
	daemonOf := func(owner string) mps.Daemon {
		t.Helper()
		ds, err := daemons.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			if d.Owner == owner {
				return d
			}
		}
		t.Fatalf("no daemon of %s among %+v", owner, ds)
		return mps.Daemon{}
	}
	var marks []string // of every daemon started
	// A client that spins once go exists in its /dev/shm (its daemon's),
	// then checks its memory limit: 256 MiB allocates, overMiB does not.
	shared := fmt.Sprintf(`
		echo "limits: memory $CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, threads ${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE:-all}"
		$CUDACHECK --spin %d /dev/shm/hwtest-go; echo "spin exit $?"
		$CUDACHECK --alloc 256; echo "alloc small exit $?"
		$CUDACHECK --alloc %d; echo "alloc over exit $?"`, spinSeconds, overMiB)
	pair := func(name string, req allocator.Request) (a, b *testenv.Buffer) {
		t.Helper()
		a = launch(name+"-a", req, shared, nil, nil)
		b = launch(name+"-b", req, shared, nil, nil)
		await(name+"-a", a, "cudacheck: spin ready", "spin")
		await(name+"-b", b, "cudacheck: spin ready", "spin")
		return a, b
	}
	start := func(d mps.Daemon) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(d.ShmDir, "hwtest-go"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// (a) One client alone, the GPU its own.
	began := time.Now()
	alone := launch("hwtest-alone", allocator.Request{Devices: dev}, fmt.Sprintf(`
		$CUDACHECK --spin %d; echo "spin exit $?"
		$CUDACHECK --alloc %d; echo "alloc over exit $?"`, spinSeconds, overMiB), nil, nil)
	finish("hwtest-alone", alone)

	// (b) Two memory shares of half the GPU each, a daemon each.
	half := (gpu.MemoryBytes / 2) &^ (1<<20 - 1)
	shareA, shareB := pair("hwtest-share", allocator.Request{Share: &allocator.Share{MemoryBytes: half}, Devices: dev})
	for _, id := range []string{"hwtest-share-a", "hwtest-share-b"} {
		d := daemonOf(id)
		marks = append(marks, d.Mark)
		start(d)
	}
	finish("hwtest-share-a", shareA)
	finish("hwtest-share-b", shareB)

	// (c) Two concurrent slices of the GPU, one daemon for both.
	sliceA, sliceB := pair("hwtest-slice", allocator.Request{Share: &allocator.Share{Mode: allocator.ShareSlice, Slices: 2}, Devices: dev})
	if ds, err := daemons.List(ctx); err != nil || len(ds) != 1 {
		t.Errorf("two slices of one GPU run %d daemons, want 1: %+v, %v", len(ds), ds, err)
	}
	sd := daemonOf(mps.SliceOwner(gpu.UUID))
	marks = append(marks, sd.Mark)
	t.Logf("the slices' daemon: %d slices, limits %+v", sd.Slices, sd.Limits)
	if sd.Slices != 2 || sd.Limits.ComputePercent != 50 || sd.Limits.MemoryBytes > gpu.MemoryBytes/2 || sd.Limits.MemoryBytes < gpu.MemoryBytes/2-(1<<20) {
		t.Errorf("the slices' daemon: %d slices, limits %+v; want 2 slices of half of %d bytes, 50%% of the threads", sd.Slices, sd.Limits, gpu.MemoryBytes)
	}
	start(sd)
	finish("hwtest-slice-a", sliceA)
	finish("hwtest-slice-b", sliceB)
	t.Logf("three arrangements in %v", time.Since(began))

	type row struct {
		name string
		outs []*testenv.Buffer
	}
	rows := []row{{"alone (exclusive)", []*testenv.Buffer{alone}}, {"2 memory shares of 1/2", []*testenv.Buffer{shareA, shareB}}, {"2 concurrent slices of 2", []*testenv.Buffer{sliceA, sliceB}}}
	var table strings.Builder
	fmt.Fprintf(&table, "%-26s %12s %12s %12s %9s\n", "arrangement", "client a", "client b", "sum", "sum/alone")
	var aloneRate float64
	for _, r := range rows {
		var rates []float64
		sum := 0.0
		for i, out := range r.outs {
			launches, rate, ok := spinRate(out.String())
			if !ok || launches == 0 || rate <= 0 || !strings.Contains(out.String(), "spin exit 0") {
				t.Errorf("%s: client %c did no work:\n%s", r.name, 'a'+i, out.String())
			}
			rates = append(rates, rate)
			sum += rate
		}
		if aloneRate == 0 {
			aloneRate = sum
		}
		b := "-"
		if len(rates) > 1 {
			b = fmt.Sprintf("%.4g", rates[1])
		}
		ratio := 0.0
		if aloneRate > 0 {
			ratio = sum / aloneRate
		}
		fmt.Fprintf(&table, "%-26s %12.4g %12s %12.4g %9.2f\n", r.name, rates[0], b, sum, ratio)
	}
	t.Logf("work per second (multiply-adds of all threads; %d s each, clients of an arrangement at once):\n%s", spinSeconds, table.String())

	// Memory: past half allocates alone, not in a half share or a slice
	// of 2; 256 MiB allocates in each.
	if !strings.Contains(alone.String(), "alloc over exit 0") {
		t.Errorf("exclusive: %d MiB did not allocate:\n%s", overMiB, alone.String())
	}
	for _, r := range rows[1:] {
		for i, out := range r.outs {
			for _, want := range []string{"alloc small exit 0", fmt.Sprintf("alloc over exit %d", cudaAlloc)} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("%s: client %c: no %q (256 MiB must allocate, %d MiB must not):\n%s", r.name, 'a'+i, want, overMiB, out.String())
				}
			}
		}
	}

	// (d) A share's client as another user than root: its server runs as
	// that user, non-dumpable. The client runs cudacheck through the
	// descriptor it is handed (fd 3): the suite's copy may be in a
	// directory of root's alone.
	bin, err := os.Open(check)
	if err != nil {
		t.Fatal(err)
	}
	defer bin.Close()
	user := launch("hwtest-user", allocator.Request{Share: &allocator.Share{MemoryBytes: half}, Devices: dev},
		`id -u; /proc/self/fd/3 --alloc 256 /dev/shm/hwtest-go; echo "alloc small exit $?"`,
		&containerizer.User{UID: nobody, GID: nobody}, []*os.File{bin})
	await("hwtest-user", user, "cudacheck: alloc 256 MiB: ok", "alloc small")
	ud := daemonOf("hwtest-user")
	marks = append(marks, ud.Mark)
	server := findServer(t, ud)
	start(ud)
	finish("hwtest-user", user)
	if server == 0 {
		t.Errorf("no MPS server of uid %d was found for the share's daemon (pid %d)", nobody, ud.Pid)
	}
	if out := user.String(); !slices.Contains(strings.Split(out, "\n"), strconv.Itoa(nobody)) || !strings.Contains(out, "alloc small exit 0") {
		t.Errorf("the share's client as uid %d: want its uid, then 256 MiB allocated:\n%s", nobody, out)
	}

	if ds, _ := daemons.List(ctx); len(ds) != 0 {
		t.Errorf("daemons left: %+v", ds)
	}
	// Stop killed what its daemon left; a server that quit ends too.
	for _, mark := range marks {
		for i := 0; len(mps.Strays("/proc", mark)) > 0; i++ {
			if i > 500 {
				t.Errorf("MPS processes left of daemon %s: %+v", mark, mps.Strays("/proc", mark))
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// findServer looks, for some seconds, for the MPS server daemon d started
// for a client of uid nobody, and checks that it is non-dumpable: its
// /proc/<pid>/environ is root's while its status shows uid nobody. It
// returns the server's pid, 0 if none was found.
func findServer(t *testing.T, d mps.Daemon) int {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		for _, p := range mps.Strays(node.DefaultProcRoot, d.Mark) {
			if p.Pid == d.Pid {
				continue
			}
			proc := filepath.Join(node.DefaultProcRoot, strconv.Itoa(p.Pid))
			status, err := os.ReadFile(filepath.Join(proc, "status"))
			if err != nil || !strings.Contains(string(status), "\nUid:\t"+strconv.Itoa(nobody)+"\t") {
				continue // ended, or another user's
			}
			var st unix.Stat_t
			if err := unix.Stat(filepath.Join(proc, "environ"), &st); err != nil {
				continue // ended
			}
			exe, _ := os.Readlink(filepath.Join(proc, "exe"))
			t.Logf("MPS server %d: uid %d, its environ uid %d's, program %s", p.Pid, nobody, st.Uid, exe)
			if st.Uid != 0 {
				t.Errorf("MPS server %d of uid %d is dumpable: its environ is uid %d's", p.Pid, nobody, st.Uid)
			}
			return p.Pid
		}
	}
	return 0
}

// newShareNode is the host's node with the shares of gpu: an allocator
// that shares it, an MPS daemon manager, and a native containerizer over
// them with its own cgroup parent, all removed, with every daemon and
// container left, when the test ends.
func newShareNode(t *testing.T, inv *node.Inventory, gpu node.Device) (*native.Containerizer, *mps.Manager) {
	t.Helper()
	alloc, err := allocator.New(inv, allocator.WithShared(strconv.Itoa(gpu.Index)))
	if err != nil {
		t.Fatal(err)
	}
	daemons, err := mps.New(filepath.Join(t.TempDir(), "mps"))
	if err != nil {
		t.Fatal(err)
	}
	parent := fmt.Sprintf("gpuiso-hwtest-shares-%d", os.Getpid())
	iso, err := cgroups.New(cgroups.WithParent(parent))
	if err != nil {
		daemons.Close()
		t.Fatal(err)
	}
	c, err := native.New(native.Config{Allocator: alloc, Inventory: inv, Isolator: iso, MPS: daemons, StateDir: filepath.Join(t.TempDir(), "state")})
	if err != nil {
		daemons.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, ct := range c.Containers() {
			c.Destroy(context.Background(), ct.ID)
		}
		daemons.Sweep(context.Background(), nil)
		daemons.Close()
		os.Remove(filepath.Dir(iso.Path("x")))
	})
	return c, daemons
}
