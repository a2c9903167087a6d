package conformance

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/native"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// The kills inside Update: the test binary, run with updateChildEnv, is a
// program over one Lifecycle and the native runtime (the one runtime that
// updates live) that launches two containers and grows or shrinks one of
// them; it SIGKILLs itself at the point its configuration names, counted
// over every step the update logs and every device rule it applies (before
// and after). The test then recovers in its own process, a new one over
// the same state, and checks each container against the allocator.

// updateChildEnv makes the test binary an updating program; its value is
// the JSON of an updateChild.
const updateChildEnv = "GPUISO_CONFORMANCE_UPDATE_CHILD"

// updateChild is what the updating program does.
type updateChild struct {
	Host, Alloc, State string
	Version            cgroups.Version
	Mount              string
	// From and To are the GPUs of the container updated, before and
	// after; a neighbour holds two GPUs throughout.
	From, To int
	// KillAt is the point (1-based) at which the program kills itself;
	// 0: none (it prints the points it passed and exits).
	KillAt int
}

// Container ids of the updating program.
const (
	idUpdated   = "updated"
	idNeighbour = "neighbour"
)

// pointsLine starts the line on which a program not killed lists the
// points it passed.
const pointsLine = "points: "

// runUpdateChild is the updating program; it returns its exit code.
func runUpdateChild() int {
	var cfg updateChild
	if err := json.Unmarshal([]byte(os.Getenv(updateChildEnv)), &cfg); err != nil {
		fmt.Println("update child:", err)
		return 1
	}
	k := &selfKill{at: cfg.KillAt}
	inv, alloc, iso, err := openInstance(cfg)
	if err != nil {
		fmt.Println("update child:", err)
		return 1
	}
	rt, err := native.NewRuntime(native.Config{Inventory: inv, Isolator: killingIsolator{iso, k}, StateDir: cfg.State, Logger: slog.New(k)})
	if err != nil {
		fmt.Println("update child:", err)
		return 1
	}
	l, err := containerizer.NewLifecycle(containerizer.LifecycleConfig{Runtime: rt, Allocator: alloc})
	if err != nil {
		fmt.Println("update child:", err)
		return 1
	}
	ctx := context.Background()
	for id, n := range map[string]int{idNeighbour: 2, idUpdated: cfg.From} {
		if _, err := l.Launch(ctx, containerizer.Spec{ID: id, Command: []string{"sleep", "1000"}, GPUs: allocator.Request{Count: n}}); err != nil {
			fmt.Println("update child:", err)
			return 1
		}
	}
	k.arm()
	if _, err := l.Update(ctx, idUpdated, cfg.To); err != nil {
		fmt.Println("update child:", err)
		return 1
	}
	fmt.Println(pointsLine + strings.Join(k.seen(), "|"))
	return 0
}

// openInstance opens the simulated node, the allocator and the device
// isolator (on the state directory's own cgroup parent) of cfg.
func openInstance(cfg updateChild) (*node.Inventory, *allocator.Allocator, *cgroups.Isolator, error) {
	sim, err := simnode.New(simulated)
	if err != nil {
		return nil, nil, nil, err
	}
	host := &simnode.Host{Root: cfg.Host, DevRoot: filepath.Join(cfg.Host, "dev"), ProcRoot: filepath.Join(cfg.Host, "proc"), SysRoot: filepath.Join(cfg.Host, "sys")}
	inv, err := nvmlnode.Discover(context.Background(), sim.DiscoverOptions(host)...)
	if err != nil {
		return nil, nil, nil, err
	}
	alloc, err := allocator.New(inv, allocator.WithStateDir(cfg.Alloc))
	if err != nil {
		return nil, nil, nil, err
	}
	iso, err := cgroups.New(cgroups.WithVersion(cfg.Version), cgroups.WithMount(cfg.Mount))
	if err != nil {
		return nil, nil, nil, err
	}
	if iso, err = iso.InParent(native.CgroupParent(cfg.State)); err != nil {
		return nil, nil, nil, err
	}
	return inv, alloc, iso, nil
}

// selfKill SIGKILLs this process at its at-th point, once armed: each
// record with a "step" that the runtime logs, and each device rule
// application (killingIsolator).
type selfKill struct {
	at     int
	mu     sync.Mutex
	armed  bool
	points []string
}

func (k *selfKill) arm() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.armed = true
}

func (k *selfKill) reach(point string) {
	k.mu.Lock()
	if !k.armed {
		k.mu.Unlock()
		return
	}
	k.points = append(k.points, point)
	n := len(k.points)
	k.mu.Unlock()
	if n == k.at {
		if p, err := os.FindProcess(os.Getpid()); err == nil {
			p.Kill()
		}
		select {} // until the signal lands
	}
}

