package native

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// The tests of this file run the containerizer's whole lifecycle without
// root: a recording isolator and an in-memory /dev stand in for the kernel,
// and inits run bare (no namespaces, mounts or confinement).

var errInjected = errors.New("injected failure")

// recorder is an Isolator that records what it is asked and can fail any
// method once told to.
type recorder struct {
	mu    sync.Mutex
	calls []string
	rules map[string][]isolator.Rule
	procs map[string][]int
	fail  map[string]bool
}

func newRecorder() *recorder {
	return &recorder{rules: map[string][]isolator.Rule{}, procs: map[string][]int{}, fail: map[string]bool{}}
}

func (r *recorder) record(call string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, call)
	name, _, _ := strings.Cut(call, " ")
	if r.fail[name] {
		return errInjected
	}
	return nil
}

func (r *recorder) Version() cgroups.Version { return cgroups.V1 }

func (r *recorder) Apply(ctx context.Context, id string, rules []isolator.Rule) error {
	if err := r.record("apply " + id); err != nil {
		return err
	}
	r.mu.Lock()
	r.rules[id] = slices.Clone(rules)
	r.mu.Unlock()
	return nil
}

func (r *recorder) AddProcess(ctx context.Context, id string, pid int) error {
	if err := r.record("add-process " + id); err != nil {
		return err
	}
	r.mu.Lock()
	r.procs[id] = append(r.procs[id], pid)
	r.mu.Unlock()
	return nil
}

func (r *recorder) OpenCgroup(id string) (*os.File, error) {
	return nil, fmt.Errorf("open cgroup %s: %w", id, node.ErrNotSupported)
}

func (r *recorder) Processes(ctx context.Context, id string) ([]int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.procs[id]), nil
}

func (r *recorder) Owners(ctx context.Context) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for id := range r.rules {
		out = append(out, id)
	}
	sort.Strings(out)
	return out, nil
}

// Destroy kills the process groups of id's processes (each init is a
// session leader, its command in its group), as removing a cgroup does.
func (r *recorder) Destroy(ctx context.Context, id string) error {
	if err := r.record("destroy " + id); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, pid := range r.procs[id] {
		syscall.Kill(-pid, syscall.SIGKILL)
	}
	delete(r.procs, id)
	delete(r.rules, id)
	return nil
}

func (r *recorder) allowed(id string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, rule := range r.rules[id] {
		out = append(out, rule.String())
	}
	return out
}

// memDev is a /dev kept in memory.
type memDev struct {
	mu   sync.Mutex
	dirs map[string]map[string]isolator.DeviceNode
	fail bool
}

func (m *memDev) makeDev(dir string, nodes []isolator.DeviceNode) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail {
		return errInjected
	}
	m.dirs[dir] = map[string]isolator.DeviceNode{}
	for _, n := range nodes {
		m.dirs[dir][strings.TrimPrefix(n.Path, "/dev/")] = n
	}
	return os.MkdirAll(dir, 0o700)
}

func (m *memDev) addNode(dir string, n isolator.DeviceNode) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dirs[dir][strings.TrimPrefix(n.Path, "/dev/")] = n
	return nil
}

func (m *memDev) removeNode(dir string, n isolator.DeviceNode) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.dirs[dir], strings.TrimPrefix(n.Path, "/dev/"))
	return nil
}

func (m *memDev) removeDev(dir string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.dirs, dir)
	return os.RemoveAll(dir)
}

