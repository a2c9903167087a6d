package simnode_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// noPanic runs call, turning a panic into a test error.
func noPanic(t *testing.T, what string, call func() error) (err error) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			t.Errorf("%s panicked: %v", what, p)
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return call()
}

// TestConstructorsRefuse: bad names, nil and zero inputs give a typed
// error, never a panic.
func TestConstructorsRefuse(t *testing.T) {
	ctx := context.Background()
	var nilNode *simnode.Node
	for _, tc := range []struct {
		name string
		call func() error
		kind error
	}{
		{"New empty name", func() error { _, err := simnode.New(""); return err }, node.ErrNotFound},
		{"New path name", func() error { _, err := simnode.New("../dgx1-volta"); return err }, node.ErrNotFound},
		{"New NUL in name", func() error { _, err := simnode.New("dgx1-volta\x00"); return err }, node.ErrNotFound},
		{"New nil option", func() error { _, err := simnode.New("pcie8", nil); return err }, node.ErrInvalid},
		{"New bad driver version", func() error { _, err := simnode.New("pcie8", simnode.WithDriverVersion("../x")); return err }, node.ErrInvalid},
		{"NewFromSpec nil", func() error { _, err := simnode.NewFromSpec(nil); return err }, node.ErrInvalid},
		{"NewFromSpec zero", func() error { _, err := simnode.NewFromSpec(&simnode.Spec{}); return err }, node.ErrInvalid},
		{"MakeHost of a nil Node", func() error { _, err := nilNode.MakeHost(t.TempDir()); return err }, node.ErrInvalid},
		{"OpenHost of a nil Node", func() error { _, err := nilNode.OpenHost(ctx, t.TempDir()); return err }, node.ErrInvalid},
		{"MakeHost of a zero Node", func() error { _, err := (&simnode.Node{}).MakeHost(t.TempDir()); return err }, node.ErrInvalid},
		{"OpenHost of a zero Node", func() error { _, err := (&simnode.Node{}).OpenHost(ctx, t.TempDir()); return err }, node.ErrInvalid},
		{"Remove of a nil Host", func() error { return (*simnode.Host)(nil).Remove() }, node.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := noPanic(t, tc.name, tc.call); !errors.Is(err, tc.kind) {
				t.Errorf("%s = %v, want an error matching %v", tc.name, err, tc.kind)
			}
		})
	}
	sim, err := simnode.New("pcie8")
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"with\x00nul", filepath.Join(t.TempDir(), "a\x00b")} {
		for name, call := range map[string]func() error{
			"MakeHost": func() error { _, err := sim.MakeHost(dir); return err },
			"OpenHost": func() error { _, err := sim.OpenHost(ctx, dir); return err },
		} {
			if err := noPanic(t, name, call); err == nil {
				t.Errorf("%s(%q) made a tree", name, dir)
			}
		}
	}
}

// TestMakeHostExists: MakeHost over a tree already there is refused with
// ErrTreeExists (node.ErrExists), and the tree stays whole for OpenHost.
func TestMakeHostExists(t *testing.T) {
	testenv.RequireRoot(t)
	sim, err := simnode.New("pcie8")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "sim")
	h, err := sim.MakeHost(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = sim.MakeHost(dir)
	var ee *simnode.ExistsError
	if !errors.Is(err, simnode.ErrTreeExists) || !errors.Is(err, node.ErrExists) || !errors.As(err, &ee) || ee.Dir != dir {
		t.Fatalf("MakeHost over a tree = %v, want an ExistsError naming %s", err, dir)
	}
	got, err := sim.OpenHost(context.Background(), dir)
	if err != nil || *got != *h {
		t.Fatalf("OpenHost after a refused MakeHost = %+v, %v; want %+v", got, err, h)
	}
}

