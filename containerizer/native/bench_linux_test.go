package native_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/native"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
)

// BenchmarkLaunch runs `true` as a 1-GPU container (allocate, driver volume,
// private /dev, device cgroup, init, wait, destroy) and, in the same run, as
// a plain fork-exec: the difference is the containerizer's overhead. The
// containers' init is examples/gpurun's binary, as an agent's would be its
// own (this test binary, with every test dependency, starts slower).
func BenchmarkLaunch(b *testing.B) {
	initPath := filepath.Join(b.TempDir(), "gpurun")
	if out, err := exec.Command("go", "build", "-o", initPath, "github.com/gpuiso/gpuiso/examples/gpurun").CombinedOutput(); err != nil {
		b.Fatalf("build gpurun: %v\n%s", err, out)
	}
	b.Run("impl=exec", func(b *testing.B) {
		for range b.N {
			if err := exec.Command("/bin/true").Run(); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, v := range []cgroups.Version{cgroups.V1, cgroups.V2} {
		b.Run("impl=native/cgroup="+v.String(), func(b *testing.B) {
			n := newNode(b, v)
			ctx := context.Background()
			c, err := native.New(native.Config{Allocator: n.alloc, Inventory: n.inv, Isolator: n.iso, Volumes: n.vols,
				DevRoot: n.host.DevRoot, StateDir: n.dirs.State, InitPath: initPath})
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				id := fmt.Sprintf("bench-%d", i)
				if _, err := c.Launch(ctx, containerizer.Spec{ID: id, Command: []string{"/bin/true"}, GPUs: allocator.Request{Count: 1}}); err != nil {
					b.Fatal(err)
				}
				if st, err := c.Wait(ctx, id); err != nil || st.Code != 0 {
					b.Fatalf("exit %d, %v", st.Code, err)
				}
				if err := c.Destroy(ctx, id); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
