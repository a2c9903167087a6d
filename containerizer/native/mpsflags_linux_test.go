package native_test

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/native"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/mps"
)

// TestMPSMountFlags: a memory share's container gets its daemon's pipe
// directory and /dev/shm with the plan's flags, nosuid, nodev and noexec:
// they are host directories its root can write, which the daemon and its
// server (root on the host) use too.
func TestMPSMountFlags(t *testing.T) {
	testenv.RequireSimulatedMPS(t)
	versions(t, func(t *testing.T, n *testNode) {
		ctx := context.Background()
		m, err := mps.New(filepath.Join(t.TempDir(), "mps"))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { m.Sweep(ctx, nil); m.Close() }()
		alloc, err := allocator.New(n.inv, allocator.WithShared("0"))
		if err != nil {
			t.Fatal(err)
		}
		c, err := native.New(native.Config{Allocator: alloc, Inventory: n.inv, Isolator: n.iso, MPS: m, StateDir: filepath.Join(t.TempDir(), "state")})
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		share := allocator.Request{Share: &allocator.Share{MemoryBytes: 4 << 30}}
		if _, err := c.Launch(ctx, containerizer.Spec{ID: "flags", Command: []string{"cat", "/proc/self/mountinfo"}, GPUs: share, Stdout: &out, Stderr: &out}); err != nil {
			t.Fatal(err)
		}
		defer c.Destroy(ctx, "flags")
		if st, err := c.Wait(ctx, "flags"); err != nil || st.Code != 0 {
			t.Fatalf("exit %+v, %v\n%s", st, err, out.String())
		}
		seen := map[string]string{}
		for _, l := range strings.Split(out.String(), "\n") {
			f := strings.Fields(l)
			if len(f) > 5 && (f[4] == "/tmp/nvidia-mps" || f[4] == "/dev/shm") {
				seen[f[4]] = f[5] // the last mount at a point is the one seen
			}
		}
		for _, p := range []string{"/tmp/nvidia-mps", "/dev/shm"} {
			opts := strings.Split(seen[p], ",")
			for _, want := range []string{"rw", "nosuid", "nodev", "noexec"} {
				found := false
				for _, o := range opts {
					found = found || o == want
				}
				if !found {
					t.Errorf("%s is mounted %q, not %s", p, seen[p], want)
				}
			}
		}
		if err := c.Destroy(ctx, "flags"); err != nil {
			t.Fatal(err)
		}
	})
}
