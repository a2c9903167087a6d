package native_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/rootfs"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// rootFS makes a root file system holding only the probe, at /probe.
func rootFS(t testing.TB, probe string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "rootfs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(probe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "probe"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestRootFS runs containers in their own root file system: they see only
// it, their /dev, /proc and /sys, and the driver volume when the image asks
// for it; the escape probes are refused there too.
func TestRootFS(t *testing.T) {
	versions(t, func(t *testing.T, n *testNode) {
		root := rootFS(t, n.probe)
		ctx := context.Background()
		run := func(id string, env []string, args ...string) string {
			t.Helper()
			var out bytes.Buffer
			_, err := n.c.Launch(ctx, containerizer.Spec{ID: id, RootFS: root, Env: env, Command: append([]string{"/probe"}, args...),
				GPUs: allocator.Request{Devices: []string{"2"}}, Stdout: &out, Stderr: &out})
			if err != nil {
				t.Fatal(err)
			}
			defer n.c.Destroy(ctx, id)
			if st, err := n.c.Wait(ctx, id); err != nil || st.Code != 0 {
				t.Fatalf("%s: exit %d, %v\n%s", id, st.Code, err, out.String())
			}
			if _, err := os.Stat(filepath.Join(n.dirs.State, id, "exit.json")); err != nil {
				t.Errorf("%s: no exit status recorded: %v", id, err)
			}
			return out.String()
		}
		if got := strings.Fields(run("ls-root", nil, "ls", "/")); !slices.Equal(got, []string{"dev", "probe", "proc", "sys", "tmp"}) {
			t.Errorf("/ holds %q, want dev, probe, proc, sys and tmp", got)
		}
		if got := run("no-volume", []string{"NVIDIA_VISIBLE_DEVICES=void"}, "ls", "/usr/local"); !strings.Contains(got, "ENOENT") {
			t.Errorf("with NVIDIA_VISIBLE_DEVICES=void, /usr/local holds %q", got)
		}
		if got := run("ls-volume", []string{"NVIDIA_VISIBLE_DEVICES=all"}, "ls", "/usr/local/nvidia"); !strings.Contains(got, "bin\n") {
			t.Errorf("with NVIDIA_VISIBLE_DEVICES=all, /usr/local/nvidia holds %q", got)
		}
		minor := n.inv.Devices[2].Minor
		dev := run("ls-dev", nil, "ls", "/dev")
		for _, want := range []string{fmt.Sprintf("nvidia%d", minor), "nvidiactl", "null", "pts", "shm"} {
			if !strings.Contains(dev, want+"\n") {
				t.Errorf("/dev lacks %s:\n%s", want, dev)
			}
		}
		if strings.Count(dev, "nvidia") != 4 { // the GPU, nvidiactl, nvidia-uvm, nvidia-uvm-tools
			t.Errorf("/dev holds other NVIDIA nodes:\n%s", dev)
		}
	})
}

// TestRootFSLinks runs images whose mount points are links out of their
// root: every path is resolved inside the root, so nothing is made or
// mounted on the host, and the volume lands where the link leads inside
// the image. An image whose /proc, /sys or /dev is a link is refused.
func TestRootFSLinks(t *testing.T) {
	versions(t, func(t *testing.T, n *testNode) {
		ctx := context.Background()
		outside := filepath.Join(t.TempDir(), "outside") // absent: the set-up must not make it
		for _, tc := range []struct {
			name, link, target string
			refused            bool
		}{
			{name: "usr-local-absolute", link: "usr/local", target: outside},
			{name: "usr-local-dotdot", link: "usr/local", target: "../../../../../../.." + outside},
			{name: "usr-absolute", link: "usr", target: outside},
			{name: "tmp-absolute", link: "tmp", target: outside},
			{name: "proc-absolute", link: "proc", target: outside, refused: true},
			{name: "sys-dotdot", link: "sys", target: "../../.." + outside, refused: true},
			{name: "dev-absolute", link: "dev", target: outside, refused: true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				root := rootFS(t, n.probe)
				link := filepath.Join(root, tc.link)
				if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(tc.target, link); err != nil {
					t.Fatal(err)
				}
				var out bytes.Buffer
				id := "links-" + tc.name
				_, err := n.c.Launch(ctx, containerizer.Spec{ID: id, RootFS: root, Env: []string{"NVIDIA_VISIBLE_DEVICES=all"},
					Command: []string{"/probe", "ls", "/usr/local/nvidia"}, GPUs: allocator.Request{Count: 1}, Stdout: &out, Stderr: &out})
				if err != nil {
					t.Fatal(err)
				}
				st, err := n.c.Wait(ctx, id)
				n.c.Destroy(ctx, id)
				if _, serr := os.Lstat(outside); serr == nil {
					os.RemoveAll(outside)
					t.Fatalf("the set-up made %s on the host", outside)
				}
				switch {
				case err != nil:
					t.Fatal(err)
				case tc.refused && st.Code == 0:
					t.Fatalf("an image whose %s is a link ran:\n%s", tc.link, out.String())
				case tc.refused && !strings.Contains(out.String(), "not a directory of the root"):
					t.Fatalf("exit %d, want the link named:\n%s", st.Code, out.String())
				case !tc.refused && (st.Code != 0 || !strings.Contains(out.String(), "bin\n")):
					t.Fatalf("exit %d, want the volume at /usr/local/nvidia through the link:\n%s", st.Code, out.String())
				}
			})
		}
	})
}

