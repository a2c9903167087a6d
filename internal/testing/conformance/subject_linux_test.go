package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/containerizer/chain"
	"github.com/gpuiso/gpuiso/containerizer/native"
	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/volume"
)

// simulated is the node every instance runs on: 8 GPUs.
const (
	simulated = "dgx1-volta"
	nodeGPUs  = 8
)

// subject is one runtime as its users run it.
type subject struct {
	name string
	// adopts tells that a start adopts the containers a killed run left
	// running (and waits for them) instead of removing them.
	adopts bool
	// batch is how many runs of one instance go at once (1 where one
	// process at a time owns a state directory).
	batch int
	// every is the sampling period.
	every time.Duration
	// setup checks what the subject needs of the host and returns how to
	// make an instance in a directory.
	setup func(t *testing.T, bins binaries) func(t *testing.T, dir string) instance
}

// binaries are the programs and the probe, built once.
type binaries struct {
	gpurun, dockerrun, agent, probe string
}

// instance is one state directory of a subject.
type instance interface {
	// run is a run with gpus GPUs whose container runs the probe with
	// args.
	run(ctx context.Context, gpus int, args ...string) *exec.Cmd
	// recovery is a start that only recovers (and, for a subject that
	// adopts, waits for what it adopted).
	recovery(ctx context.Context) *exec.Cmd
	// idOf names the container of the run with process pid, and tells
	// whether line (of its stderr) says that its container runs.
	idOf(pid int, line string) (id string, started bool)
	// live lists the containers of the instance whose first process runs.
	live() ([]Container, error)
	// records lists the containers the instance's state names now.
	records() []string
	// hold is the probe's arguments for a container that runs until letGo
	// with the same key.
	hold(key string) []string
	letGo(ctx context.Context, key string) error
	// leftovers lists what is left of the runs of ids (and of any run of
	// the instance's state), but the cgroups of skip.
	leftovers(ids []string, skip []string) []string
	// parents are the cgroup parents of its containers (absolute).
	parents() []string
	// allocDir is the directory of its allocator's state.
	allocDir() string
	// teardown removes whatever a failed case left.
	teardown()
}

// base is what every instance has: a directory holding its state, its
// TMPDIR and the files that let held containers go.
type base struct {
	t     *testing.T
	dir   string
	state string
	tmp   string
}

