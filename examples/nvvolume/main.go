// Command nvvolume builds, lists and removes the NVIDIA driver volumes that
// gpuiso mounts into containers at /usr/local/nvidia.
//
//	nvvolume build [--root DIR] [--driver-version V] [--capabilities LIST] [--verify]
//	nvvolume list  [--root DIR]
//	nvvolume gc    [--root DIR] [--keep V]
//
// A user runs it to see what their containers will get; an agent runs
// "nvvolume build" at start so that no container waits for the volume.
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

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuiso/gpuiso/volume"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `usage: nvvolume build|list|gc [flags]
  build  build (or find) the volume of the host's driver; print its path, version and file count
  list   list the volumes with their users
  gc     remove the volumes no container uses
`

// run is the command: it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd := args[0]
	fs := flag.NewFlagSet("nvvolume "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	root := fs.String("root", volume.DefaultRoot, "directory holding the volumes")
	driverRoot := fs.String("driver-root", "/", "directory the driver is installed under")
	version := fs.String("driver-version", "", "driver version (default: detected)")
	caps := fs.String("capabilities", "all", "capabilities the volume serves, comma-separated, or all")
	verify := fs.Bool("verify", false, "build: read every copied file to verify an existing volume")
	keep := fs.String("keep", "", "gc: a version to keep even when unused")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "nvvolume %s: unexpected arguments %q\n", cmd, fs.Args())
		return 2
	}
	capList, err := volume.ParseCapabilities(*caps)
	if err != nil {
		fmt.Fprintf(stderr, "nvvolume: %v\n", err)
		return 2
	}
	opts := []volume.Option{
		volume.WithRoot(*root),
		volume.WithDriverRoot(*driverRoot),
		volume.WithCapabilities(capList...),
		volume.WithDeepVerify(*verify),
		volume.WithNVML(nvmlVersion),
	}
	if *version != "" {
		opts = append(opts, volume.WithDriverVersion(*version))
	}
	m, err := volume.New(opts...)
	if err != nil {
		fmt.Fprintf(stderr, "nvvolume: %v\n", err)
		return 2
	}
	switch cmd {
	case "build":
		v, err := m.Build(ctx)
		if err != nil {
			fmt.Fprintf(stderr, "nvvolume build: %v\n", err)
			return 1
		}
		state := "found"
		if v.Built {
			state = "built"
		}
		fmt.Fprintf(stdout, "%s\t%s\t%d files\t%d links\t%s\n", v.Path, v.Version, v.Files, v.Links, state)
		for _, w := range v.Warnings {
			fmt.Fprintf(stderr, "left out: %s\n", w)
		}
	case "list":
		vols, err := m.List(ctx)
		for _, v := range vols {
			users := strings.Join(v.Users, ",")
			if users == "" {
				users = "-"
			}
			fmt.Fprintf(stdout, "%s\t%s\t%d files\tusers %s\n", v.Path, v.Version, v.Files, users)
		}
		if err != nil {
			fmt.Fprintf(stderr, "nvvolume list: %v\n", err)
			return 1
		}
	case "gc":
		var keepList []string
		if *keep != "" {
			keepList = append(keepList, *keep)
		}
		removed, err := m.GC(ctx, keepList...)
		for _, v := range removed {
			fmt.Fprintf(stdout, "removed %s\n", v)
		}
		if err != nil {
			fmt.Fprintf(stderr, "nvvolume gc: %v\n", err)
			return 1
		}
	default:
		fmt.Fprintf(stderr, "nvvolume: unknown command %q\n%s", cmd, usage)
		return 2
	}
	return 0
}

// nvmlVersion asks NVML for the loaded driver's version; without a kernel
// driver it fails and the manager falls back to the library file's name.
func nvmlVersion(context.Context) (string, error) {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return "", fmt.Errorf("nvml: %s", nvml.ErrorString(ret))
	}
	defer nvml.Shutdown()
	v, ret := nvml.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return "", fmt.Errorf("nvml: %s", nvml.ErrorString(ret))
	}
	return v, nil
}