// TestRootFSRefused refuses root file systems that would hand the
// container the host's root or the containerizer's state.
func TestRootFSRefused(t *testing.T) {
	n := newNode(t, hostVersion())
	for _, root := range []string{"/", "/var/..", filepath.Dir(n.dirs.State)} {
		_, err := n.c.Launch(context.Background(), containerizer.Spec{ID: "refused", RootFS: root, Command: []string{"/probe"}, GPUs: allocator.Request{Count: 1}})
		if !errors.Is(err, containerizer.ErrInvalidSpec) {
			t.Errorf("root file system %s: %v, want ErrInvalidSpec", root, err)
		}
	}
	if got := n.c.Containers(); len(got) != 0 {
		t.Fatalf("refused launches left %v", got)
	}
}

// TestRootFSUpdateRecover grows and shrinks the GPUs of a container in its
// own root file system (its pivoted /dev follows), then re-adopts it from a
// new containerizer.
func TestRootFSUpdateRecover(t *testing.T) {
	versions(t, func(t *testing.T, n *testNode) {
		root := rootFS(t, n.probe)
		ctx := context.Background()
		ct, err := n.c.Launch(ctx, containerizer.Spec{ID: "grow", RootFS: root, Command: []string{"/probe", "sleep", "60"}, GPUs: allocator.Request{Count: 1}})
		if err != nil {
			t.Fatal(err)
		}
		// The init has pivoted once the probe is at the root it sees.
		for i := 0; ; i++ {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d/root/probe", ct.Pid)); err == nil {
				break
			}
			if i == 200 {
				t.Fatal("the init did not pivot into its root file system")
			}
			time.Sleep(10 * time.Millisecond)
		}
		seen := func() []string {
			entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/root/dev", ct.Pid))
			if err != nil {
				t.Fatal(err)
			}
			var gpus []string
			for _, e := range entries {
				if strings.HasPrefix(e.Name(), "nvidia") && strings.TrimLeft(e.Name()[len("nvidia"):], "0123456789") == "" {
					gpus = append(gpus, e.Name())
				}
			}
			return gpus
		}
		nodes := func(c containerizer.Container) []string {
			var out []string
			for _, g := range c.GPUs {
				out = append(out, fmt.Sprintf("nvidia%d", g.Minor))
			}
			slices.Sort(out)
			return out
		}
		for _, k := range []int{3, 2} {
			c, err := n.c.Update(ctx, "grow", k)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := seen(), nodes(c); !slices.Equal(got, want) {
				t.Fatalf("after Update to %d, the container's /dev holds %v, want %v", k, got, want)
			}
		}
		n2, err := open(n.dirs, n.version, n.parentCG, false)
		if err != nil {
			t.Fatal(err)
		}
		cs, err := n2.c.Recover(ctx)
		if err != nil || len(cs) != 1 || cs[0].ID != "grow" || len(cs[0].GPUs) != 2 {
			t.Fatalf("Recover = %+v, %v", cs, err)
		}
		c, err := n2.c.Update(ctx, "grow", 1)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := seen(), nodes(c); !slices.Equal(got, want) {
			t.Fatalf("after recovery and Update to 1, the container's /dev holds %v, want %v", got, want)
		}
		if err := n2.c.Destroy(ctx, "grow"); err != nil {
			t.Fatal(err)
		}
	})
}

// TestRootFSFromDockerSave unpacks what `docker save` writes of a probe
// image labelled for the driver volume and runs it natively: its entrypoint
// runs and the volume is there.
func TestRootFSFromDockerSave(t *testing.T) {
	testenv.RequireRoot(t)
	cli := testenv.RequireDocker(t)
	testenv.LockDocker(t, false)
	n := newNode(t, hostVersion())
	tag := testenv.BuildProbeImage(t, cli, testenv.ProbeImage{Labels: map[string]string{"com.nvidia.volumes.needed": "nvidia_driver"}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cli.ImageSave(ctx, []string{tag})
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "image.tar")
	f, err := os.Create(archive)
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.Copy(f, res)
	res.Close()
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(t.TempDir(), "rootfs")
	img, err := rootfs.Unpack(ctx, archive, root)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	_, err = n.c.Launch(ctx, containerizer.Spec{ID: "saved", RootFS: root, Labels: img.Labels, Env: img.Env,
		Command: append(slices.Clone(img.Entrypoint), "ls", "/usr/local/nvidia"), GPUs: allocator.Request{Count: 1}, Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatal(err)
	}
	defer n.c.Destroy(ctx, "saved")
	if st, err := n.c.Wait(ctx, "saved"); err != nil || st.Code != 0 || !strings.Contains(out.String(), "bin\n") {
		t.Fatalf("exit %d, %v; /usr/local/nvidia holds %q", st.Code, err, out.String())
	}
}
