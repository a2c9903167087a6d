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
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/moby/moby/client"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/docker"
	"github.com/gpuiso/gpuiso/internal/cli"
	"github.com/gpuiso/gpuiso/node/simnode"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit codes of dockerrun itself (as docker run's); anything else is the
// container's.
const (
	exitFailed = 125
	exitUsage  = 2
)

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("dockerrun", flag.ContinueOnError)
	fs.SetOutput(stderr)
	simulate := fs.String("simulate", "", "run on a simulated node: "+strings.Join(simnode.Names(), ", "))
	gpus := fs.Int("gpus", 1, "number of GPUs")
	devices := fs.String("devices", "", "comma-separated GPUs (indexes, UUIDs or bus ids) instead of --gpus")
	quiet := fs.Bool("quiet", false, "do not print which GPUs and volume the container got")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: dockerrun [--simulate NAME] [--gpus N | --devices LIST] [--quiet] IMAGE [CMD...]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "dockerrun: no image (dockerrun [flags] IMAGE [CMD...])")
		return exitUsage
	}
	req := allocator.Request{Count: *gpus}
	if *devices != "" {
		req = allocator.Request{Devices: strings.Split(*devices, ",")}
	}

	dc, err := client.New(client.FromEnv)
	if err != nil {
		fmt.Fprintf(stderr, "dockerrun: %v\n", err)
		return exitFailed
	}
	defer dc.Close()
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = dc.Ping(pingCtx, client.PingOptions{NegotiateAPIVersion: true})
	cancel()
	if err != nil {
		fmt.Fprintf(stderr, "dockerrun: no Docker daemon answers: %v\n", err)
		return exitFailed
	}

	nd, err := cli.OpenNode(ctx, *simulate)
	if err != nil {
		fmt.Fprintln(stderr, "dockerrun: "+err.Error())
		return exitFailed
	}
	defer nd.Close()
	inv, devRoot, where := nd.Inventory, nd.DevRoot, nd.Where
	alloc, err := allocator.New(inv)
	if err != nil {
		fmt.Fprintf(stderr, "dockerrun: %v\n", err)
		return exitFailed
	}
	id := fmt.Sprintf("dockerrun-%d", os.Getpid())
	opts := []docker.Option{docker.WithDevRoot(devRoot), docker.WithNamespace(id)}
	vols, volNote := cli.DriverVolume(ctx)
	if vols != nil {
		opts = append(opts, docker.WithVolumes(vols))
	}
	z, err := docker.New(dc, alloc, inv, opts...)
	if err != nil {
		fmt.Fprintf(stderr, "dockerrun: %v\n", err)
		return exitFailed
	}

	ct, err := z.Launch(ctx, containerizer.Spec{ID: id, Image: fs.Arg(0), Command: fs.Args()[1:], GPUs: req, Stdout: stdout, Stderr: stderr})
	if err != nil {
		if errors.Is(err, docker.ErrNoVolume) {
			err = fmt.Errorf("%w (%s)", err, volNote)
		}
		fmt.Fprintf(stderr, "dockerrun: %v\n", err)
		return exitFailed
	}
	defer z.Destroy(context.WithoutCancel(ctx), id)
	if !*quiet {
		fmt.Fprintf(stderr, "dockerrun: %s%s; %s; container %.12s\n", cli.DescribeGPUs(ct.GPUs), where, volumeNote(ct.Volume), ct.RuntimeID)
	}
	st, err := z.Wait(ctx, id)
	if err != nil { // interrupted: Destroy (deferred) stops the container
		fmt.Fprintf(stderr, "dockerrun: %v\n", err)
		return 128 + int(syscall.SIGINT)
	}
	return st.Code
}

func volumeNote(path string) string {
	if path == "" {
		return "no driver volume (the image does not ask for it)"
	}
	return "driver volume " + path + " at /usr/local/nvidia"
}
