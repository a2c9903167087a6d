package native

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
)

// runner is the native containerizer.Runtime: it reserves a container's
// directory in the state directory (Reserver), makes its private /dev, its
// cgroup and its init (Create), lets the init go on (Start), and lists the
// containers from their records (List). It also takes over containers
// (Adopter), sweeps its leftovers (Cleaner) and resizes a running
// container's GPUs (Updater). A containerizer.Lifecycle decides the rest.
type runner struct {
	cfg Config
	// self is this process as the supervisor of the containers it launches.
	self allocator.Holder
	dev  devices
	// seccomp holds the seccomp programs built so far.
	seccomp programs
	// parent is the isolator's view of its cgroup parent, when it is the
	// state directory's own (CgroupParent): then cgroups no record
	// explains are this runtime's to remove, and so is the parent.
	parent parented
	// bare starts inits without namespaces, mounts or confinement: only
	// the package's own tests of its bookkeeping set it.
	bare bool

	mu sync.Mutex // guards procs and their fields
	// procs are the containers this process made or has dealt with since
	// it adopted them, by id.
	procs map[string]*proc
}

var (
	_ containerizer.Runtime    = (*runner)(nil)
	_ containerizer.Reserver   = (*runner)(nil)
	_ containerizer.Adopter    = (*runner)(nil)
	_ containerizer.Cleaner    = (*runner)(nil)
	_ containerizer.Updater    = (*runner)(nil)
	_ containerizer.Repairer   = (*runner)(nil)
	_ containerizer.Supervised = (*runner)(nil)
)

// proc is what the runtime knows of one container in this process.
type proc struct {
	rec  ctrRecord
	plan *isolator.Plan
	// stale are the device nodes of an update's plan not finished (see
	// enforce): they may be in the container's /dev beside plan's.
	stale []isolator.DeviceNode
	// config is what Start hands the init through w.
	config initConfig
	w      *os.File
	// child is set when this process started the init (not after a recovery).
	child *exec.Cmd
	// exited is closed once the exit status is known.
	exited chan struct{}
	code   int
	// killed: Kill removed the cgroup, with its processes.
	killed bool
	// busy serialises Update, Kill and Remove on the container.
	busy sync.Mutex
}

func (r *runner) dir(id string) string     { return filepath.Join(r.cfg.StateDir, id) }
func (r *runner) rootDir(id string) string { return filepath.Join(r.dir(id), "root") }
func (r *runner) devDir(id string) string  { return filepath.Join(r.dir(id), "dev") }
func (r *runner) exitPath(id string) string {
	return filepath.Join(r.dir(id), exitFile)
}

func (r *runner) Kind() containerizer.Kind { return containerizer.KindNative }

// Image checks spec. A container without a root file system of its own
// shares the host's, and with it the host's driver: it gets no volume over
// it. One with its own gets the volume when its image asks for it. Either
// starts from the same environment (a PATH), the spec's over it.
func (r *runner) Image(_ context.Context, spec containerizer.Spec) (containerizer.Image, error) {
	if err := validate(spec, r.cfg.StateDir); err != nil {
		return containerizer.Image{}, err
	}
	if spec.RootFS != "" {
		return containerizer.Image{Labels: spec.Labels, Env: defaultEnv(), OwnRoot: true, RootFS: spec.RootFS}, nil
	}
	return containerizer.Image{Env: defaultEnv()}, nil
}

func validate(spec containerizer.Spec, stateDir string) error {
	switch {
	case spec.Image != "":
		return fmt.Errorf("%w: an image needs the Docker containerizer", containerizer.ErrInvalidSpec)
	case len(spec.Command) == 0 || spec.Command[0] == "":
		return fmt.Errorf("%w: no command", containerizer.ErrInvalidSpec)
	case spec.Dir != "" && !filepath.IsAbs(spec.Dir):
		return fmt.Errorf("%w: working directory %q is not absolute", containerizer.ErrInvalidSpec, spec.Dir)
	}
	if _, err := confinementOf(spec); err != nil {
		return err
	}
	return checkRootFS(spec.RootFS, stateDir)
}

// Reserve makes the container's directory, naming this process as its
// supervisor (see claim): a crash at any later point leaves it behind for
// the next recovery, which gives back whatever was taken.
func (r *runner) Reserve(_ context.Context, spec containerizer.Spec) error {
	return r.claim(spec.ID)
}

// Unreserve removes the container's directory.
func (r *runner) Unreserve(_ context.Context, id string) error {
	return r.removeDir(id)
}

