// Package simnode simulates a GPU node, so that everything gpuiso does can be
// run and proven on machines without a GPU.
//
// A [Node] is built from a topology description ([Spec]); the shipped ones
// (see [Names]) are dgx1-volta, dgx1-pascal, dgx-a100, dgx-a100-mig,
// hgx-h100, hgx-h100-mig, hgx-h100-dynmig, dgx2, rtx8000x4 and pcie8. Its [Node.NVML] answers as the node's driver would,
// through go-nvml's mock types: stable UUIDs and bus ids, PCIe topology,
// NVLinks (NVSwitch systems link every GPU to the switches), memory and
// fingerprint attributes, and event sets. What a real driver could not
// answer, it answers with ERROR_NOT_SUPPORTED rather than a panic.
//
// Tests drive the node: [Node.InjectXID] delivers XID events to registered
// event sets, and [Node.Lose] makes a GPU fall off the bus (every call about
// it returns ERROR_GPU_IS_LOST, and watchers receive XID 79).
// [Node.Inject] injects any health signal of node's model (an XID or a
// double-bit ECC error, with the recovery action the driver would give
// after it; a recovery action; remapped rows or retired pages pending; a
// failed remapping; an NVLink down; NVLink errors and PCIe replays
// counted; a thermal or power slowdown; a GPU lost), answered by the
// calls nvmlnode.ReadHealth makes (the recovery-action field, remapped
// rows, pending pages, NVLink states and counters, the PCIe replay
// counter, clock event reasons) and delivered as events;
// [Node.InjectMIG] attributes an XID to one MIG device; [Node.Clear]
// heals a GPU as a reset would; [Node.ResetGPU] is such a reset, asked as
// node.Resetter asks it, and [Node.FailResets] makes a GPU's resets fail
// (it stays as it was), for tests of what follows a failed reset.
// [Node.ShareFaults] keeps the faults in a
// host tree: every node made over the same tree, in any process, sees
// them and gets the events injected since (a kubelet plugin simulating
// the host sees what gpuinfo --inject does).
//
// [Node.MakeHost] creates, as root, the node's host tree in a directory of
// the caller's: /dev nodes with NVIDIA's minors on majors no driver of the
// host owns (nvidia<minor> and nvidiactl (minor 255) on one free major,
// nvidia-uvm and nvidia-uvm-tools on another), a /proc/devices naming those
// majors, the driver's /proc files and sysfs NUMA attributes. Opening a GPU
// node gives EPERM where the device cgroup denies it and something else
// (ENXIO: no driver answers) where it allows it, also on a host whose real
// NVIDIA driver owns major 195. The majors come from the ranges Linux
// reserves for local use, 60-63 and 120-127 (never handed out dynamically)
// first, then 240-254, skipping every character major the host's
// /proc/devices lists.
//
// A host tree is gpuiso's by its marks: a marker file written into the
// directory before anything else (but OpenHost's lock) and removed last,
// and a completion mark written once the tree is whole. MakeHost takes only
// a new or empty directory (or one holding a marked tree whose dev, proc
// and sys are gone); [Node.OpenHost] makes the tree on first use and finds
// it afterwards, making once under the lock .lock.d/make.lock (a 0600 file
// in a 0700 directory, which no other user can hold; a wait ends at
// [HostLockTimeout] in a [*HostLockError]), and making again a marked tree
// a killed call left without its completion mark. Both refuse,
// before writing anything, a directory holding files gpuiso did not make
// ([ErrNotOwned]) and the host's own root directory, /dev, /proc and /sys
// or anything in them, symlinks resolved ([ErrHostPath]; [ErrRealDev] too
// where the nodes would be the host's). [Host.Remove] removes only what
// MakeHost made, and only in a marked tree: a file of anyone else's stays.
//
// A host tree decides which devices a node's GPUs are, so only root may be
// able to change it: MakeHost and OpenHost refuse a directory owned by
// another user, or one that group or others may write in, or a parent of
// it that is so (a sticky parent such as /tmp is fine when the directory
// below it is root's) with [ErrUntrusted]. The tree is made and read
// in-root: an [os.Root] of the directory, device nodes made in an open
// directory, /proc/devices and dev read without following a link out of
// the tree; a whole tree that holds a link, a device node of a major not
// its own (/dev/mem's) or majors that are not free local ones of the host
// is refused ([ErrUntrusted] too). MakeHost over a tree is [ErrTreeExists].
// On any failure both remove what they made, and never panic.
//
// # MIG
//
// A MIG-capable model names its profile table ("migProfiles": a100-40gb,
// h100-80gb, see [MIGProfileTables]): the GPU-instance profiles NVML reports
// by profile index, with NVML's profile ids, instance counts, SMs, memory and
// possible placements (start and size in eight memory slices), whether MIG is
// enabled or not. A GPU with a "mig" layout has MIG enabled and is split into
// the GPU instances it lists ([MIGLayout]), each placed by the hardware's
// rules (a placement the profile allows, no overlap, no more instances of a
// profile than the GPU holds) and holding one compute instance that spans it:
// a MIG device, reached through NVML's MIG calls (GetMigDeviceHandleByIndex,
// GetGpuInstanceById, DeviceGetHandleByUUID of its "MIG-" UUID). GPU-instance
// ids follow the placement (0 for the whole GPU, 1-2 halves, 3-6 quarters,
// 7-13 single slices); UUIDs derive from the topology, GPU and instance
// ([Node.MIGUUID]), so they are the same in every run. hgx-h100-mig and
// dgx-a100-mig split GPUs 0-3 in mixed layouts and leave 4-7 whole;
// hgx-h100-dynmig has MIG enabled on GPU 0 with no instance and on GPU 1
// with one 3g.40gb, for dynamic MIG.
// [Node.InjectMIGXID] delivers an XID the driver attributes to one instance.
// [Node.MIGManager] creates and destroys MIG devices on GPUs with MIG
// enabled (dynamic MIG, in simulation only; each call all or nothing, with
// the host tree's capability nodes kept in step), for
// allocator.WithMIGManager; [MIGManager.CreateMIGAt] creates one at a
// placement the caller chose. The simulated NVML answers the calls that
// make and destroy them too (CreateGpuInstanceWithPlacement,
// GetComputeInstanceProfileInfo and CreateComputeInstance of a compute
// instance spanning its GPU instance, Destroy of each), so that
// nvmlnode's MIGManager runs against it; a GPU instance joins the layout
// with its compute instance. A MIGManager with a host tree records each
// change of a layout in the tree, and [Node.RestoreMIG] gives a node made
// anew over that tree (a restarted program) the layouts recorded, as a
// real GPU keeps its instances.
//
// On a MIG-capable node MakeHost adds the nvidia-caps side: a third free
// major (Host.CapsMajor, the "nvidia-caps" line of /proc/devices),
// /proc/driver/nvidia-caps/mig-minors (config 1, monitor 2, then for each
// GPU minor G, GPU instance I of 15 and compute instance C of 8:
// "gpu<G>/gi<I>/access <M>", "gpu<G>/gi<I>/ci<C>/access <M+1+C>"), the
// capability files /proc/driver/nvidia/capabilities/gpu<G>/mig/gi<I>[/ci<C>]/access
// ("DeviceFileMinor: <M>", "DeviceFileMode: 292") of every instance, and
// their nodes /dev/nvidia-caps/nvidia-cap<M>, with config and monitor.
//
// The simulated driver version is the host's installed NVIDIA user-space
// driver's when there is one (so simulated nodes and the real driver volume
// agree), else [FallbackDriverVersion]; [WithDriverVersion] sets it.
package simnode