func newBase(t *testing.T, dir string) base {
	b := base{t: t, dir: dir, state: filepath.Join(dir, "state"), tmp: filepath.Join(dir, "tmp")}
	for _, d := range []string{b.tmp, filepath.Join(dir, "release")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

func (b base) command(ctx context.Context, exe string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = append(os.Environ(), "TMPDIR="+b.tmp)
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// hold and letGo of containers on the host's file system: the probe waits
// for a file of the instance's directory.
func (b base) hold(key string) []string {
	return []string{"wait", filepath.Join(b.dir, "release", key)}
}

func (b base) letGo(_ context.Context, key string) error {
	return os.WriteFile(filepath.Join(b.dir, "release", key), nil, 0o644)
}

// common lists what is left of the runs of ids that every subject could
// leave: volume users, mounts under the instance's directory, entries of
// its TMPDIR, owners in the allocator's state in allocDir.
func (b base) common(ids []string, allocDir string) []string {
	var left []string
	if m, err := volume.New(); err == nil {
		vols, _ := m.List(context.Background())
		for _, v := range vols {
			for _, u := range v.Users {
				if slices.Contains(ids, u) {
					left = append(left, fmt.Sprintf("user %s of volume %s", u, v.Version))
				}
			}
		}
	}
	left = append(left, mountsUnder(b.dir)...)
	for _, e := range entries(b.tmp) {
		left = append(left, "TMPDIR entry "+e)
	}
	own, err := owners(allocDir)
	if err != nil {
		left = append(left, err.Error())
	}
	for _, o := range own {
		left = append(left, "allocation of "+o)
	}
	// The MPS daemons of memory shares (package isolator/mps): their
	// directories under the state directory, and any MPS process whose
	// mounts come from the instance's directory.
	for _, e := range entries(filepath.Join(b.state, "mps"), ".lock") {
		left = append(left, "MPS daemon directory mps/"+e)
	}
	left = append(left, mpsProcesses(b.dir)...)
	return left
}

// mpsProcesses lists the live MPS processes (control daemons, servers)
// whose mounts come from under dir.
func mpsProcesses(dir string) []string {
	var left []string
	for _, e := range entries("/proc") {
		comm, err := os.ReadFile(filepath.Join("/proc", e, "comm"))
		if err != nil || !strings.HasPrefix(string(comm), "nvidia-cuda-mps") {
			continue
		}
		if mi, err := os.ReadFile(filepath.Join("/proc", e, "mountinfo")); err == nil && strings.Contains(string(mi), dir+"/") {
			left = append(left, "MPS process "+e+" ("+strings.TrimSpace(string(comm))+")")
		}
	}
	return left
}

// parentLeft lists the children of a cgroup parent but those of skip: the
// parent goes with its last container.
func parentLeft(parent string, skip []string) []string {
	var left []string
	list, err := os.ReadDir(parent)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	for _, e := range list {
		if e.IsDir() && !slices.Contains(skip, filepath.Join(parent, e.Name())) {
			left = append(left, "cgroup "+filepath.Join(parent, e.Name()))
		}
	}
	if len(left) == 0 && len(skip) == 0 {
		left = append(left, "cgroup parent "+parent+" without containers")
	}
	return left
}

// nativeSubject: examples/gpurun.
func nativeSubject() subject {
	return subject{name: "native", batch: 3, every: 5 * time.Millisecond,
		setup: func(t *testing.T, bins binaries) func(*testing.T, string) instance {
			version, _ := testenv.RequireDeviceCgroup(t)
			return func(t *testing.T, dir string) instance {
				return &nativeInstance{base: newBase(t, dir), bins: bins, version: version}
			}
		}}
}

type nativeInstance struct {
	base
	bins    binaries
	version string // the device cgroup's, as gpurun's --cgroup names it
	mu      sync.Mutex
	cmds    []*exec.Cmd
}

func (n *nativeInstance) gpurun(ctx context.Context, args ...string) *exec.Cmd {
	all := append([]string{"--simulate", simulated, "--state-dir", n.state, "--cgroup", n.version}, args...)
	cmd := n.command(ctx, n.bins.gpurun, all...)
	n.mu.Lock()
	n.cmds = append(n.cmds, cmd)
	n.mu.Unlock()
	return cmd
}

func (n *nativeInstance) run(ctx context.Context, gpus int, args ...string) *exec.Cmd {
	return n.gpurun(ctx, append([]string{"--gpus", strconv.Itoa(gpus), "--", n.bins.probe}, args...)...)
}

func (n *nativeInstance) recovery(ctx context.Context) *exec.Cmd {
	return n.gpurun(ctx, "--quiet", "--gpus", "0", "--", n.bins.probe, "exit", "0")
}

func (n *nativeInstance) idOf(pid int, line string) (string, bool) {
	return "gpurun-" + strconv.Itoa(pid), strings.HasPrefix(line, "gpurun: GPUs")
}

func (n *nativeInstance) records() []string {
	var ids []string
	for _, e := range entries(filepath.Join(n.state, "native")) {
		if !strings.HasPrefix(e, ".") {
			ids = append(ids, e)
		}
	}
	return ids
}

func (n *nativeInstance) live() ([]Container, error) {
	var out []Container
	for _, id := range n.records() {
		b, err := os.ReadFile(filepath.Join(n.state, "native", id, "container.json"))
		if err != nil {
			continue // being made or removed
		}
		var rec struct {
			Pid     int    `json:"pid"`
			Start   uint64 `json:"start"`
			Process *struct {
				Pid   int
				Start uint64
			} `json:"process"`
		}
		if json.Unmarshal(b, &rec) != nil {
			continue
		}
		if rec.Process != nil {
			rec.Pid, rec.Start = rec.Process.Pid, rec.Process.Start
		}
		if rec.Pid <= 0 {
			continue
		}
		if p := (Proc{rec.Pid, rec.Start}); p.Alive() {
			out = append(out, Container{ID: id, Proc: p})
		}
	}
	return out, nil
}

func (n *nativeInstance) allocDir() string { return n.state }

func (n *nativeInstance) parents() []string {
	return []string{filepath.Join(hierarchy("devices"), native.CgroupParent(filepath.Join(n.state, "native")))}
}

func (n *nativeInstance) leftovers(ids []string, skip []string) []string {
	left := n.common(ids, n.allocDir())
	for _, e := range entries(filepath.Join(n.state, "native")) {
		left = append(left, "state entry native/"+e)
	}
	for _, e := range entries(filepath.Join(n.state, "tmp")) {
		left = append(left, "state entry tmp/"+e)
	}
	for _, e := range entries(n.state) {
		if strings.HasSuffix(e, ".tmp") {
			left = append(left, "state entry "+e)
		}
	}
	for _, p := range n.parents() {
		left = append(left, parentLeft(p, skip)...)
	}
	return left
}

func (n *nativeInstance) teardown() {
	n.mu.Lock()
	cmds := slices.Clone(n.cmds)
	n.mu.Unlock()
	killAll(cmds)
	live, _ := n.live()
	for _, c := range live {
		if p, err := os.FindProcess(c.Proc.Pid); err == nil && c.Proc.Alive() {
			p.Kill()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n.recovery(ctx).Run()
	var cgs []string
	for _, p := range n.parents() {
		for _, e := range entries(p) {
			cgs = append(cgs, filepath.Join(p, e))
		}
		cgs = append(cgs, p)
	}
	n.scrub(cgs)
}

// scrub removes, once a failed case's teardown has run the instance's own
// recovery, what that left: mounts under the instance's directory (so
// that it can be removed) and those of cgroups that are empty. It logs
// each.
func (b base) scrub(cgroups []string) {
	points := mountPoints(b.dir)
	slices.SortFunc(points, func(x, y string) int { return len(y) - len(x) }) // deepest first
	for _, p := range points {
		if err := linux.DetachUnmount(p); err == nil {
			b.t.Logf("teardown: unmounted %s", p)
		}
	}
	slices.SortFunc(cgroups, func(x, y string) int { return len(y) - len(x) })
	for _, cg := range cgroups {
		if fi, err := os.Stat(cg); err == nil && fi.IsDir() && os.Remove(cg) == nil {
			b.t.Logf("teardown: removed cgroup %s", cg)
		}
	}
}

// killAll kills the runs that still go (their waiters reap them).
func killAll(cmds []*exec.Cmd) {
	for _, c := range cmds {
		if c.Process != nil {
			c.Process.Kill() // an error for one that has ended
		}
	}
}

// chainSubject: examples/agent, the GPU isolator in a chain.
func chainSubject() subject {
	return subject{name: "chain", adopts: true, batch: 1, every: 5 * time.Millisecond,
		setup: func(t *testing.T, bins binaries) func(*testing.T, string) instance {
			testenv.RequireDeviceCgroup(t)
			return func(t *testing.T, dir string) instance {
				return &chainInstance{base: newBase(t, dir), bins: bins}
			}
		}}
}

type chainInstance struct {
	base
	bins binaries
	mu   sync.Mutex
	cmds []*exec.Cmd
}

func (c *chainInstance) agent(ctx context.Context, args ...string) *exec.Cmd {
	all := append([]string{"--simulate", simulated, "--state-dir", c.state}, args...)
	cmd := c.command(ctx, c.bins.agent, all...)
	c.mu.Lock()
	c.cmds = append(c.cmds, cmd)
	c.mu.Unlock()
	return cmd
}

func (c *chainInstance) run(ctx context.Context, gpus int, args ...string) *exec.Cmd {
	return c.agent(ctx, append([]string{"--gpus", strconv.Itoa(gpus), "--", c.bins.probe}, args...)...)
}

func (c *chainInstance) recovery(ctx context.Context) *exec.Cmd { return c.agent(ctx) }

func (c *chainInstance) idOf(_ int, line string) (string, bool) {
	rest, ok := strings.CutPrefix(line, "agent: container ")
	if !ok {
		return "", false
	}
	id, _, _ := strings.Cut(rest, ":")
	return id, true
}

func (c *chainInstance) records() []string {
	var ids []string
	for _, e := range entries(filepath.Join(c.state, "containers")) {
		if id, ok := strings.CutSuffix(e, ".json"); ok && !strings.HasPrefix(id, ".") {
			ids = append(ids, id)
		}
	}
	return ids
}

func (c *chainInstance) live() ([]Container, error) {
	var out []Container
	for _, id := range c.records() {
		b, err := os.ReadFile(filepath.Join(c.state, "containers", id+".json"))
		if err != nil {
			continue
		}
		// The agent's record: an entry of its record store, the
		// container's init in its data (a record of version 1: at the
		// top).
		type proc struct {
			Pid   int
			Start uint64
		}
		var rec struct {
			Process *proc `json:"process"`
			Data    struct {
				Process *proc `json:"process"`
			} `json:"data"`
		}
		if json.Unmarshal(b, &rec) != nil {
			continue
		}
		if rec.Process == nil {
			rec.Process = rec.Data.Process
		}
		if rec.Process == nil || rec.Process.Pid <= 0 {
			continue
		}
		if p := (Proc{rec.Process.Pid, rec.Process.Start}); p.Alive() {
			out = append(out, Container{ID: id, Proc: p})
		}
	}
	return out, nil
}

// agentParent is the agent's own CPU and memory cgroup parent, shared by
// every agent.
const agentParent = "gpuiso-agent"

func (c *chainInstance) allocDir() string { return filepath.Join(c.state, "alloc") }

// parents are the GPU isolator's own device cgroup parent, then the
// agent's CPU and memory parents (cgroup2: its one parent).
func (c *chainInstance) parents() []string {
	own := filepath.Join(hierarchy("devices"), chain.CgroupParent(filepath.Join(c.state, "gpu")))
	if testenv.CgroupV2Only() {
		return []string{own, filepath.Join(cgroupRoot, agentParent)}
	}
	return []string{own, filepath.Join(cgroupRoot, "cpu", agentParent), filepath.Join(cgroupRoot, "memory", agentParent)}
}

func (c *chainInstance) leftovers(ids []string, skip []string) []string {
	left := c.common(ids, c.allocDir())
	for _, e := range entries(filepath.Join(c.state, "containers")) {
		left = append(left, "record containers/"+e)
	}
	for _, e := range entries(filepath.Join(c.state, "gpu"), ".lock") {
		left = append(left, "GPU isolator record gpu/"+e)
	}
	ps := c.parents()
	left = append(left, parentLeft(ps[0], skip)...)
	for _, p := range ps[1:] { // shared with other agents: only ours
		for _, id := range ids {
			if _, err := os.Stat(filepath.Join(p, id)); !errors.Is(err, os.ErrNotExist) {
				left = append(left, "cgroup "+filepath.Join(p, id))
			}
		}
	}
	return left
}

func (c *chainInstance) teardown() {
	c.mu.Lock()
	cmds := slices.Clone(c.cmds)
	c.mu.Unlock()
	killAll(cmds)
	live, _ := c.live()
	for _, ct := range live {
		if p, err := os.FindProcess(ct.Proc.Pid); err == nil && ct.Proc.Alive() {
			p.Kill()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c.recovery(ctx).Run()
	var cgs []string
	ps := c.parents()
	for _, id := range c.records() {
		for _, p := range ps {
			cgs = append(cgs, filepath.Join(p, id))
		}
	}
	c.scrub(append(cgs, ps[0]))
}
