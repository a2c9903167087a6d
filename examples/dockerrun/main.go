// Command dockerrun runs a Docker image as a GPU container through the
// Docker daemon's API, without the NVIDIA runtime hook: gpuiso allocates
// the GPUs, maps their device nodes (and the control devices) into the
// container, mounts the driver volume read-only at /usr/local/nvidia when
// the image asks for it (com.nvidia.volumes.needed, NVIDIA_VISIBLE_DEVICES),
// checks the image's NVIDIA_REQUIRE_* against the driver first, streams the
// container's output and exits with its status.
//
//	dockerrun [--simulate NAME] [--gpus N | --devices LIST] [--quiet] IMAGE [CMD...]
//
// --simulate runs on a simulated node: real device nodes with NVIDIA's
// numbers under a temporary directory (root needed). The image must be on
// the daemon already: dockerrun never pulls.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/moby/moby/client"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/docker"
	"github.com/gpuiso/gpuiso/internal/cli"
	"github.com/gpuiso/gpuiso/node/simnode"
	"github.com/gpuiso/gpuiso/volume"
)

func main() {
	ctx, signaled, stop := cli.NotifyContext(context.Background())
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if sig := signaled(); sig != 0 && code == exitInterrupted {
		code = cli.ExitSignal(sig) // 128+n for the signal that ended the run
	}
	os.Exit(code)
}

// Exit codes of dockerrun itself (as docker run's); anything else is the
// container's.
const exitFailed = cli.ExitError

// exitInterrupted is the status of a run a signal ended (SIGINT's; main
// puts the signal that came).
var exitInterrupted = cli.ExitSignal(syscall.SIGINT)

const usage = `usage: dockerrun [--simulate NAME] [--gpus N | --devices LIST] [--state-dir DIR] [--quiet] IMAGE [CMD...]
       dockerrun gc [--simulate NAME] [--state-dir DIR]

Run a Docker image as a GPU container through the Docker API, its GPUs' device
nodes and the read-only driver volume injected by gpuiso (no NVIDIA runtime
hook), its NVIDIA_REQUIRE_* checked first; exit with the container's status.
The image must be on the daemon already (make probe-image builds one).
"dockerrun gc" removes what killed runs left. Needs root.
`

const gcUsage = `usage: dockerrun gc [--simulate NAME] [--state-dir DIR]

Remove the containers, allocations and volume users that killed dockerrun runs
left.
`

