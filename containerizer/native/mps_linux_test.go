package native_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/native"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/mps"
)

// TestMPSShare: a memory share's native container (the host's view) finds
// its own MPS daemon at /tmp/nvidia-mps with CUDA_MPS_PIPE_DIRECTORY
// naming it, shares its /dev/shm with that daemon, and cannot reach the
// daemons' directory on the host, where its neighbour's daemon lives.
func TestMPSShare(t *testing.T) {
	testenv.RequireSimulatedMPS(t)
	versions(t, func(t *testing.T, n *testNode) {
		ctx := context.Background()
		m, err := mps.New(filepath.Join(t.TempDir(), "mps"))
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if ds, _ := m.List(ctx); len(ds) > 0 {
				t.Errorf("daemons left: %+v", ds)
			}
			m.Sweep(ctx, nil)
			m.Close()
		}()
		alloc, err := allocator.New(n.inv, allocator.WithShared("0", "1", "2", "3", "4", "5", "6", "7"))
		if err != nil {
			t.Fatal(err)
		}
		c, err := native.New(native.Config{Allocator: alloc, Inventory: n.inv, Isolator: n.iso, MPS: m, StateDir: filepath.Join(t.TempDir(), "state")})
		if err != nil {
			t.Fatal(err)
		}
		share := allocator.Request{Share: &allocator.Share{MemoryBytes: 4 << 30}}
		if _, err := c.Launch(ctx, containerizer.Spec{ID: "neighbour", Command: []string{"sleep", "60"}, GPUs: share}); err != nil {
			t.Fatal(err)
		}
		defer c.Destroy(ctx, "neighbour")
		var out bytes.Buffer
		script := fmt.Sprintf(`
			echo "pipe: $CUDA_MPS_PIPE_DIRECTORY"
			$PROBE ls /tmp/nvidia-mps | sed 's/^/own: /'
			echo x > /dev/shm/from-container && echo "shm: written"
			$PROBE ls %[1]s | sed 's/^/host: /'
			$PROBE ls %[1]s/neighbour/pipe | sed 's/^/neighbour: /'
			true`, m.Dir())
		if _, err := c.Launch(ctx, containerizer.Spec{ID: "mine", Command: []string{"/bin/sh", "-c", script}, GPUs: share,
			Env: []string{"PROBE=" + n.probe}, Stdout: &out, Stderr: &out}); err != nil {
			t.Fatal(err)
		}
		ds, _ := m.List(ctx)
		var mine mps.Daemon
		for _, d := range ds {
			if d.Owner == "mine" {
				mine = d
			}
		}
		if st, err := c.Wait(ctx, "mine"); err != nil || st.Code != 0 {
			t.Fatalf("exit %+v, %v\n%s", st, err, out.String())
		}
		if _, err := os.Stat(filepath.Join(mine.ShmDir, "from-container")); err != nil {
			t.Errorf("the container's /dev/shm is not its daemon's: %v\n%s", err, out.String())
		}
		if err := c.Destroy(ctx, "mine"); err != nil {
			t.Fatal(err)
		}
		got := lines(out.String())
		for _, want := range []string{"pipe: /tmp/nvidia-mps", "own: control", "own: control_lock", "shm: written", "neighbour: " + m.Dir() + "/neighbour/pipe ENOENT"} {
			if !got[want] {
				t.Errorf("missing %q in the container's output:\n%s", want, out.String())
			}
		}
		for l := range got {
			if strings.HasPrefix(l, "host: ") {
				t.Errorf("the container sees the daemons' directory: %s\n%s", l, out.String())
			}
		}
		if err := c.Destroy(ctx, "neighbour"); err != nil {
			t.Fatal(err)
		}
	})
}
