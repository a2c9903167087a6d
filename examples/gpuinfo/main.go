// Command gpuinfo prints what gpuiso sees on a node: its GPUs, their topology
// in `nvidia-smi topo -m` notation, the driver and CUDA versions, the
// driver's control devices, and the shares of GPUs that gpurun's runs hold.
//
//	gpuinfo [--simulate NAME [--driver-version V] [--sim-root DIR] | --nvml-library PATH] [--json]
//	        [--dev-root DIR] [--proc-root DIR] [--sys-root DIR] [--state-dir DIR]
//	gpuinfo --simulate NAME --sim-root DIR --inject SIGNAL|clear --gpu N [--mig GI/CI]
//	gpuinfo --health-table
//
// --dev-root, --proc-root and --sys-root name the directories discovery
// reads instead of /dev, /proc and /sys (--dev-root: the directory of the
// device nodes, as in every gpuiso program). --simulate alone shows a
// simulated node with device nodes of its own, made for the run (root
// needed; without root gpuinfo says so in one line and exits 125);
// --sim-root DIR shows the simulated node whose host tree gpuiso-runtime,
// nvcdi or an earlier gpuinfo made in DIR (--sim-root there too), made
// there if missing. A --dev-root that holds such a tree is refused, naming
// --sim-root.
//
// Shares are read from gpurun's state directory (--state-dir, default
// /var/lib/gpuiso/gpurun; not with --dev-root, --proc-root or --sys-root
// unless --state-dir is given): the MPS daemons of memory shares (owner,
// GPU, limits, daemon process) and, where gpurun keeps the allocator's
// state there (gpurun --state-dir), every share with its time slices. The
// section is left out when there is none, and from --json.
//
// --inject injects a health signal into GPU N (--gpu) of the simulated
// node whose host tree is in DIR, or into its MIG device at GPU instance
// GI and compute instance CI (--mig): "xid 79", "recovery-action 1",
// "row-remap-pending", "nvlink-down 2", "lost" (see node.ParseSignal);
// "clear" heals the GPU, as a reset would; "reset fail" makes the GPU's
// resets fail (a health monitor resetting it, nvmlnode.WithReset, then
// leaves it unhealthy for a reboot) and "reset ok" makes them succeed
// again. The fault lives in the host tree, so every program simulating that host (a kubelet plugin, gpurun)
// sees it. --health-table prints the health table: each signal, the state
// it gives (healthy, inform, unhealthy) and the action it asks for.
//
// On a node without a usable driver it exits 125 with one line naming the cause;
// --simulate runs on a simulated node instead (see package simnode for the
// shipped topologies).
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/cli"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

