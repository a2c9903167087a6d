package volume

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const childEnv = "GPUISO_VOLUME_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "build":
		buildChild()
		return
	case "stranger":
		strangerChild()
		return
	}
	os.Exit(m.Run())
}

// buildChild waits for a line on stdin, then builds the volume of the
// driver root os.Args[1] under the root os.Args[2] and prints "built" or
// "found".
func buildChild() {
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		fmt.Println("stdin:", err)
		os.Exit(2)
	}
	args := os.Args[len(os.Args)-2:]
	m, err := New(WithDriverRoot(args[0]), WithRoot(args[1]), WithProcRoot(filepath.Join(args[0], "proc")), WithLinks(false))
	if err == nil {
		var v *Volume
		if v, err = m.Build(context.Background()); err == nil {
			if v.Built {
				fmt.Println("built")
			} else {
				fmt.Println("found")
			}
			os.Exit(0)
		}
	}
	fmt.Println(err)
	os.Exit(1)
}

func TestDriverVersion(t *testing.T) {
	const v = "535.309.01"
	tr := driverTree(t, v)
	noDriver := newTree(t)
	noDriver.writeCache()
	loaded := newTree(t)
	loaded.writeCache()
	loaded.file("proc/driver/nvidia/version", []byte("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024\nGCC version:  gcc version 12.2.0\n"), 0o444)
	nvml := func(v string, err error) Option {
		return WithNVML(func(context.Context) (string, error) { return v, err })
	}
	notLoaded := errors.New("Driver Not Loaded")
	tests := []struct {
		name string
		tree *tree
		opts []Option
		want string
		err  error
	}{
		{"explicit", tr, []Option{WithDriverVersion("470.1")}, "470.1", nil},
		{"nvml", tr, []Option{nvml("550.54.14", nil)}, "550.54.14", nil},
		{"nvml fails, library file", tr, []Option{nvml("", notLoaded)}, v, nil},
		{"nvml answers nonsense, library file", tr, []Option{nvml("../../etc", nil)}, v, nil},
		{"proc", loaded, nil, "550.54.14", nil},
		{"nothing", noDriver, []Option{nvml("", notLoaded)}, "", ErrNoDriverVersion},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.tree.manager(tt.opts...).DriverVersion(context.Background())
			if got != tt.want || !errors.Is(err, tt.err) {
				t.Fatalf("DriverVersion = %q, %v; want %q, %v", got, err, tt.want, tt.err)
			}
			if tt.err != nil && !errors.Is(err, notLoaded) {
				t.Errorf("error %v does not carry the NVML failure", err)
			}
		})
	}
	if _, err := New(WithDriverVersion("5/35")); !errors.Is(err, ErrInvalidVersion) {
		t.Errorf("WithDriverVersion(5/35) = %v, want ErrInvalidVersion", err)
	}
}

