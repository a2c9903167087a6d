// Package node is gpuiso's model of a GPU node: plain data that every other
// package shares, with no cgo and no operating-system dependency, so it
// builds for any GOOS with CGO_ENABLED=0.
//
// An [Inventory] is what a node has: its GPUs ([Device]: index, NVML minor,
// UUID, bus id, model, brand, memory, NUMA node, MIG mode, [Health] and
// Nomad-style fingerprint [Attributes]), their [Topology] (PCIe level and
// NVLink count of every pair), the driver and CUDA versions, and the
// driver's [ControlDevice] nodes. Every device carries its node as data
// ([DeviceNode]: path and major:minor as discovery read them), so no package
// assumes NVIDIA's numbers: a simulated node may use a free major, a real
// one whatever its driver registered.
//
// A GPU with MIG enabled ([Device.MIGSplit]) carries its [MIGDevice]s
// (parent, "MIG-" UUID, GPU- and compute-instance ids, profile, memory, SMs,
// placement and the GI and CI access capability nodes under
// /dev/nvidia-caps); a MIG-capable GPU carries its [MIGProfile] table either
// way. [ParseMIGMinors] reads the nvidia-caps driver's mig-minors table.
//
// A [DeviceRef] is a device as allocations carry it; for a MIG device it
// holds the parent's identity and node with the device's "MIG-" UUID and a
// [MIGRef] (instance ids and capability nodes). [ValidateOwner] is the
// one owner-id rule that every package obeys, because owner ids become file,
// cgroup and Docker names; an [Owner] ([ParseOwner]) is an id checked once,
// where it enters a program. [ParseProcDevices] reads /proc/devices.
//
// A [Process] is the module's one process identity: a pid and the start
// time that tells it from a later process of the same pid, written
// "<pid>.<start>" ([ParseProcess] reads it back). The allocator's holders,
// the supervisor label of Docker containers and the names of the native
// runtime's and the programs' claim and temporary directories all use it.
//
// # Health
//
// A GPU's driver gives health signals ([Signal]: an XID, a double-bit ECC
// error, the driver's recovery action, remapped rows or retired pages
// pending, a failed remapping, an NVLink down or its errors counted, PCIe
// replays, a thermal or power slowdown, a GPU fallen off the bus). A
// [HealthTable] makes of each a [Verdict]: a [HealthState] (healthy,
// inform: shown but not acted on, unhealthy: out of service) and an
// [Action] (none, restart the application, drain, reset the GPU, reboot).
// [DefaultHealthTable] follows NVIDIA's XID catalog and the recovery
// actions; an operator extends or overrides it with rules of their own
// ([ParseHealthRules] reads them as text), checked by
// [HealthTable.Validate] (a bad rule is a [*HealthRuleError]).
//
// # Errors
//
// The package holds the error vocabulary of the whole module:
// [ErrNotSupported], [ErrInvalid], [ErrExists], [ErrNotFound],
// [ErrInsufficient], [ErrUnavailable] and [ErrCorrupt]. Every other package's
// sentinels are made with [Sentinel] and its typed errors' Is methods map onto
// these, so one errors.Is(err, node.ErrNotSupported) covers a refusal from
// any package or back end. Each error matches exactly one kind, and the
// kind tells a caller where to go next:
//
//   - not now: [ErrInsufficient] (too little is free) and [ErrExists] (the
//     name is taken): the same call may succeed once something is let go;
//   - never here, as asked: [ErrInvalid] (the input is wrong, or asks more
//     than the node has), [ErrNotSupported] (the node or back end does not
//     offer it) and [ErrNotFound] (what it names is not there): waiting
//     changes nothing; fix the call or place it elsewhere;
//   - [ErrUnavailable]: something exists but is down (a lost GPU, a daemon
//     that does not answer): retry once it is back;
//   - [ErrCorrupt]: stored state cannot be trusted: an operator looks.
//
// A request no release could ever grant (a share larger than every GPU,
// a share on a node with no shareable GPU) is never ErrInsufficient.
//
// # Where the data comes from
//
// Package nvmlnode fills an Inventory from NVML (cgo, Linux) and watches
// health; package simnode simulates whole nodes for tests and demos.
package node
