package cgroups_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// fixture is a simulated DGX-1 host tree with real device nodes, and an
// isolator of one cgroup version under a parent of the test's own.
type fixture struct {
	iso  *cgroups.Isolator
	inv  *node.Inventory
	host *simnode.Host
}

func newFixture(t testing.TB, v cgroups.Version) *fixture {
	t.Helper()
	var mount string
	if v == cgroups.V1 {
		mount = testenv.RequireCgroupV1Devices(t)
	} else {
		mount = testenv.RequireCgroupV2(t)
	}
	sim, err := simnode.New("dgx1-volta")
	if err != nil {
		t.Fatal(err)
	}
	host, err := sim.MakeHost(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	inv, err := nvmlnode.Discover(context.Background(), sim.DiscoverOptions(host)...)
	if err != nil {
		t.Fatal(err)
	}
	parent := fmt.Sprintf("gpuiso-test-%d", os.Getpid())
	iso, err := cgroups.New(cgroups.WithVersion(v), cgroups.WithMount(mount), cgroups.WithParent(parent))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(filepath.Join(mount, parent)) })
	return &fixture{iso: iso, inv: inv, host: host}
}

func (f *fixture) rules(gpus ...int) []isolator.Rule {
	var devs []node.DeviceRef
	for _, i := range gpus {
		devs = append(devs, f.inv.Devices[i].Ref())
	}
	return isolator.GPURules(f.inv.ControlDevices, devs)
}

func (f *fixture) node(name string) string { return filepath.Join(f.host.DevRoot, name) }

// check opens every GPU sim and the control nodes from inside the cgroup:
// ENXIO for what is allowed, EPERM for the rest.
func (f *fixture) check(t *testing.T, p *testenv.Prober, allowed ...int) {
	t.Helper()
	for i := range f.inv.Devices {
		want := "EPERM"
		if slices.Contains(allowed, i) {
			want = "ENXIO"
		}
		if got, err := p.Open(f.node(fmt.Sprintf("nvidia%d", i))); err != nil || got != want {
			t.Fatalf("open nvidia%d with GPUs %v = %s, %v; want %s", i, allowed, got, err, want)
		}
	}
	for _, c := range f.inv.ControlDevices {
		if got, _ := p.Open(c.Path); got != "ENXIO" {
			t.Fatalf("open %s = %s, want ENXIO", c.Name, got)
		}
	}
}

func versions(t *testing.T, run func(t *testing.T, v cgroups.Version)) {
	for _, v := range []cgroups.Version{cgroups.V1, cgroups.V2} {
		t.Run(v.String(), func(t *testing.T) { run(t, v) })
	}
}

func TestIsolate(t *testing.T) {
	versions(t, func(t *testing.T, v cgroups.Version) {
		f := newFixture(t, v)
		ctx := context.Background()
		const owner = "task-13"
		if err := f.iso.Apply(ctx, owner, f.rules(1, 3)); err != nil {
			t.Fatal(err)
		}
		defer f.iso.Destroy(ctx, owner)
		got, err := f.iso.Rules(ctx, owner)
		if err != nil || !slices.Equal(got, f.rules(1, 3)) {
			t.Fatalf("Rules = %v, %v; want %v", got, err, f.rules(1, 3))
		}
		p := testenv.StartProber(t, func(pid int) error { return f.iso.AddProcess(ctx, owner, pid) })
		f.check(t, p, 1, 3)
		if owners, err := f.iso.Owners(ctx); err != nil || !slices.Equal(owners, []string{owner}) {
			t.Fatalf("Owners = %v, %v", owners, err)
		}

		if err := f.iso.Destroy(ctx, owner); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(f.iso.Path(owner)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("cgroup left after Destroy: %v", err)
		}
		if _, err := p.Open(f.node("nvidia1")); err == nil {
			t.Fatal("the container's process survived Destroy")
		}
		if err := f.iso.Destroy(ctx, owner); err != nil {
			t.Fatalf("second Destroy = %v, want nil", err)
		}
	})
}

// TestLiveUpdate adds and removes a GPU 100 times on a running container.
// After every step the access matches exactly, and a second process that
// keeps opening a device allowed throughout is never denied: no update
// passes through a moment where everything is denied.
func TestLiveUpdate(t *testing.T) {
	versions(t, func(t *testing.T, v cgroups.Version) {
		f := newFixture(t, v)
		ctx := context.Background()
		const owner = "live"
		if err := f.iso.Apply(ctx, owner, f.rules(2)); err != nil {
			t.Fatal(err)
		}
		defer f.iso.Destroy(ctx, owner)
		enter := func(pid int) error { return f.iso.AddProcess(ctx, owner, pid) }
		p := testenv.StartProber(t, enter)
		watcher := testenv.StartProber(t, enter)

		var denied, opens atomic.Int64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				r, err := watcher.Open(f.node("nvidia2"))
				if err != nil || r != "ENXIO" {
					denied.Add(1)
				}
				opens.Add(1)
			}
		}()
		for cycle := range 100 {
			if err := f.iso.Apply(ctx, owner, f.rules(2, 5)); err != nil {
				t.Fatalf("cycle %d grow: %v", cycle, err)
			}
			f.check(t, p, 2, 5)
			if err := f.iso.Apply(ctx, owner, f.rules(2)); err != nil {
				t.Fatalf("cycle %d shrink: %v", cycle, err)
			}
			f.check(t, p, 2)
		}
		close(stop)
		wg.Wait()
		if denied.Load() != 0 {
			t.Fatalf("the always-allowed GPU was denied %d times in %d opens during updates", denied.Load(), opens.Load())
		}
		if v == cgroups.V2 {
			if n, err := f.iso.Programs(ctx, owner); err != nil || n != 1 {
				t.Fatalf("%d device programs attached after 200 updates (%v), want exactly 1", n, err)
			}
		}
	})
}

