// Command agent is a small container agent with a runtime of its own that
// adds GPUs with gpuiso's isolator for isolation chains (package
// containerizer/chain): it builds a CPU and memory cgroup for each
// container with containerd/cgroups, chains the GPU isolator after it,
// launches the command with its own fork and exec, and, started again after
// being killed, recovers the containers it left running.
//
//	agent [--simulate NAME] [--gpus N] [--state-dir DIR] [--cpu-shares N] [--memory BYTES] [--cpu-affinity numa|none] [-- CMD [ARGS...]]
//
// The launch: the agent writes its record of the container, makes its CPU
// and memory cgroup (cgroup v1's cpu and memory hierarchies, or a cgroup2
// group on a host with only cgroup2), asks the GPU isolator to prepare it
// (its GPUs, device rules and environment), starts a stub of itself that
// waits, puts the stub into the CPU and memory cgroup and has the GPU
// isolator isolate it (its own device cgroup on v1; on cgroup2 the agent's
// cgroup itself), records the pid, and only then lets the stub execute the
// command. The command runs on the host's file system with the device rules
// enforced: every device node but its GPUs' (and the usual pseudo devices)
// is denied to it. When it exits the agent cleans up (the GPU isolator
// first, then its own cgroup and record) and exits with its status.
//
// Every start first recovers: containers whose process still runs are
// handed to the GPU isolator's Recover as known (their GPUs held again,
// their rules enforced again) and adopted: the agent waits for them to exit
// and cleans up after them. Everything of a container that no longer runs
// is removed. Without a command the agent only recovers and waits.
// SIGINT or SIGTERM ends the agent and its containers (it exits 128+n);
// SIGKILL leaves them running for the next start to recover.
//
// On a host with only cgroup2 the container's cgroup is one group of the
// unified hierarchy with the cpu controller (its weight, converted from
// --cpu-shares) and, with --memory, the memory controller (memory.max)
// enabled from the root down. --cpu-affinity numa has the GPU isolator pin
// the container to its GPUs' NUMA nodes as well (cpuset).
//
// The state lives in --state-dir (default /var/lib/gpuiso/agent): the
// agent's records (containers/), the GPU isolator's (gpu/), the allocator's
// state (alloc/) and the simulated nodes (sim/); one agent at a time owns
// it (a second exits 125 while the first runs). The agent needs root.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/chain"
	"github.com/gpuiso/gpuiso/internal/cli"
	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node/simnode"
	"github.com/gpuiso/gpuiso/record"
)

// stubEnv makes the agent's binary the stub that waits for its go-ahead on
// fd 3, then executes the command.
const stubEnv = "GPUISO_AGENT_STUB"

func main() {
	if os.Getenv(stubEnv) == "1" {
		os.Exit(stub(os.Args[1:]))
	}
	ctx, signaled, stop := cli.NotifyContext(context.Background())
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	if sig := signaled(); sig != 0 && code == exitInterrupted {
		code = cli.ExitSignal(sig)
	}
	os.Exit(code)
}

// stub waits until the agent has isolated it, then becomes the command. It
// exits 125 when the agent died first (its end of the pipe closed without a
// word), 127 when the command is not found and 126 when it cannot run.
func stub(args []string) int {
	go1 := os.NewFile(3, "go")
	b := make([]byte, 1)
	if n, _ := go1.Read(b); n != 1 {
		return cli.ExitError
	}
	go1.Close()
	path, err := exec.LookPath(args[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "agent: %v\n", err)
		return 127
	}
	env := slices.DeleteFunc(os.Environ(), func(e string) bool { return strings.HasPrefix(e, stubEnv+"=") })
	err = syscall.Exec(path, args, env)
	fmt.Fprintf(os.Stderr, "agent: exec %s: %v\n", args[0], err)
	return 126
}

const defaultStateDir = "/var/lib/gpuiso/agent"

var exitInterrupted = cli.ExitSignal(syscall.SIGINT)

