// Command gpuiso-runtime is an OCI runtime for Docker, Docker Swarm,
// containerd and Podman that gives a container the GPUs it asks for, isolated
// by gpuiso, and hands everything else to runc.
//
//	gpuiso-runtime [--runc PATH] [--state-dir DIR] [--simulate NAME --dev-root DIR]
//	               [--log FILE] [--log-format text|json] [--cdi-kind KIND]
//	               [--swarm-resource NAME]... [--swarm-memory-resource NAME]
//	               [--swarm-slice-resource NAME] [--swarm-slices N]
//	               [--shared-gpus all|none|LIST] [--accept-env-request POLICY]
//	               [--accept-cdi-annotations true|false]
//	               [--timeout DURATION] [runc's global flags] COMMAND [ARGS...]
//
// On "create" (and "run") it reads the bundle's config.json and finds the
// GPUs asked for, first found wins: DOCKER_RESOURCE_<NAME> (the GPUs Docker
// Swarm assigned the task; NAME is NVIDIA-GPU, NVIDIA_GPU or GPU unless
// --swarm-resource says otherwise), the spec's CDI annotations
// (cdi.k8s.io/*) naming devices of --cdi-kind (default nvidia.com/gpu), then
// NVIDIA_VISIBLE_DEVICES: GPU indexes, GPU- and MIG- UUIDs, "all", or
// "none"/"void" for none. It checks the image's NVIDIA_REQUIRE_* against the
// driver, and writes into the spec the GPUs' and control devices' nodes,
// their cgroup rules (every other device denied), NVIDIA_VISIBLE_DEVICES and
// CUDA_VISIBLE_DEVICES, and the read-only driver volume at /usr/local/nvidia
// for a container that is given GPUs or whose caller asks for the volume
// (NVIDIA_VISIBLE_DEVICES set and not void, as "none" does, or the
// com.nvidia.volumes.needed annotation). Then runc creates
// the container. A container asking for nothing, with no volume, is passed
// through untouched, and runs its CPU work.
//
// A request is what the caller set, never the image. The engine's record of
// the image (Docker's config.v2.json and image configuration, in either
// image store; Podman's storage), read from the engine's files, tells the
// image's own environment and annotations from the caller's; the policy
// --accept-env-request decides when NVIDIA_VISIBLE_DEVICES asks: "never",
// "caller" (the default: when the record shows the image does not set that
// value; no record, no request), "privileged" (also in a container with
// CAP_SYS_ADMIN) or "always" (the whole environment, for images the operator
// controls). The image's environment is read as its engine reads it: Podman
// trims spaces and tabs from the front of a name and fills a name given
// without a value ("NAME", "PREFIX*") from its caller's environment, which
// makes that variable the image's whatever its value; Docker keeps names
// byte for byte and drops an entry without "=". DOCKER_RESOURCE_* asks only
// in a Docker Swarm task whose record says so, with a value not the image's;
// an annotation Podman copied from the image asks for nothing, and a CDI
// annotation of a container Podman did not create asks only with
// --accept-cdi-annotations true. GPUISO_GPU_MEMORY is a size with its unit
// (4GiB, 4096MiB): a bare number is refused. "all" claims no GPU: with --state-dir it shows the
// GPUs no container holds and holds none. A device node of an owned GPU in
// the spec's device list is refused.
//
// The image's root file system is read on the host as the container would
// see it and no more: its CUDA compat libraries are found with every link
// resolved inside the root (openat2 RESOLVE_IN_ROOT), only regular files are
// opened (a FIFO or a device by that name is ignored, logged, never opened),
// reads are bounded, all before the state directory's lock is taken and
// within --timeout (default 30s), which also bounds the wait for that lock:
// past it the create is refused naming the lock's holder. Nothing from the
// image runs, nothing is written into it, and config.json is written back
// with only the members the isolation sets changed. (runc itself, not
// gpuiso-runtime, creates /dev's symlinks in the host folder an image's /dev
// names when that /dev is an absolute link.)
//
// A refused container is one line on stderr, "gpuiso-runtime: ", what is
// wrong and what to do about it (and an error in the --log file, in runc's
// format, where Docker and containerd look for runc's), and exit status 1,
// before anything is created.
//
// With --state-dir the GPUs a container names are claimed for it in the
// allocator's state there (shared with gpurun and any other gpuiso-runtime
// naming it): a GPU held by a live container is refused. The owner is the
// container in its runc root: the id, a dot and 12 hex digits of the root's
// SHA-256. A record of the container, written in DIR/gpuiso-runtime before
// anything is claimed, stands for the claim while runc create (or a
// foreground runc run) works, locked by gpuiso-runtime and the runc it runs;
// as soon as runc reports the container, its init process holds the claim
// ("create" and "run -d" alike). The claim and the container's use of the
// driver volume are given back by a "delete" in the container's own root,
// with or without the runtime's flags (one without finds the state
// directory through /run/gpuiso-runtime), or once the init is found dead. A
// record left by a gpuiso-runtime that was killed is settled by the next
// create or delete on the directory, which asks runc for the container: one
// that lives keeps its GPUs, one that does not gives them back. Without
// --state-dir gpuiso-runtime only isolates.
//
// A container may ask for a memory share of one GPU instead: Swarm's memory
// resource (DOCKER_RESOURCE_VRAM=<MiB>, --swarm-memory-resource, trusted as
// Swarm's GPUs are) or the caller's GPUISO_GPU_MEMORY (a size) and
// GPUISO_GPU_COMPUTE (a percentage), trusted as NVIDIA_VISIBLE_DEVICES is.
// A share needs --state-dir. It goes to a GPU of --shared-gpus (default
// every GPU without MIG), packed onto GPUs shared already, and is held to
// its limits by an MPS control daemon of its own (package isolator/mps,
// under DIR/mps), started before runc create: the container gets the
// daemon's pipe directory at /tmp/nvidia-mps, its /dev/shm and the MPS
// variables. The daemon belongs to the container's claim: it is stopped
// wherever the claim is given back, started again in place when it died
// under a living container, and one that no record or share explains is
// stopped by the next create or delete.
//
// Or a concurrent slice, one of N equal parts of a GPU served by the GPU's
// one MPS daemon: the caller's GPUISO_GPU_SLICES=N, or Swarm's slice
// resource. For Swarm the node advertises a named generic resource with
// one id per slice, "<GPU>::<k>" (the GPU by UUID or index, k from 0 to
// N-1; in daemon.json, "node-generic-resources":
// ["NVIDIA-GPU-SLICE=GPU-<uuid>::0", ..., "NVIDIA-GPU-SLICE=GPU-<uuid>::3"]),
// the runtime is given N once (--swarm-slices N; --swarm-slice-resource
// names the resource, default NVIDIA-GPU-SLICE), and a service asks with
// "docker service create --generic-resource NVIDIA-GPU-SLICE=1". The id
// Swarm assigned, DOCKER_RESOURCE_NVIDIA-GPU-SLICE=GPU-<uuid>::2 (Swarm
// upper-cases the name), trusted as Swarm's other resources are, asks for
// one of N slices of that GPU, served as GPUISO_GPU_SLICES=N of that GPU
// is: at most N slices of count N on the GPU, each held by the daemon to
// 1/N of its memory and threads. Several ids in one task (a container
// holds one share), an id of another form or past N, any id without
// --swarm-slices, or a slice beside Swarm's GPUs, its memory resource or
// another kind of share is refused, with nothing claimed. One id a slice
// lets Swarm count slices as it counts GPUs, with the GPU its choice; N
// is the node's setting, checked against every id.
//
// Every other command, and every runc flag, goes to runc unchanged (runc's
// own --log and --log-format included). --simulate NAME --dev-root DIR runs
// on a simulated node whose host tree (device nodes with NVIDIA's numbers
// on majors no driver owns) is made under DIR on first use and kept there.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}