func TestBuild(t *testing.T) {
	const v = "535.309.01"
	for _, links := range []bool{true, false} {
		t.Run(fmt.Sprintf("links=%v", links), func(t *testing.T) {
			tr := driverTree(t, v)
			m := tr.manager(WithLinks(links))
			ctx := context.Background()
			vol, err := m.Build(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !vol.Built || vol.Version != v || vol.Files != 8 || vol.Links != 8 || vol.Path != filepath.Join(m.Root(), "nvidia_"+v) {
				t.Fatalf("Build = %+v", vol)
			}
			// Every file is the source's content, linked or copied as asked.
			mf, err := readManifest(vol.Path)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range mf.Files {
				got, err1 := os.ReadFile(filepath.Join(vol.Path, f.Path))
				want, err2 := os.ReadFile(f.Source)
				if err := errors.Join(err1, err2); err != nil || string(got) != string(want) {
					t.Errorf("%s differs from %s (%v)", f.Path, f.Source, err)
				}
				fi, _ := os.Stat(filepath.Join(vol.Path, f.Path))
				si, _ := os.Stat(f.Source)
				if f.Linked != links || os.SameFile(fi, si) != links {
					t.Errorf("%s: linked %v (same file %v), want %v", f.Path, f.Linked, os.SameFile(fi, si), links)
				}
			}
			out, err := exec.Command(filepath.Join(vol.Path, "bin", "nvidia-smi")).CombinedOutput()
			if err != nil || string(out) != "nvidia-smi "+v+"\n" {
				t.Errorf("volume's nvidia-smi: %q, %v", out, err)
			}
			for _, l := range []string{"lib64/libcuda.so", "lib64/libcuda.so.1", "lib/libcuda.so"} {
				if _, err := os.Stat(filepath.Join(vol.Path, l)); err != nil {
					t.Errorf("link %s does not lead to a file: %v", l, err)
				}
			}
			// Warm: found as it is.
			again, err := m.Build(ctx)
			if err != nil || again.Built || again.Files != vol.Files {
				t.Fatalf("second Build = %+v, %v; want the same volume, not built", again, err)
			}
			assertOnlyVolumes(t, m.Root(), "nvidia_"+v)
		})
	}
}

// assertOnlyVolumes checks that the root holds the named volumes and no
// leftover of a build.
func assertOnlyVolumes(t *testing.T, root string, want ...string) {
	t.Helper()
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		if e.Name() != usersDir && e.Name() != lockDir {
			got = append(got, e.Name())
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("root holds %q, want %q", got, want)
	}
}

func TestBuildRepairsDamage(t *testing.T) {
	const v = "535.309.01"
	const lib = "lib64/libnvidia-ml.so." + v
	tests := []struct {
		name   string
		damage func(t *testing.T, dir string)
		deep   bool // only a deep verification sees it
	}{
		{"truncated", func(t *testing.T, dir string) { must(t, os.Truncate(filepath.Join(dir, lib), 3)) }, false},
		{"removed", func(t *testing.T, dir string) { must(t, os.Remove(filepath.Join(dir, lib))) }, false},
		{"extra file", func(t *testing.T, dir string) {
			must(t, os.WriteFile(filepath.Join(dir, "lib64", "libevil.so.1"), []byte("x"), 0o644))
		}, false},
		{"link retargeted", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "lib64", "libcuda.so.1")
			must(t, os.Remove(p))
			must(t, os.Symlink("/tmp/libcuda.so", p))
		}, false},
		{"manifest edited", func(t *testing.T, dir string) {
			p := filepath.Join(dir, ManifestName)
			b, err := os.ReadFile(p)
			must(t, err)
			must(t, os.WriteFile(p, []byte(strings.Replace(string(b), `"size": `, `"size": 1`, 1)), 0o644))
		}, false},
		{"same size, time restored", func(t *testing.T, dir string) {
			p := filepath.Join(dir, lib)
			fi, err := os.Stat(p)
			must(t, err)
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			must(t, err)
			_, err = f.WriteAt([]byte{0xde, 0xad}, 20)
			must(t, errors.Join(err, f.Close()))
			must(t, os.Chtimes(p, fi.ModTime(), fi.ModTime()))
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := driverTree(t, v)
			// Copies: damaging a link would damage the driver itself.
			m := tr.manager(WithLinks(false), WithDeepVerify(tt.deep))
			ctx := context.Background()
			vol, err := m.Build(ctx)
			must(t, err)
			mf, err := readManifest(vol.Path)
			must(t, err)
			tt.damage(t, vol.Path)
			if tt.deep {
				if err := mf.verify(vol.Path, false); err != nil {
					t.Fatalf("shallow verify saw the damage: %v", err)
				}
			}
			if err := mf.verify(vol.Path, true); !errors.Is(err, ErrDamaged) && tt.name != "manifest edited" {
				t.Fatalf("deep verify = %v, want ErrDamaged", err)
			}
			again, err := m.Build(ctx)
			if err != nil || !again.Built {
				t.Fatalf("Build after damage = %+v, %v; want a rebuild", again, err)
			}
			mf, err = readManifest(again.Path)
			must(t, err)
			if err := mf.verify(again.Path, true); err != nil {
				t.Fatalf("rebuilt volume: %v", err)
			}
			assertOnlyVolumes(t, m.Root(), "nvidia_"+v)
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestBuildConcurrentGoroutines(t *testing.T) {
	tr := driverTree(t, "535.309.01")
	m := tr.manager(WithLinks(false))
	const n = 8
	var wg sync.WaitGroup
	built := make(chan bool, n)
	for range n {
		wg.Go(func() {
			v, err := m.Build(context.Background())
			if err != nil {
				t.Error(err)
				return
			}
			built <- v.Built
		})
	}
	wg.Wait()
	close(built)
	count := 0
	for b := range built {
		if b {
			count++
		}
	}
	if count != 1 {
		t.Fatalf("%d of %d builders built, want 1", count, n)
	}
	assertOnlyVolumes(t, m.Root(), "nvidia_535.309.01")
}

func TestBuildConcurrentProcesses(t *testing.T) {
	const v = "535.309.01"
	tr := driverTree(t, v)
	root := filepath.Join(t.TempDir(), "volumes")
	const n = 4
	var stdins []io.WriteCloser
	var outs []*strings.Builder
	var cmds []*exec.Cmd
	for range n {
		cmd := exec.Command(os.Args[0], "-test.run=^$", tr.root, root)
		cmd.Env = append(os.Environ(), childEnv+"=build")
		out := &strings.Builder{}
		cmd.Stdout, cmd.Stderr = out, out
		in, err := cmd.StdinPipe()
		must(t, err)
		must(t, cmd.Start())
		stdins, outs, cmds = append(stdins, in), append(outs, out), append(cmds, cmd)
	}
	for _, in := range stdins { // all at once
		fmt.Fprintln(in)
		in.Close()
	}
	var results []string
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("builder %d: %v: %s", i, err, outs[i])
		}
		results = append(results, strings.TrimSpace(outs[i].String()))
	}
	slices.Sort(results)
	if want := []string{"built", "found", "found", "found"}; !slices.Equal(results, want) {
		t.Fatalf("builders said %q, want %q", results, want)
	}
	assertOnlyVolumes(t, root, "nvidia_"+v)
	mf, err := readManifest(filepath.Join(root, "nvidia_"+v))
	must(t, err)
	must(t, mf.verify(filepath.Join(root, "nvidia_"+v), true))
}

func TestSafety(t *testing.T) {
	const v = "535.309.01"
	tests := []struct {
		name    string
		prepare func(t *testing.T, root string)
	}{
		{"root writable by others", func(t *testing.T, root string) { must(t, os.Chmod(root, 0o777)) }},
		{"root writable by group", func(t *testing.T, root string) { must(t, os.Chmod(root, 0o775)) }},
		{"version directory writable by others", func(t *testing.T, root string) {
			must(t, os.Mkdir(filepath.Join(root, "nvidia_"+v), 0o700))
			must(t, os.Chmod(filepath.Join(root, "nvidia_"+v), 0o757))
		}},
		{"version directory is a symlink", func(t *testing.T, root string) {
			must(t, os.Symlink(t.TempDir(), filepath.Join(root, "nvidia_"+v)))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := driverTree(t, v)
			m := tr.manager()
			must(t, os.MkdirAll(m.Root(), 0o755))
			tt.prepare(t, m.Root())
			before := listTree(t, m.Root())
			_, err := m.Build(context.Background())
			var ue *UnsafeError
			if !errors.Is(err, ErrUnsafe) || !errors.As(err, &ue) {
				t.Fatalf("Build = %v, want an *UnsafeError", err)
			}
			// The root's lock (made on its first use) aside.
			after := slices.DeleteFunc(listTree(t, m.Root()), func(e string) bool {
				return strings.HasPrefix(e, filepath.Join(m.Root(), lockDir)+" ") || strings.HasPrefix(e, filepath.Join(m.Root(), lockDir)+"/")
			})
			if !slices.Equal(before, after) {
				t.Fatalf("refused Build changed the root:\n%q\n%q", before, after)
			}
		})
	}
}

// listTree lists every path under dir with its mode.
func listTree(t *testing.T, dir string) []string {
	var out []string
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		out = append(out, fmt.Sprintf("%s %v", p, fi.Mode()))
		return nil
	})
	must(t, err)
	return out
}

