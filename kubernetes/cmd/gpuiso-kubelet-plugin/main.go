// Command gpuiso-kubelet-plugin serves a node's NVIDIA GPUs to Kubernetes,
// as a device plugin and as a DRA driver in one process:
//
//	gpuiso-kubelet-plugin [--node-name NAME] [--kubeconfig FILE]
//	        [--cdi-dir DIR] [--state-dir DIR]
//	        [--kubelet-plugins-dir DIR] [--kubelet-registry-dir DIR]
//	        [--device-plugin-dir DIR] [--driver-name NAME] [--resource-name NAME]
//	        [--device-plugin[=false]] [--dra=false] [--device-specs]
//	        [--extended-resource-name NAME] [--health-taints=false] [--dynamic-mig]
//	        [--health-period D] [--health-rules FILE] [--gpu-reset]
//	        [--simulate NAME --dev-root DIR]
//	        [--in-cluster] [--simulate-label KEY] [--driver-root DIR]
//	        [--daemonset NAMESPACE/NAME] [--metrics-address ADDR]
//	        [--device-metadata=false] [--rolling-update-uid UID] [--ready-file FILE]
//	gpuiso-kubelet-plugin --is-ready FILE
//	        [--nri-policy none|numa [--nri-socket SOCKET]]
//	        [--shared-gpus LIST [--share-min SIZE] [--share-step SIZE]
//	         [--time-slices N] [--shared-resource-name NAME]
//	         [--device-plugin-sharing time-slicing|mps]
//	         [--pod-resources-socket PATH] [--mps-control PATH]
//	         [--mps-driver-root DIR] [--mps-mount-namespace runtime|PATH]
//	         [--mps-namespace-driver-root DIR] [--mps-cgroup-parent auto|PATH]
//	         [--mps-cgroup-root DIR] [--mps-shm-size SIZE] [--mps-plain-dirs]]
//
// It discovers the node's GPUs through NVML (or simulates a node: --simulate
// with a host tree under --dev-root), writes the node's CDI spec, registers
// the device plugin (nvidia.com/gpu and one resource per MIG profile) with
// the kubelet and, given --kubeconfig, starts the DRA kubelet plugin (which
// publishes the node's ResourceSlice) and labels the Node. It watches the
// GPUs' health. Given credentials, it serves through DRA only unless
// --device-plugin asks for the device plugin too: the DRA driver's
// DeviceClass serves pods' resources.limits of nvidia.com/gpu
// (--extended-resource-name), and one name served from both sides is
// refused at start. A GPU found lost turns Unhealthy in ListAndWatch; in the
// slice it carries a taint (NoExecute for a lost GPU: the cluster evicts
// its pods; --health-taints=false leaves it out instead), and the kubelet's
// health stream reports it Unhealthy in its pods' status. Every
// --health-period it reads the GPUs' other health signals (the driver's
// recovery action, remapped rows, retired pages, NVLinks, PCIe replays,
// slowdowns); the health table (node.DefaultHealthTable, with the rules of
// --health-rules, one a line, after it) says which make a GPU unhealthy
// and which only inform (XID 94: restart the application; logged, the GPU
// stays in service). A GPU whose signals clear is healthy again on its
// own within two health periods: its taint goes, ListAndWatch and the
// health stream say Healthy. With --gpu-reset, a GPU whose signals ask
// for a reset (XID 109, 119, a recovery action GPU_RESET, ...) is reset
// instead (nvmlnode.WithReset, through nvidia-smi --gpu-reset found in
// PATH): its taint is NoExecute, so that the cluster evicts the pods of
// its claims; once nothing holds it, it is reset and, its signals clear,
// published untainted, or, the reset failed, kept unhealthy (action
// reboot, NoExecute). Other GPUs and their pods are not touched. With
// --simulate, faults injected into the host tree (gpuinfo --inject) are
// the simulated driver's, and a reset is the simulated node's (gpuinfo
// --inject 'reset fail' makes it fail). It runs until SIGINT or SIGTERM.
//
// The GPUs --shared-gpus names are handed out in parts, never whole: the
// DRA driver publishes each as memory shares (consumable memory capacity;
// each prepared claim gets an MPS control daemon of its own, recorded under
// the state directory, which outlives the program and is found again when
// it restarts; in a pod, --mps-mount-namespace and --mps-cgroup-parent
// keep it outside the pod's mounts and cgroup, so that it outlives the pod
// too), or, as a claim's configuration asks, as time slices (at most
// --time-slices per GPU, no daemon) or concurrent slices (one MPS daemon
// per GPU, shared by its slices); the device plugin serves each as
// --time-slices replicas under --shared-resource-name: time slices (no
// isolation between the pods of a GPU), or, with
// --device-plugin-sharing=mps, concurrent slices (one MPS daemon per GPU,
// recorded under the state directory's mps-deviceplugin, holds each pod's
// processes to 1/N of the GPU; a restart keeps the daemons of the slices
// pods still hold and stops the others).
//
// With --dynamic-mig (DRA only), every GPU with MIG enabled is partitioned
// on demand: the slice publishes its memory and compute slices as counters
// and every MIG profile placement, and the GPU whole, as devices that
// consume them; a claim's MIG device is made when the claim is prepared
// and destroyed when it is unprepared (see package dra).
//
// Each container of a claim finds its devices described (uuid, index, PCI
// bus id, NUMA node, MIG profile, share limits, ...) in its device
// metadata file (--device-metadata). With --nri-policy numa, the program
// also serves the container runtime's NRI (containerd 2, CRI-O): every
// container holding the node's GPUs is put on the CPUs and memory nodes of
// its GPUs' NUMA nodes before it starts (see package nri). With
// --rolling-update-uid (a DaemonSet rolling with a surge), it serves beside
// the instance it replaces, both on the node's one state.
//
// Run as a DaemonSet (the chart in kubernetes/deploy), it uses its service
// account (--in-cluster), loads NVML from the driver root mounted in the
// pod (--driver-root), serves nothing on a node without a GPU, and, told
// its DaemonSet (--daemonset), removes what it left on the node when it
// stops because the DaemonSet is gone (an uninstall), not when it is
// rolled or restarted.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/utils/ptr"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/isolator/cdi"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/kubernetes/deviceplugin"
	"github.com/gpuiso/gpuiso/kubernetes/dra"
	"github.com/gpuiso/gpuiso/kubernetes/internal/unixsock"
	"github.com/gpuiso/gpuiso/kubernetes/labels"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}