func (k *selfKill) seen() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.points)
}

func (k *selfKill) Enabled(context.Context, slog.Level) bool { return true }
func (k *selfKill) WithAttrs([]slog.Attr) slog.Handler       { return k }
func (k *selfKill) WithGroup(string) slog.Handler            { return k }

func (k *selfKill) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "step" {
			k.reach(a.Value.String())
		}
		return true
	})
	return nil
}

// killingIsolator is the device isolator with a kill point before and
// after each application of rules.
type killingIsolator struct {
	*cgroups.Isolator
	k *selfKill
}

func (i killingIsolator) Apply(ctx context.Context, id string, rules []isolator.Rule) error {
	i.k.reach("before apply")
	err := i.Isolator.Apply(ctx, id, rules)
	i.k.reach("after apply")
	return err
}

// TestUpdateKillPoints: the updating program killed at every point of a
// grow and of a shrink, on each cgroup version; after each kill, a
// recovery in a new process adopts both containers, each allowed exactly
// the GPUs the allocator holds for it (a read-write open of every GPU's
// node from inside its device cgroup: ENXIO where allowed, EPERM where
// denied), with exactly those GPUs' nodes in its /dev and in its record,
// and no GPU allowed to both; Destroy of both leaves nothing.
func TestUpdateKillPoints(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireNVIDIALibraries(t)
	probe := testenv.BuildProbe(t)
	for _, v := range []cgroups.Version{cgroups.V1, cgroups.V2} {
		t.Run(v.String(), func(t *testing.T) {
			var mount string
			if v == cgroups.V1 {
				mount = testenv.RequireCgroupV1Devices(t)
			} else {
				mount = testenv.RequireCgroupV2(t)
			}
			_, host, inv := testenv.SimulatedNode(t, simulated)
			for _, tc := range []struct {
				name     string
				from, to int
			}{
				{"grow", 1, 3},
				{"shrink", 3, 1},
			} {
				base := updateChild{Host: host.Root, Version: v, Mount: mount, From: tc.from, To: tc.to}
				points := updateKilled(t, base, inv, probe, 0)
				if len(points) == 0 {
					t.Fatalf("%s: an update passes no kill point", tc.name)
				}
				for at := 1; at <= len(points); at++ {
					t.Run(fmt.Sprintf("%s/killed at %s (%d)", tc.name, points[at-1], at), func(t *testing.T) {
						updateKilled(t, base, inv, probe, at)
					})
				}
			}
		})
	}
}