func TestUsersAndGC(t *testing.T) {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "volumes")
	old, cur := driverTree(t, "470.1"), driverTree(t, "535.309.01")
	mOld := old.manager(WithRoot(root))
	mCur := cur.manager(WithRoot(root))
	for _, m := range []*Manager{mOld, mCur} {
		if _, err := m.Build(ctx); err != nil {
			t.Fatal(err)
		}
	}
	assertOnlyVolumes(t, root, "nvidia_470.1", "nvidia_535.309.01")
	must(t, mOld.Acquire(ctx, "470.1", "task-1"))
	must(t, mOld.Acquire(ctx, "470.1", "task-1"))
	must(t, mCur.Acquire(ctx, "535.309.01", "task-2"))

	// Bad input changes nothing.
	before := listTree(t, root)
	for _, bad := range []struct{ version, user string }{
		{"470.1", "../task"}, {"470.1", ".hidden"}, {"470.1", ""}, {"470.1", "a/b"}, {"../470", "task-3"},
	} {
		err := mOld.Acquire(ctx, bad.version, bad.user)
		if !errors.Is(err, ErrInvalidName) && !errors.Is(err, ErrInvalidVersion) {
			t.Errorf("Acquire(%q, %q) = %v, want an invalid-name error", bad.version, bad.user, err)
		}
	}
	if err := mOld.Acquire(ctx, "999.1", "task-3"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Acquire(missing version) = %v, want ErrNotFound", err)
	}
	if after := listTree(t, root); !slices.Equal(before, after) {
		t.Fatalf("refused Acquire changed the root")
	}

	vols, err := mCur.List(ctx)
	must(t, err)
	got := fmt.Sprint(volumeSummary(vols))
	if want := "[470.1:[task-1] 535.309.01:[task-2]]"; got != want {
		t.Fatalf("List = %s, want %s", got, want)
	}

	removed, err := mCur.GC(ctx)
	if err != nil || len(removed) != 0 {
		t.Fatalf("GC with users = %v, %v; want nothing removed", removed, err)
	}
	must(t, mOld.Release(ctx, "470.1", "task-1"))
	must(t, mOld.Release(ctx, "470.1", "task-1")) // again: nothing to do
	must(t, mCur.Release(ctx, "535.309.01", "task-2"))
	removed, err = mCur.GC(ctx, "535.309.01")
	if err != nil || !slices.Equal(removed, []string{"470.1"}) {
		t.Fatalf("GC keeping 535.309.01 = %v, %v; want [470.1]", removed, err)
	}
	assertOnlyVolumes(t, root, "nvidia_535.309.01")
	removed, err = mCur.GC(ctx)
	if err != nil || !slices.Equal(removed, []string{"535.309.01"}) {
		t.Fatalf("GC = %v, %v; want [535.309.01]", removed, err)
	}
	assertOnlyVolumes(t, root)
}

