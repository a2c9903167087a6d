// Package nvmlnode reads a node's GPUs through NVML
// (github.com/NVIDIA/go-nvml) into the node model: [Discover] builds a
// node.Inventory once, [Monitor] watches the GPUs' health signals and marks
// GPUs unhealthy, and healthy again, through a [Target] (an allocator), and
// [ReadUsage] reads the GPU memory and utilisation of a container's
// processes.
//
// NVML is loaded at run time (dlopen of libnvidia-ml.so.1), so one binary
// serves nodes with and without GPUs: on a node without the library
// Discover fails with an error matching [ErrLibraryNotFound], on one whose
// kernel driver is not loaded with [ErrDriverNotLoaded]. A GPU NVML cannot
// read (for instance one that fell off the bus) is reported unhealthy with
// the reason, beside the others. NVML's result codes are typed
// ([NVMLError]) and match node's shared sentinels.
//
// Discovery is the only place that knows NVIDIA's device numbers: it reads
// the driver's majors from /proc/devices (falling back to [DefaultMajor] when
// the driver is not loaded), stats each GPU's and control device's node
// under the dev root, and records them in the inventory as data.
//
// # Health
//
// [Monitor] takes the driver's events (XID errors, double-bit ECC errors,
// recovery-action changes) as they come and reads the polled signals
// ([ReadHealth]: the driver's recovery action, remapped rows pending and
// failed, retired pages pending, NVLink states and error counters, the
// PCIe replay counter, thermal and power slowdowns, a GPU fallen off the
// bus) every health period. A node.HealthTable (node.DefaultHealthTable,
// after NVIDIA's XID catalog, or the operator's, [WithHealthTable]) makes
// of each signal a state and an action: an unhealthy signal marks the GPU
// (or the MIG device an event names), an informing one (XID 94, a
// contained ECC error: restart the application) is only reported. When a
// marked GPU's signals clear (not lost, nothing pending, recovery action
// none where a reset was needed, no new fault for the quiet period) the
// monitor marks it healthy again, within two health periods; a reason the
// monitor did not write (an operator's) is left alone.
//
// # Reset
//
// Opted in with [WithReset], the monitor resets a GPU whose action is a
// reset rather than waiting for someone else to: the GPU is out of
// service at once; its owners are told once to the importer's
// [ResetPolicy], which alone may end their work (the monitor never ends a
// process, nor touches another GPU or its owners); once no owner holds it
// and the driver lists no process on it, a node.Resetter ([SMIResetter]:
// nvidia-smi --gpu-reset; a simulated node) resets it; its signals are
// read again, and the GPU is healthy again, or, the reset failed or a
// signal still holds, stays unhealthy with a reboot as its action. Each
// step is a [HealthEvent] with Reset set. A GPU with MIG devices is not
// reset: a reset would destroy them under their owners.
//
// # MIG
//
// For a MIG-capable GPU, Discover reads the GPU-instance profile table
// (name such as "1g.10gb", NVML id, count, SMs, memory, placements) also when
// MIG is disabled, and, when it is enabled, every MIG device as it stands:
// its "MIG-" UUID, GPU- and compute-instance ids, profile, memory, SMs,
// placement, and its two capability nodes (GI and CI access), whose minors
// come from /proc/driver/nvidia-caps/mig-minors (else the capability's proc
// file), whose major is the nvidia-caps line of /proc/devices, and which are
// stat'ed under <dev>/nvidia-caps. Discovery only reads: it never changes a
// GPU's MIG mode or layout. Monitor attributes an event that names a GPU
// instance to that MIG device alone ([HealthEvent].MIG), also one made
// after it started (it reads the target's MIG devices at each event).
//
// A [MIGManager] changes the layout of a GPU whose MIG mode is enabled
// (dynamic MIG), never the mode: [MIGManager.CreateMIGAt] makes a GPU
// instance at a placement (CreateGpuInstanceWithPlacement) and one
// compute instance spanning it, all or nothing, and returns the MIG device
// as Discover reads it; [MIGManager.DestroyMIG] destroys its compute
// instance, then its GPU instance. It is what allocator.WithMIGManager
// takes.
//
// # Host paths
//
// Discover reads the dev root (/dev), proc root (/proc) and sys root (/sys);
// each can be moved to a test tree with [WithDevRoot], [WithProcRoot] and
// [WithSysRoot]; [WithNVML] replaces the library (package simnode provides
// a simulated one).
package nvmlnode