// Create makes the container's private /dev and cgroup, and starts its
// init in them, held until Start; the record is written once the init's
// pid is known. On error what it made is removed (the directory is the
// reservation's).
func (r *runner) Create(ctx context.Context, spec containerizer.Spec, p *containerizer.Prepared) (rec containerizer.Record, err error) {
	id := spec.ID
	plan := p.Plan
	pr := &proc{plan: plan, exited: make(chan struct{})}
	pr.rec = ctrRecord{Version: recordVersion, ID: id, GPUs: slices.Clone(p.Allocation.Devices), Mounts: plan.Mounts, Env: plan.Env, CPUAffinity: spec.CPUAffinity}
	if p.Volume != nil {
		pr.rec.Volume, pr.rec.VolumeVersion = p.Volume.Path, p.Volume.Version
	}
	if s := p.Allocation.Share; s != nil {
		sh := *s
		pr.rec.Share = &sh
	}
	var undo []func()
	defer func() {
		if err != nil {
			for _, u := range slices.Backward(undo) {
				u()
			}
		}
	}()
	bg := context.WithoutCancel(ctx) // undo runs even when ctx is cancelled
	if spec.RootFS == "" {
		// The mount point of the host's root, read-only, in the container.
		if err := os.Mkdir(r.rootDir(id), 0o700); err != nil {
			return rec, err
		}
		undo = append(undo, func() { os.Remove(r.rootDir(id)) })
	}
	if err := r.dev.makeDev(r.devDir(id), plan.Devices); err != nil {
		r.dev.removeDev(r.devDir(id))
		return rec, fmt.Errorf("private /dev: %w", err)
	}
	undo = append(undo, func() { r.dev.removeDev(r.devDir(id)) })
	if err := r.apply(ctx, id, plan.Rules); err != nil {
		return rec, err
	}
	undo = append(undo, func() { r.destroyCgroup(bg, id) })
	if err := r.pin(ctx, id, plan); err != nil {
		return rec, err
	}
	if err := r.startInit(ctx, spec, pr, p.Env, p.MPSDir); err != nil {
		return rec, err
	}
	r.mu.Lock()
	if r.procs == nil {
		r.procs = map[string]*proc{}
	}
	r.procs[id] = pr
	r.mu.Unlock()
	return r.public(pr.rec), nil
}

// public is a record as the Lifecycle sees it.
func (r *runner) public(rec ctrRecord) containerizer.Record {
	out := containerizer.Record{ID: rec.ID, RuntimeID: rec.ID, GPUs: slices.Clone(rec.GPUs), Volume: rec.Volume, VolumeVersion: rec.VolumeVersion, Pid: rec.Pid}
	if rec.Share != nil {
		s := *rec.Share
		out.Share = &s
	}
	return out
}

// apply makes the container's cgroup. Another process on the same state
// directory may remove the empty parent between the isolator's making of
// the parent and of the container's cgroup in it: then it tries again.
func (r *runner) apply(ctx context.Context, id string, rules []isolator.Rule) error {
	var err error
	for range 5 {
		if err = r.cfg.Isolator.Apply(ctx, id, rules); !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return err
}

// cpuPinner is what an isolator needs to pin a container to CPUs and
// memory nodes; *cgroups.Isolator has it.
type cpuPinner interface {
	SetCPUs(ctx context.Context, id, cpus, mems string) error
}

// pin gives the container's cgroup the plan's CPUs and memory nodes, when
// the plan has any, before a process runs in it.
func (r *runner) pin(ctx context.Context, id string, plan *isolator.Plan) error {
	if plan.CPUs == "" && plan.Mems == "" {
		return nil
	}
	p, ok := r.cfg.Isolator.(cpuPinner)
	if !ok {
		return fmt.Errorf("pin %s to CPUs %s: the isolator cannot: %w", id, plan.CPUs, containerizer.ErrNotSupported)
	}
	return p.SetCPUs(ctx, id, plan.CPUs, plan.Mems)
}

// planOptions are the options that make a container's plan again as
// Prepare made it.
func (r *runner) planOptions(a containerizer.CPUAffinity) ([]isolator.PlanOption, error) {
	return containerizer.PlanOptions(a, r.cfg.SysRoot)
}

// destroyBound bounds each removal of a cgroup: the kernel empties a
// cgroup of killed processes in milliseconds, so a cgroup still busy after
// it (a parent of cgroups not known to it, say) is reported, not waited for.
const destroyBound = 5 * time.Second

// destroyCgroup removes container id's cgroup, within destroyBound, then
// the state directory's own cgroup parent if that was its last container.
func (r *runner) destroyCgroup(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, destroyBound)
	defer cancel()
	if err := r.cfg.Isolator.Destroy(ctx, id); err != nil {
		return err
	}
	r.removeParent()
	return nil
}