func main() {
	ctx, _, stop := cli.NotifyContext(context.Background())
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `usage: gpuinfo [--simulate NAME [--driver-version V] [--sim-root DIR] | --nvml-library PATH] [--json]
               [--dev-root DIR] [--proc-root DIR] [--sys-root DIR] [--state-dir DIR]
       gpuinfo --simulate NAME --sim-root DIR --inject SIGNAL|clear|'reset fail'|'reset ok' --gpu N [--mig GI/CI]
       gpuinfo --health-table

Print what gpuiso sees on this node (or a simulated one): its GPUs with their
UUIDs and MIG modes, the topology matrix in nvidia-smi topo -m notation, the
driver and CUDA versions, the control devices and MIG devices, and the
shares of GPUs gpurun's runs hold (owner, share, MPS daemon).

--inject breaks (or, with "clear", heals) a GPU of a simulated node's host
tree, for every program simulating it ("reset fail" makes its resets fail,
"reset ok" succeed); --health-table prints which state
and action each health signal gives.
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gpuinfo", flag.ContinueOnError)
	simulate := fs.String("simulate", "", "use the simulated node `NAME`: "+strings.Join(simnode.Names(), ", "))
	driverVersion := fs.String("driver-version", "", "simulated driver `VERSION` (default: the host's NVIDIA libraries', if any)")
	asJSON := fs.Bool("json", false, "print the inventory as JSON")
	devRoot := fs.String("dev-root", node.DefaultDevRoot, "`DIR` holding the device nodes")
	simRoot := fs.String("sim-root", "", "with --simulate: the simulated node's host tree in `DIR` (as gpuiso-runtime and nvcdi --sim-root make it), made there if missing")
	procRoot := fs.String("proc-root", node.DefaultProcRoot, "proc file system `DIR`")
	sysRoot := fs.String("sys-root", node.DefaultSysRoot, "sys file system `DIR`")
	library := fs.String("nvml-library", "", "`PATH` of libnvidia-ml.so.1 (default: the dynamic loader's search)")
	stateDir := fs.String("state-dir", defaultStateDir, "gpurun's state `DIR`, whose shares of GPUs are listed")
	inject := fs.String("inject", "", "with --simulate and --sim-root: inject health `SIGNAL` (\"xid 79\", \"recovery-action 1\", \"lost\", ...) into --gpu, \"clear\" to heal it, or \"reset fail\" or \"reset ok\" to make its resets fail or succeed")
	gpu := fs.Int("gpu", -1, "with --inject: the GPU's `INDEX`")
	mig := fs.String("mig", "", "with --inject: the MIG device of --gpu at `GI/CI` (GPU and compute instance ids)")
	healthTable := fs.Bool("health-table", false, "print the health table (signal, state, action) and exit")
	if code, done := cli.Parse(fs, args, usage, stdout, stderr); done {
		return code
	}
	set := cli.Set(fs)
	switch {
	case fs.NArg() > 0:
		return cli.Usagef(stderr, "gpuinfo", "unexpected arguments %q", fs.Args())
	case *healthTable && len(set) > 1:
		return cli.Usagef(stderr, "gpuinfo", "--health-table takes no other flag")
	case *healthTable:
		printHealthTable(stdout, node.DefaultHealthTable())
		return cli.ExitOK
	case (set["gpu"] || set["mig"]) && !set["inject"]:
		return cli.Usagef(stderr, "gpuinfo", "--gpu and --mig apply to --inject only")
	case set["inject"] && (*simulate == "" || *simRoot == ""):
		return cli.Usagef(stderr, "gpuinfo", "--inject needs --simulate NAME and --sim-root DIR: the simulated host whose GPU it breaks")
	case set["inject"] && !set["gpu"]:
		return cli.Usagef(stderr, "gpuinfo", "--inject needs --gpu INDEX")
	case *simulate != "" && *library != "":
		return cli.Usagef(stderr, "gpuinfo", "--nvml-library and --simulate exclude each other")
	case *driverVersion != "" && *simulate == "":
		return cli.Usagef(stderr, "gpuinfo", "--driver-version applies to --simulate only")
	case *simRoot != "" && *simulate == "":
		return cli.Usagef(stderr, "gpuinfo", "--sim-root applies to --simulate only")
	case *simRoot != "" && (set["dev-root"] || set["proc-root"] || set["sys-root"]):
		return cli.Usagef(stderr, "gpuinfo", "--sim-root and --dev-root, --proc-root or --sys-root exclude each other: the simulated host tree has its own")
	case *simRoot != "" && !filepath.IsAbs(*simRoot):
		return cli.Usagef(stderr, "gpuinfo", "--sim-root %q: want an absolute path", *simRoot)
	case set["dev-root"] && simnode.IsHostTree(*devRoot):
		return cli.Usagef(stderr, "gpuinfo", "--dev-root %s holds a simulated node's host tree, not device nodes: give it as --simulate NAME --sim-root %s", *devRoot, *devRoot)
	}

	var simOpts []simnode.Option
	if *driverVersion != "" {
		simOpts = append(simOpts, simnode.WithDriverVersion(*driverVersion))
	}
	if set["inject"] {
		return injectSignal(ctx, stdout, stderr, *simulate, *simRoot, *inject, *gpu, *mig, simOpts)
	}
	// A simulated node with no host paths given: as root, the same host tree
	// (device nodes, /proc/devices) its containers get from gpurun, so the
	// numbers shown are theirs.
	hostPaths := set["dev-root"] || set["proc-root"] || set["sys-root"]
	// Shares of a node described by other paths are not the default state
	// directory's.
	shareDir := ""
	if set["state-dir"] || !hostPaths {
		shareDir = *stateDir
	}
	show := func(stdout, stderr io.Writer, inv *node.Inventory, simulated string, asJSON bool, note string) int {
		code := show(stdout, stderr, inv, simulated, asJSON, note)
		if code == cli.ExitOK && !asJSON && shareDir != "" {
			printShares(ctx, stdout, inv, shareDir)
		}
		return code
	}
	if *simulate != "" && !hostPaths {
		if _, err := simnode.New(*simulate, simOpts...); errors.Is(err, simnode.ErrUnknownTopology) {
			return cli.Usagef(stderr, "gpuinfo", "--simulate: %v", err)
		}
		needsRoot := func() int {
			return cli.NeedsRoot(stderr, "gpuinfo", "to make the simulated node's device nodes",
				"run it as root, or add --dev-root DIR to show the node without its device nodes")
		}
		if *simRoot == "" && !cli.IsRoot() {
			return needsRoot()
		}
		var nd *cli.Node
		var err error
		if *simRoot != "" {
			nd, err = cli.OpenSharedNode(ctx, *simulate, *simRoot, simOpts...)
		} else {
			nd, err = cli.OpenNode(ctx, *simulate, simOpts...)
		}
		if err == nil {
			defer nd.Close()
			// Its device nodes as the containers see them, not in the
			// temporary tree that goes when gpuinfo ends.
			inv := nd.Inventory
			devPath := func(p *string) {
				if rel, err := filepath.Rel(nd.DevRoot, *p); *p != "" && err == nil && !strings.HasPrefix(rel, "..") {
					*p = filepath.Join(node.DefaultDevRoot, rel)
				}
			}
			for i := range inv.ControlDevices {
				devPath(&inv.ControlDevices[i].Path)
			}
			for i := range inv.Devices {
				d := &inv.Devices[i]
				devPath(&d.Node.Path)
				for j := range d.MIGDevices {
					devPath(&d.MIGDevices[j].GIAccess.Path)
					devPath(&d.MIGDevices[j].CIAccess.Path)
				}
			}
			return show(stdout, stderr, nd.Inventory, *simulate, *asJSON, "")
		}
		if errors.Is(err, os.ErrPermission) && !cli.IsRoot() {
			return needsRoot()
		}
		return cli.Errorf(stderr, "gpuinfo", "%v", err)
	}

	opts := []nvmlnode.Option{nvmlnode.WithDevRoot(*devRoot), nvmlnode.WithProcRoot(*procRoot), nvmlnode.WithSysRoot(*sysRoot)}
	if *simulate != "" {
		node, err := simnode.New(*simulate, simOpts...)
		if err != nil {
			return cli.Usagef(stderr, "gpuinfo", "--simulate: %v", err)
		}
		opts = append(opts, nvmlnode.WithNVML(node.NVML()))
	}
	if *library != "" {
		if err := nvmlnode.CheckLibrary(*library); err != nil {
			return cli.Errorf(stderr, "gpuinfo", "%s", cli.ExplainDiscover(err))
		}
		opts = append(opts, nvmlnode.WithNVML(nvml.New(nvml.WithLibraryPath(*library))))
	}
	inv, err := nvmlnode.Discover(ctx, opts...)
	if err != nil {
		return cli.Errorf(stderr, "gpuinfo", "%s", cli.ExplainDiscover(err))
	}
	return show(stdout, stderr, inv, *simulate, *asJSON, "")
}

func show(stdout, stderr io.Writer, inv *node.Inventory, simulated string, asJSON bool, note string) int {
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(inv); err != nil {
			return cli.Errorf(stderr, "gpuinfo", "%v", err)
		}
		return cli.ExitOK
	}
	printInventory(stdout, inv, simulated, note)
	return cli.ExitOK
}

func printInventory(w io.Writer, inv *node.Inventory, simulated, note string) {
	fmt.Fprintf(w, "Driver %s, CUDA %s", inv.DriverVersion, or(inv.CUDAVersion.String(), "unknown"))
	if simulated != "" {
		fmt.Fprintf(w, " (simulated node %s)", simulated)
	}
	fmt.Fprintf(w, ", %d GPUs\n\n", len(inv.Devices))

	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GPU\tUUID\tMINOR\tBUS ID\tMODEL\tMEMORY\tNUMA\tMIG\tHEALTH")
	for _, d := range inv.Devices {
		minor, numa, mem := "-", "-", "-"
		if d.Minor >= 0 {
			minor = fmt.Sprint(d.Minor)
		}
		if d.NUMANode >= 0 {
			numa = fmt.Sprint(d.NUMANode)
		}
		if d.MemoryBytes > 0 {
			mem = fmt.Sprintf("%d MiB", d.MemoryBytes>>20)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Index, or(d.UUID, "-"), minor, or(d.BusID, "-"), or(d.Model, "-"), mem, numa, migMode(d.MIG), d.Health)
	}
	tw.Flush()
	printMIG(w, inv)

	if len(inv.Devices) > 1 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprint(tw, "\t")
		for i := range inv.Devices {
			fmt.Fprintf(tw, "GPU%d\t", i)
		}
		fmt.Fprintln(tw, "NUMA")
		for i, d := range inv.Devices {
			fmt.Fprintf(tw, "GPU%d\t", i)
			for j := range inv.Devices {
				fmt.Fprintf(tw, "%s\t", cell(inv.Topology, i, j))
			}
			numa := "-"
			if d.NUMANode >= 0 {
				numa = fmt.Sprint(d.NUMANode)
			}
			fmt.Fprintln(tw, numa)
		}
		tw.Flush()
		fmt.Fprint(w, legend)
	}

	fmt.Fprintln(w, "\nControl devices:")
	switch {
	case note != "":
		fmt.Fprintln(w, "  "+note)
	case len(inv.ControlDevices) == 0:
		fmt.Fprintln(w, "  none found")
	}
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, c := range inv.ControlDevices {
		fmt.Fprintf(tw, "  %s\t%d:%d\t%s\n", c.Name, c.Major, c.Minor, c.Path)
	}
	tw.Flush()
	if len(inv.Warnings) > 0 {
		fmt.Fprintln(w, "\nWarnings:")
		for _, s := range inv.Warnings {
			fmt.Fprintln(w, "  "+s)
		}
	}
}

// defaultStateDir is gpurun's state directory without --state-dir.
const defaultStateDir = "/var/lib/gpuiso/gpurun"

// printShares lists the shares of inv's GPUs recorded in gpurun's state
// directory dir: the allocator's (when gpurun keeps it there), and the MPS
// daemons of memory shares, merged by owner. Nothing when there is none.
func printShares(ctx context.Context, w io.Writer, inv *node.Inventory, dir string) {
	type row struct {
		gpu    int
		owner  string
		share  string
		daemon string
	}
	rows := map[string]*row{}
	index := map[string]int{}
	for _, d := range inv.Devices {
		index[d.UUID] = d.Index
	}
	if _, err := os.Stat(filepath.Join(dir, allocator.StateFile)); err == nil {
		if a, err := allocator.New(inv, allocator.WithStateDir(dir)); err == nil {
			for _, al := range a.Allocations() {
				if al.Share != nil && len(al.Devices) == 1 {
					r := &row{gpu: al.Devices[0].Index, owner: al.Owner, share: al.Share.String(), daemon: "-"}
					if al.Share.Mode == allocator.ShareTime {
						r.daemon = "nothing: time slices isolate nothing"
					}
					rows[al.Owner] = r
				}
			}
			a.Close()
		}
	}
	daemons, _ := mps.Daemons(ctx, filepath.Join(dir, "mps"))
	for _, d := range daemons {
		i, ok := index[d.GPU]
		if !ok {
			continue // another node's
		}
		r := rows[d.Owner]
		if r == nil {
			s := allocator.Share{Mode: allocator.ShareMemory, MemoryBytes: d.Limits.MemoryBytes, ComputePercent: d.Limits.ComputePercent}
			r = &row{gpu: i, owner: d.Owner, share: s.String()}
			rows[d.Owner] = r
		}
		state := "running"
		if !d.Alive {
			state = "not running"
		}
		r.daemon = fmt.Sprintf("MPS daemon %d (%s), %s", d.Pid, state, d.PipeDir)
	}
	if len(rows) == 0 {
		return
	}
	list := slices.Collect(maps.Values(rows))
	slices.SortFunc(list, func(a, b *row) int { return cmp.Or(cmp.Compare(a.gpu, b.gpu), strings.Compare(a.owner, b.owner)) })
	fmt.Fprintf(w, "\nShares (%s):\n", dir)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  GPU\tOWNER\tSHARE\tENFORCED BY")
	for _, r := range list {
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\n", r.gpu, r.owner, r.share, r.daemon)
	}
	tw.Flush()
}

// printMIG lists the MIG devices of every GPU with MIG enabled, under a
// line naming the GPU, and the profile table of the MIG-capable GPUs.
func printMIG(w io.Writer, inv *node.Inventory) {
	for _, d := range inv.Devices {
		if !d.MIGSplit() {
			continue
		}
		fmt.Fprintf(w, "\nGPU %d (%s): MIG enabled, %d MIG devices\n", d.Index, or(d.UUID, "-"), len(d.MIGDevices))
		if len(d.MIGDevices) == 0 {
			continue
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  GI\tCI\tPROFILE\tMEMORY\tSMS\tPLACEMENT\tUUID\tCAPS (GI, CI)")
		for _, m := range d.MIGDevices {
			caps := "-"
			if m.GIAccess.Path != "" && m.CIAccess.Path != "" {
				caps = fmt.Sprintf("%d:%d, %d:%d", m.GIAccess.Major, m.GIAccess.Minor, m.CIAccess.Major, m.CIAccess.Minor)
			}
			fmt.Fprintf(tw, "  %d\t%d\t%s\t%d MiB\t%d\t%s\t%s\t%s\n", m.GI, m.CI, or(m.Profile, "-"), m.MemoryBytes>>20, m.SMs, m.Placement, m.UUID, caps)
		}
		tw.Flush()
	}
	// The profile table, once per distinct table.
	var shown [][]node.MIGProfile
	for _, d := range inv.Devices {
		if len(d.MIGProfiles) == 0 || slices.ContainsFunc(shown, func(t []node.MIGProfile) bool { return sameProfiles(t, d.MIGProfiles) }) {
			continue
		}
		shown = append(shown, d.MIGProfiles)
		fmt.Fprintf(w, "\nMIG profiles of %s:\n", or(d.Model, "GPU "+fmt.Sprint(d.Index)))
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  PROFILE\tID\tCOUNT\tSMS\tMEMORY\tPLACEMENTS")
		for _, p := range d.MIGProfiles {
			var pl []string
			for _, x := range p.Placements {
				pl = append(pl, x.String())
			}
			fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%d MiB\t%s\n", p.Name, p.ID, p.Count, p.SMs, p.MemoryBytes>>20, strings.Join(pl, " "))
		}
		tw.Flush()
	}
}

func sameProfiles(a, b []node.MIGProfile) bool {
	return slices.EqualFunc(a, b, func(x, y node.MIGProfile) bool {
		return x.Name == y.Name && x.ID == y.ID && x.Count == y.Count && x.MemoryBytes == y.MemoryBytes && slices.Equal(x.Placements, y.Placements)
	})
}

// cell is one entry of the topology matrix: NV<n> where NVLinks join the
// pair, else the PCIe level.
func cell(t *node.Topology, i, j int) string {
	if i == j {
		return "X"
	}
	l := t.Link(i, j)
	if l.NVLinks > 0 {
		return fmt.Sprintf("NV%d", l.NVLinks)
	}
	return l.PCIe.Abbrev()
}

const legend = `
Legend:
  X    = the GPU itself
  NV#  = joined by # NVLinks (directly or through NVSwitches)
  PSB  = on the same board
  PIX  = through one PCIe switch
  PXB  = through several PCIe switches, not the host bridge
  PHB  = through a PCIe host bridge
  NODE = between host bridges of one NUMA node
  SYS  = across NUMA nodes (the SMP interconnect)
  ?    = unknown (a GPU NVML cannot read)
`

// migMode is a GPU's MIG mode as nvidia-smi's MIG M. column has it.
func migMode(m node.MIGMode) string {
	switch m {
	case node.MIGEnabled:
		return "Enabled"
	case node.MIGDisabled:
		return "Disabled"
	}
	return "N/A"
}

func or(s, fallback string) string {
	if s == "" {
		return fallback
	}
	return s
}

// printHealthTable prints the rules of t in effect: signal (and value),
// state, action and what the signal means.
func printHealthTable(w io.Writer, t node.HealthTable) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SIGNAL\tSTATE\tACTION\tMEANING")
	for _, r := range t.Rules() {
		sig := r.Kind.String()
		switch {
		case r.Any:
			sig += " *"
		case r.Kind == node.SignalXID || r.Kind == node.SignalRecoveryAction:
			sig += fmt.Sprintf(" %d", r.Value)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", sig, r.State, r.Action, r.Reason)
	}
	tw.Flush()
}

// injectSignal injects signal (or "clear") into GPU gpu, or its MIG device
// mig ("GI/CI"), of the simulated node name whose host tree is in root.
func injectSignal(ctx context.Context, stdout, stderr io.Writer, name, root, signal string, gpu int, mig string, opts []simnode.Option) int {
	clear := strings.EqualFold(strings.TrimSpace(signal), "clear")
	resetMode, failResets := "", false
	if f := strings.Fields(strings.ToLower(signal)); len(f) == 2 && f[0] == "reset" {
		switch f[1] {
		case "fail", "ok":
			resetMode, failResets = f[1], f[1] == "fail"
		default:
			return cli.Usagef(stderr, "gpuinfo", "--inject %q: want \"reset fail\" or \"reset ok\"", signal)
		}
	}
	var s node.Signal
	if !clear && resetMode == "" {
		var err error
		if s, err = node.ParseSignal(signal); err != nil {
			return cli.Usagef(stderr, "gpuinfo", "--inject: %v", err)
		}
	}
	gi, ci := -1, -1
	if mig != "" {
		if clear || resetMode != "" {
			return cli.Usagef(stderr, "gpuinfo", "--inject %s is about a whole GPU: no --mig", strings.TrimSpace(signal))
		}
		if _, err := fmt.Sscanf(mig, "%d/%d", &gi, &ci); err != nil || gi < 0 || ci < 0 || fmt.Sprintf("%d/%d", gi, ci) != mig {
			return cli.Usagef(stderr, "gpuinfo", "--mig %q: want GI/CI, two instance ids", mig)
		}
	}
	sim, err := simnode.New(name, opts...)
	if err != nil {
		return cli.Usagef(stderr, "gpuinfo", "--simulate: %v", err)
	}
	if gpu < 0 || gpu >= sim.Len() {
		return cli.Usagef(stderr, "gpuinfo", "--gpu %d: simulated %s has GPUs 0 to %d", gpu, name, sim.Len()-1)
	}
	if !cli.IsRoot() {
		return cli.NeedsRoot(stderr, "gpuinfo", "to open the simulated node's host tree", "run it as root")
	}
	host, err := sim.OpenHost(ctx, root)
	if err == nil {
		err = sim.ShareFaults(host)
	}
	if err == nil {
		err = sim.RestoreMIG(host)
	}
	if err != nil {
		return cli.Errorf(stderr, "gpuinfo", "simulated node %s: %v", name, err)
	}
	what := fmt.Sprintf("GPU %d", gpu)
	switch {
	case clear:
		err = sim.Clear(gpu)
	case resetMode != "":
		err = sim.FailResets(gpu, failResets)
	case mig != "":
		what = fmt.Sprintf("MIG device %s of GPU %d", mig, gpu)
		err = sim.InjectMIG(gpu, gi, ci, s)
	default:
		err = sim.Inject(gpu, s)
	}
	if err != nil {
		return cli.Errorf(stderr, "gpuinfo", "%v", err)
	}
	if clear {
		fmt.Fprintf(stdout, "cleared %s of simulated %s in %s\n", what, name, root)
		return cli.ExitOK
	}
	if resetMode != "" {
		outcome := "succeed"
		if failResets {
			outcome = "fail"
		}
		fmt.Fprintf(stdout, "resets of %s of simulated %s in %s now %s\n", what, name, root, outcome)
		return cli.ExitOK
	}
	v := node.DefaultHealthTable().Classify(s)
	fmt.Fprintf(stdout, "injected %s into %s of simulated %s in %s (%s, %s)\n", s, what, name, root, v.State, v.Action)
	return cli.ExitOK
}
