// Command nvvolume builds, lists and removes the NVIDIA driver volumes that
// gpuiso mounts into containers at /usr/local/nvidia.
//
//	nvvolume build [--root DIR] [--wait D] [--driver-root DIR] [--driver-version V] [--capabilities LIST] [--verify]
//	nvvolume list  [--root DIR] [--wait D]
//	nvvolume gc    [--root DIR] [--wait D] [--keep V]
//
// No command waits longer than --wait (default 2m) for the root's lock,
// held by another program building or changing the volumes: it then fails,
// naming the holder.
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
	"path/filepath"
	"strings"
	"syscall"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuiso/gpuiso/internal/cli"
	"github.com/gpuiso/gpuiso/internal/ldcache"
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

Build, list and remove the NVIDIA driver volumes containers mount read-only
at /usr/local/nvidia.

commands:
  build  build (or find) the volume of the host's driver; print its path, version and file count
  list   list the volumes with their users
  gc     remove the volumes no container uses

"nvvolume COMMAND --help" lists a command's flags.
`

var usages = map[string]string{
	"build": `usage: nvvolume build [--root DIR] [--wait DURATION] [--driver-root DIR]
                      [--driver-version VERSION] [--capabilities LIST] [--verify]

Build (or find) the volume of the host's driver; print its path, version, file
and link count, and whether it was built or found.
`,
	"list": `usage: nvvolume list [--root DIR] [--wait DURATION]

List the volumes with their versions, file counts and users.
`,
	"gc": `usage: nvvolume gc [--root DIR] [--wait DURATION] [--keep VERSION]

Remove the volumes no container uses.
`,
}

// Exit statuses.

// run is the command: it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fail := func(format string, a ...any) int {
		fmt.Fprintln(stderr, strings.ReplaceAll(fmt.Sprintf(format, a...), "\n", "; "))
		return cli.ExitError
	}
	cmd, code, done := cli.Subcommand("nvvolume", []string{"build", "list", "gc"}, args, usage, stdout, stderr)
	if done {
		return code
	}
	prog := "nvvolume " + cmd
	fs := flag.NewFlagSet(prog, flag.ContinueOnError)
	root := fs.String("root", volume.DefaultRoot, "`DIR` holding the volumes")
	wait := fs.Duration("wait", volume.DefaultLockTimeout, "the longest `DURATION` to wait for the root's lock while another program holds it")
	// Each subcommand has only the flags it uses.
	driverRoot, version, caps, verify, keep := new(string), new(string), new(string), new(bool), new(string)
	*caps = "all"
	switch cmd {
	case "build":
		fs.StringVar(driverRoot, "driver-root", "", "`DIR` the driver is installed under (default: the first of "+strings.Join(volume.DefaultDriverRoots(), ", ")+" with the driver in its ld.so cache)")
		fs.StringVar(version, "driver-version", "", "driver `VERSION` (default: detected)")
		fs.StringVar(caps, "capabilities", "all", "`LIST` of capabilities the volume serves, comma-separated, or all")
		fs.BoolVar(verify, "verify", false, "read every copied file to verify an existing volume")
	case "gc":
		fs.StringVar(keep, "keep", "", "a `VERSION` to keep even when unused")
	}
	if code, done := cli.Parse(fs, args[1:], usages[cmd], stdout, stderr); done {
		return code
	}
	if fs.NArg() > 0 {
		return cli.Usagef(stderr, prog, "unexpected arguments %q", fs.Args())
	}
	if *wait <= 0 {
		return cli.Usagef(stderr, prog, "--wait %v: want a positive duration such as 2m", *wait)
	}
	if filepath.IsAbs(*driverRoot) {
		// Name the real cause: a directory without the driver, not NVML.
		if err := hasDriver(*driverRoot); err != nil {
			return fail("%s: --driver-root: %v", prog, err)
		}
	}
	capList, err := volume.ParseCapabilities(*caps)
	if err != nil {
		return cli.Usagef(stderr, prog, "--capabilities: %v", err)
	}
	if *keep != "" {
		if err := volume.ValidateVersion(*keep); err != nil {
			return cli.Usagef(stderr, prog, "--keep: %v", err)
		}
	}
	opts := []volume.Option{
		volume.WithRoot(*root),
		volume.WithCapabilities(capList...),
		volume.WithDeepVerify(*verify),
		volume.WithNVML(nvmlVersion),
		volume.WithLockTimeout(*wait),
	}
	if *version != "" {
		opts = append(opts, volume.WithDriverVersion(*version))
	}
	if *driverRoot != "" {
		opts = append(opts, volume.WithDriverRoot(*driverRoot))
	}
	m, err := volume.New(opts...)
	if err != nil {
		return fail("nvvolume %s: %v", cmd, err)
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
		if cli.Set(fs)["capabilities"] && len(v.Capabilities) > len(capList) {
			// Not silently: one volume per driver version serves every
			// capability asked of it so far.
			var have []string
			for _, c := range v.Capabilities {
				have = append(have, string(c))
			}
			fmt.Fprintf(stderr, "nvvolume build: the volume %s serves more than --capabilities asked: %s\n", state, strings.Join(have, ","))
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

// hasDriver says whether dir holds an NVIDIA driver as the volume reads
// one: an ld.so cache under it that names NVML or libcuda.
func hasDriver(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s: not a directory", dir)
	}
	cachePath := filepath.Join(dir, "etc", "ld.so.cache")
	b, err := os.ReadFile(cachePath)
	if err != nil {
		return fmt.Errorf("no NVIDIA driver under %s: %w", dir, err)
	}
	cache, err := ldcache.Parse(b)
	if err != nil {
		return fmt.Errorf("no NVIDIA driver under %s: %w", dir, err)
	}
	for _, e := range cache.Entries {
		if strings.HasPrefix(e.Key, "libnvidia-ml.so") || strings.HasPrefix(e.Key, "libcuda.so") {
			return nil
		}
	}
	return fmt.Errorf("no NVIDIA driver under %s: its ld.so cache names no libnvidia-ml.so or libcuda.so", dir)
}