// flags are the command line.
type flags struct {
	nodeName, kubeconfig, cdiDir, stateDir      string
	pluginsDir, registryDir, devicePluginDir    string
	driverName, resourceName, simulate, devRoot string
	devicePlugin, dra, deviceSpecs              bool
	extendedResource                            string
	refresh                                     time.Duration
	healthTaints, deviceMetadata                bool
	healthPeriod                                time.Duration
	healthTable                                 node.HealthTable
	gpuReset                                    bool
	resetter                                    node.Resetter
	deploy                                      deployFlags
	share                                       shareFlags
	mig                                         migFlags
	nri                                         nriFlags
}

func parse(args []string, stderr io.Writer) (*flags, int, bool) {
	f := &flags{}
	fs := flag.NewFlagSet("gpuiso-kubelet-plugin", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	host, _ := os.Hostname()
	if n := os.Getenv("NODE_NAME"); n != "" {
		host = n
	}
	fs.StringVar(&f.nodeName, "node-name", host, "the Node's name (default $NODE_NAME, else the host name)")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig of the node's credentials; without it neither the DRA driver nor the labels run")
	fs.StringVar(&f.cdiDir, "cdi-dir", cdi.DefaultDir, "CDI spec directory the container runtime reads")
	fs.StringVar(&f.stateDir, "state-dir", "/var/lib/gpuiso-kubelet-plugin", "the allocator's state and one checkpoint per prepared claim")
	fs.StringVar(&f.pluginsDir, "kubelet-plugins-dir", "/var/lib/kubelet/plugins", "the kubelet's DRA plugin directory (the driver's socket goes in <dir>/<driver-name>)")
	fs.StringVar(&f.registryDir, "kubelet-registry-dir", "/var/lib/kubelet/plugins_registry", "the kubelet's plugin registration directory")
	fs.StringVar(&f.devicePluginDir, "device-plugin-dir", "/var/lib/kubelet/device-plugins", "the kubelet's device-plugin directory (kubelet.sock)")
	fs.StringVar(&f.driverName, "driver-name", dra.DefaultDriverName, "the DRA driver's name")
	fs.StringVar(&f.resourceName, "resource-name", "nvidia.com/gpu", "the device plugin's resource for whole GPUs")
	fs.StringVar(&f.simulate, "simulate", "", "simulate a node: "+strings.Join(simnode.Names(), ", "))
	fs.StringVar(&f.devRoot, "dev-root", "", "the device-node directory (default /dev); with --simulate, the old spelling of --sim-root")
	simRoot := fs.String("sim-root", "", "with --simulate: the directory of the simulated host tree (made when missing, reused otherwise; root must own it and every parent, none writable by others)")
	fs.BoolVar(&f.devicePlugin, "device-plugin", true, "serve the device plugin (default false with credentials and the DRA driver: DRA serves --extended-resource-name)")
	fs.BoolVar(&f.dra, "dra", true, "serve the DRA driver (needs --kubeconfig)")
	fs.BoolVar(&f.deviceSpecs, "device-specs", false, "device plugin: answer Allocate with device nodes too, for runtimes without CDI")
	fs.DurationVar(&f.refresh, "health-refresh", 30*time.Second, "how often to read health from the allocator's state again (GPUs marked healthy or unhealthy by others)")
	fs.DurationVar(&f.healthPeriod, "health-period", nvmlnode.DefaultHealthPeriod, "how often to read the GPUs' polled health signals (a GPU whose signals clear is healthy again within two)")
	healthRules := fs.String("health-rules", "", "a `FILE` of health rules, one a line (\"xid 94 unhealthy drain\"; see gpuinfo --health-table), over the default table")
	fs.BoolVar(&f.gpuReset, "gpu-reset", false, "reset a GPU whose health signals ask for a reset once nothing holds it (DRA: its taint is NoExecute, so that its claims' pods are evicted); a failed reset leaves it unhealthy, for a reboot")
	fs.BoolVar(&f.healthTaints, "health-taints", true, "DRA: publish an unhealthy device with a taint (<driver-name>/unhealthy); false leaves it out of the slice, for a cluster without device taints")
	fs.BoolVar(&f.deviceMetadata, "device-metadata", true, "DRA: give each container of a claim a file describing its devices (uuid, index, PCI bus id, NUMA node, MIG profile, share limits, ...) at /var/run/kubernetes.io/dra-device-attributes/<claim>/<request>/metadata.json, through a CDI spec in --cdi-dir")
	f.deploy.register(fs)
	f.share.register(fs)
	f.mig.register(fs)
	f.nri.register(fs)
	f.registerExtendedResource(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stderr)
			fs.PrintDefaults()
			return nil, 0, true
		}
		fmt.Fprintf(stderr, "gpuiso-kubelet-plugin: %v (see --help)\n", err)
		return nil, 2, true
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "gpuiso-kubelet-plugin: unexpected arguments %q\n", fs.Args())
		return nil, 2, true
	}
	if *simRoot != "" {
		if f.devRoot != "" && f.devRoot != *simRoot {
			fmt.Fprintln(stderr, "gpuiso-kubelet-plugin: --sim-root and --dev-root name different directories: give the simulated host tree as --sim-root alone (see --help)")
			return nil, 2, true
		}
		// A simulated node's device nodes are those of its tree.
		f.devRoot = *simRoot
	}
	if f.simulate != "" && f.devRoot == "" {
		fmt.Fprintln(stderr, "gpuiso-kubelet-plugin: --simulate needs --sim-root DIR for the simulated host tree")
		return nil, 2, true
	}
	if f.nodeName == "" {
		fmt.Fprintln(stderr, "gpuiso-kubelet-plugin: --node-name is empty")
		return nil, 2, true
	}
	if f.healthPeriod <= 0 {
		fmt.Fprintln(stderr, "gpuiso-kubelet-plugin: --health-period must be positive")
		return nil, 2, true
	}
	f.healthTable = node.DefaultHealthTable()
	if *healthRules != "" {
		b, err := os.ReadFile(*healthRules)
		var rules node.HealthTable
		if err == nil {
			rules, err = node.ParseHealthRules(string(b))
		}
		if err == nil {
			f.healthTable = append(f.healthTable, rules...)
			err = f.healthTable.Validate()
		}
		if err != nil {
			fmt.Fprintf(stderr, "gpuiso-kubelet-plugin: --health-rules: %v\n", err)
			return nil, 2, true
		}
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if why := f.resolveServing(set); why != "" {
		fmt.Fprintln(stderr, "gpuiso-kubelet-plugin: "+why)
		return nil, 2, true
	}
	if !f.devicePlugin && !f.dra {
		fmt.Fprintln(stderr, "gpuiso-kubelet-plugin: --device-plugin=false and --dra=false leave nothing to serve")
		return nil, 2, true
	}
	if why := f.deploy.check(f); why != "" {
		fmt.Fprintln(stderr, "gpuiso-kubelet-plugin: "+why)
		return nil, 2, true
	}
	if why := f.share.check(); why != "" {
		fmt.Fprintln(stderr, "gpuiso-kubelet-plugin: "+why)
		return nil, 2, true
	}
	if why := f.mig.check(f); why != "" {
		fmt.Fprintln(stderr, "gpuiso-kubelet-plugin: "+why)
		return nil, 2, true
	}
	if why := f.nri.check(); why != "" {
		fmt.Fprintln(stderr, "gpuiso-kubelet-plugin: "+why)
		return nil, 2, true
	}
	return f, 0, false
}

