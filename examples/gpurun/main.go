// Command gpurun runs a command as a GPU container: in its own mount, pid and
// cgroup namespaces and device cgroup, with a private /dev holding only its
// GPUs and NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES naming them,
// confined as Docker confines a container by default (capabilities, seccomp,
// read-only /sys and cgroups, masked /proc). The driver volume is mounted
// read-only at /usr/local/nvidia only in a root file system of its own
// (--rootfs, --image) whose image asks for it; otherwise the command sees the
// host's driver as installed. It exits as docker run does (internal/cli):
// the command's status, 125 for gpurun's own errors, 126/127 for a command
// it cannot execute or find, 128+n for the signal n that ended it.
//
//	gpurun [--simulate NAME] [--gpus N | --devices LIST | --mig PROFILE | --gpu-memory SIZE [--gpu-compute PERCENT] | --gpu-time-slice | --gpu-slices N] [--policy P]
//	       [--state-dir DIR] [--cgroup v1|v2] [--rootfs DIR [--label K=V]... | --image ARCHIVE]
//	       [--user UID[:GID]] [--network none|host] [--max-image-bytes N] [--max-image-entries N] [--max-image-ratio N]
//	       [--cap-add CAP]... [--cpu-affinity numa|none] [--quiet] -- CMD [ARGS...]
//
// --mig takes one MIG device of that profile (e.g. 1g.10gb) instead of whole
// GPUs; --rootfs runs the command in DIR as its root file system (--label
// KEY=VALUE says what its image declares, such as
// com.nvidia.volumes.needed=nvidia_driver for the driver volume); --image
// unpacks an OCI layout or a docker save archive and runs in it, with its
// labels, environment, entrypoint, USER and WORKDIR, unpacked within limits
// (--max-image-bytes, --max-image-entries, --max-image-ratio; an archive past them is refused
// in one line and leaves nothing); --user runs the command as that user
// (with no capabilities) instead; --cap-add adds a capability to Docker's default set
// (repeatable).
//
// A container has its own network namespace (loopback only), IPC and UTS
// namespaces, a private /tmp, and only descriptors 0-2 of gpurun's;
// --network host shares the host's network instead.
//
// --cpu-affinity numa pins the command to the CPUs and memory nodes of its
// GPUs' NUMA nodes (the union for GPUs on several; nothing on a node whose
// GPUs' NUMA nodes are unknown, as NVML reports on many servers);
// --cpu-affinity none, the default, leaves it every CPU of the host, as
// docker run and Kubernetes' default topology policy do: pinning halves a
// two-socket node's CPUs for the command, which the caller must ask for.
//
// --gpu-memory SIZE (4GiB, 512M: a unit is required, so that a bare 4096
// meant as MiB is refused when the flags are read rather than taken as
// bytes) asks for a memory share of one GPU instead
// of whole GPUs: SIZE of its memory, counted by the allocator, with
// --gpu-compute PERCENT of its compute, enforced by an MPS control daemon
// of the share's own (package isolator/mps), whose pipe directory the
// command finds at /tmp/nvidia-mps (CUDA_MPS_PIPE_DIRECTORY) and whose
// /dev/shm it shares; the daemon is stopped when the command ends.
// --gpu-time-slice asks for a time slice: the GPU whole, beside the other
// time slices of it (at most 4), isolated from none of them.
// --gpu-slices N asks for a concurrent slice: one of N equal slices of one
// GPU (2 to 48), whose commands run at once as clients of the GPU's one MPS
// control daemon, started with its first slice and stopped with its last,
// which holds each to 1/N of the GPU's memory and compute; the slices of a
// GPU share that daemon's pipe directory and /dev/shm, and a fault in one
// can disturb the others (see package isolator/mps). A GPU split in N takes
// slices of N alone, at most N. Shares pack
// onto GPUs already shared and keep whole GPUs for whole requests;
// --devices may name the one GPU. A share that fits nowhere fails with one
// line naming each GPU's free memory.
//
// --mig PROFILE asks for --gpus MIG devices of that profile ("1g.10gb")
// instead of whole GPUs, on a node with MIG enabled on some GPUs
// (--simulate hgx-h100-mig). Beside a share flag it asks for a share of
// one MIG device of that profile instead of one GPU's (--devices may name
// the MIG device): --mig 1g.10gb --gpu-memory 2GiB is a memory share of a
// 1g.10gb device under an MPS daemon of its own that serves that MIG
// device alone, --mig 3g.40gb --gpu-slices 2 one of two slices of one. --simulate runs on a simulated node: real
// cgroups and real device nodes with NVIDIA's numbers, made by the first run
// of the state directory (sim/NAME) and kept for the next. gpurun needs
// root: without it, it says so in one line and exits 125, having made
// nothing. Its errors are one line, "gpurun: ...", ending with what to do
// (a usage error with "(see gpurun --help)").
//
// Runs keep their state in a state directory: --state-dir DIR, or
// /var/lib/gpuiso/gpurun without it. It holds each container's record
// (naming the gpurun that supervises it) and each run's --image tree (with
// the unpacker's scratch) under native/, the simulated nodes under sim/;
// the containers' cgroups go under the cgroup parent derived from it
// (gpuiso/i<hash>, removed with its last container). Each gpurun first
// tears down what killed runs of the same state directory left: their
// containers, cgroups, /dev mounts, GPUs and trees. With --state-dir the
// allocator's state is kept there too, shared by every gpurun naming it;
// without, each run allocates from the whole node.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/native"
	"github.com/gpuiso/gpuiso/containerizer/rootfs"
	"github.com/gpuiso/gpuiso/internal/cli"
	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node/simnode"
	"github.com/gpuiso/gpuiso/volume"
)