const usage = `usage: agent [--simulate NAME] [--gpus N] [--state-dir DIR] [--cpu-shares N] [--memory BYTES]
             [--cpu-affinity numa|none] [-- CMD [ARGS...]]

A small container agent: it recovers the containers a killed run of the same
state directory left running (their GPUs held again, their device rules
enforced again) and waits for them, then runs CMD as a container of its own:
a CPU and memory cgroup built with containerd/cgroups, then gpuiso's GPU
isolator chained after it (--gpus GPUs, every other device denied), started
with its own fork and exec. It exits with the command's status. Needs root.
`

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	simulate := fs.String("simulate", "", "run on the simulated node `NAME`: "+strings.Join(simnode.Names(), ", "))
	gpus := fs.Int("gpus", 1, "number of GPUs the command gets")
	stateDir := fs.String("state-dir", defaultStateDir, "keep the agent's, the GPU isolator's and the allocator's state in `DIR`")
	shares := fs.Uint64("cpu-shares", 1024, "the container's CPU shares (cgroup2: converted to a weight)")
	memory := fs.Int64("memory", 0, "the container's memory limit in `BYTES` (0: none)")
	cpuAffinity := fs.String("cpu-affinity", "none", "`numa`: the GPU isolator pins the container to its GPUs' NUMA nodes; none: every CPU")
	gpuMemory := fs.String("gpu-memory", "", "a memory share of one GPU instead of --gpus: `SIZE` with a unit (4GiB, 512MiB), held by an MPS control daemon of its own")
	gpuCompute := fs.Int("gpu-compute", 0, "with --gpu-memory: the share's `PERCENT` of the GPU's compute (1 to 100)")
	timeSlice := fs.Bool("gpu-time-slice", false, "a time slice of one GPU instead of --gpus, isolated from none of its other time slices")
	if code, done := cli.Parse(fs, args, usage, stdout, stderr); done {
		return code
	}
	req := allocator.Request{Count: *gpus}
	if set := cli.Set(fs); set["gpu-memory"] || *timeSlice {
		switch {
		case set["gpus"]:
			return cli.Usagef(stderr, "agent", "--gpus and a share (--gpu-memory, --gpu-time-slice) exclude each other")
		case set["gpu-memory"] && *timeSlice:
			return cli.Usagef(stderr, "agent", "--gpu-memory and --gpu-time-slice exclude each other")
		}
		req = allocator.Request{Share: &allocator.Share{Mode: allocator.ShareTime}}
		if set["gpu-memory"] {
			if err := cli.SizeUnit("gpu-memory", *gpuMemory); err != nil {
				return cli.Usagef(stderr, "agent", "%v", err)
			}
			b, err := allocator.ParseBytes(*gpuMemory)
			if err != nil {
				return cli.Usagef(stderr, "agent", "--gpu-memory: %v", err)
			}
			req.Share = &allocator.Share{Mode: allocator.ShareMemory, MemoryBytes: b, ComputePercent: *gpuCompute}
		}
		if err := req.Share.Validate(); err != nil {
			return cli.Usagef(stderr, "agent", "--gpu-compute: %v", err)
		}
	} else if set["gpu-compute"] {
		return cli.Usagef(stderr, "agent", "--gpu-compute applies to --gpu-memory only")
	}
	command := fs.Args()
	switch {
	case *gpus < 0:
		return cli.Usagef(stderr, "agent", "--gpus %d: want 0 or more", *gpus)
	case *memory < 0:
		return cli.Usagef(stderr, "agent", "--memory %d: want 0 or more", *memory)
	case *stateDir == "":
		return cli.Usagef(stderr, "agent", "--state-dir is empty")
	case len(command) == 0 && (cli.Set(fs)["gpus"] || cli.Set(fs)["cpu-shares"] || cli.Set(fs)["memory"]):
		return cli.Usagef(stderr, "agent", "--gpus, --cpu-shares and --memory need a command")
	}
	affinity, err := containerizer.ParseCPUAffinity(*cpuAffinity)
	if err != nil {
		return cli.Usagef(stderr, "agent", "--cpu-affinity %q: want numa (the CPUs of its GPUs' NUMA nodes) or none (every CPU)", *cpuAffinity)
	}
	if !linux.IsRoot() {
		return cli.NeedsRoot(stderr, "agent", "to make its containers' cgroups and device rules", "")
	}
	a, err := open(ctx, *simulate, *stateDir, affinity)
	if err != nil {
		return cli.Errorf(stderr, "agent", "%v", err)
	}
	defer a.close()
	// What recovery could not do is reported (and is the exit status of a
	// run without a command); the containers it adopted and the command
	// still run.
	code := 0
	adopted, err := a.recover(ctx, stderr)
	if err != nil {
		code = cli.Errorf(stderr, "agent", "recover: %v", err)
	}
	if len(command) > 0 {
		res := &specs.LinuxResources{CPU: &specs.LinuxCPU{Shares: shares}}
		if *memory > 0 {
			res.Memory = &specs.LinuxMemory{Limit: memory}
		}
		code = a.launch(ctx, command, req, res, stdin, stdout, stderr) // the command's status

	}
	for _, c := range adopted {
		if err := a.waitAdopted(ctx, c); err != nil {
			fmt.Fprintf(stderr, "agent: %v\n", err)
			if code == 0 {
				code = cli.ExitError
			}
		}
	}
	if ctx.Err() != nil && code == 0 {
		code = exitInterrupted
	}
	return code
}