func run(ctx context.Context, args []string, stderr io.Writer) int {
	f, code, done := parse(args, stderr)
	if done {
		return code
	}
	if f.deploy.isReady != "" {
		return isReady(f.deploy.isReady, stderr)
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	if err := serve(ctx, f, log); err != nil && !errors.Is(err, context.Canceled) {
		log.Error("exiting", "err", err)
		return 1
	}
	afterExit(f, log)
	return 0
}

// openNode discovers the node, real or simulated, and returns the NVML
// library the health monitor watches and the sys root for PCIe roots.
func openNode(ctx context.Context, f *flags) (*node.Inventory, nvml.Interface, string, error) {
	if f.simulate == "" {
		lib, err := f.nvmlLibrary(ctx)
		if err != nil {
			return nil, nil, "", err
		}
		opts := []nvmlnode.Option{nvmlnode.WithNVML(lib)}
		if f.devRoot != "" {
			opts = append(opts, nvmlnode.WithDevRoot(f.devRoot))
		}
		inv, err := nvmlnode.Discover(ctx, opts...)
		f.resetter = nvmlnode.SMIResetter{}
		if err == nil && f.mig.dynamic {
			f.mig.manager, err = nvmlnode.NewMIGManager(opts...)
			f.mig.destroyer = nvmlPlacements{lib: lib}
		}
		return inv, lib, node.DefaultSysRoot, err
	}
	sim, err := simnode.New(f.simulate)
	if err != nil {
		return nil, nil, "", err
	}
	root, err := filepath.Abs(f.devRoot)
	if err != nil {
		return nil, nil, "", err
	}
	// A first start makes the tree; a restart reuses it (its /proc/devices
	// names the majors it was made with). Either way it is checked: only
	// in a directory no other user may write, read in-root.
	host, err := sim.OpenHost(ctx, root)
	if err != nil {
		return nil, nil, "", fmt.Errorf("simulated host (needs root): %w", err)
	}
	// Faults injected into the tree (gpuinfo --inject) are the simulated
	// driver's.
	if err := sim.ShareFaults(host); err != nil {
		return nil, nil, "", err
	}
	if err := f.mig.simulated(sim, host); err != nil {
		return nil, nil, "", err
	}
	inv, err := nvmlnode.Discover(ctx, sim.DiscoverOptions(host)...)
	f.resetter = sim // resets in the tree, as gpuinfo --inject sees them
	return inv, sim.NVML(), host.SysRoot, err
}

func serve(ctx context.Context, f *flags, log *slog.Logger) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	client, err := f.client()
	if err != nil {
		return err
	}
	if client != nil {
		if err := f.resolveSimulate(ctx, client); err != nil {
			return err
		}
	}
	inv, lib, sysRoot, err := openNode(ctx, f)
	if err == nil && len(inv.Devices) == 0 {
		err = errors.New("no GPU")
	}
	if err != nil && f.simulate == "" && f.deploy.daemonSet != "" {
		// A DaemonSet lands on every node it selects, GPU or not.
		log.Error("no GPU to serve on this node: serving nothing", "err", err)
		<-ctx.Done()
		return ctx.Err()
	}
	if err != nil {
		return fmt.Errorf("discover the node's GPUs: %w", err)
	}
	if err := f.nri.start(ctx, inv, sysRoot, log); err != nil {
		return err
	}
	allocDir := filepath.Join(f.stateDir, "allocator")
	for _, d := range []string{allocDir, f.cdiDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	shared, err := sharedUUIDs(inv, f.share.sharedGPUs)
	if err != nil {
		return err
	}
	alloc, err := allocator.New(inv, append(f.mig.options(), allocator.WithStateDir(allocDir), allocator.WithLogger(log),
		allocator.WithShared(shared...), allocator.WithTimeSlices(f.share.timeSlices))...)
	if err != nil {
		return err
	}
	defer alloc.Close()
	log.Info("node", "gpus", len(inv.Devices), "driver", inv.DriverVersion, "simulated", f.simulate, "shared", shared)

	writeSpec := func() {
		cur := inv.Clone()
		cur.Devices = alloc.Devices()
		spec, err := cdi.New(cur)
		if err == nil {
			_, err = cdi.Writer{Dir: f.cdiDir}.Write(ctx, spec)
		}
		if err != nil {
			log.Warn("node CDI spec", "err", err)
		}
	}
	writeSpec()

	// The device plugin's concurrent slices have MPS daemons of their
	// own directory, which Adopt sweeps by the slices held;
	// closed after the device plugin's Run has returned (deferred first).
	sliceDaemons, err := f.deviceSlicesMPS(shared)
	if err != nil {
		return fmt.Errorf("device plugin: concurrent slices: %w", err)
	}
	var dpMPS deviceplugin.SliceDaemons
	if sliceDaemons != nil {
		defer sliceDaemons.Close()
		dpMPS = sliceDaemons
	}
	// The device plugin's Run removes its sockets before it returns: serve
	// waits for it.
	errc := make(chan error, 1)
	var dpDone <-chan error
	defer func() {
		cancel()
		if dpDone != nil {
			<-dpDone
		}
	}()
	var refreshers []func()
	// The DRA driver's slice taints the devices the device plugin holds
	// (dra.HeldTaint): it is published again the moment they change, so
	// that the scheduler gives no claim a device a pod has just got.
	var republish atomic.Pointer[func()]
	dpConfig := deviceplugin.Config{
		ResourceName: f.resourceName, Dir: f.devicePluginDir, DeviceSpecs: f.deviceSpecs, Logger: log,
		Shared: shared, Replicas: f.share.timeSlices, SharedResourceName: f.share.sharedResource, PodResources: f.share.podResources,
		Strategy: f.share.dpStrategy(), MPS: dpMPS,
		HeldChanged: func() {
			if p := republish.Load(); p != nil {
				(*p)()
			}
		},
	}
	if !f.devicePlugin && client != nil && f.dra {
		// The device plugin is off, but one may have run here before: the
		// GPUs it handed out to pods that still run stay held until those
		// pods end, so that no claim takes them meanwhile.
		m, err := deviceplugin.New(inv, alloc, dpConfig)
		if err != nil {
			return err
		}
		if held, err := m.Adopt(ctx); err != nil {
			log.Warn("devices of pods the device plugin served", "err", err)
		} else if len(held) > 0 {
			log.Info("the device plugin is off: holding the devices its pods still run on", "owners", held)
		}
		refreshers = append(refreshers, func() {
			if _, err := m.Reconcile(ctx); err != nil {
				log.Warn("devices of pods the device plugin served", "err", err)
			}
		})
	}
	if f.devicePlugin {
		m, err := deviceplugin.New(inv, alloc, dpConfig)
		if err != nil {
			return err
		}
		// What the kubelet's pods hold of it already (handed out by an
		// earlier run, or a version that did not hold whole GPUs) is held
		// before a claim can take it.
		if _, err := m.Adopt(ctx); err != nil {
			log.Warn("device plugin: devices of running pods", "err", err)
		}
		done := make(chan error, 1)
		dpDone = done
		go func() {
			err := m.Run(ctx)
			errc <- err
			done <- err
		}()
		refreshers = append(refreshers, func() {
			if _, err := m.Refresh(); err != nil {
				log.Warn("device plugin refresh", "err", err)
			}
			// Devices and time slices whose pods ended go back to the
			// allocator.
			if _, err := m.Reconcile(ctx); err != nil {
				log.Warn("device plugin: devices of ended pods", "err", err)
			}
		})
	}
	var prepared func() int
	ops := newDRAMetrics()
	if client != nil {
		if want, err := labels.Labels(inv); err != nil {
			log.Warn("node labels", "err", err)
		} else if changed, err := labels.Apply(ctx, client, f.nodeName, want); err != nil {
			log.Warn("node labels", "err", err)
		} else if len(changed) > 0 {
			log.Info("node labels", "changed", changed)
		}
		if f.dra {
			publish, count, stop, err := startDRA(ctx, f, inv, alloc, shared, client, sysRoot, ops, log)
			if err != nil {
				return err
			}
			defer stop()
			refreshers = append(refreshers, publish)
			republish.Store(&publish)
			prepared = count
		}
	} else if f.dra {
		log.Info("no --kubeconfig: the DRA driver and node labels are off")
	}
	if f.deploy.metricsAddr != "" {
		if prepared == nil {
			ops = nil // no DRA driver: no operations to count
		}
		reg, err := metricsRegistry(alloc, prepared, ops)
		if err != nil {
			return err
		}
		if err := serveMetrics(ctx, f.deploy.metricsAddr, metricsHandler(reg), f.deploy.rollingUID != "", log); err != nil {
			return err
		}
	}

	refresh := func() {
		writeSpec()
		for _, r := range refreshers {
			r()
		}
	}
	monitorOpts := []nvmlnode.MonitorOption{nvmlnode.WithHealthTable(f.healthTable), nvmlnode.WithHealthPeriod(f.healthPeriod)}
	if f.gpuReset {
		// The policy is to wait: the claims' pods are evicted by the
		// NoExecute taint, and the device plugin's pods end on their own.
		monitorOpts = append(monitorOpts, nvmlnode.WithReset(f.resetter, nil))
	}
	go func() {
		err := nvmlnode.Monitor(ctx, lib, alloc, func(ev nvmlnode.HealthEvent) {
			attrs := []any{"gpu", ev.Device.UUID, "signal", ev.Verdict.Signal.String(), "state", ev.Verdict.State.String(),
				"action", ev.Verdict.Action.String(), "owners", ev.Owners, "err", ev.Err}
			if ev.MIG != nil {
				attrs = append(attrs, "mig", ev.MIG.UUID)
			}
			if ev.Reset != nvmlnode.ResetNone {
				attrs = append(attrs, "reset", ev.Reset.String())
			}
			switch {
			case ev.Healed:
				log.Info("GPU healthy again", attrs...)
			case ev.Err == nil && ev.Verdict.State == node.StateInform:
				log.Info("GPU health signal", attrs...)
			default:
				log.Warn("GPU health", attrs...)
			}
			refresh()
		}, monitorOpts...)
		if err != nil && !errors.Is(err, context.Canceled) {
			log.Warn("health monitor stopped", "err", err)
		}
	}()
	tick := time.NewTicker(f.refresh)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-errc:
			return err
		case <-tick.C:
			refresh()
		}
	}
}