// DefaultStateDir keeps the allocator's state of every dockerrun on the host.
const DefaultStateDir = "/run/gpuiso/dockerrun"

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	gc := len(args) > 0 && args[0] == "gc"
	prog, help := "dockerrun", usage
	if gc {
		args = args[1:]
		prog, help = "dockerrun gc", gcUsage
	}
	fs := flag.NewFlagSet(prog, flag.ContinueOnError)
	simulate := fs.String("simulate", "", "run on the simulated node `NAME`: "+strings.Join(simnode.Names(), ", "))
	stateDir := fs.String("state-dir", DefaultStateDir, "the allocator's state `DIR`, shared by every dockerrun that names it")
	gpus, devices, quiet := new(int), new(string), new(bool)
	*gpus = 1
	if !gc {
		fs.IntVar(gpus, "gpus", 1, "number of GPUs")
		fs.StringVar(devices, "devices", "", "comma-separated GPUs (indexes, UUIDs or bus ids) instead of --gpus")
		fs.BoolVar(quiet, "quiet", false, "do not print which GPUs and volume the container got")
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "dockerrun: "+format+"\n", a...)
		return exitFailed
	}
	if code, done := cli.Parse(fs, args, help, stdout, stderr); done {
		return code
	}
	set := cli.Set(fs)
	switch {
	case gc && fs.NArg() > 0:
		return cli.Usagef(stderr, prog, "unexpected arguments %q", fs.Args())
	case !gc && fs.NArg() == 0:
		return cli.Usagef(stderr, prog, "no image (dockerrun [flags] IMAGE [CMD...])")
	case set["gpus"] && set["devices"]:
		return cli.Usagef(stderr, prog, "--gpus and --devices exclude each other: --devices names the GPUs, and their number")
	case *gpus < 0:
		return cli.Usagef(stderr, prog, "--gpus %d: want 0 or more GPUs", *gpus)
	}
	if !cli.IsRoot() {
		return cli.NeedsRoot(stderr, "dockerrun", "to hold GPUs in its state directory and give their device nodes to containers", "")
	}
	req := allocator.Request{Count: *gpus}
	if *devices != "" {
		req = allocator.Request{Devices: strings.Split(*devices, ",")}
	}
	state, err := filepath.Abs(*stateDir)
	if err != nil {
		return fail("%v", err)
	}
	self, err := allocator.ProcessHolder("", os.Getpid())
	if err != nil {
		return fail("%v", err)
	}

	dc, err := client.New(client.FromEnv)
	if err != nil {
		return fail("%v", err)
	}
	defer dc.Close()
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = dc.Ping(pingCtx, client.PingOptions{NegotiateAPIVersion: true})
	cancel()
	if err != nil {
		return fail("no Docker daemon answers: %v", err)
	}

	if *simulate != "" {
		_, _ = cli.RemoveDeadTemp("") // simulated nodes of killed runs
	}
	nd, err := cli.OpenNode(ctx, *simulate)
	if err != nil {
		return fail("%v", err)
	}
	defer nd.Close()
	inv, where := nd.Inventory, nd.Where
	alloc, err := allocator.New(inv, allocator.WithStateDir(state))
	if err != nil {
		return fail("%v", err)
	}
	defer alloc.Close()
	id := fmt.Sprintf("dockerrun-%d", os.Getpid())
	ns := namespace(state)
	vols, volErr := volume.New()
	if volErr == nil {
		_, volErr = vols.Build(ctx)
	}
	// This process supervises its container: once it is dead, the next
	// run's Clean removes what it left.
	opts := []docker.Option{docker.WithNamespace(ns), docker.WithSupervisor(self)}
	if volErr == nil {
		opts = append(opts, docker.WithVolumes(vols))
	}
	z, err := docker.New(dc, alloc, opts...)
	if err != nil {
		return fail("%v", err)
	}
	// The daemon is the truth, and every run reads and changes it under the
	// allocator's lock: Clean removes what killed runs left and holds the
	// GPUs of the live runs' containers again, and only then is this run's
	// container created. No other run acts in between.
	var ct containerizer.Container
	err = alloc.Exclusive(ctx, func() error {
		if _, err := z.Clean(ctx); err != nil {
			if gc {
				return err
			}
			fmt.Fprintf(stderr, "dockerrun: cleaning up after killed runs: %v\n", err)
		}
		if gc {
			return nil
		}
		var err error
		ct, err = z.Launch(ctx, containerizer.Spec{ID: id, Image: fs.Arg(0), Command: fs.Args()[1:], GPUs: req, Stdout: stdout, Stderr: stderr})
		return err
	})
	if gc {
		if err != nil {
			return fail("%v", err)
		}
		return 0
	}
	if err != nil {
		if errors.Is(err, docker.ErrNoVolume) {
			err = fmt.Errorf("%w (no driver volume (%v))", err, volErr)
		}
		if code, ok := cli.StartStatus(err); ok {
			fmt.Fprintf(stderr, "dockerrun: %v\n", err)
			return code // as docker run: 127 not found, 126 not executable
		}
		return fail("%v", err)
	}
	// Removing the container and giving back its GPUs is one step too.
	defer alloc.Exclusive(context.WithoutCancel(ctx), func() error { return z.Destroy(context.WithoutCancel(ctx), id) })
	if !*quiet {
		fmt.Fprintf(stderr, "dockerrun: %s%s; %s; container %.12s\n", cli.DescribeGPUs(ct.GPUs), where, volumeNote(ct.Volume), ct.RuntimeID)
	}
	st, err := z.Wait(ctx, id)
	if err != nil {
		if ctx.Err() != nil { // interrupted: Destroy (deferred) stops the container
			fmt.Fprintln(stderr, "dockerrun: interrupted; the container is removed")
			return exitInterrupted
		}
		return fail("%v", err)
	}
	return st.Code
}

// namespace is the containerizer namespace of the runs sharing a state
// directory.
func namespace(stateDir string) string {
	sum := sha256.Sum256([]byte(stateDir))
	return "dockerrun-" + hex.EncodeToString(sum[:6])
}

func volumeNote(path string) string {
	if path == "" {
		return "no driver volume (the image does not ask for it)"
	}
	return "driver volume " + path + " at /usr/local/nvidia"
}