func volumeSummary(vols []Volume) []string {
	var out []string
	for _, v := range vols {
		out = append(out, fmt.Sprintf("%s:%v", v.Version, v.Users))
	}
	return out
}

func TestGCRemovesCrashLeftovers(t *testing.T) {
	tr := driverTree(t, "535.309.01")
	m := tr.manager()
	ctx := context.Background()
	_, err := m.Build(ctx)
	must(t, err)
	must(t, m.Acquire(ctx, "535.309.01", "c1"))
	half := filepath.Join(m.Root(), tmpPrefix+"nvidia_535.309.01-123")
	must(t, os.MkdirAll(filepath.Join(half, "lib64"), 0o700))
	removed, err := m.GC(ctx)
	if err != nil || len(removed) != 0 {
		t.Fatalf("GC = %v, %v", removed, err)
	}
	assertOnlyVolumes(t, m.Root(), "nvidia_535.309.01")
}

func TestBuildCancelled(t *testing.T) {
	tr := driverTree(t, "535.309.01")
	m := tr.manager()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := m.Build(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Build(cancelled) = %v, want context.Canceled", err)
	}
	// A builder waiting for the lock gives up when its context ends.
	unlock, err := m.lock(context.Background())
	must(t, err)
	defer unlock()
	short, stop := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer stop()
	if _, err := m.Build(short); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrLocked) {
		t.Fatalf("Build while locked = %v, want context.DeadlineExceeded and ErrLocked", err)
	}
}