// agent is one run's state.
type agent struct {
	dir   string
	alloc *allocator.Allocator
	gpu   *chain.Isolator
	close func()
}

func open(ctx context.Context, simulate, stateDir string, affinity containerizer.CPUAffinity) (*agent, error) {
	dir, err := filepath.Abs(stateDir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(dir, "containers"), 0o700); err != nil {
		return nil, err
	}
	nd, err := cli.OpenSharedNode(ctx, simulate, filepath.Join(dir, "sim", simulate))
	if err != nil {
		return nil, err
	}
	// Every GPU without MIG takes shares (--gpu-memory, --gpu-time-slice).
	var shareable []string
	for _, d := range nd.Inventory.Devices {
		if !d.MIGSplit() {
			shareable = append(shareable, strconv.Itoa(d.Index))
		}
	}
	alloc, err := allocator.New(nd.Inventory, allocator.WithStateDir(filepath.Join(dir, "alloc")), allocator.WithShared(shareable...))
	if err != nil {
		nd.Close()
		return nil, err
	}
	// The MPS daemons of memory shares, where the node has MPS.
	daemons, _ := mps.New(filepath.Join(dir, "mps"))
	gpu, err := chain.New(chain.Config{Allocator: alloc, Inventory: nd.Inventory, StateDir: filepath.Join(dir, "gpu"), CPUAffinity: affinity, MPS: daemons})
	if err != nil {
		alloc.Close()
		nd.Close()
		return nil, err
	}
	return &agent{dir: dir, alloc: alloc, gpu: gpu, close: func() { gpu.Close(); alloc.Close(); daemons.Close(); nd.Close() }}, nil
}

// container is the agent's record of one container.
type container struct {
	ID string `json:"id"`
	// Cgroup is its CPU and memory cgroup, from the hierarchy's root.
	Cgroup string `json:"cgroup"`
	// V2 tells the cgroup is a cgroup2 group.
	V2 bool `json:"v2,omitempty"`
	// Process is its first process, once started.
	Process *linux.Process `json:"process,omitempty"`
}

// The agent's records are entries of a record store (package record) in
// <dir>/containers, one "<id>.json" each, of format "gpuiso-agent-container",
// version 2. Version 1, the container's JSON alone, is read still.
const (
	recordFormat  = "gpuiso-agent-container"
	recordVersion = 2
)

// store is the agent's record store.
func (a *agent) store() (*record.Store[container], error) {
	dir, err := filepath.Abs(filepath.Join(a.dir, "containers"))
	if err != nil {
		return nil, err
	}
	return record.New(dir, record.Options[container]{Format: recordFormat, Version: recordVersion, Legacy: legacyContainer})
}

// legacyContainer reads a record of version 1: the container alone.
func legacyContainer(b []byte) (record.Entry[container], error) {
	var c container
	if err := json.Unmarshal(b, &c); err != nil {
		return record.Entry[container]{}, err
	}
	return record.Entry[container]{Key: c.ID, Phase: record.Completed, Version: 1, Data: c}, nil
}

func (a *agent) write(c container) error {
	s, err := a.store()
	if err != nil {
		return err
	}
	return s.Write(record.Entry[container]{Key: c.ID, Phase: record.Completed, Data: c})
}

func (a *agent) records() ([]container, error) {
	s, err := a.store()
	if err != nil {
		return nil, err
	}
	// An interrupted write's temporary files; this agent owns the
	// directory.
	if err := s.Clean(); err != nil {
		return nil, err
	}
	keys, err := s.List()
	if err != nil {
		return nil, err
	}
	var out []container
	var errs []error
	for _, id := range keys {
		e, err := s.Read(id)
		if err == nil && e.Data.ID != id {
			err = fmt.Errorf("record %s: names another container", id)
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, e.Data)
	}
	return out, errors.Join(errs...)
}

// running reports whether c's first process still runs.
func running(c container) bool {
	return c.Process != nil && linux.Alive("", *c.Process)
}