func (m *memDev) names(dir string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for name := range m.dirs[dir] {
		if strings.HasPrefix(name, "nvidia") && strings.Trim(name[len("nvidia"):], "0123456789") == "" {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// bareNode is a simulated DGX-1 (no host tree), an allocator and a bare
// containerizer over a recorder and an in-memory /dev.
type bareNode struct {
	inv   *node.Inventory
	alloc *allocator.Allocator
	iso   *recorder
	dev   *memDev
	state string
	c     *Containerizer
}

func newBareNode(t *testing.T) *bareNode {
	t.Helper()
	sim, err := simnode.New("dgx1-volta")
	if err != nil {
		t.Fatal(err)
	}
	inv, err := nvmlnode.Discover(context.Background(), nvmlnode.WithNVML(sim.NVML()), nvmlnode.WithDevRoot(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	alloc, err := allocator.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	n := &bareNode{inv: inv, alloc: alloc, iso: newRecorder(), dev: &memDev{dirs: map[string]map[string]isolator.DeviceNode{}}, state: t.TempDir()}
	n.c = n.open(t)
	t.Cleanup(func() {
		for _, ct := range n.c.Containers() {
			n.c.Destroy(context.Background(), ct.ID)
		}
	})
	return n
}

// open makes a containerizer over the node's state, as a restarted agent
// would.
func (n *bareNode) open(t *testing.T) *Containerizer {
	t.Helper()
	c, err := New(Config{Allocator: n.alloc, Inventory: n.inv, Isolator: n.iso, StateDir: n.state})
	if err != nil {
		t.Fatal(err)
	}
	c.rt.dev, c.rt.bare = n.dev, true
	return c
}

// nothingLeft fails unless id holds nothing anywhere.
func (n *bareNode) nothingLeft(t *testing.T, id string) {
	t.Helper()
	if al, err := n.alloc.Allocation(id); err == nil {
		t.Errorf("%s still holds %+v", id, al)
	}
	if owners, _ := n.iso.Owners(context.Background()); slices.Contains(owners, id) {
		t.Errorf("%s still has device rules", id)
	}
	if _, err := os.Stat(filepath.Join(n.state, id)); err == nil {
		t.Errorf("%s's state directory is left", id)
	}
	if names := n.dev.names(filepath.Join(n.state, id, "dev")); len(names) > 0 {
		t.Errorf("%s's /dev still holds %v", id, names)
	}
}

func rulesOf(inv *node.Inventory, idx ...int) []string {
	var out []string
	for _, i := range idx {
		out = append(out, fmt.Sprintf("c %d:%d rwm", inv.Devices[i].Node.Major, inv.Devices[i].Node.Minor))
	}
	return out
}

func TestBareLifecycle(t *testing.T) {
	n := newBareNode(t)
	ctx := context.Background()
	ct, err := n.c.Launch(ctx, containerizer.Spec{ID: "job", Command: []string{"/bin/sh", "-c", "exit 3"}, GPUs: allocator.Request{Devices: []string{"1", "3"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := n.dev.names(n.c.rt.devDir("job")); !slices.Equal(got, []string{"nvidia1", "nvidia3"}) {
		t.Errorf("/dev holds %v", got)
	}
	allowed := n.iso.allowed("job")
	for _, want := range rulesOf(n.inv, 1, 3) {
		if !slices.Contains(allowed, want) {
			t.Errorf("rules %v lack %s", allowed, want)
		}
	}
	for _, deny := range rulesOf(n.inv, 0, 2, 4, 5, 6, 7) {
		if slices.Contains(allowed, deny) {
			t.Errorf("rules allow %s", deny)
		}
	}
	if st, err := n.c.Wait(ctx, "job"); err != nil || st.Code != 3 {
		t.Fatalf("wait = %+v, %v; want exit 3", st, err)
	}
	if ct.Pid == 0 || len(ct.GPUs) != 2 {
		t.Errorf("container %+v", ct)
	}
	if err := n.c.Destroy(ctx, "job"); err != nil {
		t.Fatal(err)
	}
	n.nothingLeft(t, "job")
	if want := []string{"apply job", "add-process job", "destroy job"}; !slices.Equal(n.iso.calls, want) {
		t.Errorf("isolator calls %v, want %v", n.iso.calls, want)
	}
}

func TestBareUpdate(t *testing.T) {
	n := newBareNode(t)
	ctx := context.Background()
	if _, err := n.c.Launch(ctx, containerizer.Spec{ID: "grow", Command: []string{"sleep", "60"}}); err != nil {
		t.Fatal(err)
	}
	for _, count := range []int{3, 1, 4, 2} {
		ct, err := n.c.Update(ctx, "grow", count)
		if err != nil {
			t.Fatalf("update to %d: %v", count, err)
		}
		var idx []int
		var names []string
		for _, g := range ct.GPUs {
			idx = append(idx, g.Index)
			names = append(names, fmt.Sprintf("nvidia%d", g.Minor))
		}
		sort.Strings(names)
		if got := n.dev.names(n.c.rt.devDir("grow")); len(ct.GPUs) != count || !slices.Equal(got, names) {
			t.Fatalf("update to %d: GPUs %v, /dev %v", count, idx, got)
		}
		al, err := n.alloc.Allocation("grow")
		if err != nil || len(al.Devices) != count {
			t.Fatalf("update to %d: allocation %+v, %v", count, al, err)
		}
		allowed := n.iso.allowed("grow")
		for i := range n.inv.Devices {
			if want := slices.Contains(idx, i); slices.Contains(allowed, rulesOf(n.inv, i)[0]) != want {
				t.Fatalf("update to %d: GPU %d allowed = %v", count, i, !want)
			}
		}
	}
	if _, err := n.c.Update(ctx, "grow", 0); !errors.Is(err, node.ErrInvalid) {
		t.Fatalf("update to 0 = %v", err)
	}
	// Ended, though no one has waited for it yet: refused, GPUs kept.
	if _, err := n.c.Launch(ctx, containerizer.Spec{ID: "ends", Command: []string{"true"}, GPUs: allocator.Request{Count: 1}}); err != nil {
		t.Fatal(err)
	}
	<-n.c.rt.known("ends").exited
	if _, err := n.c.Update(ctx, "ends", 2); !errors.Is(err, containerizer.ErrNotSupported) {
		t.Fatalf("update of an ended container = %v", err)
	}
	if al, err := n.alloc.Allocation("ends"); err != nil || len(al.Devices) != 1 {
		t.Fatalf("after a refused update: %+v, %v", al, err)
	}
	if err := n.c.Destroy(ctx, "grow"); err != nil {
		t.Fatal(err)
	}
	n.nothingLeft(t, "grow")
}

// TestBareLaunchFailures fails each step of a launch in turn: the launch
// fails with the cause and leaves nothing.
func TestBareLaunchFailures(t *testing.T) {
	for _, step := range []string{"allocate", "dev", "apply", "add-process", "command"} {
		t.Run(step, func(t *testing.T) {
			n := newBareNode(t)
			spec := containerizer.Spec{ID: "doomed", Command: []string{"sleep", "60"}, GPUs: allocator.Request{Count: 2}}
			switch step {
			case "allocate":
				spec.GPUs.Count = 9
			case "dev":
				n.dev.fail = true
			case "apply", "add-process":
				n.iso.fail[step] = true
			case "command":
				spec.Command = []string{""}
			}
			if _, err := n.c.Launch(context.Background(), spec); err == nil {
				t.Fatal("launch succeeded")
			}
			n.nothingLeft(t, "doomed")
			if len(n.c.Containers()) != 0 {
				t.Fatalf("containers %+v", n.c.Containers())
			}
		})
	}
}

// TestBareRecover restarts the containerizer under a running container and
// one that exited: both are re-adopted, this process being their
// supervisor, the first with its GPUs, the second as exited; destroying
// them gives everything back.
func TestBareRecover(t *testing.T) {
	n := newBareNode(t)
	ctx := context.Background()
	if _, err := n.c.Launch(ctx, containerizer.Spec{ID: "lives", Command: []string{"sleep", "60"}, GPUs: allocator.Request{Count: 2}}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.c.Launch(ctx, containerizer.Spec{ID: "ends", Command: []string{"sh", "-c", "exit 5"}, GPUs: allocator.Request{Count: 1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.c.Wait(ctx, "ends"); err != nil {
		t.Fatal(err)
	}
	// A restart: a new allocator that lost everything, a new containerizer
	// over the same state.
	var err error
	if n.alloc, err = allocator.New(n.inv); err != nil {
		t.Fatal(err)
	}
	old := n.c
	n.c = n.open(t)
	got, err := n.c.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var states []string
	for _, c := range got {
		states = append(states, fmt.Sprintf("%s:%s:%d", c.ID, c.State, len(c.GPUs)))
	}
	if want := []string{"ends:exited:1", "lives:running:2"}; !slices.Equal(states, want) {
		t.Fatalf("recovered %v, want %v", states, want)
	}
	if al, err := n.alloc.Allocation("lives"); err != nil || len(al.Devices) != 2 {
		t.Fatalf("allocation after recovery %+v, %v", al, err)
	}
	if st, err := n.c.Wait(ctx, "ends"); err != nil || st.Code != 5 {
		t.Fatalf("wait for the adopted exited container: %+v, %v; want exit 5", st, err)
	}
	for _, id := range []string{"ends", "lives"} {
		if err := n.c.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
		n.nothingLeft(t, id)
	}
	// The old instance's reaper sees its child go.
	first := old.rt.known("lives")
	if first == nil {
		t.Fatal("the first instance forgot its container")
	}
	select {
	case <-first.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the first instance never saw its container end")
	}
}

// parentedRecorder is a recorder that tells its cgroup parent.
type parentedRecorder struct {
	*recorder
	parent string
}

func (p *parentedRecorder) Parent() string { return p.parent }

func (p *parentedRecorder) RemoveParent() error { return p.record("remove-parent") }

// TestBareUnexplainedCgroups: Recover removes a cgroup no record explains
// only when the isolator's parent is the state directory's own, and then
// removes the parent (the isolator leaves one in use); an isolator on any
// other parent, or one that does not tell it, keeps every cgroup that is
// not its containers'.
func TestBareUnexplainedCgroups(t *testing.T) {
	tests := []struct {
		name        string
		parent      func(state string) string // nil: an isolator that does not tell
		wantRemoved bool
	}{
		{"own parent", CgroupParent, true},
		{"shared parent", func(string) string { return cgroups.DefaultParent }, false},
		{"another state directory's", func(string) string { return CgroupParent("/elsewhere") }, false},
		{"parent not told", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newBareNode(t)
			rec := newRecorder()
			var iso Isolator = rec
			if tt.parent != nil {
				iso = &parentedRecorder{recorder: rec, parent: tt.parent(n.state)}
			}
			rec.rules["stranger"] = nil // someone else's container, or a lost one
			c, err := New(Config{Allocator: n.alloc, Inventory: n.inv, Isolator: iso, StateDir: n.state})
			if err != nil {
				t.Fatal(err)
			}
			c.rt.dev, c.rt.bare = n.dev, true
			if _, err := c.Recover(context.Background()); err != nil {
				t.Fatal(err)
			}
			removed := slices.Contains(rec.calls, "destroy stranger")
			if removed != tt.wantRemoved {
				t.Errorf("stranger's cgroup removed: %v, want %v (calls %v)", removed, tt.wantRemoved, rec.calls)
			}
			if parentRemoved := slices.Contains(rec.calls, "remove-parent"); parentRemoved != tt.wantRemoved {
				t.Errorf("parent removal asked: %v, want %v", parentRemoved, tt.wantRemoved)
			}
		})
	}
}

// TestNewOwnParent: New moves an isolator on the package default parent to
// the state directory's own, and leaves one on a parent the caller chose.
func TestNewOwnParent(t *testing.T) {
	n := newBareNode(t)
	tests := []struct {
		name string
		opts []cgroups.Option
		want string
	}{
		{"default parent", nil, CgroupParent(n.state)},
		{"default parent named", []cgroups.Option{cgroups.WithParent(cgroups.DefaultParent)}, CgroupParent(n.state)},
		{"chosen parent", []cgroups.Option{cgroups.WithParent("agent/gpus")}, "agent/gpus"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			iso, err := cgroups.New(tt.opts...)
			if errors.Is(err, isolator.ErrNotSupported) {
				t.Skipf("no cgroup hierarchy here: %v", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			c, err := New(Config{Allocator: n.alloc, Inventory: n.inv, Isolator: iso, StateDir: n.state})
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Isolator().(*cgroups.Isolator).Parent(); got != tt.want {
				t.Errorf("the containerizer's cgroup parent = %q, want %q", got, tt.want)
			}
			if iso.Parent() != cgroups.DefaultParent && tt.want == CgroupParent(n.state) {
				t.Errorf("the caller's isolator was changed: parent %q", iso.Parent())
			}
		})
	}
}

// TestBareTempDir: a TempDir is named for its process; Clean leaves this
// process's and a live one's, removes a dead one's (with what it holds) once
// that process's containers are torn down, and Recover removes none.
func TestBareTempDir(t *testing.T) {
	n := newBareNode(t)
	ctx := context.Background()
	mine, err := n.c.TempDir()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(filepath.Base(mine), fmt.Sprintf(".tmp-%d.", os.Getpid())) || filepath.Dir(mine) != n.state {
		t.Fatalf("TempDir = %s, want .tmp-%d.* in %s", mine, os.Getpid(), n.state)
	}
	if err := node.ValidateOwner(filepath.Base(mine)); err == nil {
		t.Fatalf("%s could be a container's id", filepath.Base(mine))
	}
	deadProc := exec.Command("/bin/true")
	if err := deadProc.Run(); err != nil {
		t.Skip(err)
	}
	dead := filepath.Join(n.state, fmt.Sprintf(".tmp-%d.1-abc", deadProc.Process.Pid))
	parent, err := allocator.ProcessHolder("", os.Getppid()) // a live process
	if err != nil {
		t.Skip(err)
	}
	live := filepath.Join(n.state, fmt.Sprintf(".tmp-%d.%d-abc", parent.Pid, parent.Start))
	for _, d := range []string{filepath.Join(dead, "rootfs", "gpuiso-unpack-1"), live} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := n.c.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dead); err != nil {
		t.Fatalf("Recover removed a dead process's directory: %v", err)
	}
	if _, err := n.c.Clean(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dead); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Clean left a dead process's directory: %v", err)
	}
	for _, d := range []string{mine, live} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("Clean removed %s: %v", d, err)
		}
	}
}

// TestBareUnreadableRecord: records are not synced, so a machine crash can
// leave one empty. Recover tears down a container whose record is
// unreadable when its cgroup holds no process, and leaves one alone (with
// an error) when its cgroup still does.
func TestBareUnreadableRecord(t *testing.T) {
	n := newBareNode(t)
	ctx := context.Background()
	for _, id := range []string{"gone", "running"} {
		if _, err := n.c.Launch(ctx, containerizer.Spec{ID: id, Command: []string{"sleep", "60"}, GPUs: allocator.Request{Count: 1}}); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(n.state, id, "container.json"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	n.iso.mu.Lock()
	delete(n.iso.procs, "gone") // its cgroup is empty, as after a reboot
	n.iso.mu.Unlock()
	old := n.c
	defer old.Destroy(ctx, "running")
	n.c = n.open(t)
	got, err := n.c.Recover(ctx)
	if err == nil || !strings.Contains(err.Error(), "container.json") {
		t.Errorf("Recover = %v, want the unreadable record of the running container named", err)
	}
	if len(got) != 0 {
		t.Errorf("recovered %+v", got)
	}
	n.nothingLeft(t, "gone")
	if _, err := n.alloc.Allocation("running"); err != nil {
		t.Errorf("the running container lost its GPUs: %v", err)
	}
}

// TestRecordReplaced: a record is replaced whole, leaving no temporary file.
func TestRecordReplaced(t *testing.T) {
	r := &runner{cfg: Config{StateDir: t.TempDir()}}
	p := filepath.Join(r.dir("a"), recordFile)
	if err := os.Mkdir(r.dir("a"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, v := range []ctrRecord{{ID: "a", Pid: 1, Start: 1}, {ID: "a", Pid: 2, Start: 2}} {
		if err := r.writeRecord(v); err != nil {
			t.Fatal(err)
		}
		got, err := r.readRecord("a")
		if err != nil || got.ID != v.ID || got.Pid != v.Pid {
			t.Fatalf("read %+v, %v after writing %+v", got, err, v)
		}
	}
	if entries, _ := os.ReadDir(filepath.Dir(p)); len(entries) != 1 {
		t.Fatalf("left %d files, want the record alone", len(entries))
	}
}
