// Command nvcdi writes, lists and checks the Container Device Interface
// specs that give gpuiso's GPUs to any CDI runtime (Podman, containerd,
// CRI-O, Docker 25+).
//
//	nvcdi generate [--dir DIR] [--kind VENDOR/CLASS] [--volume PATH] [--simulate NAME [--sim-root DIR]]
//	nvcdi list     [--dir DIR]...
//	nvcdi validate FILE
//
// generate writes the spec of this node (or of a simulated one, whose host
// tree it makes in --sim-root, root needed, or finds there) and prints the
// names of its
// devices, one a line, ready for "podman run --device NAME". Run it when the
// agent starts and whenever a GPU's health changes: an unchanged spec is left
// untouched. Like docker run, it exits with 125 on any error of its own (a
// bad flag included) and prints the usage only for --help.
//
// --sim-root was spelt --dev-root before; every other gpuiso program's
// --dev-root names a directory of device nodes, so that spelling is read as
// --sim-root with a line on stderr saying so.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/gpuiso/gpuiso/internal/cli"
	"github.com/gpuiso/gpuiso/isolator/cdi"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
	"github.com/gpuiso/gpuiso/volume"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `usage: nvcdi generate|list|validate [flags]

Write, list and check the Container Device Interface specs that give this
node's GPUs to any CDI runtime (Podman, containerd, CRI-O, Docker 25+).

commands:
  generate  write the CDI spec of this node's GPUs (or --simulate NAME's); print its device names
  list      print the device names the spec directories define
  validate  check a spec file as CDI runtimes read it

"nvcdi COMMAND --help" lists a command's flags.
`

var usages = map[string]string{
	"generate": `usage: nvcdi generate [--dir DIR] [--kind VENDOR/CLASS] [--volume PATH]
                      [--simulate NAME [--sim-root DIR]]

Write the CDI spec of this node's GPUs (or of a simulated node, whose device
tree it makes in --sim-root, as root) and print the names of its devices,
one a line, ready for "podman run --device NAME". An unchanged spec is left
untouched.
`,
	"list": `usage: nvcdi list [--dir DIR]...

Print the device names the spec directories define.
`,
	"validate": `usage: nvcdi validate FILE

Check a spec file as CDI runtimes read it.
`,
}

// Exit statuses.

// defaultSimRoot is where --simulate makes a node's host tree unless
// --sim-root says otherwise: they must outlive the command, since the spec
// names them.
const defaultSimRoot = "/var/run/gpuiso/simnodes"

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

