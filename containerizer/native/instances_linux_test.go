package native_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/native"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// readmeAgent is an agent built exactly as the README shows: an allocator,
// cgroups.New() with the host's defaults, and a state directory of its own.
type readmeAgent struct {
	c     *native.Containerizer
	state string
	host  *simnode.Host
}

func newReadmeAgent(t *testing.T) *readmeAgent {
	t.Helper()
	base := t.TempDir()
	sim, err := simnode.New("dgx1-volta")
	if err != nil {
		t.Fatal(err)
	}
	host, err := sim.MakeHost(filepath.Join(base, "host"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Remove() })
	inv, err := nvmlnode.Discover(context.Background(), sim.DiscoverOptions(host)...)
	if err != nil {
		t.Fatal(err)
	}
	a, err := allocator.New(inv, allocator.WithStateDir(filepath.Join(base, "alloc")))
	if err != nil {
		t.Fatal(err)
	}
	iso, err := cgroups.New()
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(base, "state")
	c, err := native.New(native.Config{Allocator: a, Inventory: inv, Isolator: iso, StateDir: state})
	if err != nil {
		t.Fatal(err)
	}
	return &readmeAgent{c: c, state: state, host: host}
}

// launchHeld runs a container that exits 0 once its stdin is closed; the
// returned function closes it.
func (a *readmeAgent) launchHeld(t *testing.T, id string) func() {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	if _, err := a.c.Launch(context.Background(), containerizer.Spec{ID: id, Command: []string{"/bin/sh", "-c", "cat >/dev/null; exit 0"},
		GPUs: allocator.Request{Count: 1}, Stdin: r}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.c.Destroy(context.Background(), id) })
	return func() { w.Close() }
}

// cgroupWithProcess makes the cgroup dir (relative to the isolator's mount)
// and moves a fresh sleep into it: a process of someone else's.
func cgroupWithProcess(t *testing.T, iso *cgroups.Isolator, dir string) *exec.Cmd {
	t.Helper()
	mount := cgroupMount(iso)
	path := filepath.Join(mount, dir)
	if err := os.MkdirAll(path, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		for p := path; p != mount && p != filepath.Join(mount, cgroups.DefaultParent); p = filepath.Dir(p) {
			os.Remove(p)
		}
	})
	if err := os.WriteFile(filepath.Join(path, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// cgroupMount is the mount point of the isolator's hierarchy.
func cgroupMount(iso *cgroups.Isolator) string {
	return strings.TrimSuffix(iso.Path("x"), "/"+iso.Parent()+"/x")
}

func isAlive(cmd *exec.Cmd) bool { return running(cmd.Process.Pid) }

// TestAgentsDoNotCollide: two agents built as the README shows, each with a
// state directory of its own and a running container. Each one's Recover
// and Clean leave the other's container, and cgroups that are not its own
// (a neighbour's container in the shared default parent, a nested parent
// with a live process inside its own parent) alone, and return without
// waiting on them. Each agent's cgroup parent is gone once its last
// container is.
func TestAgentsDoNotCollide(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireNVIDIALibraries(t)
	a, b := newReadmeAgent(t), newReadmeAgent(t)
	releaseA, releaseB := a.launchHeld(t, "job-a"), b.launchHeld(t, "job-b")
	isoA := a.c.Isolator().(*cgroups.Isolator)
	isoB := b.c.Isolator().(*cgroups.Isolator)
	if got, want := isoA.Parent(), native.CgroupParent(a.state); got != want {
		t.Fatalf("agent A's cgroup parent = %q, want its own %q", got, want)
	}
	if isoA.Parent() == isoB.Parent() {
		t.Fatalf("both agents' cgroups are under %s", isoA.Parent())
	}
	// Someone else's container in the shared default parent, and a nested
	// parent holding a live process inside A's own.
	neighbour := cgroupWithProcess(t, isoA, filepath.Join(cgroups.DefaultParent, "neighbour-"+strconv.Itoa(os.Getpid())))
	nested := cgroupWithProcess(t, isoA, filepath.Join(isoA.Parent(), "nest", "inner"))

	for _, ag := range []struct {
		name string
		c    *native.Containerizer
	}{{"A", a.c}, {"B", b.c}} {
		// A bound far above what the work takes: Recover must not wait
		// for cgroups that are not its containers'.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		start := time.Now()
		if _, err := ag.c.Recover(ctx); err != nil {
			t.Errorf("agent %s: Recover: %v", ag.name, err)
		}
		if _, err := ag.c.Clean(ctx); err != nil {
			t.Errorf("agent %s: Clean: %v", ag.name, err)
		}
		cancel()
		t.Logf("agent %s: Recover and Clean took %v", ag.name, time.Since(start))
	}
	for name, cmd := range map[string]*exec.Cmd{"the neighbour's process": neighbour, "the process in a nested parent": nested} {
		if !isAlive(cmd) {
			t.Errorf("%s was killed", name)
		}
	}
	releaseA()
	releaseB()
	for name, ag := range map[string]*readmeAgent{"A": a, "B": b} {
		id := "job-" + strings.ToLower(name)
		st, err := ag.c.Wait(context.Background(), id)
		if err != nil || st.Code != 0 {
			t.Errorf("agent %s's container: exit %d, %v; want 0", name, st.Code, err)
		}
		if err := ag.c.Destroy(context.Background(), id); err != nil {
			t.Errorf("agent %s: Destroy: %v", name, err)
		}
	}
	// B's parent held only its container; A's holds the nested parent.
	mount := cgroupMount(isoB)
	if _, err := os.Stat(filepath.Join(mount, isoB.Parent())); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("agent B's cgroup parent is left after its last container: %v", err)
	}
	if _, err := os.Stat(filepath.Join(mount, isoA.Parent(), "nest")); err != nil {
		t.Errorf("the nested parent in A's was removed: %v", err)
	}
}