// TestHostSetupFailsAtEveryStep: MakeHost and OpenHost on a file system
// that runs out of inodes after 1, 2, ... files fail at every step of the
// making (after the marker too), never panic, and leave nothing of what
// they made; with room enough they succeed.
func TestHostSetupFailsAtEveryStep(t *testing.T) {
	testenv.RequireRoot(t)
	sim, err := simnode.New("hgx-h100-mig")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, call := range []struct {
		name string
		sub  string // under the mount
		make func(dir string) (*simnode.Host, error)
	}{
		{"MakeHost", "", sim.MakeHost},
		{"OpenHost", "sim/hgx-h100-mig", func(dir string) (*simnode.Host, error) { return sim.OpenHost(ctx, dir) }},
	} {
		t.Run(call.name, func(t *testing.T) {
			failed := 0
			for inodes := 2; ; inodes++ {
				mnt := t.TempDir()
				if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, fmt.Sprintf("nr_inodes=%d,mode=0755", inodes)); err != nil {
					t.Skipf("mount tmpfs: %v", err)
				}
				dir := filepath.Join(mnt, call.sub)
				var h *simnode.Host
				err := noPanic(t, fmt.Sprintf("%s with %d inodes", call.name, inodes), func() (err error) { h, err = call.make(dir); return err })
				left, _ := os.ReadDir(mnt)
				unix.Unmount(mnt, unix.MNT_DETACH)
				if err == nil {
					if h == nil {
						t.Fatalf("%d inodes: no host and no error", inodes)
					}
					break
				}
				failed++
				if len(left) != 0 {
					var names []string
					for _, e := range left {
						names = append(names, e.Name())
					}
					t.Errorf("%d inodes: %v, and %v left in the file system", inodes, err, names)
				}
				if inodes > 10000 {
					t.Fatalf("still failing with %d inodes: %v", inodes, err)
				}
			}
			if failed < 10 {
				t.Errorf("only %d failing steps: the file system did not run out inside the making", failed)
			}
		})
	}
}

// TestUntrustedDirs: a directory another user made, or one in a parent
// others may write in, is refused before anything is made in it; a
// tree in which a link or a device of another driver (/dev/mem's) was
// planted, or whose /proc/devices names a major of a real driver, is
// refused when read; a sticky parent (/tmp) with a root-owned directory
// in it is fine.
func TestUntrustedDirs(t *testing.T) {
	testenv.RequireRoot(t)
	sim, err := simnode.New("pcie8")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	calls := map[string]func(dir string) error{
		"MakeHost": func(dir string) error { _, err := sim.MakeHost(dir); return err },
		"OpenHost": func(dir string) error { _, err := sim.OpenHost(ctx, dir); return err },
	}
	refused := func(t *testing.T, name, dir, path string, err error) {
		t.Helper()
		var ue *simnode.UntrustedError
		if !errors.Is(err, simnode.ErrUntrusted) || !errors.Is(err, node.ErrInvalid) || !errors.As(err, &ue) || ue.Path != path {
			t.Errorf("%s(%s) = %v, want an UntrustedError naming %s", name, dir, err, path)
		} else if strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "root owns") {
			t.Errorf("%s: %q is not one line ending with what to do", name, err)
		}
	}
	base := t.TempDir()
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Run("made by another user", func(t *testing.T) {
		for name, call := range calls {
			dir := filepath.Join(base, "nobody-"+name)
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(dir, 65534, 65534); err != nil {
				t.Fatal(err)
			}
			refused(t, name, dir, dir, call(dir))
			if names := dirNames(dir); len(names) != 0 {
				t.Errorf("%s made %v in it", name, names)
			}
		}
	})
	t.Run("parent writable by others", func(t *testing.T) {
		parent := filepath.Join(base, "open")
		if err := os.Mkdir(parent, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(parent, 0o777); err != nil {
			t.Fatal(err)
		}
		for name, call := range calls {
			dir := filepath.Join(parent, name)
			refused(t, name, dir, parent, call(dir))
		}
		if names := dirNames(parent); len(names) != 0 {
			t.Errorf("made %v in it", names)
		}
	})
	t.Run("sticky parent", func(t *testing.T) {
		parent := filepath.Join(base, "sticky")
		if err := os.Mkdir(parent, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(parent, 0o777|os.ModeSticky); err != nil {
			t.Fatal(err)
		}
		h, err := sim.OpenHost(ctx, filepath.Join(parent, "sim"))
		if err != nil {
			t.Fatalf("OpenHost in a sticky parent: %v", err)
		}
		h.Remove()
	})
	t.Run("planted in the tree", func(t *testing.T) {
		for _, tc := range []struct {
			name  string
			plant func(t *testing.T, h *simnode.Host) string // the path to be named
		}{
			{"GPU node a link to /dev/mem", func(t *testing.T, h *simnode.Host) string {
				p := filepath.Join(h.DevRoot, "nvidia1")
				replace(t, p, func() error { return os.Symlink("/dev/mem", p) })
				return p
			}},
			{"GPU node /dev/mem's number", func(t *testing.T, h *simnode.Host) string {
				p := filepath.Join(h.DevRoot, "nvidia1")
				replace(t, p, func() error { return unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 1))) })
				return p
			}},
			{"dev a link to /dev", func(t *testing.T, h *simnode.Host) string {
				replace(t, h.DevRoot, func() error { return os.Symlink("/dev", h.DevRoot) })
				return h.DevRoot
			}},
			{"proc/devices naming mem's major", func(t *testing.T, h *simnode.Host) string {
				p := filepath.Join(h.ProcRoot, "devices")
				replace(t, p, func() error {
					return os.WriteFile(p, []byte(fmt.Sprintf("Character devices:\n  1 nvidia\n%3d nvidia-uvm\n%3d nvidia-caps\n", h.UVMMajor, h.CapsMajor)), 0o444)
				})
				return p
			}},
			{"proc/devices a link to the host's", func(t *testing.T, h *simnode.Host) string {
				p := filepath.Join(h.ProcRoot, "devices")
				replace(t, p, func() error { return os.Symlink("/proc/devices", p) })
				return "" // refused, as not a regular file of the tree
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				dir := filepath.Join(base, strings.ReplaceAll(tc.name, " ", "-"))
				h, err := sim.OpenHost(ctx, dir)
				if err != nil {
					t.Fatal(err)
				}
				path := tc.plant(t, h)
				_, err = sim.OpenHost(ctx, dir)
				if path == "" {
					if err == nil {
						t.Errorf("OpenHost of a tree with %s = nil error", tc.name)
					}
					return
				}
				refused(t, "OpenHost", dir, path, err)
			})
		}
	})
}

