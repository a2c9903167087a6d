// Command nvvolume builds, lists and removes the NVIDIA driver volumes that
// gpuiso mounts into containers at /usr/local/nvidia.
//
//	nvvolume build [--root DIR] [--driver-root DIR] [--driver-version V] [--capabilities LIST] [--verify]
//	nvvolume list  [--root DIR]
//	nvvolume gc    [--root DIR] [--keep V]
//
// A user runs it to see what their containers will get; an agent runs
// "nvvolume build" at start so that no container waits for the volume.
// Like docker run, it exits with 125 on any error of its own (a bad flag
// included) and prints the usage only for --help.
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

	"github.com/gpuiso/gpuiso/internal/cli"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
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

// Exit statuses.

// run is the command: it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, format+"\n", a...)
		return cli.ExitError
	}
	cmd, code, done := cli.Subcommand("nvvolume", []string{"build", "list", "gc"}, args, usage, stdout, stderr)
	if done {
		return code
	}
	fs := flag.NewFlagSet("nvvolume "+cmd, flag.ContinueOnError)
	root := fs.String("root", volume.DefaultRoot, "directory holding the volumes")
	driverRoot := fs.String("driver-root", "", "directory the driver is installed under (default: the first of "+strings.Join(volume.DefaultDriverRoots(), ", ")+" with the driver in its ld.so cache)")
	version := fs.String("driver-version", "", "driver version (default: detected)")
	caps := fs.String("capabilities", "all", "capabilities the volume serves, comma-separated, or all")
	verify := fs.Bool("verify", false, "build: read every copied file to verify an existing volume")
	keep := fs.String("keep", "", "gc: a version to keep even when unused")
	if code, done := cli.Parse(fs, args[1:], usage, stdout, stderr); done {
		return code
	}
	if fs.NArg() > 0 {
		return fail("nvvolume %s: unexpected arguments %q", cmd, fs.Args())
	}
	if cmd != "build" && cmd != "list" && cmd != "gc" {
		return fail("nvvolume: unknown command %q (build, list or gc)", cmd)
	}
	capList, err := volume.ParseCapabilities(*caps)
	if err != nil {
		return fail("nvvolume: %v", err)
	}
	if *keep != "" {
		if err := volume.ValidateVersion(*keep); err != nil {
			return fail("nvvolume %s: --keep: %v", cmd, err)
		}
	}
	opts := []volume.Option{
		volume.WithRoot(*root),
		volume.WithCapabilities(capList...),
		volume.WithDeepVerify(*verify),
		volume.WithNVML(nvmlVersion),
	}
	if *version != "" {
		opts = append(opts, volume.WithDriverVersion(*version))
	}
	if *driverRoot != "" {
		opts = append(opts, volume.WithDriverRoot(*driverRoot))
	}
	m, err := volume.New(opts...)
	if err != nil {
		return fail("nvvolume: %v", err)
	}
	switch cmd {
	case "build":
		v, err := m.Build(ctx)
		if err != nil {
			return fail("nvvolume build: %v", err)
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
			return fail("nvvolume list: %v", err)
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
			return fail("nvvolume gc: %v", err)
		}
	}
	return cli.ExitOK
}

// nvmlVersion asks NVML for the loaded driver's version; without a kernel
// driver it fails and the manager falls back to the library file's name.
func nvmlVersion(context.Context) (string, error) {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return "", &nvmlnode.NVMLError{Op: "driver version", Device: -1, Return: ret}
	}
	defer nvml.Shutdown()
	v, ret := nvml.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return "", &nvmlnode.NVMLError{Op: "driver version", Device: -1, Return: ret}
	}
	return v, nil
}