// exitRefused is the status of a refused command.
const exitRefused = 1

// run carries out one command line.
func run(ctx context.Context, args []string, stderr io.Writer) int {
	s, cmd, rest, err := splitArgs(args)
	if err != nil {
		fmt.Fprintln(stderr, refusal(err))
		return exitRefused
	}
	log := newLogger(s)
	defer log.Close()
	refuse := func(err error) int {
		fmt.Fprintln(stderr, refusal(err))
		log.Error(remedied(err))
		return exitRefused
	}
	switch cmd {
	case "create", "run":
		c, err := parseCreate(rest)
		if err != nil {
			return refuse(err)
		}
		rt := &Runtime{Settings: s, Log: log.Logger}
		defer rt.closeDaemons()
		defer rt.abandon(ctx)
		// Everything before runc (reading the image, the state directory's
		// lock) ends with --timeout.
		pctx, cancel := context.WithTimeout(ctx, s.Timeout)
		res, err := rt.Prepare(pctx, c)
		cancel()
		if err != nil {
			return refuse(err)
		}
		// Without a state directory nothing is claimed: only a use of the
		// driver volume waits for runc's outcome.
		if res == nil || (s.StateDir == "" && res.p.Volume == nil) {
			return refuse(handOver(s.runcArgv(cmd, rest)))
		}
		return rt.Create(ctx, res, cmd, rest, c, stderr)
	case "delete":
		rt := &Runtime{Settings: s, Log: log.Logger}
		defer rt.closeDaemons()
		return rt.Delete(ctx, deleteID(rest), rest, stderr)
	}
	return refuse(handOver(s.runcArgv(cmd, rest)))
}

