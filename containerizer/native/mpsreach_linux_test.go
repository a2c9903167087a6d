package native_test

import (
	"bytes"
	"context"
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

// TestOtherManagersDaemonsHidden: a container with the host's view, run as
// root (gpurun's default), cannot reach the MPS daemon of a share that
// another program's manager started (gpuiso-runtime's, with its state
// directory anywhere on the host): the manager's directory, found in the
// registry, is masked, so the container neither lists its pipe directory
// nor connects to its control socket, with the control client itself or
// with connect(2); the daemon's limits stay as they were.
func TestOtherManagersDaemonsHidden(t *testing.T) {
	bin := testenv.RequireSimulatedMPS(t)
	versions(t, func(t *testing.T, n *testNode) {
		ctx := context.Background()
		reg := filepath.Join(t.TempDir(), "registry")
		// Outside /tmp, /run and gpuiso's default directories: only the
		// registry tells where it is.
		base, err := os.MkdirTemp("/var/lib", "gpuiso-other-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(base)
		other, err := mps.New(filepath.Join(base, "mps"), mps.WithRegistry(reg))
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			other.Sweep(ctx, nil)
			other.Close()
		}()
		d, err := other.Start(ctx, "theirs", n.inv.Devices[0].Ref(), mps.Limits{MemoryBytes: 2 << 30})
		if err != nil {
			t.Fatal(err)
		}
		alloc, err := allocator.New(n.inv)
		if err != nil {
			t.Fatal(err)
		}
		c, err := native.New(native.Config{Allocator: alloc, Inventory: n.inv, Isolator: n.iso, MPSRegistry: reg, StateDir: filepath.Join(t.TempDir(), "state")})
		if err != nil {
			t.Fatal(err)
		}
		script := `
			$PROBE ls "$PIPE" | sed 's/^/pipe: /'
			echo "set_default_device_pinned_mem_limit 0 29G" | CUDA_MPS_PIPE_DIRECTORY="$PIPE" timeout 10 ` + bin + ` >/dev/null 2>&1 && echo "control: reached"
			python3 -c 'import socket,sys; socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET).connect(sys.argv[1]); print("connect: reached")' "$PIPE/control" 2>/dev/null
			true`
		var buf bytes.Buffer
		if _, err := c.Launch(ctx, containerizer.Spec{ID: "gpurun-like", Command: []string{"/bin/sh", "-c", script},
			Env: []string{"PROBE=" + n.probe, "PIPE=" + d.PipeDir}, Stdout: &buf, Stderr: &buf}); err != nil {
			t.Fatal(err)
		}
		if st, err := c.Wait(ctx, "gpurun-like"); err != nil || st.Code != 0 {
			t.Fatalf("exit %+v, %v\n%s", st, err, buf.String())
		}
		c.Destroy(ctx, "gpurun-like")
		out := buf.String()
		got := lines(out)
		if !got["pipe: "+d.PipeDir+" ENOENT"] {
			t.Errorf("the container lists the other manager's pipe directory:\n%s", out)
		}
		for l := range got {
			if strings.HasSuffix(l, ": reached") {
				t.Errorf("the container reached the other manager's daemon (%s):\n%s", l, out)
			}
		}
		if h, err := other.Held(ctx, "theirs"); err != nil || h.MemoryMinMiB != 2048 {
			t.Errorf("the other share's daemon holds %+v, %v; want its 2 GiB", h, err)
		}
	})
}