// startDRA starts the DRA kubelet plugin and publishes the node's slice; it
// returns the function that publishes it again, one that counts the
// prepared claims, and one that stops the plugin (its sockets go).
func startDRA(ctx context.Context, f *flags, inv *node.Inventory, alloc *allocator.Allocator, shared []string, client kubernetes.Interface, sysRoot string, obs dra.Observer, log *slog.Logger) (func(), func() int, func(), error) {
	pcieRoot := func(busID string) (string, bool) {
		a, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(busID, deviceattribute.WithFSFromRoot(sysRoot))
		if err != nil || a.Value.StringValue == nil {
			return "", false
		}
		return *a.Value.StringValue, true
	}
	// Shares' MPS daemons are recorded under the state directory; a
	// restart finds them (dra.Driver.Restore).
	var daemons *mps.Manager
	if len(shared) > 0 {
		m, err := f.mpsManager()
		if err != nil {
			return nil, nil, nil, err
		}
		daemons = m
	}
	closeMPS := func() {
		if daemons != nil {
			daemons.Close()
		}
	}
	least, step := f.share.sizes()
	d, err := dra.New(inv, alloc, dra.Config{
		DriverName: f.driverName, CDIDir: f.cdiDir, StateDir: filepath.Join(f.stateDir, "claims"),
		Slice: dra.SliceOptions{PCIeRoot: pcieRoot, Shared: shared, ShareMin: least, ShareStep: step, DynamicMIG: f.mig.gpus(inv), EvictForReset: f.gpuReset}, MPS: daemons, Logger: log,
		Observer: obs,
		NodeName: f.nodeName, LeaveOutUnhealthy: !f.healthTaints, MIGDestroyer: f.mig.destroyer,
		DeviceMetadata: f.deviceMetadata,
	})
	if err != nil {
		closeMPS()
		return nil, nil, nil, err
	}
	dataDir := filepath.Join(f.pluginsDir, f.driverName)
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		return nil, nil, nil, err
	}
	// After a reboot the claims' CDI specs are gone (the CDI directory is
	// emptied at boot) while their checkpoints are kept: they are written
	// again before the kubelet can reach the plugin. A claim that cannot
	// be restored is reported; its next prepare tries again.
	restored, err := d.Restore(ctx)
	if err != nil {
		log.Warn("restore the CDI specs of prepared claims", "err", err)
	}
	if len(restored) > 0 {
		log.Info("wrote the CDI specs of prepared claims again", "claims", restored)
	}
	// A release before device metadata, rolled back to, unprepares claims
	// without removing their metadata files and specs.
	swept, err := d.SweepMetadata(dataDir)
	if err != nil {
		log.Warn("remove the device metadata of claims no longer prepared", "err", err)
	}
	if len(swept) > 0 {
		log.Info("removed the device metadata of claims no longer prepared", "claims", swept)
	}
	// Both sockets are 0600 whatever the umask: only root, the kubelet,
	// may connect.
	served := &republishing{Driver: d}
	helper, err := kubeletplugin.Start(ctx, served,
		kubeletplugin.DriverName(f.driverName),
		kubeletplugin.NodeName(f.nodeName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.PluginDataDirectoryPath(dataDir),
		kubeletplugin.RegistrarDirectoryPath(f.registryDir),
		kubeletplugin.PluginListener(unixsock.Listen),
		kubeletplugin.RegistrarListener(unixsock.Listen),
		// The driver orders the operations itself (one at a time on a
		// claim, the node's state held one claim at a time), so that
		// the checkpoint writes of pods starting together overlap.
		// Beside another instance (a rolling update) the framework
		// runs them one at a time across both, under its file lock:
		// each call reads the state both share (the allocator's state
		// file, the checkpoints, the MPS registry) afresh.
		kubeletplugin.Serialize(f.deploy.rollingUID != ""),
		kubeletplugin.RollingUpdate(types.UID(f.deploy.rollingUID)),
		// The metadata files go under dataDir, their CDI specs (which
		// bind them into the containers) beside the claims' own.
		kubeletplugin.EnableDeviceMetadata(f.deviceMetadata, []schema.GroupVersion{v1beta1.SchemeGroupVersion}),
		kubeletplugin.CDIDirectory(f.cdiDir),
	)
	if err != nil {
		closeMPS()
		return nil, nil, nil, fmt.Errorf("start the DRA kubelet plugin: %w", err)
	}
	var stopOnce sync.Once
	stop := func() {
		stopOnce.Do(func() {
			helper.Stop()
			closeMPS()
		})
	}
	go func() {
		<-ctx.Done()
		stop()
	}()
	served.publish.Store(ptr.To(func() {
		if err := helper.PublishResources(ctx, d.Resources(f.nodeName)); err != nil {
			log.Warn("publish the ResourceSlice", "err", err)
		}
	}))
	publish := func() {
		if err := helper.PublishResources(ctx, d.Resources(f.nodeName)); err != nil {
			log.Warn("publish the ResourceSlice", "err", err)
		}
		// The kubelet's health stream (WatchHealthStatus) follows.
		d.NotifyHealth()
	}
	publish()
	readyWhen(ctx, f.deploy.readyFile, func() bool {
		st := helper.RegistrationStatus()
		return st != nil && st.PluginRegistered
	}, log)
	if uids, err := d.Prepared(); err == nil && len(uids) > 0 {
		log.Info("prepared claims kept from before", "claims", uids)
	}
	count := func() int {
		uids, _ := d.Prepared()
		return len(uids)
	}
	return publish, count, stop, nil
}
