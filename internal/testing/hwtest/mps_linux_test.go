package hwtest_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/native"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
)

// TestMPSShares proves a memory share on a real GPU: inside a 1 GiB share
// (its own MPS daemon, limits set by the daemon), allocating 256 MiB
// succeeds and 2 GiB fails, while a second 1 GiB share of the same GPU
// holds 256 MiB beside it; the same 2 GiB in an exclusive container
// succeeds. Afterwards no daemon or server is left. It also logs what the
// driver's daemon lets a non-root client change.
func TestMPSShares(t *testing.T) {
	testenv.RequireGPU(t)
	testenv.RequireRoot(t)
	testenv.RequireMPS(t)
	ctx := context.Background()
	inv, err := nvmlnode.Discover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gpu := cudaGPU(t, inv)
	alloc, err := allocator.New(inv, allocator.WithShared(strconv.Itoa(gpu.Index)))
	if err != nil {
		t.Fatal(err)
	}
	daemons, err := mps.New(filepath.Join(t.TempDir(), "mps"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("MPS control daemon: %s", daemons.Control())
	parent := fmt.Sprintf("gpuiso-hwtest-mps-%d", os.Getpid())
	iso, err := cgroups.New(cgroups.WithParent(parent))
	if err != nil {
		t.Fatal(err)
	}
	c, err := native.New(native.Config{Allocator: alloc, Inventory: inv, Isolator: iso, MPS: daemons, StateDir: filepath.Join(t.TempDir(), "state")})
	if err != nil {
		t.Fatal(err)
	}
	check := cudaCheck(t)
	t.Cleanup(func() {
		for _, ct := range c.Containers() {
			c.Destroy(context.Background(), ct.ID)
		}
		daemons.Sweep(context.Background(), nil)
		daemons.Close()
		os.Remove(filepath.Dir(iso.Path("x")))
	})
	launch := func(id string, req allocator.Request, script string, out *bytes.Buffer) {
		t.Helper()
		if _, err := c.Launch(ctx, containerizer.Spec{ID: id, Command: []string{"/bin/sh", "-c", script}, GPUs: req,
			Env: []string{"CUDACHECK=" + check}, Stdout: out, Stderr: out}); err != nil {
			t.Fatalf("launch %s: %v", id, err)
		}
	}
	finish := func(id string, out *bytes.Buffer) {
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
	share := func() allocator.Request {
		return allocator.Request{Share: &allocator.Share{MemoryBytes: 1 << 30}, Devices: []string{strconv.Itoa(gpu.Index)}}
	}
	began := time.Now()
	var neighbourOut bytes.Buffer
	launch("hwtest-neighbour", share(), `$CUDACHECK --alloc 256 /dev/shm/hwtest-go; echo "neighbour exit $?"`, &neighbourOut)
	t.Logf("first share launched, its daemon started, in %v", time.Since(began))
	var neighbour mps.Daemon
	if ds, _ := daemons.List(ctx); len(ds) == 1 {
		neighbour = ds[0]
	}
	for i := 0; !strings.Contains(neighbourOut.String(), "alloc 256 MiB:"); i++ {
		if i > 6000 {
			t.Fatalf("the neighbour share never allocated:\n%s", neighbourOut.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	var shareOut bytes.Buffer
	// The daemon's limit covers each client's context too (on an H100 with
	// driver 580 some 550 MiB of a 1 GiB limit): 256 MiB fits, 2 GiB does
	// not; the largest of a few sizes that fits is logged.
	launch("hwtest-share", share(), `
		echo "pipe $CUDA_MPS_PIPE_DIRECTORY limit $CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
		$CUDACHECK --alloc 256; echo "alloc 256 exit $?"
		$CUDACHECK --alloc 2048; echo "alloc 2048 exit $?"
		for n in 384 448 512 640 768; do $CUDACHECK --alloc $n; done; true`, &shareOut)
	if h, err := daemons.Held(ctx, "hwtest-share"); err == nil {
		t.Logf("the share's daemon holds %+v", h)
	}
	servers, _ := exec.Command("pgrep", "-c", "nvidia-cuda-mps-server").Output()
	t.Logf("MPS servers running: %s", strings.TrimSpace(string(servers)))
	finish("hwtest-share", &shareOut)
	// The neighbour ran all along; let it go.
	if err := os.WriteFile(filepath.Join(neighbour.ShmDir, "hwtest-go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	finish("hwtest-neighbour", &neighbourOut)
	var wholeOut bytes.Buffer
	launch("hwtest-whole", allocator.Request{Devices: []string{strconv.Itoa(gpu.Index)}}, `$CUDACHECK --alloc 2048; echo "alloc 2048 exit $?"`, &wholeOut)
	finish("hwtest-whole", &wholeOut)

	out := shareOut.String()
	for _, want := range []string{"pipe /tmp/nvidia-mps limit 0=1024M", "cudacheck: alloc 256 MiB: ok", "alloc 256 exit 0", "alloc 2048 exit 6"} {
		if !strings.Contains(out, want) {
			t.Errorf("in the 1 GiB share: no %q:\n%s", want, out)
		}
	}
	if !strings.Contains(neighbourOut.String(), "cudacheck: alloc 256 MiB: ok") || !strings.Contains(neighbourOut.String(), "neighbour exit 0") {
		t.Errorf("the neighbour share:\n%s", neighbourOut.String())
	}
	if !strings.Contains(wholeOut.String(), "cudacheck: alloc 2048 MiB: ok") {
		t.Errorf("exclusive: 2 GiB did not allocate:\n%s", wholeOut.String())
	}
	if ds, _ := daemons.List(ctx); len(ds) != 0 {
		t.Errorf("daemons left: %+v", ds)
	}
	// Stop killed what its daemon left; a server that quit ends too.
	for i := 0; len(mps.Strays("/proc", neighbour.Mark)) > 0; i++ {
		if i > 500 {
			t.Errorf("MPS processes left of the neighbour's daemon: %+v", mps.Strays("/proc", neighbour.Mark))
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
}
