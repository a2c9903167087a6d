package native_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/native"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
)

// BenchmarkLaunch runs the static probe (`probe exit 0`) as a 1-GPU
// container (allocate, driver volume, private /dev, device cgroup,
// confinement, init, wait, destroy), on the host's file system and in a root
// file system of its own, and, in the same run, as a plain fork-exec and
// with `runc run` (Docker's runtime, its default spec) from a bundle holding
// the same binary. The containers' init is examples/gpurun's binary, as an
// agent's would be its own (this test binary, with every test dependency,
// starts slower).
func BenchmarkLaunch(b *testing.B) {
	initPath := filepath.Join(b.TempDir(), "gpurun")
	if out, err := exec.Command("go", "build", "-buildvcs=false", "-o", initPath, "github.com/gpuiso/gpuiso/examples/gpurun").CombinedOutput(); err != nil {
		b.Fatalf("build gpurun: %v\n%s", err, out)
	}
	probe := testenv.BuildProbe(b)
	b.Run("impl=exec", func(b *testing.B) {
		for range b.N {
			if err := exec.Command(probe, "exit", "0").Run(); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, v := range []cgroups.Version{cgroups.V1, cgroups.V2} {
		for _, withRoot := range []bool{false, true} {
			name := "impl=native/cgroup=" + v.String()
			if withRoot {
				name = "impl=native+rootfs/cgroup=" + v.String()
			}
			b.Run(name, func(b *testing.B) {
				n := newNode(b, v)
				ctx := context.Background()
				c, err := native.New(native.Config{Allocator: n.alloc, Inventory: n.inv, Isolator: n.iso, Volumes: n.vols,
					StateDir: n.dirs.State, InitPath: initPath})
				if err != nil {
					b.Fatal(err)
				}
				spec := containerizer.Spec{Command: []string{probe, "exit", "0"}, GPUs: allocator.Request{Count: 1}}
				if withRoot {
					spec.RootFS, spec.Command = rootFS(b, probe), []string{"/probe", "exit", "0"}
				}
				b.ResetTimer()
				for i := range b.N {
					spec.ID = fmt.Sprintf("bench-%d", i)
					if _, err := c.Launch(ctx, spec); err != nil {
						b.Fatal(err)
					}
					if st, err := c.Wait(ctx, spec.ID); err != nil || st.Code != 0 {
						b.Fatalf("exit %d, %v", st.Code, err)
					}
					if err := c.Destroy(ctx, spec.ID); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
	b.Run("impl=runc", func(b *testing.B) {
		testenv.RequireRoot(b)
		runc, err := exec.LookPath("runc")
		if err != nil {
			b.Skip("no runc")
		}
		bundle := filepath.Join(b.TempDir(), "bundle")
		if err := os.MkdirAll(bundle, 0o755); err != nil {
			b.Fatal(err)
		}
		if out, err := exec.Command(runc, "spec", "--bundle", bundle).CombinedOutput(); err != nil {
			b.Fatalf("runc spec: %v\n%s", err, out)
		}
		var spec map[string]any
		raw, err := os.ReadFile(filepath.Join(bundle, "config.json"))
		if err != nil || json.Unmarshal(raw, &spec) != nil {
			b.Fatalf("read config.json: %v", err)
		}
		proc := spec["process"].(map[string]any)
		proc["terminal"], proc["args"] = false, []string{"/probe", "exit", "0"}
		spec["root"] = map[string]any{"path": rootFS(b, probe), "readonly": true}
		raw, _ = json.Marshal(spec)
		if err := os.WriteFile(filepath.Join(bundle, "config.json"), raw, 0o644); err != nil {
			b.Fatal(err)
		}
		state := b.TempDir()
		b.ResetTimer()
		for i := range b.N {
			cmd := exec.Command(runc, "--root", state, "run", "--bundle", bundle, fmt.Sprintf("gpuiso-bench-%d-%d", os.Getpid(), i))
			if out, err := cmd.CombinedOutput(); err != nil {
				b.Fatalf("runc run: %v\n%s", err, out)
			}
		}
	})
}
