package conformance

import (
	"context"
	"errors"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/containerizer/native"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
)

func TestMain(m *testing.M) {
	native.Init() // the init of the updating program's containers
	if os.Getenv(updateChildEnv) != "" {
		os.Exit(runUpdateChild())
	}
	testenv.Main(m)
}

// Environment variables that replay or widen the suite.
const (
	seedEnv  = "GPUISO_CONFORMANCE_SEED"  // the seed of the random kills
	killsEnv = "GPUISO_CONFORMANCE_KILLS" // runs killed per subject (default 10)
)

// caseTimeout bounds each case: a hang fails it rather than stalls the run.
const caseTimeout = 3 * time.Minute

// TestConformance runs every case against every subject (see doc.go).
func TestConformance(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireDeviceCgroup(t) // the sampler reads v1 device rules, or cgroup2's device programs
	testenv.RequireNVIDIALibraries(t)
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv(seedEnv); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", seedEnv, v, err)
		}
		seed = n
	}
	t.Logf("seed %d (replay with %s=%d)", seed, seedEnv, seed)
	bins := build(t)
	// The GPUs' minors by UUID: the allocator names GPUs by UUID, device
	// cgroups by number.
	_, _, inv := testenv.SimulatedNode(t, simulated)
	minorOf := map[string]int{}
	var major uint32
	for _, d := range inv.Devices {
		minorOf[d.UUID] = int(d.Node.Minor)
		major = d.Node.Major
	}
	cases := []struct {
		name string
		run  func(t *testing.T, e env)
	}{
		{"random kills", randomKills},
		{"side by side", sideBySide},
		{"neighbours", neighbours},
	}
	for _, s := range []subject{nativeSubject(), dockerSubject(), chainSubject()} {
		t.Run(s.name, func(t *testing.T) {
			// Subjects share nothing: their own state directories,
			// cgroup parents and Docker namespaces.
			t.Parallel()
			newInstance := s.setup(t, bins)
			h := fnv.New64a()
			h.Write([]byte(s.name))
			rng := rand.New(rand.NewPCG(seed, h.Sum64()))
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) { c.run(t, env{s, newInstance, rng, minorOf, major}) })
			}
		})
	}
}

// env is what a case runs with: the subject, how to make its instances,
// the subject's random source and the GPUs' minors by UUID.
type env struct {
	s           subject
	newInstance func(*testing.T, string) instance
	rng         *rand.Rand
	minorOf     map[string]int
	gpuMajor    uint32
}

func (e env) sampler(inst instance) *Sampler {
	return newSampler(inst, e.minorOf, e.gpuMajor, e.s.every)
}

// build compiles the three programs and the probe, or takes them prebuilt
// from testenv.ProgramDirEnv's directory (a test bundle's, which has no
// dockerrun: the docker subject needs a Docker daemon first).
func build(t *testing.T) binaries {
	t.Helper()
	if dir := os.Getenv(testenv.ProgramDirEnv); dir != "" {
		return binaries{
			gpurun:    testenv.Program(t, testenv.Root, "gpurun", "github.com/gpuiso/gpuiso/examples/gpurun"),
			agent:     testenv.Program(t, testenv.Root, "agent", "github.com/gpuiso/gpuiso/examples/agent"),
			dockerrun: filepath.Join(dir, "dockerrun"),
			probe:     testenv.BuildProbe(t),
		}
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skipf("no go command to build the programs: %v", err)
	}
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-buildvcs=false", "-o", dir+"/",
		"github.com/gpuiso/gpuiso/examples/gpurun", "github.com/gpuiso/gpuiso/examples/dockerrun", "github.com/gpuiso/gpuiso/examples/agent")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return binaries{
		gpurun:    filepath.Join(dir, "gpurun"),
		dockerrun: filepath.Join(dir, "dockerrun"),
		agent:     filepath.Join(dir, "agent"),
		probe:     testenv.BuildProbe(t),
	}
}

// newInstances makes n instances in directories of t, each torn down when
// t ends.
func newInstances(t *testing.T, newInstance func(*testing.T, string) instance, names ...string) []instance {
	base := t.TempDir()
	var out []instance
	for _, n := range names {
		inst := newInstance(t, filepath.Join(base, n))
		t.Cleanup(inst.teardown)
		out = append(out, inst)
	}
	return out
}

// recoverInstance runs a start of inst that only recovers, bounded, and
// fails t unless it exits 0 in time.
func recoverInstance(t *testing.T, ctx context.Context, inst instance) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	began := time.Now()
	out, err := inst.recovery(ctx).CombinedOutput()
	took := time.Since(began)
	if ctx.Err() != nil {
		t.Errorf("recovery did not return within a minute: %v\n%s", err, out)
	} else if err != nil {
		t.Errorf("recovery: %v\n%s", err, out)
	}
	return took
}

