package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node"
)

// TestOtherProgramsDaemonHidden: root in a gpurun container (the host's
// view, the default) cannot reach the MPS daemon of a share that another
// program's manager runs (gpuiso-runtime's, whose state directory may be
// anywhere on the host): it neither lists the daemon's pipe directory nor
// connects to its control socket, and the daemon's limits stay its own.
func TestOtherProgramsDaemonHidden(t *testing.T) {
	testenv.RequireRoot(t)
	bin := testenv.RequireSimulatedMPS(t)
	ctx := context.Background()
	// A short path: a socket's is limited to 107 bytes.
	state, err := os.MkdirTemp("", "rt-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(state)
	other, err := mps.New(filepath.Join(state, "mps"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		other.Sweep(ctx, nil)
		other.Close()
	}()
	d, err := other.Start(ctx, "theirs", node.DeviceRef{UUID: "GPU-00000000-1111-2222-3333-444444444444"}, mps.Limits{MemoryBytes: 2 << 30})
	if err != nil {
		t.Fatal(err)
	}
	script := `ls "$0" >/dev/null 2>&1 && echo "pipe: listed"
		echo "set_default_device_pinned_mem_limit 0 29G" | CUDA_MPS_PIPE_DIRECTORY="$0" timeout 10 ` + bin + ` >/dev/null 2>&1 && echo "control: reached"
		true`
	out, errOut, code := gpurun("--simulate", "dgx1-volta", "--state-dir", t.TempDir(), "--quiet", "--", "/bin/sh", "-c", script, d.PipeDir)
	if code != 0 {
		t.Fatalf("exit %d: %s%s", code, out, errOut)
	}
	if strings.TrimSpace(out) != "" {
		t.Errorf("the container reached another program's MPS daemon:\n%s", out)
	}
	if h, err := other.Held(ctx, "theirs"); err != nil || h.MemoryMinMiB != 2048 {
		t.Errorf("the other program's daemon holds %+v, %v; want its 2 GiB", h, err)
	}
}