// TestFillStaysInside hands the builder contents naming paths outside the
// volume: it refuses them and writes nothing outside its directory.
func TestFillStaysInside(t *testing.T) {
	tr := driverTree(t, "535.309.01")
	m := tr.manager()
	src := filepath.Join(tr.root, "usr/lib/nvidia/current/nvidia-smi")
	tests := []struct {
		name string
		c    Contents
	}{
		{"file up", Contents{Files: []File{{Path: "lib64/../../escape", Source: src}}}},
		{"file absolute", Contents{Files: []File{{Path: "/tmp/escape", Source: src}}}},
		{"file in another directory", Contents{Files: []File{{Path: "etc/escape", Source: src}}}},
		{"link up", Contents{Links: []Link{{Path: "lib64/../../escape", Target: "x"}}}},
		{"link target outside", Contents{Links: []Link{{Path: "lib64/x", Target: "/etc/passwd"}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := t.TempDir()
			tmp := filepath.Join(base, "a", "b")
			must(t, os.MkdirAll(tmp, 0o700))
			for _, links := range []bool{true, false} {
				m.cfg.links = links
				if _, err := m.fill(context.Background(), tmp, &tt.c); !errors.Is(err, ErrInvalidName) {
					t.Fatalf("fill = %v, want ErrInvalidName", err)
				}
				must(t, os.RemoveAll(tmp))
				must(t, os.MkdirAll(tmp, 0o700))
			}
			if got := listTree(t, base); len(got) != 3 {
				t.Fatalf("something was written: %q", got)
			}
		})
	}
}

func TestBuildKeepsCapabilities(t *testing.T) {
	tr := driverTree(t, "535.309.01")
	root := filepath.Join(t.TempDir(), "volumes")
	ctx := context.Background()
	utility := tr.manager(WithRoot(root), WithCapabilities(Utility))
	compute := tr.manager(WithRoot(root), WithCapabilities(Compute))
	v, err := utility.Build(ctx)
	if err != nil || v.Files != 2 {
		t.Fatalf("utility Build = %+v, %v", v, err)
	}
	v, err = compute.Build(ctx)
	if err != nil || !v.Built || !slices.Equal(v.Capabilities, []Capability{Compute, Utility}) || v.Files != 5 {
		t.Fatalf("compute Build over a utility volume = %+v, %v; want both", v, err)
	}
	for _, m := range []*Manager{utility, compute} {
		if v, err := m.Build(ctx); err != nil || v.Built {
			t.Fatalf("Build = %+v, %v; want the volume found", v, err)
		}
	}
}

func TestBuildIgnoresUmask(t *testing.T) {
	old := syscall.Umask(0o002)
	defer syscall.Umask(old)
	tr := driverTree(t, "535.309.01")
	m := tr.manager(WithLinks(false))
	v, err := m.Build(context.Background())
	must(t, err)
	for _, p := range []string{m.Root(), v.Path, filepath.Join(v.Path, "lib64"), filepath.Join(v.Path, "lib64", "libcuda.so.535.309.01")} {
		fi, err := os.Stat(p)
		must(t, err)
		if fi.Mode().Perm()&0o022 != 0 {
			t.Errorf("%s: mode %v, writable by group or others", p, fi.Mode())
		}
	}
	must(t, m.Acquire(context.Background(), v.Version, "c1"))
	if _, err := m.Build(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestRebuildOfDamagedKeepsCapabilities(t *testing.T) {
	tr := driverTree(t, "535.309.01")
	root := filepath.Join(t.TempDir(), "volumes")
	ctx := context.Background()
	all := tr.manager(WithRoot(root), WithLinks(false))
	utility := tr.manager(WithRoot(root), WithLinks(false), WithCapabilities(Utility))
	v, err := all.Build(ctx)
	must(t, err)
	must(t, os.Remove(filepath.Join(v.Path, "lib64", "libcuda.so.535.309.01")))
	again, err := utility.Build(ctx)
	if err != nil || !again.Built || again.Files != v.Files || !slices.Equal(again.Capabilities, v.Capabilities) {
		t.Fatalf("rebuild by a utility manager = %+v, %v; want the whole volume back", again, err)
	}
}