// run is the command: it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fail := func(format string, a ...any) int {
		fmt.Fprintln(stderr, strings.ReplaceAll(fmt.Sprintf(format, a...), "\n", "; "))
		return cli.ExitError
	}
	cmd, code, done := cli.Subcommand("nvcdi", []string{"generate", "list", "validate"}, args, usage, stdout, stderr)
	if done {
		return code
	}
	prog := "nvcdi " + cmd
	fs := flag.NewFlagSet(prog, flag.ContinueOnError)
	var dirs multi
	var dir, kind, vol, simulate, simRoot, devRoot *string
	switch cmd {
	case "generate":
		dir = fs.String("dir", cdi.DefaultDir, "spec `DIR` to write to")
		kind = fs.String("kind", cdi.DefaultKind, "device kind, `VENDOR/CLASS`")
		vol = fs.String("volume", "", "driver volume to mount at "+volume.ContainerPath+" (the `PATH` nvvolume build printed); none by default")
		simulate = fs.String("simulate", "", "the simulated node `NAME`: "+strings.Join(simnode.Names(), ", "))
		simRoot = fs.String("sim-root", "", "with --simulate: the simulated node's host tree in `DIR`, made there if missing, found there after (default "+defaultSimRoot+"/NAME)")
		devRoot = fs.String("dev-root", "", "the old spelling of --sim-root (`DIR`), read as it with a warning")
	case "list":
		fs.Var(&dirs, "dir", "spec `DIR`, repeatable (default "+strings.Join(cdi.DefaultDirs(), " and ")+")")
	}
	if code, done := cli.Parse(fs, args[1:], usages[cmd], stdout, stderr); done {
		return code
	}

	switch cmd {
	case "validate":
		if fs.NArg() != 1 {
			return cli.Usagef(stderr, prog, "want one spec file, got %d arguments", fs.NArg())
		}
		spec, err := cdi.ValidateFile(fs.Arg(0))
		if err != nil {
			return fail("nvcdi validate: %v", err)
		}
		fmt.Fprintf(stdout, "%s: valid, cdiVersion %s, kind %s, %d devices\n", fs.Arg(0), spec.Version, spec.Kind, len(spec.Devices))
		return cli.ExitOK
	case "list":
		if fs.NArg() > 0 {
			return cli.Usagef(stderr, prog, "unexpected arguments %q", fs.Args())
		}
		for _, d := range dirs {
			// A directory named on purpose must be there.
			if fi, err := os.Stat(d); err != nil {
				return fail("nvcdi list: --dir: %v", err)
			} else if !fi.IsDir() {
				return fail("nvcdi list: --dir %s: not a directory", d)
			}
		}
		names, err := cdi.List(dirs...)
		for _, n := range names {
			fmt.Fprintln(stdout, n)
		}
		if err != nil {
			return fail("nvcdi list: %s", strings.ReplaceAll(err.Error(), "\n", "; "))
		}
		return cli.ExitOK
	}

	// generate
	if fs.NArg() > 0 {
		return cli.Usagef(stderr, prog, "unexpected arguments %q", fs.Args())
	}
	if err := cdi.ValidateKind(*kind); err != nil {
		return fail("nvcdi generate: --kind: %v", err)
	}
	if !filepath.IsAbs(*dir) {
		return fail("nvcdi generate: --dir %q: not an absolute path", *dir)
	}
	if cli.Set(fs)["dev-root"] {
		switch {
		case cli.Set(fs)["sim-root"]:
			return cli.Usagef(stderr, prog, "--dev-root is the old spelling of --sim-root: give --sim-root once")
		case *simulate == "":
			return cli.Usagef(stderr, prog, "--dev-root (the old spelling of --sim-root) applies to --simulate only")
		}
		fmt.Fprintf(stderr, "%s: --dev-root is the old spelling of --sim-root (the simulated node's host tree; gpuiso's other programs' --dev-root is a directory of device nodes): read as --sim-root %s; write --sim-root\n", prog, *devRoot)
		*simRoot = *devRoot
	}
	if *simRoot != "" && *simulate == "" {
		return cli.Usagef(stderr, prog, "--sim-root applies to --simulate only")
	}
	opts := []cdi.Option{cdi.WithKind(*kind)}
	if *vol != "" {
		if !filepath.IsAbs(*vol) {
			return fail("nvcdi generate: --volume %q: not an absolute path", *vol)
		}
		if fi, err := os.Stat(*vol); err != nil || !fi.IsDir() {
			return fail("nvcdi generate: --volume %q: not a directory", *vol)
		}
		opts = append(opts, cdi.WithVolume(&volume.Volume{Path: *vol}))
	}
	var inv *node.Inventory
	var err error
	if *simulate == "" {
		if inv, err = nvmlnode.Discover(ctx); err != nil {
			return fail("nvcdi generate: %s", cli.ExplainDiscover(err))
		}
	} else {
		root := *simRoot
		if root == "" {
			root = filepath.Join(defaultSimRoot, *simulate)
		}
		if inv, err = simulated(ctx, *simulate, root); err != nil {
			if errors.Is(err, os.ErrPermission) && !cli.IsRoot() {
				return cli.NeedsRoot(stderr, prog, "to make the simulated node's device nodes", "run it as root")
			}
			return fail("nvcdi generate: %v", err)
		}
	}
	spec, err := cdi.New(inv, opts...)
	if err != nil {
		return fail("nvcdi generate: %v", err)
	}
	res, err := cdi.Writer{Dir: *dir}.Write(ctx, spec)
	if err != nil {
		return fail("nvcdi generate: %v", err)
	}
	state := "unchanged"
	if res.Changed {
		state = "written"
	}
	fmt.Fprintf(stderr, "nvcdi: %s %s\n", res.Path, state)
	for _, d := range spec.Devices {
		fmt.Fprintf(stdout, "%s=%s\n", spec.Kind, d.Name)
	}
	return cli.ExitOK
}

// simulated discovers the simulated node name whose host tree lives in
// root: made there on first use (root needed), read again afterwards, so
// that the spec's device nodes stay where it names them.
func simulated(ctx context.Context, name, root string) (*node.Inventory, error) {
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("--sim-root %q: not an absolute path: give an absolute one", root)
	}
	nd, err := cli.OpenSharedNode(ctx, name, root)
	if err != nil {
		return nil, err
	}
	return nd.Inventory, nil
}