// checkLeft fails t for anything left of the runs of ids of inst (keep:
// containers that run on by design, skip: neighbours' cgroups).
func checkLeft(t *testing.T, what string, inst instance, smp *Sampler, ids []string, keep map[string]bool, skip []string) {
	t.Helper()
	ids = slices.Compact(slices.Sorted(slices.Values(ids)))
	ids = slices.DeleteFunc(ids, func(id string) bool { return id == "" }) // runs killed before they named theirs
	left := inst.leftovers(ids, skip)
	left = append(left, smp.Leftovers(keep)...)
	for _, l := range left {
		t.Errorf("%s: left: %s", what, l)
	}
}

// checkSamples fails t for every time the sampler saw a GPU allowed to two
// live containers, or one the allocator did not hold for the container, and
// unless it saw at least seen containers running.
func checkSamples(t *testing.T, what string, smp *Sampler, seen int) {
	t.Helper()
	for _, f := range smp.Finish() {
		t.Errorf("%s: %s", what, f)
	}
	if n := smp.SeenRunning(); n < seen {
		t.Errorf("%s: the sampler saw %d containers running, want at least %d", what, n, seen)
	}
}

// envInt reads a positive count from the environment, or def.
func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// randomKills: runs of a short command (3 GPUs, 0.3 s), a batch at a time,
// each SIGKILLed at a random delay up to 1.2 times as long as a run takes
// (a batch of runs of 1 GPU not killed measures it): in start-up, launch, while the
// container runs, in destroy, or after it ended. Two starts that only
// recover are killed in their turn. Then a start that only recovers, and a run of all the node's
// GPUs. No GPU was ever allowed to two live containers; nothing of any
// run is left.
func randomKills(t *testing.T, e env) {
	ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
	defer cancel()
	inst := newInstances(t, e.newInstance, "a")[0]
	kills := envInt(killsEnv, 10)
	smp := e.sampler(inst)
	smp.Start()
	// The window of the kill delays: a run's whole life, and a little
	// more, as long as it takes on this host with a batch going at once.
	var ids []string
	var window time.Duration
	var calibration []*process
	began := time.Now()
	for range e.s.batch {
		calibration = append(calibration, start(t, inst, inst.run(ctx, 1, "sleep", "0.3")))
	}
	for _, p := range calibration {
		p.wait(t, ctx, "a run not killed")
		window = max(window, time.Since(began)*6/5)
		ids = append(ids, p.ID())
	}
	// The rest takes a window for each batch of kills, half of one for
	// each of the two killed recoveries, and about one for the recovery
	// and the run of all GPUs after them: on a host slow enough that this
	// passes the case's timeout (an emulated VM on a loaded machine), the
	// deadline follows the window it measured rather than cut the case.
	if need := time.Since(began) + time.Duration((kills+e.s.batch-1)/e.s.batch+3)*window; need > caseTimeout {
		t.Logf("a run takes %v here: the case may take %v", window.Round(time.Millisecond), need.Round(time.Second))
		var longer context.CancelFunc
		ctx, longer = context.WithTimeout(context.Background(), need)
		defer longer()
	}
	phases := map[string]int{}
	for k := 0; k < kills; k += e.s.batch {
		var batch []*process
		var delays []time.Duration
		for range min(e.s.batch, kills-k) {
			delays = append(delays, time.Duration(e.rng.Int64N(int64(window))))
			batch = append(batch, start(t, inst, inst.run(ctx, 3, "sleep", "0.3")))
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		for i, p := range batch {
			wg.Go(func() {
				time.Sleep(delays[i])
				phase := p.kill()
				mu.Lock()
				phases[phase]++
				mu.Unlock()
			})
		}
		wg.Wait()
		for _, p := range batch {
			if id := p.ID(); id != "" {
				ids = append(ids, id)
			}
		}
		// What a kill left that names a container no line did.
		ids = append(ids, inst.records()...)
	}
	t.Logf("%d runs killed, %d at a time, at delays up to %v: %v; %d containers seen running", kills, e.s.batch, window.Round(time.Millisecond), phases, smp.SeenRunning())
	// Starts that only recover, killed in their recovery.
	for range 2 {
		p := start(t, inst, inst.recovery(ctx))
		time.Sleep(time.Duration(e.rng.Int64N(int64(window / 2))))
		p.kill()
	}
	took := recoverInstance(t, ctx, inst)
	t.Logf("the recovery after the kills took %v", took.Round(time.Millisecond))
	checkLeft(t, "after the kills and the next start", inst, smp, ids, nil, nil)
	all := start(t, inst, inst.run(ctx, nodeGPUs, "exit", "0"))
	all.wait(t, ctx, "a run of all GPUs after the kills")
	ids = append(ids, all.ID())
	checkSamples(t, "random kills", smp, e.s.batch)
	checkLeft(t, "after a run of all GPUs", inst, smp, ids, nil, nil)
}

// sideBySide: instances A and B (their own state directories, the same
// kind of node) each run a held container. A is killed, three more starts
// of A are killed at random points, and A is started again; B's container
// runs on, untouched, and exits 0 when let go. A subject
// that adopts keeps A's first container running (the restarted A adopts
// it); one that does not removes it.
func sideBySide(t *testing.T, e env) {
	ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
	defer cancel()
	insts := newInstances(t, e.newInstance, "a", "b")
	a, b := insts[0], insts[1]
	smpA, smpB := e.sampler(a), e.sampler(b)
	smpA.Start()
	smpB.Start()
	a1 := start(t, a, a.run(ctx, 2, a.hold("a1")...))
	b1 := start(t, b, b.run(ctx, 2, b.hold("b1")...))
	a1.waitStarted(t, ctx)
	b1.waitStarted(t, ctx)
	// A look while both certainly run (sampling alone may miss a short one).
	smpA.Sample()
	smpB.Sample()
	before := liveProc(t, b, b1.ID())
	firstA := liveProc(t, a, a1.ID())

	if phase := a1.kill(); phase != "run" {
		t.Fatalf("A's first run was killed in %s, want while its container ran", phase)
	}
	// Starts of A killed at random points of their own start-up and run
	// (of one GPU each: a subject that adopts holds them all, with A's
	// first, when A starts again).
	ids := []string{a1.ID()}
	for range 3 {
		p := start(t, a, a.run(ctx, 1, "sleep", "0.3"))
		time.Sleep(time.Duration(e.rng.Int64N(int64(400 * time.Millisecond))))
		p.kill()
		ids = append(ids, p.ID())
		ids = append(ids, a.records()...)
	}
	a2 := start(t, a, a.run(ctx, 2, a.hold("a2")...))
	a2.waitStarted(t, ctx)
	smpA.Sample()
	if !b1.running() {
		t.Errorf("B's run ended when A was started again: %v\n%s", b1.err, b1.output())
	}
	if got := liveProc(t, b, b1.ID()); got != before || !before.Alive() {
		t.Errorf("B's container %s: first process %v, now %v (alive %v)", b1.ID(), before, got, before.Alive())
	}
	if e.s.adopts {
		if !firstA.Alive() {
			t.Errorf("A's first container %s was not adopted: its process %d is gone", a1.ID(), firstA.Pid)
		}
		if err := a.letGo(ctx, "a1"); err != nil {
			t.Error(err)
		}
	} else {
		if firstA.Alive() {
			t.Errorf("A's first container %s runs on after A was started again (process %d)", a1.ID(), firstA.Pid)
		}
		// The start that removes what dead runs left is this one.
		if recs := a.records(); len(recs) != 1 || recs[0] != a2.ID() {
			t.Errorf("A's state names containers %v once A was started again, want only %s", recs, a2.ID())
		}
	}
	if err := a.letGo(ctx, "a2"); err != nil {
		t.Error(err)
	}
	a2.wait(t, ctx, "A's second run")
	checkLeft(t, "A after its last run", a, smpA, append(ids, a2.ID()), nil, nil)
	if !b1.running() {
		t.Errorf("B's run ended before it was let go: %v\n%s", b1.err, b1.output())
	}
	if err := b.letGo(ctx, "b1"); err != nil {
		t.Error(err)
	}
	b1.wait(t, ctx, "B's run")
	checkSamples(t, "A", smpA, 2)
	checkSamples(t, "B", smpB, 1)
	checkLeft(t, "B after its run", b, smpB, []string{b1.ID()}, nil, nil)
}

// liveProc returns the first process of inst's live container id.
func liveProc(t *testing.T, inst instance, id string) Proc {
	t.Helper()
	live, err := inst.live()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range live {
		if c.ID == id {
			return c.Proc
		}
	}
	t.Fatalf("container %s does not run (live: %v)", id, live)
	return Proc{}
}

// neighbour is something live that is not the instance's: it must outlive
// the instance's recovery.
type neighbour struct {
	name  string
	alive func() bool
}

// neighbourer is an instance with neighbours of its own kind (a Docker
// container that is not gpuiso's).
type neighbourer interface {
	neighbours(t *testing.T) []neighbour
}

// neighbours: live processes in a cgroup of gpuiso's shared default
// parent and in nested parents inside each of A's own cgroup parents,
// instance B's held container (and the subject's own kind of neighbour).
// A run of A is killed early in its start, another while its container
// runs; A's recovery returns within a bound, leaves nothing of the runs,
// and every neighbour runs on;
// B's container exits 0 when let go.
func neighbours(t *testing.T, e env) {
	ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
	defer cancel()
	insts := newInstances(t, e.newInstance, "a", "b")
	a, b := insts[0], insts[1]
	smpA, smpB := e.sampler(a), e.sampler(b)
	smpA.Start()
	smpB.Start()
	b1 := start(t, b, b.run(ctx, 2, b.hold("b1")...))
	b1.waitStarted(t, ctx)
	smpB.Sample()
	tag := strconv.Itoa(os.Getpid()) + "-" + e.s.name + "-" + strconv.FormatUint(e.rng.Uint64()%1e6, 10)
	shared := cgroupProcess(t, []string{filepath.Join(gpuParent(), "neighbour-"+tag)})
	var nested []string
	for _, p := range a.parents() {
		nested = append(nested, filepath.Join(p, "nest-"+tag, "inner"))
	}
	// One process in every nested parent: on v1 one process in all of
	// them (a cgroup per hierarchy); on cgroup2, where a process is in one
	// cgroup alone, one each.
	nests := []neighbour{}
	if testenv.CgroupV2Only() {
		for _, n := range nested {
			nests = append(nests, cgroupProcess(t, []string{n}))
		}
	} else {
		nests = append(nests, cgroupProcess(t, nested))
	}
	var skip []string
	for _, n := range nested {
		skip = append(skip, filepath.Dir(n))
	}
	all := append([]neighbour{shared, {"B's container " + b1.ID(), liveProc(t, b, b1.ID()).Alive}}, nests...)
	if n, ok := b.(neighbourer); ok {
		all = append(all, n.neighbours(t)...)
	}

	// One run of A killed early in its start, one while its container runs.
	a0 := start(t, a, a.run(ctx, 2, "sleep", "0.3"))
	time.Sleep(time.Duration(e.rng.Int64N(int64(150 * time.Millisecond))))
	a0.kill()
	a1 := start(t, a, a.run(ctx, 2, "sleep", "0.3"))
	a1.waitStarted(t, ctx)
	smpA.Sample()
	a1.kill()
	ids := append([]string{a0.ID(), a1.ID()}, a.records()...)
	took := recoverInstance(t, ctx, a)
	t.Logf("A's recovery with neighbours took %v", took.Round(time.Millisecond))
	for _, n := range all {
		if !n.alive() {
			t.Errorf("A's recovery stopped a neighbour: %s", n.name)
		}
	}
	checkSamples(t, "A", smpA, 1)
	checkLeft(t, "A after its recovery", a, smpA, ids, nil, skip)
	if !b1.running() {
		t.Errorf("B's run ended before it was let go: %v\n%s", b1.err, b1.output())
	}
	if err := b.letGo(ctx, "b1"); err != nil {
		t.Error(err)
	}
	b1.wait(t, ctx, "B's run")
	checkSamples(t, "B", smpB, 1)
	checkLeft(t, "B after its run", b, smpB, []string{b1.ID()}, nil, nil)
}

// gpuParent is gpuiso's shared default device cgroup parent.
func gpuParent() string { return filepath.Join(hierarchy("devices"), cgroups.DefaultParent) }

// cgroupProcess makes the cgroup directories dirs (one per hierarchy) and
// moves one fresh process into all of them: someone else's live process.
// It is killed, and what was made removed, when t ends.
func cgroupProcess(t *testing.T, dirs []string) neighbour {
	t.Helper()
	var made []string
	for _, d := range dirs {
		for p := d; ; p = filepath.Dir(p) {
			if _, err := os.Stat(p); err == nil {
				break
			}
			made = append(made, p)
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("sleep", "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := ProcOf(cmd.Process.Pid)
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		// Deepest first: made lists each directory's own before its parents.
		for _, d := range made {
			if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Logf("remove %s: %v", d, err)
			}
		}
	})
	for _, d := range dirs {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(p.Pid)), 0); err != nil {
			t.Fatal(err)
		}
	}
	return neighbour{name: "process in " + strings.Join(dirs, ", "), alive: func() bool {
		if !p.Alive() {
			return false
		}
		// Still where it was put.
		cgs := CgroupsOf(p.Pid)
		for _, d := range dirs {
			rel, _ := filepath.Rel(cgroupRoot, d)
			ctl, path, _ := strings.Cut(rel, "/")
			if testenv.CgroupV2Only() {
				ctl, path = "", rel
			}
			if cgs[ctl] != "/"+path {
				return false
			}
		}
		return true
	}}
}