func main() {
	native.Init() // gpurun's own binary is each container's init
	ctx, signaled, stop := cli.NotifyContext(context.Background())
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	if sig := signaled(); sig != 0 && code == exitInterrupted {
		code = cli.ExitSignal(sig) // 128+n for the signal that ended the run
	}
	os.Exit(code)
}

// defaultStateDir is the state directory of runs without --state-dir.
const defaultStateDir = "/var/lib/gpuiso/gpurun"

// Exit codes of gpurun itself, as docker run has them; anything else is the
// command's (126: it could not be run, 127: it was not found).
const exitFailed = cli.ExitError

// exitInterrupted is the status of a run a signal ended (SIGINT's; main
// puts the signal that came).
var exitInterrupted = cli.ExitSignal(syscall.SIGINT)

const usage = `usage: gpurun [--simulate NAME] [--gpus N | --devices LIST | --mig PROFILE] [--policy P]
              [--gpu-memory SIZE [--gpu-compute PERCENT] | --gpu-time-slice | --gpu-slices N]
              [--state-dir DIR] [--cgroup v1|v2] [--rootfs DIR [--label KEY=VALUE]... | --image ARCHIVE]
              [--user UID[:GID]] [--network none|host] [--max-image-bytes N] [--max-image-entries N]
              [--max-image-ratio N] [--cap-add CAP]... [--cpu-affinity numa|none] [--quiet] -- CMD [ARGS...]

Run a command as a GPU container: its own mount, pid, cgroup, network, IPC and
UTS namespaces and device cgroup, a private /dev with only its GPUs and a
private /tmp, NVIDIA_VISIBLE_DEVICES naming them, only fds 0-2 of gpurun's,
confined as Docker confines a container by default. gpurun says which GPUs it
got on stderr and exits with the command's status. Needs root.
`

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gpurun", flag.ContinueOnError)
	simulate := fs.String("simulate", "", "run on the simulated node `NAME`: "+strings.Join(simnode.Names(), ", "))
	gpus := fs.Int("gpus", 1, "number of GPUs (or of MIG devices, with --mig)")
	devices := fs.String("devices", "", "comma-separated GPUs (indexes, UUIDs, bus ids or MIG- UUIDs) instead of --gpus")
	mig := fs.String("mig", "", "MIG `PROFILE` (e.g. 1g.10gb): --gpus MIG devices of it instead of whole GPUs")
	policy := fs.String("policy", string(allocator.PolicyTopology), "placement policy: topology, pack or spread")
	gpuMemory := fs.String("gpu-memory", "", "a memory share of one GPU instead of whole GPUs: `SIZE` with a unit (4GiB, 512MiB), enforced by an MPS control daemon of its own")
	gpuCompute := fs.Int("gpu-compute", 0, "with --gpu-memory: the share's `PERCENT` of the GPU's compute (MPS active threads, 1 to 100)")
	timeSlice := fs.Bool("gpu-time-slice", false, "a time slice of one GPU: the GPU whole, beside its other time slices, isolated from none of them")
	gpuSlices := fs.Int("gpu-slices", 0, "a concurrent slice: one of `N` equal slices of one GPU (2 to 48), run at once beside the GPU's other slices under one MPS control daemon that holds each to 1/N of the GPU")
	stateDir := fs.String("state-dir", "", "keep the state in `DIR` (containers' records, image trees, and the allocator's state, shared with every gpurun that names it; default /var/lib/gpuiso/gpurun, with the allocator in memory)")
	version := fs.String("cgroup", "", "cgroup version for devices: v1 or v2 (default: the host's)")
	quiet := fs.Bool("quiet", false, "do not print which GPUs and volume the command got")
	rootDir := fs.String("rootfs", "", "run the command in `DIR` as its root file system")
	image := fs.String("image", "", "unpack the image `ARCHIVE` (an OCI layout, or a tar of one or of docker save) and run in it")
	labels := map[string]string{}
	fs.Func("label", "`KEY=VALUE`: a label of the --rootfs image, such as com.nvidia.volumes.needed=nvidia_driver (repeatable)", func(s string) error {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return fmt.Errorf("want KEY=VALUE")
		}
		labels[k] = v
		return nil
	})
	user := fs.String("user", "", "run the command as `UID[:GID]` (for --image, instead of the image's USER)")
	maxBytes := fs.Int64("max-image-bytes", 0, "refuse an --image whose files hold more than `N` bytes (default 32 GiB)")
	maxEntries := fs.Int64("max-image-entries", 0, "refuse an --image of more than `N` files (default 1048576)")
	maxRatio := fs.Int64("max-image-ratio", 0, "refuse an --image whose compressed layers expand more than `N` times (default 100)")
	cpuAffinity := fs.String("cpu-affinity", "none", "`numa`: pin the command to the CPUs and memory of its GPUs' NUMA nodes; none: every CPU")
	network := fs.String("network", "none", "the container's network: `none` (its own, loopback only) or host (the host's: every listener and abstract socket of the host reachable)")
	var capAdd []string
	fs.Func("cap-add", "add the capability `CAP` to the default set (repeatable; ALL for every one, as docker run has it)", func(s string) error {
		if strings.EqualFold(s, "ALL") {
			// Every capability gpurun itself may pass on (its bounding set).
			bnd, err := boundingSet()
			if err != nil {
				return err
			}
			for n := 0; linux.CapabilityName(n) != ""; n++ {
				if bnd&(1<<n) != 0 {
					capAdd = append(capAdd, linux.CapabilityName(n))
				}
			}
			return nil
		}
		capAdd = append(capAdd, s)
		return nil
	})
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "gpurun: "+format+"\n", a...)
		return exitFailed
	}
	if code, done := cli.Parse(fs, args, usage, stdout, stderr); done {
		return code
	}
	usageErr := func(format string, a ...any) int { return cli.Usagef(stderr, "gpurun", format, a...) }
	set := cli.Set(fs)
	switch {
	case fs.NArg() == 0 && *image == "":
		return usageErr("no command (gpurun [flags] -- CMD [ARGS...])")
	case *image != "" && *rootDir != "":
		return usageErr("--image and --rootfs exclude each other")
	case set["gpus"] && set["devices"]:
		return usageErr("--gpus and --devices exclude each other: --devices names the GPUs, and their number")
	case set["label"] && *rootDir == "":
		return usageErr("--label applies to --rootfs only (an --image brings its own labels)")
	case set["gpu-memory"] && *timeSlice:
		return usageErr("--gpu-memory and --gpu-time-slice exclude each other")
	case set["gpu-slices"] && (set["gpu-memory"] || *timeSlice):
		return usageErr("--gpu-slices excludes --gpu-memory and --gpu-time-slice: a GPU is shared one way")
	case set["gpu-compute"] && !set["gpu-memory"]:
		return usageErr("--gpu-compute applies to --gpu-memory only")
	case (set["gpu-memory"] || *timeSlice || set["gpu-slices"]) && set["gpus"] && *gpus != 1:
		return usageErr("a share (--gpu-memory, --gpu-time-slice, --gpu-slices) is of one GPU, not --gpus %d", *gpus)
	case *gpus < 0:
		return usageErr("--gpus %d: want 0 or more GPUs", *gpus)
	}
	var usr *containerizer.User
	if *user != "" {
		u, err := containerizer.ParseUser(*user)
		if err != nil {
			return usageErr("--user %q: want a numeric UID or UID:GID (such as 1000:1000)", *user)
		}
		usr = &u
	}
	if *maxBytes < 0 || *maxEntries < 0 {
		return usageErr("--max-image-bytes and --max-image-entries take a positive number")
	}
	netMode, err := containerizer.ParseNetwork(*network)
	if err != nil {
		return usageErr("--network %q: want none (its own, loopback only) or host", *network)
	}
	affinity, err := containerizer.ParseCPUAffinity(*cpuAffinity)
	if err != nil {
		return usageErr("--cpu-affinity %q: want numa (the CPUs of its GPUs' NUMA nodes) or none (every CPU)", *cpuAffinity)
	}
	req := allocator.Request{Count: *gpus, MIG: *mig}
	if *devices != "" {
		if *mig != "" {
			return usageErr("--devices and --mig exclude each other")
		}
		req = allocator.Request{Devices: strings.Split(*devices, ",")}
	}
	if set["gpu-slices"] {
		req.Count, req.Share = 0, &allocator.Share{Mode: allocator.ShareSlice, Slices: *gpuSlices}
		if err := req.Share.Validate(); err != nil {
			return usageErr("--gpu-slices: %v", err)
		}
	}
	if set["gpu-memory"] || *timeSlice {
		req.Count, req.Share = 0, &allocator.Share{Mode: allocator.ShareTime}
		if set["gpu-memory"] {
			if err := cli.SizeUnit("gpu-memory", *gpuMemory); err != nil {
				return usageErr("%v", err)
			}
			b, err := allocator.ParseBytes(*gpuMemory)
			if err != nil {
				return usageErr("--gpu-memory: %v", err)
			}
			req.Share = &allocator.Share{Mode: allocator.ShareMemory, MemoryBytes: b, ComputePercent: *gpuCompute}
		}
		if err := req.Share.Validate(); err != nil {
			return usageErr("--gpu-compute: %v", err)
		}
	}
	settings := []allocator.Option{allocator.WithPolicy(allocator.Policy(*policy))}
	var isoOpts []cgroups.Option
	switch *version {
	case "":
	case "v1":
		isoOpts = append(isoOpts, cgroups.WithVersion(cgroups.V1))
	case "v2":
		isoOpts = append(isoOpts, cgroups.WithVersion(cgroups.V2))
	default:
		return usageErr("--cgroup %q: want v1 or v2", *version)
	}
	if !cli.IsRoot() {
		return cli.NeedsRoot(stderr, "gpurun", "to make its containers' namespaces, cgroups and device nodes", "")
	}
	// Runs share a state directory: --state-dir, or defaultStateDir. It
	// holds under native the containers' records (one directory each,
	// naming the gpurun that supervises it), whose cgroup parent native.New
	// derives from it, and each run's --image tree; under sim the simulated
	// nodes; with --state-dir the allocator's state too. Each run
	// first cleans up after runs that were killed: their containers,
	// cgroups, /dev mounts and GPUs, then their trees.
	stateRoot := defaultStateDir
	if *stateDir != "" {
		abs, err := filepath.Abs(*stateDir)
		if err != nil {
			return fail("%v", err)
		}
		settings = append(settings, allocator.WithStateDir(abs))
		stateRoot = abs
	}
	state, tmp := filepath.Join(stateRoot, "native"), filepath.Join(stateRoot, "tmp")

	// The node: the host's, or a simulated one, made by the first run of
	// the state directory and kept for the next (sim/<name>).
	nd, err := cli.OpenSharedNode(ctx, *simulate, filepath.Join(stateRoot, "sim", *simulate))
	if err != nil {
		return fail("%v", err)
	}
	defer nd.Close()
	inv, where := nd.Inventory, nd.Where
	if *mig != "" {
		if err := cli.CheckMIG(inv, *mig); err != nil {
			return fail("--mig: %v", err)
		}
	}
	// Every GPU without MIG takes shares: placement packs shares onto GPUs
	// already shared, and whole requests take shared GPUs last.
	var shareable []string
	for _, d := range inv.Devices {
		if !d.MIGSplit() {
			shareable = append(shareable, strconv.Itoa(d.Index))
		}
	}
	settings = append(settings, allocator.WithShared(shareable...))
	alloc, err := allocator.New(inv, settings...)
	if err != nil {
		return fail("%v", err)
	}
	defer alloc.Close()
	// The daemons of memory shares and of sliced GPUs live under mps/ of
	// the state directory; a node without nvidia-cuda-mps-control runs
	// everything but them.
	daemons, err := mps.New(filepath.Join(stateRoot, "mps"))
	if err != nil {
		if req.Share != nil && req.Share.Mode == allocator.ShareMemory {
			return fail("--gpu-memory: %v", err)
		}
		if req.Share != nil && req.Share.Mode == allocator.ShareSlice {
			return fail("--gpu-slices: %v", err)
		}
		daemons = nil
	} else {
		defer daemons.Close()
	}
	iso, err := cgroups.New(isoOpts...)
	if err != nil {
		return fail("%v", err)
	}
	vols, err := volume.New()
	if err == nil {
		_, err = vols.Build(ctx)
	}
	if err != nil {
		vols = nil // no driver: containers that ask for its volume are refused
	}
	c, err := native.New(native.Config{Allocator: alloc, Inventory: inv, Isolator: iso, Volumes: vols, MPS: daemons, StateDir: state})
	if err != nil {
		return fail("%v", err)
	}
	if _, err := c.Clean(ctx); err != nil {
		fmt.Fprintf(stderr, "gpurun: cleaning up after killed runs: %v\n", err)
	} else if _, err := cli.RemoveDeadTempIn(tmp, ""); err != nil {
		// Simulated nodes that earlier gpuruns made per run under tmp.
		fmt.Fprintf(stderr, "gpurun: cleaning up after killed runs: %v\n", err)
	}

	id := fmt.Sprintf("gpurun-%d", os.Getpid())
	spec := containerizer.Spec{ID: id, Command: fs.Args(), GPUs: req, Stdin: stdin, Stdout: stdout, Stderr: stderr,
		RootFS: *rootDir, Labels: labels, User: usr, CapAdd: capAdd, Network: netMode, CPUAffinity: affinity}
	if *image != "" {
		// The image's labels and environment decide the driver volume, as
		// for a Docker image; its entrypoint runs the arguments (or its CMD).
		// The tree and the unpacker's scratch live in a directory of this
		// run under the state directory: a later run's Clean removes it if
		// this one is killed.
		dir, err := c.TempDir()
		if err != nil {
			return fail("%v", err)
		}
		defer os.RemoveAll(dir)
		root := filepath.Join(dir, "rootfs")
		img, err := rootfs.Unpack(ctx, *image, root, rootfs.WithLimits(rootfs.Limits{Bytes: *maxBytes, Entries: *maxEntries, Ratio: *maxRatio}), rootfs.WithScratchDir(dir))
		if err != nil {
			return fail("%v", err)
		}
		spec.RootFS, spec.Labels, spec.Env, spec.Dir = root, img.Labels, img.Env, img.WorkingDir
		// The image's USER, as Docker runs it, unless --user says otherwise;
		// its working directory, made if the image lacks it.
		if usr == nil && img.User != "" {
			u, err := rootfs.ResolveUser(root, img.User)
			if err != nil {
				return fail("image %s: USER %s: %v", *image, img.User, err)
			}
			spec.User = &u
		}
		if img.WorkingDir != "" {
			if err := rootfs.EnsureDir(root, img.WorkingDir); err != nil {
				return fail("image %s: WORKDIR %s: %v", *image, img.WorkingDir, err)
			}
		}
		args := fs.Args()
		if len(args) == 0 {
			args = img.Cmd
		}
		spec.Command = append(slices.Clone(img.Entrypoint), args...)
		if len(spec.Command) == 0 {
			return fail("image %s has no entrypoint or command, and none was given", *image)
		}
	}
	ct, err := c.Launch(ctx, spec)
	if err != nil {
		if code, ok := cli.StartStatus(err); ok {
			fmt.Fprintf(stderr, "gpurun: %v\n", err)
			return code
		}
		if errors.Is(err, isolator.ErrUnknownNUMANode) {
			return fail("%s", cli.ExplainNUMA(err))
		}
		return fail("%v", err)
	}
	defer c.Destroy(context.WithoutCancel(ctx), id)
	if !*quiet {
		fmt.Fprintf(stderr, "gpurun: %s%s%s; %s\n", cli.DescribeMIG(inv, ct.GPUs), where, shareNote(ctx, daemons, ct), volumeNote(ct.Volume))
	}
	st, err := c.Wait(ctx, id)
	if err != nil {
		if ctx.Err() != nil { // interrupted: Destroy (deferred) stops the container
			fmt.Fprintln(stderr, "gpurun: interrupted; the container is stopped")
			return exitInterrupted
		}
		return fail("%v", err)
	}
	return st.Code
}