// removeParent removes the state directory's own cgroup parent if it is
// empty; one still in use stays.
func (r *runner) removeParent() {
	if r.parent == nil {
		return
	}
	if err := r.parent.RemoveParent(); err != nil {
		r.cfg.Logger.Warn("cgroup parent left", "parent", r.parent.Parent(), "err", err)
	}
}

func defaultEnv() []string {
	return []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
}

// startInit runs the init in the cgroup, held on its config pipe, and
// writes the record; mpsDir, when set, is hidden from the container.
func (r *runner) startInit(ctx context.Context, spec containerizer.Spec, pr *proc, env []string, mpsDir string) error {
	id := spec.ID
	rd, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer rd.Close()
	keep := false
	defer func() {
		if !keep {
			w.Close()
		}
	}()
	cmd := exec.Command(r.cfg.InitPath)
	cmd.Env = []string{initEnv + "=1"}
	cmd.ExtraFiles = append([]*os.File{rd}, spec.ExtraFiles...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = spec.Stdin, spec.Stdout, spec.Stderr
	cf, err := confinementOf(spec)
	if err != nil {
		return err
	}
	flags := uintptr(initCloneFlags)
	if !cf.HostNetwork {
		flags |= linux.CloneNewNet
	}
	if r.bare {
		flags = 0
	}
	cmd.SysProcAttr = linux.InitAttr(flags)
	inCgroup := false
	if r.cfg.Isolator.Version() == cgroups.V2 {
		// Born inside its cgroup (clone3 CLONE_INTO_CGROUP).
		cg, err := r.cfg.Isolator.OpenCgroup(id)
		if err != nil {
			return err
		}
		defer cg.Close()
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(cg.Fd())
		inCgroup = true
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start init: %w", err)
	}
	kill := func() { cmd.Process.Kill(); cmd.Wait() }
	if !inCgroup {
		if err := r.cfg.Isolator.AddProcess(ctx, id, cmd.Process.Pid); err != nil {
			kill()
			return err
		}
	}
	start, err := startTime(r.cfg.ProcRoot, cmd.Process.Pid)
	if err != nil {
		kill()
		return err
	}
	pr.rec.Pid, pr.rec.Start = cmd.Process.Pid, start
	if err := r.writeRecord(pr.rec); err != nil {
		kill()
		return fmt.Errorf("record: %w", err)
	}
	if cf.RootFS == "" {
		cf.HostRoot = r.rootDir(id)
	}
	cf.Hostname = hostname(id)
	if !r.bare {
		if cf.Seccomp, err = r.seccomp.get(cf.Caps); err != nil {
			kill()
			return err
		}
	}
	pr.config = initConfig{Args: spec.Command, Env: env, Dir: spec.Dir, DevDir: r.devDir(id), Mounts: pr.plan.Mounts, ExitFile: r.exitPath(id), Confine: cf, ExtraFiles: len(spec.ExtraFiles), Bare: r.bare}
	pr.config.Masked = r.hidden(mpsDir)
	pr.child, pr.w, keep = cmd, w, true
	go r.reap(pr)
	return nil
}

// Start hands the init its configuration: the command runs.
func (r *runner) Start(_ context.Context, rec containerizer.Record) error {
	pr := r.known(rec.ID)
	if pr == nil || pr.w == nil {
		return fmt.Errorf("start %s: not created here: %w", rec.ID, containerizer.ErrUnknownContainer)
	}
	err := writeConfig(pr.w, pr.config)
	pr.w = nil
	if err != nil {
		return fmt.Errorf("configure init: %w", err)
	}
	r.cfg.Logger.Info("container launched", "id", rec.ID, "pid", pr.rec.Pid, "gpus", len(pr.rec.GPUs), "volume", pr.rec.Volume)
	return nil
}

func writeConfig(w io.WriteCloser, cfg initConfig) error {
	defer w.Close()
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	if _, err := w.Write(b); err != nil {
		return err
	}
	return w.Close()
}

// known returns the container this process knows by id, or nil.
func (r *runner) known(id string) *proc {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.procs[id]
}

// entry returns container id as this process knows it, loading one it
// did not make (an adopted one) from its record and watching its init.
func (r *runner) entry(id string) (*proc, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if pr, ok := r.procs[id]; ok {
		return pr, nil
	}
	rec, err := r.readRecord(id)
	if err != nil {
		return nil, err
	}
	opts, err := r.planOptions(rec.CPUAffinity)
	if err != nil {
		return nil, err
	}
	plan, err := isolator.NewPlan(id, r.cfg.Inventory, rec.GPUs, rec.Mounts, rec.Env, opts...)
	if err != nil {
		return nil, err
	}
	pr := &proc{rec: rec, plan: plan, exited: make(chan struct{})}
	if r.procs == nil {
		r.procs = map[string]*proc{}
	}
	r.procs[id] = pr
	go r.watch(id, pr)
	return pr, nil
}

// reap waits for an init this process started and records how it ended.
func (r *runner) reap(pr *proc) {
	code, _ := linux.ExitCode(pr.child.Wait())
	r.exit(pr, code)
}

// watch polls an adopted init (not a child of this process) until it ends,
// then takes the status the init recorded.
func (r *runner) watch(id string, pr *proc) {
	r.mu.Lock()
	pid, start := pr.rec.Pid, pr.rec.Start
	r.mu.Unlock()
	for alive(r.cfg.ProcRoot, pid, start) {
		select {
		case <-pr.exited:
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	code := 128 + linux.SignalKill // killed before it could record anything
	if ex, err := r.readExit(id); err == nil {
		code = ex.Code
	}
	r.exit(pr, code)
}

// exit records how pr ended, once.
func (r *runner) exit(pr *proc, code int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-pr.exited:
	default:
		pr.code = code
		close(pr.exited)
	}
}

// Wait blocks until the container's command has exited.
func (r *runner) Wait(ctx context.Context, rec containerizer.Record) (containerizer.ExitStatus, error) {
	pr, err := r.entry(rec.ID)
	if err != nil {
		return containerizer.ExitStatus{}, err
	}
	select {
	case <-pr.exited:
		r.mu.Lock()
		defer r.mu.Unlock()
		return containerizer.ExitStatus{Code: pr.code}, nil
	case <-ctx.Done():
		return containerizer.ExitStatus{}, ctx.Err()
	}
}

// Kill kills every process of the container and removes its cgroup. A
// cgroup that stays busy for seconds after its processes were killed (one
// stuck in the kernel) is reported rather than waited for.
func (r *runner) Kill(ctx context.Context, rec containerizer.Record) error {
	pr := r.known(rec.ID)
	if pr == nil {
		return r.destroyCgroup(ctx, rec.ID)
	}
	pr.busy.Lock()
	defer pr.busy.Unlock()
	return r.kill(ctx, rec.ID, pr)
}

func (r *runner) kill(ctx context.Context, id string, pr *proc) error {
	if err := r.destroyCgroup(ctx, id); err != nil {
		return err
	}
	if pr.child != nil {
		if pr.w != nil { // created, never started
			pr.w.Close()
			pr.w = nil
		}
		<-pr.exited // reaped: the cgroup's processes are gone
	} else {
		r.exit(pr, 128+linux.SignalKill)
	}
	r.mu.Lock()
	pr.killed = true
	r.mu.Unlock()
	return nil
}

// Remove removes the container's cgroup (killing what runs in it) and its
// private /dev; its directory, the reservation, stays for Unreserve.
// Every step tolerates what is already gone.
func (r *runner) Remove(ctx context.Context, rec containerizer.Record) error {
	id := rec.ID
	if pr := r.known(id); pr != nil {
		pr.busy.Lock()
		defer pr.busy.Unlock()
		r.mu.Lock()
		killed := pr.killed
		r.mu.Unlock()
		if !killed {
			if err := r.kill(ctx, id, pr); err != nil {
				return err
			}
		}
	} else if err := r.destroyCgroup(ctx, id); err != nil {
		return err
	}
	if err := r.dev.removeDev(r.devDir(id)); err != nil {
		return err
	}
	r.mu.Lock()
	delete(r.procs, id)
	r.mu.Unlock()
	r.cfg.Logger.Info("container removed", "id", id)
	return nil
}

// Adopt names sup the supervisor of rec's container.
func (r *runner) Adopt(_ context.Context, rec containerizer.Record, sup allocator.Holder) (containerizer.Record, error) {
	if err := writeSupervisor(r.dir(rec.ID), rec.ID, sup); err != nil {
		return rec, fmt.Errorf("adopt %s: %w", rec.ID, err)
	}
	r.cfg.Logger.Info("container re-adopted", "id", rec.ID, "pid", rec.Pid, "gpus", len(rec.GPUs))
	rec.Supervisor = &sup
	return rec, nil
}

// Supervisor is this process, the supervisor of the containers the
// runtime launches (containerizer.Supervised), or nil where the proc file
// system cannot tell.
func (r *runner) Supervisor() *allocator.Holder { return r.holder() }