func TestRejectsBadInput(t *testing.T) {
	versions(t, func(t *testing.T, v cgroups.Version) {
		f := newFixture(t, v)
		ctx := context.Background()
		for _, owner := range []string{"../x", "", "a/b", string(make([]byte, 200))} {
			if err := f.iso.Apply(ctx, owner, f.rules(0)); !errors.Is(err, node.ErrInvalidOwner) {
				t.Errorf("Apply(%q) = %v, want ErrInvalidOwner", owner, err)
			}
		}
		bad := append(f.rules(0), isolator.Rule{Type: 'c', Major: 195, Minor: 1, Access: "rwm"})
		if err := f.iso.Apply(ctx, "deny", bad); !errors.Is(err, isolator.ErrInvalidRule) {
			t.Errorf("Apply with a deny rule = %v, want ErrInvalidRule", err)
		}
		if owners, _ := f.iso.Owners(ctx); len(owners) != 0 {
			t.Fatalf("bad input created cgroups %v", owners)
		}
		if _, err := f.iso.Rules(ctx, "nobody-here"); !errors.Is(err, isolator.ErrUnknownContainer) {
			t.Fatalf("Rules(unknown) = %v", err)
		}
	})
}

// BenchmarkPrepareIsolateCleanup measures one container's isolator work:
// create and confine its cgroup, move a process in, and remove it again.
func BenchmarkPrepareIsolateCleanup(b *testing.B) {
	for _, v := range []cgroups.Version{cgroups.V1, cgroups.V2} {
		b.Run("cgroup="+v.String(), func(b *testing.B) {
			f := newFixture(b, v)
			ctx := context.Background()
			p := testenv.StartProber(b, nil)
			rules := f.rules(0, 1)
			b.ResetTimer()
			for i := range b.N {
				owner := fmt.Sprintf("bench-%d", i)
				if err := f.iso.Apply(ctx, owner, rules); err != nil {
					b.Fatal(err)
				}
				if err := f.iso.AddProcess(ctx, owner, p.Pid); err != nil {
					b.Fatal(err)
				}
				// Move it back out so Destroy finds an empty cgroup.
				if err := os.WriteFile(filepath.Join(filepath.Dir(f.iso.Path(owner)), "cgroup.procs"), []byte(fmt.Sprint(p.Pid)), 0); err != nil {
					b.Fatal(err)
				}
				if err := f.iso.Destroy(ctx, owner); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestParent: InParent moves an isolator to another parent; Owners lists
// the containers' cgroups of its parent but not a child that is itself a
// parent of cgroups; RemoveParent leaves a parent with children and removes
// an empty one.
func TestParent(t *testing.T) {
	versions(t, func(t *testing.T, v cgroups.Version) {
		f := newFixture(t, v)
		ctx := context.Background()
		mount := f.iso.Path("x")[:len(f.iso.Path("x"))-len("/"+f.iso.Parent()+"/x")]
		iso, err := f.iso.InParent(f.iso.Parent() + "/inner")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.iso.InParent("../escape"); err == nil {
			t.Error("InParent(../escape) accepted")
		}
		for _, id := range []string{"a", "b"} {
			if err := iso.Apply(ctx, id, f.rules(1)); err != nil {
				t.Fatal(err)
			}
		}
		nested := filepath.Join(mount, iso.Parent(), "nest")
		if err := os.MkdirAll(filepath.Join(nested, "c"), 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			os.Remove(filepath.Join(nested, "c"))
			os.Remove(nested)
			os.Remove(filepath.Join(mount, iso.Parent()))
		})
		owners, err := iso.Owners(ctx)
		if err != nil || !slices.Equal(owners, []string{"a", "b"}) {
			t.Fatalf("Owners = %v, %v; want [a b], not the nested parent", owners, err)
		}
		if err := iso.RemoveParent(); err != nil {
			t.Fatalf("RemoveParent of a parent in use: %v", err)
		}
		if _, err := os.Stat(filepath.Join(mount, iso.Parent())); err != nil {
			t.Fatalf("a parent in use was removed: %v", err)
		}
		for _, id := range []string{"a", "b"} {
			if err := iso.Destroy(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		os.Remove(filepath.Join(nested, "c"))
		os.Remove(nested)
		if err := iso.RemoveParent(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(mount, iso.Parent())); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the empty parent is left: %v", err)
		}
		if err := iso.RemoveParent(); err != nil {
			t.Fatalf("RemoveParent of a parent already gone: %v", err)
		}
	})
}