// replace removes p and makes it again with mk.
func replace(t *testing.T, p string, mk func() error) {
	t.Helper()
	if err := os.RemoveAll(p); err != nil {
		t.Fatal(err)
	}
	if err := mk(); err != nil {
		t.Fatal(err)
	}
}

// TestHostReadOnly: on a read-only file system MakeHost and OpenHost fail
// with an error, never panic, and make nothing.
func TestHostReadOnly(t *testing.T) {
	testenv.RequireRoot(t)
	sim, err := simnode.New("pcie8")
	if err != nil {
		t.Fatal(err)
	}
	mnt := t.TempDir()
	if err := unix.Mount("tmpfs", mnt, "tmpfs", unix.MS_RDONLY, "mode=0755"); err != nil {
		t.Skipf("mount tmpfs: %v", err)
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	for name, call := range map[string]func() error{
		"MakeHost":       func() error { _, err := sim.MakeHost(mnt); return err },
		"MakeHost below": func() error { _, err := sim.MakeHost(filepath.Join(mnt, "a", "b")); return err },
		"OpenHost":       func() error { _, err := sim.OpenHost(context.Background(), mnt); return err },
		"OpenHost below": func() error {
			_, err := sim.OpenHost(context.Background(), filepath.Join(mnt, "sim", "pcie8"))
			return err
		},
		"Remove of nothing": func() error { return (&simnode.Host{Root: mnt}).Remove() },
	} {
		err := noPanic(t, name, call)
		if name != "Remove of nothing" && err == nil {
			t.Errorf("%s on a read-only file system: no error", name)
		}
		if left := dirNames(mnt); len(left) != 0 {
			t.Errorf("%s left %v", name, left)
		}
	}
}