// updateKilled runs the updating program of cfg killed at point at (none:
// 0) in directories of t, recovers and checks; it returns the points the
// program passed (at 0).
func updateKilled(t *testing.T, cfg updateChild, inv *node.Inventory, probe string, at int) []string {
	t.Helper()
	dir := t.TempDir()
	cfg.Alloc, cfg.State, cfg.KillAt = filepath.Join(dir, "alloc"), filepath.Join(dir, "state"), at
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), updateChildEnv+"="+string(b))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	var points []string
	if at == 0 {
		if err != nil {
			t.Fatalf("the updating program: %v\n%s", err, out.String())
		}
		for l := range strings.Lines(out.String()) {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(l), pointsLine); ok {
				points = strings.Split(rest, "|")
			}
		}
	} else if ee := (*exec.ExitError)(nil); !errors.As(err, &ee) || ee.ExitCode() != -1 {
		t.Fatalf("the updating program was not killed at point %d: %v\n%s", at, err, out.String())
	}

	// A new process: this one.
	_, alloc, iso, err := openInstance(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := native.NewRuntime(native.Config{Inventory: inv, Isolator: iso, StateDir: cfg.State})
	if err != nil {
		t.Fatal(err)
	}
	l, err := containerizer.NewLifecycle(containerizer.LifecycleConfig{Runtime: rt, Allocator: alloc})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t.Cleanup(func() {
		// Whatever a failure left: what Destroy of each id removes (a
		// container not adopted too), then mounts and empty cgroups.
		for _, id := range []string{idUpdated, idNeighbour} {
			l.Destroy(context.Background(), id)
		}
		base{t: t, dir: dir}.scrub([]string{iso.Path(idUpdated), iso.Path(idNeighbour), filepath.Dir(iso.Path(idUpdated))})
	})
	cs, err := l.Recover(ctx)
	if err != nil {
		t.Errorf("recover: %v", err)
	}
	var ids []string
	procs := map[string]Proc{}
	for _, c := range cs {
		ids = append(ids, c.ID)
		procs[c.ID] = ProcOf(c.Pid)
	}
	if !slices.Equal(ids, []string{idNeighbour, idUpdated}) {
		t.Fatalf("adopted %v, want %s and %s", ids, idNeighbour, idUpdated)
	}
	allowedTo := map[string][]int{}
	for _, c := range cs {
		al, err := alloc.Allocation(c.ID)
		if err != nil {
			t.Fatalf("%s: %v", c.ID, err)
		}
		var held []int
		for _, d := range al.Devices {
			held = append(held, int(d.Minor))
		}
		slices.Sort(held)
		if c.ID == idUpdated && len(held) != cfg.From && len(held) != cfg.To {
			t.Errorf("%s holds GPUs %v, want %d or %d of them", c.ID, held, cfg.From, cfg.To)
		}
		allowedTo[c.ID] = openGPUs(t, iso.Path(c.ID), inv, cfg.Host, probe)
		if !slices.Equal(allowedTo[c.ID], held) {
			t.Errorf("%s: its device cgroup allows GPUs %v, the allocator holds %v for it", c.ID, allowedTo[c.ID], held)
		}
		if got := devNodes(filepath.Join(cfg.State, c.ID, "dev")); !slices.Equal(got, held) {
			t.Errorf("%s: its /dev holds GPUs %v, the allocator holds %v for it", c.ID, got, held)
		}
		var recorded []int
		for _, d := range c.GPUs {
			recorded = append(recorded, int(d.Minor))
		}
		slices.Sort(recorded)
		if !slices.Equal(recorded, held) {
			t.Errorf("%s: adopted with GPUs %v, the allocator holds %v for it", c.ID, recorded, held)
		}
	}
	for _, m := range allowedTo[idUpdated] {
		if slices.Contains(allowedTo[idNeighbour], m) {
			t.Errorf("GPU %d allowed to both containers", m)
		}
	}
	for _, id := range ids {
		if err := l.Destroy(ctx, id); err != nil {
			t.Fatalf("destroy %s: %v", id, err)
		}
	}
	var left []string
	for id, p := range procs {
		if p.Alive() {
			left = append(left, fmt.Sprintf("process %d of %s", p.Pid, id))
		}
		if _, err := os.Stat(iso.Path(id)); !errors.Is(err, os.ErrNotExist) {
			left = append(left, "cgroup "+iso.Path(id))
		}
	}
	if _, err := os.Stat(filepath.Dir(iso.Path(idUpdated))); !errors.Is(err, os.ErrNotExist) {
		left = append(left, "cgroup parent "+filepath.Dir(iso.Path(idUpdated)))
	}
	for _, al := range alloc.Allocations() {
		left = append(left, "allocation of "+al.Owner)
	}
	for _, e := range entries(cfg.State) {
		left = append(left, "state entry "+e)
	}
	left = append(left, mountsUnder(dir)...)
	for _, x := range left {
		t.Errorf("after destroy: left: %s", x)
	}
	return points
}

// openGPUs opens every GPU's node (read-write) from a process in the
// cgroup at cgroup and returns the minors it may open: ENXIO (no driver
// answers the simulated node) where the cgroup allows it, EPERM where it
// denies it.
func openGPUs(t *testing.T, cgroup string, inv *node.Inventory, hostRoot, probe string) []int {
	t.Helper()
	gate := filepath.Join(t.TempDir(), "go")
	args := []string{"do", "wait", gate, "--", "open"}
	byPath := map[string]int{}
	for _, d := range inv.Devices {
		p := filepath.Join(hostRoot, "dev", "nvidia"+strconv.Itoa(int(d.Node.Minor)))
		args = append(args, p)
		byPath[p] = int(d.Node.Minor)
	}
	cmd := exec.Command(probe, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	if err := os.WriteFile(filepath.Join(cgroup, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
		t.Fatalf("move the probe into %s: %v", cgroup, err)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("probe: %v\n%s", err, out.String())
	}
	var allowed []int
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		path, result, _ := strings.Cut(sc.Text(), " ")
		m, ok := byPath[path]
		switch {
		case !ok:
		case result == "ENXIO":
			allowed = append(allowed, m)
		case result != "EPERM":
			t.Errorf("open %s in %s: %s, want ENXIO (allowed) or EPERM (denied)", path, cgroup, result)
		}
	}
	slices.Sort(allowed)
	return allowed
}

// devNodes lists the minors of the GPU nodes in a container's /dev.
func devNodes(dir string) []int {
	var out []int
	for _, e := range entries(dir) {
		if n, err := strconv.Atoi(strings.TrimPrefix(e, "nvidia")); err == nil && strings.HasPrefix(e, "nvidia") {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}