// shareNote says what a container holds of a shared GPU: its share and
// the MPS daemon that enforces a memory share or serves a GPU's slices.
func shareNote(ctx context.Context, daemons *mps.Manager, ct containerizer.Container) string {
	if ct.Share == nil {
		return ""
	}
	if ct.Share.Mode == allocator.ShareTime {
		return ", a time slice (no isolation from the GPU's other time slices)"
	}
	owner, note := ct.ID, ", a share of "+ct.Share.String()
	if ct.Share.Mode == allocator.ShareSlice && len(ct.GPUs) == 1 {
		owner, note = mps.SliceOwner(ct.GPUs[0].UUID), ", "+ct.Share.String()+" (running beside the GPU's other slices)"
	}
	if ds, err := daemons.List(ctx); err == nil {
		for _, d := range ds {
			if d.Owner == owner {
				note += fmt.Sprintf(" held by MPS daemon %d (%s)", d.Pid, d.PipeDir)
			}
		}
	}
	return note
}

// volumeNote says what the container has of the driver: a container that
// shares the host's root file system has the host's driver as installed.
func volumeNote(path string) string {
	if path == "" {
		return "the host's driver, as installed"
	}
	return "driver volume " + path + " at /usr/local/nvidia"
}

// boundingSet reads the capability bounding set of gpurun's own process.
func boundingSet() (uint64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapBnd:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, fmt.Errorf("/proc/self/status: no CapBnd line")
}