// recover hands the containers that still run to the GPU isolator as
// known, and removes everything of the others.
func (a *agent) recover(ctx context.Context, stderr io.Writer) ([]container, error) {
	recs, err := a.records()
	if err != nil {
		return nil, err
	}
	var live []container
	var known []string
	for _, c := range recs {
		if running(c) {
			live = append(live, c)
			known = append(known, c.ID)
		}
	}
	// A container the GPU isolator could not recover is reported and, like
	// one it never isolated, does not get to run on.
	res, rerr := a.gpu.Recover(ctx, known)
	var adopted []container
	errs := []error{rerr}
	for _, c := range live {
		if !slices.Contains(res.Recovered, c.ID) {
			errs = append(errs, a.destroy(ctx, c))
			continue
		}
		fmt.Fprintf(stderr, "agent: recovered container %s (pid %d)\n", c.ID, c.Process.Pid)
		adopted = append(adopted, c)
	}
	for _, c := range recs {
		if !running(c) {
			errs = append(errs, a.destroy(ctx, c))
		}
	}
	return adopted, errors.Join(errs...)
}

// waitAdopted waits for an adopted container's process to end (it is not
// the agent's child: it is watched in /proc), then cleans up after it.
func (a *agent) waitAdopted(ctx context.Context, c container) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for !linux.Dead("", *c.Process) {
		select {
		case <-ctx.Done():
			return a.destroy(context.WithoutCancel(ctx), c)
		case <-t.C:
		}
	}
	return a.destroy(ctx, c)
}

// destroy kills what is left of c, then cleans up: the GPU isolator first
// (its device cgroup, its GPUs), then the CPU and memory cgroup and the
// record.
func (a *agent) destroy(ctx context.Context, c container) error {
	cg, err := loadCgroup(c)
	if err == nil {
		err = cg.kill(ctx)
	}
	if err != nil && !errors.Is(err, cgroup1.ErrCgroupDeleted) && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("container %s: %w", c.ID, err)
	}
	if err := a.gpu.Cleanup(ctx, c.ID); err != nil {
		return fmt.Errorf("container %s: %w", c.ID, err)
	}
	if cg != nil {
		if err := cg.delete(); err != nil {
			return fmt.Errorf("container %s: %w", c.ID, err)
		}
	}
	s, err := a.store()
	if err == nil {
		err = s.Remove(c.ID)
	}
	if err != nil {
		return fmt.Errorf("container %s: %w", c.ID, err)
	}
	return nil
}

// launch runs command as a new container and returns its exit status.
func (a *agent) launch(ctx context.Context, command []string, req allocator.Request, res *specs.LinuxResources, stdin io.Reader, stdout, stderr io.Writer) int {
	c := container{ID: newID()}
	c.V2 = cgroups.Mode() == cgroups.Unified
	c.Cgroup = "/gpuiso-agent/" + c.ID
	// The record first: whatever a kill leaves from here on, the next
	// start finds.
	if err := a.write(c); err != nil {
		return cli.Errorf(stderr, "agent", "%v", err)
	}
	fail := func(err error) int {
		derr := a.destroy(context.WithoutCancel(ctx), c)
		if ctx.Err() != nil && derr == nil {
			return exitInterrupted // a signal cut the launch short
		}
		return cli.Errorf(stderr, "agent", "%v", errors.Join(err, derr))
	}
	cg, err := newCgroup(c, res)
	if err != nil {
		return fail(err)
	}
	// The GPU isolator is chained after the CPU and memory isolator.
	l, err := a.gpu.Prepare(ctx, c.ID, req, containerizer.Image{})
	if err != nil {
		return fail(err)
	}

	goR, goW, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	self, err := os.Executable()
	if err != nil {
		return fail(err)
	}
	cmd := exec.Command(self, command...)
	cmd.Env = append(isolator.MergeEnv(os.Environ(), l.Plan.Env), stubEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	cmd.ExtraFiles = []*os.File{goR}
	if len(l.Plan.Mounts) == 0 {
		// Its own process group: a terminal's signals reach the agent,
		// which decides; the container outlives an agent that is killed.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		err = cmd.Start()
	} else {
		// The plan's mounts (a memory share's MPS pipe directory and
		// /dev/shm) are made in a mount namespace of the container's
		// own, in a session of its own (a process group too).
		err = linux.StartDaemon(cmd, namespaceMounts(l.Plan.Mounts))
	}
	goR.Close()
	if err != nil {
		goW.Close()
		return fail(err)
	}
	pid := cmd.Process.Pid
	err = cg.add(pid)
	if err == nil && c.V2 {
		err = a.gpu.IsolateCgroup(ctx, c.ID, strings.TrimPrefix(c.Cgroup, "/"))
	} else if err == nil {
		err = a.gpu.Isolate(ctx, c.ID, pid)
	}
	if err == nil {
		var p linux.Process
		if p, err = linux.ProcessOf("", pid); err == nil {
			c.Process = &p
			err = a.write(c)
		}
	}
	if err != nil {
		goW.Close() // the stub exits without running the command
		cmd.Wait()
		return fail(err)
	}
	goW.Write([]byte{1})
	goW.Close()
	fmt.Fprintf(stderr, "agent: container %s: %s\n", c.ID, cli.DescribeGPUs(l.Allocation.Devices))

	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var werr error
	select {
	case werr = <-done:
	case <-ctx.Done():
		syscall.Kill(-pid, syscall.SIGKILL)
		<-done
	}
	if err := a.destroy(context.WithoutCancel(ctx), c); err != nil {
		return cli.Errorf(stderr, "agent", "%v", err)
	}
	if ctx.Err() != nil {
		return exitInterrupted
	}
	var ee *exec.ExitError
	if errors.As(werr, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return cli.ExitSignal(ws.Signal())
		}
		return ee.ExitCode()
	}
	if werr != nil {
		return cli.Errorf(stderr, "agent", "%v", werr)
	}
	return 0
}

