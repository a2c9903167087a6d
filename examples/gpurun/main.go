// Command gpurun runs a command as a GPU container: in its own mount, pid and
// cgroup namespaces and device cgroup, with a private /dev holding only its
// GPUs, the driver volume read-only at /usr/local/nvidia, and
// NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES naming its GPUs, confined as
// Docker confines a container by default (capabilities, seccomp, read-only
// /sys and cgroups, masked /proc). It exits with the command's status.
//
//	gpurun [--simulate NAME] [--gpus N | --devices LIST | --mig PROFILE] [--policy P]
//	       [--state-dir DIR] [--cgroup v1|v2] [--rootfs DIR] [--user UID[:GID]]
//	       [--cap-add CAP]... [--quiet] -- CMD [ARGS...]
//
// --mig takes one MIG device of that profile (e.g. 1g.10gb) instead of whole
// GPUs; --rootfs runs the command in DIR as its root file system; --user runs
// it as that user (with no capabilities); --cap-add adds a capability to
// Docker's default set (repeatable).
//
// --mig PROFILE asks for --gpus MIG devices of that profile ("1g.10gb")
// instead of whole GPUs, on a node with MIG enabled on some GPUs
// (--simulate hgx-h100-mig). --simulate runs on a simulated node: real cgroups and real device nodes
// with NVIDIA's numbers, under a temporary directory. gpurun needs root.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/native"
	"github.com/gpuiso/gpuiso/internal/cli"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
	"github.com/gpuiso/gpuiso/node/simnode"
)

func main() {
	native.Init() // gpurun's own binary is each container's init
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit codes of gpurun itself; anything else is the command's.
const (
	exitFailed = 125
	exitUsage  = 2
)

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gpurun", flag.ContinueOnError)
	fs.SetOutput(stderr)
	simulate := fs.String("simulate", "", "run on a simulated node: "+strings.Join(simnode.Names(), ", "))
	gpus := fs.Int("gpus", 1, "number of GPUs")
	devices := fs.String("devices", "", "comma-separated GPUs (indexes, UUIDs, bus ids or MIG- UUIDs) instead of --gpus")
	mig := fs.String("mig", "", "MIG profile (e.g. 1g.10gb): --gpus MIG devices of it instead of whole GPUs")
	policy := fs.String("policy", string(allocator.PolicyTopology), "placement policy: topology, pack or spread")
	stateDir := fs.String("state-dir", "", "keep the allocator's state in DIR (default: in memory)")
	version := fs.String("cgroup", "", "cgroup version for devices: v1 or v2 (default: the host's)")
	quiet := fs.Bool("quiet", false, "do not print which GPUs and volume the command got")
	rootfs := fs.String("rootfs", "", "run the command in DIR as its root file system")
	user := fs.String("user", "", "run the command as UID[:GID]")
	var capAdd []string
	fs.Func("cap-add", "add a capability to the default set (repeatable)", func(s string) error {
		capAdd = append(capAdd, s)
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "gpurun: no command (gpurun [flags] -- CMD [ARGS...])")
		return exitUsage
	}
	var usr *containerizer.User
	if *user != "" {
		u, err := containerizer.ParseUser(*user)
		if err != nil {
			fmt.Fprintf(stderr, "gpurun: --user: %v\n", err)
			return exitUsage
		}
		usr = &u
	}
	req := allocator.Request{Count: *gpus, MIG: *mig}
	if *devices != "" {
		if *mig != "" {
			fmt.Fprintln(stderr, "gpurun: --devices and --mig exclude each other")
			return exitUsage
		}
		req = allocator.Request{Devices: strings.Split(*devices, ",")}
	}
	settings := []allocator.Option{allocator.WithPolicy(allocator.Policy(*policy))}
	if *stateDir != "" {
		settings = append(settings, allocator.WithStateDir(*stateDir))
	}
	var isoOpts []cgroups.Option
	switch *version {
	case "":
	case "v1":
		isoOpts = append(isoOpts, cgroups.WithVersion(cgroups.V1))
	case "v2":
		isoOpts = append(isoOpts, cgroups.WithVersion(cgroups.V2))
	default:
		fmt.Fprintf(stderr, "gpurun: --cgroup %q: want v1 or v2\n", *version)
		return exitUsage
	}

	// The node: the host's, or a simulated one under a temporary directory.
	nd, err := cli.OpenNode(ctx, *simulate)
	if err != nil {
		fmt.Fprintln(stderr, "gpurun: "+err.Error())
		return exitFailed
	}
	defer nd.Close()
	inv, devRoot, where := nd.Inventory, nd.DevRoot, nd.Where
	alloc, err := allocator.New(inv, settings...)
	if err != nil {
		fmt.Fprintf(stderr, "gpurun: %v\n", err)
		return exitUsage
	}
	iso, err := cgroups.New(isoOpts...)
	if err != nil {
		fmt.Fprintf(stderr, "gpurun: %v\n", err)
		return exitFailed
	}
	vols, _ := cli.DriverVolume(ctx)
	state, err := os.MkdirTemp("", "gpurun-")
	if err != nil {
		fmt.Fprintf(stderr, "gpurun: %v\n", err)
		return exitFailed
	}
	defer os.RemoveAll(state)
	c, err := native.New(native.Config{Allocator: alloc, Inventory: inv, Isolator: iso, Volumes: vols, DevRoot: devRoot, StateDir: state})
	if err != nil {
		fmt.Fprintf(stderr, "gpurun: %v\n", err)
		return exitFailed
	}

	id := fmt.Sprintf("gpurun-%d", os.Getpid())
	ct, err := c.Launch(ctx, containerizer.Spec{ID: id, Command: fs.Args(), GPUs: req, Stdin: stdin, Stdout: stdout, Stderr: stderr,
		RootFS: *rootfs, User: usr, CapAdd: capAdd})
	if err != nil {
		fmt.Fprintf(stderr, "gpurun: %v\n", err)
		return exitFailed
	}
	defer c.Destroy(context.WithoutCancel(ctx), id)
	if !*quiet {
		fmt.Fprintf(stderr, "gpurun: %s%s; %s\n", cli.DescribeGPUs(ct.GPUs), where, volumeNote(ct.Volume))
	}
	st, err := c.Wait(ctx, id)
	if err != nil { // interrupted: Destroy (deferred) stops the container
		fmt.Fprintf(stderr, "gpurun: %v\n", err)
		return 128 + int(syscall.SIGINT)
	}
	return st.Code
}

// volumeNote says what the container has of the driver: a container that
// shares the host's root file system has the host's driver as installed.
func volumeNote(path string) string {
	if path == "" {
		return "the host's driver, as installed"
	}
	return "driver volume " + path + " at /usr/local/nvidia"
}