// handOver replaces this process by runc with argv: same pid, same open
// files, same environment. It returns only on error.
func handOver(argv []string) error {
	path, err := lookRunc(argv[0])
	if err != nil {
		return err
	}
	err = syscall.Exec(path, argv, os.Environ())
	return fmt.Errorf("exec %s: %w", path, err)
}

// runRunc runs runc with argv as a child sharing this process's standard
// files and the preserveFDs files after them, then the inherit files, and
// returns its exit status.
func runRunc(ctx context.Context, argv []string, preserveFDs int, inherit ...*os.File) (int, error) {
	path, err := lookRunc(argv[0])
	if err != nil {
		return 0, err
	}
	cmd := exec.Command(path, argv[1:]...)
	cmd.Args[0] = argv[0]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	for fd := 3; fd < 3+preserveFDs; fd++ {
		cmd.ExtraFiles = append(cmd.ExtraFiles, os.NewFile(uintptr(fd), fmt.Sprintf("fd%d", fd)))
	}
	cmd.ExtraFiles = append(cmd.ExtraFiles, inherit...)
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("runc: %w", err)
	}
	// A SIGTERM to this process (ctx ends) goes on to runc, which decides.
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			cmd.Process.Signal(syscall.SIGTERM)
		case <-done:
		}
	}()
	err = cmd.Wait()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), nil
	}
	if err != nil {
		return 0, fmt.Errorf("runc: %w", err)
	}
	return 0, nil
}

// runcDirs are where runc is looked for when PATH does not have it: some
// callers (Podman's cleanup) run the runtime with a short PATH.
var runcDirs = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// lookRunc finds the runc binary name (a path, or a name looked up in PATH
// and then in runcDirs).
func lookRunc(name string) (string, error) {
	path, err := exec.LookPath(name)
	if err == nil || strings.Contains(name, "/") {
		if err != nil {
			return "", fmt.Errorf("runc: %w", err)
		}
		return path, nil
	}
	for _, dir := range runcDirs {
		if p, err2 := exec.LookPath(filepath.Join(dir, name)); err2 == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("runc: %w", err)
}