// namespaceMounts is the container's mount namespace made of a plan's
// mounts: each a bind of a host directory that the container may write,
// hence nosuid, nodev, noexec and nosymfollow.
func namespaceMounts(ms []specs.Mount) []linux.NamespaceMount {
	out := make([]linux.NamespaceMount, 0, len(ms))
	for _, m := range ms {
		out = append(out, linux.NamespaceMount{Source: m.Source, Target: m.Destination, Untrusted: true})
	}
	return out
}

func newID() string {
	b := make([]byte, 6)
	rand.Read(b)
	return "ct-" + hex.EncodeToString(b)
}

// cpuMemory is a container's CPU and memory cgroup, v1 or cgroup2.
type cpuMemory struct {
	v1 cgroup1.Cgroup
	v2 *cgroup2.Manager
}

// hierarchy is the v1 hierarchies the agent uses: cpu and memory only; the
// devices hierarchy is the GPU isolator's.
func hierarchy() ([]cgroup1.Subsystem, error) {
	return []cgroup1.Subsystem{cgroup1.NewCpu("/sys/fs/cgroup"), cgroup1.NewMemory("/sys/fs/cgroup")}, nil
}

func newCgroup(c container, res *specs.LinuxResources) (*cpuMemory, error) {
	if c.V2 {
		m, err := cgroup2.NewManager("/sys/fs/cgroup", c.Cgroup, cgroup2.ToResources(res))
		if err != nil {
			return nil, fmt.Errorf("cgroup %s: %w", c.Cgroup, err)
		}
		return &cpuMemory{v2: m}, nil
	}
	cg, err := cgroup1.New(cgroup1.StaticPath(c.Cgroup), res, cgroup1.WithHierarchy(hierarchy))
	if err != nil {
		return nil, fmt.Errorf("cgroup %s: %w", c.Cgroup, err)
	}
	return &cpuMemory{v1: cg}, nil
}

func loadCgroup(c container) (*cpuMemory, error) {
	if c.V2 {
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", c.Cgroup)); err != nil {
			return nil, err
		}
		m, err := cgroup2.Load(c.Cgroup)
		if err != nil {
			return nil, err
		}
		return &cpuMemory{v2: m}, nil
	}
	cg, err := cgroup1.Load(cgroup1.StaticPath(c.Cgroup), cgroup1.WithHierarchy(hierarchy))
	if err != nil {
		return nil, err
	}
	return &cpuMemory{v1: cg}, nil
}

func (cg *cpuMemory) add(pid int) error {
	if cg.v2 != nil {
		return cg.v2.AddProc(uint64(pid))
	}
	return cg.v1.Add(cgroup1.Process{Pid: pid})
}

// kill kills every process of the cgroup until it is empty.
func (cg *cpuMemory) kill(ctx context.Context) error {
	for {
		var pids []int
		if cg.v2 != nil {
			procs, err := cg.v2.Procs(true)
			if err != nil {
				return err
			}
			for _, p := range procs {
				pids = append(pids, int(p))
			}
		} else {
			// Every hierarchy still there: a destroy killed between the
			// removal of the cpu and the memory cgroup leaves only the
			// memory one, which cgroup1.Load then holds alone.
			for _, sub := range cg.v1.Subsystems() {
				procs, err := cg.v1.Processes(sub.Name(), true)
				if err != nil {
					return err
				}
				for _, p := range procs {
					pids = append(pids, p.Pid)
				}
			}
		}
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (cg *cpuMemory) delete() error {
	if cg.v2 != nil {
		return cg.v2.Delete()
	}
	return cg.v1.Delete()
}
